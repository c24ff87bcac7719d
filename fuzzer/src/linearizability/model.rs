//! Sequential specifications the checker compares histories against.
//!
//! Like Porcupine's, a [`Model`] splits a history into partitions that can be
//! checked independently (P-compositionality: a history is linearizable iff
//! each partition is), gives the initial state, and steps a state by one
//! operation. A step with no output (an operation that did not return)
//! applies the operation's effect whatever it would have answered.

use std::collections::{BTreeSet, HashSet};
use std::fmt::Debug;
use std::hash::Hash;

use super::history::{KvInput, KvOutput, Operation, TimeNs};

/// An operation's interval in real time: a call, and a return unless it
/// never returned.
pub trait Timed {
    fn call(&self) -> TimeNs;
    /// `None`: no return (an infinitely long interval).
    fn ret(&self) -> Option<TimeNs>;
}

impl Timed for Operation {
    fn call(&self) -> TimeNs {
        self.call
    }
    fn ret(&self) -> Option<TimeNs> {
        self.ret
    }
}

/// Operations of one partition: a label (for the KV model, the key) and
/// indices into the history's operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub label: String,
    pub ops: Vec<usize>,
}

/// A sequential specification.
pub trait Model {
    type Op: Timed + Clone;
    type State: Clone + Eq + Hash + Debug;
    /// What an operation without a return does, as far as the search can
    /// tell: two such operations with equal effects are interchangeable.
    type Effect: Hash + Eq;

    /// Splits operations into independent partitions (each op in exactly
    /// one).
    fn partition(&self, ops: &[Self::Op]) -> Vec<Partition>;
    fn init(&self) -> Self::State;
    /// The state after `op`, or `None` if `op`'s output is impossible in
    /// `state`. An op without output is always possible.
    fn step(&self, state: &Self::State, op: &Self::Op) -> Option<Self::State>;
    /// Whether the op can be left out of a check altogether because it
    /// constrains nothing (for example a read that never returned).
    fn is_inert(&self, op: &Self::Op) -> bool;
    /// The partition's operations rewritten so that more states coincide,
    /// without changing which sub-histories are linearizable (one op out per
    /// op in, in order). By default, unchanged.
    fn canonicalize(&self, ops: &[&Self::Op]) -> Vec<Self::Op> {
        ops.iter().map(|&op| op.clone()).collect()
    }
    /// The effect of an operation without a return.
    fn effect(&self, op: &Self::Op) -> Self::Effect;
    /// Whether the op is possible in every state and leaves the same state
    /// whatever the state before it (a blind write).
    fn overwrites(&self, op: &Self::Op) -> bool;
    /// Whether every value the `kept` ops observed that some op of `all`
    /// wrote is still written by a kept op (see [`super::minimize`]).
    fn reads_explained(&self, kept: &[&Self::Op], all: &[&Self::Op]) -> bool {
        let _ = (kept, all);
        true
    }
    fn describe_operation(&self, op: &Self::Op) -> String;
    fn describe_state(&self, state: &Self::State) -> String;
}

/// The key-value store: one register per key, partitioned by key. A key
/// starts absent.
#[derive(Debug, Clone, Copy, Default)]
pub struct KvModel;

impl Model for KvModel {
    type Op = Operation;
    /// The key's value, `None` when absent.
    type State = Option<String>;

    fn partition(&self, ops: &[Operation]) -> Vec<Partition> {
        let mut by_key: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
        for (index, op) in ops.iter().enumerate() {
            by_key.entry(op.key.as_str()).or_default().push(index);
        }
        by_key
            .into_iter()
            .map(|(key, ops)| Partition {
                label: key.to_owned(),
                ops,
            })
            .collect()
    }

    fn init(&self) -> Option<String> {
        None
    }

    fn step(&self, state: &Option<String>, op: &Operation) -> Option<Option<String>> {
        match (&op.input, &op.output) {
            (KvInput::Get, None) => Some(state.clone()),
            (KvInput::Get, Some(KvOutput::Get { value })) => {
                (value == state).then(|| state.clone())
            }
            (KvInput::Put { value }, None | Some(KvOutput::Put)) => Some(Some(value.clone())),
            (KvInput::Delete, None | Some(KvOutput::Delete)) => Some(None),
            (KvInput::Cas { from, to }, output) => {
                let matches = state.as_deref() == Some(from.as_str());
                match output {
                    None => Some(if matches {
                        Some(to.clone())
                    } else {
                        state.clone()
                    }),
                    Some(KvOutput::Cas { swapped: true }) => matches.then(|| Some(to.clone())),
                    Some(KvOutput::Cas { swapped: false }) => (!matches).then(|| state.clone()),
                    Some(_) => None,
                }
            }
            // An output of another operation's shape (the parser never makes
            // one) fits no state.
            _ => None,
        }
    }

    type Effect = KvInput;

    fn is_inert(&self, op: &Operation) -> bool {
        matches!(op.input, KvInput::Get) && op.output.is_none()
    }

    /// Values no operation of the partition observes (no get reads them, no
    /// cas compares with them) are indistinguishable: every write of one
    /// writes a single stand-in value instead, so that the states after
    /// them, and the operations without a return that write them, coincide.
    fn canonicalize(&self, ops: &[&Operation]) -> Vec<Operation> {
        let mut observed: HashSet<&str> = HashSet::new();
        let mut used: HashSet<&str> = HashSet::new();
        for op in ops {
            match (&op.input, &op.output) {
                (KvInput::Get, Some(KvOutput::Get { value: Some(value) })) => {
                    observed.insert(value);
                }
                (KvInput::Cas { from, to }, _) => {
                    observed.insert(from);
                    used.insert(to);
                }
                (KvInput::Put { value }, _) => {
                    used.insert(value);
                }
                _ => {}
            }
        }
        let mut stand_in = String::from("\u{0}unobserved");
        while used.contains(stand_in.as_str()) || observed.contains(stand_in.as_str()) {
            stand_in.push('\'');
        }
        ops.iter()
            .map(|&op| {
                let mut op = op.clone();
                match &mut op.input {
                    KvInput::Put { value } | KvInput::Cas { to: value, .. }
                        if !observed.contains(value.as_str()) =>
                    {
                        value.clone_from(&stand_in);
                    }
                    _ => {}
                }
                op
            })
            .collect()
    }

    fn effect(&self, op: &Operation) -> KvInput {
        op.input.clone()
    }

    fn overwrites(&self, op: &Operation) -> bool {
        matches!(
            (&op.input, &op.output),
            (KvInput::Put { .. }, None | Some(KvOutput::Put))
                | (KvInput::Delete, None | Some(KvOutput::Delete))
        )
    }

    /// A value read (by a get, or the `from` of a swapped cas) must keep a
    /// writer (a put, or the `to` of a cas) if it had one; "absent" read must
    /// keep a delete if there was one (else the initial state explains it).
    fn reads_explained(&self, kept: &[&Operation], all: &[&Operation]) -> bool {
        let writes = |ops: &[&Operation]| -> BTreeSet<Option<String>> {
            ops.iter()
                .filter_map(|op| match &op.input {
                    KvInput::Put { value } => Some(Some(value.clone())),
                    KvInput::Cas { to, .. } => Some(Some(to.clone())),
                    KvInput::Delete => Some(None),
                    KvInput::Get => None,
                })
                .collect()
        };
        let all_writes = writes(all);
        let kept_writes = writes(kept);
        kept.iter().all(|op| {
            let observed = match (&op.input, &op.output) {
                (KvInput::Get, Some(KvOutput::Get { value })) => value.clone(),
                (KvInput::Cas { from, .. }, Some(KvOutput::Cas { swapped: true })) => {
                    Some(from.clone())
                }
                _ => return true,
            };
            !all_writes.contains(&observed) || kept_writes.contains(&observed)
        })
    }

    fn describe_operation(&self, op: &Operation) -> String {
        let call = match &op.input {
            KvInput::Get => format!("get({})", op.key),
            KvInput::Put { value } => format!("put({}, {value})", op.key),
            KvInput::Delete => format!("delete({})", op.key),
            KvInput::Cas { from, to } => format!("cas({}, {from} → {to})", op.key),
        };
        let answer = match &op.output {
            None => "?".to_owned(),
            Some(KvOutput::Get { value: Some(value) }) => value.clone(),
            Some(KvOutput::Get { value: None }) => "absent".to_owned(),
            Some(KvOutput::Put | KvOutput::Delete) => "ok".to_owned(),
            Some(KvOutput::Cas { swapped }) => swapped.to_string(),
        };
        format!("{call} -> {answer}")
    }

    fn describe_state(&self, state: &Option<String>) -> String {
        match state {
            Some(value) => value.clone(),
            None => "absent".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(input: KvInput, output: Option<KvOutput>) -> Operation {
        Operation {
            process: 0,
            op: 0,
            key: "k".into(),
            input,
            output,
            call: TimeNs(0),
            ret: None,
        }
    }

    fn some(value: &str) -> Option<String> {
        Some(value.to_owned())
    }

    #[test]
    fn register_semantics() {
        let m = KvModel;
        let get = |v: Option<&str>| {
            op(
                KvInput::Get,
                Some(KvOutput::Get {
                    value: v.map(str::to_owned),
                }),
            )
        };
        assert_eq!(m.step(&None, &get(None)), Some(None));
        assert_eq!(m.step(&some("a"), &get(Some("a"))), Some(some("a")));
        assert_eq!(m.step(&some("a"), &get(Some("b"))), None);
        assert_eq!(m.step(&some("a"), &get(None)), None);
        let put = op(KvInput::Put { value: "b".into() }, Some(KvOutput::Put));
        assert_eq!(m.step(&some("a"), &put), Some(some("b")));
        let delete = op(KvInput::Delete, Some(KvOutput::Delete));
        assert_eq!(m.step(&some("a"), &delete), Some(None));
        let cas = |swapped: Option<bool>| {
            op(
                KvInput::Cas {
                    from: "a".into(),
                    to: "c".into(),
                },
                swapped.map(|swapped| KvOutput::Cas { swapped }),
            )
        };
        assert_eq!(m.step(&some("a"), &cas(Some(true))), Some(some("c")));
        assert_eq!(m.step(&some("b"), &cas(Some(true))), None);
        assert_eq!(m.step(&None, &cas(Some(true))), None);
        assert_eq!(m.step(&some("b"), &cas(Some(false))), Some(some("b")));
        assert_eq!(m.step(&some("a"), &cas(Some(false))), None);
        // Without a return, a cas does what the state makes it do.
        assert_eq!(m.step(&some("a"), &cas(None)), Some(some("c")));
        assert_eq!(m.step(&None, &cas(None)), Some(None));
        assert!(m.is_inert(&op(KvInput::Get, None)));
        assert!(!m.is_inert(&cas(None)));
        assert_eq!(
            m.describe_operation(&cas(Some(true))),
            "cas(k, a → c) -> true"
        );
        assert_eq!(m.describe_operation(&get(None)), "get(k) -> absent");
    }

    #[test]
    fn partitions_by_key_in_key_order() {
        let mut ops = vec![op(KvInput::Get, None); 4];
        ops[0].key = "k2".into();
        ops[2].key = "k2".into();
        ops[3].key = "k1".into();
        let parts = KvModel.partition(&ops);
        let summary: Vec<_> = parts
            .iter()
            .map(|p| (p.label.as_str(), p.ops.clone()))
            .collect();
        assert_eq!(
            summary,
            vec![("k", vec![1]), ("k1", vec![3]), ("k2", vec![0, 2])]
        );
    }
}
