//! Bad input is refused by the binary before any VM (or helper VM) starts:
//! one error naming what is wrong, exit status 2, and no hang on a FIFO.
//! No test here boots a guest.

mod common;

use common::stderr;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs detvisor with `args`; fails the test if it has not ended in 20 s.
fn detvisor_quick(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("detvisor starts");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            panic!("detvisor {} hung", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    eprintln!("$ detvisor {}\n{}", args.join(" "), stderr(&out));
    out
}

fn refused(args: &[&str], naming: &str) {
    let out = detvisor_quick(args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stderr(&out);
    assert_eq!(text.lines().count(), 1, "one error: {text}");
    assert!(text.contains(naming), "{text}");
}

#[test]
fn flags_are_checked_before_anything_starts() {
    let run = |flags: &[&str], naming: &str| {
        let mut args = vec!["run", "--host-vm", "never"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "true"]);
        refused(&args, naming);
    };
    run(&["--mem", "1M"], "--mem: guest RAM of 1M is out of range");
    run(
        &["--mem", "268435457"],
        "--mem: guest RAM of 268435457 bytes is not a whole number of 4K pages",
    );
    run(
        &["--net-latency", "garbage"],
        "--net-latency: unparsable duration",
    );
    run(
        &["--net-latency", "100000h"],
        "--net-latency: invalid network configuration: latency",
    );
    run(
        &["--net-loss", "7"],
        "--net-loss: invalid network configuration: loss probability 7",
    );
    run(
        &["--rtc-epoch", "99999999999999"],
        "--rtc-epoch: 99999999999999 is outside 1970..9999",
    );
}

#[test]
fn a_manifest_the_agent_would_refuse_is_refused_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("bad.toml");
    std::fs::write(
        &manifest,
        "[[node]]\nname = \"a\"\nrootfs = \"/nonexistent\"\ncommand = [\"\"]\n",
    )
    .unwrap();
    refused(
        &["up", manifest.to_str().unwrap(), "--host-vm", "never"],
        "node 1 (\"a\"): command = [\"\", ...]: the program (the first word) is empty",
    );
}

#[test]
fn a_spec_naming_no_snapshot_is_one_error_not_one_per_seed() {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("{}@bad", dir.path().display());
    refused(
        &["branch", &spec, "--seeds", "1..4", "--host-vm", "never"],
        "no snapshot with id \"bad\"",
    );
}

#[test]
fn a_fifo_in_a_snapshot_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s1");
    std::fs::create_dir(&snap).unwrap();
    let status = Command::new("mkfifo")
        .arg(snap.join("state.bin"))
        .status()
        .unwrap();
    assert!(status.success());
    let root = dir.path().to_str().unwrap();
    refused(
        &["snapshot", "ls", root],
        "state.bin: not a regular file (a FIFO)",
    );
    refused(
        &["snapshot", "info", snap.to_str().unwrap()],
        "not a regular file (a FIFO)",
    );
    refused(
        &["seek", &format!("{root}@1s"), "--host-vm", "never"],
        "not a regular file (a FIFO)",
    );
}
