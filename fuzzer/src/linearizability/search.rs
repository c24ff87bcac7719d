//! The Wing–Gong–Lowe search for a linearization of one partition.
//!
//! Calls and returns sit in one doubly linked list in time order (a call
//! before a return at the same instant, so operations that touch are
//! concurrent). Scanning from the head, an operation whose call comes before
//! the first remaining return may be linearized next: if the model accepts
//! it, it is lifted out of the list (its call and return), pushed on a stack,
//! and the scan restarts; on reaching a return whose operation is not yet
//! linearized, the last choice is undone and the scan moves past it. Lowe's
//! memoization skips a choice that leads to a (linearized set, state) pair
//! already visited: the rest of the search from there is the same.
//!
//! Operations without a return have no return entry (an infinite interval),
//! and the search succeeds once every operation *with* a return is
//! linearized: the others left over are those that never took effect. That
//! lets the cache go one step further than equality: a visited pair
//! (S, state) covers (S', state) when S' adds only operations without a
//! return to S, because from S' the same returned operations remain with
//! fewer choices and no new order constraints (an operation with no return
//! precedes nothing), so S' fails whenever S did.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::model::{Model, Timed};

/// When to give up on a search.
#[derive(Debug, Clone, Copy, Default)]
pub struct Budget<'a> {
    /// Stop with [`Unknown::Timeout`] after this instant.
    pub deadline: Option<Instant>,
    /// Stop with [`Unknown::StepBudget`] after this many search steps.
    pub max_steps: Option<u64>,
    /// Stop with [`Unknown::Cancelled`] once set (another partition already
    /// found a violation).
    pub cancel: Option<&'a AtomicBool>,
}

/// Why a search gave no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unknown {
    Timeout,
    StepBudget,
    Cancelled,
}

/// The answer for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Linearizable,
    Illegal,
    Unknown(Unknown),
}

/// What a search cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SearchStats {
    /// Operations searched (after leaving out those that constrain nothing).
    pub operations: usize,
    /// Iterations of the search loop.
    pub steps: u64,
    /// Distinct (linearized set, state) pairs memoized.
    pub cache_entries: usize,
}

const NONE: usize = usize::MAX;
const HEAD: usize = 0;

struct Entry {
    /// Index into the searched operations.
    op: usize,
    is_call: bool,
    /// For a call, its return entry (or `NONE` if it has none).
    partner: usize,
    prev: usize,
    next: usize,
}

/// The list of calls and returns, with O(1) lift and undo.
struct EntryList {
    entries: Vec<Entry>,
}

impl EntryList {
    fn new<T: Timed>(ops: &[&T]) -> Self {
        // (time, call before return, op) orders events; the op index breaks
        // ties so the order is deterministic.
        let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(ops.len() * 2);
        for (index, op) in ops.iter().enumerate() {
            events.push((op.call().0, 0, index));
            if let Some(ret) = op.ret() {
                events.push((ret.0, 1, index));
            }
        }
        events.sort_unstable();
        let mut entries = Vec::with_capacity(events.len() + 1);
        entries.push(Entry {
            op: NONE,
            is_call: false,
            partner: NONE,
            prev: NONE,
            next: NONE,
        });
        let mut call_entry = vec![NONE; ops.len()];
        for (position, &(_, kind, op)) in events.iter().enumerate() {
            let index = position + 1;
            let is_call = kind == 0;
            if is_call {
                call_entry[op] = index;
            } else {
                entries[call_entry[op]].partner = index;
            }
            entries.push(Entry {
                op,
                is_call,
                partner: NONE,
                prev: index - 1,
                next: if position + 1 < events.len() {
                    index + 1
                } else {
                    NONE
                },
            });
        }
        entries[HEAD].next = if events.is_empty() { NONE } else { 1 };
        EntryList { entries }
    }

    fn unlink(&mut self, index: usize) {
        let (prev, next) = (self.entries[index].prev, self.entries[index].next);
        self.entries[prev].next = next;
        if next != NONE {
            self.entries[next].prev = prev;
        }
    }

    fn relink(&mut self, index: usize) {
        let (prev, next) = (self.entries[index].prev, self.entries[index].next);
        self.entries[prev].next = index;
        if next != NONE {
            self.entries[next].prev = index;
        }
    }

    /// Takes a call (and its return) out of the list.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        let partner = self.entries[call].partner;
        if partner != NONE {
            self.unlink(partner);
        }
    }

    /// Undoes the last [`EntryList::lift`].
    fn unlift(&mut self, call: usize) {
        let partner = self.entries[call].partner;
        if partner != NONE {
            self.relink(partner);
        }
        self.relink(call);
    }
}

/// A set of small indices.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Bits(Box<[u64]>);

impl Bits {
    fn new(len: usize) -> Self {
        Bits(vec![0; len.div_ceil(64)].into_boxed_slice())
    }
    fn set(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }
    fn clear(&mut self, index: usize) {
        self.0[index / 64] &= !(1 << (index % 64));
    }
    fn is_subset_of(&self, other: &Bits) -> bool {
        self.0.iter().zip(other.0.iter()).all(|(a, b)| a & !b == 0)
    }
}

/// A fixed pseudo-random word per operation, XORed into the hash of the
/// linearized set as it changes (Zobrist hashing), so a step costs O(1)
/// hashing whatever the history's length.
fn zobrist(index: usize) -> u64 {
    let mut z = (index as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The memo: per (linearized set of returned ops, state), the sets of
/// linearized no-return ops seen with it.
struct Cache<S> {
    buckets: HashMap<u64, Vec<CacheEntry<S>>>,
    len: usize,
}

struct CacheEntry<S> {
    returned: Bits,
    state: S,
    unreturned: Vec<Bits>,
}

impl<S: Eq + Hash + Clone> Cache<S> {
    fn new() -> Self {
        Cache {
            buckets: HashMap::new(),
            len: 0,
        }
    }

    /// Records the pair, or returns false if a pair that covers it was seen.
    fn insert(
        &mut self,
        returned_hash: u64,
        returned: &Bits,
        unreturned: &Bits,
        state: &S,
    ) -> bool {
        let mut hasher = DefaultHasher::new();
        state.hash(&mut hasher);
        let key = returned_hash ^ hasher.finish();
        let bucket = self.buckets.entry(key).or_default();
        if let Some(entry) = bucket
            .iter_mut()
            .find(|entry| entry.state == *state && entry.returned == *returned)
        {
            if entry
                .unreturned
                .iter()
                .any(|seen| seen.is_subset_of(unreturned))
            {
                return false;
            }
            entry.unreturned.push(unreturned.clone());
        } else {
            bucket.push(CacheEntry {
                returned: returned.clone(),
                state: state.clone(),
                unreturned: vec![unreturned.clone()],
            });
        }
        self.len += 1;
        true
    }
}

/// Searches for a linearization of `ops` (one partition).
pub fn check_partition<M: Model>(
    model: &M,
    ops: &[&M::Op],
    budget: &Budget,
) -> (Outcome, SearchStats) {
    // Operations that constrain nothing are left out: reads that never
    // returned, and operations without a return called after every return
    // (they could only be linearized after every returned operation).
    let last_return = ops.iter().filter_map(|op| op.ret()).max();
    let ops: Vec<&M::Op> = ops
        .iter()
        .copied()
        .filter(|op| !model.is_inert(op))
        .filter(|op| op.ret().is_some() || last_return.is_some_and(|last| op.call() <= last))
        .collect();
    let mut stats = SearchStats {
        operations: ops.len(),
        ..SearchStats::default()
    };
    // Each op's slot in the bitset of its kind.
    let mut slot = Vec::with_capacity(ops.len());
    let (mut returned_count, mut unreturned_count) = (0, 0);
    for op in &ops {
        if op.ret().is_some() {
            slot.push(returned_count);
            returned_count += 1;
        } else {
            slot.push(unreturned_count);
            unreturned_count += 1;
        }
    }
    let mut list = EntryList::new(&ops);
    let mut returned = Bits::new(returned_count);
    let mut unreturned = Bits::new(unreturned_count);
    let mut returned_hash = 0u64;
    let mut remaining = returned_count;
    let mut cache = Cache::new();
    let mut state = model.init();
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut entry = list.entries[HEAD].next;
    loop {
        if remaining == 0 {
            stats.cache_entries = cache.len;
            return (Outcome::Linearizable, stats);
        }
        stats.steps += 1;
        if stats.steps.is_multiple_of(1024) {
            if let Some(reason) = exhausted(budget, stats.steps) {
                stats.cache_entries = cache.len;
                return (Outcome::Unknown(reason), stats);
            }
        }
        let at_call = entry != NONE && list.entries[entry].is_call;
        if at_call {
            let op_index = list.entries[entry].op;
            let op = ops[op_index];
            let has_return = op.ret().is_some();
            if let Some(next_state) = model.step(&state, op) {
                let fresh = if has_return {
                    returned.set(slot[op_index]);
                    let hash = returned_hash ^ zobrist(slot[op_index]);
                    let fresh = cache.insert(hash, &returned, &unreturned, &next_state);
                    if fresh {
                        returned_hash = hash;
                    } else {
                        returned.clear(slot[op_index]);
                    }
                    fresh
                } else {
                    unreturned.set(slot[op_index]);
                    let fresh = cache.insert(returned_hash, &returned, &unreturned, &next_state);
                    if !fresh {
                        unreturned.clear(slot[op_index]);
                    }
                    fresh
                };
                if fresh {
                    stack.push((entry, std::mem::replace(&mut state, next_state)));
                    list.lift(entry);
                    if has_return {
                        remaining -= 1;
                    }
                    entry = list.entries[HEAD].next;
                    continue;
                }
            }
            entry = list.entries[entry].next;
        } else {
            // A return of an op not yet linearized (or, defensively, the end
            // of the list): no way forward from this prefix; undo the last
            // choice and try the next one.
            let Some((call, previous)) = stack.pop() else {
                stats.cache_entries = cache.len;
                return (Outcome::Illegal, stats);
            };
            state = previous;
            let op_index = list.entries[call].op;
            if ops[op_index].ret().is_some() {
                returned.clear(slot[op_index]);
                returned_hash ^= zobrist(slot[op_index]);
                remaining += 1;
            } else {
                unreturned.clear(slot[op_index]);
            }
            list.unlift(call);
            entry = list.entries[call].next;
        }
    }
}

fn exhausted(budget: &Budget, steps: u64) -> Option<Unknown> {
    if budget
        .cancel
        .is_some_and(|cancel| cancel.load(Ordering::Relaxed))
    {
        return Some(Unknown::Cancelled);
    }
    if budget.max_steps.is_some_and(|max| steps >= max) {
        return Some(Unknown::StepBudget);
    }
    if budget
        .deadline
        .is_some_and(|deadline| Instant::now() >= deadline)
    {
        return Some(Unknown::Timeout);
    }
    None
}
