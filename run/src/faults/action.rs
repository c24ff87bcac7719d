//! What a fault does ([`FaultAction`]), by who carries it out, and what
//! `for=` undoes it with.

use super::{DiskFault, NetworkFault};
use guest_agent::protocol::HostToAgent;

/// What a fault does, by who carries it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Carried out by the switch, at the fault's exact time.
    Network(NetworkFault),
    /// Carried out by the agent, at the first exit at or after the fault's time.
    Node(NodeFault),
    /// Carried out by the node's disk, at the fault's exact time.
    Disk(DiskFault),
}

/// Something the agent does to one node. `ClockStep` steps the node's
/// CLOCK_REALTIME by `by_ns` (either way; its monotonic clocks do not move,
/// see docs/determinism.md); `Drift` makes it run `ppm` parts per million
/// fast (negative: slow) from then on, 0 stopping the drift and keeping
/// what it gained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeFault {
    Pause {
        node: String,
    },
    Resume {
        node: String,
    },
    /// `signal: None`: written without `signal=`, SIGKILL.
    Kill {
        node: String,
        signal: Option<i32>,
    },
    Restart {
        node: String,
    },
    /// Kill -9, then unmount the node's disk (whose unflushed writes the
    /// VMM drops at the fault's time, discarding more until then).
    Crash {
        node: String,
    },
    /// Fill the node's disk's free space.
    DiskFull {
        node: String,
    },
    /// Undo [`NodeFault::DiskFull`].
    DiskFree {
        node: String,
    },
    ClockStep {
        node: String,
        by_ns: i64,
    },
    Drift {
        node: String,
        ppm: i32,
    },
}

impl FaultAction {
    /// The node names the action refers to.
    pub fn nodes(&self) -> Vec<&str> {
        match self {
            FaultAction::Network(fault) => fault.nodes(),
            FaultAction::Node(fault) => vec![fault.node()],
            FaultAction::Disk(fault) => vec![fault.node()],
        }
    }

    /// The action as a run records it: its defaults written out (a kill's
    /// signal), so a run's schedule, events and snapshots name the signal.
    pub fn explicit(&self) -> FaultAction {
        match self {
            FaultAction::Node(NodeFault::Kill { node, signal: None }) => {
                FaultAction::Node(NodeFault::Kill {
                    node: node.clone(),
                    signal: Some(libc::SIGKILL),
                })
            }
            other => other.clone(),
        }
    }

    /// The action `for=` schedules after this one, if it has one.
    pub(super) fn undo(&self) -> Option<FaultAction> {
        match self {
            FaultAction::Network(fault) => fault.undo().map(FaultAction::Network),
            FaultAction::Node(NodeFault::Pause { node }) => {
                Some(FaultAction::Node(NodeFault::Resume { node: node.clone() }))
            }
            FaultAction::Node(NodeFault::DiskFull { node }) => {
                Some(FaultAction::Node(NodeFault::DiskFree {
                    node: node.clone(),
                }))
            }
            FaultAction::Disk(fault) => fault.undo().map(FaultAction::Disk),
            FaultAction::Node(NodeFault::Drift { node, .. }) => {
                Some(FaultAction::Node(NodeFault::Drift {
                    node: node.clone(),
                    ppm: 0,
                }))
            }
            _ => None,
        }
    }
}

impl NodeFault {
    /// The node the agent acts on.
    pub fn node(&self) -> &str {
        match self {
            NodeFault::Pause { node }
            | NodeFault::Resume { node }
            | NodeFault::Kill { node, .. }
            | NodeFault::Restart { node }
            | NodeFault::Crash { node }
            | NodeFault::DiskFull { node }
            | NodeFault::DiskFree { node }
            | NodeFault::ClockStep { node, .. }
            | NodeFault::Drift { node, .. } => node,
        }
    }
}

/// The agent's message that carries the fault out.
impl From<NodeFault> for HostToAgent {
    fn from(fault: NodeFault) -> Self {
        match fault {
            NodeFault::Pause { node } => HostToAgent::Pause { node },
            NodeFault::Resume { node } => HostToAgent::Resume { node },
            NodeFault::Kill { node, signal } => HostToAgent::Kill {
                node,
                signal: signal.unwrap_or(libc::SIGKILL),
            },
            NodeFault::Restart { node } => HostToAgent::Restart { node },
            NodeFault::Crash { node } => HostToAgent::Crash { node },
            NodeFault::DiskFull { node } => HostToAgent::FillDisk { node },
            NodeFault::DiskFree { node } => HostToAgent::FreeDisk { node },
            NodeFault::ClockStep { node, by_ns } => HostToAgent::StepClock { node, by_ns },
            NodeFault::Drift { node, ppm } => HostToAgent::DriftClock { node, ppm },
        }
    }
}

impl FaultAction {
    /// What kind of fault this is, without its nodes and settings (e.g.
    /// `partition`, `cut`, `pause`, `fsync-error`): the alphabet of fault
    /// combinations a campaign scores as rare or common. `None` for an
    /// action that ends a fault (heal, resume, a node's clock or disk back
    /// to normal): the fault it ends was counted when it began.
    pub fn kind(&self) -> Option<&'static str> {
        Some(match self {
            FaultAction::Network(fault) => match fault {
                NetworkFault::Partition(_) => "partition",
                NetworkFault::Cut(_) => "cut",
                NetworkFault::Bridge => "bridge",
                NetworkFault::MajoritiesRing => "majorities-ring",
                NetworkFault::Slow {
                    latency: Some(_), ..
                } => "slow",
                NetworkFault::Loss { loss: Some(_), .. } => "loss",
                NetworkFault::Heal
                | NetworkFault::HealLinks(_)
                | NetworkFault::Slow { latency: None, .. }
                | NetworkFault::Loss { loss: None, .. } => return None,
            },
            FaultAction::Node(fault) => match fault {
                NodeFault::Pause { .. } => "pause",
                NodeFault::Kill { .. } => "kill",
                NodeFault::Restart { .. } => "restart",
                NodeFault::Crash { .. } => "crash",
                NodeFault::DiskFull { .. } => "disk-full",
                NodeFault::ClockStep { .. } => "clock",
                NodeFault::Drift { ppm: 0, .. } => return None,
                NodeFault::Drift { .. } => "drift",
                NodeFault::Resume { .. } | NodeFault::DiskFree { .. } => return None,
            },
            FaultAction::Disk(fault) => match fault {
                DiskFault::FsyncDelay { .. } => "fsync-delay",
                DiskFault::FsyncError { .. } => "fsync-error",
                DiskFault::FsyncOk { .. } => return None,
            },
        })
    }
}
