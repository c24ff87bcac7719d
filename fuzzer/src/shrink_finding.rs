//! A new finding's path made small before it is written, every trial
//! replayed from the root checkpoint:
//!
//! 1. its faults, by ddmin ([`crate::shrink`]): the fewest the failure
//!    still needs;
//! 2. its steps: those after the failure moment are dropped (they never ran
//!    before it), then those that add no fault (a re-key only) by ddmin: a
//!    step left out is a re-key that does not happen, the step before it
//!    running on;
//! 3. its end: the path ends at the failure moment of what is left (the
//!    earliest end at which it still fails), when a replay to there shows
//!    the failure again.
//!
//! So a finding without faults still says something: its minimal path, the
//! fewest steps and the earliest failure moment that still fail.
//!
//! The trials of one ddmin round are independent: they run on every worker
//! at once, in batches of the number of workers, and ddmin moves on from the
//! first failing trial in the sequential order, so the path written is the
//! same whatever the number of workers ([`crate::shrink::ddmin_batched`]).
//! The judge looks at each batch's histories afterwards, in that order, on
//! the calling thread.

use crate::failure::FailureKey;
use crate::failure_moment;
use crate::judge::{Failure, Judge};
use crate::shrink::{ddmin_batched, Reduction};
use crate::step::Path as StepPath;
use crate::worker::{Worker, WorkerError};
use run::api::Position;
use run::records::GuestRecord;
use serde::{Deserialize, Serialize};
use std::time::Instant;
use vmm::VirtNanos;

/// Trials of ddmin over a found path's faults.
pub const MAX_FAULT_TRIALS: usize = 48;
/// Trials of ddmin over its steps without faults.
pub const MAX_STEP_TRIALS: usize = 16;

/// How a finding's path was shrunk, as `finding.json` keeps it (findings
/// written before steps and ends were shrunk have none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shrinking {
    /// Trials of ddmin over the found path's faults, as one worker runs
    /// them (the same whatever the number of workers).
    pub fault_trials: u32,
    /// Trials of ddmin over the steps that add no fault.
    pub step_trials: u32,
    /// The path ends at its failure moment: a replay to there failed again
    /// (`false`: its end is the found path's).
    pub ends_at_failure: bool,
}

/// What shrinking cost in this process (the campaign's closing summary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShrinkStats {
    /// Findings shrunk.
    pub findings: u32,
    /// Replays from the root run (trials of a batch after its first failing
    /// one included).
    pub replays: u64,
    /// Wall time spent shrinking.
    pub wall_ms: u64,
}

impl std::ops::AddAssign for ShrinkStats {
    fn add_assign(&mut self, other: ShrinkStats) {
        self.findings += other.findings;
        self.replays += other.replays;
        self.wall_ms += other.wall_ms;
    }
}

/// A replay of a shrinking trial failed (the others of its batch that
/// failed too are named, not lost).
#[derive(Debug, thiserror::Error)]
#[error(
    "shrinking the finding: a replay on worker {worker}{}",
    others_text(others)
)]
pub struct ShrinkError {
    pub worker: usize,
    #[source]
    pub source: WorkerError,
    /// The other failed replays of the same batch: (worker, error chain).
    pub others: Vec<(usize, String)>,
}

fn others_text(others: &[(usize, String)]) -> String {
    others
        .iter()
        .map(|(worker, chain)| format!(" (and on worker {worker}: {chain})"))
        .collect()
}

/// A finding's path as shrunk, replayed once more: where it ended, its
/// digest there and the failure as that replay shows it.
pub(crate) struct Shrunk {
    pub path: StepPath,
    /// The records of the path's steps (the root's stretch not included).
    pub records: Vec<GuestRecord>,
    pub position: Position,
    pub digest: String,
    /// `None` when the shrunk path did not fail again, and `path` is the
    /// found one after all.
    pub failure: Option<Failure>,
    pub shrinking: Shrinking,
    pub stats: ShrinkStats,
}

/// Runs trials on the workers and judges them.
struct Trials<'w, 'a> {
    workers: &'w mut [Worker<'a>],
    judge: &'w dyn Judge,
    root_records: &'w [GuestRecord],
    key: &'w FailureKey,
    replays: u64,
    /// The last trial that failed: its path and records.
    last_failing: Option<(StepPath, Vec<GuestRecord>)>,
}

impl Trials<'_, '_> {
    fn width(&self) -> usize {
        self.workers.len()
    }

    /// Whether `records` (a path's, after the root's) fail with the key.
    fn fails(&self, records: &[GuestRecord]) -> bool {
        self.judge
            .check(&[self.root_records, records])
            .iter()
            .any(|f| &f.key == self.key)
    }

    /// Replays `paths` (at most one per worker) at once, worker `i` the
    /// `i`th; the first (in order) whose history fails with the key. Every
    /// replay's error is kept.
    fn first_failing(&mut self, paths: &[StepPath]) -> Result<Option<usize>, ShrinkError> {
        let results = replay_all(self.workers, paths);
        self.replays += paths.len() as u64;
        let mut errors = results
            .iter()
            .enumerate()
            .filter_map(|(w, r)| r.as_ref().err().map(|e| (w, run::chain(e))));
        if let Some((worker, _)) = errors.next() {
            let others = errors.collect();
            let source = results
                .into_iter()
                .nth(worker)
                .and_then(Result::err)
                .expect("the error just seen");
            return Err(ShrinkError {
                worker,
                source,
                others,
            });
        }
        for (i, result) in results.into_iter().enumerate() {
            let records = result.expect("errors were returned above");
            if self.fails(&records) {
                self.last_failing = Some((paths[i].clone(), records));
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// ddmin over `items`, each subset tried as the path `trial` makes of
    /// it.
    fn ddmin<T: Clone>(
        &mut self,
        items: &[T],
        max_trials: usize,
        trial: impl Fn(&[T]) -> StepPath,
    ) -> Result<Reduction<T>, ShrinkError> {
        let width = self.width();
        ddmin_batched(items, max_trials, width, |batch| {
            let paths: Vec<StepPath> = batch.iter().map(|subset| trial(subset)).collect();
            self.first_failing(&paths)
        })
    }

    /// The records of `path`: from the last failing trial when it was this
    /// path, else replayed (on worker 0).
    fn records_of(&mut self, path: &StepPath) -> Result<Vec<GuestRecord>, ShrinkError> {
        if let Some((tried, records)) = &self.last_failing {
            if tried == path {
                return Ok(records.clone());
            }
        }
        self.replays += 1;
        self.workers[0]
            .replay_from_root(path)
            .map(|(records, _)| records)
            .map_err(|source| ShrinkError {
                worker: 0,
                source,
                others: Vec::new(),
            })
    }

    /// The virtual time of the failure moment of `records` (a path's),
    /// `None` when no prefix of them shows it.
    fn failure_ns(&self, records: &[GuestRecord]) -> Option<VirtNanos> {
        let mut all = self.root_records.to_vec();
        all.extend_from_slice(records);
        failure_moment::find(&all, self.judge, self.key).map(|m| m.virtual_ns)
    }

    /// Replays `path` on worker 0 to its end: its records, position, digest
    /// and the failure with the key, if it shows.
    fn last_replay(&mut self, path: &StepPath) -> Result<Replayed, ShrinkError> {
        self.replays += 1;
        let worker = &mut self.workers[0];
        let error = |source| ShrinkError {
            worker: 0,
            source,
            others: Vec::new(),
        };
        let (records, position) = worker.replay_from_root(path).map_err(error)?;
        let digest = worker.digest().map_err(error)?;
        let failure = self
            .judge
            .check(&[self.root_records, &records])
            .into_iter()
            .find(|f| &f.key == self.key);
        Ok(Replayed {
            records,
            position,
            digest,
            failure,
        })
    }
}

struct Replayed {
    records: Vec<GuestRecord>,
    position: Position,
    digest: String,
    failure: Option<Failure>,
}

/// Replays each of `paths` from the root on its own worker, at once.
fn replay_all(
    workers: &mut [Worker<'_>],
    paths: &[StepPath],
) -> Vec<Result<Vec<GuestRecord>, WorkerError>> {
    assert!(paths.len() <= workers.len(), "a batch per worker at most");
    let replay =
        |worker: &mut Worker<'_>, path| worker.replay_from_root(path).map(|(records, _)| records);
    if let [path] = paths {
        return vec![replay(&mut workers[0], path)];
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .iter_mut()
            .zip(paths)
            .map(|(worker, path)| s.spawn(move || replay(worker, path)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker panicked"))
            .collect()
    })
}

/// Shrinks `found` (a path from the root whose history, after the root's
/// `root_records`, fails with `key`) on `workers`, and replays the result
/// once more on worker 0 (which is left at its end). `root_end` is the
/// root moment's virtual time: no path ends before it.
pub(crate) fn shrink(
    workers: &mut [Worker<'_>],
    judge: &dyn Judge,
    root_records: &[GuestRecord],
    root_end: VirtNanos,
    found: &StepPath,
    key: &FailureKey,
) -> Result<Shrunk, ShrinkError> {
    let started = Instant::now();
    let mut trials = Trials {
        workers,
        judge,
        root_records,
        key,
        replays: 0,
        last_failing: None,
    };
    let mut shrinking = Shrinking::default();
    // 1. Faults.
    let faults = trials.ddmin(&found.fault_positions(), MAX_FAULT_TRIALS, |keep| {
        found.with_faults(keep)
    })?;
    shrinking.fault_trials = faults.trials as u32;
    let fewer_faults = found.with_faults(&faults.kept);
    let records = trials.records_of(&fewer_faults)?;
    let mut path = fewer_faults.clone();
    if trials.fails(&records) {
        // 2. Steps: none after the failure moment, then the fewest re-keys.
        let failure_ns = trials.failure_ns(&records).unwrap_or(path.end_ns);
        let before = path.ending_at(failure_ns.max(root_end));
        let cut = StepPath {
            end_ns: path.end_ns,
            ..before
        };
        let with_faults: Vec<usize> = (0..cut.steps.len())
            .filter(|&s| !cut.steps[s].faults.is_empty())
            .collect();
        let steps = trials.ddmin(&cut.steps_without_faults(), MAX_STEP_TRIALS, |keep| {
            let mut kept: Vec<usize> = with_faults.iter().chain(keep).copied().collect();
            kept.sort_unstable();
            cut.with_steps(&kept)
        })?;
        shrinking.step_trials = steps.trials as u32;
        let mut kept: Vec<usize> = with_faults.iter().chain(&steps.kept).copied().collect();
        kept.sort_unstable();
        let fewer_steps = cut.with_steps(&kept);
        let records = trials.records_of(&fewer_steps)?;
        if trials.fails(&records) {
            path = fewer_steps;
            // 3. The end: the failure moment of what is left.
            if let Some(failure_ns) = trials.failure_ns(&records) {
                let end = failure_ns.max(root_end);
                if end < path.end_ns {
                    let earlier = path.ending_at(end);
                    let replayed = trials.last_replay(&earlier)?;
                    if replayed.failure.is_some() {
                        shrinking.ends_at_failure = true;
                        return Ok(finish(trials, earlier, replayed, shrinking, started));
                    }
                }
            }
        } else {
            path = fewer_faults;
        }
    }
    let mut replayed = trials.last_replay(&path)?;
    if replayed.failure.is_none() {
        // Shrinking must keep the failure; if the replay disagrees, the
        // path as found.
        path = found.clone();
        replayed = trials.last_replay(&path)?;
        replayed.failure = None;
    }
    Ok(finish(trials, path, replayed, shrinking, started))
}

fn finish(
    trials: Trials<'_, '_>,
    path: StepPath,
    replayed: Replayed,
    shrinking: Shrinking,
    started: Instant,
) -> Shrunk {
    Shrunk {
        path,
        records: replayed.records,
        position: replayed.position,
        digest: replayed.digest,
        failure: replayed.failure,
        shrinking,
        stats: ShrinkStats {
            findings: 1,
            replays: trials.replays,
            wall_ms: started.elapsed().as_millis() as u64,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::FindingLine;
    use crate::findings::FindingFile;

    /// A finding.json written before steps and ends were shrunk (the stale
    /// read of tests/campaign.rs, its details cut short) loads, without
    /// `shrinking`, and is listed as before; written back, it is unchanged.
    #[test]
    fn test_a_finding_written_before_steps_were_shrunk_still_loads() {
        let text = include_str!("testdata/finding_before_shrinking_steps.json");
        let file: FindingFile = serde_json::from_str(text).unwrap();
        assert_eq!(file.shrinking, None);
        assert_eq!(
            (file.path.fault_count(), file.found_path.fault_count()),
            (2, 3)
        );
        let json = serde_json::to_value(&file).unwrap();
        let original: serde_json::Value = serde_json::from_str(text).unwrap();
        assert_eq!(json, original);
        let line = FindingLine::of_file("/c/findings/0001".into(), file.clone());
        assert_eq!(
            line.shrunk(),
            "2 faults after shrinking from 3; ends at 4.5000316s"
        );
        // With its shrinking: the field as it is written, and back.
        let shrinking = Shrinking {
            fault_trials: 9,
            step_trials: 0,
            ends_at_failure: true,
        };
        let file = FindingFile {
            shrinking: Some(shrinking),
            ..file
        };
        let json = serde_json::to_value(&file).unwrap();
        assert_eq!(
            json["shrinking"],
            serde_json::json!({"fault_trials": 9, "step_trials": 0, "ends_at_failure": true})
        );
        assert_eq!(serde_json::from_value::<FindingFile>(json).unwrap(), file);
    }
}
