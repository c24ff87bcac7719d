//! One alternate history from a saved moment (`detvisor branch DIR@T`):
//! the moment restored and replayed exactly, optionally re-keyed, run on to
//! its end (taking snapshots of the branch too, if asked).

use crate::outcome::RunSummary;
use crate::snapshots::{self, NodeOutput, SnapshotPlan, Snapshotter};
use crate::streams::Streams;
use serde::{Deserialize, Serialize};
use vmm::record::RecordConfig;
use vmm::stall::StallTimeout;
use vmm::vm::ResumeConfig;
use vmm::VirtNanos;

/// What `branch` asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BranchRequest {
    /// The moment: DIR@<time>, DIR@exit:<n>, DIR@latest or DIR/<id>.
    pub spec: String,
    /// Stop at this virtual time (absolute).
    pub until: Option<VirtNanos>,
    /// Re-key every seeded stream from this seed at the branch point.
    pub seed: Option<u64>,
    /// Snapshots of the branch.
    pub snapshots: Option<SnapshotPlan>,
    /// Print an `up` snapshot's events (node started, faults) on stderr.
    pub events: bool,
    /// Faults added at the branch point (`at=+2s` counts from it), as
    /// written: see [`crate::faults`].
    #[serde(default)]
    pub faults: Vec<String>,
    /// Wall time the guest may run without a VM exit before the run ends
    /// as stalled (host policy, not part of the history).
    #[serde(default)]
    pub stall_timeout: StallTimeout,
    /// Write every exit of the branch (from the branch point on) here, a
    /// JSON line each (see [`crate::trace`]).
    #[serde(default)]
    pub trace: Option<std::path::PathBuf>,
}

/// Why a branch could not be restored or run.
#[derive(Debug, thiserror::Error)]
pub enum BranchError {
    /// Restoring the moment, or the branch's own snapshots.
    #[error(transparent)]
    Snapshots(#[from] crate::snapshots::SnapshotsError),
    #[error(transparent)]
    Driven(#[from] crate::driven::DrivenError),
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
}

/// Runs the branch: the guest's console (or an `up` run's node output) to
/// `streams`' stdout.
pub fn branch(request: &BranchRequest, streams: &dyn Streams) -> Result<RunSummary, BranchError> {
    let resume = ResumeConfig {
        until: request.until,
        record: RecordConfig::default(),
        stall_timeout: request.stall_timeout,
    };
    let node_output = NodeOutput {
        out: Box::new(streams.stdout()),
        events: request
            .events
            .then(|| Box::new(streams.stderr()) as Box<dyn std::io::Write>),
    };
    // Before the VM starts: a path that cannot be written stops nothing running.
    let trace = crate::trace::TraceFile::create_if(request.trace.as_deref())?;
    let mut restored =
        snapshots::restore(&request.spec, &resume, streams.stdout(), None, node_output)?;
    let driven = &mut restored.driven;
    if let Some(trace) = &trace {
        trace.attach(&mut driven.session);
    }
    if let Some(seed) = request.seed {
        // An alternate history from here on.
        driven.rekey(seed)?;
    }
    driven.add_faults(&request.faults)?;
    let stop = match restored.stopped_early {
        Some(stop) => stop,
        None => match &request.snapshots {
            Some(plan) => {
                let mut snapshotter =
                    Snapshotter::new(plan, Some(restored.snapshot.meta.id.clone()))?;
                snapshotter.run(driven)?
            }
            None => driven.run_to_end()?,
        },
    };
    let seed = driven.session.seed();
    let exit_status = driven.exit_status(stop);
    let outcome = driven.outcome(stop)?;
    if let Some(trace) = trace {
        trace.finish()?;
    }
    Ok(RunSummary::new(seed, &outcome).with_exit_status(exit_status))
}
