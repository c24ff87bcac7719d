//! Many alternate histories from one moment (`branch --seeds A..B`): each
//! seed is the same saved moment re-keyed, run to its end. Workers run on
//! threads of this process, one vCPU each, several at a time. Each worker
//! either restores the moment afresh for every seed, or (in place) restores
//! it once and returns to it in memory between seeds
//! (`Session::reset_to`: cost proportional to the pages the previous
//! history dirtied).

use crate::driven::{Driven, DrivenCheckpoint};
use crate::moment::Moment;
use crate::outcome::RunSummary;
use crate::snapshots::{restore, NodeOutput, SnapshotsError};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use vmm::record::RecordConfig;
use vmm::stall::StallTimeout;
use vmm::vm::ResumeConfig;
use vmm::VirtNanos;

/// The most seeds one request may ask for.
pub const MAX_SEEDS: u64 = 100_000;

/// Why a text is not a seed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeedRangeError {
    #[error("bad seed range {text:?}: {part:?} is not a number")]
    NotANumber { text: String, part: String },
    #[error("bad seed range {text:?}: it is empty")]
    Empty { text: String },
    #[error("seed range {text:?} has more than {MAX_SEEDS} seeds")]
    TooMany { text: String },
}

/// Why a worker could not reach the branch point.
#[derive(Debug, thiserror::Error)]
pub enum BranchPointError {
    #[error(transparent)]
    Restore(#[from] crate::snapshots::SnapshotsError),
    #[error("the guest stopped before the branch point: {stop:?}")]
    StoppedBefore { stop: vmm::exit::StopReason },
    /// Keeping the branch point as a checkpoint.
    #[error(transparent)]
    Driven(#[from] crate::driven::DrivenError),
}

/// An inclusive range of seeds: `1..64` (or `1..=64`), or one seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedRange {
    pub first: u64,
    pub last: u64,
}

impl SeedRange {
    pub fn seeds(&self) -> impl Iterator<Item = u64> {
        self.first..=self.last
    }

    pub fn len(&self) -> u64 {
        self.last - self.first + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

impl std::str::FromStr for SeedRange {
    type Err = SeedRangeError;

    fn from_str(text: &str) -> Result<Self, SeedRangeError> {
        let (first, last) = match text.split_once("..") {
            Some((a, b)) => (a.trim(), b.trim_start_matches('=').trim()),
            None => (text.trim(), text.trim()),
        };
        let number = |part: &str| -> Result<u64, SeedRangeError> {
            part.parse().map_err(|_| SeedRangeError::NotANumber {
                text: text.to_owned(),
                part: part.to_owned(),
            })
        };
        let (first, last) = (number(first)?, number(last)?);
        if last < first {
            return Err(SeedRangeError::Empty {
                text: text.to_owned(),
            });
        }
        if last - first >= MAX_SEEDS {
            return Err(SeedRangeError::TooMany {
                text: text.to_owned(),
            });
        }
        Ok(SeedRange { first, last })
    }
}

impl std::fmt::Display for SeedRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}..{}", self.first, self.last)
        }
    }
}

/// What `branch --seeds` asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedsRequest {
    /// The moment every branch starts from.
    pub moment: Moment,
    pub seeds: SeedRange,
    /// Workers at a time (0: one per core).
    pub jobs: usize,
    /// Stop each branch at this virtual time (absolute).
    pub until: Option<VirtNanos>,
    /// Restore once per worker and reset in memory between seeds.
    pub in_place: bool,
    /// Faults added at the branch point of every seed (see
    /// [`crate::branch::BranchRequest::faults`]).
    #[serde(default)]
    pub faults: Vec<crate::faults::Fault>,
    /// Wall time the guest may run without a VM exit before the run ends
    /// as stalled (host policy, not part of the history).
    #[serde(default)]
    pub stall_timeout: StallTimeout,
    /// Tell each seed's outcome as it ends, a line on the request's
    /// stderr ([`SeedDone::line`]; `branch --seeds` without `--quiet`).
    #[serde(default)]
    pub progress: bool,
}

/// One branch's outcome: the run's summary (the one representation of a
/// run's outcome), or why the branch could not run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BranchOutcome {
    Ran(Box<RunSummary>),
    Failed { seed: u64, error: String },
}

impl BranchOutcome {
    fn failed(seed: u64, error: String) -> Self {
        BranchOutcome::Failed { seed, error }
    }

    pub fn seed(&self) -> u64 {
        match self {
            BranchOutcome::Ran(summary) => summary.seed,
            BranchOutcome::Failed { seed, .. } => *seed,
        }
    }

    pub fn summary(&self) -> Option<&RunSummary> {
        match self {
            BranchOutcome::Ran(summary) => Some(summary),
            BranchOutcome::Failed { .. } => None,
        }
    }

    pub fn error(&self) -> Option<&str> {
        match self {
            BranchOutcome::Ran(_) => None,
            BranchOutcome::Failed { error, .. } => Some(error),
        }
    }
}

/// Every branch's outcome, in seed order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedsReport {
    /// The moment the branches started from (printed as its text).
    pub spec: Moment,
    pub jobs: usize,
    /// Branches with distinct digests: anything differed, even only the
    /// random bytes in memory.
    pub distinct_histories: usize,
    /// Branches whose control flow differed: distinct (exit count, exits by
    /// kind, virtual time at the end). Histories that differ only in data
    /// (other random bytes, the same steps) count once here.
    pub distinct_control_flows: usize,
    /// Branches that ended as stalled (neither a pass nor a failure).
    pub stalled: usize,
    pub failures: usize,
    pub branches: Vec<BranchOutcome>,
}

/// A seed's branch has ended: told as each ends (in the order they end,
/// which is not the seeds' with several workers).
#[derive(Clone, Copy, Debug)]
pub struct SeedDone<'a> {
    /// Branches ended so far, this one included, of `total`.
    pub done: u64,
    pub total: u64,
    pub outcome: &'a BranchOutcome,
    /// Wall time since the request started (host time: no part of any
    /// history), for the time left at this pace.
    pub elapsed: std::time::Duration,
}

impl SeedDone<'_> {
    /// The wall time the seeds left take at this request's pace so far.
    pub fn eta(&self) -> std::time::Duration {
        let left = self.total.saturating_sub(self.done);
        self.elapsed.mul_f64(left as f64 / self.done.max(1) as f64)
    }

    /// The line for people: the seed, how far the request has come (with
    /// the time left while seeds are), and the branch's outcome as
    /// `branch --seeds`' table says it.
    pub fn line(&self) -> String {
        let outcome = match self.outcome {
            BranchOutcome::Ran(summary) => format!(
                "{}{} at {}, {} exits, digest {:.12}",
                summary.stop_kind(),
                summary
                    .exit_status
                    .map(|status| format!(" (status {status})"))
                    .unwrap_or_default(),
                summary.virtual_ns,
                summary.exits,
                summary.digest
            ),
            BranchOutcome::Failed { error, .. } => format!("error: {error}"),
        };
        let eta = if self.done < self.total {
            format!(", ETA {}s", self.eta().as_secs())
        } else {
            String::new()
        };
        format!(
            "detvisor: seed {} ({}/{}{eta}): {outcome}",
            self.outcome.seed(),
            self.done,
            self.total
        )
    }
}

/// Restores the request's moment (replayed to its target) for one branch.
fn restore_branch_point(request: &SeedsRequest) -> Result<Driven, BranchPointError> {
    let resume = ResumeConfig {
        until: request.until,
        record: RecordConfig::default(),
        stall_timeout: request.stall_timeout,
        clock: None,
    };
    let restored = restore(
        &request.moment,
        &resume,
        Box::new(std::io::sink()),
        None,
        NodeOutput::discard(),
    )?;
    if let Some(stop) = restored.stopped_early {
        return Err(BranchPointError::StoppedBefore { stop });
    }
    Ok(restored.driven)
}

/// Re-keys `driven` with `seed`, adds the faults, and runs it to its end.
fn run_branch(driven: &mut Driven, seed: u64, faults: &[crate::faults::Fault]) -> BranchOutcome {
    let run = driven
        .rekey(seed)
        .and_then(|()| driven.add_faults(faults))
        .and_then(|()| driven.run_to_end())
        .and_then(|stop| {
            let exit_status = driven.exit_status(stop);
            Ok((exit_status, driven.outcome(stop)?))
        });
    match run {
        Ok((exit_status, run)) => BranchOutcome::Ran(Box::new(
            RunSummary::new(seed, &run).with_exit_status(exit_status),
        )),
        Err(e) => BranchOutcome::failed(seed, crate::chain(&e)),
    }
}

/// One worker that restores the moment afresh for each seed it takes.
fn fresh_worker(
    request: &SeedsRequest,
    next_seed: &dyn Fn() -> Option<u64>,
    done: &dyn Fn(BranchOutcome),
) {
    while let Some(seed) = next_seed() {
        done(match restore_branch_point(request) {
            Ok(mut driven) => run_branch(&mut driven, seed, &request.faults),
            Err(e) => BranchOutcome::failed(seed, crate::chain(&e)),
        });
    }
}

/// One in-place worker: restores the moment once, keeps it as a checkpoint, and
/// runs one seed after another from it, resetting in between.
fn in_place_worker(
    request: &SeedsRequest,
    next_seed: &dyn Fn() -> Option<u64>,
    done: &dyn Fn(BranchOutcome),
) {
    let Some(mut seed) = next_seed() else { return };
    let setup = || -> Result<(Driven, DrivenCheckpoint), BranchPointError> {
        let mut driven = restore_branch_point(request)?;
        let checkpoint = driven.checkpoint()?;
        Ok((driven, checkpoint))
    };
    let (mut driven, checkpoint) = match setup() {
        Ok(ready) => ready,
        Err(e) => {
            // Only this seed fails; seeds this worker would have taken go to
            // the others (or are reported as not run at the end).
            done(BranchOutcome::failed(seed, crate::chain(&e)));
            return;
        }
    };
    loop {
        done(run_branch(&mut driven, seed, &request.faults));
        if let Err(e) = driven.reset_to(&checkpoint) {
            // The next seed cannot start from the branch point here; this
            // worker stops, the others go on.
            if let Some(next) = next_seed() {
                done(BranchOutcome::failed(
                    next,
                    format!("resetting to the branch point: {}", crate::chain(&e)),
                ));
            }
            return;
        }
        let Some(next) = next_seed() else { return };
        seed = next;
    }
}

/// How many of `branches` differ in control flow (see
/// [`SeedsReport::distinct_control_flows`]).
fn distinct_control_flows(branches: &[BranchOutcome]) -> usize {
    let mut shapes: Vec<_> = branches
        .iter()
        .filter_map(BranchOutcome::summary)
        .map(|s| (s.exits, s.virtual_ns, &s.exits_by_kind))
        .collect();
    shapes.sort_unstable();
    shapes.dedup();
    shapes.len()
}

/// Runs every seed of `request` and reports them in seed order, telling
/// `progress` (on the calling thread) of each as it ends. A moment that
/// names no snapshot is one error, before any worker starts.
pub fn branch_seeds(
    request: &SeedsRequest,
    progress: &mut dyn FnMut(SeedDone<'_>),
) -> Result<SeedsReport, SnapshotsError> {
    crate::snapshots::resolve(&request.moment)?;
    let jobs = if request.jobs == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        request.jobs
    }
    .min(usize::try_from(request.seeds.len()).unwrap_or(usize::MAX));
    let queue = Mutex::new(request.seeds.seeds());
    let total = request.seeds.len();
    let started = std::time::Instant::now();
    let mut branches = Vec::new();
    std::thread::scope(|scope| {
        // Each worker sends its outcomes here; this thread keeps and tells
        // them until every worker has ended.
        let (sender, outcomes) = std::sync::mpsc::channel::<BranchOutcome>();
        for _ in 0..jobs {
            let (sender, queue) = (sender.clone(), &queue);
            scope.spawn(move || {
                let next_seed = || queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                let done = |outcome: BranchOutcome| {
                    let _ = sender.send(outcome);
                };
                if request.in_place {
                    in_place_worker(request, &next_seed, &done);
                } else {
                    fresh_worker(request, &next_seed, &done);
                }
            });
        }
        drop(sender);
        for outcome in outcomes {
            branches.push(outcome);
            progress(SeedDone {
                done: branches.len() as u64,
                total,
                outcome: branches.last().expect("just pushed"),
                elapsed: started.elapsed(),
            });
        }
    });
    // Seeds no worker got to (every worker stopped early).
    for seed in queue.into_inner().unwrap_or_else(|e| e.into_inner()) {
        branches.push(BranchOutcome::failed(
            seed,
            "not run: every worker stopped".into(),
        ));
    }
    branches.sort_by_key(BranchOutcome::seed);
    let failures = branches.iter().filter(|o| o.error().is_some()).count();
    let mut digests: Vec<&str> = branches
        .iter()
        .filter_map(|o| o.summary().map(|s| s.digest.as_str()))
        .collect();
    digests.sort_unstable();
    digests.dedup();
    let stalled = branches
        .iter()
        .filter(|o| o.summary().is_some_and(|s| s.stop_kind() == "stalled"))
        .count();
    Ok(SeedsReport {
        spec: request.moment.clone(),
        jobs,
        distinct_histories: digests.len(),
        distinct_control_flows: distinct_control_flows(&branches),
        stalled,
        failures,
        branches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_seed_range_inclusive_single_and_round_trip() {
        let range: SeedRange = "1..4".parse().unwrap();
        assert_eq!(range.seeds().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        assert_eq!(range.to_string().parse::<SeedRange>().unwrap(), range);
        let one: SeedRange = "7".parse().unwrap();
        assert_eq!(one.seeds().collect::<Vec<_>>(), vec![7]);
        assert_eq!(one.to_string(), "7");
        let inclusive: SeedRange = "1..=2".parse().unwrap();
        assert_eq!(inclusive.len(), 2);
        assert!("5..1".parse::<SeedRange>().is_err());
        assert!("a..b".parse::<SeedRange>().is_err());
        assert!("0..100000".parse::<SeedRange>().is_err());
    }

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let e = "a..3".parse::<SeedRange>().unwrap_err();
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "bad seed range \"a..3\": \"a\" is not a number"
        );
        // A failed branch's error is its whole chain, each cause once.
        let request = SeedsRequest {
            moment: "/nonexistent/detvisor-snaps@latest".parse().unwrap(),
            seeds: "1..2".parse().unwrap(),
            jobs: 1,
            until: None,
            in_place: false,
            faults: Vec::new(),
            stall_timeout: StallTimeout::default(),
            progress: false,
        };
        let e = restore_branch_point(&request).err().unwrap();
        let text = crate::chain(&e);
        assert_eq!(text, format!("{:#}", anyhow::Error::from(e)));
        assert!(
            text.starts_with("resolving \"/nonexistent/detvisor-snaps@latest\": "),
            "{text}"
        );
    }

    #[test]
    fn test_a_spec_naming_no_snapshot_is_one_error_before_any_worker() {
        let dir = tempfile::tempdir().unwrap();
        let request = SeedsRequest {
            moment: format!("{}@bad", dir.path().display()).parse().unwrap(),
            seeds: "1..8".parse().unwrap(),
            jobs: 4,
            until: None,
            in_place: false,
            faults: Vec::new(),
            stall_timeout: StallTimeout::default(),
            progress: false,
        };
        let e = branch_seeds(&request, &mut |_| panic!("no seed ran")).unwrap_err();
        assert!(format!("{:#}", anyhow::Error::from(e))
            .starts_with(&format!("resolving \"{}\"", request.moment)),);
    }

    #[test]
    fn test_control_flows_count_shapes_not_digests() {
        let ran = |seed: u64, exits: u64, virtual_ns: u64, digest: &str| {
            let mut summary: RunSummary = serde_json::from_value(serde_json::json!({
                "exit_status": 0, "stop": {"kind": "guest_exit", "status": 0},
                "seed": seed, "virtual_ns": virtual_ns, "exits": exits,
                "exits_by_kind": {"Hlt": exits}, "injected_interrupts": 0,
                "irq_windows_stepped": 0, "single_steps": 0, "wall_ms": 1,
                "wall_setup_ms": 0, "wall_finish_ms": 0, "exits_per_sec": 1,
                "digest": digest,
                "digest_parts": {"records": "", "memory": "", "devices": "", "console": ""},
                "console_bytes": 0, "unhandled_accesses": 0,
                "vmm_peak_rss_beyond_guest_kib": null, "cpu_model_version": 2
            }))
            .unwrap();
            summary.seed = seed;
            BranchOutcome::Ran(Box::new(summary))
        };
        let branches = [
            ran(1, 100, 5, "a"),
            ran(2, 100, 5, "b"),
            ran(3, 101, 5, "c"),
            ran(4, 100, 6, "d"),
            BranchOutcome::failed(5, "no".into()),
        ];
        assert_eq!(distinct_control_flows(&branches), 3);
    }

    #[test]
    fn test_a_seed_s_line_says_its_place_and_its_outcome() {
        let failed = BranchOutcome::failed(4, "resolving: no snapshots".into());
        let done = SeedDone {
            done: 2,
            total: 8,
            outcome: &failed,
            elapsed: std::time::Duration::from_secs(10),
        };
        // 6 seeds left at 5 s each.
        assert_eq!(done.eta(), std::time::Duration::from_secs(30));
        assert_eq!(
            done.line(),
            "detvisor: seed 4 (2/8, ETA 30s): error: resolving: no snapshots"
        );
        let summary: RunSummary = serde_json::from_value(serde_json::json!({
            "exit_status": 0, "stop": {"kind": "guest_exit", "status": 0},
            "seed": 7, "virtual_ns": 30_000_000_000u64, "exits": 1234,
            "exits_by_kind": {"Hlt": 1234}, "injected_interrupts": 0,
            "irq_windows_stepped": 0, "single_steps": 0, "wall_ms": 1,
            "wall_setup_ms": 0, "wall_finish_ms": 0, "exits_per_sec": 1,
            "digest": "0a1b2c3d4e5f6a7b8c9d",
            "digest_parts": {"records": "", "memory": "", "devices": "", "console": ""},
            "console_bytes": 0, "unhandled_accesses": 0,
            "vmm_peak_rss_beyond_guest_kib": null, "cpu_model_version": 2
        }))
        .unwrap();
        let ran = BranchOutcome::Ran(Box::new(summary));
        let done = SeedDone {
            done: 8,
            total: 8,
            outcome: &ran,
            elapsed: std::time::Duration::from_secs(40),
        };
        assert_eq!(
            done.line(),
            "detvisor: seed 7 (8/8): guest_exit (status 0) at 30s, 1234 exits, digest 0a1b2c3d4e5f"
        );
    }

    #[test]
    fn test_a_branch_is_its_run_summary_or_its_error_in_json() {
        let failed = BranchOutcome::failed(4, "resolving: no snapshots".into());
        let json = serde_json::to_value(&failed).unwrap();
        assert_eq!(json["seed"], 4);
        assert_eq!(json["error"], "resolving: no snapshots");
        assert_eq!(
            serde_json::from_value::<BranchOutcome>(json).unwrap(),
            failed
        );
        assert_eq!(failed.seed(), 4);
        assert!(failed.summary().is_none());
    }
}
