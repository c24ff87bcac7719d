//! A path through the multiverse: how a moment of a campaign's tree is
//! reached from its root, as (virtual time, seed, faults) steps. Exit
//! indices are not part of it: they move when a fault is removed (while
//! shrinking), virtual times do not.

use run::faults::{Fault, FaultError};
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;
use vmm::VirtNanos;

/// One branch: run to virtual time `at_ns`, re-key every seeded stream from
/// `seed` there, add `faults` (`at=+<d>` from the branch point; serialized
/// as their text).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub at_ns: VirtNanos,
    pub seed: u64,
    pub faults: Vec<Fault>,
}

/// A fault of a stored path that does not parse or cannot be replayed (the
/// fault names itself in its source).
#[derive(Debug, thiserror::Error)]
#[error("step {step} (the branch at {at})")]
pub struct PathFaultError {
    /// 1-based.
    pub step: usize,
    pub at: VirtNanos,
    #[source]
    pub source: Box<FaultError>,
}

/// Why a path's JSON is not a path.
#[derive(Debug, thiserror::Error)]
pub enum PathReadError {
    #[error(transparent)]
    Json(serde_json::Error),
    #[error(transparent)]
    Fault(PathFaultError),
}

/// The steps from the root moment, and the virtual time the last one runs
/// to. Read, a fault that does not parse is named with its step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Path {
    pub steps: Vec<Step>,
    pub end_ns: VirtNanos,
}

/// A [`Path`] as stored, its faults still text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredPath {
    steps: Vec<StoredStep>,
    end_ns: VirtNanos,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredStep {
    at_ns: VirtNanos,
    seed: u64,
    faults: Vec<String>,
}

impl TryFrom<StoredPath> for Path {
    type Error = PathFaultError;

    fn try_from(stored: StoredPath) -> Result<Self, PathFaultError> {
        let steps = stored
            .steps
            .into_iter()
            .enumerate()
            .map(|(index, step)| {
                let faults =
                    run::faults::parse_faults(&step.faults).map_err(|source| PathFaultError {
                        step: index + 1,
                        at: step.at_ns,
                        source: Box::new(source),
                    })?;
                Ok(Step {
                    at_ns: step.at_ns,
                    seed: step.seed,
                    faults,
                })
            })
            .collect::<Result<_, PathFaultError>>()?;
        Ok(Path {
            steps,
            end_ns: stored.end_ns,
        })
    }
}

impl<'de> Deserialize<'de> for Path {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Path::try_from(StoredPath::deserialize(deserializer)?)
            .map_err(|e| serde::de::Error::custom(run::chain(&e)))
    }
}

impl Path {
    /// A path as its JSON holds it, a fault that does not parse named
    /// with its step (a [`PathReadError::Fault`]).
    pub fn from_json(text: &str) -> Result<Path, PathReadError> {
        let stored: StoredPath = serde_json::from_str(text).map_err(PathReadError::Json)?;
        Path::try_from(stored).map_err(PathReadError::Fault)
    }

    /// This path and one more branch from its end, run for `slice_ns`.
    pub fn child(&self, seed: u64, faults: Vec<Fault>, slice_ns: VirtNanos) -> Path {
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
                .map(|(_, fault)| fault.clone())
                .collect();
        }
        path
    }

    /// The same path with only the steps at `keep` (indices into
    /// `steps`, in order): a step left out is a re-key (and faults) that
    /// does not happen, the step before it running on.
    pub fn with_steps(&self, keep: &[usize]) -> Path {
        Path {
            steps: self
                .steps
                .iter()
                .enumerate()
                .filter(|(s, _)| keep.contains(s))
                .map(|(_, step)| step.clone())
                .collect(),
            end_ns: self.end_ns,
        }
    }

    /// The same path run only to `end_ns`: the steps that branch before it,
    /// then to `end_ns` (a step at `end_ns` or later never changed
    /// anything before it).
    pub fn ending_at(&self, end_ns: VirtNanos) -> Path {
        Path {
            steps: self
                .steps
                .iter()
                .filter(|step| step.at_ns < end_ns)
                .cloned()
                .collect(),
            end_ns,
        }
    }

    /// The indices of the steps that add no fault (only re-key).
    pub fn steps_without_faults(&self) -> Vec<usize> {
        (0..self.steps.len())
            .filter(|&s| self.steps[s].faults.is_empty())
            .collect()
    }

    /// Checks that every fault of every step names only `nodes` (the
    /// run's) and has a time (`at=+` from the step's branch point), so a
    /// path read from a file or a database is refused before any run
    /// replays it, naming the step and the fault.
    pub fn check_faults(&self, nodes: &[String]) -> Result<(), PathFaultError> {
        for (index, step) in self.steps.iter().enumerate() {
            for fault in &step.faults {
                let error = |source| PathFaultError {
                    step: index + 1,
                    at: step.at_ns,
                    source: Box::new(source),
                };
                fault.check_nodes(nodes).map_err(error)?;
                fault.scheduled(Some(step.at_ns)).map_err(error)?;
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
            write!(f, "@{} seed={}", step.at_ns, step.seed)?;
            for fault in &step.faults {
                write!(f, " [{fault}]")?;
            }
            write!(f, "; ")?;
        }
        write!(f, "to {}", self.end_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults(texts: &[&str]) -> Vec<Fault> {
        run::faults::parse_faults(texts).unwrap()
    }

    fn path() -> Path {
        Path::default()
            .child(
                7,
                faults(&["at=+1s pause n1 for=2s"]),
                VirtNanos::from_secs(5),
            )
            .child(
                9,
                faults(&[
                    "at=+0s cut n1 <-> n2",
                    "at=+2s kill n2",
                    "at=+2.5s restart n2",
                ]),
                VirtNanos::from_secs(5),
            )
    }

    #[test]
    fn test_a_child_branches_at_its_parent_s_end() {
        let p = path();
        assert_eq!(p.steps[0].at_ns, VirtNanos::ZERO);
        assert_eq!(p.steps[1].at_ns, VirtNanos::from_secs(5));
        assert_eq!(p.end_ns, VirtNanos::from_secs(10));
        assert_eq!(p.fault_count(), 4);
    }

    #[test]
    fn test_a_path_round_trips_through_json() {
        let p = path();
        let text = serde_json::to_string(&p).unwrap();
        // As the build before typed faults wrote it: each fault its text,
        // a kill without the signal it was not written with.
        assert_eq!(
            text,
            r#"{"steps":[{"at_ns":0,"seed":7,"faults":["at=+1s pause n1 for=2s"]},{"at_ns":5000000000,"seed":9,"faults":["at=+0s cut n1 <-> n2","at=+2s kill n2","at=+2.5s restart n2"]}],"end_ns":10000000000}"#
        );
        assert_eq!(serde_json::from_str::<Path>(&text).unwrap(), p);
        assert_eq!(Path::from_json(&text).unwrap(), p);
        // A step alone, its time a bare number of nanoseconds as when it
        // was a `u64`.
        let step = r#"{"at_ns":5000000000,"seed":9,"faults":["at=+0s cut n1 <-> n2","at=+2s kill n2","at=+2.5s restart n2"]}"#;
        assert_eq!(serde_json::to_string(&p.steps[1]).unwrap(), step);
        assert_eq!(serde_json::from_str::<Step>(step).unwrap(), p.steps[1]);
    }

    #[test]
    fn test_a_fault_that_does_not_parse_is_named_with_its_step() {
        let text = r#"{"steps":[{"at_ns":0,"seed":7,"faults":[]},{"at_ns":1000000000,"seed":9,"faults":["at=+1s paws n1"]}],"end_ns":2000000000}"#;
        let message = serde_json::from_str::<Path>(text).unwrap_err().to_string();
        assert!(
            message.starts_with(
                "step 2 (the branch at 1s): fault \"at=+1s paws n1\": unknown action \"paws\""
            ),
            "{message}"
        );
        let Err(PathReadError::Fault(error)) = Path::from_json(text) else {
            panic!("a fault error");
        };
        assert_eq!((error.step, error.at), (2, VirtNanos::from_secs(1)));
        assert!(matches!(
            Path::from_json("{\"steps\": 3}"),
            Err(PathReadError::Json(_))
        ));
        let unknown = path().check_faults(&["n1".to_string()]).unwrap_err();
        assert_eq!(
            run::chain(&unknown),
            "step 2 (the branch at 5s): fault at=+0s cut n1 <-> n2: no node is named \"n2\" (nodes: n1)"
        );
    }

    #[test]
    fn test_removing_faults_keeps_steps_and_times() {
        let p = path();
        let positions = p.fault_positions();
        assert_eq!(positions, vec![(0, 0), (1, 0), (1, 1), (1, 2)]);
        let q = p.with_faults(&[(1, 1)]);
        assert_eq!(q.steps.len(), 2);
        assert!(q.steps[0].faults.is_empty());
        assert_eq!(q.steps[1].faults, faults(&["at=+2s kill n2"]));
        assert_eq!(q.end_ns, p.end_ns);
        assert_eq!(q.steps[1].seed, 9);
    }

    #[test]
    fn test_steps_left_out_and_an_earlier_end_keep_the_rest() {
        let p = path().child(11, Vec::new(), VirtNanos::from_secs(5));
        assert_eq!(p.steps_without_faults(), vec![2]);
        let q = p.with_steps(&[1, 2]);
        assert_eq!(q.steps, p.steps[1..].to_vec());
        assert_eq!(q.end_ns, p.end_ns);
        assert_eq!(p.with_steps(&[]).steps, Vec::new());
        // Ending at 10 s: the step at 10 s never ran before it.
        let r = p.ending_at(VirtNanos::from_secs(10));
        assert_eq!(r.steps, p.steps[..2].to_vec());
        assert_eq!(r.end_ns, VirtNanos::from_secs(10));
        let r = p.ending_at(VirtNanos::from_micros(5_001_000));
        assert_eq!(r.steps, p.steps[..2].to_vec());
        assert_eq!(p.ending_at(VirtNanos::ZERO).steps, Vec::new());
    }
}
