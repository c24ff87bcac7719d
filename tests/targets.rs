//! Real systems under test with a fixed fault (no search): etcd 3.4
//! (examples/etcd) serves a stale serializable read from a member cut off
//! from the others, and no stale linearizable read under the same cut. The
//! histories come from kvclient (stdout lines in the history format); the
//! check here is a simple stale-read search written apart from the fuzzer's
//! linearizability checker, so the two check each other.
//!
//! The Raft example's stale read (a paused leader that resumes and serves
//! reads without verifying leadership) is found, shrunk and replayed by the
//! campaign in tests/campaign.rs, and its verified variant is searched there
//! with no finding: a fixed-fault copy of those runs here would only repeat
//! them at the cost of two more guest runs in CI.

mod common;

use common::images::*;
use common::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A copy of an example manifest in the scratch directory (beside the built
/// images), with `../raft/raft.img` pointing at the scratch copy too, and
/// the workload's 20 s shortened to `duration` (a test's time is dear).
fn manifest(example: &str, duration: &str) -> PathBuf {
    example_copy(example, |text| {
        let text = text.replace("\"../raft/raft.img\"", "\"raft.img\"");
        let long = r#""--duration", "20s""#;
        assert!(text.contains(long), "{example} runs its workload for 20 s");
        text.replace(long, &format!(r#""--duration", "{duration}""#))
    })
}

fn up(manifest: &Path, extra: &[&str]) -> std::process::Output {
    let logs = manifest.with_extension("logs");
    let _ = std::fs::remove_dir_all(&logs);
    let mut args = vec![
        "up",
        manifest.to_str().unwrap(),
        "--logs",
        logs.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    detvisor(&args)
}

/// One operation of a history: its invocation and its completion, if any.
#[derive(Debug, Clone)]
struct Op {
    f: String,
    key: String,
    input: serde_json::Value,
    call_ns: u64,
    /// (type, value, time) of the completion.
    done: Option<(String, serde_json::Value, u64)>,
}

/// The operations of the history lines in `text` (any prefix before the
/// JSON object is ignored, as `workload | ` in `up`'s output).
fn history(text: &str) -> Vec<Op> {
    let mut ops: Vec<Op> = Vec::new();
    let mut open: HashMap<(u64, u64), usize> = HashMap::new();
    for line in text.lines() {
        let Some(start) = line.find("{\"detvisor_history\"") else {
            continue;
        };
        let json: serde_json::Value = serde_json::from_str(&line[start..])
            .unwrap_or_else(|e| panic!("history line {line:?}: {e}"));
        let e = &json["detvisor_history"];
        let id = (e["process"].as_u64().unwrap(), e["op"].as_u64().unwrap());
        let time = e["time_ns"].as_u64().unwrap();
        match e["type"].as_str().unwrap() {
            "invoke" => {
                assert!(!open.contains_key(&id), "op {id:?} invoked twice");
                open.insert(id, ops.len());
                ops.push(Op {
                    f: e["f"].as_str().unwrap().into(),
                    key: e["key"].as_str().unwrap().into(),
                    input: e["value"].clone(),
                    call_ns: time,
                    done: None,
                });
            }
            kind @ ("ok" | "fail" | "info") => {
                let i = open
                    .remove(&id)
                    .unwrap_or_else(|| panic!("{id:?} completed twice"));
                assert!(time >= ops[i].call_ns, "{line}");
                ops[i].done = Some((kind.into(), e["value"].clone(), time));
            }
            other => panic!("unknown type {other} in {line}"),
        }
    }
    ops
}

/// A get that returned `w` on key k although a write of another value `v`
/// to k completed before the get was invoked, and the write of `w` completed
/// before that write of `v` was invoked: in every order consistent with real
/// time `w` was overwritten before the get began. Values are unique per
/// write, so "the write of w" is one operation. Histories with deletes are
/// not judged (a null read could be a delete's).
fn stale_reads(ops: &[Op]) -> Vec<(Op, Op)> {
    assert!(
        ops.iter().all(|o| o.f != "delete"),
        "deletes are not judged"
    );
    let ok_at = |o: &Op| match &o.done {
        Some((kind, _, t)) if kind == "ok" => Some(*t),
        _ => None,
    };
    // The value an ok write wrote: put's input, a successful cas's "to".
    let written = |o: &Op| -> Option<String> {
        let (kind, out, _) = o.done.as_ref()?;
        match (o.f.as_str(), kind.as_str()) {
            ("put", "ok") => o.input.as_str().map(String::from),
            ("cas", "ok") if out == &serde_json::Value::Bool(true) => {
                o.input[1].as_str().map(String::from)
            }
            _ => None,
        }
    };
    // Writers of each value, whatever their outcome (put input; cas "to").
    let mut writer: HashMap<String, &Op> = HashMap::new();
    for o in ops {
        let value = match o.f.as_str() {
            "put" => o.input.as_str(),
            "cas" => o.input[1].as_str(),
            _ => None,
        };
        if let Some(v) = value {
            writer.insert(v.to_string(), o);
        }
    }
    let mut found = Vec::new();
    for get in ops.iter().filter(|o| o.f == "get") {
        let Some((kind, value, _)) = &get.done else {
            continue;
        };
        if kind != "ok" {
            continue;
        }
        // When the read value was written for sure (None: the initial null).
        let w_done = match value.as_str() {
            None => Some(0),
            Some(w) => match writer.get(w) {
                Some(op) if written(op).as_deref() == Some(w) => ok_at(op),
                _ => None,
            },
        };
        let Some(w_done) = w_done else { continue };
        let newer = ops.iter().find(|p| {
            p.key == get.key
                && written(p).is_some_and(|v| Some(v.as_str()) != value.as_str())
                && ok_at(p).is_some_and(|t| t < get.call_ns)
                && w_done < p.call_ns
        });
        if let Some(p) = newer {
            found.push((get.clone(), p.clone()));
        }
    }
    found
}

/// Counts of (f, completion type) in a history, for the test's log.
fn tally(ops: &[Op]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for o in ops {
        let kind = o.done.as_ref().map_or("none", |d| d.0.as_str());
        *counts.entry(format!("{} {}", o.f, kind)).or_default() += 1;
    }
    format!("{counts:?}")
}

#[test]
fn test_stale_read_check_on_small_histories() {
    let line = |p: u64, op: u64, t: &str, f: &str, k: &str, v: &str, ns: u64| {
        format!(
            "workload | {{\"detvisor_history\":{{\"process\":{p},\"op\":{op},\"type\":\"{t}\",\"f\":\"{f}\",\"key\":\"{k}\",\"value\":{v},\"time_ns\":{ns}}}}}\n"
        )
    };
    // put a, then put b, then a get of k1 returns a: stale.
    let mut text = String::new();
    text += &line(0, 1, "invoke", "put", "k1", "\"a\"", 10);
    text += &line(0, 1, "ok", "put", "k1", "null", 20);
    text += &line(1, 1, "invoke", "put", "k1", "\"b\"", 30);
    text += &line(1, 1, "ok", "put", "k1", "null", 40);
    text += &line(2, 1, "invoke", "get", "k1", "null", 50);
    text += &line(2, 1, "ok", "get", "k1", "\"a\"", 60);
    assert_eq!(stale_reads(&history(&text)).len(), 1);
    // The same with the puts concurrent: a legal order puts b first.
    let concurrent = text.replace("\"time_ns\":30", "\"time_ns\":15");
    assert!(stale_reads(&history(&concurrent)).is_empty());
    // A get concurrent with put b: legal.
    let overlapping = text.replace("\"time_ns\":50", "\"time_ns\":35");
    assert!(stale_reads(&history(&overlapping)).is_empty());
    // A get of null after an ok put: stale; before any put completed: legal.
    let mut text = String::new();
    text += &line(0, 1, "invoke", "put", "k2", "\"a\"", 10);
    text += &line(0, 1, "ok", "put", "k2", "null", 20);
    text += &line(1, 1, "invoke", "get", "k2", "null", 30);
    text += &line(1, 1, "ok", "get", "k2", "null", 40);
    text += &line(2, 1, "invoke", "get", "k2", "null", 15);
    text += &line(2, 1, "ok", "get", "k2", "null", 45);
    assert_eq!(stale_reads(&history(&text)).len(), 1);
    // Another key is another register; a failed put wrote nothing.
    let mut text = String::new();
    text += &line(0, 1, "invoke", "put", "k1", "\"a\"", 10);
    text += &line(0, 1, "ok", "put", "k1", "null", 20);
    text += &line(1, 1, "invoke", "put", "k1", "\"b\"", 30);
    text += &line(1, 1, "fail", "put", "k1", "null", 40);
    text += &line(3, 1, "invoke", "put", "k3", "\"c\"", 30);
    text += &line(3, 1, "ok", "put", "k3", "null", 40);
    text += &line(2, 1, "invoke", "get", "k1", "null", 50);
    text += &line(2, 1, "ok", "get", "k1", "\"a\"", 60);
    assert!(stale_reads(&history(&text)).is_empty());
}

/// The etcd kv example `example` (its workload reads with `--consistency s`
/// or `l`) with n1 cut off from n2 and n3 at 12 s for 6 s (the workload still
/// reaches all three) while the workload writes through the majority.
/// Returns the history's stale reads.
fn etcd_cut_member_run(example: &str) -> Vec<(Op, Op)> {
    raft_image();
    etcd_image();
    let manifest = manifest(example, "16s");
    let fault = "at=12s cut n1 <-> n2,n3 for=6s";
    let out = up(
        &manifest,
        &["--seed", "1", "--until", "150s", "--fault", fault],
    );
    assert_eq!(out.status.code(), Some(0), "the workload ends by itself");
    let ops = history(&stdout(&out));
    let stale = stale_reads(&ops);
    eprintln!(
        "{example}: {} ops {}, {} stale reads",
        ops.len(),
        tally(&ops),
        stale.len()
    );
    for (get, put) in stale.iter().take(5) {
        eprintln!("stale: {get:?}\n  after {put:?}");
    }
    // Reads and writes completed during the cut (through the majority).
    let during = |f: &str| {
        ops.iter().any(|o| {
            o.f == f
                && o.done.as_ref().is_some_and(|d| d.0 == "ok")
                && (12_500_000_000..17_500_000_000).contains(&o.call_ns)
        })
    };
    assert!(during("get") && during("put"), "{}", tally(&ops));
    stale
}

#[test]
fn test_etcd_serializable_reads_from_a_cut_off_member_are_stale() {
    let stale = etcd_cut_member_run("etcd/kv-serializable.toml");
    assert!(!stale.is_empty(), "no stale read");
}

#[test]
fn test_etcd_linearizable_reads_are_never_stale_under_the_same_cut() {
    let stale = etcd_cut_member_run("etcd/kv-linearizable.toml");
    assert!(stale.is_empty(), "stale reads: {stale:?}");
}
