//! How to start the helper VM: [`HelperVmConfig`].

use std::path::PathBuf;

use crate::assets::default_assets_dir;

/// QEMU binary used when none is configured.
pub const DEFAULT_QEMU: &str = "qemu-system-x86_64";
/// Guest memory of the helper VM (MiB): room for the payload's own guests.
pub const DEFAULT_MEMORY_MIB: u32 = 4096;

/// How to start the helper VM.
#[derive(Debug, Clone)]
pub struct HelperVmConfig {
    /// Forward our stdin to the payload even when it is not a terminal (a pipe, a file), and
    /// mark its end with an EOT byte ([`crate::EOT`]): the payload reads a raw serial line,
    /// which has no end of file of its own. Only for [`crate::run`]; the channel carries
    /// stdin per call.
    pub forward_stdin_always: bool,
    /// QEMU binary (default `qemu-system-x86_64`, looked up in `PATH`).
    pub qemu: PathBuf,
    /// Directory holding `vmlinuz` (and optionally `vmlinux`) and `initramfs.cpio.gz`
    /// (see [`crate::ensure_assets`]).
    pub assets_dir: PathBuf,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Virtual CPUs of the helper VM (at least 1). More than one runs QEMU's multi-threaded
    /// TCG (`-accel tcg,thread=multi`): one host thread per vCPU.
    pub cpus: u32,
    /// Appended to the kernel command line.
    pub extra_kernel_args: String,
    /// Host directories shared read-write with the payload, each mounted in L1 at the same
    /// absolute path (virtio-9p, QEMU `security_model=none`: files the payload creates are
    /// ordinary host files owned by the user running QEMU). Each must be an absolute,
    /// canonical (`fs::canonicalize`) directory other than `/` that neither is, contains nor
    /// lies inside one of L1's own directories (`/bin`, `/sbin`, `/usr/bin`, `/usr/sbin`,
    /// `/dev`, `/proc`, `/sys`, `/payload`, `/etc/helper-vm`). Nested shares are allowed.
    pub shared_dirs: Vec<PathBuf>,
    /// The payload's working directory in L1 (absolute; typically inside a shared directory,
    /// e.g. the launcher's current directory). `None`: `/payload/files`, where relative
    /// [`crate::PayloadFile`] names resolve.
    pub workdir: Option<PathBuf>,
}

impl Default for HelperVmConfig {
    fn default() -> Self {
        Self {
            forward_stdin_always: false,
            qemu: PathBuf::from(DEFAULT_QEMU),
            assets_dir: default_assets_dir(),
            memory_mib: DEFAULT_MEMORY_MIB,
            cpus: 1,
            extra_kernel_args: String::new(),
            shared_dirs: Vec::new(),
            workdir: None,
        }
    }
}
