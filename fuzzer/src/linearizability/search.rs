//! The Wing–Gong–Lowe search for a linearization of one partition.
//!
//! Calls and returns sit in one doubly linked list in time order (a call
//! before a return at the same instant, so operations that touch are
//! concurrent). An operation whose call comes before the first remaining
//! return may be linearized next ([`candidates`]): if the model accepts it,
//! it is lifted out of the list (its call and return, O(1) and undone in
//! O(1)) and the search goes one level deeper; when a level has no candidate
//! left, its choice is undone. Lowe's memoization skips a choice that leads
//! to a (linearized set, state) pair already visited: the rest of the search
//! from there is the same.
//!
//! Operations without a return have no return entry (an infinite interval),
//! and the search succeeds once every operation *with* a return is
//! linearized: the others left over are those that never took effect. That
//! lets the cache go one step further than equality: a visited pair
//! (S, state) covers (S', state) when S' adds only operations without a
//! return to S, because from S' the same returned operations remain with
//! fewer choices and no new order constraints (an operation with no return
//! precedes nothing), so S' fails whenever S did.
//!
//! Two more prunings keep many operations without a return from multiplying
//! the search (see [`candidates`]); each drops a choice only when a sibling
//! choice reaches the same state with a superset of the remaining options,
//! so completeness holds. The brute-force property test checks all of this.

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
/// The head of the list of calls and returns of the operations that
/// returned.
const HEAD: usize = 0;
/// The head of the list of calls of the operations without a return.
const UNRETURNED_HEAD: usize = 1;

struct Entry {
    /// Index into the searched operations.
    op: usize,
    is_call: bool,
    time: u64,
    /// For a call, its return entry (or `NONE` if it has none).
    partner: usize,
    prev: usize,
    next: usize,
}

/// The lists of calls and returns, with O(1) lift and undo.
///
/// Operations without a return have a list of their own (their calls in
/// time order), so that the search can try them after the others: the
/// cache then sees a configuration without them first, and covers the same
/// configuration reached with some of them (see the module documentation).
struct EntryList {
    entries: Vec<Entry>,
}

impl EntryList {
    fn new<T: Timed>(ops: &[&T]) -> Self {
        // (time, call before return, op) orders events; the op index breaks
        // ties so the order is deterministic.
        let mut returned: Vec<(u64, u8, usize)> = Vec::with_capacity(ops.len() * 2);
        let mut unreturned: Vec<(u64, u8, usize)> = Vec::new();
        for (index, op) in ops.iter().enumerate() {
            match op.ret() {
                Some(ret) => {
                    returned.push((op.call().0, 0, index));
                    returned.push((ret.0, 1, index));
                }
                None => unreturned.push((op.call().0, 0, index)),
            }
        }
        returned.sort_unstable();
        unreturned.sort_unstable();
        let head = || Entry {
            op: NONE,
            is_call: false,
            time: 0,
            partner: NONE,
            prev: NONE,
            next: NONE,
        };
        let mut list = EntryList {
            entries: vec![head(), head()],
        };
        let mut call_entry = vec![NONE; ops.len()];
        for (head, events) in [(HEAD, returned), (UNRETURNED_HEAD, unreturned)] {
            let mut last = head;
            for (time, kind, op) in events {
                let index = list.entries.len();
                let is_call = kind == 0;
                if is_call {
                    call_entry[op] = index;
                } else {
                    list.entries[call_entry[op]].partner = index;
                }
                list.entries.push(Entry {
                    op,
                    is_call,
                    time,
                    partner: NONE,
                    prev: last,
                    next: NONE,
                });
                list.entries[last].next = index;
                last = index;
            }
        }
        list
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
    let kept: Vec<&M::Op> = ops
        .iter()
        .copied()
        .filter(|op| !model.is_inert(op))
        .filter(|op| op.ret().is_some() || last_return.is_some_and(|last| op.call() <= last))
        .collect();
    let canonical = model.canonicalize(&kept);
    let ops: Vec<&M::Op> = canonical.iter().collect();
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
    let mut classes = EffectClasses::new(model, &ops, &list);
    let mut returned = Bits::new(returned_count);
    let mut unreturned = Bits::new(unreturned_count);
    let mut returned_hash = 0u64;
    let mut remaining = returned_count;
    let mut cache = Cache::new();
    let mut state = model.init();
    let mut stack: Vec<Level<M::State>> = vec![Level {
        chosen: None,
        candidates: candidates(model, &ops, &list, &classes, false),
        next: 0,
    }];
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
        let Some(level) = stack.last_mut() else {
            stats.cache_entries = cache.len;
            return (Outcome::Illegal, stats);
        };
        if let Some(&entry) = level.candidates.get(level.next) {
            level.next += 1;
            let op_index = list.entries[entry].op;
            let op = ops[op_index];
            let has_return = op.ret().is_some();
            let Some(next_state) = model.step(&state, op) else {
                continue;
            };
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
            if !fresh {
                continue;
            }
            let before = std::mem::replace(&mut state, next_state);
            list.lift(entry);
            if has_return {
                remaining -= 1;
            } else {
                classes.take(op_index);
            }
            let candidates = candidates(model, &ops, &list, &classes, !has_return);
            stack.push(Level {
                chosen: Some((entry, before)),
                candidates,
                next: 0,
            });
        } else {
            // Every candidate tried: no way forward from this prefix; undo
            // the choice that led here.
            let Some(level) = stack.pop() else {
                continue;
            };
            let Some((entry, before)) = level.chosen else {
                continue;
            };
            state = before;
            let op_index = list.entries[entry].op;
            if ops[op_index].ret().is_some() {
                returned.clear(slot[op_index]);
                returned_hash ^= zobrist(slot[op_index]);
                remaining += 1;
            } else {
                unreturned.clear(slot[op_index]);
                classes.give_back(op_index);
            }
            list.unlift(entry);
        }
    }
}

/// One level of the depth-first search: the choice that led to it (its
/// call entry and the state before it), and the choices from it.
struct Level<S> {
    chosen: Option<(usize, S)>,
    /// Call entries, in the order to try them.
    candidates: Vec<usize>,
    next: usize,
}

/// The operations that may be linearized next: those called before the
/// first remaining return. The ones with a return are tried first, in call
/// order (trying the earliest return first was measured slower on simulated
/// histories), then the ones without a return, so that the cache sees a
/// configuration without them before the same one with them.
///
/// Two kinds are left out as dominated by a sibling choice: an op without a
/// return that is not the first of its effect class ([`EffectClasses`]),
/// and, right after an op without a return, a blind write (which leaves the
/// state it would leave without that op, with one op fewer left to use).
fn candidates<M: Model>(
    model: &M,
    ops: &[&M::Op],
    list: &EntryList,
    classes: &EffectClasses,
    after_unreturned: bool,
) -> Vec<usize> {
    let mut found = Vec::new();
    let mut entry = list.entries[HEAD].next;
    while entry != NONE && list.entries[entry].is_call {
        found.push(entry);
        entry = list.entries[entry].next;
    }
    let limit = if entry == NONE {
        u64::MAX
    } else {
        list.entries[entry].time
    };
    let mut entry = list.entries[UNRETURNED_HEAD].next;
    while entry != NONE && list.entries[entry].time <= limit {
        if classes.is_next(list.entries[entry].op) {
            found.push(entry);
        }
        entry = list.entries[entry].next;
    }
    if after_unreturned {
        found.retain(|&call| !model.overwrites(ops[list.entries[call].op]));
    }
    found
}

/// The operations without a return grouped by effect. Within a group they
/// are interchangeable, and the earlier-called one can be linearized
/// wherever a later one can, so the search linearizes each group's members
/// in call order only: the linearized members are always a prefix.
struct EffectClasses {
    /// Per op: its class (unused for ops with a return).
    class: Vec<usize>,
    /// Per class: its members in call order.
    members: Vec<Vec<usize>>,
    /// Per class: how many of its members are linearized.
    taken: Vec<usize>,
}

impl EffectClasses {
    fn new<M: Model>(model: &M, ops: &[&M::Op], list: &EntryList) -> Self {
        let mut ids: HashMap<M::Effect, usize> = HashMap::new();
        let mut classes = EffectClasses {
            class: vec![NONE; ops.len()],
            members: Vec::new(),
            taken: Vec::new(),
        };
        let mut entry = list.entries[UNRETURNED_HEAD].next;
        while entry != NONE {
            let op = list.entries[entry].op;
            let next_id = ids.len();
            let id = *ids.entry(model.effect(ops[op])).or_insert(next_id);
            if id == classes.members.len() {
                classes.members.push(Vec::new());
                classes.taken.push(0);
            }
            classes.members[id].push(op);
            classes.class[op] = id;
            entry = list.entries[entry].next;
        }
        classes
    }

    fn is_next(&self, op: usize) -> bool {
        let class = self.class[op];
        self.members[class].get(self.taken[class]) == Some(&op)
    }

    fn take(&mut self, op: usize) {
        self.taken[self.class[op]] += 1;
    }

    fn give_back(&mut self, op: usize) {
        self.taken[self.class[op]] -= 1;
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
