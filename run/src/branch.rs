//! One alternate history from a saved moment (`detvisor branch DIR@T`):
//! the moment restored and replayed exactly, optionally re-keyed, run on to
//! its end (taking snapshots of the branch too, if asked).

use crate::faults::Fault;
use crate::moment::Moment;
use crate::outcome::RunSummary;
use crate::snapshots::{self, NodeOutput, SnapshotPlan, Snapshotter};
use crate::streams::Streams;
use devices::ClockKind;
use serde::{Deserialize, Serialize};
use vmm::record::RecordConfig;
use vmm::stall::StallTimeout;
use vmm::vm::ResumeConfig;
use vmm::VirtNanos;

/// What `branch` asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BranchRequest {
    /// The moment the branch starts from.
    pub moment: Moment,
    /// Stop at this virtual time (absolute).
    pub until: Option<VirtNanos>,
    /// Re-key every seeded stream from this seed at the branch point.
    pub seed: Option<u64>,
    /// Snapshots of the branch.
    pub snapshots: Option<SnapshotPlan>,
    /// Print an `up` snapshot's events (node started, faults) on stderr.
    pub events: bool,
    /// Faults added at the branch point (`at=+2s` counts from it): see
    /// [`crate::faults`].
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// Wall time the guest may run without a VM exit before the run ends
    /// as stalled (host policy, not part of the history).
    #[serde(default)]
    pub stall_timeout: StallTimeout,
    /// Write every exit of the branch (from the branch point on) here, a
    /// JSON line each (see [`crate::trace`]).
    #[serde(default)]
    pub trace: Option<std::path::PathBuf>,
    /// The clock the caller expects the moment's history to have (`None`:
    /// whichever made it); another is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockKind>,
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
        clock: request.clock,
    };
    let node_output = NodeOutput {
        out: Box::new(streams.stdout()),
        events: request
            .events
            .then(|| Box::new(streams.stderr()) as Box<dyn std::io::Write>),
    };
    // Before the VM starts: a path that cannot be written stops nothing running.
    let trace = crate::trace::TraceFile::create_if(request.trace.as_deref())?;
    // A branch that keeps snapshots writes its first over the snapshot it
    // is restored from: the dirty log counts every page written since.
    let restore = match request.snapshots {
        Some(_) => snapshots::restore_tracking_writes,
        None => snapshots::restore,
    };
    let mut restored = restore(
        &request.moment,
        &resume,
        streams.stdout(),
        None,
        node_output,
    )?;
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
                let mut snapshotter = Snapshotter::over_restored(plan, &restored.snapshot)?;
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

/// Why `branch --fault` texts were refused before anything ran.
#[derive(Debug, thiserror::Error)]
pub enum BranchFaultsError {
    #[error(transparent)]
    Snapshot(#[from] snapshots::SnapshotsError),
    #[error(transparent)]
    Driven(#[from] crate::driven::DrivenError),
    #[error("--fault")]
    Fault(#[source] crate::faults::FaultError),
    #[error("--fault \"{fault}\": at={at} is before the branch point, {point} at the earliest ({moment}): a branch cannot change its past")]
    BeforeBranchPoint {
        fault: Box<Fault>,
        at: VirtNanos,
        point: VirtNanos,
        moment: Moment,
    },
}

/// The part of a snapshot's state (a [`crate::driven::SavedState`]) the
/// checks read: its `up` run's nodes, if it is of one.
#[derive(Deserialize)]
struct NodesOnly {
    up: Option<Nodes>,
}

#[derive(Deserialize)]
struct Nodes {
    node_names: Vec<String>,
}

/// Checks `branch MOMENT --fault` faults against the snapshot `moment` is
/// restored from, from its files alone (before any helper VM starts or any
/// exit is replayed): it is an `up` run's, every node named is one of its
/// nodes, no fault is before the branch point (at the earliest the
/// snapshot's time, or the time `DIR@<time>` names), and no two faults
/// overlap on a lane ([`crate::faults::check_lanes`]).
pub fn check_faults(moment: &Moment, faults: &[Fault]) -> Result<(), BranchFaultsError> {
    let Some(first) = faults.first() else {
        return Ok(());
    };
    let resolved = snapshots::resolve(moment)?;
    let (meta, saved): (snapshot::SnapshotMeta, NodesOnly) =
        snapshot::read_snapshot(&resolved.snapshot.dir).map_err(snapshots::SnapshotsError::from)?;
    let Some(up) = saved.up else {
        return Err(crate::driven::DrivenError::FaultOnPlainRun {
            fault: Box::new(first.clone()),
        }
        .into());
    };
    let point = match resolved.target {
        snapshot::Target::VirtualTime(time) => time.max(meta.virtual_ns),
        _ => meta.virtual_ns,
    };
    let mut all = Vec::new();
    for fault in faults {
        fault
            .check_nodes(&up.node_names)
            .map_err(BranchFaultsError::Fault)?;
        for scheduled in fault
            .scheduled(Some(point))
            .map_err(BranchFaultsError::Fault)?
        {
            if scheduled.at < point {
                return Err(BranchFaultsError::BeforeBranchPoint {
                    fault: Box::new(fault.clone()),
                    at: scheduled.at,
                    point,
                    moment: moment.clone(),
                });
            }
            all.push(scheduled);
        }
    }
    all.sort_by_key(|f| f.at);
    crate::faults::check_lanes(&all).map_err(BranchFaultsError::Fault)?;
    Ok(())
}
