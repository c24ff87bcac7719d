//! The checker on classic cases, and against the brute force on random
//! small histories.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::json;

use super::brute::brute_force_linearizable;
use super::model::{KvModel, Model};
use super::*;

fn op(
    process: u64,
    key: &str,
    input: KvInput,
    output: Option<KvOutput>,
    call: u64,
    ret: Option<u64>,
) -> Operation {
    Operation {
        process,
        op: call,
        key: key.into(),
        input,
        output,
        call: TimeNs(call),
        ret: ret.map(TimeNs),
    }
}

fn put(process: u64, key: &str, value: &str, call: u64, ret: Option<u64>) -> Operation {
    let output = ret.map(|_| KvOutput::Put);
    op(
        process,
        key,
        KvInput::Put {
            value: value.into(),
        },
        output,
        call,
        ret,
    )
}

fn get(process: u64, key: &str, read: Option<&str>, call: u64, ret: u64) -> Operation {
    let output = Some(KvOutput::Get {
        value: read.map(str::to_owned),
    });
    op(process, key, KvInput::Get, output, call, Some(ret))
}

fn cas(
    process: u64,
    key: &str,
    from: &str,
    to: &str,
    swapped: bool,
    call: u64,
    ret: u64,
) -> Operation {
    let input = KvInput::Cas {
        from: from.into(),
        to: to.into(),
    };
    op(
        process,
        key,
        input,
        Some(KvOutput::Cas { swapped }),
        call,
        Some(ret),
    )
}

fn history(operations: Vec<Operation>) -> History {
    History {
        operations,
        failed: 0,
    }
}

fn check(operations: Vec<Operation>) -> CheckReport {
    let history = history(operations);
    let report = check_kv(&history, None);
    let expected = brute_force_linearizable(&history);
    assert_eq!(
        report.verdict == Verdict::Ok,
        expected,
        "{history:?}: {report:?}"
    );
    report
}

fn violation(report: &CheckReport) -> &Violation {
    match &report.verdict {
        Verdict::Illegal(violation) => violation,
        other => panic!("expected a violation, got {other:?}"),
    }
}

#[test]
fn stale_read_after_a_completed_put_is_illegal() {
    let report = check(vec![
        put(1, "k", "a", 0, Some(10)),
        put(1, "k", "b", 20, Some(30)),
        get(2, "k", Some("a"), 40, 50),
        get(2, "k", Some("b"), 60, 70),
    ]);
    let violation = violation(&report);
    assert_eq!(violation.key, "k");
    assert!(violation.minimal);
    // The stale read, the write it saw, the write that overwrote it.
    let calls: Vec<u64> = violation.operations.iter().map(|op| op.call.0).collect();
    assert_eq!(calls, vec![0, 20, 40]);
}

#[test]
fn concurrent_put_and_get_may_go_either_way() {
    check(vec![
        put(1, "k", "a", 0, Some(10)),
        get(2, "k", Some("a"), 5, 15),
    ]);
    check(vec![
        put(1, "k", "a", 0, Some(10)),
        get(2, "k", None, 5, 15),
    ]);
    // Touching intervals are concurrent too.
    check(vec![
        put(1, "k", "a", 0, Some(10)),
        get(2, "k", None, 10, 15),
    ]);
    check(vec![
        put(1, "k", "a", 0, Some(10)),
        get(2, "k", None, 11, 15),
    ]);
}

#[test]
fn unreturned_put_may_take_effect_late_or_never() {
    // Read later: it took effect.
    check(vec![
        put(1, "k", "a", 0, None),
        get(2, "k", Some("a"), 20, 30),
    ]);
    // Never read: it never took effect (or not yet).
    check(vec![put(1, "k", "a", 0, None), get(2, "k", None, 20, 30)]);
    // Absent, then present: it took effect in between.
    check(vec![
        put(1, "k", "a", 0, None),
        get(2, "k", None, 20, 30),
        get(2, "k", Some("a"), 40, 50),
    ]);
    // Present, then absent again with nothing to delete it: illegal.
    let report = check(vec![
        put(1, "k", "a", 0, None),
        get(2, "k", Some("a"), 20, 30),
        get(2, "k", None, 40, 50),
    ]);
    assert_eq!(violation(&report).operations.len(), 3);
    // It cannot take effect before its call.
    let report = check(vec![
        get(2, "k", Some("a"), 0, 10),
        put(1, "k", "a", 20, None),
    ]);
    assert_eq!(violation(&report).operations.len(), 2);
}

#[test]
fn a_read_of_a_value_nobody_wrote_is_illegal() {
    let report = check(vec![
        put(1, "k", "a", 0, Some(10)),
        get(2, "k", Some("zzz"), 20, 30),
    ]);
    let violation = violation(&report);
    assert_eq!(violation.operations, vec![get(2, "k", Some("zzz"), 20, 30)]);
}

#[test]
fn compare_and_swap_semantics() {
    check(vec![
        put(1, "k", "a", 0, Some(10)),
        cas(2, "k", "a", "b", true, 20, 30),
        get(1, "k", Some("b"), 40, 50),
        cas(2, "k", "a", "c", false, 60, 70),
        get(1, "k", Some("b"), 80, 90),
    ]);
    // A swap from a value the key no longer holds.
    check(vec![
        put(1, "k", "a", 0, Some(10)),
        put(1, "k", "c", 20, Some(30)),
        cas(2, "k", "a", "b", true, 40, 50),
    ]);
    // A failed compare although the key held `from`.
    check(vec![
        put(1, "k", "a", 0, Some(10)),
        cas(2, "k", "a", "b", false, 20, 30),
    ]);
    // Two concurrent swaps from the same value cannot both succeed.
    check(vec![
        put(1, "k", "a", 0, Some(10)),
        cas(2, "k", "a", "b", true, 20, 30),
        cas(3, "k", "a", "c", true, 20, 30),
    ]);
    // A swap with no return may have happened: its value is readable.
    check(vec![
        put(1, "k", "a", 0, Some(10)),
        op(
            2,
            "k",
            KvInput::Cas {
                from: "a".into(),
                to: "b".into(),
            },
            None,
            20,
            None,
        ),
        get(1, "k", Some("b"), 40, 50),
    ]);
}

#[test]
fn failed_operations_never_happened() {
    let lines = [
        json!({"process": 1, "op": 1, "type": "invoke", "f": "put", "key": "k", "value": "a", "time_ns": 0}),
        json!({"process": 1, "op": 1, "type": "fail", "f": "put", "key": "k", "value": null, "time_ns": 10}),
        json!({"process": 2, "op": 1, "type": "invoke", "f": "get", "key": "k", "value": null, "time_ns": 20}),
        json!({"process": 2, "op": 1, "type": "ok", "f": "get", "key": "k", "value": "a", "time_ns": 30}),
    ];
    let history = parse_history_values(&lines).unwrap();
    assert!(matches!(
        check_kv(&history, None).verdict,
        Verdict::Illegal(_)
    ));
    // The same with "info": it may have happened.
    let mut lines = lines.to_vec();
    lines[1]["type"] = json!("info");
    let history = parse_history_values(&lines).unwrap();
    assert_eq!(check_kv(&history, None).verdict, Verdict::Ok);
}

#[test]
fn the_first_illegal_key_is_reported_and_the_report_round_trips() {
    let report = check(vec![
        put(1, "k1", "a", 0, Some(10)),
        get(2, "k1", Some("a"), 20, 30),
        get(2, "k3", Some("x"), 20, 30),
        put(1, "k2", "a", 0, Some(10)),
        get(2, "k2", None, 20, 30),
    ]);
    let violation = violation(&report);
    assert_eq!(violation.key, "k2");
    assert_eq!(violation.partition_operations, 2);
    assert_eq!(report.stats.partitions, 3);
    assert_eq!(report.stats.operations, 5);
    let text = serde_json::to_string(&report).unwrap();
    assert!(text.contains("\"outcome\":\"illegal\""), "{text}");
    assert_eq!(serde_json::from_str::<CheckReport>(&text).unwrap(), report);
    let html = render_html(&report);
    assert!(
        html.contains("key k2") && html.contains("get(k2) -&gt; absent"),
        "{html}"
    );
}

/// A long sequential history on one key: put v_i, then read it.
fn sequential(count: u64) -> History {
    let mut ops = Vec::new();
    for i in 0..count {
        let value = format!("v{i}");
        ops.push(put(1, "k", &value, 4 * i, Some(4 * i + 1)));
        ops.push(get(2, "k", Some(&value), 4 * i + 2, 4 * i + 3));
    }
    history(ops)
}

#[test]
fn budgets_give_unknown() {
    let history = sequential(2000);
    assert_eq!(check_kv(&history, None).verdict, Verdict::Ok);
    let report = check_kv_with(&history, None, Some(1));
    assert_eq!(
        report.verdict,
        Verdict::Unknown {
            reason: Unknown::StepBudget,
            key: "k".into()
        }
    );
    let report = check_kv(&history, Some(Duration::ZERO));
    assert_eq!(
        report.verdict,
        Verdict::Unknown {
            reason: Unknown::Timeout,
            key: "k".into()
        }
    );
}

#[test]
fn a_violation_deep_in_a_long_history_shrinks_to_its_cause() {
    let mut history = sequential(3000);
    // Somewhere in the middle, a read of the value before the last write.
    let index = history.operations.len() / 2 + 1;
    assert!(matches!(history.operations[index].input, KvInput::Get));
    history.operations[index].output = Some(KvOutput::Get {
        value: Some("v1499".into()),
    });
    let report = check_kv(&history, Some(Duration::from_secs(60)));
    let violation = violation(&report);
    assert!(violation.minimal);
    let described: Vec<String> = violation
        .operations
        .iter()
        .map(|op| KvModel.describe_operation(op))
        .collect();
    assert_eq!(
        described,
        vec![
            "put(k, v1499) -> ok",
            "put(k, v1500) -> ok",
            "get(k) -> v1499"
        ]
    );
}

/// One operation of a random small history, before outputs are decided.
#[derive(Debug, Clone)]
struct Spec {
    process: u64,
    key: usize,
    kind: u8,
    value: u8,
    other: u8,
    call: u64,
    duration: u64,
    returned: bool,
    /// Where in its interval it takes effect (simulated histories), in
    /// eighths; 8 and above: never (only without a return).
    point: u8,
    random_output: u8,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0u64..3,
        0usize..2,
        0u8..4,
        0u8..3,
        0u8..3,
        0u64..16,
        0u64..8,
        prop::bool::weighted(0.75),
        0u8..10,
        0u8..4,
    )
        .prop_map(
            |(process, key, kind, value, other, call, duration, returned, point, random_output)| {
                Spec {
                    process,
                    key,
                    kind,
                    value,
                    other,
                    call,
                    duration,
                    returned,
                    point,
                    random_output,
                }
            },
        )
}

/// Builds a history: outputs either simulated from a register that applies
/// each operation at a point in its interval (linearizable), then possibly
/// corrupted at one op, or drawn at random.
fn build(specs: &[Spec], simulate: bool, corrupt: Option<usize>) -> History {
    let value = |v: u8| format!("v{v}");
    let mut ops: Vec<Operation> = specs
        .iter()
        .enumerate()
        .map(|(index, s)| {
            let input = match s.kind {
                0 => KvInput::Get,
                1 => KvInput::Put {
                    value: value(s.value),
                },
                2 => KvInput::Delete,
                _ => KvInput::Cas {
                    from: value(s.value),
                    to: value(s.other),
                },
            };
            Operation {
                process: s.process,
                op: index as u64,
                key: format!("k{}", s.key),
                input,
                output: None,
                call: TimeNs(s.call),
                ret: s.returned.then_some(TimeNs(s.call + s.duration)),
            }
        })
        .collect();
    let random_output = |op: &Operation, s: &Spec| match op.input {
        KvInput::Get => KvOutput::Get {
            value: (s.random_output > 0).then(|| value(s.random_output - 1)),
        },
        KvInput::Put { .. } => KvOutput::Put,
        KvInput::Delete => KvOutput::Delete,
        KvInput::Cas { .. } => KvOutput::Cas {
            swapped: s.random_output.is_multiple_of(2),
        },
    };
    if simulate {
        // Effect points in sixteenths of time units, to order ties.
        let mut points: Vec<(u64, usize)> = specs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.returned || s.point < 8)
            .map(|(index, s)| {
                (
                    s.call * 16 + s.duration * 16 * u64::from(s.point.min(7)) / 7,
                    index,
                )
            })
            .collect();
        points.sort_unstable();
        let mut registers: [Option<String>; 2] = [None, None];
        for (_, index) in points {
            let register = &mut registers[specs[index].key];
            let output = match &ops[index].input {
                KvInput::Get => KvOutput::Get {
                    value: register.clone(),
                },
                KvInput::Put { value } => {
                    *register = Some(value.clone());
                    KvOutput::Put
                }
                KvInput::Delete => {
                    *register = None;
                    KvOutput::Delete
                }
                KvInput::Cas { from, to } => {
                    let swapped = register.as_deref() == Some(from.as_str());
                    if swapped {
                        *register = Some(to.clone());
                    }
                    KvOutput::Cas { swapped }
                }
            };
            if specs[index].returned {
                ops[index].output = Some(output);
            }
        }
        if let Some(index) = corrupt.filter(|&index| index < ops.len() && specs[index].returned) {
            ops[index].output = Some(random_output(&ops[index], &specs[index]));
        }
    } else {
        for (op, s) in ops.iter_mut().zip(specs) {
            if s.returned {
                op.output = Some(random_output(op, s));
            }
        }
    }
    History {
        operations: ops,
        failed: 0,
    }
}

fn histories() -> impl Strategy<Value = History> {
    (prop::collection::vec(spec(), 0..8), 0u8..3, 0usize..10)
        .prop_map(|(specs, mode, corrupt)| build(&specs, mode > 0, (mode == 2).then_some(corrupt)))
}

/// The random histories are not all of one kind: both verdicts, overlapping
/// operations and operations without a return all occur often.
#[test]
fn random_histories_cover_both_verdicts() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = histories();
    let (mut legal, mut illegal, mut with_unreturned, mut overlapping) = (0, 0, 0, 0);
    for _ in 0..2000 {
        let history = strategy.new_tree(&mut runner).unwrap().current();
        if brute_force_linearizable(&history) {
            legal += 1;
        } else {
            illegal += 1;
        }
        let ops = &history.operations;
        if ops.iter().any(|op| op.ret.is_none()) {
            with_unreturned += 1;
        }
        let overlap = |a: &Operation, b: &Operation| {
            a.call <= b.ret.unwrap_or(TimeNs(u64::MAX))
                && b.call <= a.ret.unwrap_or(TimeNs(u64::MAX))
        };
        if ops
            .iter()
            .enumerate()
            .any(|(i, a)| ops[i + 1..].iter().any(|b| overlap(a, b)))
        {
            overlapping += 1;
        }
    }
    for (what, count) in [
        ("legal", legal),
        ("illegal", illegal),
        ("with unreturned", with_unreturned),
        ("overlapping", overlapping),
    ] {
        assert!(count > 300, "{what}: {count} of 2000");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6000, ..ProptestConfig::default() })]

    #[test]
    fn agrees_with_brute_force(
        specs in prop::collection::vec(spec(), 0..8),
        mode in 0u8..3,
        corrupt in 0usize..10,
    ) {
        let history = build(&specs, mode > 0, (mode == 2).then_some(corrupt));
        let report = check_kv(&history, None);
        let linearizable = brute_force_linearizable(&history);
        if mode == 1 {
            prop_assert!(linearizable, "a simulated history must be linearizable: {:?}", history);
        }
        match &report.verdict {
            Verdict::Ok => prop_assert!(linearizable, "{:?}", history),
            Verdict::Illegal(violation) => {
                prop_assert!(!linearizable, "{:?}", history);
                prop_assert!(violation.minimal);
                // The minimal sub-history is itself illegal, and dropping
                // any one op that the minimizer may drop makes it legal.
                let minimal = History { operations: violation.operations.clone(), failed: 0 };
                prop_assert!(!brute_force_linearizable(&minimal), "{:?}", minimal);
                let partition: Vec<&Operation> =
                    history.operations.iter().filter(|op| op.key == violation.key).collect();
                for drop in 0..minimal.operations.len() {
                    let mut smaller = minimal.operations.clone();
                    smaller.remove(drop);
                    let kept: Vec<&Operation> = smaller.iter().collect();
                    if KvModel.reads_explained(&kept, &partition) {
                        let smaller = History { operations: smaller, failed: 0 };
                        prop_assert!(brute_force_linearizable(&smaller), "{:?} from {:?}", smaller, minimal);
                    }
                }
            }
            Verdict::Unknown { .. } => prop_assert!(false, "no budget, yet unknown"),
        }
        // The history survives printing and parsing.
        let mut reparsed = parse_history_jsonl(&history.to_jsonl()).unwrap();
        let mut original = history.clone();
        let order = |ops: &mut Vec<Operation>| ops.sort_by_key(|op| (op.process, op.op));
        order(&mut reparsed.operations);
        order(&mut original.operations);
        prop_assert_eq!(reparsed, original);
    }
}
