//! What a check found, as the campaign's findings store it (JSON).

use serde::{Deserialize, Serialize};

use super::history::Operation;
use super::search::Unknown;

/// The result of [`super::check_kv`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    pub verdict: Verdict,
    pub stats: CheckStats,
}

/// Whether the history is linearizable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Verdict {
    /// Every partition has a linearization.
    Ok,
    /// A partition has none.
    Illegal(Violation),
    /// No partition is known illegal, but one was not decided.
    Unknown {
        reason: Unknown,
        /// The first undecided partition's key.
        key: String,
    },
}

/// A non-linearizable partition, shrunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// The partition's key (the first illegal one in key order).
    pub key: String,
    /// A minimal non-linearizable sub-history of the partition, in invoke
    /// order.
    pub operations: Vec<Operation>,
    /// How many operations the partition had.
    pub partition_operations: usize,
    /// False if the deadline cut the minimization short (`operations` is
    /// then non-linearizable but maybe not minimal).
    pub minimal: bool,
}

/// What the check cost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckStats {
    /// Operations in the history (failed ones are not operations).
    pub operations: usize,
    pub partitions: usize,
    /// Operations searched, after leaving out those that constrain nothing.
    pub operations_searched: usize,
    /// Iterations of the search loop, over all partitions.
    pub search_steps: u64,
    /// Memoized (linearized set, state) pairs, over all partitions.
    pub cache_entries: usize,
    /// Sub-histories checked while minimizing a violation.
    pub minimization_checks: usize,
    /// Wall-clock time of the search, in microseconds.
    pub search_us: u64,
    /// Wall-clock time of the minimization, in microseconds.
    pub minimization_us: u64,
}
