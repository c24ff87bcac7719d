//! The helper VM: runs a program inside an L1 Linux guest that has real KVM.
//!
//! On hosts whose `/dev/kvm` cannot run a Linux guest (e.g. `kvm_pvm`), detvisor re-runs itself
//! inside a helper VM: a stock Debian kernel under `qemu-system-x86_64 -accel tcg` with an
//! emulated AMD CPU that has SVM + NPT, whose busybox initramfs loads `kvm-amd` and then runs
//! the payload. The assets are built by `helper-vm/build.sh` (see `helper-vm/README.md`).
//!
//! Two ways to use it:
//! * [`run`]: one program, to its end (one boot per program); its stdout and stderr come back
//!   over serial ports, its exit status is returned.
//! * [`HelperVm`]: a long-lived payload that serves typed requests over one bidirectional
//!   channel (a virtio-serial port, see [`channel`]); [`HelperVm::call`] may be issued many
//!   times on one boot, the payload's output for a call streaming back as it is written.
//!
//! Modules, one concern each:
//! * `assets`: the cached kernel and initramfs, their features, building them;
//! * `payload` (with `args`, `libs`): the archive appended to the initramfs;
//! * `shares`: host directories mounted in L1 over virtio-9p;
//! * `qemu`, `stdio`, `launch`: the QEMU process, its serial stdio, starting and ending it;
//! * `run`: the one-shot run; [`channel`]: frames, the host end ([`HelperVm`]) and the guest
//!   end ([`channel::serve`]);
//! * `placement`: host KVM or helper VM;
//! * [`client`]: the run library's requests answered in a helper VM (what each ships
//!   into it), and a runner placed here or there.

mod args;
mod assets;
pub mod channel;
pub mod client;
mod config;
mod launch;
mod libs;
mod payload;
mod placement;
mod qemu;
mod run;
mod shares;
mod stdio;
pub mod tempdir;

pub use args::NulInArgument;
pub use assets::{
    default_assets_dir, default_build_script, ensure_assets, AssetsError, BUILD_INFO_FILE,
    INITRAMFS_FILE, KERNEL_FILE, PVH_KERNEL_FILE,
};
pub use channel::{CallError, HelperVm, StartError};
pub use config::{HelperVmConfig, DEFAULT_MEMORY_MIB, DEFAULT_QEMU};
pub use launch::{LaunchError, KEEP_TMP_ENV};
pub use libs::{elf_interpreter_of, shared_libraries, LibsError};
pub use payload::{payload_path, PayloadError, PayloadFile};
pub use placement::{placement, qemu_available, HostVmMode, Placement};
pub use qemu::{direct_boot_args, DirectBoot, GuestAccel, VmFailed};
pub use run::{run, RunError};
pub use shares::ShareError;
pub use stdio::EOT;
pub use tempdir::TempDir;

/// Exit status the helper VM's init reports when it could not run the payload at all
/// (e.g. `/dev/kvm` did not appear); the reason is on stderr.
pub const STATUS_HELPER_FAILED: i32 = 125;
