//! Fault-injection campaigns on a real system under test: raftkv on Debian's
//! hashicorp/raft (examples/raft), whose leader serves lease reads without
//! `VerifyLeader`. A short campaign must find the stale read (a
//! linearizability violation), shrink it and write a finding that `replay`
//! reproduces bit for bit from a copy of its directory elsewhere; a campaign
//! killed with SIGKILL mid-branch and resumed must make the same search and
//! keep what it reported; and the variant that verifies leadership must pass
//! the same budget.

mod common;

use common::images::*;
use common::stale::*;
use common::*;
use fuzzer::store::Store;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A copy of `examples/raft/campaign-<variant>.toml` and its manifest beside
/// the scratch raft image.
fn campaign_file(variant: &str) -> PathBuf {
    raft_image();
    example_copy(&format!("raft/campaign-{variant}-manifest.toml"), |t| t);
    example_copy(&format!("raft/campaign-{variant}.toml"), |t| t)
}

fn out_dir(name: &str) -> PathBuf {
    let dir = scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A campaign of `file` into `out`, `BRANCHES` long, with `more` arguments.
fn campaign(file: &Path, out: &Path, more: &[&str]) -> std::process::Output {
    let mut args = vec![
        "campaign",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--branches",
        BRANCHES,
    ];
    args.extend_from_slice(more);
    detvisor(&args)
}

/// A campaign's state as its database holds it: the tree (every moment as a
/// JSON row), the findings (number, key, branch) and the property tally.
type CampaignState = (Vec<String>, Vec<(u32, String, u64)>, Option<String>);

/// The campaign's tree (every moment: parent, path, end, digest, score) and
/// findings and property tally, as its database holds them.
fn state(dir: &Path) -> CampaignState {
    let store = Store::open(dir).unwrap();
    let nodes = store
        .nodes()
        .unwrap()
        .iter()
        .map(|n| {
            serde_json::json!([
                n.id,
                n.parent,
                n.depth,
                n.path,
                n.end_exits,
                n.end_ns,
                n.digest,
                n.score,
                n.stopped
            ])
            .to_string()
        })
        .collect();
    let findings = store
        .findings()
        .unwrap()
        .into_iter()
        .map(|f| (f.number, f.key, f.node))
        .collect();
    (nodes, findings, store.campaign_meta().unwrap().tally)
}

#[test]
fn test_stale_read_campaign_finds_shrinks_and_replays_from_a_copy() {
    let dir = stale_campaign();
    let found = findings_json(&dir);
    let lin: Vec<_> = found
        .iter()
        .filter(|f| {
            f["key"]
                .as_str()
                .unwrap()
                .starts_with("checker:linearizability:")
        })
        .collect();
    assert!(!lin.is_empty(), "no linearizability finding: {found:?}");
    let finding = lin[0];
    assert!(
        finding["faults"].as_u64().unwrap() <= finding["found_faults"].as_u64().unwrap(),
        "shrinking never adds faults: {finding}"
    );
    let number = finding["number"].as_u64().unwrap();
    let dir_name = format!("{number:04}");
    let finding_dir = dir.join("findings").join(&dir_name);
    for file in ["finding.json", "run.json", "records.jsonl"] {
        assert!(finding_dir.join(file).is_file(), "{file} in the finding");
    }
    // The checker's minimal non-linearizable sub-history is shown as HTML.
    let html = std::fs::read_to_string(finding_dir.join("checker.html")).unwrap();
    assert!(
        html.contains("<html") || html.contains("<!DOCTYPE"),
        "{html}"
    );
    // No absolute path of this machine in what the finding holds.
    let text = std::fs::read_to_string(finding_dir.join("run.json")).unwrap();
    assert!(
        !text.contains(scratch().to_str().unwrap()),
        "run.json names no path here: {text}"
    );

    // Replay from a copy of the finding elsewhere, in a fresh process.
    let copy = out_dir("copied-finding");
    let cp = Command::new("cp")
        .args(["-a", finding_dir.to_str().unwrap(), copy.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(cp.success());
    let replay = detvisor(&["replay", copy.to_str().unwrap(), "--json"]);
    assert_eq!(replay.status.code(), Some(0), "{}", stderr(&replay));
    let report: serde_json::Value = serde_json::from_str(stdout(&replay).trim()).unwrap();
    assert_eq!(report["reproduced"], true, "{report}");
    assert_eq!(report["failed_again"], true, "{report}");
    assert_eq!(report["digest"], finding["digest"], "{report}");
    assert_eq!(report["key"], finding["key"], "{report}");
    // Its progress away from a terminal: the root, each slice of the path
    // up to the last, the judging.
    let told = stderr(&replay);
    let slices: Vec<&str> = told
        .lines()
        .filter_map(|l| l.strip_prefix("detvisor: replay: slice "))
        .collect();
    let last = slices.last().expect("a line per slice");
    let (done, total) = last.split_once(' ').unwrap().0.split_once('/').unwrap();
    assert_eq!(done, total, "{told}");
    assert_eq!(slices.len().to_string(), total, "{told}");
    assert!(told.contains("detvisor: replay: root moment at "), "{told}");
    assert!(
        told.ends_with("detvisor: replay: judging the history\n"),
        "{told}"
    );
}

#[test]
fn test_campaign_killed_mid_branch_resumes_the_same_search() {
    let file = campaign_file("stale");
    let out = out_dir("killed");
    let mut child = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .args(["campaign", file.to_str().unwrap(), "--out"])
        .arg(&out)
        .args(["--branches", BRANCHES])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kill it once the first branch is committed (and its finding reported):
    // the second branch is then in flight.
    let mut reported = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        eprintln!("killed campaign: {line}");
        if line.starts_with("detvisor: FINDING ") {
            reported.push(line.clone());
        }
        if line.starts_with("detvisor: branch 1 ") {
            break;
        }
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(status.code().is_none(), "killed by a signal: {status:?}");
    let (nodes, findings, _) = state(&out);
    assert_eq!(nodes.len(), 2, "the root and branch 1 were committed");
    assert_eq!(findings.len(), reported.len(), "{reported:?}");
    for (number, _, _) in &findings {
        assert!(out
            .join("findings")
            .join(format!("{number:04}"))
            .join("finding.json")
            .is_file());
    }

    let resumed = detvisor(&[
        "campaign",
        "--resume",
        out.to_str().unwrap(),
        "--branches",
        BRANCHES,
    ]);
    assert!(
        matches!(resumed.status.code(), Some(0 | 1)),
        "{}",
        stderr(&resumed)
    );
    // The same tree, findings and tally as the uninterrupted campaign.
    let (nodes, findings, tally) = state(&out);
    let (want_nodes, want_findings, want_tally) = state(&stale_campaign());
    assert_eq!(nodes, want_nodes);
    assert_eq!(findings, want_findings);
    assert_eq!(tally, want_tally);
}

/// The variant that verifies leadership, searched by a worker per core
/// (`--jobs 0`) that keep two moments each in memory, so moments are
/// spilled to disk: nothing is found in the same number of branches.
#[test]
fn test_campaign_on_raft_that_verifies_leadership_finds_nothing_in_the_same_budget() {
    let out = out_dir("verified");
    raft_image();
    example_copy("raft/campaign-verified-manifest.toml", |t| t);
    let file = example_copy("raft/campaign-verified.toml", |t| {
        t.replace("live_checkpoints = 6", "live_checkpoints = 2")
    });
    let run = campaign(&file, &out, &["--jobs", "0"]);
    assert_eq!(run.status.code(), Some(0), "no finding: {}", stdout(&run));
    let (nodes, findings, _) = state(&out);
    assert_eq!(nodes.len(), 1 + BRANCHES.parse::<usize>().unwrap());
    assert!(findings.is_empty(), "{findings:?}");
    let err = stderr(&run);
    assert!(err.contains("detvisor: branch 3 "), "{err}");
    // Its history lines reached the checker: no warning that it cannot fail.
    assert!(!err.contains("WARNING"), "{err}");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores > 1 {
        assert!(
            err.contains(&format!("{cores} workers, a helper VM each"))
                || !err.contains("helper VM"),
            "{err}"
        );
    }
    assert!(spilled(&err) > 0, "{err}");
    assert!(!out.join("spill").exists(), "spill/ is removed at the end");
}

/// Checkpoints written to `spill/`, as the closing summary's line about
/// going back to moments says.
fn spilled(err: &str) -> u64 {
    let line = err
        .lines()
        .find(|l| l.starts_with("detvisor: going back to moments: "))
        .unwrap_or_else(|| panic!("no line about going back to moments: {err}"));
    let before = line
        .split(" written to it")
        .next()
        .and_then(|head| head.rsplit(", ").next())
        .unwrap_or_else(|| panic!("{line}"));
    before.parse().unwrap_or_else(|_| panic!("{line}"))
}

/// A busybox node that prints a line every 100 ms; nothing is judged.
const TICKING: &str = "[[node]]\nname = \"n1\"\nrootfs = \"root\"\n\
    command = [\"sh\", \"-c\", \"while true; do echo tick; sleep 0.1; done\"]\n\
    \n[workload]\nnode = \"n1\"\ncommand = [\"sh\", \"-c\", \"sleep 100\"]\n";

/// A campaign of `TICKING` that lets every checkpoint but the root and the
/// present go (spilling it), its `spill/` bounded by `spill_limit`.
fn spilling_campaign(cluster: &cluster::Cluster, spill_limit: &str) -> PathBuf {
    let file = cluster.dir.join(format!("spill-{spill_limit}.toml"));
    let off = ["network", "node", "clock", "disk"]
        .map(|kind| format!("[faults.{kind}]\nenabled = false\n"))
        .concat();
    let text = format!(
        "manifest = {:?}\nseed = 1\n[root]\nat = \"2s\"\n[search]\nslice = \"1s\"\n\
         max_depth = 3\nlive_checkpoints = 2\n\
         spill_limit = {spill_limit:?}\n{off}",
        cluster.manifest()
    );
    std::fs::write(&file, text).unwrap();
    file
}

/// Unmounts a tmpfs when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: PathBuf, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(&dir).unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes}"),
                "detvisor-test",
            ])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "mounting a tmpfs (the tests run as root)");
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A moment `spill/` cannot take, past `spill_limit` (below one
/// checkpoint) or on a disk too full for it (a small tmpfs), is let go
/// unwritten with a line saying so, and the campaign goes on to its
/// second branch and ends as a passing campaign does.
#[test]
fn test_a_moment_spill_cannot_take_is_let_go_and_the_campaign_goes_on() {
    let cluster = cluster::Cluster::new("spill", TICKING);
    let two = |file: &Path, out: &Path| {
        let (file, out) = (file.to_str().unwrap(), out.to_str().unwrap());
        let run = detvisor(&["campaign", file, "--out", out, "--branches", "2"]);
        let err = stderr(&run);
        assert_eq!(run.status.code(), Some(0), "{err}");
        assert!(err.contains("detvisor: branch 2 from"), "{err}");
        assert_eq!(spilled(&err), 0, "nothing was kept: {err}");
        err
    };
    let bounded = cluster.dir.join("bounded");
    let err = two(&spilling_campaign(&cluster, "4K"), &bounded);
    assert!(
        err.contains("WARNING: spill/ reached its bound: moment 1 takes"),
        "{err}"
    );

    // Room for the campaign's own files and not for a checkpoint.
    let used: u64 = std::fs::read_dir(bounded.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let disk = Tmpfs::mount(cluster.dir.join("tmpfs"), used + (6 << 20));
    let err = two(&spilling_campaign(&cluster, "1T"), &disk.0.join("out"));
    assert!(
        err.contains("WARNING: writing moment 1 to spill/ failed")
            && err.contains("No space left on device"),
        "{err}"
    );
}

/// The debugger at the stale-read finding, as a person and as an agent
/// would use it: its failure moment; a command, the processes and a file
/// one second before it in the old leader's node (each in a fork, from the
/// command line); then, in one library session, the same inspections and
/// a command in a branch that runs on, after which the original history's
/// digest is still the straight replay's; and a call past its budget
/// refused before it starts, naming the budget.
#[test]
fn test_the_debugger_looks_into_the_past_of_the_stale_read_without_changing_it() {
    use debugger::budget::Limits;
    use debugger::inspect::{self, Command as GuestCommand};
    use debugger::moment::MomentId;
    use debugger::session::{Session, SessionOptions};
    use debugger::source::Source;
    use run::moment::When;

    let finding = stale_finding();
    let f = finding.to_str().unwrap();
    let node = old_leader(&finding);

    // The failure moment, and the moments before it.
    let out = detvisor(&["moments", f, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let moments: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let failure = moments["moments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["kind"] == "failure")
        .expect("the failure moment")
        .clone();
    assert_eq!(failure["moment"], format!("{f}@failure"));
    let failure_ns = failure["virtual_ns"].as_u64().unwrap();
    assert!(failure_ns > 2_000_000_000, "{failure}");

    // A command 1 s before the failure, in the old leader's node.
    let before = format!("{f}@-1s");
    let out = detvisor(&[
        "exec",
        &before,
        "--node",
        &node,
        "--json",
        "--",
        "cat",
        "/proc/1/cmdline",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let exec: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert!(
        exec["stdout"].as_str().unwrap().starts_with("raftkv"),
        "{exec}"
    );
    assert_eq!(exec["at"]["moment"], before);
    // At the first exit at or after that virtual time.
    let at_ns = exec["at"]["virtual_ns"].as_u64().unwrap();
    let planned = failure_ns - 1_000_000_000;
    assert!((planned..planned + 50_000_000).contains(&at_ns), "{exec}");
    let digest_before = exec["at"]["digest"].as_str().unwrap().to_owned();
    assert!(!digest_before.is_empty(), "{exec}");
    assert!(
        exec["budget"]["session"]["virtual_time"].as_u64().unwrap() > 0,
        "{exec}"
    );

    // A call that would pass its budget is refused before it starts.
    let budget = scratch().join("tiny-budget.json");
    std::fs::write(&budget, r#"{"call_virtual": 1000000000}"#).unwrap();
    let out = detvisor(&[
        "processes",
        &before,
        "--node",
        &node,
        "--budget",
        budget.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("budget call_virtual: the call needs"), "{err}");
    assert!(err.contains("over"), "{err}");

    // One library session: inspections in forks, a command in a branch,
    // and the history it came from unchanged.
    let source = Source::open(&finding).unwrap();
    let prepared = source.finding().unwrap().finding.run.clone();
    let place = fuzzer::campaign::Place {
        host_vm: helper_vm::HostVmMode::Auto,
        seccomp: true,
    };
    // This test binary serves no calls: a helper VM runs detvisor's.
    helper_vm::client::set_serving_executable(env!("CARGO_BIN_EXE_detvisor"));
    let (mut runners, there) = fuzzer::campaign::start_runners(place, &prepared, 1, &[]).unwrap();
    let runner = runners.pop().unwrap();
    let log = scratch().join("usage.jsonl");
    let mut session = Session::new(
        source,
        Box::new(runner),
        SessionOptions {
            limits: Limits::default(),
            log: Some(log.clone()),
            ..SessionOptions::default()
        },
    )
    .with_run_as_seen(there);
    let moment: MomentId = before.parse().unwrap();
    let started = std::time::Instant::now();
    let at = session.call("rewind", |s| s.reach(&moment)).unwrap().0;
    let cold = started.elapsed();
    assert_eq!(
        at.digest, digest_before,
        "one moment, one digest, any process"
    );

    let ps = GuestCommand {
        node: Some(node.clone()),
        command: vec!["cat".into(), "/proc/1/cmdline".into()],
        timeout: inspect::DEFAULT_TIMEOUT,
        output_limit: 4096,
    };
    let started = std::time::Instant::now();
    let (executed, spent) = session
        .call("exec", |s| inspect::exec(s, &moment, &ps))
        .unwrap();
    let warm = started.elapsed();
    assert!(executed.stdout.starts_with("raftkv"), "{executed:?}");
    // From the checkpoint kept at the moment: only the command's own
    // virtual time is simulated, no replay.
    assert!(
        spent.call.virtual_time.0 < 100_000_000,
        "the exec replayed to its moment: {spent:?}"
    );
    eprintln!("reaching {moment} cold: {cold:?}; exec there with it kept: {warm:?}");

    let (listed, _) = session
        .call("processes", |s| {
            inspect::processes(s, &moment, Some(node.clone()))
        })
        .unwrap();
    assert!(
        listed
            .processes
            .iter()
            .any(|p| p.pid == 1 && p.command.first().is_some_and(|c| c.ends_with("raftkv"))),
        "{listed:?}"
    );
    let (file, _) = session
        .call("extract", |s| {
            inspect::extract(s, &moment, Some(node.clone()), "/etc/passwd", 1 << 20)
        })
        .unwrap();
    assert!(file.bytes.starts_with(b"root:x:0:0:"), "{:?}", file.bytes);
    assert_eq!(file.size, file.bytes.len() as u64);

    // A command in a branch: the nodes run while it sleeps; the branch ends
    // later, under a new id that carries the command.
    let sleep = GuestCommand {
        command: vec!["sleep".into(), "1".into()],
        ..ps.clone()
    };
    let (branched, _) = session
        .call("exec", |s| inspect::exec_in_branch(s, &moment, &sleep))
        .unwrap();
    let end = branched.end.expect("a branch's end");
    assert!(
        end.virtual_ns.0 >= at.virtual_ns.0 + 1_000_000_000,
        "{end:?}"
    );
    assert!(end.moment.to_string().contains(":exec="), "{}", end.moment);
    // Reached again from its id, the branch's end is the same machine.
    let again = session.call("rewind", |s| s.reach(&end.moment)).unwrap().0;
    assert_eq!(again.digest, end.digest);

    // The history the session looked into is unchanged: its moment's digest
    // is the one first seen, and its end is the straight replay's.
    let back = session.call("rewind", |s| s.reach(&moment)).unwrap().0;
    assert_eq!(back.digest, digest_before);
    // A moment between two exits: single steps after the moment's exit in
    // the up run (3, or the interval's last position when it is shorter,
    // which the refusal names).
    let between = |steps| {
        moment.at(When::Exit(vmm::position::InsnPosition {
            exit: back.exits,
            steps,
        }))
    };
    let steps = match session.call("rewind", |s| s.reach(&between(3))) {
        Ok(_) => 3,
        Err(error) => {
            let text = error.to_string();
            assert!(text.contains("the positions between them are"), "{text}");
            text.rsplit("+insn:")
                .next()
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        }
    };
    if steps > 0 {
        let stepped = session
            .call("rewind", |s| s.reach(&between(steps)))
            .unwrap()
            .0;
        assert_eq!((stepped.exits, stepped.insn_steps), (back.exits, steps));
        assert!(stepped
            .moment
            .to_string()
            .ends_with(&format!("+insn:{steps}")));
    }
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(finding.join("finding.json")).unwrap())
            .unwrap();
    let end_of_history = moment.at(When::Latest);
    let last = session
        .call("rewind", |s| s.reach(&end_of_history))
        .unwrap()
        .0;
    assert_eq!(last.digest, file["digest"].as_str().unwrap());
    session.close().unwrap();
    // Every call's use was logged.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.lines().count() >= 7, "{logged}");
}

/// A fix verified against the finding's unpatched control: the diff to
/// raftkv's source that makes every read verify leadership
/// (examples/raft/verify-leader.patch), built into an image by the
/// example's own script, is verified over 2 seeds (the finding's own and
/// one more); the unpatched image given as the "patch" is not.
#[test]
fn test_verify_a_source_patch_against_the_finding_s_unpatched_control() {
    let finding_dir = stale_finding();
    let finding: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(finding_dir.join("finding.json")).unwrap())
            .unwrap();
    let finding_arg = finding_dir.to_str().unwrap();

    let patched = patched_raft_image();
    let out = detvisor(&[
        "verify",
        finding_arg,
        "--image",
        patched.to_str().unwrap(),
        "--seeds",
        "2",
        "--jobs",
        "2",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "verified: {}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["verified"], true, "{report}");
    let seeds = report["seeds"].as_array().unwrap();
    assert_eq!(seeds.len(), 2, "{report}");
    // Offset 0 is the finding's own history: the control fails there with
    // the finding's digest.
    assert_eq!(seeds[0]["seeds"]["offset"], 0, "{report}");
    assert_eq!(seeds[0]["control"]["failed"], true, "{report}");
    assert_eq!(seeds[0]["control"]["digest"], finding["digest"], "{report}");
    assert_eq!(report["control_check"]["reproduced"], true, "{report}");
    for row in seeds {
        assert_eq!(row["patched"]["failed"], false, "{report}");
        assert_ne!(
            row["patched"]["digest"], row["control"]["digest"],
            "{report}"
        );
    }
    assert_eq!(report["patched"]["failed"], 0, "{report}");
    assert!(
        report["control"]["failed"].as_u64().unwrap() >= 1,
        "{report}"
    );
    let verdict = report["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("verified: patched failed 0/2"),
        "{verdict}"
    );

    // The unpatched image as the "patch": the same system, so it fails
    // where the control does.
    let unpatched = raft_image();
    let out = detvisor(&[
        "verify",
        finding_arg,
        "--image",
        unpatched.to_str().unwrap(),
        "--seeds",
        "2",
        "--jobs",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(1), "not verified: {}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("not verified: the patched system failed; patched failed "),
        "{text}"
    );
    assert!(text.contains("(reproduced)"), "{text}");
}

/// Triage across nights on the stale campaign: against an empty baseline its
/// finding is new (exit 1); `triage --known` writes the entry; then it is
/// known (exit 0), an entry for a key not found tonight is possibly fixed,
/// and `triage --ignore` updates the entry in place, the file's comments
/// kept. No guest boots: only the campaign directory is read.
#[test]
fn test_findings_against_a_baseline_fail_only_on_new_findings() {
    let dir = stale_campaign();
    let dir_text = dir.to_str().unwrap();
    let finding = stale_finding();
    let key = findings_json(&dir)
        .into_iter()
        .find(|f| f["dir"] == finding.to_str().unwrap())
        .unwrap()["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let work = out_dir("triage");
    std::fs::create_dir_all(&work).unwrap();
    let baseline = work.join("triage.toml");
    let baseline_text = baseline.to_str().unwrap();
    std::fs::write(&baseline, "").unwrap();
    let listed = |more: &[&str]| {
        let mut args = vec!["findings", dir_text, "--baseline", baseline_text];
        args.extend_from_slice(more);
        detvisor(&args)
    };
    let json_lines = |out: &std::process::Output| -> Vec<serde_json::Value> {
        stdout(out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };

    // An empty baseline: everything is new.
    let night = listed(&["--json"]);
    assert_eq!(night.status.code(), Some(1), "{}", stderr(&night));
    let lines = json_lines(&night);
    assert!(!lines.is_empty());
    assert!(lines.iter().all(|l| l["status"] == "new"), "{lines:?}");
    let text = listed(&[]);
    assert_eq!(text.status.code(), Some(1));
    assert!(stdout(&text).starts_with("new "), "{}", stdout(&text));

    let triage = |mark: &[&str]| {
        let mut args = vec!["triage", finding.to_str().unwrap()];
        args.extend_from_slice(mark);
        args.extend_from_slice(&["--into", baseline_text]);
        let triaged = detvisor(&args);
        assert_eq!(triaged.status.code(), Some(0), "{}", stderr(&triaged));
    };

    // Triaged known, and an entry for a failure not found tonight.
    triage(&["--known", "upstream #123"]);
    let mut file = std::fs::read_to_string(&baseline).unwrap();
    assert!(file.contains(&format!("[finding.\"{key}\"]")), "{file}");
    file.push_str("\n# Gone since the fix?\n[finding.\"checker:linearizability:no-such-key\"]\nstatus = \"known\"\nnote = \"fixed in #130\"\n");
    std::fs::write(&baseline, &file).unwrap();
    let morning = listed(&["--json"]);
    assert_eq!(morning.status.code(), Some(0), "{}", stderr(&morning));
    let lines = json_lines(&morning);
    let ours = lines.iter().find(|l| l["key"] == key.as_str()).unwrap();
    assert_eq!(ours["status"], "known", "{ours}");
    assert_eq!(ours["note"], "upstream #123", "{ours}");
    let fixed = lines.last().unwrap();
    assert_eq!(fixed["status"], "possibly_fixed", "{lines:?}");
    assert_eq!(fixed["key"], "checker:linearizability:no-such-key");
    let text = stdout(&listed(&[]));
    assert!(text.contains("known    0001"), "{text}");
    assert!(
        text.contains("possibly fixed checker:linearizability:no-such-key  # fixed in #130"),
        "{text}"
    );

    // Re-triaged ignored: the entry updated in place, the comment kept.
    triage(&["--ignore", "too strict", "--by", "ci"]);
    let file = std::fs::read_to_string(&baseline).unwrap();
    assert_eq!(
        file.matches(&format!("[finding.\"{key}\"]")).count(),
        1,
        "{file}"
    );
    assert!(file.contains("# Gone since the fix?"), "{file}");
    // The same campaign twice: one failure, both listed by directory.
    let twice = detvisor(&["findings", dir_text, dir_text, "--baseline", baseline_text]);
    assert_eq!(twice.status.code(), Some(0), "{}", stderr(&twice));
    let text = stdout(&twice);
    assert!(
        text.contains(&format!("ignored  {}", finding.display())),
        "{text}"
    );

    // A bad baseline is an error (2) naming its file and line.
    std::fs::write(
        &baseline,
        "[finding.\"command:a\"]\nstatus = \"knwon\"\nnote = \"\"\n",
    )
    .unwrap();
    let bad = listed(&[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains(&format!("{baseline_text}: line 2: unknown variant `knwon`")),
        "{}",
        stderr(&bad)
    );
}
