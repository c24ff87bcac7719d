//! Launching the helper VM: checking the config, assembling the initrd, starting QEMU with its
//! output pumps (and stdin forwarder), and collecting the payload's exit status at the end.
//! Shared by the one-shot [`crate::run`] and the long-lived [`crate::HelperVm`].

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::assets::{
    assets_complete, has_features, kernel_path, BUILD_INFO_FILE, FEATURE_CHANNEL, FEATURE_SHARES,
    FEATURE_WORKDIR, INITRAMFS_FILE, KERNEL_FILE,
};
use crate::payload::{payload_entries, write_initrd, PayloadError, PayloadFile, PayloadOptions};
use crate::qemu::{parse_status, qemu_args, spawn_tied, Leftovers, QemuFiles, VmFailed};
use crate::shares::{checked_shares, checked_workdir, ShareError};
use crate::stdio::{pump, StdinForwarder, Target};
use crate::tempdir::{new_temp_dir, TempDir};
use crate::HelperVmConfig;

/// Set (to anything) to keep the launcher's temporary directory (initrd, status, L1 console,
/// QEMU's messages, the channel's socket); its path is printed on stderr.
pub const KEEP_TMP_ENV: &str = "DETVISOR_HELPER_VM_KEEP_TMP";

/// Why the helper VM could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "helper VM assets missing: {} must hold {KERNEL_FILE} and {INITRAMFS_FILE} (build them \
         with helper-vm/build.sh)",
        .0.display()
    )]
    AssetsMissing(PathBuf),
    #[error(
        "the helper VM assets in {} predate {what} (no `features ... {feature}` in \
         {BUILD_INFO_FILE}): rebuild them with helper-vm/build.sh",
        dir.display()
    )]
    AssetsTooOld {
        dir: PathBuf,
        what: &'static str,
        feature: &'static str,
    },
    #[error(transparent)]
    Share(#[from] ShareError),
    #[error(transparent)]
    Payload(#[from] PayloadError),
    #[error("cannot create a temporary directory for the helper VM")]
    TempDir(#[source] io::Error),
    #[error("cannot set up QEMU's {what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{} not found: install qemu-system-x86", .0.display())]
    QemuNotFound(PathBuf),
    #[error("cannot start {}", qemu.display())]
    Spawn {
        qemu: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> LaunchError {
    move |source| LaunchError::Io { what, source }
}

/// What to launch.
pub(crate) struct LaunchSpec<'a> {
    pub config: &'a HelperVmConfig,
    pub exe: &'a Path,
    pub args: &'a [OsString],
    pub files: &'a [PayloadFile],
    /// Forward our stdin to ttyS0 (and say `tty` in `/payload/stdin`).
    pub forward_stdin: bool,
    /// The channel's port name, if any.
    pub channel: Option<&'a str>,
    /// Where the payload's serial stdout and stderr go.
    pub out: Target,
    pub err: Target,
}

/// A started helper VM: QEMU, its pumps and its temporary files.
pub(crate) struct Running {
    child: Child,
    tmp: Option<TempDir>,
    status_path: PathBuf,
    console_path: PathBuf,
    qemu_log_path: PathBuf,
    out_thread: Option<JoinHandle<Vec<u8>>>,
    err_thread: Option<JoinHandle<Vec<u8>>>,
    stdin: Option<StdinForwarder>,
    /// The channel's Unix socket (QEMU listens on it), if any.
    pub socket: Option<PathBuf>,
}

impl Running {
    pub(crate) fn start(spec: &LaunchSpec<'_>) -> Result<Running, LaunchError> {
        let config = spec.config;
        let dir = &config.assets_dir;
        if !assets_complete(dir) {
            return Err(LaunchError::AssetsMissing(dir.clone()));
        }
        let shares = checked_shares(&config.shared_dirs)?;
        let workdir = checked_workdir(config.workdir.as_deref())?;
        for (needed, feature, what) in [
            (!shares.is_empty(), FEATURE_SHARES, "shared directories"),
            (workdir.is_some(), FEATURE_WORKDIR, "a working directory"),
            (spec.channel.is_some(), FEATURE_CHANNEL, "the channel"),
        ] {
            if needed && !has_features(dir, &[feature]) {
                return Err(LaunchError::AssetsTooOld {
                    dir: dir.clone(),
                    what,
                    feature,
                });
            }
        }
        let options = PayloadOptions {
            stdin_tty: spec.forward_stdin,
            shares: &shares,
            workdir,
            channel: spec.channel,
        };
        let entries = payload_entries(spec.exe, spec.args, spec.files, &options)?;

        let tmp = new_temp_dir().map_err(LaunchError::TempDir)?;
        let initrd = tmp.path().join("initrd.img");
        write_initrd(&dir.join(INITRAMFS_FILE), &entries, &initrd)?;
        let status_path = tmp.path().join("status");
        let console_path = tmp.path().join("console.log");
        let qemu_log_path = tmp.path().join("qemu.log");
        let socket = spec.channel.map(|_| tmp.path().join("channel.sock"));

        let (out_r, out_w) = io::pipe().map_err(io_err("stdout pipe"))?;
        let (err_r, err_w) = io::pipe().map_err(io_err("stderr pipe"))?;
        let stdin_pipe = if spec.forward_stdin {
            Some(io::pipe().map_err(io_err("stdin pipe"))?)
        } else {
            None
        };
        let qemu_log = File::create(&qemu_log_path).map_err(io_err("log file"))?;

        let err_fd = err_w.as_raw_fd();
        let err_path = format!("/dev/fd/{err_fd}");
        let kernel = kernel_path(dir);
        let files = QemuFiles {
            kernel: &kernel,
            initrd: &initrd,
            err_path: &err_path,
            status: &status_path,
            console: &console_path,
            shares: &shares,
            channel: socket.as_deref().zip(spec.channel),
        };
        let mut cmd = Command::new(&config.qemu);
        cmd.args(qemu_args(config, &files))
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
        let child = match spawn_tied(&mut cmd, err_fd) {
            Ok(child) => child,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(LaunchError::QemuNotFound(config.qemu.clone()))
            }
            Err(source) => {
                return Err(LaunchError::Spawn {
                    qemu: config.qemu.clone(),
                    source,
                })
            }
        };
        // Only QEMU may hold the write ends now, so that the pumps see EOF when it exits.
        drop(cmd);
        drop(err_w);

        // Set once the payload has written anything: L1's serial line is ready (raw, no echo)
        // by then, so forwarded input is neither echoed nor flushed by L1's boot.
        let payload_spoke = Arc::new(AtomicBool::new(false));
        let (out_spoke, err_spoke) = (payload_spoke.clone(), payload_spoke.clone());
        let (out, err) = (spec.out.clone(), spec.err.clone());
        let out_thread = thread::spawn(move || pump(out_r, out, &out_spoke));
        let err_thread = thread::spawn(move || pump(err_r, err, &err_spoke));
        let stdin = match stdin_writer {
            // A terminal's user types after seeing output anyway; piped input must wait for
            // the payload explicitly.
            Some(w) => Some(
                StdinForwarder::start(
                    w,
                    config.forward_stdin_always,
                    config.forward_stdin_always.then(|| payload_spoke.clone()),
                )
                .map_err(io_err("stdin forwarder"))?,
            ),
            None => None,
        };
        Ok(Running {
            child,
            tmp: Some(tmp),
            status_path,
            console_path,
            qemu_log_path,
            out_thread: Some(out_thread),
            err_thread: Some(err_thread),
            stdin,
            socket,
        })
    }

    /// Whether QEMU has exited.
    pub(crate) fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for QEMU to exit (killing it when `limit` passes first) and returns the payload's
    /// exit status, or why there is none.
    pub(crate) fn finish(self, limit: Option<Duration>) -> Result<i32, VmFailed> {
        let ended = self.end(limit);
        match ended.status {
            Some(code) => Ok(code),
            None => Err(ended.left.failure(ended.why)),
        }
    }

    /// Waits for QEMU to exit (killing it when `limit` passes first) and collects what came
    /// back.
    pub(crate) fn end(mut self, limit: Option<Duration>) -> Ended {
        let mut killed = None;
        if let Some(limit) = limit {
            let deadline = Instant::now() + limit;
            while !self.has_exited() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            if !self.has_exited() {
                let _ = self.child.kill();
                killed = Some(limit);
            }
        }
        let wait = self.child.wait();
        if let Some(fwd) = self.stdin.take() {
            fwd.stop();
        }
        // A pump only ends at EOF; a panic in one leaves an empty tail.
        let join =
            |t: Option<JoinHandle<Vec<u8>>>| t.and_then(|t| t.join().ok()).unwrap_or_default();
        let left = Leftovers {
            qemu_status: wait.as_ref().ok().copied(),
            qemu_log: fs::read(&self.qemu_log_path).unwrap_or_default(),
            console: fs::read(&self.console_path).unwrap_or_default(),
            err_tail: join(self.err_thread.take()),
            out_tail: join(self.out_thread.take()),
        };
        let status = parse_status(&fs::read(&self.status_path).unwrap_or_default());
        let why = match (killed, &wait) {
            (Some(limit), _) => format!(
                "QEMU did not exit within {} s and was killed",
                limit.as_secs_f32()
            ),
            (None, Err(e)) => format!("waiting for QEMU failed: {e}"),
            (None, Ok(_)) => left.why_qemu_ended().unwrap_or_default(),
        };
        Ended { status, why, left }
    }
}

/// How a helper VM ended.
pub(crate) struct Ended {
    /// The payload's exit status, when the init reported one.
    pub status: Option<i32>,
    /// Why QEMU ended.
    pub why: String,
    pub left: Leftovers,
}

impl Drop for Running {
    fn drop(&mut self) {
        if std::env::var_os(KEEP_TMP_ENV).is_some() {
            if let Some(tmp) = self.tmp.take() {
                eprintln!("helper VM: kept {}", tmp.keep().display());
            }
        }
    }
}
