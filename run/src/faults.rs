//! The faults of a multi-node run: one type, [`Fault`], parsed from and
//! printed as the text users write (`--fault` strings, the manifest's
//! `faults` list, a campaign path's steps), in the `grammar` submodule only.
//!
//! Grammar, one fault per string, words separated by spaces:
//!
//! ```text
//! at=<time> partition <nodes> | <nodes> [| ...] [for=<duration>]
//! at=<time> partition <nodes> -> <nodes> [for=<duration>]   one way
//! at=<time> cut <nodes> <-> <nodes> [for=<duration>]         both ways, those links only
//! at=<time> bridge [for=<duration>]                          Jepsen's, over the run's nodes
//! at=<time> majorities-ring [for=<duration>]                 Jepsen's, over the run's nodes
//! at=<time> heal [<nodes> <-> <nodes> | <nodes> -> <nodes>]
//! at=<time> slow <node> latency=<d>[..<d>] [for=<duration>]  (slow <node> off ends it)
//! at=<time> loss <node> <probability> [for=<duration>]       (loss <node> off ends it)
//! at=<time> pause <node> [for=<duration>]
//! at=<time> resume <node>
//! at=<time> kill <node> [signal=<n>]          (default 9, SIGKILL)
//! at=<time> restart <node>
//! at=<time> crash <node>                      (kill -9; the disk loses unflushed writes)
//! at=<time> disk <node> fsync-delay=<d> | fsync-error | fsync-ok | full | free
//! at=<time> clock <node> <+|-><duration>      step the node's CLOCK_REALTIME
//! at=<time> drift <node> <+|-><n>ppm [for=<duration>]   its rate; for= back to 0ppm
//! ```
//!
//! The disk faults are in `disk` (this module's child).
//!
//! `<nodes>` is a comma-separated list of node names; nodes listed in no
//! group of a partition form one more group together. A time
//! ([`FaultTime`]) is a virtual time since boot (as `--until`), or, written
//! `at=+<duration>`, that long after a branch point: such a fault is taken
//! at a branch (`branch --fault`, a campaign's step, a request's) and
//! refused anywhere else. The network faults' words, text and switch form
//! are in the `network` submodule.
//!
//! `for=` makes a fault last: when it is scheduled ([`Fault::scheduled`],
//! [`schedule`]) it becomes two [`ScheduledFault`]s, the action written and
//! the one undoing it (heal, resume, `off`) that much later. A fault keeps
//! its `for=` until then, so it prints back as written and a campaign
//! removes it whole while shrinking.
//!
//! The kind of an action decides who carries it out:
//! [`FaultAction::Network`] actions go to the switch
//! ([`NetworkFault::to_switch`]), [`FaultAction::Node`] actions to the agent
//! ([`HostToAgent`](guest_agent::protocol::HostToAgent) from a
//! [`NodeFault`]). Serialized, a fault and an action are their text
//! (`"at=+2s pause n1 for=1s"`, `"partition n1 | n2,n3"`), a scheduled
//! fault `{"at": <ns>, "action": <text>}`.

mod action;
mod disk;
mod error;
mod grammar;
mod lanes;
mod network;
mod until;

pub use action::{FaultAction, NodeFault};
pub use disk::{DiskActionError, DiskFault};
pub use error::{ActionError, FaultError, FaultTextError, FaultTimeError};
pub use lanes::check_lanes;
pub use network::{LatencyRange, NetworkActionError, NetworkFault, NoPortError};
pub use until::{check_run_end, check_until};

use devices::VirtNanos;
use serde::{Deserialize, Serialize};

/// When a fault happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultTime {
    /// `at=10s`: a virtual time since boot.
    SinceBoot(VirtNanos),
    /// `at=+2s`: that long after the branch point the fault is added at.
    AfterBranch(VirtNanos),
}

/// A fault as written: an action at a time, lasting `for=` if it says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub at: FaultTime,
    pub action: FaultAction,
    /// `for=`: the action is undone that much later (see [`Fault::scheduled`]).
    pub lasting: Option<VirtNanos>,
}

/// One action at one virtual time since boot: what a run's schedule holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledFault {
    pub at: VirtNanos,
    pub action: FaultAction,
}

impl FaultTime {
    /// The virtual time since boot, a relative time counted from
    /// `branch_point` (`None`: there is none, and a relative time is
    /// refused). No later than [`crate::units::MAX_VIRTUAL_TIME`].
    pub fn since_boot(self, branch_point: Option<VirtNanos>) -> Result<VirtNanos, FaultTimeError> {
        let after = match self {
            FaultTime::SinceBoot(at) => return Ok(at),
            FaultTime::AfterBranch(after) => after,
        };
        let base = branch_point.ok_or(FaultTimeError::RelativeWithoutBase)?;
        let at = base
            .0
            .checked_add(after.0)
            .map(VirtNanos)
            .ok_or(FaultTimeError::Beyond { base, after })?;
        if at > crate::units::MAX_VIRTUAL_TIME {
            return Err(FaultTimeError::BeyondMax { base, after, at });
        }
        Ok(at)
    }
}

impl Fault {
    /// Refuses a fault naming a node not in `nodes`.
    pub fn check_nodes(&self, nodes: &[String]) -> Result<(), FaultError> {
        for name in self.action.nodes() {
            if !nodes.iter().any(|n| n == name) {
                return Err(FaultError::UnknownNode {
                    fault: Box::new(self.clone()),
                    name: name.to_owned(),
                    nodes: nodes.to_vec(),
                });
            }
        }
        Ok(())
    }

    /// When the action written happens, as [`FaultTime::since_boot`],
    /// an error naming the fault.
    pub fn since_boot(&self, branch_point: Option<VirtNanos>) -> Result<VirtNanos, FaultError> {
        self.at
            .since_boot(branch_point)
            .map_err(|source| FaultError::Time {
                fault: Box::new(self.clone()),
                source,
            })
    }

    /// The actions the fault schedules, a relative time counted from
    /// `branch_point`: the one written (its defaults written out, as a
    /// run records it) and, with `for=`, the one undoing it.
    pub fn scheduled(
        &self,
        branch_point: Option<VirtNanos>,
    ) -> Result<Vec<ScheduledFault>, FaultError> {
        let at = self.since_boot(branch_point)?;
        let mut faults = vec![ScheduledFault {
            at,
            action: self.action.explicit(),
        }];
        if let Some(lasting) = self.lasting {
            let undo = self.action.undo().ok_or_else(|| FaultError::NoUndo {
                text: self.to_string(),
            })?;
            faults.push(ScheduledFault {
                at: VirtNanos(at.0.saturating_add(lasting.0)),
                action: undo,
            });
        }
        Ok(faults)
    }
}

impl ScheduledFault {
    /// Refuses a fault naming a node not in `nodes`.
    pub fn check_nodes(&self, nodes: &[String]) -> Result<(), FaultError> {
        Fault::from(self.clone()).check_nodes(nodes)
    }
}

/// The fault that schedules just this action.
impl From<ScheduledFault> for Fault {
    fn from(fault: ScheduledFault) -> Self {
        Fault {
            at: FaultTime::SinceBoot(fault.at),
            action: fault.action,
            lasting: None,
        }
    }
}

/// Parses fault texts (`--fault`s, a manifest's list), each as [`Fault`]'s
/// `FromStr`.
pub fn parse_faults(texts: &[impl AsRef<str>]) -> Result<Vec<Fault>, FaultError> {
    texts.iter().map(|text| text.as_ref().parse()).collect()
}

/// One fault of a command line (`--fault`), its error the whole chain of
/// causes as one line: a flag parser shows a value's error without its
/// sources.
pub fn parse_fault_flag(text: &str) -> Result<Fault, String> {
    text.parse::<Fault>().map_err(|e| crate::chain(&e))
}

/// The schedule of a run from boot: every fault's actions ordered by time
/// (those at the same time keep the order given), node names checked
/// against `nodes`, no two faults overlapping on a lane. Relative times
/// are refused (there is no branch point).
pub fn schedule(faults: &[Fault], nodes: &[String]) -> Result<Vec<ScheduledFault>, FaultError> {
    let mut all = Vec::new();
    for fault in faults {
        fault.check_nodes(nodes)?;
        all.extend(fault.scheduled(None)?);
    }
    // A stable sort: same-time faults stay in the order given.
    all.sort_by_key(|f| f.at);
    check_lanes(&all)?;
    Ok(all)
}

#[cfg(test)]
mod network_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
