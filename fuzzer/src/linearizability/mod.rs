//! A linearizability checker for recorded key-value histories.
//!
//! A history is what the workload clients printed: one `detvisor_history`
//! event per invoke and completion, paired into [`Operation`]s
//! ([`parse_history_values`], [`parse_history_jsonl`]). It is linearizable if
//! every operation can be given one instant between its call and its return
//! at which it takes effect, so that the operations in that order, applied to
//! a register per key ([`model::KvModel`]), give exactly the outputs the
//! clients saw.
//!
//! # Why Wing–Gong–Lowe
//!
//! Deciding linearizability is NP-complete in general; what makes it fast in
//! practice is the search Porcupine and Knossos's successors use: Wing and
//! Gong's depth-first search over "which pending operation takes effect
//! next", on a linked list of calls and returns that makes the choices O(1)
//! to take and undo, with Lowe's memoization of (set of linearized
//! operations, model state) so that the many orders reaching the same
//! configuration are explored once ([`search`]). Histories are split by key
//! first (a history is linearizable iff each key's sub-history is: the
//! locality of linearizability), and the keys are checked in parallel.
//!
//! # Operations without a return
//!
//! An operation that timed out or failed ambiguously (`info`, or no
//! completion at all) may have taken effect at any point after its call, or
//! never. Without this rule a linearizable control reports false violations:
//! a write whose acknowledgement was lost is later read, or never read. The
//! search gives such an operation an infinite interval and succeeds once
//! every operation *with* a return is linearized, leaving the others out.
//! A `fail` completion means the operation did not happen: it is dropped.
//!
//! # On a violation
//!
//! The first illegal key's sub-history is shrunk to a minimal
//! non-linearizable one ([`minimize`]), usually two to four operations,
//! reported in [`CheckReport`] (serde, for the findings) and drawn as a
//! self-contained HTML timeline by [`render_html`].
//!
//! The checker is cross-checked against a brute-force enumeration of all
//! orders on thousands of random small histories (`brute` and the property
//! test in `tests`).

#[cfg(test)]
mod brute;
mod history;
mod html;
pub mod minimize;
pub mod model;
mod report;
pub mod search;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use history::{
    parse_history_jsonl, parse_history_values, History, HistoryError, HistoryProblem, KvInput,
    KvOutput, Operation, TimeNs, HISTORY_LINE_KEY,
};
pub use html::{escape as escape_html, render_html};
pub use report::{CheckReport, CheckStats, Verdict, Violation};
pub use search::Unknown;

use model::{KvModel, Model};
use search::{check_partition, Budget, Outcome, SearchStats};

/// Checks a key-value history, giving up (with [`Verdict::Unknown`]) after
/// `deadline` if one is given. On a violation, the first illegal key (in key
/// order) is minimized within what is left of the deadline.
pub fn check_kv(history: &History, deadline: Option<Duration>) -> CheckReport {
    check_kv_with(history, deadline, None)
}

/// [`check_kv`] with a cap on search steps per partition search as well.
pub fn check_kv_with(
    history: &History,
    deadline: Option<Duration>,
    max_steps: Option<u64>,
) -> CheckReport {
    let start = Instant::now();
    let deadline = deadline.map(|deadline| start + deadline);
    let model = KvModel;
    let ops = &history.operations;
    let partitions = model.partition(ops);
    let outcomes = check_partitions(&model, ops, &partitions, deadline, max_steps);
    let mut stats = CheckStats {
        operations: ops.len(),
        partitions: partitions.len(),
        ..CheckStats::default()
    };
    for (_, search) in &outcomes {
        stats.operations_searched += search.operations;
        stats.search_steps += search.steps;
        stats.cache_entries += search.cache_entries;
    }
    stats.search_us = micros(start.elapsed());

    let illegal = outcomes
        .iter()
        .position(|(outcome, _)| *outcome == Outcome::Illegal);
    let verdict = if let Some(index) = illegal {
        let minimizing = Instant::now();
        let partition = &partitions[index];
        let partition_ops: Vec<&Operation> = partition.ops.iter().map(|&i| &ops[i]).collect();
        let budget = Budget {
            deadline,
            max_steps,
            cancel: None,
        };
        let minimized = minimize::minimize(&model, &partition_ops, &budget);
        stats.minimization_checks = minimized.checks;
        stats.minimization_us = micros(minimizing.elapsed());
        Verdict::Illegal(Violation {
            key: partition.label.clone(),
            operations: minimized
                .kept
                .iter()
                .map(|&i| partition_ops[i].clone())
                .collect(),
            partition_operations: partition_ops.len(),
            minimal: minimized.complete,
        })
    } else if let Some((index, reason)) =
        outcomes
            .iter()
            .enumerate()
            .find_map(|(index, (outcome, _))| match outcome {
                Outcome::Unknown(reason) => Some((index, *reason)),
                _ => None,
            })
    {
        Verdict::Unknown {
            reason,
            key: partitions[index].label.clone(),
        }
    } else {
        Verdict::Ok
    };
    CheckReport { verdict, stats }
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Searches every partition, on as many threads as there are cores. When a
/// partition is found illegal, the searches of later partitions (in key
/// order) are cancelled, so which partition is reported does not depend on
/// thread timing.
fn check_partitions<M>(
    model: &M,
    ops: &[M::Op],
    partitions: &[model::Partition],
    deadline: Option<Instant>,
    max_steps: Option<u64>,
) -> Vec<(Outcome, SearchStats)>
where
    M: Model + Sync,
    M::Op: Sync,
{
    let cancelled: Vec<AtomicBool> = partitions.iter().map(|_| AtomicBool::new(false)).collect();
    let results: Mutex<Vec<(Outcome, SearchStats)>> =
        Mutex::new(vec![
            (Outcome::Linearizable, SearchStats::default());
            partitions.len()
        ]);
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(partitions.len())
        .max(1);
    let work = || loop {
        let index = next.fetch_add(1, Ordering::Relaxed);
        let Some(partition) = partitions.get(index) else {
            return;
        };
        let partition_ops: Vec<&M::Op> = partition.ops.iter().map(|&i| &ops[i]).collect();
        let budget = Budget {
            deadline,
            max_steps,
            cancel: Some(&cancelled[index]),
        };
        let result = check_partition(model, &partition_ops, &budget);
        if result.0 == Outcome::Illegal {
            for later in &cancelled[index + 1..] {
                later.store(true, Ordering::Relaxed);
            }
        }
        // A poisoned lock means another worker panicked; its panic is
        // re-raised by the scope, so this result no longer matters.
        if let Ok(mut results) = results.lock() {
            results[index] = result;
        }
    };
    if workers == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(work);
            }
        });
    }
    results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
