//! The run library driven as a campaign engine or a server would: no CLI,
//! no subprocess, one `Controller` answering typed requests. An `up` run of
//! two nodes is booted, run to its workload's start and checkpointed; from
//! that moment it is run on plainly, with a partition injected, re-keyed,
//! reset again, and snapshotted and restored, and each outcome is read.
//!
//! Where this host's KVM cannot run Linux, the guest is assembled here and
//! this same test binary runs inside the helper VM, where KVM can, on the
//! shipped files (the only process boundary is the helper VM's).

use run::api::{CheckpointId, Controller, Position, Request, Response, RunId, Until};
use run::faults::Fault;
use run::inspect::{ExecMode, ExecOutcome, ExecRequest, ExitStatus, NodeState};
use run::manifest;
use run::moment::Moment;
use run::streams::Captured;
use run::up::{Initrd, PreparedUp, UpOptions};
use run::RunSummary;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use vmm::VirtNanos;

const TEST_NAME: &str =
    "test_the_run_library_boots_checkpoints_injects_a_fault_branches_and_reads_outcomes";

/// The workload in n2 pings n1 a second after it starts: it exits 3 when n1
/// answers, 1 when it cannot be reached.
const TWO_NODES: &str = r#"
[network]
latency = "1ms..3ms"

[[node]]
name = "n1"
rootfs = "root"
command = ["sh", "-c", "while true; do echo pong | nc -l -p 7000; done"]

[[node]]
name = "n2"
rootfs = "root"
command = ["sh", "-c", "while true; do sleep 1; done"]

[workload]
node = "n2"
command = ["sh", "-c", "sleep 1; if ping -c 1 -w 2 192.0.2.1; then echo reached n1; exit 3; fi; echo n1 unreachable; exit 1"]
"#;

/// A file of the nodes' root, read back through the agent.
const MOTD: &str = "a file in the nodes' root\n";

/// Where the shipped plan is inside the helper VM.
const SHIPPED_PLAN: &str = "/payload/files/prepared.json";

/// The manifest's guest, assembled on this host (busybox as the nodes' root).
fn prepare(dir: &Path) -> PreparedUp {
    let bin = dir.join("root/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).expect("busybox-static is installed");
    for applet in ["sh", "echo", "sleep", "ping", "nc", "true", "hostname"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    std::fs::create_dir_all(dir.join("root/etc")).unwrap();
    std::fs::write(dir.join("root/etc/motd"), MOTD).unwrap();
    let manifest = manifest::parse(TWO_NODES, dir).unwrap();
    run::up::prepare(&manifest, &[], None, None).unwrap()
}

fn started(response: Response) -> RunId {
    match response {
        Response::Started { run, .. } => run,
        other => panic!("expected a started run, got {other:?}"),
    }
}

fn position(response: Response) -> Position {
    match response {
        Response::Position(position) => position,
        other => panic!("expected a position, got {other:?}"),
    }
}

fn summary(response: Response) -> RunSummary {
    match response {
        Response::Summary(summary) => summary,
        other => panic!("expected a summary, got {other:?}"),
    }
}

/// Runs `run` to its end and reads its outcome.
fn to_the_end(c: &mut Controller, streams: &Captured, run: RunId) -> RunSummary {
    let end = position(
        c.handle(
            Request::RunUntil {
                run,
                until: Until::End,
            },
            streams,
        )
        .unwrap(),
    );
    assert!(end.stop.is_some(), "the run stopped: {end:?}");
    summary(c.handle(Request::Outcome { run }, streams).unwrap())
}

fn reset(c: &mut Controller, streams: &Captured, run: RunId, checkpoint: CheckpointId) -> Position {
    position(
        c.handle(Request::Reset { run, checkpoint }, streams)
            .unwrap(),
    )
}

/// Boots the two nodes and runs them to the workload's start.
fn boot_to_the_workload(
    c: &mut Controller,
    streams: &Captured,
    prepared: PreparedUp,
) -> (RunId, Position) {
    let options = UpOptions {
        until: Some(VirtNanos::from_secs(60)),
        stream_output: true,
        ..UpOptions::new(1)
    };
    let run = started(
        c.handle(Request::BootUp { prepared, options }, streams)
            .unwrap(),
    );

    // To the workload's start, a few exits at a time (with the clock page
    // the workload needs only tens of exits to run to its end).
    let mut at = None;
    for _ in 0..200_000 {
        let p = position(
            c.handle(
                Request::RunUntil {
                    run,
                    until: Until::Steps(4),
                },
                streams,
            )
            .unwrap(),
        );
        assert!(
            p.stop.is_none(),
            "the run ended before its workload started: {:?}\n{}",
            p.stop,
            streams.stderr_text()
        );
        if streams
            .stderr_text()
            .contains("workload started in node n2")
        {
            at = Some(p);
            break;
        }
    }
    (run, at.expect("the workload started"))
}

/// The scenario itself, on a host whose KVM runs Linux.
fn scenario(prepared: PreparedUp, scratch: &Path) {
    let streams = Captured::default();
    let mut c = Controller::new();
    let (run, at) = boot_to_the_workload(&mut c, &streams, prepared);
    let checkpoint = match c.handle(Request::Checkpoint { run }, &streams).unwrap() {
        Response::Checkpoint {
            checkpoint,
            position,
        } => {
            assert_eq!(position, at);
            checkpoint
        }
        other => panic!("expected a checkpoint, got {other:?}"),
    };

    // 1. The history as it goes, its output collected as records too.
    c.handle(Request::CollectRecords { run }, &streams).unwrap();
    let straight = to_the_end(&mut c, &streams, run);
    assert_eq!(straight.exit_status, Some(3), "{}", streams.stdout_text());
    assert!(streams.stdout_text().contains("reached n1"));
    let records = match c.handle(Request::TakeRecords { run }, &streams).unwrap() {
        Response::Records { records } => records,
        other => panic!("expected records, got {other:?}"),
    };
    let workload: String = records
        .iter()
        .filter_map(|r| match &r.body {
            run::records::RecordBody::Output { log, text, .. } if log == "workload" => {
                Some(text.as_str())
            }
            _ => None,
        })
        .collect();
    assert!(workload.contains("reached n1"), "{records:?}");

    // 2. Back to the checkpoint, n1 cut off 1 ms later: the workload cannot
    //    reach it, and says so with its status.
    assert_eq!(reset(&mut c, &streams, run, checkpoint), at);
    let cut = format!("at={}ns partition n1 | n2", at.virtual_ns.0 + 1_000_000);
    let fault: Fault = cut.parse().unwrap();
    c.handle(Request::InjectFault { run, fault }, &streams)
        .unwrap();
    let partitioned = to_the_end(&mut c, &streams, run);
    assert_eq!(partitioned.exit_status, Some(1));
    assert!(streams.stdout_text().contains("n1 unreachable"));
    assert_ne!(partitioned.digest, straight.digest);
    assert!(streams.stderr_text().contains("fault: partition n1 | n2"));

    // 3. Re-keyed: another history of the same control flow's start.
    reset(&mut c, &streams, run, checkpoint);
    c.handle(Request::Rekey { run, seed: 2 }, &streams).unwrap();
    let rekeyed = to_the_end(&mut c, &streams, run);
    assert_eq!(rekeyed.seed, 2);
    assert_ne!(rekeyed.digest, straight.digest);

    // 4. Reset again (which undoes the re-keying too), nothing changed:
    //    exactly the straight history.
    reset(&mut c, &streams, run, checkpoint);
    let again = to_the_end(&mut c, &streams, run);
    assert_eq!(again.seed, 1);
    assert_eq!(again.digest, straight.digest);
    assert_eq!(again.exits, straight.exits);

    // 5. A snapshot of the checkpointed moment, restored as a second run,
    //    goes on to the straight history too.
    reset(&mut c, &streams, run, checkpoint);
    let dir = scratch.join("snaps");
    let row = match c
        .handle(
            Request::Snapshot {
                run,
                dir: dir.clone(),
            },
            &streams,
        )
        .unwrap()
    {
        Response::Snapshot(row) => row,
        other => panic!("expected a snapshot, got {other:?}"),
    };
    assert_eq!(row.exit_index, at.exits);
    let moment = Moment::Snapshot(dir.join(&row.id));
    let restored = started(
        c.handle(
            Request::Restore {
                moment,
                until: None,
                stall_timeout: Default::default(),
                stream_output: true,
            },
            &streams,
        )
        .unwrap(),
    );
    assert_ne!(restored, run);
    let from_snapshot = to_the_end(&mut c, &streams, restored);
    assert_eq!(from_snapshot.digest, straight.digest);

    // Bad input is a named error, never a panic.
    c.handle(Request::Close { run }, &streams).unwrap();
    let error = c
        .handle(
            Request::RunUntil {
                run,
                until: Until::End,
            },
            &streams,
        )
        .unwrap_err();
    assert!(error.to_string().contains("no run"), "{error}");
    let error = c
        .handle(
            Request::InjectFault {
                run: restored,
                fault: "at=0s pause n1".parse().unwrap(),
            },
            &streams,
        )
        .unwrap_err();
    assert!(
        error.to_string().contains("before the run's present"),
        "{error}"
    );
}

#[test]
fn test_the_run_library_boots_checkpoints_injects_a_fault_branches_and_reads_outcomes() {
    on_a_guest(TEST_NAME, scenario);
}

#[test]
fn test_a_held_up_run_is_looked_into_and_acted_in_without_changing_its_history() {
    on_a_guest(INSPECT_TEST_NAME, inspect_scenario);
}

/// Runs `scenario` where this host's KVM can run the guest: here, or
/// inside the helper VM (this test binary again, running only `test_name`).
fn on_a_guest(test_name: &str, scenario: fn(PreparedUp, &Path)) {
    let scratch = tempfile::tempdir().unwrap();
    if Path::new(SHIPPED_PLAN).is_file() {
        // Inside the helper VM, on the files shipped below.
        let plan = std::fs::read(SHIPPED_PLAN).unwrap();
        return scenario(serde_json::from_slice(&plan).unwrap(), scratch.path());
    }
    let prepared = prepare(scratch.path());
    match helper_vm::placement(helper_vm::HostVmMode::Auto) {
        helper_vm::Placement::Host => scenario(prepared, scratch.path()),
        helper_vm::Placement::HelperVm { reason } => {
            eprintln!("running the scenario inside the helper VM: {reason}");
            let Initrd::Bytes(initrd) = &prepared.initrd else {
                panic!("a prepared guest's initrd is in memory")
            };
            let initrd_file = scratch.path().join("initrd");
            std::fs::write(&initrd_file, initrd).unwrap();
            let shipped = |name: &str| PathBuf::from(helper_vm::payload_path(name));
            let mut inside = prepared.clone();
            inside.kernel = shipped("vmlinux");
            inside.initrd = Initrd::File(shipped("initrd"));
            let plan_file = scratch.path().join("prepared.json");
            std::fs::write(&plan_file, serde_json::to_vec(&inside).unwrap()).unwrap();
            let file = |host_path: &Path, name: &str| helper_vm::PayloadFile {
                host_path: host_path.to_path_buf(),
                payload_name: name.into(),
            };
            let files = [
                file(&prepared.kernel, "vmlinux"),
                file(&initrd_file, "initrd"),
                file(&plan_file, "prepared.json"),
            ];
            let config = helper_vm::HelperVmConfig {
                assets_dir: helper_vm::ensure_assets(None).unwrap(),
                memory_mib: 3072,
                ..helper_vm::HelperVmConfig::default()
            };
            let args: Vec<OsString> = [test_name, "--exact", "--nocapture", "--test-threads=1"]
                .into_iter()
                .map(OsString::from)
                .collect();
            let exe = std::env::current_exe().unwrap();
            let status = helper_vm::run(&config, &exe, &args, &files).unwrap();
            assert_eq!(status, 0, "the scenario failed inside the helper VM");
        }
    }
}

const INSPECT_TEST_NAME: &str =
    "test_a_held_up_run_is_looked_into_and_acted_in_without_changing_its_history";

/// A command to run in the held run.
fn command(node: Option<&str>, argv: &[&str], mode: ExecMode, timeout_secs: u64) -> ExecRequest {
    ExecRequest {
        node: node.map(str::to_string),
        command: argv.iter().map(|a| a.to_string()).collect(),
        env: Default::default(),
        mode,
        timeout: VirtNanos::from_secs(timeout_secs),
        output_limit: 1 << 16,
    }
}

/// Looking into a held run (frozen: commands, files, processes, the
/// machine) and resetting leaves its history as it was; a live command
/// advances it.
fn inspect_scenario(prepared: PreparedUp, _scratch: &Path) {
    let streams = Captured::default();
    let mut c = Controller::new();
    let (run, at) = boot_to_the_workload(&mut c, &streams, prepared);

    // The history without any of it.
    let (checkpoint, _) = c_checkpoint(&mut c, &streams, run);
    let straight = to_the_end(&mut c, &streams, run);
    assert_eq!(straight.exit_status, Some(3), "{}", streams.stdout_text());
    assert_eq!(reset(&mut c, &streams, run, checkpoint), at);
    let c = &mut c;
    let wall = std::time::Instant::now();

    // A frozen command in n1 sees that node (its hostname, its root).
    let hostname = exec_ok(
        c,
        &streams,
        run,
        command(Some("n1"), &["hostname"], ExecMode::Frozen, 10),
    );
    assert_eq!(hostname.stdout, b"n1\n");
    assert_eq!(hostname.status, ExitStatus::Code(0));
    assert!(!hostname.timed_out && !hostname.stdout_truncated);
    assert_eq!(hostname.started, at);
    assert!(hostname.position.exits > at.exits);

    // Output past the limit is cut and said so; stderr is its own stream.
    let mut loud = command(
        Some("n2"),
        &["sh", "-c", "echo 0123456789; echo oops >&2; exit 4"],
        ExecMode::Frozen,
        10,
    );
    loud.output_limit = 4;
    let loud = exec_ok(c, &streams, run, loud);
    assert_eq!(loud.stdout, b"0123");
    assert!(loud.stdout_truncated);
    assert_eq!(loud.stderr, b"oops");
    assert!(loud.stderr_truncated, "5 bytes with the newline");
    assert_eq!(loud.status, ExitStatus::Code(4));

    // A command past its timeout is killed, in virtual time.
    let slow = exec_ok(
        c,
        &streams,
        run,
        command(Some("n1"), &["sleep", "30"], ExecMode::Frozen, 1),
    );
    assert!(slow.timed_out);
    assert_eq!(slow.status, ExitStatus::Signal(9));
    let took = slow.position.virtual_ns.0 - slow.started.virtual_ns.0;
    assert!((1_000_000_000..5_000_000_000).contains(&took), "{took} ns");

    // A command that does not exist fails, naming it.
    let error = exec_err(
        c,
        &streams,
        run,
        command(Some("n1"), &["no-such-command"], ExecMode::Frozen, 10),
    );
    assert!(error.contains("no-such-command"), "{error}");

    // A node's file, whole and cut; a missing one names its path.
    let (bytes, size, truncated) = read_ok(c, &streams, run, Some("n1"), "/etc/motd", 1 << 20);
    assert_eq!(bytes, MOTD.as_bytes());
    assert_eq!((size, truncated), (MOTD.len() as u64, false));
    let (bytes, size, truncated) = read_ok(c, &streams, run, Some("n2"), "/etc/motd", 6);
    assert_eq!(bytes, &MOTD.as_bytes()[..6]);
    assert_eq!((size, truncated), (MOTD.len() as u64, true));
    let missing = c
        .handle(
            Request::ReadFile {
                run,
                node: Some("n1".into()),
                path: "/etc/nothing-here".into(),
                limit: 10,
            },
            &streams,
        )
        .unwrap_err()
        .to_string();
    assert!(missing.contains("/etc/nothing-here"), "{missing}");
    let directory = c
        .handle(
            Request::ReadFile {
                run,
                node: Some("n1".into()),
                path: "/etc".into(),
                limit: 10,
            },
            &streams,
        )
        .unwrap_err()
        .to_string();
    assert!(directory.contains("\"/etc\" is a directory"), "{directory}");

    // n1's processes, as its PID namespace sees them: its command is PID 1.
    let processes = match c
        .handle(
            Request::Processes {
                run,
                node: Some("n1".into()),
            },
            &streams,
        )
        .unwrap()
    {
        Response::Processes { processes, .. } => processes,
        other => panic!("expected processes, got {other:?}"),
    };
    let init = processes.iter().find(|p| p.pid == 1).expect("a PID 1");
    assert_eq!(
        init.command,
        ["sh", "-c", "while true; do echo pong | nc -l -p 7000; done"],
        "{processes:?}"
    );
    assert_eq!((init.ppid, init.state), (0, 'T'), "paused: {processes:?}");

    // An unknown node names the nodes there are.
    let unknown = exec_err(
        c,
        &streams,
        run,
        command(Some("n9"), &["true"], ExecMode::Frozen, 1),
    );
    assert!(
        unknown.contains("no node \"n9\" in this run (its nodes: n1, n2)"),
        "{unknown}"
    );

    // The machine: registers, devices, both nodes paused.
    let report = match c.handle(Request::Inspect { run }, &streams).unwrap() {
        Response::Inspect(report) => report,
        other => panic!("expected a report, got {other:?}"),
    };
    assert_ne!(report.registers.rip, 0);
    assert!(
        report.devices.iter().any(|d| d.name == "switch"),
        "{report:?}"
    );
    let states: Vec<_> = report
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n.state))
        .collect();
    assert_eq!(
        states,
        [("n1", NodeState::Paused), ("n2", NodeState::Paused)]
    );
    assert!(report.conductor_held);
    let live = exec_err(
        c,
        &streams,
        run,
        command(None, &["true"], ExecMode::Live, 1),
    );
    assert!(live.contains("was frozen for an inspection"), "{live}");
    eprintln!(
        "looked into the run for {:.1} s (wall), {} exits",
        wall.elapsed().as_secs_f64(),
        report.position.exits - at.exits
    );

    // Back to the checkpoint: the history goes on exactly as it did.
    assert_eq!(reset(c, &streams, run, checkpoint), at);
    let again = to_the_end(c, &streams, run);
    assert_eq!(again.digest, straight.digest);
    assert_eq!(again.exits, straight.exits);
    assert_eq!(again.exit_status, Some(3));

    // A live command runs in the history: the nodes go on, time advances.
    reset(c, &streams, run, checkpoint);
    let live = exec_ok(
        c,
        &streams,
        run,
        command(None, &["true"], ExecMode::Live, 10),
    );
    assert_eq!(live.status, ExitStatus::Code(0));
    assert!(
        live.position.virtual_ns > live.started.virtual_ns,
        "{live:?}"
    );
    assert!(live.position.exits > live.started.exits);
    let report = match c.handle(Request::Inspect { run }, &streams).unwrap() {
        Response::Inspect(report) => report,
        other => panic!("expected a report, got {other:?}"),
    };
    assert!(!report.conductor_held);
    assert!(
        report.nodes.iter().all(|n| n.state == NodeState::Running),
        "{report:?}"
    );
    let after_live = to_the_end(c, &streams, run);
    assert_eq!(after_live.exit_status, Some(3));
    // The digest sees what a command did: the one compared above would
    // have told a look that changed the history.
    assert_ne!(after_live.digest, straight.digest);
}

fn c_checkpoint(c: &mut Controller, streams: &Captured, run: RunId) -> (CheckpointId, Position) {
    match c.handle(Request::Checkpoint { run }, streams).unwrap() {
        Response::Checkpoint {
            checkpoint,
            position,
        } => (checkpoint, position),
        other => panic!("expected a checkpoint, got {other:?}"),
    }
}

fn exec_ok(c: &mut Controller, streams: &Captured, run: RunId, exec: ExecRequest) -> ExecOutcome {
    match c.handle(Request::Exec { run, exec }, streams) {
        Ok(Response::Exec(outcome)) => outcome,
        other => panic!("expected an exec outcome, got {other:?}"),
    }
}

fn exec_err(c: &mut Controller, streams: &Captured, run: RunId, exec: ExecRequest) -> String {
    match c.handle(Request::Exec { run, exec }, streams) {
        Err(error) => format!("{:#}", anyhow::Error::from(error)),
        other => panic!("expected an error, got {other:?}"),
    }
}

fn read_ok(
    c: &mut Controller,
    streams: &Captured,
    run: RunId,
    node: Option<&str>,
    path: &str,
    limit: u64,
) -> (Vec<u8>, u64, bool) {
    let request = Request::ReadFile {
        run,
        node: node.map(str::to_string),
        path: path.into(),
        limit,
    };
    match c.handle(request, streams) {
        Ok(Response::File {
            bytes,
            size,
            truncated,
            ..
        }) => (bytes, size, truncated),
        other => panic!("expected a file, got {other:?}"),
    }
}
