//! Lanes: what a fault takes while it lasts (the network's topology, a
//! node's processes, its disk's FLUSH mode or fill, its clock's drift, its
//! links' latency or loss). Two faults of one lane never overlap, since one
//! would undo the other early: a `heal` heals every partition, a `resume`
//! ends every pause, a `restart` ends a pause too, and a `kill` during a
//! pause is carried out as an agent event only. The campaign's fault
//! profile draws by the same rule; faults written by hand (a manifest's,
//! `up --fault`, `branch --fault`) are refused by it, naming both.
//!
//! A fault that begins something (a partition, a pause, a kill, ...) takes
//! its lanes until the fault that ends it (heal, resume, restart, `off`,
//! `free`, `fsync-ok`, `0ppm`; `for=` writes that one), or to the end of
//! the run. A clock step takes none.

use super::{DiskFault, FaultAction, FaultError, NetworkFault, NodeFault, ScheduledFault};
use std::collections::BTreeMap;

/// What an action does to a lane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// Takes it until an `End` of the same kind.
    Begin,
    /// Ends what a `Begin` of the lane took (nothing if it is free).
    End,
    /// Frees the lane if a crash took it, and leaves it as it is otherwise
    /// (a `restart` remounts a crashed node's disk, and leaves a full one
    /// full).
    Remount,
}

/// The lanes `action` takes or frees, and how.
fn lanes(action: &FaultAction) -> Vec<(String, Effect)> {
    use Effect::{Begin, End, Remount};
    let on = |kind: &str, node: &str| format!("{kind} {node}");
    match action {
        FaultAction::Network(fault) => match fault {
            NetworkFault::Partition(_)
            | NetworkFault::Cut(_)
            | NetworkFault::Bridge
            | NetworkFault::MajoritiesRing => vec![("the network".into(), Begin)],
            NetworkFault::Heal | NetworkFault::HealLinks(_) => vec![("the network".into(), End)],
            NetworkFault::Slow { node, latency } => {
                let effect = if latency.is_some() { Begin } else { End };
                vec![(on("the latency of", node), effect)]
            }
            NetworkFault::Loss { node, loss } => {
                let effect = if loss.is_some() { Begin } else { End };
                vec![(on("the loss of", node), effect)]
            }
        },
        FaultAction::Node(fault) => {
            let node = fault.node();
            let processes = on("the processes of", node);
            let fill = on("the disk fill of", node);
            match fault {
                NodeFault::Pause { .. } | NodeFault::Kill { .. } => vec![(processes, Begin)],
                NodeFault::Resume { .. } => vec![(processes, End)],
                // A crash unmounts the disk: no fill across it.
                NodeFault::Crash { .. } => vec![(processes, Begin), (fill, Begin)],
                NodeFault::Restart { .. } => vec![(processes, End), (fill, Remount)],
                NodeFault::DiskFull { .. } => vec![(fill, Begin)],
                NodeFault::DiskFree { .. } => vec![(fill, End)],
                NodeFault::Drift { ppm: 0, .. } => vec![(on("the drift of", node), End)],
                NodeFault::Drift { .. } => vec![(on("the drift of", node), Begin)],
                NodeFault::ClockStep { .. } => Vec::new(),
            }
        }
        FaultAction::Disk(fault) => {
            let lane = on("the disk flush of", fault.node());
            match fault {
                DiskFault::FsyncDelay { .. } | DiskFault::FsyncError { .. } => {
                    vec![(lane, Begin)]
                }
                DiskFault::FsyncOk { .. } => vec![(lane, End)],
            }
        }
    }
}

/// Whether `end` ends what `begin` began on a lane (a `restart` ends a
/// kill or a crash, not a pause; a `resume` a pause, not a kill).
fn ends(begin: &FaultAction, end: &FaultAction) -> bool {
    match (begin, end) {
        (FaultAction::Node(b), FaultAction::Node(e)) => matches!(
            (b, e),
            (NodeFault::Pause { .. }, NodeFault::Resume { .. })
                | (
                    NodeFault::Kill { .. } | NodeFault::Crash { .. },
                    NodeFault::Restart { .. }
                )
                | (NodeFault::DiskFull { .. }, NodeFault::DiskFree { .. })
                | (NodeFault::Drift { .. }, NodeFault::Drift { .. })
        ),
        _ => true,
    }
}

/// Refuses two faults of `faults` (in time order, as [`super::schedule`]
/// gives them) that overlap on one lane, naming both and the lane.
pub fn check_lanes(faults: &[ScheduledFault]) -> Result<(), FaultError> {
    let mut taken: BTreeMap<String, &ScheduledFault> = BTreeMap::new();
    for fault in faults {
        for (lane, effect) in lanes(&fault.action) {
            let overlap = |first: &ScheduledFault| FaultError::Overlap {
                first: Box::new(first.clone()),
                second: Box::new(fault.clone()),
                lane: lane.clone(),
            };
            match (effect, taken.get(&lane)) {
                (Effect::Begin, Some(first)) => return Err(overlap(first)),
                (Effect::Begin, None) => {
                    taken.insert(lane, fault);
                }
                (Effect::End, Some(first)) if !ends(&first.action, &fault.action) => {
                    return Err(overlap(first));
                }
                (Effect::End, _) => {
                    taken.remove(&lane);
                }
                (Effect::Remount, Some(first))
                    if matches!(first.action, FaultAction::Node(NodeFault::Crash { .. })) =>
                {
                    taken.remove(&lane);
                }
                (Effect::Remount, _) => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::faults::{parse_faults, schedule, FaultError};

    fn scheduled(texts: &[&str]) -> Result<(), FaultError> {
        let nodes = ["n1".to_string(), "n2".into(), "n3".into()];
        schedule(&parse_faults(texts)?, &nodes).map(drop)
    }

    /// The overlaps the issue names (a pause inside a pause, a kill during
    /// a pause, a restart that would end a pause) and their kin: refused,
    /// naming both faults and the lane.
    #[test]
    fn test_faults_that_overlap_on_a_lane_are_refused_naming_both() {
        let cases: [(&[&str], &str, &str, &str); 7] = [
            (
                &["at=1s pause n1 for=10s", "at=2s pause n1 for=1s"],
                "at=1s pause n1",
                "at=2s pause n1",
                "the processes of n1",
            ),
            (
                &["at=1s pause n1 for=10s", "at=2s kill n1"],
                "at=1s pause n1",
                "at=2s kill n1 signal=9",
                "the processes of n1",
            ),
            (
                &["at=1s pause n1 for=10s", "at=2s restart n1"],
                "at=1s pause n1",
                "at=2s restart n1",
                "the processes of n1",
            ),
            (
                &["at=1s partition n1 | n2 for=5s", "at=2s cut n1 <-> n3"],
                "at=1s partition n1 | n2",
                "at=2s cut n1 <-> n3",
                "the network",
            ),
            (
                &["at=1s disk n1 full for=5s", "at=2s crash n1"],
                "at=1s disk n1 full",
                "at=2s crash n1",
                "the disk fill of n1",
            ),
            (
                &["at=1s drift n2 +100ppm for=5s", "at=3s drift n2 -50ppm"],
                "at=1s drift n2 +100ppm",
                "at=3s drift n2 -50ppm",
                "the drift of n2",
            ),
            (
                &[
                    "at=1s slow n3 latency=5ms for=5s",
                    "at=2s slow n3 latency=1ms",
                ],
                "at=1s slow n3 latency=5ms",
                "at=2s slow n3 latency=1ms",
                "the latency of n3",
            ),
        ];
        for (texts, first, second, lane) in cases {
            let error = scheduled(texts).expect_err("refused");
            let message = error.to_string();
            assert!(matches!(error, FaultError::Overlap { .. }), "{message}");
            assert!(
                message.contains(first) && message.contains(second) && message.contains(lane),
                "{texts:?}: {message}"
            );
        }
    }

    /// Faults one after the other on a lane, on other lanes, or ended by
    /// the fault that undoes them, pass; so do clock steps anywhere.
    #[test]
    fn test_faults_that_follow_each_other_or_take_other_lanes_pass() {
        let fine: [&[&str]; 6] = [
            &["at=1s pause n1 for=1s", "at=2s pause n1 for=1s"],
            &[
                "at=1s pause n1 for=5s",
                "at=2s pause n2 for=1s",
                "at=3s kill n3",
            ],
            &["at=1s kill n1", "at=2s restart n1", "at=3s pause n1 for=1s"],
            &["at=1s crash n1", "at=2s restart n1", "at=3s disk n1 full"],
            &[
                "at=1s partition n1 | n2",
                "at=2s heal",
                "at=3s bridge for=1s",
            ],
            &[
                "at=1s pause n1 for=5s",
                "at=2s clock n1 +1s",
                "at=2s drift n1 +5ppm",
            ],
        ];
        for texts in fine {
            scheduled(texts).unwrap_or_else(|e| panic!("{texts:?}: {e}"));
        }
    }
}
