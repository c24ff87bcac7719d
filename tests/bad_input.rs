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

/// A campaign of `text` (c.toml, beside a manifest of nodes n1 and n2, n1
/// with a disk): refused before anything starts, naming `naming`, and its
/// `--out` never made.
fn campaign_refused(text: &str, naming: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("m.toml"),
        "[[node]]\nname = \"n1\"\nrootfs = \"/nonexistent\"\ncommand = [\"true\"]\ndisk = \"64M\"\ndata = \"/data\"\n\
         [[node]]\nname = \"n2\"\nrootfs = \"/nonexistent\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, format!("manifest = \"m.toml\"\n{text}")).unwrap();
    let out = dir.path().join("out");
    let (file, out_text) = (file.to_str().unwrap(), out.to_str().unwrap());
    refused(
        &["campaign", file, "--out", out_text, "--host-vm", "never"],
        &format!("detvisor: error: campaign file {file}, {naming}"),
    );
    assert!(!out.exists(), "nothing made for a refused campaign");
}

#[test]
fn campaign_files_are_checked_before_anything_starts() {
    // Names checked against the manifest.
    campaign_refused(
        "[faults]\nexclude = [\"workoad\"]",
        "line 3: faults.exclude[0] = \"workoad\": no node is named \"workoad\" (the manifest's nodes: n1, n2; or \"workload\")",
    );
    campaign_refused(
        "[faults]\nexclude = [\"n1\", \"\"]",
        "line 3: faults.exclude[1] = \"\": no node",
    );
    campaign_refused(
        "[faults]\nexclude = [\"n1\", \"n2\"]",
        "line 3: faults.exclude = [\"n1\", \"n2\"]: every node of the manifest (n1, n2) is excluded",
    );
    campaign_refused(
        "[faults]\nexclude = [\"n1\"]\n[faults.disk]\nenabled = true",
        "line 5: faults.disk.enabled = true: every node with a disk (n1) is excluded",
    );
    // A range that cannot fit the slice, naming both keys.
    campaign_refused(
        "[search]\nslice = \"4s\"\n[faults.clock]\nenabled = false\n[faults.network]\nduration = \"10s..20s\"",
        "line 7: faults.network.duration = \"10s..20s\": its minimum, 10s, is longer than a slice, search.slice = \"4s\" (line 3)",
    );
    // [faults] errors at the user's own line, far down the file.
    campaign_refused(
        &format!(
            "{}[faults.network]\nrate = 0.2\nduration = \"1s..2x\"",
            "\n".repeat(28)
        ),
        "line 32: faults.network.duration: ",
    );
    // Values that can never work.
    for (text, naming) in [
        ("[search]\nslice = \"5000000h\"", "line 3: search.slice = \"5000000h\": beyond the latest virtual time a campaign may name, 31536000s (365 days)"),
        ("[search]\nslice = \"0s\"", "line 3: search.slice = \"0s\": must be at least 1ms"),
        ("[root]\nat = \"5000000h\"", "line 3: root.at = \"5000000h\": beyond the latest"),
        ("[root]\nat = \"0s\"", "line 3: root.at = \"0s\": must be at least 1ns"),
        ("[root]\nwait = \"0s\"", "line 3: root.wait = \"0s\": must be at least 100ms"),
        ("[search]\nmax_depth = 4294967295", "line 3: search.max_depth = 4294967295: must be 1..=1000"),
        ("[search]\nlive_checkpoints = 100000000", "line 3: search.live_checkpoints = 100000000: more than 64 needs search.checkpoint_memory"),
        ("[search]\ncheckpoint_memory = \"0\"", "line 3: search.checkpoint_memory = \"0\": must be at least 1M"),
    ] {
        campaign_refused(text, naming);
    }
}

#[test]
fn campaign_prints_its_default_fault_profile_and_says_its_exit_status() {
    let out = detvisor_quick(&["campaign", "--print-defaults"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("\n[faults]\n")
            && text.contains("\n[faults.network]\nenabled = true\nrate = 0.1\n"),
        "{text}"
    );
    let help = detvisor_quick(&["campaign", "--help"]);
    let help = String::from_utf8(help.stdout).unwrap();
    assert!(help.contains("Exit status: 0 when the campaign stopped holding no finding, 1 when it holds one or more"), "{help}");
}

#[test]
fn a_fault_after_the_run_ends_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("m.toml");
    std::fs::write(
        &manifest,
        "[[node]]\nname = \"n1\"\nrootfs = \"/nonexistent\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let up = |fault: &str, naming: &str| {
        let args = [
            "up",
            manifest.to_str().unwrap(),
            "--host-vm",
            "never",
            "--until",
            "1s",
            "--fault",
            fault,
        ];
        refused(&args, naming);
    };
    up("at=50s pause n1", "fault \"at=50s pause n1\": the run ends at 1s (--until), before at=50s: it would never happen");
    up(
        "at=100ms pause n1 for=0s",
        "for=0s: a fault undone the moment it happens does nothing",
    );
    up(
        "at=100ms pause n1 for=5000000h",
        "for=18000000000s: beyond the latest virtual time a fault may name, 31536000s (365 days)",
    );
}
