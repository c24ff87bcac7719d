//! The QEMU process: its command line, starting it tied to our lifetime, and turning an exit
//! without a payload status into an error that says why. Also the command line of a guest QEMU
//! boots directly, the baseline detvisor is measured against ([`direct_boot_args`]).

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};

use crate::shares::share_tag;
use crate::stdio::{tail, TAIL_BYTES};
use crate::HelperVmConfig;

/// Fixed part of the L1 kernel command line. The console is ttyS3 (a log file), so that no
/// kernel message can reach the payload's stdout on ttyS0; `panic=-1` plus QEMU's
/// `-no-reboot` turns a panic into a QEMU exit instead of a hang.
const KERNEL_ARGS: &str = "console=ttyS3 quiet panic=-1";

/// The files QEMU is started with, besides the config's.
pub(crate) struct QemuFiles<'a> {
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    /// ttyS1 (the payload's stderr): `/dev/fd/N` of a pipe.
    pub err_path: &'a str,
    /// ttyS2: the payload's exit status.
    pub status: &'a Path,
    /// ttyS3: the L1 kernel console.
    pub console: &'a Path,
    /// Shared directories in mount order (`checked_shares`).
    pub shares: &'a [PathBuf],
    /// The channel: a virtio-serial port named `.1` whose host side is a Unix socket QEMU
    /// listens on at `.0`.
    pub channel: Option<(&'a Path, &'a str)>,
}

/// The QEMU command line (without the binary). ttyS0 is QEMU's stdio; shares become virtio-9p
/// PCI devices tagged [`share_tag`]; the channel a virtio-serial PCI device with one port.
pub(crate) fn qemu_args(config: &HelperVmConfig, f: &QemuFiles<'_>) -> Vec<OsString> {
    let mut append = KERNEL_ARGS.to_string();
    if !config.extra_kernel_args.trim().is_empty() {
        append.push(' ');
        append.push_str(config.extra_kernel_args.trim());
    }
    // One vCPU: single-threaded TCG. More: multi-threaded TCG, asked for explicitly (QEMU
    // falls back to one thread for all vCPUs when it thinks the guest/host pair unsafe).
    let cpus = config.cpus.max(1);
    let accel = if cpus > 1 { "tcg,thread=multi" } else { "tcg" };
    let smp = cpus.to_string();
    let mut a: Vec<OsString> = [
        "-accel",
        accel,
        "-cpu",
        "EPYC,+svm,+npt,+nrip-save",
        "-smp",
        &smp,
        "-m",
        &config.memory_mib.to_string(),
    ]
    .iter()
    .chain(&NO_DEFAULTS)
    .chain(&["-chardev", "stdio,id=hvm0,signal=off"])
    .map(OsString::from)
    .collect();
    for (id, path) in [
        ("hvm1", f.err_path.as_bytes()),
        ("hvm2", f.status.as_os_str().as_bytes()),
        ("hvm3", f.console.as_os_str().as_bytes()),
    ] {
        a.push("-chardev".into());
        a.push(file_chardev(id, path));
    }
    for i in 0..4 {
        a.push("-serial".into());
        a.push(format!("chardev:hvm{i}").into());
    }
    a.push("-append".into());
    a.push(append.into());
    // One virtio-9p PCI device per share (the `pc` machine keeps its PCI bus under
    // -nodefaults). security_model=none: QEMU creates files with the guest's uid/gid and mode
    // where it can (we are root on both sides) and silently keeps its own where it cannot, so
    // host files are plain files with no xattr metadata (mapped-xattr would store the mode in
    // xattrs and leave 0600 files). multidevs=remap keeps inode numbers unique when the
    // directory has other filesystems mounted below it.
    for (i, dir) in f.shares.iter().enumerate() {
        let mut fsdev =
            format!("local,id=fsdev{i},security_model=none,multidevs=remap,path=").into_bytes();
        fsdev.extend_from_slice(&qemu_opt_bytes(dir.as_os_str().as_bytes()));
        a.push("-fsdev".into());
        a.push(OsString::from_vec(fsdev));
        a.push("-device".into());
        a.push(format!("virtio-9p-pci,fsdev=fsdev{i},mount_tag={}", share_tag(i)).into());
    }
    // The channel: QEMU listens on the socket (server=on) without waiting for us (wait=off);
    // until we connect, the guest's writes to the port block and its reads see EOF.
    if let Some((socket, port)) = f.channel {
        let mut chardev = b"socket,id=chan0,server=on,wait=off,path=".to_vec();
        chardev.extend_from_slice(&qemu_opt_bytes(socket.as_os_str().as_bytes()));
        a.push("-chardev".into());
        a.push(OsString::from_vec(chardev));
        a.push("-device".into());
        a.push("virtio-serial-pci,id=vser0".into());
        a.push("-device".into());
        a.push(format!("virtserialport,bus=vser0.0,chardev=chan0,name={port}").into());
    }
    a.push("-kernel".into());
    a.push(f.kernel.into());
    a.push("-initrd".into());
    a.push(f.initrd.into());
    a
}

/// No default devices, no configuration files, no display, and a reset ends QEMU: every QEMU
/// started here.
const NO_DEFAULTS: [&str; 5] = [
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-no-reboot",
];

/// A `-chardev` value writing to the file `path`.
fn file_chardev(id: &str, path: &[u8]) -> OsString {
    let mut v = format!("file,id={id},path=").into_bytes();
    v.extend_from_slice(&qemu_opt_bytes(path));
    OsString::from_vec(v)
}

/// How QEMU runs a directly booted guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestAccel {
    /// `-accel kvm`.
    Kvm,
    /// `-accel tcg -icount shift=0,sleep=off`: the guest's clocks follow its instructions,
    /// and so does its real-time clock (`-rtc clock=vm`, from `rtc_base` when given).
    TcgIcount { rtc_base: Option<String> },
}

/// A Linux guest QEMU boots directly (`-kernel`, `-initrd`, `-append`), with no device but its
/// serial port (ttyS0, to a file) and an `isa-debugcon` at port 0x610 (the status byte the
/// default guest's `/init` writes, to a file): what detvisor is measured against.
pub struct DirectBoot<'a> {
    pub accel: GuestAccel,
    /// `-M`.
    pub machine: &'a str,
    /// `-m`.
    pub memory: &'a str,
    /// `-L`: where QEMU finds its firmware (its own default when `None`).
    pub firmware_dir: Option<&'a Path>,
    pub serial: &'a Path,
    pub status: &'a Path,
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub append: &'a str,
}

/// The QEMU command line (without the binary) of `boot`.
pub fn direct_boot_args(boot: &DirectBoot<'_>) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    if let Some(dir) = boot.firmware_dir {
        a.push("-L".into());
        a.push(dir.into());
    }
    match &boot.accel {
        GuestAccel::Kvm => a.extend(["-accel", "kvm"].map(OsString::from)),
        GuestAccel::TcgIcount { rtc_base } => {
            a.extend(["-accel", "tcg", "-icount", "shift=0,sleep=off", "-rtc"].map(OsString::from));
            a.push(match rtc_base {
                Some(base) => format!("clock=vm,base={base}").into(),
                None => "clock=vm".into(),
            });
        }
    }
    a.extend(["-M", boot.machine, "-m", boot.memory].map(OsString::from));
    a.extend(NO_DEFAULTS.map(OsString::from));
    a.push("-chardev".into());
    a.push(file_chardev("ser0", boot.serial.as_os_str().as_bytes()));
    a.extend(["-serial", "chardev:ser0", "-chardev"].map(OsString::from));
    a.push(file_chardev("status", boot.status.as_os_str().as_bytes()));
    a.extend(
        [
            "-device",
            "isa-debugcon,iobase=0x610,chardev=status",
            "-kernel",
        ]
        .map(OsString::from),
    );
    a.push(boot.kernel.into());
    a.push("-initrd".into());
    a.push(boot.initrd.into());
    a.push("-append".into());
    a.push(boot.append.into());
    a
}

/// Escapes a value inside a QEMU `key=value,...` option string: `,` is doubled.
fn qemu_opt_bytes(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    for &b in v {
        out.push(b);
        if b == b',' {
            out.push(b',');
        }
    }
    out
}

/// Starts `cmd` (QEMU) so that it dies with us (`PR_SET_PDEATHSIG`, even when we are killed
/// by SIGKILL) and keeps `inherit_fd` open across exec (ttyS1's pipe, opened by QEMU as
/// `/dev/fd/N`). QEMU stays in our process group, so Ctrl-C and `timeout` reach it too.
pub(crate) fn spawn_tied(cmd: &mut Command, inherit_fd: i32) -> io::Result<Child> {
    let parent = libc::pid_t::try_from(std::process::id()).map_err(io::Error::other)?;
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls (fcntl, prctl, getppid, _exit) on plain integers; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(inherit_fd, libc::F_SETFD, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            // If we die (even by SIGKILL), QEMU dies too instead of running on unattended.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(125);
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Parses what the init wrote on ttyS2: a decimal status 0..=255 and a newline.
pub(crate) fn parse_status(raw: &[u8]) -> Option<i32> {
    let text = std::str::from_utf8(raw).ok()?;
    let line = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    if line.is_empty() || line.len() > 3 || !line.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let code: i32 = line.parse().ok()?;
    (0..=255).contains(&code).then_some(code)
}

/// The helper VM ended without the payload's exit status, or the channel broke: why, and the
/// last lines of everything that came back.
#[derive(Debug, thiserror::Error)]
#[error("helper VM: {why}{details}")]
pub struct VmFailed {
    /// One line: QEMU killed or failed, or what happened on the channel.
    pub why: String,
    /// The tails of QEMU's messages, the L1 console, the payload's stderr and stdout, each
    /// under a `--- title (last lines) ---` line (empty when there is nothing).
    pub details: String,
}

/// What came back from a QEMU run besides the status, for [`VmFailed`].
pub(crate) struct Leftovers {
    pub qemu_status: Option<ExitStatus>,
    pub qemu_log: Vec<u8>,
    pub console: Vec<u8>,
    pub err_tail: Vec<u8>,
    pub out_tail: Vec<u8>,
}

impl Leftovers {
    /// Why QEMU ended (when it did), as one line.
    pub(crate) fn why_qemu_ended(&self) -> Option<String> {
        let status = self.qemu_status?;
        let log = String::from_utf8_lossy(&self.qemu_log);
        Some(if let Some(sig) = status.signal() {
            format!("QEMU was killed by signal {sig}")
        } else if let Some(line) = log.lines().find(|l| l.contains("terminating on signal")) {
            format!("QEMU was stopped by a signal ({})", line.trim())
        } else if !status.success() {
            format!("QEMU failed ({status})")
        } else {
            "the helper VM shut down without reporting the payload's exit status".to_string()
        })
    }

    /// A [`VmFailed`] with `why` and the tails.
    pub(crate) fn failure(&self, why: String) -> VmFailed {
        // The requested CPU model has features TCG lacks; QEMU warns about each on every start.
        let qemu_messages: String = String::from_utf8_lossy(&self.qemu_log)
            .lines()
            .filter(|l| !l.contains("TCG doesn't support requested feature"))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut details = String::new();
        for (title, bytes) in [
            ("QEMU messages", qemu_messages.as_bytes()),
            ("L1 kernel console", &self.console[..]),
            ("payload stderr", &self.err_tail[..]),
            ("payload stdout", &self.out_tail[..]),
        ] {
            let text = String::from_utf8_lossy(tail(bytes, TAIL_BYTES)).replace("\r\n", "\n");
            let text = text.trim_end();
            if !text.is_empty() {
                details.push_str(&format!("\n--- {title} (last lines) ---\n{text}"));
            }
        }
        VmFailed { why, details }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn files<'a>(shares: &'a [PathBuf], channel: Option<(&'a Path, &'a str)>) -> QemuFiles<'a> {
        QemuFiles {
            kernel: Path::new("/a/vmlinuz"),
            initrd: Path::new("/t/initrd.img"),
            err_path: "/dev/fd/9",
            status: Path::new("/t,x/status"),
            console: Path::new("/t/console.log"),
            shares,
            channel,
        }
    }

    #[test]
    fn qemu_command_line() {
        let config = HelperVmConfig {
            qemu: "q".into(),
            assets_dir: "/a".into(),
            memory_mib: 1234,
            extra_kernel_args: " foo=1 ".into(),
            ..HelperVmConfig::default()
        };
        let args = strings(&qemu_args(&config, &files(&[], None)));
        let joined = args.join(" ");
        assert!(joined.contains("-m 1234 "), "{joined}");
        assert!(joined.starts_with("-accel tcg -cpu "), "{joined}");
        assert!(joined.contains(" -smp 1 "), "{joined}");
        assert!(
            joined.contains("-cpu EPYC,+svm,+npt,+nrip-save"),
            "{joined}"
        );
        assert!(joined.contains("path=/t,,x/status"), "{joined}");
        assert!(joined.contains("path=/dev/fd/9"), "{joined}");
        let append = &args[args.iter().position(|a| a == "-append").unwrap() + 1];
        assert_eq!(append, "console=ttyS3 quiet panic=-1 foo=1");
        assert_eq!(args.iter().filter(|a| *a == "-serial").count(), 4);
        assert!(!args.iter().any(|a| a == "-fsdev" || a == "-device"));
    }

    #[test]
    fn qemu_command_line_with_two_cpus_is_multi_threaded() {
        let config = HelperVmConfig {
            cpus: 2,
            ..HelperVmConfig::default()
        };
        let joined = strings(&qemu_args(&config, &files(&[], None))).join(" ");
        assert!(
            joined.starts_with("-accel tcg,thread=multi -cpu "),
            "{joined}"
        );
        assert!(joined.contains(" -smp 2 "), "{joined}");
    }

    #[test]
    fn qemu_command_line_with_shares() {
        let shares = [
            PathBuf::from("/s/a"),
            PathBuf::from("/s/a b,c/d"),
            PathBuf::from(std::ffi::OsStr::from_bytes(b"/s/\xff,")),
        ];
        let args = qemu_args(&HelperVmConfig::default(), &files(&shares, None));
        let pos = args.iter().position(|a| a == "-fsdev").unwrap();
        let expected: Vec<&[u8]> = vec![
            b"-fsdev",
            b"local,id=fsdev0,security_model=none,multidevs=remap,path=/s/a",
            b"-device",
            b"virtio-9p-pci,fsdev=fsdev0,mount_tag=share0",
            b"-fsdev",
            b"local,id=fsdev1,security_model=none,multidevs=remap,path=/s/a b,,c/d",
            b"-device",
            b"virtio-9p-pci,fsdev=fsdev1,mount_tag=share1",
            b"-fsdev",
            b"local,id=fsdev2,security_model=none,multidevs=remap,path=/s/\xff,,",
            b"-device",
            b"virtio-9p-pci,fsdev=fsdev2,mount_tag=share2",
            b"-kernel",
        ];
        let got: Vec<&[u8]> = args[pos..pos + expected.len()]
            .iter()
            .map(|a| a.as_bytes())
            .collect();
        assert_eq!(got, expected);
        assert_eq!(args.iter().filter(|a| *a == "-fsdev").count(), 3);
        // -nodefaults drops default devices, not the pc machine's PCI bus the devices sit on.
        assert!(args.iter().any(|a| a == "-nodefaults"));
        assert!(!args.iter().any(|a| a == "-machine" || a == "-M"));
    }

    #[test]
    fn qemu_command_line_with_channel() {
        let channel = Some((Path::new("/t,1/chan.sock"), "detvisor.0"));
        let args = strings(&qemu_args(&HelperVmConfig::default(), &files(&[], channel)));
        let pos = args.iter().position(|a| a.starts_with("socket,")).unwrap();
        assert_eq!(
            args[pos - 1..pos + 5],
            [
                "-chardev",
                "socket,id=chan0,server=on,wait=off,path=/t,,1/chan.sock",
                "-device",
                "virtio-serial-pci,id=vser0",
                "-device",
                "virtserialport,bus=vser0.0,chardev=chan0,name=detvisor.0",
            ]
        );
    }

    #[test]
    fn direct_boot_command_lines() {
        let boot = |accel| DirectBoot {
            accel,
            machine: "pc",
            memory: "1G",
            firmware_dir: Some(Path::new("/fw")),
            serial: Path::new("/t,1/serial"),
            status: Path::new("/t/status"),
            kernel: Path::new("/b/bzImage"),
            initrd: Path::new("/b/initrd"),
            append: "console=ttyS0 reboot=t",
        };
        let tail = "-M pc -m 1G -nodefaults -no-user-config -display none -no-reboot \
                    -chardev file,id=ser0,path=/t,,1/serial -serial chardev:ser0 \
                    -chardev file,id=status,path=/t/status \
                    -device isa-debugcon,iobase=0x610,chardev=status \
                    -kernel /b/bzImage -initrd /b/initrd -append console=ttyS0 reboot=t";
        assert_eq!(
            strings(&direct_boot_args(&boot(GuestAccel::Kvm))).join(" "),
            format!("-L /fw -accel kvm {tail}")
        );
        let icount = GuestAccel::TcgIcount {
            rtc_base: Some("2024-01-01T00:00:00".into()),
        };
        assert_eq!(
            strings(&direct_boot_args(&boot(icount))).join(" "),
            format!(
                "-L /fw -accel tcg -icount shift=0,sleep=off \
                 -rtc clock=vm,base=2024-01-01T00:00:00 {tail}"
            )
        );
        let mut plain = boot(GuestAccel::TcgIcount { rtc_base: None });
        plain.firmware_dir = None;
        assert!(strings(&direct_boot_args(&plain))
            .join(" ")
            .starts_with("-accel tcg -icount shift=0,sleep=off -rtc clock=vm -M pc "));
    }

    #[test]
    fn status_parsing() {
        assert_eq!(parse_status(b"7\n"), Some(7));
        assert_eq!(parse_status(b"0\n"), Some(0));
        assert_eq!(parse_status(b"255\r\n"), Some(255));
        assert_eq!(parse_status(b"\n\n125\n"), Some(125));
        assert_eq!(parse_status(b"42"), Some(42));
        assert_eq!(parse_status(b""), None);
        assert_eq!(parse_status(b"\n"), None);
        assert_eq!(parse_status(b"256\n"), None);
        assert_eq!(parse_status(b"-1\n"), None);
        assert_eq!(parse_status(b"1x\n"), None);
        assert_eq!(parse_status(b"\xff\n"), None);
        assert_eq!(parse_status(b"00000000012\n"), None);
    }

    #[test]
    fn failure_names_why_and_filters_tcg_warnings() {
        let left = Leftovers {
            qemu_status: Some(ExitStatus::from_raw(9)),
            qemu_log: b"qemu: warning: TCG doesn't support requested feature x\nreal problem\n"
                .to_vec(),
            console: Vec::new(),
            err_tail: b"oops\r\n".to_vec(),
            out_tail: Vec::new(),
        };
        let why = left.why_qemu_ended().unwrap();
        assert_eq!(why, "QEMU was killed by signal 9");
        let msg = left.failure(why).to_string();
        assert!(
            msg.starts_with("helper VM: QEMU was killed by signal 9\n"),
            "{msg}"
        );
        assert!(
            msg.contains("--- QEMU messages (last lines) ---\nreal problem"),
            "{msg}"
        );
        assert!(!msg.contains("TCG doesn't"), "{msg}");
        assert!(
            msg.contains("--- payload stderr (last lines) ---\noops"),
            "{msg}"
        );
        assert!(!msg.contains("console"), "{msg}");
    }
}
