//! A path through the multiverse: how a moment of a campaign's tree is
//! reached from its root, as (virtual time, seed, faults) steps. Exit
//! indices are not part of it: they move when a fault is removed (while
//! shrinking), virtual times do not.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One branch: run to virtual time `at_ns`, re-key every seeded stream from
/// `seed` there, add `faults` (texts in the fault grammar, `at=+<d>` from
/// the branch point).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub at_ns: u64,
    pub seed: u64,
    pub faults: Vec<String>,
}

/// A fault of a stored path that cannot be replayed (the fault names
/// itself in its source).
#[derive(Debug, thiserror::Error)]
#[error("step {step} (the branch at {at})")]
pub struct PathFaultError {
    /// 1-based.
    pub step: usize,
    pub at: vmm::VirtNanos,
    #[source]
    pub source: Box<run::faults::FaultError>,
}

/// The steps from the root moment, and the virtual time the last one runs
/// to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Path {
    pub steps: Vec<Step>,
    pub end_ns: u64,
}

impl Path {
    /// This path and one more branch from its end, run for `slice_ns`.
    pub fn child(&self, seed: u64, faults: Vec<String>, slice_ns: u64) -> Path {
        let mut steps = self.steps.clone();
        steps.push(Step {
            at_ns: self.end_ns,
            seed,
            faults,
        });
        Path {
            steps,
            end_ns: self.end_ns.saturating_add(slice_ns),
        }
    }

    /// Every fault of the path, as (step index, fault index).
    pub fn fault_positions(&self) -> Vec<(usize, usize)> {
        self.steps
            .iter()
            .enumerate()
            .flat_map(|(s, step)| (0..step.faults.len()).map(move |f| (s, f)))
            .collect()
    }

    /// The same path with only the faults at `keep` (positions as
    /// [`Path::fault_positions`] gives them).
    pub fn with_faults(&self, keep: &[(usize, usize)]) -> Path {
        let mut path = self.clone();
        for (s, step) in path.steps.iter_mut().enumerate() {
            step.faults = step
                .faults
                .iter()
                .enumerate()
                .filter(|(f, _)| keep.contains(&(s, *f)))
                .map(|(_, text)| text.clone())
                .collect();
        }
        path
    }

    /// Checks that every fault of every step parses (`at=+` from the
    /// step's branch point) and names only `nodes` (the run's), so a path
    /// read from a file or a database is refused before any run replays
    /// it, naming the step and the fault.
    pub fn check_faults(&self, nodes: &[String]) -> Result<(), PathFaultError> {
        for (index, step) in self.steps.iter().enumerate() {
            for text in &step.faults {
                let error = |source| PathFaultError {
                    step: index + 1,
                    at: vmm::VirtNanos(step.at_ns),
                    source: Box::new(source),
                };
                let base = Some(vmm::VirtNanos(step.at_ns));
                for fault in run::faults::parse_fault_after(text, base).map_err(error)? {
                    fault.check_nodes(nodes).map_err(error)?;
                }
            }
        }
        Ok(())
    }

    pub fn fault_count(&self) -> usize {
        self.steps.iter().map(|s| s.faults.len()).sum()
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for step in &self.steps {
            write!(f, "@{} seed={}", vmm::VirtNanos(step.at_ns), step.seed)?;
            for fault in &step.faults {
                write!(f, " [{fault}]")?;
            }
            write!(f, "; ")?;
        }
        write!(f, "to {}", vmm::VirtNanos(self.end_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> Path {
        Path::default()
            .child(7, vec!["at=+1s pause n1 for=2s".into()], 5_000_000_000)
            .child(
                9,
                vec!["at=+0s cut n1 <-> n2".into(), "at=+2s heal".into()],
                5_000_000_000,
            )
    }

    #[test]
    fn test_a_child_branches_at_its_parent_s_end() {
        let p = path();
        assert_eq!(p.steps[0].at_ns, 0);
        assert_eq!(p.steps[1].at_ns, 5_000_000_000);
        assert_eq!(p.end_ns, 10_000_000_000);
        assert_eq!(p.fault_count(), 3);
    }

    #[test]
    fn test_a_path_round_trips_through_json() {
        let p = path();
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Path>(&text).unwrap(), p);
    }

    #[test]
    fn test_removing_faults_keeps_steps_and_times() {
        let p = path();
        let positions = p.fault_positions();
        assert_eq!(positions, vec![(0, 0), (1, 0), (1, 1)]);
        let q = p.with_faults(&[(1, 1)]);
        assert_eq!(q.steps.len(), 2);
        assert!(q.steps[0].faults.is_empty());
        assert_eq!(q.steps[1].faults, vec!["at=+2s heal".to_string()]);
        assert_eq!(q.end_ns, p.end_ns);
        assert_eq!(q.steps[1].seed, 9);
    }
}
