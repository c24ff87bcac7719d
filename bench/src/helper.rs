//! Where the guests run, and the helper VM session seen from the host.
//!
//! When the host's KVM cannot run guests, a bench starts the helper VM with the helper-VM
//! crate ([`helper_vm::HelperVm`]): its payload is this detvisor serving the benches' calls
//! ([`crate::serve`]), the files a plan names are shipped along, its directories shared. The
//! bench sends its worker's plan as one call and gets the worker's report back; how long the
//! helper VM took to start, to answer and to shut down is the [`Session`].

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::serve::{BenchCall, BenchReply};
use crate::stats::ms;
use crate::BenchHostVm;
use helper_vm::{HelperVm, HelperVmConfig, PayloadFile};

/// Extra time allowed for a helper VM to boot and shut down.
pub const HELPER_VM_ALLOWANCE: Duration = Duration::from_secs(300);
/// The error of every measurement of a failed helper VM session.
pub const NOT_MEASURED: &str = "not measured: the helper VM session failed (see below)";

/// Where the guests run.
pub struct Placement {
    /// In the helper VM (else on the host).
    pub helper: bool,
    /// Why the helper VM is used.
    pub reason: Option<String>,
}

impl Placement {
    pub fn choose(host_vm: BenchHostVm) -> Self {
        let (helper, reason) = match host_vm {
            BenchHostVm::Always => (true, Some("--host-vm always".to_string())),
            BenchHostVm::Never => (false, None),
            BenchHostVm::Auto => {
                let report = vmm::probe::host_report();
                if report.can_run_guests {
                    (false, None)
                } else {
                    (true, report.reason)
                }
            }
        };
        Placement { helper, reason }
    }

    /// "helper VM" or "host".
    pub fn place(&self) -> &'static str {
        if self.helper {
            "helper VM"
        } else {
            "host"
        }
    }

    /// " (because REASON)", or nothing.
    pub fn because(&self) -> String {
        self.reason
            .as_deref()
            .map(|r| format!(" (because {r})"))
            .unwrap_or_default()
    }
}

/// A worker's report: it says how long the worker took, on the clock of the machine it ran on.
pub trait WorkerReport: Sized {
    fn elapsed_ms(&self) -> f64;
    /// The report in a reply, if the reply is one.
    fn from_reply(reply: BenchReply) -> Option<Self>;
}

/// The helper VM session as seen from the host.
#[derive(Serialize, Default)]
pub struct Session {
    /// Start of the helper VM to its payload serving the channel (helper VM boot, incl.
    /// assembling its initrd).
    pub boot_ms: Option<f64>,
    /// The worker's reply to the helper VM's exit (helper VM shutdown).
    pub shutdown_ms: Option<f64>,
    /// Start to exit.
    pub total_ms: f64,
    /// The worker's call, on the host's clock ...
    pub payload_host_ms: Option<f64>,
    /// ... and the worker's own duration on L1's clock (a check of L1's clock).
    pub payload_l1_ms: Option<f64>,
    /// L1's uptime when the payload started (L1 kernel boot + init, on L1's clock).
    pub l1_uptime_at_payload_s: Option<f64>,
    /// Bytes shipped as payload files (QEMU, its libraries and firmware, kernels, initrds).
    pub payload_file_bytes: u64,
    pub error: Option<String>,
}

impl Session {
    /// Runs `f` in a new session; an error of `f` becomes the session's `error`.
    pub fn record<R>(f: impl FnOnce(&mut Session) -> Result<R>) -> (Session, Option<R>) {
        let mut session = Session::default();
        match f(&mut session) {
            Ok(r) => (session, Some(r)),
            Err(e) => {
                session.error = Some(format!("{e:#}"));
                (session, None)
            }
        }
    }
}

/// A helper VM whose payload is `detvisor bench serve-channel`.
pub struct HelperLaunch {
    pub memory_mib: u32,
    /// Payload files: (host path, payload name).
    pub files: Vec<(PathBuf, String)>,
    /// Host directories shared read-write (9p), mounted at the same path in L1.
    pub shared_dirs: Vec<PathBuf>,
}

impl HelperLaunch {
    /// The bytes of the payload files.
    pub fn payload_file_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|(p, _)| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum()
    }

    /// Starts the helper VM (printing `announce(session)` to stderr just before), sends `call`
    /// (its progress lines come back to our stderr), shuts the helper VM down; fills in
    /// `session` and returns the worker's report.
    pub fn run<R: WorkerReport>(
        self,
        call: &BenchCall,
        session: &mut Session,
        announce: impl FnOnce(&Session) -> String,
    ) -> Result<R> {
        session.payload_file_bytes = self.payload_file_bytes();
        let announce = announce(session);
        let (reply, host_ms) = self.session(session, &announce, |vm| {
            let t = Instant::now();
            let reply = call_vm(vm, call)?;
            Ok((reply, ms(t.elapsed())))
        })?;
        let report = R::from_reply(reply).context("the helper VM answered another call")?;
        session.payload_host_ms = Some(host_ms);
        session.payload_l1_ms = Some(report.elapsed_ms());
        Ok(report)
    }

    /// Starts the helper VM (printing `announce` first, unless empty), runs `calls` on it, shuts
    /// it down, timing each step in `session`.
    pub fn session<T>(
        self,
        session: &mut Session,
        announce: &str,
        calls: impl FnOnce(&mut HelperVm) -> Result<T>,
    ) -> Result<T> {
        let mut config = HelperVmConfig {
            assets_dir: helper_vm::ensure_assets(None)?,
            memory_mib: self.memory_mib,
            shared_dirs: self.shared_dirs,
            ..HelperVmConfig::default()
        };
        config.shared_dirs.sort();
        config.shared_dirs.dedup();
        let files: Vec<PayloadFile> = self
            .files
            .into_iter()
            .map(|(host_path, payload_name)| PayloadFile {
                host_path,
                payload_name,
            })
            .collect();
        let exe = std::env::current_exe().context("locating the detvisor executable")?;
        let args: [OsString; 2] = ["bench".into(), "serve-channel".into()];
        if !announce.is_empty() {
            crate::say!("{announce}");
        }
        let started = Instant::now();
        let mut vm = HelperVm::start(&config, &exe, &args, &files)?;
        session.boot_ms = Some(ms(started.elapsed()));
        if let Ok(BenchReply::Uptime(uptime)) = call_vm(&mut vm, &BenchCall::Uptime) {
            session.l1_uptime_at_payload_s = uptime;
        }
        let result = calls(&mut vm);
        let end = Instant::now();
        let status = vm.shutdown();
        session.shutdown_ms = Some(ms(end.elapsed()));
        session.total_ms = ms(started.elapsed());
        match status {
            Ok(0) => {}
            Ok(code) => session.error = Some(format!("the payload exited with status {code}")),
            Err(e) => session.error = Some(format!("{:#}", anyhow::Error::from(e))),
        }
        result
    }
}

/// Sends `call` to the helper VM's bench server; its stdout and stderr frames go to ours.
pub fn call_vm(vm: &mut HelperVm, call: &BenchCall) -> Result<BenchReply> {
    let reply: Result<BenchReply, String> =
        vm.call(call, &mut std::io::stdout(), &mut std::io::stderr(), None)?;
    match reply {
        Ok(reply) => Ok(reply),
        Err(e) => bail!("{e}"),
    }
}
