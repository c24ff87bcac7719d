//! detvisor-agent: PID 1 of detvisor's multi-node guests.
//!
//! ```text
//! detvisor-agent [--channel PATH | --channel-fd N] [--mode guest|test]
//! ```
//! * `--channel PATH` (default `/dev/hvc0`): the control channel; a
//!   terminal is put into raw mode. `--channel-fd N`: an inherited
//!   descriptor instead (a socketpair in tests).
//! * `--mode guest` (default): must be PID 1. Mounts devtmpfs, devpts,
//!   /dev/shm, proc, sysfs, tmpfs /tmp and /run, sets the hostname to
//!   `detvisor` and brings `lo` up, like `guest-image/init`; at the end,
//!   writes the workload's status to port 0x610 and reboots.
//! * `--mode test`: for tests on a development host. Moves itself into a
//!   new network namespace first (so it can never touch the host's links;
//!   a test creates the NICs to move in there), mounts nothing outside the
//!   nodes' own mount namespaces, becomes a child subreaper, exits 0 at
//!   the end.
//!
//! See `agent/README.md` for the protocol and how nodes are built.

mod agent;
mod assert_cmd;
mod capture;
mod clock;
mod composer;
mod container;
mod disk;
mod history;
mod local_output;
mod netlink;
mod procfs;
mod sdk;
mod sys;

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use agent::{Agent, Mode};

const USAGE: &str = "usage: detvisor-agent [--channel PATH | --channel-fd N] [--mode guest|test]";

/// The detvisor status port (see guest-image/README.md): one byte ends the run.
const STATUS_PORT: i64 = 0x610;

#[derive(Debug, PartialEq, Eq)]
enum Channel {
    Path(PathBuf),
    Fd(i32),
}

#[derive(Debug, PartialEq, Eq)]
struct Options {
    channel: Channel,
    mode: Mode,
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        channel: Channel::Path(PathBuf::from("/dev/hvc0")),
        mode: Mode::Guest,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match arg.as_str() {
            "--channel" => options.channel = Channel::Path(PathBuf::from(value("--channel")?)),
            "--channel-fd" => {
                let fd = value("--channel-fd")?;
                let fd = fd
                    .parse()
                    .ok()
                    .filter(|fd| *fd >= 0)
                    .ok_or_else(|| format!("invalid descriptor {fd:?}"))?;
                options.channel = Channel::Fd(fd);
            }
            "--mode" => {
                options.mode = match value("--mode")?.as_str() {
                    "guest" => Mode::Guest,
                    "test" => Mode::Test,
                    other => return Err(format!("unknown mode {other:?}")),
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(options)
}

/// The SDK sockets and the shim's file in a guest (see `sdk.rs`).
const GUEST_SDK_DIR: &str = "/run/detvisor";

fn main() {
    // The same binary is `detvisor-assert` in every node (see assert_cmd.rs).
    let argv0 = std::env::args().next().unwrap_or_default();
    if Path::new(&argv0).file_name() == Some(std::ffi::OsStr::new("detvisor-assert")) {
        let args: Vec<String> = std::env::args().skip(1).collect();
        std::process::exit(assert_cmd::main(&args));
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return;
    }
    if args.iter().any(|a| a == "--version") {
        println!(
            "detvisor-agent {} (protocol {})",
            env!("CARGO_PKG_VERSION"),
            guest_agent::protocol::PROTOCOL_VERSION
        );
        return;
    }
    let options = match parse_args(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("detvisor-agent: {message}\n{USAGE}");
            std::process::exit(2);
        }
    };
    match options.mode {
        Mode::Test => match run(&options) {
            Ok(_) => {}
            Err(error) => {
                eprintln!("detvisor-agent: {error}");
                std::process::exit(1);
            }
        },
        Mode::Guest => {
            if std::process::id() != 1 {
                eprintln!("detvisor-agent: --mode guest must run as PID 1 (use --mode test)");
                std::process::exit(2);
            }
            set_up_guest();
            let status = match run(&options) {
                Ok(status) => status,
                Err(error) => {
                    eprintln!("detvisor-agent: {error}");
                    None
                }
            };
            // PID 1 must never exit (the kernel would panic).
            power_off(status.map(|s| s.shell_code()))
        }
    }
}

fn run(options: &Options) -> io::Result<Option<guest_agent::protocol::ExitStatus>> {
    if options.mode == Mode::Test {
        // Orphans of the root workload come back to us, not to the host's init.
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) has no memory effects.
        sys::cvt(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) })?;
        // Never the host's network: everything the agent does to links
        // (moving NICs into nodes) happens from a namespace of its own.
        sys::unshare(libc::CLONE_NEWNET)
            .map_err(|e| io::Error::new(e.kind(), format!("unshare(CLONE_NEWNET): {e}")))?;
        netlink::link_index("lo").and_then(|lo| netlink::Netlink::open()?.set_link_up(lo))?;
    }
    ensure_std_fds();
    let channel = open_channel(&options.channel)?;
    let mut agent = Agent::new(channel)?;
    let sdk_dir = match options.mode {
        Mode::Guest => PathBuf::from(GUEST_SDK_DIR),
        Mode::Test => std::env::temp_dir().join(format!("detvisor-agent-{}", std::process::id())),
    };
    // Without the SDK sockets the nodes still run (their SDKs fall back).
    match agent.start_sdk(&sdk_dir) {
        Ok(()) if options.mode == Mode::Guest => install_root_sdk(&agent),
        Ok(()) => {}
        Err(error) => eprintln!("detvisor-agent: the SDK sockets in {sdk_dir:?}: {error}"),
    }
    agent.run()?;
    Ok(agent.workload_status())
}

fn open_channel(channel: &Channel) -> io::Result<OwnedFd> {
    let fd = match channel {
        Channel::Path(path) => sys::open(path, libc::O_RDWR | libc::O_NOCTTY)
            .map_err(|e| io::Error::new(e.kind(), format!("open {path:?}: {e}")))?,
        Channel::Fd(fd) => {
            // SAFETY: F_GETFD only checks that the descriptor is open.
            sys::cvt(unsafe { libc::fcntl(*fd, libc::F_GETFD) })
                .map_err(|e| io::Error::new(e.kind(), format!("--channel-fd {fd}: {e}")))?;
            // SAFETY: the descriptor is open and was handed to us to own.
            let owned = unsafe { OwnedFd::from_raw_fd(*fd) };
            // SAFETY: F_SETFD on an open descriptor has no memory effects.
            sys::cvt(unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) })?;
            owned
        }
    };
    sys::make_raw_if_tty(fd.as_fd())
        .map_err(|e| io::Error::new(e.kind(), format!("raw mode on the channel: {e}")))?;
    Ok(fd)
}

/// In a guest, the root namespaces (a workload outside every node) get the
/// shim and `detvisor-assert` too: the initramfs is the agent's own.
fn install_root_sdk(agent: &Agent) {
    let Some(shim) = agent.shim_path() else {
        return;
    };
    let result = std::fs::create_dir_all("/usr/lib")
        .and_then(|()| std::fs::copy(&shim, "/usr/lib/libvoidstar.so").map(drop))
        .and_then(|()| std::fs::create_dir_all("/usr/bin"))
        .and_then(|()| match std::env::current_exe() {
            Ok(own) => match std::os::unix::fs::symlink(own, "/usr/bin/detvisor-assert") {
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                other => other,
            },
            Err(error) => Err(error),
        });
    if let Err(error) = result {
        eprintln!("detvisor-agent: installing the SDK shim in the guest's root: {error}");
    }
}

/// Makes sure descriptors 0-2 are open (on /dev/null if not), so the pipes
/// and descriptors the agent creates never take those numbers.
fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only checks that the descriptor is open.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            // SAFETY: opening /dev/null; the lowest free number is `fd`.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}

/// The guest's early set-up (what `guest-image/init` does). Failures are
/// reported on the console and are not fatal: the host learns about missing
/// pieces when a node needs them.
fn set_up_guest() {
    let warn = |what: &str, result: io::Result<()>| {
        if let Err(error) = result {
            if error.raw_os_error() != Some(libc::EBUSY) {
                eprintln!("detvisor-agent: {what}: {error}");
            }
        }
    };
    let mkdir = |path: &str| {
        let _ = std::fs::create_dir_all(path);
    };
    let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
    mkdir("/dev");
    warn(
        "mount /dev",
        sys::mount(
            Some("dev"),
            Path::new("/dev"),
            Some("devtmpfs"),
            0,
            Some("mode=0755"),
        ),
    );
    // The kernel gave us no stdio if the initramfs has no /dev/console.
    if let Ok(console) = sys::open(Path::new("/dev/console"), libc::O_RDWR | libc::O_NOCTTY) {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors.
            unsafe { libc::dup2(console.as_raw_fd(), fd) };
        }
    }
    ensure_std_fds();
    for dir in ["/dev/pts", "/dev/shm", "/proc", "/sys", "/tmp", "/run"] {
        mkdir(dir);
    }
    let mounts: [(&str, &str, &str, libc::c_ulong, &str); 6] = [
        (
            "devpts",
            "/dev/pts",
            "devpts",
            libc::MS_NOSUID | libc::MS_NOEXEC,
            "gid=5,mode=0620,ptmxmode=0666",
        ),
        ("shm", "/dev/shm", "tmpfs", nosuid_nodev, "mode=1777"),
        ("proc", "/proc", "proc", nosuid_nodev | libc::MS_NOEXEC, ""),
        ("sysfs", "/sys", "sysfs", nosuid_nodev | libc::MS_NOEXEC, ""),
        ("tmpfs", "/tmp", "tmpfs", nosuid_nodev, "mode=1777"),
        ("tmpfs", "/run", "tmpfs", nosuid_nodev, "mode=0755"),
    ];
    for (source, target, fstype, flags, data) in mounts {
        let data = (!data.is_empty()).then_some(data);
        warn(
            &format!("mount {target}"),
            sys::mount(Some(source), Path::new(target), Some(fstype), flags, data),
        );
    }
    warn("sethostname", sys::sethostname("detvisor"));
    warn(
        "set lo up",
        netlink::link_index("lo").and_then(|lo| netlink::Netlink::open()?.set_link_up(lo)),
    );
}

/// Ends the guest: the status byte (if the workload ended) on port 0x610,
/// which detvisor treats as the end of the run, then a reboot (detvisor
/// boots with `reboot=t`: a triple fault, also the end of the run).
fn power_off(status: Option<i32>) -> ! {
    if let Some(status) = status {
        let byte = [(status & 0xff) as u8];
        match sys::open(Path::new("/dev/port"), libc::O_WRONLY) {
            Ok(port) => {
                // SAFETY: `byte` is valid for one byte.
                let written =
                    unsafe { libc::pwrite(port.as_raw_fd(), byte.as_ptr().cast(), 1, STATUS_PORT) };
                if written != 1 {
                    eprintln!(
                        "detvisor-agent: write /dev/port: {}",
                        io::Error::last_os_error()
                    );
                }
            }
            Err(error) => eprintln!("detvisor-agent: open /dev/port: {error}"),
        }
    }
    // SAFETY: sync and reboot have no memory effects; if reboot returns,
    // PID 1 waits forever instead of exiting.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_AUTOBOOT);
        loop {
            libc::pause();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn test_defaults_are_hvc0_and_guest_mode() {
        assert_eq!(
            parse_args(&[]),
            Ok(Options {
                channel: Channel::Path(PathBuf::from("/dev/hvc0")),
                mode: Mode::Guest,
            })
        );
    }

    #[test]
    fn test_parse_channel_and_mode() {
        assert_eq!(
            parse_args(&args(&["--channel-fd", "3", "--mode", "test"])),
            Ok(Options {
                channel: Channel::Fd(3),
                mode: Mode::Test,
            })
        );
        assert_eq!(
            parse_args(&args(&["--channel", "/dev/pts/3"]))
                .unwrap()
                .channel,
            Channel::Path(PathBuf::from("/dev/pts/3"))
        );
    }

    #[test]
    fn test_parse_rejects_bad_arguments() {
        for bad in [
            &["--mode", "host"][..],
            &["--channel-fd", "-1"],
            &["--channel"],
            &["--frobnicate"],
        ] {
            assert!(parse_args(&args(bad)).is_err(), "{bad:?}");
        }
    }
}
