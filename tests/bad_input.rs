//! Bad input is refused by the binary before any VM (or helper VM) starts:
//! one error naming what is wrong, exit status 2, and no hang on a FIFO.
//! No test here boots a guest.

mod common;

use common::stderr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs detvisor with `args` and `env`; fails the test if it has not
/// ended in `limit`.
fn detvisor_within(limit: Duration, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("detvisor starts");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("detvisor {} hung", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    eprintln!("$ detvisor {}\n{}", args.join(" "), stderr(&out));
    out
}

/// Runs detvisor with `args`; fails the test if it has not ended in 20 s.
fn detvisor_quick(args: &[&str]) -> Output {
    detvisor_within(Duration::from_secs(20), args, &[])
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
    // The manifest's own fault past the end is said, not refused: a shorter
    // run looks at the scenario's beginning.
    std::fs::write(
        &manifest,
        "faults = [\"at=50s pause n1\"]\n[[node]]\nname = \"n1\"\nrootfs = \"/nonexistent\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let args = [
        "up",
        manifest.to_str().unwrap(),
        "--host-vm",
        "never",
        "--until",
        "1s",
    ];
    let out = detvisor_quick(&args);
    let err = stderr(&out);
    assert!(
        err.contains("detvisor: note: the manifest's fault \"at=50s pause n1\": the run ends at 1s (--until), before at=50s: it would never happen"),
        "{err}"
    );
    assert!(
        err.contains("/nonexistent"),
        "it went on to the rootfs: {err}"
    );
    up(
        "at=100ms pause n1 for=0s",
        "for=0s: a fault undone the moment it happens does nothing",
    );
    up(
        "at=100ms pause n1 for=5000000h",
        "for=18000000000s: beyond the latest virtual time a fault may name, 31536000s (365 days)",
    );
}

/// Runs detvisor with `args` and `TMPDIR` set to `tmp`, where a helper VM
/// it started would leave its directory (`detvisor-helper-vm-*`: its
/// console and QEMU logs, kept by `DETVISOR_HELPER_VM_KEEP_TMP`). Allowed
/// 120 s: the first campaign of a test binary may build the guest agent.
fn detvisor_in(tmp: &Path, args: &[&str]) -> Output {
    let keep = Path::new("1");
    let env = [("TMPDIR", tmp), (helper_vm::KEEP_TMP_ENV, keep)];
    detvisor_within(Duration::from_secs(120), args, &env)
}

/// `args` (with `--host-vm always`, so any run would start a helper VM)
/// refused: exit 2, one line naming `naming`, and no helper VM started (no
/// directory of one in `tmp`).
fn refused_before_any_helper_vm(tmp: &Path, args: &[&str], naming: &str) {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--host-vm", "always"]);
    let out = detvisor_in(tmp, &all);
    let text = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert_eq!(text.lines().count(), 1, "one error: {text}");
    assert!(text.contains(naming), "{text}");
    let started: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("detvisor-helper-vm-")
        })
        .map(|e| e.path())
        .collect();
    assert!(started.is_empty(), "a helper VM started: {started:?}");
}

/// A directory with a busybox cluster of one node, a campaign file of it
/// (`c.toml`) and a `tmp/` for [`detvisor_in`]. Nothing here boots.
fn campaign_scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("root/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).expect("busybox-static is installed");
    std::os::unix::fs::symlink("busybox", bin.join("sh")).unwrap();
    std::fs::write(
        dir.path().join("cluster.toml"),
        "[[node]]\nname = \"n1\"\nrootfs = \"root\"\ncommand = [\"sh\", \"-c\", \"sleep 100\"]\n\
         \n[workload]\nnode = \"n1\"\ncommand = [\"sh\", \"-c\", \"sleep 1\"]\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("c.toml"), "manifest = \"cluster.toml\"\n").unwrap();
    std::fs::create_dir(dir.path().join("tmp")).unwrap();
    dir
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A run of one node `n1` whose kernel is `dir/vmlinux` (never booted).
fn prepared_run(dir: &Path) -> run::up::PreparedUp {
    let kernel = dir.join("vmlinux");
    std::fs::write(&kernel, b"kernel bytes").unwrap();
    let network =
        devices::NetworkConfig::reliable(devices::LatencyDist::Fixed(vmm::VirtNanos::ZERO));
    serde_json::from_value(serde_json::json!({
        "kernel": kernel, "initrd": {"bytes": [1, 2, 3]}, "specs": [], "node_names": ["n1"],
        "workload": null, "network": serde_json::to_value(network).unwrap(),
        "rtc_epoch_unix_secs": 0, "ram_bytes": 1, "faults": [], "disks": []
    }))
    .expect("a prepared run")
}

/// A path of one branch at 1 s holding `fault`.
fn path_with(fault: run::faults::Fault) -> fuzzer::step::Path {
    fuzzer::step::Path::default().child(7, vec![fault], vmm::VirtNanos::from_secs(2))
}

/// Written in place of a fault text that does not parse (a path holds
/// faults), then replaced by it in the files, as a damaged or hand-edited
/// file would hold it.
const STAND_IN: &str = "at=+1s kill n1";

/// A campaign directory (never run) whose index holds finding 0001 at
/// moment 1, reached by a branch holding `fault`; its run and blobs as a
/// campaign writes them, and `findings/0001/` with `finding.json` and
/// `run.json`.
fn campaign_with_finding(dir: &Path, fault: &str) -> PathBuf {
    use fuzzer::store::{FindingRow, FinishedBranch, NodeRow, Store};
    let out = dir.join("campaign");
    std::fs::create_dir(&out).unwrap();
    let spec = fuzzer::spec::CampaignSpec::load(&dir.join("c.toml")).unwrap();
    let run = fuzzer::findings::blobify(&out, &prepared_run(dir)).unwrap();
    let mut store = Store::create(&out, &[("spec", json(&spec)), ("run", json(&run))]).unwrap();
    let typed = fault.parse::<run::faults::Fault>().ok();
    let path = path_with(typed.clone().unwrap_or_else(|| STAND_IN.parse().unwrap()));
    let row = FindingRow {
        number: 1,
        key: "property:p".into(),
        node: 1,
        summary: "p failed".into(),
    };
    for (id, path) in [(0, Default::default()), (1, path.clone())] {
        let node = NodeRow {
            id,
            parent: (id > 0).then_some(0),
            depth: id as u32,
            path,
            end_exits: 0,
            end_ns: vmm::VirtNanos::ZERO,
            digest: "d".into(),
            score: 1.0,
            stopped: false,
        };
        let findings = if id == 1 { vec![row.clone()] } else { vec![] };
        store
            .commit_branch(&FinishedBranch {
                node: &node,
                records_json: "[]",
                findings: &findings,
                meta: &[],
            })
            .unwrap();
    }
    let finding = fuzzer::findings::finding_dir(&out, 1);
    std::fs::create_dir_all(&finding).unwrap();
    let file = fuzzer::findings::FindingFile {
        format: fuzzer::findings::FINDING_FORMAT,
        number: 1,
        key: row.key,
        summary: row.summary,
        details: serde_json::Value::Null,
        path: path.clone(),
        found_path: path,
        digest: "d".into(),
        exits: 0,
        virtual_ns: vmm::VirtNanos::ZERO,
        spec,
        failure_moment: None,
        shrinking: None,
    };
    let mut finding_json = json(&file);
    if typed.is_none() {
        drop(store);
        let db = rusqlite::Connection::open(out.join(fuzzer::store::DB_FILE)).unwrap();
        let edited = db
            .execute(
                "UPDATE nodes SET path = replace(path, ?1, ?2) WHERE instr(path, ?1) > 0",
                [STAND_IN, fault],
            )
            .unwrap();
        assert_eq!(edited, 1, "moment 1's path");
        finding_json = finding_json.replace(STAND_IN, fault);
    }
    std::fs::write(finding.join("finding.json"), finding_json).unwrap();
    std::fs::write(finding.join("run.json"), json(&run)).unwrap();
    out
}

fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap()
}

/// `findings` lists from the campaign's index: a finding the index holds
/// whose directory is gone, and a database that is not a campaign's
/// (random bytes, truncated, empty), a FIFO or a directory, are errors,
/// never "no findings" with exit 0.
#[test]
fn findings_are_listed_from_the_index_and_a_damaged_campaign_is_refused() {
    let dir = campaign_scratch();
    let out = campaign_with_finding(dir.path(), "at=+100ms pause n1 for=1s");
    let listed = detvisor_quick(&["findings", text(&out)]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(common::stdout(&listed).starts_with("0001  property:p  p failed"));

    let findings = out.join("findings");
    std::fs::rename(&findings, dir.path().join("moved")).unwrap();
    refused(
        &["findings", text(&out)],
        "findings/0001: missing, though the campaign's index",
    );
    std::fs::rename(dir.path().join("moved"), &findings).unwrap();

    let db = out.join("campaign.db");
    let whole = std::fs::read(&db).unwrap();
    let damaged: [(&str, Vec<u8>, &str); 3] = [
        (
            "random bytes",
            (0..8192u32).map(|i| (i * 7919 % 251) as u8).collect(),
            "not a detvisor campaign database",
        ),
        ("empty", Vec::new(), "not a detvisor campaign database"),
        (
            "truncated",
            whole[..whole.len() / 2].to_vec(),
            "campaign.db",
        ),
    ];
    for (what, bytes, naming) in damaged {
        eprintln!("-- {what}");
        std::fs::write(&db, bytes).unwrap();
        refused(&["findings", text(&out)], naming);
    }
    std::fs::remove_file(&db).unwrap();
    assert!(Command::new("mkfifo").arg(&db).status().unwrap().success());
    refused(
        &["findings", text(&out)],
        "campaign.db: not a regular file (a FIFO)",
    );
    refused(
        &["campaign", "--resume", text(&out), "--host-vm", "never"],
        "campaign.db: not a regular file (a FIFO)",
    );
    let c = dir.path().join("c.toml");
    refused(
        &[
            "campaign",
            text(&c),
            "--out",
            text(&out),
            "--host-vm",
            "never",
        ],
        "campaign.db: not a regular file (a FIFO)",
    );
    std::fs::remove_file(&db).unwrap();
    std::fs::create_dir(&db).unwrap();
    refused(
        &["findings", text(&out)],
        "campaign.db: not a regular file (a directory)",
    );
}

/// A campaign directory that is a regular file says so, for a new
/// campaign's `--out`, `--resume` and `findings`.
#[test]
fn a_campaign_directory_that_is_a_file_is_refused_saying_what_it_is() {
    let dir = campaign_scratch();
    let file = dir.path().join("c.toml");
    let c = text(&file);
    let naming = "c.toml: not a directory (a regular file)";
    refused(&["campaign", c, "--out", c, "--host-vm", "never"], naming);
    refused(&["campaign", "--resume", c, "--host-vm", "never"], naming);
    refused(&["findings", c], naming);
}

/// A finding, or a campaign to resume, whose path holds a fault that does
/// not parse or names no node of the run: refused before any helper VM
/// starts, naming the file, the step and the fault.
#[test]
fn a_stored_path_with_a_bad_fault_is_refused_before_any_helper_vm() {
    let dir = campaign_scratch();
    let tmp = dir.path().join("tmp");
    for (fault, naming) in [
        ("at=+1s paws n1", "unknown action \"paws\""),
        ("at=+1s pause n9", "no node is named \"n9\""),
    ] {
        let out = campaign_with_finding(dir.path(), fault);
        let finding = out.join("findings/0001");
        refused_before_any_helper_vm(&tmp, &["replay", text(&finding)], naming);
        refused_before_any_helper_vm(
            &tmp,
            &["replay", text(&finding)],
            "findings/0001/finding.json: path: step 1 (the branch at 0s): fault",
        );
        refused_before_any_helper_vm(
            &tmp,
            &["campaign", "--resume", text(&out)],
            "campaign.db: moment 1's path: step 1 (the branch at 0s): fault",
        );
        refused_before_any_helper_vm(&tmp, &["campaign", "--resume", text(&out)], naming);
        std::fs::remove_dir_all(&out).unwrap();
    }
}

/// A new campaign whose `--out` cannot be written, whose `--jobs` the
/// host's memory cannot hold, or whose `--out` another campaign holds, is
/// refused before any helper VM starts; the second leaves no `--out`
/// behind, the third writes nothing into it.
#[test]
fn a_campaign_that_cannot_run_is_refused_before_any_helper_vm() {
    let dir = campaign_scratch();
    let tmp = dir.path().join("tmp");
    let c = dir.path().join("c.toml");
    let c = text(&c);

    // Read-only: a read-only mount, as root can write anywhere else.
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mounted = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "ro,size=1m",
            "detvisor-test",
            text(&ro),
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        mounted,
        "mounting a read-only tmpfs (the tests run as root)"
    );
    let out = ro.join("out");
    refused_before_any_helper_vm(
        &tmp,
        &["campaign", c, "--out", text(&out)],
        "ro: cannot write in it",
    );
    assert!(Command::new("umount").arg(&ro).status().unwrap().success());

    let out = dir.path().join("out");
    refused_before_any_helper_vm(
        &tmp,
        &["campaign", c, "--out", text(&out), "--jobs", "64"],
        "--jobs 64: 64 helper VMs of",
    );
    assert!(!out.exists(), "--out left behind");

    let held = fuzzer::store::NewCampaignDir::claim(&out).unwrap();
    refused_before_any_helper_vm(
        &tmp,
        &["campaign", c, "--out", text(&out)],
        "another campaign is running on",
    );
    let written: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(written, ["lock"], "only the first campaign's lock");
    drop(held);
}

/// A snapshot of an `up` run of nodes n1 and n2 at 5 s, as its files
/// describe it (its state holds only what the checks read; never restored).
fn up_snapshot(root: &Path) -> String {
    let meta = snapshot::SnapshotMeta::new("s1", vmm::VirtNanos(5_000_000_000), 1000, 4096, 1);
    let state = serde_json::json!({"up": {"node_names": ["n1", "n2"]}});
    snapshot::write_snapshot(root, &meta, &state, &[0; 4096]).unwrap();
    text(&root.join("s1")).to_owned()
}

/// `branch --fault` naming a node the snapshot's run does not have, a
/// time before the branch point, or two faults overlapping on one lane, is
/// refused from the snapshot's files before any helper VM starts.
#[test]
fn branch_faults_are_checked_against_the_snapshot_before_any_helper_vm() {
    let dir = campaign_scratch();
    let tmp = dir.path().join("tmp");
    let s1 = up_snapshot(&dir.path().join("snaps"));
    let at_time = format!("{}@6s", text(&dir.path().join("snaps")));
    let branch = |spec: &str, faults: &[&str], naming: &str| {
        let mut args = vec!["branch", spec];
        for fault in faults {
            args.extend_from_slice(&["--fault", fault]);
        }
        refused_before_any_helper_vm(&tmp, &args, naming);
    };
    branch(
        &s1,
        &["at=+1s pause n9"],
        "no node is named \"n9\" (nodes: n1, n2)",
    );
    branch(
        &s1,
        &["at=4s pause n1"],
        "at=4s is before the branch point, 5s at the earliest",
    );
    branch(
        &at_time,
        &["at=5500ms pause n1"],
        "at=5.5s is before the branch point, 6s at the earliest",
    );
    branch(
        &s1,
        &["at=+1s pause n1 for=5s", "at=+2s kill n1"],
        "fault at=7s kill n1 signal=9 overlaps fault at=6s pause n1: both take the processes of n1",
    );
}

/// `up` refuses a manifest's fault and a `--fault` that overlap on one
/// lane, naming both, before any helper VM starts.
#[test]
fn up_faults_that_overlap_on_a_lane_are_refused_naming_both() {
    let dir = campaign_scratch();
    let tmp = dir.path().join("tmp");
    let manifest = dir.path().join("cluster.toml");
    let nodes = std::fs::read_to_string(&manifest).unwrap();
    let faults = "faults = [\"at=2s pause n1 for=10s\"]\n";
    std::fs::write(&manifest, format!("{faults}{nodes}")).unwrap();
    refused_before_any_helper_vm(
        &tmp,
        &["up", text(&manifest), "--fault", "at=3s pause n1 for=1s"],
        "fault at=3s pause n1 overlaps fault at=2s pause n1: both take the processes of n1",
    );
}

/// Two `image build`s to one `--out` at once: the one that finds the other
/// building it fails, naming it (its pid), and leaves the output alone.
#[test]
fn a_second_image_build_to_one_output_fails_naming_the_first() {
    use std::os::fd::AsRawFd;
    let dir = campaign_scratch();
    let out = dir.path().join("node.img");
    // The first build, as the lock beside its output shows it.
    let lock = dir.path().join(".node.img.lock");
    std::fs::write(&lock, "4242").unwrap();
    let held = std::fs::File::open(&lock).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    let root = dir.path().join("root");
    let build = [
        "image",
        "build",
        "--rootfs",
        text(&root),
        "--out",
        text(&out),
    ];
    refused(
        &build,
        "node.img: another process (pid 4242) is writing it now",
    );
    assert!(!out.exists());
    drop(held);
    std::fs::remove_file(&lock).unwrap();
    let built = detvisor_quick(&build);
    assert_eq!(built.status.code(), Some(0), "{}", stderr(&built));
    assert!(out.is_file() && !lock.exists());
}

/// The debugger's verbs refuse what names no history before any helper VM
/// starts, one line naming the problem: a directory that is missing or
/// none of a finding, a campaign or snapshots; a finding whose stored path
/// does not parse; a moment a finding's history has no room for.
#[test]
fn debugger_moments_that_name_nothing_are_refused_before_any_helper_vm() {
    let dir = campaign_scratch();
    let tmp = dir.path().join("tmp");
    let missing = dir.path().join("no-such-dir");
    refused_before_any_helper_vm(
        &tmp,
        &["exec", &format!("{}@-1s", text(&missing)), "--", "ls"],
        "no-such-dir: no such directory",
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    refused_before_any_helper_vm(
        &tmp,
        &["processes", &format!("{}@2s", text(&empty))],
        "neither a finding (finding.json), a campaign (campaign.db) nor a directory of snapshots",
    );
    let out = campaign_with_finding(dir.path(), "at=+1s paws n1");
    let finding = out.join("findings/0001");
    refused_before_any_helper_vm(
        &tmp,
        &["exec", &format!("{}@failure", text(&finding)), "--", "ls"],
        "unknown action \"paws\"",
    );
    refused_before_any_helper_vm(
        &tmp,
        &["events", text(&finding), "--until", "@-1s"],
        "unknown action \"paws\"",
    );
    std::fs::remove_dir_all(&out).unwrap();
    // A moment's text that is no moment: clap's error, naming the part.
    let out = detvisor_in(&tmp, &["exec", "f~1s:spin=1@2s", "--", "ls"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown action \"spin\""),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_reader_that_closes_stdout_ends_the_process_without_a_panic() {
    // As `detvisor campaign --print-defaults | head -0` would: the reader
    // is gone before the first line is written.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .args(["campaign", "--print-defaults"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    assert_eq!(out.status.code(), Some(128 + 13), "{}", stderr(&out));
}
