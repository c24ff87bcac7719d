//! The run API through a helper VM: on hosts whose KVM cannot run Linux,
//! the run library's requests go to a detvisor serving them inside a helper
//! VM (`detvisor serve-channel`) over its typed channel ([`Remote`]). One
//! helper VM answers any number of requests; what a request names on the
//! host travels as payload files (kernels, initrds) or shared directories
//! (snapshots, logs), mounted at the same absolute paths: [`needs`] decides
//! which, for every kind of request, and rewrites the request's paths to
//! where they are inside. [`Placed`] is a runner wherever a run's guests
//! run: here, or in a helper VM started for its first request; [`serve`]
//! is the other end, inside.

use crate::channel::{CallIo, OutputWriter, StdinSource};
use crate::{HelperVm, HelperVmConfig, PayloadFile, Placement, TempDir};
use ::run::api::{Controller, Reply, Request};
use ::run::client::Runner;
use ::run::moment::Moment;
use ::run::plain::GuestSpec;
use ::run::snapshots::SnapshotPlan;
use ::run::soak::SoakTarget;
use ::run::streams::{Input, Streams};
use ::run::up::{Initrd, PreparedUp, UpOptions};
use std::cell::RefCell;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use vmm::stall::StallTimeout;

/// Why what a request needs in the helper VM could not be gathered.
#[derive(Debug, thiserror::Error)]
pub enum NeedsError {
    #[error("creating {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("directory {}", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {}: cannot create it", path.display())]
    CreateFile {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {}: not a file name", path.display())]
    NotAFileName { what: &'static str, path: PathBuf },
    #[error("creating a staging directory for the helper VM's files")]
    Staging(#[source] std::io::Error),
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {}", path.display())]
    Size {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Image(#[from] ::run::plain::PlainError),
    #[error(transparent)]
    Snapshots(#[from] ::run::snapshots::SnapshotsError),
    #[error(transparent)]
    Spec(#[from] snapshot::SnapshotError),
    #[error(transparent)]
    Trace(#[from] ::run::trace::TraceError),
}

type Result<T, E = NeedsError> = std::result::Result<T, E>;

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
        PathBuf::from(crate::payload_path(name))
    }

    /// Shares `dir` (created if missing); returns its absolute path, the
    /// same inside the helper VM.
    pub fn share(&mut self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|source| NeedsError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let dir = dir.canonicalize().map_err(|source| NeedsError::Directory {
            path: dir.to_path_buf(),
            source,
        })?;
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
        drop(::run::trace::TraceFile::create(path)?);
        self.in_shared_dir(path, "trace")
    }

    /// A file the request writes inside the helper VM (`what`: for errors,
    /// e.g. "records"): created here first, as [`Needs::trace_file`].
    pub fn output_file(&mut self, path: &Path, what: &'static str) -> Result<PathBuf> {
        std::fs::File::create(path).map_err(|source| NeedsError::CreateFile {
            what,
            path: path.to_path_buf(),
            source,
        })?;
        self.in_shared_dir(path, what)
    }

    /// `path` with its directory shared.
    fn in_shared_dir(&mut self, path: &Path, what: &'static str) -> Result<PathBuf> {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let name = path.file_name().ok_or_else(|| NeedsError::NotAFileName {
            what,
            path: path.to_path_buf(),
        })?;
        Ok(self.share(dir)?.join(name))
    }
}

/// What `request` ships into the helper VM, its host paths rewritten to
/// where they are inside it. A request on a held run needs nothing new.
pub fn needs(request: &mut Request) -> Result<Needs> {
    Ok(match request {
        Request::Run {
            guest,
            snapshots,
            pcap,
            trace,
        } => {
            let mut needs = guest_needs(guest, snapshots.as_mut())?;
            // Written inside the helper VM, read here.
            if let Some(dir) = pcap {
                *dir = needs.share(dir)?;
            }
            if let Some(file) = trace {
                *file = needs.trace_file(file)?;
            }
            needs
        }
        Request::Audit { guest, .. } | Request::Boot { guest } => guest_needs(guest, None)?,
        Request::Soak(soak) => {
            let mut needs = match &mut soak.target {
                SoakTarget::Boot(guest) => guest_needs(guest, None)?,
                SoakTarget::Up { prepared, options } => up_needs(prepared, options)?,
            };
            soak.dir = needs.share(&soak.dir)?;
            needs
        }
        Request::Up { prepared, options } | Request::BootUp { prepared, options } => {
            up_needs(prepared, options)?
        }
        Request::Branch(branch) => {
            let mut needs = snapshot_needs(&mut branch.moment, branch.snapshots.as_mut())?;
            if let Some(file) = &mut branch.trace {
                *file = needs.trace_file(file)?;
            }
            needs
        }
        Request::BranchSeeds(seeds) => snapshot_needs(&mut seeds.moment, None)?,
        Request::Seek { moment } | Request::Restore { moment, .. } => snapshot_needs(moment, None)?,
        Request::Shell(shell) => snapshot_needs(&mut shell.moment, None)?,
        Request::ListSnapshots { dir }
        | Request::SnapshotInfo { dir }
        | Request::Snapshot { dir, .. }
        | Request::Spill { dir, .. }
        | Request::LoadInPlace { dir, .. } => {
            let mut needs = Needs::default();
            *dir = needs.share(dir)?;
            needs
        }
        Request::TraceReport { path } => {
            let mut needs = Needs::default();
            *path = needs.in_shared_dir(path, "trace")?;
            needs
        }
        Request::HostReport
        | Request::RunUntil { .. }
        | Request::Checkpoint { .. }
        | Request::Reset { .. }
        | Request::DropCheckpoint { .. }
        | Request::CheckpointMemory { .. }
        | Request::CheckpointBudget { .. }
        | Request::InjectFault { .. }
        | Request::Rekey { .. }
        | Request::Outcome { .. }
        | Request::CollectRecords { .. }
        | Request::TakeRecords { .. }
        // A guest's path (`ReadFile`) or command (`Exec`) is no host file.
        | Request::Exec { .. }
        | Request::ShellIn { .. }
        | Request::ReadFile { .. }
        | Request::Processes { .. }
        | Request::Inspect { .. }
        | Request::StepInsns { .. }
        | Request::StepTo { .. }
        | Request::StepToChange { .. }
        | Request::RunToBreakpoint { .. }
        | Request::Registers { .. }
        | Request::MemoryDigest { .. }
        | Request::WriteVirtual { .. }
        | Request::SetRegisters { .. }
        | Request::ReadVirtual { .. }
        | Request::Close { .. }
        | Request::Seccomp { .. } => Needs::default(),
    })
}

/// A plain run's files: kernel and initrd shipped along, the snapshot
/// directory shared.
fn guest_needs(guest: &mut GuestSpec, snapshots: Option<&mut SnapshotPlan>) -> Result<Needs> {
    let mut needs = Needs::default();
    let image = guest.image_files()?;
    guest.kernel = Some(needs.file(&image.kernel, "vmlinux"));
    guest.initrd = Some(needs.file(&image.initrd, "initrd"));
    if let Some(plan) = snapshots {
        plan.dir = needs.share(&plan.dir)?;
    }
    needs.memory_mib = ((guest.ram_bytes >> 20) as u32)
        .saturating_add(1024)
        .max(2048);
    Ok(needs)
}

/// A saved moment: its snapshot directory shared (and the directory new
/// snapshots go to), the disk image cache, the moment's paths made absolute.
fn snapshot_needs(moment: &mut Moment, taking: Option<&mut SnapshotPlan>) -> Result<Needs> {
    // A moment that names no snapshot is refused before the helper VM starts.
    ::run::snapshots::resolve(moment)?;
    let mut needs = Needs::default();
    *moment = moment.absolute()?;
    needs.share(&moment.root())?;
    // A branch's snapshots chain to the snapshot it was restored from, in
    // another directory: every directory of the chain is read.
    for root in ::run::snapshots::chain_roots(moment)? {
        needs.share(&root)?;
    }
    // An `up` run's snapshots name their disks' base images in the node
    // disks' image cache, shared at its own path.
    let disks = ::run::guest::cache_root().join("disks");
    if disks.is_dir() {
        needs.share(&disks)?;
    }
    if let Some(plan) = taking {
        plan.dir = needs.share(&plan.dir)?;
    }
    Ok(needs)
}

/// An `up` run: the assembled initrd (staged in a file) and the kernel
/// shipped along, the log, snapshot and capture directories shared.
fn up_needs(prepared: &mut PreparedUp, options: &mut UpOptions) -> Result<Needs> {
    let mut needs = Needs::default();
    // Removed with its files when the helper VM is done with them.
    let staging = TempDir::new("detvisor-up-").map_err(NeedsError::Staging)?;
    let path = match &prepared.initrd {
        Initrd::Bytes(bytes) => {
            let path = staging.path().join("initrd");
            std::fs::write(&path, bytes).map_err(|source| NeedsError::Write {
                path: path.clone(),
                source,
            })?;
            path
        }
        Initrd::File(path) => path.clone(),
    };
    let size = |what, path: &Path| {
        std::fs::metadata(path)
            .map(|m| m.len() as usize)
            .map_err(|source| NeedsError::Size {
                what,
                path: path.to_path_buf(),
                source,
            })
    };
    let initrd_len = size("initrd", &path)?;
    prepared.initrd = Initrd::File(needs.file(&path, "initrd"));
    prepared.kernel = needs.file(&prepared.kernel.clone(), "vmlinux");
    // Node disks' base images stay in their shared directory (the disk
    // cache), at the same paths inside: snapshots name them, and a later
    // branch finds them there.
    let mut disk_len = 0usize;
    for disk in &mut prepared.disks {
        disk_len += size("disk image", &disk.image)?;
        let dir = disk.image.parent().unwrap_or(Path::new("/"));
        let name = disk.image.file_name().unwrap_or_default().to_owned();
        disk.image = needs.share(dir)?.join(name);
    }
    if let Some(logs) = &options.logs {
        options.logs = Some(needs.share(logs)?);
    }
    if let Some(plan) = &mut options.snapshots {
        plan.dir = needs.share(&plan.dir)?;
    }
    if let Some(dir) = &options.pcap {
        options.pcap = Some(needs.share(dir)?);
    }
    if let Some(file) = &options.trace {
        options.trace = Some(needs.trace_file(file)?);
    }
    if let Some(file) = &options.records {
        options.records = Some(needs.output_file(file, "records")?);
    }
    // The initrd is shipped in the helper's own initramfs and then read
    // into the VMM: count it about three times over.
    needs.staging = Some(staging);
    needs.memory_mib = ((prepared.ram_bytes >> 20) as u32)
        .saturating_add(1536)
        .saturating_add(((3 * initrd_len) >> 20) as u32)
        .saturating_add((disk_len >> 20) as u32)
        .max(2048);
    Ok(needs)
}

/// `MemAvailable` of /proc/meminfo, in MiB: what helper VMs started now
/// may take at most.
pub fn available_memory_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// Why a helper VM serving run requests could not start.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error(transparent)]
    Needs(#[from] NeedsError),
    #[error(transparent)]
    Assets(#[from] crate::AssetsError),
    #[error("locating the detvisor executable")]
    Executable(#[source] std::io::Error),
    #[error(transparent)]
    Start(#[from] crate::StartError),
}

/// The executable a helper VM runs to serve calls, when it is not this one
/// (see [`set_serving_executable`]).
static SERVING_EXECUTABLE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Makes helper VMs started from now on in this process serve with `exe`
/// (a detvisor binary) instead of this process's own executable: for a
/// program that uses the libraries but is not detvisor and has no
/// `serve-channel` verb of its own (a test, an embedding server). Set once;
/// a second call is ignored.
pub fn set_serving_executable(exe: impl Into<PathBuf>) {
    let _ = SERVING_EXECUTABLE.set(exe.into());
}

/// Starts a helper VM whose payload is this executable (or the one
/// [`set_serving_executable`] named) run with `args`
/// (a hidden verb that serves calls on the channel: the run API's
/// `serve-channel`, the benchmarks' `bench serve-channel`), with `files`
/// shipped in and `shared_dirs` shared at their own paths; `memory_mib` 0
/// is the helper VM's default.
pub fn start_serving(
    args: &[&str],
    memory_mib: u32,
    mut shared_dirs: Vec<PathBuf>,
    files: &[PayloadFile],
) -> Result<HelperVm, RemoteError> {
    shared_dirs.sort();
    shared_dirs.dedup();
    let mut config = HelperVmConfig {
        assets_dir: crate::ensure_assets(None)?,
        shared_dirs,
        ..HelperVmConfig::default()
    };
    if memory_mib > 0 {
        config.memory_mib = memory_mib;
    }
    let exe = match SERVING_EXECUTABLE.get() {
        Some(exe) => exe.clone(),
        None => std::env::current_exe().map_err(RemoteError::Executable)?,
    };
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    Ok(HelperVm::start(&config, &exe, &args, files)?)
}

/// A helper VM serving run requests (`detvisor serve-channel`).
pub struct Remote {
    vm: HelperVm,
    /// Outlives the helper VM (fields drop in order).
    _staging: Option<TempDir>,
}

impl Remote {
    /// Starts the helper VM with what `needs` names; says why on stderr.
    pub fn start(reason: &str, needs: Needs) -> Result<Remote, RemoteError> {
        eprintln!(
            "detvisor: running inside a helper VM (QEMU TCG with nested SVM) because {reason}"
        );
        let vm = start_serving(
            &["serve-channel"],
            needs.memory_mib,
            needs.shared_dirs,
            &needs.files,
        )?;
        Ok(Remote {
            vm,
            _staging: needs.staging,
        })
    }

    /// Sends `request`; its output streams to this process's stdout and
    /// stderr, and with `stdin` this process's stdin goes along.
    pub fn call_with_stdin(&mut self, request: &Request, stdin: bool) -> Reply {
        let own_stdin = std::io::stdin();
        let source = stdin.then(|| StdinSource::Fd(own_stdin.as_fd()));
        let reply: Reply = self
            .vm
            .call(
                request,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
                source,
            )
            .map_err(|e| ::run::chain(&e))?;
        reply
    }
}

impl Runner for Remote {
    fn call(&mut self, request: Request) -> Reply {
        self.call_with_stdin(&request, false)
    }
}

/// Where a [`Placed`] runner's runs happen.
enum Place<L> {
    Here(L),
    HelperVm {
        reason: String,
        /// Started for the first request, with what it needs.
        remote: Option<Box<Remote>>,
        /// This process's stdin goes along with every request.
        stdin: bool,
    },
}

/// A runner where a run's guests run: here (`L`, the run library in this
/// process), or in a helper VM. Every request that runs a guest gets the
/// stall timeout for where it runs; the seccomp filter is turned off
/// before the first request when asked (`--no-seccomp`).
pub struct Placed<L> {
    place: Place<L>,
    stall: StallTimeout,
    seccomp: bool,
    /// Whether the seccomp setting went ahead already.
    seccomp_said: bool,
}

impl<L: Runner> Placed<L> {
    /// A runner for `placement`: here, `local()`; in a helper VM, started
    /// with what the first request [`needs`] (see [`Placed::start`]).
    /// `stall`: the stall timeout of every run (default: for where it runs).
    pub fn new(
        placement: Placement,
        local: impl FnOnce() -> L,
        stall: Option<StallTimeout>,
        seccomp: bool,
        stdin: bool,
    ) -> Self {
        let (place, default_stall) = match placement {
            Placement::Host => (Place::Here(local()), StallTimeout::HARDWARE),
            Placement::HelperVm { reason } => (
                Place::HelperVm {
                    reason,
                    remote: None,
                    stdin,
                },
                StallTimeout::HELPER_VM,
            ),
        };
        Placed {
            place,
            stall: stall.unwrap_or(default_stall),
            seccomp,
            seccomp_said: false,
        }
    }

    /// Whether the runs happen in a helper VM.
    pub fn in_helper_vm(&self) -> bool {
        matches!(self.place, Place::HelperVm { .. })
    }

    /// Starts the helper VM now (no-op here or once started), holding
    /// `needs`: for a caller that starts it on a thread of its own choosing
    /// (QEMU ends with the thread that started it) or that shares more than
    /// its first request names.
    pub fn start(&mut self, needs: Needs) -> Result<(), RemoteError> {
        if let Place::HelperVm {
            reason,
            remote: remote @ None,
            ..
        } = &mut self.place
        {
            *remote = Some(Box::new(Remote::start(reason, needs)?));
        }
        Ok(())
    }

    /// Sends `request`; with `stdin`, this process's stdin goes along when
    /// the verb forwards it.
    fn send(&mut self, request: Request, stdin: bool) -> Reply {
        match &mut self.place {
            Place::Here(local) => local.call(request),
            Place::HelperVm {
                remote: Some(remote),
                stdin: forwarded,
                ..
            } => remote.call_with_stdin(&request, stdin && *forwarded),
            Place::HelperVm { remote: None, .. } => {
                Err("the helper VM was not started (it failed to start before)".into())
            }
        }
    }
}

impl<L: Runner> Runner for Placed<L> {
    fn call(&mut self, mut request: Request) -> Reply {
        if let Some(timeout) = request.stall_timeout_mut() {
            *timeout = self.stall;
        }
        if let Place::HelperVm { remote: None, .. } = self.place {
            let needs = needs(&mut request).map_err(|e| ::run::chain(&e))?;
            self.start(needs).map_err(|e| ::run::chain(&e))?;
        }
        if !self.seccomp_said {
            self.seccomp_said = true;
            // On by default wherever the runs are; a caller that says it
            // first (to name the failure) says it once.
            if !self.seccomp && !matches!(request, Request::Seccomp { .. }) {
                // The verb's stdin is for its own request.
                self.send(Request::Seccomp { enabled: false }, false)?;
            }
        }
        self.send(request, true)
    }
}

/// One call's streams inside the helper VM: its output frames and its stdin.
struct CallStreams {
    stdout: OutputWriter,
    stderr: OutputWriter,
    stdin: RefCell<Option<Input>>,
}

impl Streams for CallStreams {
    fn stdout(&self) -> Box<dyn std::io::Write + Send> {
        Box::new(self.stdout.clone())
    }
    fn stderr(&self) -> Box<dyn std::io::Write + Send> {
        Box::new(self.stderr.clone())
    }
    fn stdin(&self) -> Option<Input> {
        self.stdin.borrow_mut().take()
    }
}

/// Inside the helper VM (`detvisor serve-channel`): answers the run
/// library's requests arriving on the channel until the host shuts it
/// down, holding live runs between them; each request's output goes back
/// as the channel's stdout and stderr frames of that call.
pub fn serve() -> Result<(), crate::channel::ServeError> {
    // This process is detvisor's own: once the first guest is set up, the
    // seccomp filter covers every thread of it (the channel's reader
    // among them), for every later request too. `Request::Seccomp` turns
    // it off before that, for `--no-seccomp`.
    vmm::seccomp::set_scope(vmm::seccomp::Scope::Process);
    let mut controller = Controller::new();
    crate::channel::serve(|request: Request, io: &mut CallIo| -> Reply {
        let input = io.stdin.take_receiver();
        // A fork's shell ends at Ctrl-D, as on the host.
        let input = match request {
            Request::Shell(_) | Request::ShellIn { .. } => ::run::streams::until_eot(input),
            _ => input,
        };
        let streams = CallStreams {
            stdout: io.stdout.clone(),
            stderr: io.stderr.clone(),
            stdin: RefCell::new(Some(input)),
        };
        controller
            .handle(request, &streams)
            .map_err(|e| ::run::chain(&e))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::run::api::{Response, RunId};

    fn guest(dir: &Path, ram_bytes: u64) -> GuestSpec {
        let kernel = dir.join("vmlinux");
        let initrd = dir.join("initrd.img");
        std::fs::write(&kernel, b"k").unwrap();
        std::fs::write(&initrd, b"i").unwrap();
        GuestSpec {
            seed: 0,
            kernel: Some(kernel),
            initrd: Some(initrd),
            cmdline: None,
            ram_bytes,
            until: None,
            rtc_epoch_unix_secs: 0,
            network: None,
            command: vec!["true".into()],
            stall_timeout: StallTimeout::default(),
            exit_path: Default::default(),
            clock: Default::default(),
            pmu_counter: Default::default(),
        }
    }

    /// A plain run ships its kernel and initrd, shares the directories it
    /// writes (at their absolute paths) and sizes the helper VM for its RAM.
    #[test]
    fn test_a_run_ships_its_image_and_shares_what_it_writes() {
        let scratch = TempDir::new("detvisor-needs-").unwrap();
        let dir = scratch.path().canonicalize().unwrap();
        let mut request = Request::Run {
            guest: guest(&dir, 4 << 30),
            snapshots: None,
            pcap: Some(dir.join("pcap")),
            trace: None,
        };
        let needs = needs(&mut request).unwrap();
        let names: Vec<&str> = needs
            .files
            .iter()
            .map(|f| f.payload_name.as_str())
            .collect();
        assert_eq!(names, ["vmlinux", "initrd"]);
        assert_eq!(needs.files[0].host_path, dir.join("vmlinux"));
        assert_eq!(needs.shared_dirs, [dir.join("pcap")]);
        assert_eq!(needs.memory_mib, 4096 + 1024);
        let Request::Run { guest, pcap, .. } = request else {
            panic!("still a run request");
        };
        assert_eq!(
            guest.kernel,
            Some(PathBuf::from(crate::payload_path("vmlinux")))
        );
        assert_eq!(
            guest.initrd,
            Some(PathBuf::from(crate::payload_path("initrd")))
        );
        assert_eq!(pcap, Some(dir.join("pcap")));
        // A small guest still gets the helper VM's floor.
        let mut audit = Request::Audit {
            guest: guest_small(&dir),
            options: Default::default(),
        };
        assert_eq!(needs_of(&mut audit).memory_mib, 2048);
    }

    fn guest_small(dir: &Path) -> GuestSpec {
        guest(dir, 256 << 20)
    }

    fn needs_of(request: &mut Request) -> Needs {
        needs(request).unwrap()
    }

    /// A request on a held run names nothing on the host.
    #[test]
    fn test_a_held_run_s_requests_need_nothing() {
        for mut request in [
            Request::Outcome { run: RunId(1) },
            Request::Close { run: RunId(1) },
            Request::HostReport,
            Request::Seccomp { enabled: false },
            Request::ReadFile {
                run: RunId(1),
                node: Some("n1".into()),
                path: "/etc/hostname".into(),
                limit: 10,
            },
            Request::Exec {
                run: RunId(1),
                exec: ::run::inspect::ExecRequest {
                    node: None,
                    command: vec!["cat".into(), "/tmp/x".into()],
                    env: Default::default(),
                    mode: ::run::inspect::ExecMode::Frozen,
                    timeout: vmm::VirtNanos(1),
                    output_limit: 1,
                },
            },
            Request::Processes {
                run: RunId(1),
                node: None,
            },
            Request::Inspect { run: RunId(1) },
        ] {
            let needs = needs_of(&mut request);
            assert!(needs.files.is_empty() && needs.shared_dirs.is_empty());
            assert_eq!(needs.memory_mib, 0);
        }
    }

    /// A moment that names no snapshot is refused before any helper VM.
    #[test]
    fn test_a_moment_naming_no_snapshot_is_refused_first() {
        let mut request = Request::Seek {
            moment: "/nonexistent/detvisor-snapshots@1s".parse().unwrap(),
        };
        assert!(needs(&mut request).is_err());
    }

    /// Records what it is asked; answers `Closed`.
    #[derive(Default)]
    struct Recording(Vec<Request>);

    impl Runner for Recording {
        fn call(&mut self, request: Request) -> Reply {
            self.0.push(request);
            Ok(Response::Closed)
        }
    }

    fn requests(placed: Placed<Recording>) -> Vec<Request> {
        match placed.place {
            Place::Here(recording) => recording.0,
            Place::HelperVm { .. } => panic!("placed here"),
        }
    }

    /// Here, every request that runs a guest gets the stall timeout for
    /// where it runs, and `--no-seccomp` goes ahead of the first request,
    /// once.
    #[test]
    fn test_a_placed_runner_sets_the_stall_timeout_and_says_seccomp_once() {
        let scratch = TempDir::new("detvisor-placed-").unwrap();
        let mut placed = Placed::new(Placement::Host, Recording::default, None, false, false);
        assert!(!placed.in_helper_vm());
        placed
            .call(Request::Boot {
                guest: guest_small(scratch.path()),
            })
            .unwrap();
        placed.call(Request::Close { run: RunId(1) }).unwrap();
        let seen = requests(placed);
        assert!(matches!(seen[0], Request::Seccomp { enabled: false }));
        let Request::Boot { guest } = &seen[1] else {
            panic!("the boot request second");
        };
        assert_eq!(guest.stall_timeout, StallTimeout::HARDWARE);
        assert!(matches!(seen[2], Request::Close { .. }));
        assert_eq!(seen.len(), 3);

        let stall = StallTimeout(std::time::Duration::from_secs(5));
        let mut placed = Placed::new(
            Placement::Host,
            Recording::default,
            Some(stall),
            false,
            false,
        );
        placed.call(Request::Seccomp { enabled: false }).unwrap();
        placed
            .call(Request::Boot {
                guest: guest_small(scratch.path()),
            })
            .unwrap();
        let seen = requests(placed);
        assert_eq!(seen.len(), 2);
        let Request::Boot { guest } = &seen[1] else {
            panic!("the boot request second");
        };
        assert_eq!(guest.stall_timeout, stall);
    }
}
