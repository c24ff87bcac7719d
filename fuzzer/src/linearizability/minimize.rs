//! Shrinking a non-linearizable partition to a minimal non-linearizable
//! sub-history: operations are dropped while what remains is still
//! non-linearizable, until dropping any single remaining one would make it
//! linearizable (1-minimal, as delta debugging defines it).
//!
//! First the shortest illegal prefix by call time is found by bisection
//! (keeping "the upper end is illegal" as the invariant, which needs no
//! monotonicity), then chunks and finally single operations are dropped as
//! in delta debugging. A candidate must also pass [`Model::reads_explained`]:
//! dropping the write whose value a kept read observed would make "a read of
//! a value nobody wrote" the reported violation instead of the real one.

use super::model::{Model, Timed};
use super::search::{check_partition, Budget, Outcome};

/// The result of a minimization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minimized {
    /// Indices into the operations given, in their order.
    pub kept: Vec<usize>,
    /// False if the budget ran out first (`kept` is then illegal but maybe
    /// not minimal).
    pub complete: bool,
    /// How many sub-histories were checked.
    pub checks: usize,
}

/// Minimizes `ops`, which must be non-linearizable.
pub fn minimize<M: Model>(model: &M, ops: &[&M::Op], budget: &Budget) -> Minimized {
    let mut shrinker = Shrinker {
        model,
        ops,
        budget,
        checks: 0,
        out_of_budget: false,
    };
    let mut by_call: Vec<usize> = (0..ops.len()).collect();
    by_call.sort_by_key(|&index| (ops[index].call(), index));
    let mut kept = shrinker.shortest_illegal_prefix(&by_call);
    kept = shrinker.delta_debug(kept);
    kept.sort_unstable();
    Minimized {
        kept,
        complete: !shrinker.out_of_budget,
        checks: shrinker.checks,
    }
}

struct Shrinker<'m, 'o, 'b, M: Model> {
    model: &'m M,
    ops: &'o [&'o M::Op],
    budget: &'b Budget<'b>,
    checks: usize,
    out_of_budget: bool,
}

impl<M: Model> Shrinker<'_, '_, '_, M> {
    /// Whether the candidate is an acceptable smaller violation. An
    /// inconclusive check counts as "no" (the candidate is not taken).
    fn is_violation(&mut self, candidate: &[usize]) -> bool {
        if self.out_of_budget {
            return false;
        }
        let kept: Vec<&M::Op> = candidate.iter().map(|&index| self.ops[index]).collect();
        if !self.model.reads_explained(&kept, self.ops) {
            return false;
        }
        self.checks += 1;
        match check_partition(self.model, &kept, self.budget).0 {
            Outcome::Illegal => true,
            Outcome::Linearizable => false,
            Outcome::Unknown(_) => {
                self.out_of_budget = true;
                false
            }
        }
    }

    fn shortest_illegal_prefix(&mut self, by_call: &[usize]) -> Vec<usize> {
        // Invariant: the prefix of length `high` is a violation; that of
        // length `low` is not known to be one.
        let (mut low, mut high) = (0, by_call.len());
        while high - low > 1 {
            let middle = low + (high - low) / 2;
            if self.is_violation(&by_call[..middle]) {
                high = middle;
            } else {
                low = middle;
            }
        }
        by_call[..high].to_vec()
    }

    fn delta_debug(&mut self, mut kept: Vec<usize>) -> Vec<usize> {
        let mut chunks = 2usize;
        while kept.len() >= 2 && !self.out_of_budget {
            let chunk_len = kept.len().div_ceil(chunks);
            let mut shrunk = false;
            for start in (0..kept.len()).step_by(chunk_len) {
                let end = (start + chunk_len).min(kept.len());
                let candidate: Vec<usize> =
                    kept[..start].iter().chain(&kept[end..]).copied().collect();
                if self.is_violation(&candidate) {
                    kept = candidate;
                    shrunk = true;
                    break;
                }
            }
            if shrunk {
                chunks = chunks.saturating_sub(1).max(2);
            } else if chunk_len == 1 {
                break;
            } else {
                chunks = (chunks * 2).min(kept.len());
            }
        }
        kept
    }
}
