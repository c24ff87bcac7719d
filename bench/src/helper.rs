//! The helper VM session seen from the host.
//!
//! When the host's KVM cannot run guests, a bench starts the helper VM with the helper-VM
//! crate ([`helper_vm::HelperVm`]): its payload is this detvisor serving the benches' calls
//! ([`crate::serve`]), the files a plan names are shipped along, its directories shared. The
//! bench sends its worker's plan as one call and gets the worker's report back; how long the
//! helper VM took to start, to answer and to shut down is the [`Session`].

use anyhow::{bail, Context, Result};
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::boot_worker::BootWorkerReport;
use crate::branch_snapshots_worker::BranchSnapshotsReport;
use crate::etcd_worker::EtcdWorkerReport;
use crate::exits_worker::ExitsWorkerReport;
use crate::report::{Session, WorkerReport};
use crate::serve::{BenchCall, BenchReply};
use crate::snapshot_worker::SnapWorkerReport;
use crate::stats::ms;
use helper_vm::{HelperVm, PayloadFile};

/// Extra time allowed for a helper VM to boot and shut down.
pub const HELPER_VM_ALLOWANCE: Duration = Duration::from_secs(300);

/// A worker's report as the helper VM's reply carries it.
pub trait FromReply: Sized {
    /// The report in a reply, if the reply is one.
    fn from_reply(reply: BenchReply) -> Option<Self>;
}

/// `FromReply` for each worker's report, by its variant of [`BenchReply`].
macro_rules! from_reply {
    ($($report:ty => $variant:ident),* $(,)?) => {$(
        impl FromReply for $report {
            fn from_reply(reply: BenchReply) -> Option<Self> {
                match reply {
                    BenchReply::$variant(report) => Some(*report),
                    _ => None,
                }
            }
        }
    )*};
}

from_reply!(
    BootWorkerReport => Boot,
    SnapWorkerReport => Snapshot,
    EtcdWorkerReport => Etcd,
    ExitsWorkerReport => Exits,
    BranchSnapshotsReport => BranchSnapshots,
);

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
    pub fn run<R: WorkerReport + FromReply>(
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
        let files: Vec<PayloadFile> = self
            .files
            .into_iter()
            .map(|(host_path, payload_name)| PayloadFile {
                host_path,
                payload_name,
            })
            .collect();
        if !announce.is_empty() {
            crate::say!("{announce}");
        }
        let started = Instant::now();
        let mut vm = helper_vm::client::start_serving(
            &["bench", "serve-channel"],
            self.memory_mib,
            self.shared_dirs,
            &files,
        )?;
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
