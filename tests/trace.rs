//! End-to-end tests of `--trace FILE` (one JSON line per exit) and
//! `detvisor trace FILE` (where the exits went): a real guest boots with
//! and without a trace, and the trace must hold exactly the run's exits and
//! change nothing of the run.

mod common;

use common::*;
use std::collections::BTreeMap;

const COMMAND: &str = "echo traced; head -c8 /dev/urandom | od -An -tx1";

#[test]
fn test_run_trace_has_every_exit_named_and_changes_no_digest() {
    // Arrange
    let dir = std::env::temp_dir().join(format!("detvisor-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("exits.jsonl");
    let file_arg = file.to_str().unwrap();

    // Act
    let plain = detvisor(&["run", "--json", "--seed", "5", "--", "sh", "-c", COMMAND]);
    let traced = detvisor(&[
        "run", "--json", "--seed", "5", "--trace", file_arg, "--", "sh", "-c", COMMAND,
    ]);
    let report = detvisor(&["trace", "--json", file_arg]);
    let table = detvisor(&["trace", "--totals", file_arg]);

    // Assert: the run is the run without a trace.
    assert_eq!(plain.status.code(), Some(0));
    assert_eq!(traced.status.code(), Some(0));
    let (plain, traced) = (summary(&plain), summary(&traced));
    assert_eq!(
        traced["digest"], plain["digest"],
        "a trace must not change the run"
    );
    assert_eq!(traced["exits"], plain["exits"]);

    // A line per exit, in order, counted by kind as the summary counts them.
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let exits = traced["exits"].as_u64().unwrap();
    assert_eq!(lines.len() as u64, exits, "a line per exit");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(
            line["index"].as_u64(),
            Some(i as u64),
            "line {i} out of order"
        );
    }
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_device: BTreeMap<String, u64> = BTreeMap::new();
    for line in &lines {
        *by_kind
            .entry(line["kind"].as_str().unwrap().into())
            .or_default() += 1;
        let device = line["device"].as_str().unwrap_or("-");
        *by_device.entry(device.into()).or_default() += 1;
    }
    let expected_kinds: BTreeMap<String, u64> =
        serde_json::from_value(traced["exits_by_kind"].clone()).unwrap();
    assert_eq!(by_kind, expected_kinds);

    // The devices the boot talks to are named.
    for device in ["serial", "pic-master", "status-port"] {
        assert!(
            by_device.contains_key(device),
            "no {device} exits: {by_device:?}"
        );
    }
    assert!(
        by_device.keys().any(|d| d.starts_with("virtio-rng@0x")),
        "no virtio-rng exits: {by_device:?}"
    );
    let last = lines.last().unwrap();
    assert_eq!(
        last["device"], "status-port",
        "the run ends at its status write"
    );
    assert!(last["rip"].as_str().unwrap().starts_with("0x"));

    // The report counts the same.
    assert_eq!(report.status.code(), Some(0));
    let report = summary(&report);
    assert_eq!(report["total"]["exits"].as_u64(), Some(exits));
    let report_kinds: BTreeMap<String, u64> =
        serde_json::from_value(report["total"]["by_kind"].clone()).unwrap();
    assert_eq!(report_kinds, expected_kinds);
    let report_devices: BTreeMap<String, u64> =
        serde_json::from_value(report["total"]["by_device"].clone()).unwrap();
    assert_eq!(report_devices, by_device);
    let per_second: u64 = report["seconds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["exits"].as_u64().unwrap())
        .sum();
    assert_eq!(per_second, exits);
    assert_eq!(table.status.code(), Some(0));
    assert!(stdout(&table).contains(&format!("{exits} exits")));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn test_run_trace_into_a_missing_directory_fails_before_the_run() {
    let file = "/nonexistent-detvisor-dir/exits.jsonl";
    let out = detvisor(&["run", "--trace", file, "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains(&format!("creating the trace {file}")), "{err}");
    assert!(!err.contains("helper VM"), "nothing may start: {err}");
    assert!(!err.contains("virtual"), "no run may start: {err}");
}

/// The trace's lines, parsed.
fn trace_lines(file: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("trace {}: {e}", file.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn test_branch_trace_is_the_runs_trace_from_the_branch_point_on() {
    // Arrange: a traced run with a snapshot in the middle.
    let dir = std::env::temp_dir().join(format!("detvisor-trace-branch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (run_file, branch_file) = (dir.join("run.jsonl"), dir.join("branch.jsonl"));
    let snaps = dir.join("snaps").display().to_string();
    let run = detvisor(&[
        "run",
        "--json",
        "--seed",
        "5",
        "--snapshots",
        &snaps,
        "--snapshot-at-exit",
        "400",
        "--trace",
        run_file.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        COMMAND,
    ]);
    assert_eq!(run.status.code(), Some(0));

    // Act: the same history from exit 400 on (no new seed).
    let branch = detvisor(&[
        "branch",
        &format!("{snaps}@exit:400"),
        "--json",
        "--trace",
        branch_file.to_str().unwrap(),
    ]);

    // Assert
    assert_eq!(branch.status.code(), Some(0));
    let (run, branch) = (summary(&run), summary(&branch));
    assert_eq!(branch["digest"], run["digest"]);
    let (run_lines, branch_lines) = (trace_lines(&run_file), trace_lines(&branch_file));
    assert_eq!(run_lines.len() as u64, run["exits"].as_u64().unwrap());
    assert_eq!(
        branch_lines[0]["index"], 400,
        "the branch traces from its branch point"
    );
    assert_eq!(
        branch_lines.len() as u64,
        branch["exits"].as_u64().unwrap() - 400
    );
    assert!(
        branch_lines[..] == run_lines[400..],
        "the branch's exits are the run's from exit 400 on"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Two nodes: n1 answers on TCP port 7000, the workload in n2 talks to it.
fn two_nodes() -> String {
    common::cluster::manifest(
        "1ms",
        &[
            "while true; do echo pong | nc -l -p 7000; done".to_string(),
            "while true; do sleep 1; done".to_string(),
        ],
        ("n2", "sleep 1; echo hi | nc 192.0.2.1 7000"),
    )
}

#[test]
fn test_up_traces_its_first_run_and_the_runs_stay_identical() {
    let cluster = common::cluster::Cluster::new("trace", &two_nodes());
    let file = cluster.dir.join("up.jsonl");
    let out = cluster.up(&[
        "--seed",
        "2",
        "--json",
        "--quiet",
        "--runs",
        "2",
        "--trace",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let summary = summary(&out);
    // The second run, untraced, had every exit of the first, traced.
    assert_eq!(summary["identical"], true);
    let lines = trace_lines(&file);
    assert_eq!(lines.len() as u64, summary["exits"].as_u64().unwrap());
    let devices: std::collections::BTreeSet<&str> =
        lines.iter().filter_map(|l| l["device"].as_str()).collect();
    for nic in ["virtio-net@0xd0002000", "virtio-net@0xd0003000"] {
        assert!(devices.contains(nic), "no exits of {nic}: {devices:?}");
    }
    let seconds = lines.last().unwrap()["time_ns"].as_u64().unwrap() / 1_000_000_000;
    assert!(seconds >= 1, "the workload sleeps a virtual second");
}
