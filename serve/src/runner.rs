//! The one runner every session of a server shares: the run library on a
//! thread of its own where the host's KVM runs guests, or one long-lived
//! helper VM where it does not, started for the first request and kept, so
//! that no later call pays a helper VM's boot.
//!
//! A helper VM is given its files when it starts (`helper_vm::client::
//! needs`); a server's later runs name other files (another finding's
//! initrd, a patched system's). So the files of a run are staged here, in a
//! directory shared with the helper VM at its own path, and every request
//! is rewritten to name them there; directories a request reads or writes
//! (snapshots) must lie in the directories shared when it started (the
//! server's root among them).

use helper_vm::client::Placed;
use helper_vm::{HelperVm, Placement, TempDir};
use run::api::{Reply, Request};
use run::client::{InProcess, Runner};
use run::up::{Initrd, PreparedUp, UpOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use vmm::stall::StallTimeout;

/// Where the shared runner's runs happen, and what a helper VM holds.
#[derive(Clone, Debug)]
pub struct RunnerOptions {
    pub placement: Placement,
    /// Guests under the VMM's seccomp filter.
    pub seccomp: bool,
    /// Directories shared with a helper VM (at their own paths) besides
    /// the staging directory: the server's root, the node disks' cache.
    pub shared_dirs: Vec<PathBuf>,
    /// A helper VM's memory, in MiB, at least (it holds every session's
    /// run at once).
    pub helper_memory_mib: u32,
}

/// A request and where its reply goes.
type Job = (Request, crossbeam_channel::Sender<Reply>);

/// A handle on the shared runner (clone it for each session); the runner's
/// thread ends when the last handle is dropped.
#[derive(Clone)]
pub struct SharedRunner {
    jobs: crossbeam_channel::Sender<Job>,
}

impl SharedRunner {
    /// Starts the runner's thread (a helper VM starts with the first
    /// request: QEMU is tied to the thread that starts it, this one).
    pub fn start(options: RunnerOptions) -> std::io::Result<SharedRunner> {
        let (jobs, incoming) = crossbeam_channel::unbounded::<Job>();
        std::thread::Builder::new()
            .name("shared-runner".into())
            .spawn(move || {
                let mut place = Place::new(options);
                for (request, reply) in incoming {
                    // The caller may have gone (a cancelled call): fine.
                    let _ = reply.send(place.call(request));
                }
            })?;
        Ok(SharedRunner { jobs })
    }

    /// A runner for one session (or one worker) on this shared one.
    pub fn handle(&self) -> Box<dyn Runner + Send> {
        Box::new(self.clone())
    }
}

impl Runner for SharedRunner {
    fn call(&mut self, request: Request) -> Reply {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.jobs
            .send((request, reply))
            .map_err(|_| "the shared runner stopped".to_string())?;
        answer
            .recv()
            .map_err(|_| "the shared runner stopped".to_string())?
    }
}

/// The runner's thread's state.
enum Place {
    Here(Box<Placed<InProcess>>),
    HelperVm(Box<HelperPlace>),
}

impl Place {
    fn new(options: RunnerOptions) -> Place {
        match options.placement.clone() {
            Placement::Host => Place::Here(Box::new(Placed::new(
                Placement::Host,
                InProcess::new,
                None,
                options.seccomp,
                false,
            ))),
            Placement::HelperVm { reason } => Place::HelperVm(Box::new(HelperPlace {
                reason,
                options,
                vm: None,
                staging: None,
                staged: BTreeMap::new(),
                kernels: BTreeMap::new(),
                seccomp_said: false,
            })),
        }
    }

    fn call(&mut self, request: Request) -> Reply {
        match self {
            Place::Here(placed) => placed.call(request),
            Place::HelperVm(helper) => helper.call(request),
        }
    }
}

/// One helper VM for every request.
struct HelperPlace {
    reason: String,
    options: RunnerOptions,
    vm: Option<HelperVm>,
    /// Files staged for the helper VM, shared with it at its own path.
    staging: Option<TempDir>,
    /// What was staged: a host file (or an initrd's digest) and where it is.
    staged: BTreeMap<String, PathBuf>,
    /// Kernels shipped in the helper VM's payload when it started (the
    /// VMM loads a kernel straight into guest memory, which a file on the
    /// shared directory cannot be read into): host path, path inside.
    kernels: BTreeMap<PathBuf, PathBuf>,
    seccomp_said: bool,
}

impl HelperPlace {
    fn call(&mut self, mut request: Request) -> Reply {
        if let Some(timeout) = request.stall_timeout_mut() {
            *timeout = StallTimeout::HELPER_VM;
        }
        let memory = self.rewrite(&mut request)?;
        if self.vm.is_none() {
            self.start(memory)?;
        }
        if !self.seccomp_said {
            self.seccomp_said = true;
            if !self.options.seccomp {
                self.send(&Request::Seccomp { enabled: false })?;
            }
        }
        self.send(&request)
    }

    fn send(&mut self, request: &Request) -> Reply {
        let vm = self.vm.as_mut().ok_or("the helper VM is not running")?;
        // Output of a run (node output, events) goes to this process's
        // stderr: its stdout may be a protocol's.
        let reply: Reply = vm
            .call(
                request,
                &mut std::io::stderr(),
                &mut std::io::stderr(),
                None,
            )
            .map_err(|e| run::chain(&e))?;
        reply
    }

    fn staging(&mut self) -> Result<PathBuf, String> {
        if self.staging.is_none() {
            let dir = TempDir::new("detvisor-serve-")
                .map_err(|e| format!("creating the helper VM's staging directory: {e}"))?;
            self.staging = Some(dir);
        }
        let dir = self.staging.as_ref().expect("staged").path();
        dir.canonicalize()
            .map_err(|e| format!("{}: {e}", dir.display()))
    }

    /// Rewrites `request`'s host files to where the helper VM sees them;
    /// the memory (MiB) a helper VM started for it needs.
    fn rewrite(&mut self, request: &mut Request) -> Result<u32, String> {
        if let Request::Up { prepared, options } | Request::BootUp { prepared, options } = request {
            let initrd = match &prepared.initrd {
                Initrd::Bytes(bytes) => bytes.len() as u64,
                Initrd::File(path) => std::fs::metadata(path).map_or(0, |m| m.len()),
            };
            self.stage_up(prepared, options)?;
            // As `helper_vm::client::needs` counts an `up` run.
            return Ok(((prepared.ram_bytes >> 20) as u32)
                .saturating_add(1536)
                .saturating_add(((3 * initrd) >> 20) as u32)
                .max(2048));
        }
        let mut probe = request.clone();
        let needs = helper_vm::client::needs(&mut probe).map_err(|e| run::chain(&e))?;
        if !needs.files.is_empty() {
            return Err(
                "this request ships files into a helper VM: the server's shared one takes `up` runs and snapshots only"
                    .into(),
            );
        }
        // Its paths made absolute, as inside.
        *request = probe;
        // The helper VM shares the root, the disks' cache and the staging
        // directory, whichever request comes first.
        for dir in &needs.shared_dirs {
            self.check_shared(dir)?;
        }
        Ok(needs.memory_mib)
    }

    fn stage_up(&mut self, prepared: &mut PreparedUp, options: &UpOptions) -> Result<(), String> {
        let staging = self.staging()?;
        let initrd = match &prepared.initrd {
            Initrd::Bytes(bytes) => {
                let key = format!("initrd:{}", blake3::hash(bytes).to_hex());
                match self.staged.get(&key) {
                    Some(path) => path.clone(),
                    None => {
                        let path = staging.join(format!("initrd-{}", self.staged.len()));
                        std::fs::write(&path, bytes)
                            .map_err(|e| format!("{}: {e}", path.display()))?;
                        self.staged.insert(key, path.clone());
                        path
                    }
                }
            }
            Initrd::File(path) => self.stage_file(&staging, path, "initrd")?,
        };
        prepared.initrd = Initrd::File(initrd);
        prepared.kernel = self.kernel(&prepared.kernel)?;
        for disk in &mut prepared.disks {
            disk.image = disk
                .image
                .canonicalize()
                .map_err(|e| format!("disk image {}: {e}", disk.image.display()))?;
            self.check_shared(&disk.image)?;
        }
        for (what, path) in [
            ("logs", &options.logs),
            ("pcap", &options.pcap),
            ("trace", &options.trace),
            ("records", &options.records),
        ] {
            if path.is_some() {
                return Err(format!(
                    "the server's helper VM takes no {what} file of an `up` run"
                ));
            }
        }
        if options.snapshots.is_some() {
            return Err("the server's helper VM takes no snapshots of an `up` run".into());
        }
        Ok(())
    }

    /// Where the helper VM has the kernel `path`: shipped in its payload
    /// when it starts; a kernel it was not started with is refused.
    fn kernel(&mut self, path: &Path) -> Result<PathBuf, String> {
        let host = path
            .canonicalize()
            .map_err(|e| format!("kernel {}: {e}", path.display()))?;
        if let Some(inside) = self.kernels.get(&host) {
            return Ok(inside.clone());
        }
        if self.vm.is_some() {
            return Err(format!(
                "kernel {}: the server's helper VM started with {}; a run with another kernel needs a server of its own",
                host.display(),
                self.kernels
                    .keys()
                    .map(|k| k.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let inside = PathBuf::from(helper_vm::payload_path(&format!(
            "vmlinux-{}",
            self.kernels.len()
        )));
        self.kernels.insert(host, inside.clone());
        Ok(inside)
    }

    /// A copy of the host file `path` in the staging directory (once).
    fn stage_file(&mut self, staging: &Path, path: &Path, what: &str) -> Result<PathBuf, String> {
        let key = format!("{what}:{}", path.display());
        if let Some(staged) = self.staged.get(&key) {
            return Ok(staged.clone());
        }
        let staged = staging.join(format!("{what}-{}", self.staged.len()));
        std::fs::copy(path, &staged).map_err(|e| format!("{what} {}: {e}", path.display()))?;
        self.staged.insert(key, staged.clone());
        Ok(staged)
    }

    /// Refuses a path outside the directories the helper VM shares.
    fn check_shared(&self, path: &Path) -> Result<(), String> {
        let staging = self.staging.as_ref().map(|s| s.path().to_path_buf());
        let shared = self.options.shared_dirs.iter().chain(staging.iter());
        if shared.clone().any(|dir| path.starts_with(dir)) {
            return Ok(());
        }
        Err(format!(
            "{}: outside the directories the server's helper VM shares ({})",
            path.display(),
            shared
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    fn start(&mut self, memory_mib: u32) -> Result<(), String> {
        let staging = self.staging()?;
        let mut shared = vec![staging];
        for dir in &self.options.shared_dirs {
            if let Ok(dir) = dir.canonicalize() {
                shared.push(dir);
            }
        }
        let memory = memory_mib.max(self.options.helper_memory_mib);
        eprintln!(
            "detvisor: serving through one helper VM (QEMU TCG with nested SVM, {memory} MiB), kept for every call, because {}",
            self.reason
        );
        let files: Vec<helper_vm::PayloadFile> = self
            .kernels
            .iter()
            .map(|(host, inside)| helper_vm::PayloadFile {
                host_path: host.clone(),
                payload_name: inside
                    .strip_prefix(helper_vm::payload_path(""))
                    .expect("a payload path")
                    .display()
                    .to_string(),
            })
            .collect();
        let vm = helper_vm::client::start_serving(&["serve-channel"], memory, shared, &files)
            .map_err(|e| run::chain(&e))?;
        self.vm = Some(vm);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(kernel: &Path, initrd: Initrd) -> PreparedUp {
        PreparedUp {
            kernel: kernel.to_path_buf(),
            initrd,
            specs: Vec::new(),
            node_names: Vec::new(),
            workload: None,
            network: devices::NetworkConfig::reliable(devices::LatencyDist::Fixed(vmm::VirtNanos(
                1_000_000,
            ))),
            rtc_epoch_unix_secs: 0,
            ram_bytes: 384 << 20,
            faults: Vec::new(),
            disks: Vec::new(),
        }
    }

    fn helper(shared: &Path) -> HelperPlace {
        HelperPlace {
            reason: "a test".into(),
            options: RunnerOptions {
                placement: Placement::HelperVm {
                    reason: "a test".into(),
                },
                seccomp: true,
                shared_dirs: vec![shared.to_path_buf()],
                helper_memory_mib: 0,
            },
            vm: None,
            staging: None,
            staged: BTreeMap::new(),
            kernels: BTreeMap::new(),
            seccomp_said: false,
        }
    }

    /// An `up` run's initrd and kernel are staged once each (by content,
    /// by path) in the directory shared with the helper VM, the request
    /// rewritten to name them there; what the shared helper VM cannot
    /// hold is refused, naming it.
    #[test]
    fn test_a_run_s_files_are_staged_once_for_the_shared_helper_vm() {
        let scratch = tempfile::tempdir().unwrap();
        let kernel = scratch.path().join("vmlinux");
        std::fs::write(&kernel, b"kernel").unwrap();
        let mut place = helper(scratch.path());
        let boot = |initrd: &[u8]| Request::BootUp {
            prepared: prepared(&kernel, Initrd::Bytes(initrd.to_vec())),
            options: UpOptions::new(1),
        };
        let mut first = boot(b"initrd one");
        let memory = place.rewrite(&mut first).unwrap();
        assert_eq!(memory, 2048, "at least the helper VM's floor");
        let Request::BootUp { prepared: one, .. } = &first else {
            panic!("a boot")
        };
        let Initrd::File(initrd) = &one.initrd else {
            panic!("staged as a file")
        };
        let staging = place.staging().unwrap();
        assert!(initrd.starts_with(&staging));
        assert_eq!(std::fs::read(initrd).unwrap(), b"initrd one");
        // The kernel goes in the helper VM's payload.
        assert_eq!(one.kernel, Path::new("/payload/files/vmlinux-0"));
        let mut again = boot(b"initrd one");
        place.rewrite(&mut again).unwrap();
        let mut other = boot(b"initrd two");
        place.rewrite(&mut other).unwrap();
        let (
            Request::BootUp {
                prepared: again, ..
            },
            Request::BootUp {
                prepared: other, ..
            },
        ) = (&again, &other)
        else {
            panic!("boots")
        };
        let file = |initrd: &Initrd| match initrd {
            Initrd::File(path) => path.clone(),
            Initrd::Bytes(_) => panic!("staged as a file"),
        };
        assert_eq!(
            file(&again.initrd),
            file(&one.initrd),
            "the same bytes staged once"
        );
        assert_ne!(file(&other.initrd), file(&one.initrd));
        assert_eq!(other.kernel, one.kernel, "the same kernel shipped once");
        assert_eq!(place.staged.len(), 2);

        let mut logs = boot(b"initrd one");
        if let Request::BootUp { options, .. } = &mut logs {
            options.logs = Some(scratch.path().join("logs"));
        }
        let refused = place.rewrite(&mut logs).unwrap_err();
        assert!(refused.contains("no logs file"), "{refused}");
        assert!(place.check_shared(&scratch.path().join("x")).is_ok());
        let outside = place.check_shared(Path::new("/elsewhere")).unwrap_err();
        assert!(outside.contains("/elsewhere: outside"), "{outside}");
    }
}
