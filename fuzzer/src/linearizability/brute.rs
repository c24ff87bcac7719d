//! A brute-force linearizability checker, straight from the definition, to
//! cross-check the search: it tries every order of the operations that
//! respects real time (an operation that returned before another's call
//! comes first), with every subset of the operations without a return left
//! out, on the whole history at once (one register per key, no
//! partitioning, no memo). Exponential: for small histories only.

use std::collections::BTreeMap;

use super::history::{History, Operation};
use super::model::{KvModel, Model};

/// Whether the history is linearizable.
pub fn brute_force_linearizable(history: &History) -> bool {
    let ops: Vec<&Operation> = history.operations.iter().collect();
    let mut placed = vec![false; ops.len()];
    let mut state: BTreeMap<&str, Option<String>> = BTreeMap::new();
    extend(&ops, &mut placed, &mut state)
}

fn must_precede(a: &Operation, b: &Operation) -> bool {
    a.ret.is_some_and(|ret| ret < b.call)
}

fn extend<'a>(
    ops: &[&'a Operation],
    placed: &mut [bool],
    state: &mut BTreeMap<&'a str, Option<String>>,
) -> bool {
    // Every operation with a return placed: the rest never took effect.
    if ops
        .iter()
        .zip(placed.iter())
        .all(|(op, &done)| done || op.ret.is_none())
    {
        return true;
    }
    for next in 0..ops.len() {
        if placed[next] {
            continue;
        }
        let op = ops[next];
        let blocked = (0..ops.len()).any(|other| !placed[other] && must_precede(ops[other], op));
        if blocked {
            continue;
        }
        let current = state.get(op.key.as_str()).cloned().unwrap_or(None);
        let Some(after) = KvModel.step(&current, op) else {
            continue;
        };
        placed[next] = true;
        state.insert(op.key.as_str(), after);
        let found = extend(ops, placed, state);
        state.insert(op.key.as_str(), current);
        placed[next] = false;
        if found {
            return true;
        }
    }
    false
}
