//! QEMU for `bench boot`: the host's installation (binary, shared libraries, firmware), shipping
//! it into the helper VM, its command line, and one run of it.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::monitor::MemoryPeak;
use super::process::{last_lines, run_measured, Finished, Watch};
use super::report::RunResult;
use super::stats::{fnv1a, ms};
use helper_vm::{direct_boot_args, DirectBoot, GuestAccel};

/// QEMU machine type: `pc` (i440FX, SeaBIOS). `microvm` would boot faster, but with this
/// kernel and `reboot=t` it does not exit after the guest's `reboot -f` (it hangs).
pub const QEMU_MACHINE: &str = "pc";
const QEMU_BIN: &str = "qemu-system-x86_64";
/// The firmware QEMU 7.2 `-M pc` opens when booting with `-kernel` (seen with strace): SeaBIOS,
/// the fw_cfg DMA Linux boot option ROM, the vAPIC option ROM.
const QEMU_FIRMWARE: [&str; 3] = ["bios-256k.bin", "linuxboot_dma.bin", "kvmvapic.bin"];
/// Where QEMU firmware is looked up on the host (Debian puts SeaBIOS in /usr/share/seabios).
const QEMU_FIRMWARE_DIRS: [&str; 4] = [
    "/usr/share/qemu",
    "/usr/share/seabios",
    "/usr/lib/ipxe/qemu",
    "/usr/local/share/qemu",
];

/// How to run QEMU (paths as seen where it runs).
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct QemuPlan {
    bin: PathBuf,
    /// `LD_LIBRARY_PATH` (the shipped libraries), if any.
    lib_dir: Option<PathBuf>,
    /// QEMU's ELF interpreter (`PT_INTERP`, as `ldd` shows it on the host) ...
    interp: Option<PathBuf>,
    /// ... and its shipped copy, used explicitly when `interp` does not exist where QEMU runs.
    loader: Option<PathBuf>,
    /// `-L` (the shipped firmware), if any.
    firmware_dir: Option<PathBuf>,
}

// ---------------------------------------------------------------------------------------------
// The host's QEMU installation.

pub struct QemuInstall {
    bin: PathBuf,
    /// Shared libraries (as `ldd` names them) and the ELF interpreter.
    libs: Vec<PathBuf>,
    interp: Option<PathBuf>,
    firmware: Vec<PathBuf>,
}

impl QemuInstall {
    /// Runs the host's QEMU as it is installed.
    pub fn on_host(&self) -> QemuPlan {
        QemuPlan {
            bin: self.bin.clone(),
            lib_dir: None,
            interp: None,
            loader: None,
            firmware_dir: None,
        }
    }

    /// Adds QEMU, its libraries and its firmware to the payload `files`; the plan runs them
    /// in the helper VM.
    pub fn ship(&self, files: &mut Vec<(PathBuf, String)>) -> Result<QemuPlan> {
        files.push((self.bin.clone(), format!("qemu/bin/{QEMU_BIN}")));
        let mut seen = std::collections::BTreeSet::new();
        for lib in &self.libs {
            let name = file_name(lib)?;
            if seen.insert(name.clone()) {
                files.push((lib.clone(), format!("qemu/lib/{name}")));
            }
        }
        for fw in &self.firmware {
            files.push((fw.clone(), format!("qemu/share/{}", file_name(fw)?)));
        }
        let lib_dir = PathBuf::from(helper_vm::payload_path("qemu/lib"));
        let loader = match &self.interp {
            Some(i) => Some(lib_dir.join(file_name(i)?)),
            None => None,
        };
        Ok(QemuPlan {
            bin: helper_vm::payload_path(&format!("qemu/bin/{QEMU_BIN}")).into(),
            lib_dir: Some(lib_dir),
            // The worker uses the loader only if QEMU's PT_INTERP is missing in L1 (it is
            // there when detvisor itself is dynamically linked: the launcher ships it).
            interp: self.interp.clone(),
            loader,
            firmware_dir: Some(helper_vm::payload_path("qemu/share").into()),
        })
    }
}

/// The host's `qemu-system-x86_64`, found in `PATH`.
pub fn find_qemu() -> Result<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(QEMU_BIN))
                .find(|p| p.is_file())
        })
        .with_context(|| format!("{QEMU_BIN} not found in PATH: install qemu-system-x86"))
}

pub fn discover_qemu() -> Result<QemuInstall> {
    let bin = find_qemu()?;
    let libs = helper_vm::shared_libraries(&bin).context("QEMU's shared libraries")?;
    let interp = helper_vm::elf_interpreter_of(&bin).context("QEMU's ELF interpreter")?;
    let bin_dir = bin.parent().unwrap_or(Path::new("/"));
    let mut dirs: Vec<PathBuf> = vec![
        bin_dir.join("../share/qemu"),
        bin_dir.join("../share/seabios"),
    ];
    dirs.extend(QEMU_FIRMWARE_DIRS.iter().map(PathBuf::from));
    let mut firmware = Vec::new();
    for name in QEMU_FIRMWARE {
        let found = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
        match found {
            Some(p) => firmware.push(p),
            None => bail!(
                "QEMU firmware {name} not found in {}",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    Ok(QemuInstall {
        bin,
        libs,
        interp,
        firmware,
    })
}

fn file_name(p: &Path) -> Result<String> {
    p.file_name()
        .and_then(|n| n.to_str())
        .map(String::from)
        .with_context(|| format!("unusable file name {}", p.display()))
}

// ---------------------------------------------------------------------------------------------
// One run.

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    TcgIcount,
}

pub struct QemuFiles<'a> {
    pub bzimage: &'a Path,
    pub initrd: &'a Path,
    pub cmdline: &'a str,
    pub mem: &'a str,
}

pub fn qemu_command(
    q: &QemuPlan,
    accel: Accel,
    files: &QemuFiles,
    serial: &Path,
    status: &Path,
) -> Command {
    let interp_missing = q.interp.as_ref().is_some_and(|i| !i.exists());
    let mut cmd = match (&q.loader, &q.lib_dir) {
        (Some(loader), Some(lib_dir)) if interp_missing => {
            let mut c = Command::new(loader);
            c.arg("--library-path").arg(lib_dir).arg(&q.bin);
            c
        }
        _ => Command::new(&q.bin),
    };
    if let Some(lib_dir) = &q.lib_dir {
        cmd.env("LD_LIBRARY_PATH", lib_dir);
    }
    cmd.args(direct_boot_args(&DirectBoot {
        accel: match accel {
            Accel::Kvm => GuestAccel::Kvm,
            Accel::TcgIcount => GuestAccel::TcgIcount { rtc_base: None },
        },
        machine: QEMU_MACHINE,
        memory: files.mem,
        firmware_dir: q.firmware_dir.as_deref(),
        serial,
        status,
        kernel: files.bzimage,
        initrd: files.initrd,
        append: files.cmdline,
    }));
    cmd
}

pub struct QemuRun<'a> {
    pub q: &'a QemuPlan,
    pub accel: Accel,
    pub files: QemuFiles<'a>,
    pub scratch: &'a Path,
    pub label: &'a str,
    pub limit: Duration,
    pub ram_bytes: u64,
}

impl QemuRun<'_> {
    pub fn command(&self, index: u32) -> (Command, PathBuf, PathBuf) {
        let serial = self.scratch.join(format!("{}-{index}.serial", self.label));
        let status = self.scratch.join(format!("{}-{index}.status", self.label));
        let _ = fs::remove_file(&serial);
        let _ = fs::remove_file(&status);
        let cmd = qemu_command(self.q, self.accel, &self.files, &serial, &status);
        (cmd, serial, status)
    }

    pub fn run(&self, index: u32, sample: bool, stats: bool) -> (RunResult, Option<MemoryPeak>) {
        let (cmd, serial_path, status_path) = self.command(index);
        let watch = Watch {
            ram: sample.then_some(self.ram_bytes),
            kvm: stats,
        };
        run_measured(cmd, self.limit, watch, |finished| {
            let serial = fs::read(&serial_path).unwrap_or_default();
            let status = fs::read(&status_path).unwrap_or_default();
            let mut r = RunResult {
                wall_ms: ms(finished.wall),
                guest_status: (status.len() == 1).then(|| status[0]),
                kvm: finished.kvm.clone(),
                output: Some(fnv1a(&serial)),
                output_bytes: Some(serial.len() as u64),
                ..RunResult::default()
            };
            r.error = qemu_failure(finished, &status, &serial, 8, self.limit);
            r.ok = r.error.is_none();
            r
        })
    }
}

/// Why a QEMU run that wrote `status` to port 0x610 and `serial` to its serial port failed
/// (it did not exit 0, or the guest did not write exactly one byte 0), with the last
/// `serial_lines` of its serial output; `None` when it succeeded.
pub fn qemu_failure(
    finished: &Finished,
    status: &[u8],
    serial: &[u8],
    serial_lines: usize,
    limit: Duration,
) -> Option<String> {
    if !finished.succeeded() {
        Some(finished.failure("QEMU", limit))
    } else if status != [0] {
        Some(format!(
            "the guest wrote {status:?} to port 0x610 (expected one byte 0); serial ends with:\n{}",
            last_lines(&String::from_utf8_lossy(serial), serial_lines)
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This host's QEMU (the helper VM needs it, so the tests' hosts have
    /// it): its loader and libraries as `ldd` resolves them, the loader
    /// among them, every one a file here.
    #[test]
    fn test_the_hosts_qemu_is_found_with_its_loader_and_libraries() {
        let install = discover_qemu().unwrap();
        let loader = install.interp.clone().expect("QEMU is dynamically linked");
        assert!(install.libs.contains(&loader), "{:?}", install.libs);
        assert!(install.libs.len() > 1, "{:?}", install.libs);
        for lib in &install.libs {
            assert!(lib.is_file(), "{}", lib.display());
        }
    }

    #[test]
    fn qemu_tcg_icount_command_line_on_the_host() {
        let install = QemuInstall {
            bin: "/usr/bin/qemu-system-x86_64".into(),
            libs: Vec::new(),
            interp: None,
            firmware: Vec::new(),
        };
        let files = QemuFiles {
            bzimage: Path::new("/b/bzImage"),
            initrd: Path::new("/b/initrd"),
            cmdline: "console=ttyS0",
            mem: "256M",
        };
        let cmd = qemu_command(
            &install.on_host(),
            Accel::TcgIcount,
            &files,
            Path::new("/t/a,b.serial"),
            Path::new("/t/st"),
        );
        assert_eq!(
            crate::process::command_words(&cmd).join(" "),
            "/usr/bin/qemu-system-x86_64 -accel tcg -icount shift=0,sleep=off -rtc clock=vm \
             -M pc -m 256M -nodefaults -no-user-config -display none -no-reboot \
             -chardev file,id=ser0,path=/t/a,,b.serial -serial chardev:ser0 \
             -chardev file,id=status,path=/t/st -device isa-debugcon,iobase=0x610,chardev=status \
             -kernel /b/bzImage -initrd /b/initrd -append console=ttyS0"
        );
        assert_eq!(cmd.get_envs().count(), 0);
    }
}
