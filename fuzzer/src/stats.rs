//! Where a campaign's wall time went and how its tree was explored, for
//! reports: kept in the campaign's database under the metadata key
//! [`STATS_META`] (JSON), written with every branch and once more when the
//! campaign stops, and summed over the runs of a resumed campaign. A
//! campaign written before these were kept has none (a report says "not
//! recorded"); every field has a default, so one kept by an older build
//! reads.

use crate::spill::SpillStats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The metadata key the stats are kept under.
pub const STATS_META: &str = "stats";

/// Wall time of the campaign is counted in buckets of this many
/// milliseconds for [`CampaignStats::branches_by_minute`].
pub const BUCKET_MS: u64 = 60_000;

/// A campaign's counters, over all its runs (a resumed campaign's
/// included).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CampaignStats {
    /// The most workers any run of the campaign had.
    pub workers: u32,
    /// Wall time spent booting and running to the root (the workers boot
    /// at once: counted once per run).
    pub root_ms: u64,
    /// Wall time of the branches, summed over the workers that ran them
    /// (worker-milliseconds: reaching the parent, the slice, the digest).
    pub branch_ms: u64,
    /// Wall time spent shrinking new findings and writing them.
    pub shrink_ms: u64,
    /// Branches committed in each minute of the campaign's wall time (index
    /// `i`: from `i` to `i + 1` minutes).
    pub branches_by_minute: Vec<u64>,
    /// Branches run by each worker (index: the worker).
    pub branches_by_worker: Vec<u64>,
    /// Each finding's number and the campaign's wall time (ms) when it was
    /// committed.
    pub findings_at_ms: BTreeMap<u32, u64>,
    /// Checkpoints written to `spill/`, and the milliseconds that took.
    pub spilled: u64,
    pub spill_write_ms: u64,
    /// Checkpoints loaded back from `spill/`, and the milliseconds that took.
    pub loaded: u64,
    pub load_ms: u64,
    /// Steps replayed to reach a moment that was neither live nor spilled,
    /// and the milliseconds that took (worker-milliseconds).
    pub replayed_steps: u64,
    pub replay_ms: u64,
    /// Checkpoints the workers held in memory at the last commit.
    pub live_checkpoints: u64,
    /// Where [`branch_ms`](Self::branch_ms) and the engine's thread spent a
    /// branch: see [`BranchParts`]; summed over branches (and workers).
    pub restore_ms: u64,
    pub run_ms: u64,
    pub keep_ms: u64,
    pub judge_ms: u64,
    pub commit_ms: u64,
    /// Each finding's number and the campaign's wall time (ms) when the
    /// branch that found it was judged: before shrinking, which
    /// [`findings_at_ms`](Self::findings_at_ms) includes.
    pub found_at_ms: BTreeMap<u32, u64>,
}

/// The wall time of one branch in parts (milliseconds). A worker's part
/// (`restore`, `run`, `keep`) is its [`CampaignStats::branch_ms`]; the
/// engine's (`judge`, `commit`) follow on the campaign's thread, in branch
/// order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BranchParts {
    /// Going back to the parent's moment: a reset to its checkpoint, a load
    /// from `spill/`, or a replay of its path's steps from an ancestor.
    pub restore_ms: u64,
    /// The branch's own step (re-key, faults, the slice), taking its
    /// records and reading its digest.
    pub run_ms: u64,
    /// Keeping the new moment as a checkpoint (and letting older ones go,
    /// spilled to disk).
    pub keep_ms: u64,
    /// Judging the history of the whole path.
    pub judge_ms: u64,
    /// The branch's database transaction (shrinking a new finding is not
    /// in it: that is [`CampaignStats::shrink_ms`]).
    pub commit_ms: u64,
}

/// What the workers of one run counted so far (their totals in this run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerCounts {
    pub spill: SpillStats,
    pub replayed_steps: u64,
    pub replay_ms: u64,
    pub live_checkpoints: u64,
    /// Bytes the live checkpoints held (where a memory bound has them
    /// measured; 0 otherwise).
    pub checkpoint_bytes: u64,
}

impl std::ops::AddAssign for WorkerCounts {
    fn add_assign(&mut self, other: Self) {
        self.spill += other.spill;
        self.replayed_steps += other.replayed_steps;
        self.replay_ms += other.replay_ms;
        self.live_checkpoints += other.live_checkpoints;
        self.checkpoint_bytes += other.checkpoint_bytes;
    }
}

/// What going back to moments (to branch them) cost the workers of one
/// run of a campaign, against their time: the share a campaign's closing
/// summary prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoingBack {
    pub counts: WorkerCounts,
    /// The run's wall time times its workers.
    pub worker_ms: u64,
}

impl GoingBack {
    /// The part of the workers' time `ms` is, in percent (0 with no time).
    pub fn percent(&self, ms: u64) -> f64 {
        if self.worker_ms == 0 {
            return 0.0;
        }
        100.0 * ms as f64 / self.worker_ms as f64
    }

    /// One line: loads from `spill/`, writes to it and replays, each with
    /// its time and share.
    pub fn line(&self) -> String {
        let c = &self.counts;
        let part = |ms: u64| format!("{:.1} s, {:.1}%", ms as f64 / 1000.0, self.percent(ms));
        format!(
            "going back to moments: {} checkpoint load(s) from spill/ ({}), {} written to it ({}), {} step(s) replayed ({}) of {:.1} s of the workers' time; {} checkpoint(s) live at the end{}",
            c.spill.loaded,
            part(c.spill.load_ms),
            c.spill.written,
            part(c.spill.write_ms),
            c.replayed_steps,
            part(c.replay_ms),
            self.worker_ms as f64 / 1000.0,
            c.live_checkpoints,
            match c.checkpoint_bytes {
                0 => String::new(),
                bytes => format!(", holding {}", run::units::ByteSize(bytes)),
            }
        )
    }
}

impl CampaignStats {
    /// Counts a branch `worker` ran for `branch_ms`, committed when the
    /// campaign's wall time was `at_ms`.
    pub fn branch(&mut self, worker: usize, branch_ms: u64, at_ms: u64) {
        self.branch_ms += branch_ms;
        let minute = (at_ms / BUCKET_MS) as usize;
        if self.branches_by_minute.len() <= minute {
            self.branches_by_minute.resize(minute + 1, 0);
        }
        self.branches_by_minute[minute] += 1;
        if self.branches_by_worker.len() <= worker {
            self.branches_by_worker.resize(worker + 1, 0);
        }
        self.branches_by_worker[worker] += 1;
    }

    /// Adds a branch's parts (see [`BranchParts`]).
    pub fn branch_parts(&mut self, parts: BranchParts) {
        self.restore_ms += parts.restore_ms;
        self.run_ms += parts.run_ms;
        self.keep_ms += parts.keep_ms;
        self.judge_ms += parts.judge_ms;
        self.commit_ms += parts.commit_ms;
    }

    /// These stats (of the runs before this one) with this run's workers'
    /// counts added.
    pub fn with_counts(&self, counts: WorkerCounts) -> CampaignStats {
        let mut total = self.clone();
        total.spilled += counts.spill.written;
        total.spill_write_ms += counts.spill.write_ms;
        total.loaded += counts.spill.loaded;
        total.load_ms += counts.spill.load_ms;
        total.replayed_steps += counts.replayed_steps;
        total.replay_ms += counts.replay_ms;
        total.live_checkpoints = counts.live_checkpoints;
        total
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("stats serialize")
    }
}

impl crate::store::Store {
    /// The campaign's stats (`None`: a campaign written before they were
    /// kept, or whose root has not been committed yet).
    pub fn stats(&self) -> Result<Option<CampaignStats>, crate::store::StoreError> {
        self.meta_json(STATS_META)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_branches_are_bucketed_by_minute_and_worker() {
        let mut stats = CampaignStats::default();
        stats.branch(1, 500, 10);
        stats.branch(0, 700, 59_999);
        stats.branch(1, 300, 125_000);
        assert_eq!(stats.branches_by_minute, vec![2, 0, 1]);
        assert_eq!(stats.branches_by_worker, vec![1, 2]);
        assert_eq!(stats.branch_ms, 1500);
    }

    #[test]
    fn test_worker_counts_add_to_earlier_runs_and_live_is_the_latest() {
        let before = CampaignStats {
            spilled: 2,
            loaded: 1,
            replayed_steps: 5,
            live_checkpoints: 9,
            ..Default::default()
        };
        let counts = WorkerCounts {
            spill: SpillStats {
                written: 3,
                write_ms: 30,
                loaded: 4,
                load_ms: 40,
            },
            replayed_steps: 1,
            replay_ms: 7,
            live_checkpoints: 2,
            checkpoint_bytes: 0,
        };
        let total = before.with_counts(counts);
        assert_eq!(total.replay_ms, 7);
        assert_eq!(
            (total.spilled, total.loaded, total.replayed_steps),
            (5, 5, 6)
        );
        assert_eq!((total.spill_write_ms, total.load_ms), (30, 40));
        assert_eq!(total.live_checkpoints, 2);
    }

    /// The closing summary's line: each cost with its share of the
    /// workers' time.
    #[test]
    fn test_going_back_says_each_cost_and_its_share() {
        let going_back = GoingBack {
            counts: WorkerCounts {
                spill: SpillStats {
                    written: 3,
                    write_ms: 1_500,
                    loaded: 4,
                    load_ms: 12_000,
                },
                replayed_steps: 2,
                replay_ms: 6_000,
                live_checkpoints: 40,
                checkpoint_bytes: 3 << 30,
            },
            worker_ms: 120_000,
        };
        assert_eq!(going_back.percent(12_000), 10.0);
        assert_eq!(
            going_back.line(),
            "going back to moments: 4 checkpoint load(s) from spill/ (12.0 s, 10.0%), 3 written to it (1.5 s, 1.2%), 2 step(s) replayed (6.0 s, 5.0%) of 120.0 s of the workers' time; 40 checkpoint(s) live at the end, holding 3G"
        );
        assert_eq!(GoingBack::default().percent(5), 0.0);
    }

    /// A branch's parts add up over branches; the old JSON (without them)
    /// reads them as zero.
    #[test]
    fn test_branch_parts_add_up() {
        let mut stats = CampaignStats::default();
        let parts = BranchParts {
            restore_ms: 1,
            run_ms: 20,
            keep_ms: 3,
            judge_ms: 4,
            commit_ms: 5,
        };
        stats.branch_parts(parts);
        stats.branch_parts(BranchParts {
            run_ms: 10,
            ..parts
        });
        assert_eq!(
            (
                stats.restore_ms,
                stats.run_ms,
                stats.keep_ms,
                stats.judge_ms,
                stats.commit_ms
            ),
            (2, 30, 6, 8, 10)
        );
        let back: CampaignStats = serde_json::from_str(&stats.to_json()).unwrap();
        assert_eq!(back, stats);
        let old: CampaignStats = serde_json::from_str(r#"{"branch_ms": 7}"#).unwrap();
        assert_eq!((old.restore_ms, old.found_at_ms.len()), (0, 0));
    }

    /// Stats kept by an older build (fewer fields) read, the rest default.
    #[test]
    fn test_stats_with_missing_fields_read_with_defaults() {
        let stats: CampaignStats = serde_json::from_str(r#"{"root_ms": 5}"#).unwrap();
        assert_eq!(stats.root_ms, 5);
        assert_eq!(stats.branches_by_minute, Vec::<u64>::new());
        let back: CampaignStats = serde_json::from_str(&stats.to_json()).unwrap();
        assert_eq!(back, stats);
    }
}
