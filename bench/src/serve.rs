//! `detvisor bench serve-channel` (hidden): what runs inside the helper VM. It answers the
//! benches' calls on the helper VM's typed channel: a worker's plan (the worker runs here, in
//! L1, and its report goes back), or a plain run through the run library's typed client.
//! Progress lines go back as the call's stderr frames.

use anyhow::Result;
use helper_vm::channel::CallIo;
use run::outcome::RunSummary;
use run::plain::GuestSpec;
use serde::{Deserialize, Serialize};

use crate::boot_worker::{run_plain, BootWorkerReport, WorkerPlan};
use crate::branch_snapshots_worker::{BranchSnapshotsPlan, BranchSnapshotsReport};
use crate::etcd_worker::{EtcdWorkerPlan, EtcdWorkerReport};
use crate::exits_worker::{ExitsPlan, ExitsWorkerReport};
use crate::machine::uptime;
use crate::snapshot_worker::{SnapWorkerPlan, SnapWorkerReport};

/// What a bench asks of the helper VM.
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
pub enum BenchCall {
    /// L1's uptime (s).
    Uptime,
    Boot(WorkerPlan),
    Snapshot(SnapWorkerPlan),
    Etcd(EtcdWorkerPlan),
    Exits(Box<ExitsPlan>),
    BranchSnapshots(BranchSnapshotsPlan),
    /// A plain run to its end through the run library (an end-to-end
    /// run, as `detvisor run` makes it).
    Run(Box<GuestSpec>),
}

/// The answer to a [`BenchCall`].
#[derive(Serialize, Deserialize, Debug)]
#[serde(rename_all = "snake_case")]
pub enum BenchReply {
    Uptime(Option<f64>),
    Boot(Box<BootWorkerReport>),
    Snapshot(Box<SnapWorkerReport>),
    Etcd(Box<EtcdWorkerReport>),
    Exits(Box<ExitsWorkerReport>),
    BranchSnapshots(Box<BranchSnapshotsReport>),
    Run(Box<RunSummary>),
}

/// Carries out `call` here.
pub fn answer(call: BenchCall) -> Result<BenchReply> {
    Ok(match call {
        BenchCall::Uptime => BenchReply::Uptime(uptime()),
        BenchCall::Boot(plan) => BenchReply::Boot(Box::new(crate::boot_worker::worker(&plan))),
        BenchCall::Snapshot(plan) => {
            BenchReply::Snapshot(Box::new(crate::snapshot_worker::worker(&plan)))
        }
        BenchCall::Etcd(plan) => BenchReply::Etcd(Box::new(crate::etcd_worker::worker(&plan))),
        BenchCall::Exits(plan) => BenchReply::Exits(Box::new(crate::exits_worker::worker(&plan))),
        BenchCall::BranchSnapshots(plan) => {
            BenchReply::BranchSnapshots(Box::new(crate::branch_snapshots_worker::worker(&plan)))
        }
        BenchCall::Run(guest) => {
            BenchReply::Run(Box::new(on_own_thread(move || run_plain(*guest))?))
        }
    })
}

/// Runs `f` on a thread of its own and waits for it: a run installs the
/// VMM's seccomp filter on the thread that runs its guest (see
/// docs/security.md), and this process's main thread goes on to start QEMU
/// baselines and tools, which the filter would refuse. The benches' other
/// runs are on threads of their own already (`process::run_in_process`).
fn on_own_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            // A main thread's stack (8 MiB) and room to spare, as the
            // campaign's run thread.
            .stack_size(32 << 20)
            .spawn_scoped(s, f)
            .expect("starting a run's thread")
            .join()
    })
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Serves calls until the host shuts the channel down.
pub fn serve() -> Result<u8> {
    helper_vm::channel::serve(
        |call: BenchCall, io: &mut CallIo| -> Result<BenchReply, String> {
            crate::progress_to(Some(Box::new(io.stderr.clone())));
            let reply = answer(call).map_err(|e| format!("{e:#}"));
            crate::progress_to(None);
            reply
        },
    )?;
    Ok(0)
}
