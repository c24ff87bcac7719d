//! The helper VM: runs a program inside an L1 Linux guest that has real KVM.
//!
//! On hosts whose `/dev/kvm` cannot run a Linux guest (e.g. `kvm_pvm`), detvisor re-runs itself
//! inside a helper VM: a stock Debian kernel under `qemu-system-x86_64 -accel tcg` with an
//! emulated AMD CPU that has SVM + NPT, whose busybox initramfs loads `kvm-amd` and then runs
//! the payload. The assets are built by `helper-vm/build.sh` (see `helper-vm/README.md`).
//!
//! How the payload gets in: the launcher copies the base `initramfs.cpio.gz`, pads it with zeros
//! to a multiple of 4 bytes and appends an uncompressed newc archive holding
//! `/payload/detvisor` (the program), `/payload/args` (argv, NUL-terminated),
//! `/payload/args.sh` (argv as one shell-quoted `set --` line, which the init actually uses),
//! `/payload/stdin` (`tty` or `null`), `/payload/files/<name>` for each [`PayloadFile`] and, for
//! a dynamically linked program, its ELF interpreter and shared libraries (as `ldd` resolves
//! them on the host) at their host paths. The kernel unpacks both archives into one rootfs.
//!
//! How results get out (16550 UARTs):
//! * ttyS0: the payload's stdout (and stdin). QEMU's `-chardev stdio` whose stdout is a pipe we
//!   copy to our stdout live, so bytes arrive as the payload wrote them (the L1 tty is raw,
//!   `-opost`: no `\n` -> `\r\n`). QEMU's stdin is a pipe fed from our stdin when that is a
//!   terminal we own (foreground process group), /dev/null otherwise.
//! * ttyS1: the payload's stderr and the init's own errors: a pipe copied to our stderr live.
//! * ttyS2: the exit status, decimal + `\n`, into a temp file.
//! * ttyS3: the kernel console (`console=ttyS3`), into a temp file shown only on failure, so
//!   kernel messages never reach ttyS0.
//! * [`HelperVmConfig::shared_dirs`]: host directories shared read-write over virtio-9p and
//!   mounted at the same absolute paths in L1, so files the payload writes there (snapshots)
//!   outlive the helper VM.

// The CLI wires in only part of this API at first.
#![allow(dead_code)]

use anyhow::{anyhow, bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, BufWriter, IsTerminal, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

/// QEMU binary used when none is configured.
pub const DEFAULT_QEMU: &str = "qemu-system-x86_64";
/// Guest memory of the helper VM (MiB): room for the payload's own guests.
pub const DEFAULT_MEMORY_MIB: u32 = 4096;
/// Exit status the helper VM's init reports when it could not run the payload at all
/// (e.g. `/dev/kvm` did not appear); the reason is on stderr.
pub const STATUS_HELPER_FAILED: i32 = 125;
/// Kernel image (bzImage) in an assets directory.
pub const KERNEL_FILE: &str = "vmlinuz";
/// Optional decompressed kernel (ELF with a PVH entry) in an assets directory: preferred when
/// present, as it saves the ~7 s that decompressing the bzImage takes under TCG.
pub const PVH_KERNEL_FILE: &str = "vmlinux";
/// Base initramfs in an assets directory.
pub const INITRAMFS_FILE: &str = "initramfs.cpio.gz";
/// Description of an assets directory written by build.sh; its `features` line says what the
/// assets support.
pub const BUILD_INFO_FILE: &str = "build-info";
/// Asset feature: the initramfs has the 9p modules and an init that mounts shared directories.
const FEATURE_SHARES: &str = "9p";
/// Asset feature: the init honours `/payload/workdir.sh`.
const FEATURE_WORKDIR: &str = "workdir";
/// Features this launcher can use; [`ensure_assets`] rebuilds assets that lack one.
const FEATURES: [&str; 2] = [FEATURE_SHARES, FEATURE_WORKDIR];
/// Host directories L1's init needs for itself: a shared directory may not be, contain or lie
/// inside one of them (mounting over them would hide busybox, the payload or the kernel's
/// filesystems).
const RESERVED_L1_PATHS: [&str; 9] = [
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/dev",
    "/proc",
    "/sys",
    "/payload",
    "/etc/helper-vm",
];

/// Fixed part of the L1 kernel command line. The console is ttyS3 (a log file), so that no
/// kernel message can reach the payload's stdout on ttyS0; `panic=-1` plus QEMU's
/// `-no-reboot` turns a panic into a QEMU exit instead of a hang.
const KERNEL_ARGS: &str = "console=ttyS3 quiet panic=-1";
/// How much of each output stream is kept for error messages.
const TAIL_BYTES: usize = 4096;

/// How to start the helper VM.
#[derive(Debug, Clone)]
pub struct HelperVmConfig {
    /// Forward our stdin to the payload even when it is not a terminal (a
    /// pipe, a file), and mark its end with an EOT byte (0x04): the payload
    /// reads a raw serial line, which has no end of file of its own.
    pub forward_stdin_always: bool,
    /// QEMU binary (default `qemu-system-x86_64`, looked up in `PATH`).
    pub qemu: PathBuf,
    /// Directory holding `vmlinuz` (and optionally `vmlinux`) and `initramfs.cpio.gz`
    /// (see [`ensure_assets`]).
    pub assets_dir: PathBuf,
    /// Guest memory in MiB.
    pub memory_mib: u32,
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
    /// [`PayloadFile`] names resolve.
    pub workdir: Option<PathBuf>,
}

impl Default for HelperVmConfig {
    fn default() -> Self {
        Self {
            forward_stdin_always: false,
            qemu: PathBuf::from(DEFAULT_QEMU),
            assets_dir: default_assets_dir(),
            memory_mib: DEFAULT_MEMORY_MIB,
            extra_kernel_args: String::new(),
            shared_dirs: Vec::new(),
            workdir: None,
        }
    }
}

/// A host file made available to the payload, at [`payload_path`]`(payload_name)`.
#[derive(Debug, Clone)]
pub struct PayloadFile {
    pub host_path: PathBuf,
    /// Relative path below `/payload/files/` (`/`-separated; no empty, `.` or `..` parts).
    pub payload_name: String,
}

/// The path under which the payload sees the [`PayloadFile`] named `payload_name`. Unless
/// [`HelperVmConfig::workdir`] is set, the payload runs in `/payload/files`, so `payload_name`
/// also works as a relative path there.
pub fn payload_path(payload_name: &str) -> String {
    format!("/payload/files/{payload_name}")
}

/// `${DETVISOR_CACHE:-$HOME/.cache/detvisor}` (`$HOME` falls back to `/tmp`, as in build.sh).
fn cache_root() -> PathBuf {
    match std::env::var_os("DETVISOR_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let home = std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| OsString::from("/tmp"));
            PathBuf::from(home).join(".cache/detvisor")
        }
    }
}

/// `${DETVISOR_CACHE:-$HOME/.cache/detvisor}/helper-vm/default`: the symlink build.sh points at
/// the newest assets.
pub fn default_assets_dir() -> PathBuf {
    cache_root().join("helper-vm/default")
}

/// `helper-vm/build.sh` of the source tree this binary was built from.
pub fn default_build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("helper-vm/build.sh")
}

fn assets_complete(dir: &Path) -> bool {
    dir.join(KERNEL_FILE).is_file() && dir.join(INITRAMFS_FILE).is_file()
}

/// The words of the `features` line of `dir`'s build-info (empty for assets built before
/// build.sh wrote one).
fn asset_features(dir: &Path) -> BTreeSet<String> {
    let info = fs::read_to_string(dir.join(BUILD_INFO_FILE)).unwrap_or_default();
    info.lines()
        .filter_map(|l| l.strip_prefix("features "))
        .flat_map(str::split_whitespace)
        .map(String::from)
        .collect()
}

fn has_features(dir: &Path, wanted: &[&str]) -> bool {
    let have = asset_features(dir);
    wanted.iter().all(|f| have.contains(*f))
}

/// Returns the helper VM assets directory, building the assets first (with `build_script`, by
/// default [`default_build_script`]) when [`default_assets_dir`] lacks them or they predate a
/// feature this launcher uses (shared directories, working directory: the `features` line of
/// `build-info`). A first build downloads the kernel package (~70 MB) and takes ~15 s; its
/// progress goes to stderr. Otherwise assets that exist are used as they are: to refresh them
/// run the build script, which is a fast no-op when nothing changed.
pub fn ensure_assets(build_script: Option<&Path>) -> Result<PathBuf> {
    let dir = default_assets_dir();
    let complete = assets_complete(&dir);
    if complete && has_features(&dir, &FEATURES) {
        return Ok(dir);
    }
    let script = build_script.map_or_else(default_build_script, Path::to_path_buf);
    if complete && !script.is_file() {
        // Older assets and no source tree to rebuild them: fine unless a run needs the
        // missing feature, which `run` then reports.
        return Ok(dir);
    }
    if !script.is_file() {
        bail!(
            "helper VM assets missing in {} and the build script {} does not exist",
            dir.display(),
            script.display()
        );
    }
    // Its stdout (the assets directory) is ours to read: our stdout carries only payload output.
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run bash {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "building the helper VM assets failed ({}): see the messages of {} above",
            out.status,
            script.display()
        );
    }
    let printed = String::from_utf8_lossy(&out.stdout);
    let built = printed
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(PathBuf::from)
        .unwrap_or(dir);
    if !assets_complete(&built) {
        bail!(
            "{} finished but {} lacks {KERNEL_FILE} or {INITRAMFS_FILE}",
            script.display(),
            built.display()
        );
    }
    Ok(built)
}

/// Runs `exe` with `args` inside the helper VM; streams its stdout to our stdout live and its
/// stderr to our stderr; returns its exit status (0..=255; a payload killed by signal N gives
/// 128+N; [`STATUS_HELPER_FAILED`] when the helper VM could not start it, the reason being on
/// stderr). Errors name what went wrong on the host side: QEMU or the assets missing, QEMU
/// failing or killed, no exit status reported (with the tail of what came back).
pub fn run(
    config: &HelperVmConfig,
    exe: &Path,
    args: &[OsString],
    files: &[PayloadFile],
) -> Result<i32> {
    run_to(config, exe, args, files, Target::Stdout, Target::Stderr)
}

/// [`run`] with the payload's stdout and stderr sent to the given targets.
fn run_to(
    config: &HelperVmConfig,
    exe: &Path,
    args: &[OsString],
    files: &[PayloadFile],
    out_target: Target,
    err_target: Target,
) -> Result<i32> {
    let pvh_kernel = config.assets_dir.join(PVH_KERNEL_FILE);
    let kernel = if pvh_kernel.is_file() {
        pvh_kernel
    } else {
        config.assets_dir.join(KERNEL_FILE)
    };
    let base_initramfs = config.assets_dir.join(INITRAMFS_FILE);
    if !assets_complete(&config.assets_dir) {
        bail!(
            "helper VM assets missing: {} must hold {KERNEL_FILE} and {INITRAMFS_FILE} \
             (build them with helper-vm/build.sh)",
            config.assets_dir.display()
        );
    }
    let shares = checked_shares(&config.shared_dirs)?;
    let workdir = checked_workdir(config.workdir.as_deref())?;
    for (needed, feature, what) in [
        (!shares.is_empty(), FEATURE_SHARES, "shared directories"),
        (workdir.is_some(), FEATURE_WORKDIR, "a working directory"),
    ] {
        if needed && !has_features(&config.assets_dir, &[feature]) {
            bail!(
                "the helper VM assets in {} predate {what} (no `features ... {feature}` in \
                 {BUILD_INFO_FILE}): rebuild them with helper-vm/build.sh",
                config.assets_dir.display()
            );
        }
    }
    let forward_stdin = config.forward_stdin_always || stdin_is_foreground_terminal();
    let options = PayloadOptions {
        stdin_tty: forward_stdin,
        shares: &shares,
        workdir,
    };
    let entries = payload_entries(exe, args, files, &options)?;

    let tmp = new_temp_dir().context("cannot create a temporary directory for the helper VM")?;
    let initrd = tmp.path().join("initrd.img");
    write_initrd(&base_initramfs, &entries, &initrd)?;
    let status_path = tmp.path().join("status");
    let console_path = tmp.path().join("console.log");
    let qemu_log_path = tmp.path().join("qemu.log");

    let (out_r, out_w) = io::pipe().context("pipe")?;
    let (err_r, err_w) = io::pipe().context("pipe")?;
    let stdin_pipe = if forward_stdin {
        Some(io::pipe().context("pipe")?)
    } else {
        None
    };
    let qemu_log = File::create(&qemu_log_path)
        .with_context(|| format!("cannot create {}", qemu_log_path.display()))?;

    let err_fd = err_w.as_raw_fd();
    let qemu_args = qemu_args(
        config,
        &kernel,
        &initrd,
        &format!("/dev/fd/{err_fd}"),
        &status_path,
        &console_path,
        &shares,
    );
    let mut cmd = Command::new(&config.qemu);
    cmd.args(&qemu_args)
        .stdout(Stdio::from(OwnedFd::from(out_w)))
        .stderr(Stdio::from(qemu_log));
    let mut stdin_writer = None;
    match stdin_pipe {
        Some((r, w)) => {
            cmd.stdin(Stdio::from(OwnedFd::from(r)));
            stdin_writer = Some(w);
        }
        None => {
            cmd.stdin(Stdio::null());
        }
    }
    let parent = libc::pid_t::try_from(std::process::id()).context("pid")?;
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls (fcntl, prctl, getppid, _exit) on plain integers; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            // QEMU opens ttyS1's pipe as /dev/fd/<err_fd>: keep it open across exec.
            if libc::fcntl(err_fd, libc::F_SETFD, 0) == -1 {
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
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            bail!(
                "{} not found: install qemu-system-x86",
                config.qemu.display()
            )
        }
        Err(e) => return Err(e).with_context(|| format!("cannot start {}", config.qemu.display())),
    };
    // Only QEMU may hold the write ends now, so that the copy threads see EOF when it exits.
    drop(cmd);
    drop(err_w);

    // Set once the payload has written anything: L1's serial line is ready
    // (raw, no echo) by then, so forwarded input is neither echoed nor
    // flushed by L1's boot.
    let payload_spoke = Arc::new(AtomicBool::new(false));
    let (out_spoke, err_spoke) = (payload_spoke.clone(), payload_spoke.clone());
    let out_thread = thread::spawn(move || pump(out_r, out_target, &out_spoke));
    let err_thread = thread::spawn(move || pump(err_r, err_target, &err_spoke));
    let stdin_stop = match stdin_writer {
        Some(w) => {
            // A terminal's user types after seeing output anyway; piped input
            // must wait for the payload explicitly.
            let wait_for = config.forward_stdin_always.then_some(payload_spoke);
            Some(StdinForwarder::start(
                w,
                config.forward_stdin_always,
                wait_for,
            )?)
        }
        None => None,
    };

    let wait = child.wait();
    if let Some(fwd) = stdin_stop {
        fwd.stop();
    }
    let out_tail = out_thread
        .join()
        .map_err(|_| anyhow!("stdout copy thread panicked"))?;
    let err_tail = err_thread
        .join()
        .map_err(|_| anyhow!("stderr copy thread panicked"))?;
    let qemu_status = wait.context("waiting for QEMU")?;

    if let Some(code) = parse_status(&fs::read(&status_path).unwrap_or_default()) {
        return Ok(code);
    }

    let qemu_log = fs::read(&qemu_log_path).unwrap_or_default();
    let qemu_log_text = String::from_utf8_lossy(&qemu_log);
    let why = if let Some(sig) = qemu_status.signal() {
        format!("QEMU was killed by signal {sig}")
    } else if let Some(line) = qemu_log_text
        .lines()
        .find(|l| l.contains("terminating on signal"))
    {
        format!("QEMU was stopped by a signal ({})", line.trim())
    } else if !qemu_status.success() {
        format!("QEMU failed ({qemu_status})")
    } else {
        "the helper VM shut down without reporting the payload's exit status".to_string()
    };
    let console = fs::read(&console_path).unwrap_or_default();
    // The requested CPU model has features TCG lacks; QEMU warns about each on every start.
    let qemu_messages: String = qemu_log_text
        .lines()
        .filter(|l| !l.contains("TCG doesn't support requested feature"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut msg = format!("helper VM: {why}");
    for (title, bytes) in [
        ("QEMU messages", qemu_messages.as_bytes()),
        ("L1 kernel console", tail(&console, TAIL_BYTES)),
        ("payload stderr", err_tail.as_slice()),
        ("payload stdout", out_tail.as_slice()),
    ] {
        let text = String::from_utf8_lossy(tail(bytes, TAIL_BYTES)).replace("\r\n", "\n");
        let text = text.trim_end();
        if !text.is_empty() {
            msg.push_str(&format!("\n--- {title} (last lines) ---\n{text}"));
        }
    }
    Err(anyhow!(msg))
}

/// The 9p mount tag of the `index`th entry of [`checked_shares`].
fn share_tag(index: usize) -> String {
    format!("share{index}")
}

/// Validates [`HelperVmConfig::shared_dirs`]; returns them in mount order (sorted by path, so a
/// parent comes before the shares nested in it). The mount tag of the `i`th is
/// [`share_tag`]`(i)`.
fn checked_shares(dirs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::with_capacity(dirs.len());
    for d in dirs {
        if !d.is_absolute() {
            bail!("shared directory {} is not an absolute path", d.display());
        }
        if d.as_os_str().as_bytes().contains(&0) {
            bail!("shared directory {d:?} contains a NUL byte");
        }
        let canonical = fs::canonicalize(d)
            .with_context(|| format!("shared directory {} not found", d.display()))?;
        if canonical != *d {
            bail!(
                "shared directory {} is not canonical (it is {}): it is mounted in the helper \
                 VM at the path given, which must be the real one",
                d.display(),
                canonical.display()
            );
        }
        if !canonical.is_dir() {
            bail!("shared directory {} is not a directory", d.display());
        }
        if d.parent().is_none() {
            bail!("the root directory cannot be shared with the helper VM");
        }
        if let Some(r) = RESERVED_L1_PATHS
            .iter()
            .find(|r| d.starts_with(r) || Path::new(r).starts_with(d))
        {
            bail!(
                "shared directory {} would hide or lie inside the helper VM's own {r}",
                d.display()
            );
        }
        out.push(canonical);
    }
    out.sort();
    if let Some(w) = out.windows(2).find(|w| w[0] == w[1]) {
        bail!("shared directory {} given twice", w[0].display());
    }
    Ok(out)
}

/// Validates [`HelperVmConfig::workdir`].
fn checked_workdir(dir: Option<&Path>) -> Result<Option<&Path>> {
    if let Some(d) = dir {
        if !d.is_absolute() {
            bail!(
                "helper VM working directory {} is not an absolute path",
                d.display()
            );
        }
        if d.as_os_str().as_bytes().contains(&0) {
            bail!("helper VM working directory {d:?} contains a NUL byte");
        }
    }
    Ok(dir)
}

/// The QEMU command line (without the binary). ttyS0 is QEMU's stdio, ttyS1 `err_path`;
/// `shares` (from [`checked_shares`]) become virtio-9p PCI devices tagged [`share_tag`].
fn qemu_args(
    config: &HelperVmConfig,
    kernel: &Path,
    initrd: &Path,
    err_path: &str,
    status_path: &Path,
    console_path: &Path,
    shares: &[PathBuf],
) -> Vec<OsString> {
    let mut append = KERNEL_ARGS.to_string();
    if !config.extra_kernel_args.trim().is_empty() {
        append.push(' ');
        append.push_str(config.extra_kernel_args.trim());
    }
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |s: &str| a.push(OsString::from(s));
    for s in [
        "-accel",
        "tcg",
        "-cpu",
        "EPYC,+svm,+npt,+nrip-save",
        "-smp",
        "1",
        "-m",
        &config.memory_mib.to_string(),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-chardev",
        "stdio,id=hvm0,signal=off",
        "-chardev",
        &format!("file,id=hvm1,path={}", qemu_opt_value(err_path)),
        "-chardev",
        &format!(
            "file,id=hvm2,path={}",
            qemu_opt_value(&status_path.to_string_lossy())
        ),
        "-chardev",
        &format!(
            "file,id=hvm3,path={}",
            qemu_opt_value(&console_path.to_string_lossy())
        ),
        "-serial",
        "chardev:hvm0",
        "-serial",
        "chardev:hvm1",
        "-serial",
        "chardev:hvm2",
        "-serial",
        "chardev:hvm3",
        "-append",
        &append,
    ] {
        push(s);
    }
    // One virtio-9p PCI device per share (the `pc` machine keeps its PCI bus under
    // -nodefaults). security_model=none: QEMU creates files with the guest's uid/gid and mode
    // where it can (we are root on both sides) and silently keeps its own where it cannot, so
    // host files are plain files with no xattr metadata (mapped-xattr would store the mode in
    // xattrs and leave 0600 files). multidevs=remap keeps inode numbers unique when the
    // directory has other filesystems mounted below it.
    for (i, dir) in shares.iter().enumerate() {
        let mut fsdev =
            format!("local,id=fsdev{i},security_model=none,multidevs=remap,path=").into_bytes();
        fsdev.extend_from_slice(&qemu_opt_bytes(dir.as_os_str().as_bytes()));
        a.push("-fsdev".into());
        a.push(OsString::from_vec(fsdev));
        a.push("-device".into());
        a.push(format!("virtio-9p-pci,fsdev=fsdev{i},mount_tag={}", share_tag(i)).into());
    }
    a.push("-kernel".into());
    a.push(kernel.into());
    a.push("-initrd".into());
    a.push(initrd.into());
    a
}

/// Escapes a value inside a QEMU `key=value,...` option string.
fn qemu_opt_value(v: &str) -> String {
    v.replace(',', ",,")
}

/// [`qemu_opt_value`] for raw bytes (paths need not be UTF-8).
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

/// End of transmission: how the end of forwarded stdin reaches the payload.
pub const EOT: u8 = 0x04;

/// Whether stdin is a terminal whose foreground process group is ours. Only then is it
/// forwarded to the payload: reading it from a background group (e.g. under `timeout`, which
/// runs its command in a process group of its own) would stop us with SIGTTIN.
fn stdin_is_foreground_terminal() -> bool {
    if !io::stdin().is_terminal() {
        return false;
    }
    // SAFETY: tcgetpgrp and getpgrp only query the kernel about fd 0 and this process.
    unsafe { libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Copies our stdin (a terminal, left in its own mode: lines arrive when Enter is pressed) to
/// QEMU's stdin until our stdin ends or [`StdinForwarder::stop`].
struct StdinForwarder {
    stop_w: io::PipeWriter,
    thread: thread::JoinHandle<()>,
}

impl StdinForwarder {
    /// With `eot_at_end`, the end of our stdin is passed on as one EOT byte;
    /// with `wait_for`, nothing is forwarded before that flag is set.
    fn start(
        mut to_qemu: io::PipeWriter,
        eot_at_end: bool,
        wait_for: Option<Arc<AtomicBool>>,
    ) -> Result<Self> {
        let (stop_r, stop_w) = io::pipe().context("pipe")?;
        let thread = thread::spawn(move || {
            if let Some(flag) = wait_for {
                while !flag.load(Ordering::Acquire) {
                    let mut fds = [libc::pollfd {
                        fd: stop_r.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    }];
                    // SAFETY: fds is a valid array of one pollfd that outlives the call.
                    if unsafe { libc::poll(fds.as_mut_ptr(), 1, 50) } > 0 {
                        return; // stopped before the payload spoke
                    }
                }
            }
            let stdin = io::stdin();
            let mut buf = [0u8; 4096];
            loop {
                let mut fds = [
                    libc::pollfd {
                        fd: stdin.as_fd().as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: stop_r.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: fds is a valid array of 2 pollfd structs that outlives the call.
                let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
                if n < 0 {
                    if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return;
                }
                if fds[1].revents != 0 {
                    return;
                }
                if fds[0].revents == 0 {
                    continue;
                }
                // SAFETY: buf is valid for writes of buf.len() bytes; fd 0 stays open (it is
                // our stdin). A raw read avoids std's buffering, which could keep input that
                // belongs to whoever reads stdin after us.
                let got = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
                if got < 0 {
                    if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return;
                }
                if got == 0 {
                    if eot_at_end {
                        let _ = to_qemu.write_all(&[EOT]);
                    }
                    return; // end of our input
                }
                if to_qemu.write_all(&buf[..got as usize]).is_err() {
                    return; // QEMU is gone
                }
            }
        });
        Ok(Self { stop_w, thread })
    }

    fn stop(self) {
        drop(self.stop_w); // makes stop_r readable (EOF)
        let _ = self.thread.join();
    }
}

/// Where a payload output stream goes.
#[derive(Clone)]
enum Target {
    Stdout,
    Stderr,
    /// Collected in memory (tests).
    Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>),
}

/// Copies `from` to our stdout or stderr as data arrives; returns the last [`TAIL_BYTES`].
/// Keeps draining (and discarding) when our side is closed so QEMU never blocks.
fn pump(mut from: io::PipeReader, to: Target, spoke: &AtomicBool) -> Vec<u8> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut last = Vec::new();
    let mut broken = false;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &buf[..n];
        spoke.store(true, Ordering::Release);
        last.extend_from_slice(chunk);
        if last.len() > 2 * TAIL_BYTES {
            last.drain(..last.len() - TAIL_BYTES);
        }
        if !broken {
            let written = match &to {
                Target::Stdout => {
                    let mut o = io::stdout().lock();
                    o.write_all(chunk).and_then(|()| o.flush())
                }
                Target::Stderr => {
                    let mut e = io::stderr().lock();
                    e.write_all(chunk).and_then(|()| e.flush())
                }
                Target::Buffer(buf) => buf
                    .lock()
                    .map_err(|_| io::Error::other("poisoned"))
                    .map(|mut b| b.extend_from_slice(chunk)),
            };
            broken = written.is_err();
        }
    }
    tail(&last, TAIL_BYTES).to_vec()
}

fn tail(bytes: &[u8], max: usize) -> &[u8] {
    &bytes[bytes.len().saturating_sub(max)..]
}

/// Parses what the init wrote on ttyS2: a decimal status 0..=255 and a newline.
fn parse_status(raw: &[u8]) -> Option<i32> {
    let text = std::str::from_utf8(raw).ok()?;
    let line = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    if line.is_empty() || line.len() > 3 || !line.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let code: i32 = line.parse().ok()?;
    (0..=255).contains(&code).then_some(code)
}

/// `args` as NUL-terminated byte strings: `/payload/args`.
fn encode_args_nul(args: &[OsString]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for a in args {
        let bytes = a.as_bytes();
        if bytes.contains(&0) {
            bail!("argument {a:?} contains a NUL byte");
        }
        out.extend_from_slice(bytes);
        out.push(0);
    }
    Ok(out)
}

/// `args` as one POSIX sh line `set -- 'a' 'b' ...\n`: `/payload/args.sh`. Inside single quotes
/// every byte but `'` is literal (newlines included); `'` becomes `'\''`.
fn encode_args_sh(args: &[OsString]) -> Result<Vec<u8>> {
    let mut out = b"set --".to_vec();
    for a in args {
        let bytes = a.as_bytes();
        if bytes.contains(&0) {
            bail!("argument {a:?} contains a NUL byte");
        }
        out.extend_from_slice(b" '");
        for &b in bytes {
            if b == b'\'' {
                out.extend_from_slice(b"'\\''");
            } else {
                out.push(b);
            }
        }
        out.push(b'\'');
    }
    out.push(b'\n');
    Ok(out)
}

/// Splits a payload name into its `/`-separated parts, rejecting anything that could leave
/// `/payload/files`.
fn payload_name_parts(name: &str) -> Result<Vec<&str>> {
    let parts: Vec<&str> = name.split('/').collect();
    if name.is_empty()
        || name.contains('\0')
        || parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == "..")
    {
        bail!("invalid payload file name {name:?}: need a relative path without empty, '.' or '..' parts");
    }
    Ok(parts)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Content {
    Dir,
    Bytes(Vec<u8>),
    HostFile(PathBuf),
}

/// One member of the payload archive. `name` has no leading `/`; `mode` holds permissions only.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    mode: u32,
    content: Content,
}

/// What the payload archive says besides the program, its arguments and files.
#[derive(Debug, Default)]
struct PayloadOptions<'a> {
    /// `/payload/stdin` says `tty` rather than `null`.
    stdin_tty: bool,
    /// Shared directories in mount order ([`checked_shares`]): `/payload/mounts.sh`.
    shares: &'a [PathBuf],
    /// `/payload/workdir.sh`.
    workdir: Option<&'a Path>,
}

/// Everything the payload archive holds, directories first (parents before children).
fn payload_entries(
    exe: &Path,
    args: &[OsString],
    files: &[PayloadFile],
    options: &PayloadOptions<'_>,
) -> Result<Vec<Entry>> {
    let meta = fs::metadata(exe)
        .with_context(|| format!("helper VM payload program {} not found", exe.display()))?;
    if !meta.is_file() {
        bail!(
            "helper VM payload program {} is not a regular file",
            exe.display()
        );
    }
    let mut dirs: BTreeSet<String> = ["payload", "payload/files"].map(String::from).into();
    let mut regular: BTreeMap<String, (u32, Content)> = BTreeMap::new();
    let exe_content = Content::HostFile(exe.to_path_buf());
    regular.insert("payload/detvisor".into(), (0o755, exe_content));
    regular.insert(
        "payload/args".into(),
        (0o644, Content::Bytes(encode_args_nul(args)?)),
    );
    regular.insert(
        "payload/args.sh".into(),
        (0o644, Content::Bytes(encode_args_sh(args)?)),
    );
    let stdin_mode: &[u8] = if options.stdin_tty {
        b"tty\n"
    } else {
        b"null\n"
    };
    regular.insert(
        "payload/stdin".into(),
        (0o644, Content::Bytes(stdin_mode.to_vec())),
    );
    if !options.shares.is_empty() {
        let mut words = Vec::with_capacity(2 * options.shares.len());
        for (i, dir) in options.shares.iter().enumerate() {
            words.push(OsString::from(share_tag(i)));
            words.push(dir.as_os_str().to_os_string());
        }
        regular.insert(
            "payload/mounts.sh".into(),
            (0o644, Content::Bytes(encode_args_sh(&words)?)),
        );
    }
    if let Some(dir) = options.workdir {
        let words = [dir.as_os_str().to_os_string()];
        regular.insert(
            "payload/workdir.sh".into(),
            (0o644, Content::Bytes(encode_args_sh(&words)?)),
        );
    }

    for f in files {
        let parts = payload_name_parts(&f.payload_name)?;
        let meta = fs::metadata(&f.host_path).with_context(|| {
            format!(
                "payload file {} (for {}) not found",
                f.host_path.display(),
                payload_path(&f.payload_name)
            )
        })?;
        if !meta.is_file() {
            bail!(
                "payload file {} is not a regular file",
                f.host_path.display()
            );
        }
        let mut dir = String::from("payload/files");
        for p in &parts[..parts.len() - 1] {
            dir.push('/');
            dir.push_str(p);
            dirs.insert(dir.clone());
        }
        let name = format!("payload/files/{}", f.payload_name);
        let mode = meta.permissions().mode() & 0o777;
        let prev = regular.insert(name, (mode, Content::HostFile(f.host_path.clone())));
        if prev.is_some() {
            bail!("payload file name {:?} given twice", f.payload_name);
        }
    }

    for lib in shared_libraries(exe)? {
        let Some(rel) = lib.to_str().and_then(|s| s.strip_prefix('/')) else {
            bail!("unusable shared library path {}", lib.display());
        };
        let parts = payload_name_parts(rel)
            .with_context(|| format!("shared library path {}", lib.display()))?;
        let mut dir = String::new();
        for p in &parts[..parts.len() - 1] {
            if !dir.is_empty() {
                dir.push('/');
            }
            dir.push_str(p);
            dirs.insert(dir.clone());
        }
        regular
            .entry(rel.to_string())
            .or_insert((0o755, Content::HostFile(lib.clone())));
    }

    if let Some(clash) = regular.keys().find(|f| dirs.contains(*f)) {
        bail!("payload path /{clash} is both a file and a directory");
    }
    let mut entries: Vec<Entry> = dirs
        .into_iter()
        .map(|name| Entry {
            name,
            mode: 0o755,
            content: Content::Dir,
        })
        .collect();
    entries.extend(regular.into_iter().map(|(name, (mode, content))| Entry {
        name,
        mode,
        content,
    }));
    Ok(entries)
}

/// Writes `entries` as a newc archive (with trailer) to `w`.
fn write_newc<W: Write>(entries: &[Entry], mut w: W) -> Result<W> {
    for (i, e) in entries.iter().enumerate() {
        let ino = u32::try_from(i + 1).context("too many payload entries")?;
        let (file_type, nlink) = match e.content {
            Content::Dir => (0o040000, 2),
            _ => (0o100000, 1),
        };
        let builder = cpio::newc::Builder::new(&e.name)
            .ino(ino)
            .mode(file_type | (e.mode & 0o7777))
            .uid(0)
            .gid(0)
            .nlink(nlink)
            .mtime(0);
        match &e.content {
            Content::Dir => {
                builder.write(&mut w, 0).finish()?;
            }
            Content::Bytes(bytes) => {
                let size = u32::try_from(bytes.len()).context("payload member too large")?;
                let mut writer = builder.write(&mut w, size);
                writer.write_all(bytes)?;
                writer.finish()?;
            }
            Content::HostFile(path) => {
                let file =
                    File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
                let len = file.metadata()?.len();
                let size = u32::try_from(len).map_err(|_| {
                    anyhow!(
                        "{} is too large for the helper VM payload (4 GiB at most)",
                        path.display()
                    )
                })?;
                let mut writer = builder.write(&mut w, size);
                let copied = io::copy(&mut file.take(len), &mut writer)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                if copied != len {
                    bail!("{} shrank while being copied", path.display());
                }
                writer.finish()?;
            }
        }
    }
    Ok(cpio::newc::trailer(w)?)
}

/// `base` (the compressed initramfs) + zero padding to a 4-byte boundary (where the kernel
/// looks for the next archive) + the payload archive.
fn assemble_initrd<R: Read, W: Write>(base: &mut R, entries: &[Entry], mut w: W) -> Result<W> {
    let n = io::copy(base, &mut w)?;
    let pad = ((4 - n % 4) % 4) as usize;
    w.write_all(&[0u8; 3][..pad])?;
    write_newc(entries, w)
}

fn write_initrd(base: &Path, entries: &[Entry], out: &Path) -> Result<()> {
    let mut base_file =
        File::open(base).with_context(|| format!("cannot open {}", base.display()))?;
    let out_file = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut w = assemble_initrd(&mut base_file, entries, BufWriter::new(out_file))?;
    w.flush()
        .with_context(|| format!("cannot write {}", out.display()))?;
    Ok(())
}

/// The ELF interpreter (`PT_INTERP`) of a 64-bit little-endian ELF file; `None` for a static
/// executable or a file that is not such an ELF (e.g. a `#!` script).
fn elf_interpreter(bytes: &[u8]) -> Option<PathBuf> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(bytes.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(ph)? == 3 {
            let off = usize::try_from(u64_at(ph + 8)?).ok()?;
            let size = usize::try_from(u64_at(ph + 32)?).ok()?;
            let raw = bytes.get(off..off.checked_add(size)?)?;
            let raw = raw.split(|&b| b == 0).next()?;
            return Some(PathBuf::from(std::ffi::OsStr::from_bytes(raw)));
        }
    }
    None
}

/// Parses `ldd` output into the absolute paths of the libraries and the loader.
fn parse_ldd(output: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in output.lines().map(str::trim) {
        let target = match line.split_once(" => ") {
            Some((name, rest)) => {
                if rest.trim_start().starts_with("not found") {
                    bail!("shared library {name} not found");
                }
                rest
            }
            None => line,
        };
        let path = target.rsplit_once(" (0x").map_or(target, |(p, _)| p).trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// The files a dynamically linked `exe` needs to start in the helper VM (which has no libc):
/// its interpreter and the libraries `ldd` resolves. Empty for a static executable.
fn shared_libraries(exe: &Path) -> Result<Vec<PathBuf>> {
    let mut head = Vec::new();
    File::open(exe)
        .with_context(|| format!("cannot open {}", exe.display()))?
        .take(1 << 20)
        .read_to_end(&mut head)?;
    let Some(interp) = elf_interpreter(&head) else {
        return Ok(Vec::new());
    };
    let out = Command::new("ldd")
        .arg(exe)
        .stdin(Stdio::null())
        .output()
        .with_context(|| {
            format!(
                "{} is dynamically linked and ldd (libc-bin) cannot be run",
                exe.display()
            )
        })?;
    if !out.status.success() {
        bail!(
            "ldd {} failed: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut libs = parse_ldd(&String::from_utf8_lossy(&out.stdout))
        .with_context(|| format!("{} cannot run in the helper VM", exe.display()))?;
    if !libs.contains(&interp) {
        libs.push(interp);
    }
    Ok(libs)
}

/// A private temporary directory, removed with its contents on drop (kept, and named on
/// stderr, when `DETVISOR_HELPER_VM_KEEP_TMP` is set: it holds the L1 console log, QEMU's
/// messages and the assembled initrd).
const TEMP_PREFIX: &str = "detvisor-helper-vm-";

/// The launcher's private temporary directory (`detvisor-helper-vm-<pid>-*`),
/// made after clearing those of launchers that died without cleaning up.
fn new_temp_dir() -> io::Result<crate::tempdir::TempDir> {
    remove_stale_temp_dirs(&std::env::temp_dir());
    crate::tempdir::TempDir::new(TEMP_PREFIX)
}

/// Removes the temporary directories of launchers that died without cleaning up (SIGKILL):
/// `detvisor-helper-vm-<pid>-*` whose process no longer exists.
fn remove_stale_temp_dirs(base: &Path) {
    let Ok(dir) = fs::read_dir(base) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TEMP_PREFIX)) else {
            continue;
        };
        let Some(pid) = rest
            .split('-')
            .next()
            .and_then(|p| p.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } == -1
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn os(v: &[&[u8]]) -> Vec<OsString> {
        v.iter()
            .map(|b| std::ffi::OsStr::from_bytes(b).to_os_string())
            .collect()
    }

    fn tricky_args() -> Vec<OsString> {
        os(&[
            b"run",
            b"",
            b"a b",
            b"it's",
            b"\"double\" 'single'",
            b"line1\nline2\n",
            b"$HOME `id` $(id) \\ \\n * ? [a] ~ ; & | < > # !",
            b"  leading and trailing  ",
            b"-",
            b"--",
            b"\t\r\x01\x7f",
            b"\x81\x82\x83\x84\x85\x86\x87\x88\xff\xfe caf\xc3\xa9",
            b"'",
            b"''",
        ])
    }

    #[test]
    fn nul_encoding_is_exact() {
        let args = tricky_args();
        let enc = encode_args_nul(&args).unwrap();
        let back: Vec<&[u8]> = enc[..enc.len() - 1].split(|&b| b == 0).collect();
        assert_eq!(back.len(), args.len());
        for (a, b) in args.iter().zip(back) {
            assert_eq!(a.as_bytes(), b);
        }
        assert!(encode_args_nul(&os(&[b"a\0b"])).is_err());
        assert_eq!(encode_args_nul(&[]).unwrap(), b"");
    }

    #[test]
    fn sh_encoding_shape() {
        assert_eq!(encode_args_sh(&[]).unwrap(), b"set --\n");
        assert_eq!(
            encode_args_sh(&os(&[b"a b", b"it's", b""])).unwrap(),
            b"set -- 'a b' 'it'\\''s' ''\n"
        );
        assert!(encode_args_sh(&os(&[b"\0"])).is_err());
    }

    /// Feeds args.sh to a real POSIX shell (busybox sh when present, as in the helper VM) and
    /// checks that "$@" comes back byte for byte.
    #[test]
    fn sh_encoding_round_trips_through_a_shell() {
        let args = tricky_args();
        let script = encode_args_sh(&args).unwrap();
        let dir = new_temp_dir().unwrap();
        let file = dir.path().join("args.sh");
        fs::write(&file, &script).unwrap();
        let mut shells = vec![vec!["/bin/sh"]];
        if Path::new("/bin/busybox").exists() {
            shells.push(vec!["/bin/busybox", "sh"]);
        }
        for shell in shells {
            let out = Command::new(shell[0])
                .args(&shell[1..])
                .arg("-c")
                .arg(". \"$1\"; for a in \"$@\"; do printf '%s\\0' \"$a\"; done")
                .arg("sh")
                .arg(&file)
                .output()
                .unwrap();
            assert!(out.status.success(), "{shell:?}: {out:?}");
            assert_eq!(
                out.stdout,
                encode_args_nul(&args).unwrap(),
                "{shell:?} got {:?}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
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
    fn payload_names() {
        assert_eq!(payload_path("kernel"), "/payload/files/kernel");
        assert_eq!(payload_path("a/b.img"), "/payload/files/a/b.img");
        assert!(payload_name_parts("a/b").is_ok());
        for bad in [
            "", "/abs", "a//b", "a/", "..", "a/../b", "./a", "a/.", "a\0b",
        ] {
            assert!(payload_name_parts(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// Reads back a newc stream: (name, mode, data) per entry, until the trailer.
    fn read_newc(mut r: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let mut reader = cpio::NewcReader::new(r).unwrap();
            if reader.entry().is_trailer() {
                break;
            }
            let name = reader.entry().name().to_string();
            let mode = reader.entry().mode();
            let mut data = Vec::new();
            reader.read_to_end(&mut data).unwrap();
            out.push((name, mode, data));
            r = reader.finish().unwrap();
        }
        out
    }

    #[test]
    fn payload_archive_parses_back() {
        let dir = new_temp_dir().unwrap();
        let exe = dir.path().join("prog");
        fs::write(&exe, b"#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o700)).unwrap();
        let img = dir.path().join("disk.img");
        fs::write(&img, vec![0xa5u8; 1001]).unwrap();
        fs::set_permissions(&img, fs::Permissions::from_mode(0o640)).unwrap();
        let args = tricky_args();
        let files = [
            PayloadFile {
                host_path: img.clone(),
                payload_name: "disk.img".into(),
            },
            PayloadFile {
                host_path: exe.clone(),
                payload_name: "sub/dir/tool".into(),
            },
        ];
        let entries = payload_entries(&exe, &args, &files, &PayloadOptions::default()).unwrap();

        // Base "initramfs" of odd length: the payload must start 4-byte aligned.
        let base = b"\x1f\x8b-not-really-gzip".to_vec();
        assert_ne!(base.len() % 4, 0);
        let image = assemble_initrd(&mut Cursor::new(&base), &entries, Vec::new()).unwrap();
        assert_eq!(&image[..base.len()], &base[..]);
        let start = base.len().next_multiple_of(4);
        assert!(image[base.len()..start].iter().all(|&b| b == 0));
        assert_eq!(image.len() % 4, 0);

        let got = read_newc(&image[start..]);
        let names: Vec<&str> = got.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "payload",
                "payload/files",
                "payload/files/sub",
                "payload/files/sub/dir",
                "payload/args",
                "payload/args.sh",
                "payload/detvisor",
                "payload/files/disk.img",
                "payload/files/sub/dir/tool",
                "payload/stdin",
            ]
        );
        let find = |n: &str| got.iter().find(|(name, _, _)| name == n).unwrap();
        assert_eq!(find("payload").1, 0o040755);
        assert_eq!(find("payload/files/sub/dir").1, 0o040755);
        let prog = find("payload/detvisor");
        assert_eq!(prog.1, 0o100755);
        assert_eq!(prog.2, b"#!/bin/sh\necho hi\n");
        assert_eq!(find("payload/args").2, encode_args_nul(&args).unwrap());
        assert_eq!(find("payload/args.sh").2, encode_args_sh(&args).unwrap());
        assert_eq!(find("payload/stdin").2, b"null\n");
        let disk = find("payload/files/disk.img");
        assert_eq!(disk.1, 0o100640);
        assert_eq!(disk.2, vec![0xa5u8; 1001]);
        assert_eq!(find("payload/files/sub/dir/tool").1, 0o100700);
    }

    #[test]
    fn payload_rejects_bad_input() {
        let dir = new_temp_dir().unwrap();
        let exe = dir.path().join("prog");
        fs::write(&exe, b"x").unwrap();
        let file = |name: &str| PayloadFile {
            host_path: exe.clone(),
            payload_name: name.into(),
        };
        assert!(payload_entries(
            &dir.path().join("missing"),
            &[],
            &[],
            &PayloadOptions::default()
        )
        .is_err());
        assert!(payload_entries(dir.path(), &[], &[], &PayloadOptions::default()).is_err());
        assert!(payload_entries(&exe, &[], &[file("../x")], &PayloadOptions::default()).is_err());
        assert!(payload_entries(
            &exe,
            &[],
            &[file("a"), file("a")],
            &PayloadOptions::default()
        )
        .is_err());
        assert!(payload_entries(
            &exe,
            &[],
            &[file("a"), file("a/b")],
            &PayloadOptions::default()
        )
        .is_err());
        let missing = PayloadFile {
            host_path: dir.path().join("nope"),
            payload_name: "n".into(),
        };
        let err = payload_entries(&exe, &[], &[missing], &PayloadOptions::default()).unwrap_err();
        assert!(format!("{err:#}").contains("nope"), "{err:#}");
        let stdin = payload_entries(
            &exe,
            &[],
            &[],
            &PayloadOptions {
                stdin_tty: true,
                ..PayloadOptions::default()
            },
        )
        .unwrap();
        let e = stdin.iter().find(|e| e.name == "payload/stdin").unwrap();
        assert_eq!(e.content, Content::Bytes(b"tty\n".to_vec()));
    }

    #[test]
    fn ldd_parsing() {
        let out = "\tlinux-vdso.so.1 (0x00007ffc1b5f2000)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f2c0b9a0000)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2c0b7bf000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f2c0ba2b000)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
        assert!(parse_ldd("\tstatically linked\n").unwrap().is_empty());
    }

    #[test]
    fn elf_interpreter_of_this_test_binary() {
        // The test binary is linked like detvisor itself: dynamically, against glibc.
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        let interp = elf_interpreter(&me).expect("test binary has PT_INTERP");
        assert!(interp.is_absolute(), "{interp:?}");
        assert!(shared_libraries(&std::env::current_exe().unwrap())
            .unwrap()
            .contains(&interp));
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(elf_interpreter(b"\x7fELF\x02\x01"), None);
        assert_eq!(elf_interpreter(b""), None);
    }

    #[test]
    fn stale_temp_dirs_are_removed() {
        let base = new_temp_dir().unwrap();
        let dead = base.path().join(format!("{TEMP_PREFIX}{}-1-0", i32::MAX));
        let alive = base
            .path()
            .join(format!("{TEMP_PREFIX}{}-1-0", std::process::id()));
        let other = base.path().join("unrelated-123");
        for d in [&dead, &alive, &other] {
            fs::create_dir(d).unwrap();
            fs::write(d.join("f"), b"x").unwrap();
        }
        remove_stale_temp_dirs(base.path());
        assert!(!dead.exists());
        assert!(alive.exists());
        assert!(other.exists());
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
        let args = qemu_args(
            &config,
            Path::new("/a/vmlinuz"),
            Path::new("/t/initrd.img"),
            "/dev/fd/9",
            Path::new("/t,x/status"),
            Path::new("/t/console.log"),
            &[],
        );
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        assert!(joined.contains("-m 1234 "), "{joined}");
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
    fn qemu_command_line_with_shares() {
        let shares = [
            PathBuf::from("/s/a"),
            PathBuf::from("/s/a b,c/d"),
            PathBuf::from(std::ffi::OsStr::from_bytes(b"/s/\xff,")),
        ];
        let args = qemu_args(
            &HelperVmConfig::default(),
            Path::new("/a/vmlinux"),
            Path::new("/t/initrd.img"),
            "/dev/fd/9",
            Path::new("/t/status"),
            Path::new("/t/console.log"),
            &shares,
        );
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
    fn shared_dir_checks() {
        let tmp = new_temp_dir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        let (a, b, nested) = (base.join("a"), base.join("b"), base.join("a/n"));
        for d in [&a, &b, &nested] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(base.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(&a, base.join("link")).unwrap();
        assert_eq!(
            checked_shares(&[b.clone(), nested.clone(), a.clone()]).unwrap(),
            [a.clone(), nested.clone(), b.clone()],
            "parents first"
        );
        assert!(checked_shares(&[]).unwrap().is_empty());
        let bad = |d: PathBuf, why: &str| {
            let err = format!(
                "{:#}",
                checked_shares(std::slice::from_ref(&d)).unwrap_err()
            );
            assert!(err.contains(why), "{d:?}: {err}");
        };
        bad("rel/dir".into(), "not an absolute path");
        bad(base.join("missing"), "not found");
        bad(base.join("a/../b"), "not canonical");
        bad(base.join("link"), "not canonical");
        bad(base.join("file"), "not a directory");
        bad("/".into(), "root directory");
        bad("/usr".into(), "/usr/bin");
        bad("/dev".into(), "/dev");
        bad("/sys/kernel".into(), "/sys");
        let err = checked_shares(&[a.clone(), b, a]).unwrap_err();
        assert!(format!("{err:#}").contains("given twice"), "{err:#}");

        assert_eq!(checked_workdir(None).unwrap(), None);
        assert_eq!(
            checked_workdir(Some(&nested)).unwrap(),
            Some(nested.as_path())
        );
        assert!(checked_workdir(Some(Path::new("rel"))).is_err());
    }

    #[test]
    fn payload_mounts_and_workdir() {
        let dir = new_temp_dir().unwrap();
        let exe = dir.path().join("prog");
        fs::write(&exe, b"x").unwrap();
        let plain = payload_entries(&exe, &[], &[], &PayloadOptions::default()).unwrap();
        assert!(!plain
            .iter()
            .any(|e| e.name == "payload/mounts.sh" || e.name == "payload/workdir.sh"));

        let shares = [PathBuf::from("/h/it's"), PathBuf::from("/h/it's/x y")];
        let options = PayloadOptions {
            stdin_tty: false,
            shares: &shares,
            workdir: Some(Path::new("/h/it's")),
        };
        let entries = payload_entries(&exe, &[], &[], &options).unwrap();
        let content = |name: &str| {
            let e = entries.iter().find(|e| e.name == name).unwrap();
            assert_eq!(e.mode, 0o644);
            e.content.clone()
        };
        assert_eq!(
            content("payload/mounts.sh"),
            Content::Bytes(b"set -- 'share0' '/h/it'\\''s' 'share1' '/h/it'\\''s/x y'\n".to_vec())
        );
        assert_eq!(
            content("payload/workdir.sh"),
            Content::Bytes(b"set -- '/h/it'\\''s'\n".to_vec())
        );
    }

    #[test]
    fn shares_need_assets_that_support_them() {
        let dir = new_temp_dir().unwrap();
        fs::write(dir.path().join(KERNEL_FILE), b"k").unwrap();
        fs::write(dir.path().join(INITRAMFS_FILE), b"i").unwrap();
        fs::write(
            dir.path().join(BUILD_INFO_FILE),
            b"key 1\nmodules kvm\nfeatures kvm\n",
        )
        .unwrap();
        assert_eq!(
            asset_features(dir.path()),
            BTreeSet::from(["kvm".to_string()])
        );
        assert!(has_features(dir.path(), &[]));
        assert!(!has_features(dir.path(), &FEATURES));
        let share = fs::canonicalize(dir.path()).unwrap();
        let exe = std::env::current_exe().unwrap();
        for config in [
            HelperVmConfig {
                assets_dir: dir.path().to_path_buf(),
                shared_dirs: vec![share.clone()],
                ..HelperVmConfig::default()
            },
            HelperVmConfig {
                assets_dir: dir.path().to_path_buf(),
                workdir: Some(share.clone()),
                ..HelperVmConfig::default()
            },
        ] {
            let err = format!("{:#}", run(&config, &exe, &[], &[]).unwrap_err());
            assert!(
                err.contains("rebuild them with helper-vm/build.sh"),
                "{err}"
            );
        }
        fs::write(
            dir.path().join(BUILD_INFO_FILE),
            b"features kvm 9p workdir\n",
        )
        .unwrap();
        assert!(has_features(dir.path(), &FEATURES));
    }

    /// Boots the real helper VM: `cargo test -- --ignored helper_vm_end_to_end --nocapture`.
    /// Also shares two host directories (one nested in the other, names with a space and a
    /// comma) with the working directory in the outer one, and prints the 9p write throughput
    /// of a 64 MiB `dd`.
    #[test]
    #[ignore = "boots the helper VM (~10 s under TCG); builds its assets on first use"]
    fn helper_vm_end_to_end() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let assets = ensure_assets(None).expect("helper VM assets");
        // busybox picks its applet from argv[0], so wrap it: /payload/detvisor is this script.
        let dir = new_temp_dir().unwrap();
        let exe = dir.path().join("wrapper");
        fs::write(&exe, b"#!/bin/sh\nexec /bin/busybox \"$@\"\n").unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        let data = dir.path().join("data");
        fs::write(&data, b"file contents\n").unwrap();
        let share = fs::canonicalize(dir.path()).unwrap().join("shared dir,1");
        let nested = share.join("nested");
        fs::create_dir_all(&nested).unwrap();
        fs::write(share.join("in.txt"), b"from the host\n").unwrap();
        let config = HelperVmConfig {
            assets_dir: assets,
            shared_dirs: vec![nested.clone(), share.clone()],
            workdir: Some(share.clone()),
            ..HelperVmConfig::default()
        };
        const SPARSE_LEN: u64 = 100 << 20;
        let script = format!(
            "echo \"a b\"; ls /dev/kvm; grep -c svm /proc/cpuinfo; \
             cat /payload/files/sub/data; pwd; cat in.txt; echo appended >>in.txt; \
             echo 'from L1' >out.txt; mkdir sub && echo deep >sub/f; echo inner >nested/n.txt; \
             printf X | dd of=sparse bs=1 seek={} conv=notrunc 2>/dev/null; \
             t0=$(cut -d' ' -f1 /proc/uptime); dd if=/dev/zero of=big bs=1M count=64 2>/dev/null; \
             echo $t0 $(cut -d' ' -f1 /proc/uptime) >dd.times; \
             printf '%s|' \"$@\"; echo oops >&2; exit 7",
            SPARSE_LEN - 1
        );
        let mut args = os(&[b"sh", b"-c", script.as_bytes(), b"sh"]);
        args.extend(tricky_args());
        let files = [PayloadFile {
            host_path: data,
            payload_name: "sub/data".into(),
        }];
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let err = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let status = run_to(
            &config,
            &exe,
            &args,
            &files,
            Target::Buffer(out.clone()),
            Target::Buffer(err.clone()),
        )
        .unwrap();
        let mut expected = b"a b\n/dev/kvm\n1\nfile contents\n".to_vec();
        expected.extend_from_slice(share.as_os_str().as_bytes());
        expected.extend_from_slice(b"\nfrom the host\n");
        for a in tricky_args() {
            expected.extend_from_slice(a.as_bytes());
            expected.push(b'|');
        }
        let out = out.lock().unwrap().clone();
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected)
        );
        assert_eq!(out, expected);
        assert_eq!(*err.lock().unwrap(), b"oops\n");
        assert_eq!(status, 7);

        // What the payload wrote is on the host, as ordinary files of ours.
        assert_eq!(
            fs::read(share.join("in.txt")).unwrap(),
            b"from the host\nappended\n"
        );
        let created = share.join("out.txt");
        assert_eq!(fs::read(&created).unwrap(), b"from L1\n");
        let meta = fs::symlink_metadata(&created).unwrap();
        assert!(meta.is_file());
        // SAFETY: getuid/getgid only query this process's credentials.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!((meta.uid(), meta.gid()), (uid, gid));
        assert_eq!(meta.mode() & 0o7777, 0o644);
        assert_eq!(fs::read(share.join("sub/f")).unwrap(), b"deep\n");
        assert_eq!(fs::read(nested.join("n.txt")).unwrap(), b"inner\n");
        let sparse = File::open(share.join("sparse")).unwrap();
        let meta = sparse.metadata().unwrap();
        assert_eq!(meta.len(), SPARSE_LEN);
        let mut last = [0u8; 2];
        assert_eq!(sparse.read_at(&mut last, SPARSE_LEN - 1).unwrap(), 1);
        assert_eq!(last[0], b'X');
        assert!(meta.blocks() * 512 < 1 << 20, "not sparse: {meta:?}");
        assert_eq!(fs::metadata(share.join("big")).unwrap().len(), 64 << 20);
        let times: Vec<f64> = fs::read_to_string(share.join("dd.times"))
            .unwrap()
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        let secs = (times[1] - times[0]).max(0.01); // /proc/uptime has 10 ms resolution
        eprintln!(
            "64 MiB dd bs=1M to a 9p share in L1: {secs:.2} s, {:.0} MiB/s",
            64.0 / secs
        );
    }

    /// A working directory that does not exist in L1 is reported, with status 125.
    #[test]
    #[ignore = "boots the helper VM (~7 s under TCG); builds its assets on first use"]
    fn helper_vm_missing_workdir() {
        let assets = ensure_assets(None).expect("helper VM assets");
        let dir = new_temp_dir().unwrap();
        let share = fs::canonicalize(dir.path()).unwrap();
        let config = HelperVmConfig {
            assets_dir: assets,
            shared_dirs: vec![share.clone()],
            workdir: Some(share.join("missing")),
            ..HelperVmConfig::default()
        };
        let exe = dir.path().join("wrapper");
        fs::write(&exe, b"#!/bin/sh\necho ran\n").unwrap();
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let err = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let status = run_to(
            &config,
            &exe,
            &[],
            &[],
            Target::Buffer(out.clone()),
            Target::Buffer(err.clone()),
        )
        .unwrap();
        assert_eq!(status, STATUS_HELPER_FAILED);
        assert!(out.lock().unwrap().is_empty());
        let err = String::from_utf8_lossy(&err.lock().unwrap()).into_owned();
        assert!(
            err.contains("cannot enter the working directory") && err.contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn missing_assets_and_qemu_are_named() {
        let dir = new_temp_dir().unwrap();
        let config = HelperVmConfig {
            assets_dir: dir.path().to_path_buf(),
            ..HelperVmConfig::default()
        };
        let exe = std::env::current_exe().unwrap();
        let err = run(&config, &exe, &[], &[]).unwrap_err();
        assert!(format!("{err:#}").contains("assets missing"), "{err:#}");

        fs::write(dir.path().join(KERNEL_FILE), b"k").unwrap();
        fs::write(dir.path().join(INITRAMFS_FILE), b"i").unwrap();
        let config = HelperVmConfig {
            qemu: dir.path().join("no-such-qemu"),
            ..config
        };
        let err = run(&config, &exe, &[], &[]).unwrap_err();
        assert!(
            format!("{err:#}").contains("not found: install qemu-system-x86"),
            "{err:#}"
        );
    }
}
