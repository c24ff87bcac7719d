//! Placement in the helper VM: on hosts whose KVM cannot run Linux, the run
//! library's requests go to a detvisor serving them inside the helper VM
//! (`detvisor serve-channel`), over the helper VM's typed channel. One helper
//! VM answers any number of requests; what a request names on the host
//! travels as payload files (kernels, initrds) or shared directories
//! (snapshots, logs), mounted at the same absolute paths.

use anyhow::{Context, Result};
use helper_vm::channel::StdinSource;
use helper_vm::{HelperVm, HelperVmConfig, PayloadFile, TempDir};
use run::api::{Reply, Request, Response};
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// What the helper VM must hold for the requests it will get.
#[derive(Default)]
pub struct Needs {
    /// Files shipped into the helper VM (see [`Needs::file`]).
    pub files: Vec<PayloadFile>,
    /// Host directories the requests read or write, shared at the same paths.
    pub shared_dirs: Vec<PathBuf>,
    /// Guest memory in MiB the helper VM needs (0: its default).
    pub memory_mib: u32,
    /// Files written for the helper VM alone, removed when it is done.
    pub staging: Option<TempDir>,
}

impl Needs {
    /// Ships `host_path` into the helper VM; returns where it is there.
    pub fn file(&mut self, host_path: &Path, name: &str) -> PathBuf {
        self.files.push(PayloadFile {
            host_path: host_path.to_path_buf(),
            payload_name: name.into(),
        });
        PathBuf::from(helper_vm::payload_path(name))
    }

    /// Shares `dir` (created if missing); returns its absolute path, the
    /// same inside the helper VM.
    pub fn share(&mut self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("directory {}", dir.display()))?;
        if !self.shared_dirs.contains(&dir) {
            self.shared_dirs.push(dir.clone());
        }
        Ok(dir)
    }

    /// A trace the request writes inside the helper VM (`--trace FILE`):
    /// created here first, so that a path that cannot be written is an
    /// error before the helper VM starts; its directory shared. Returns its
    /// absolute path, the same inside the helper VM.
    pub fn trace_file(&mut self, path: &Path) -> Result<PathBuf> {
        drop(run::trace::TraceFile::create(path)?);
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .with_context(|| format!("trace {}: not a file name", path.display()))?;
        Ok(self.share(dir)?.join(name))
    }
}

impl Needs {
    /// A file the request writes inside the helper VM (`what`: for errors,
    /// e.g. "records"): created here first, so that a path that cannot be
    /// written is an error before the helper VM starts; its directory
    /// shared. Returns its absolute path, the same inside the helper VM.
    pub fn output_file(&mut self, path: &Path, what: &str) -> Result<PathBuf> {
        std::fs::File::create(path)
            .with_context(|| format!("{what} {}: cannot create it", path.display()))?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .with_context(|| format!("{what} {}: not a file name", path.display()))?;
        Ok(self.share(dir)?.join(name))
    }
}

/// A helper VM serving run requests.
pub struct Remote {
    vm: HelperVm,
    /// Outlives the helper VM (fields drop in order).
    _staging: Option<TempDir>,
}

impl Remote {
    /// Starts the helper VM with what `needs` names; says why on stderr.
    pub fn start(reason: &str, needs: Needs) -> Result<Remote> {
        eprintln!(
            "detvisor: running inside a helper VM (QEMU TCG with nested SVM) because {reason}"
        );
        let mut config = HelperVmConfig {
            assets_dir: helper_vm::ensure_assets(None)?,
            shared_dirs: needs.shared_dirs,
            ..HelperVmConfig::default()
        };
        if needs.memory_mib > 0 {
            config.memory_mib = needs.memory_mib;
        }
        config.shared_dirs.sort();
        config.shared_dirs.dedup();
        let exe = std::env::current_exe().context("locating the detvisor executable")?;
        let args: [OsString; 1] = ["serve-channel".into()];
        let vm = HelperVm::start(&config, &exe, &args, &needs.files)?;
        Ok(Remote {
            vm,
            _staging: needs.staging,
        })
    }

    /// Sends `request`; its output streams to this process's stdout and
    /// stderr, and with `stdin` this process's stdin goes along.
    pub fn call(&mut self, request: &Request, stdin: bool) -> Result<Response> {
        let own_stdin = std::io::stdin();
        let source = stdin.then(|| StdinSource::Fd(own_stdin.as_fd()));
        let reply: Reply = self.vm.call(
            request,
            &mut std::io::stdout(),
            &mut std::io::stderr(),
            source,
        )?;
        reply.map_err(anyhow::Error::msg)
    }
}

/// Starts a helper VM for one request and sends it.
pub fn call_once(reason: &str, needs: Needs, request: &Request, stdin: bool) -> Result<Response> {
    let mut remote = Remote::start(reason, needs)?;
    remote.call(request, stdin)
}
