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

/// Where the shipped plan is inside the helper VM.
const SHIPPED_PLAN: &str = "/payload/files/prepared.json";

/// The manifest's guest, assembled on this host (busybox as the nodes' root).
fn prepare(dir: &Path) -> PreparedUp {
    let bin = dir.join("root/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).expect("busybox-static is installed");
    for applet in ["sh", "echo", "sleep", "ping", "nc", "true"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
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

/// The scenario itself, on a host whose KVM runs Linux.
fn scenario(prepared: PreparedUp, scratch: &Path) {
    let streams = Captured::default();
    let mut c = Controller::new();
    let options = UpOptions {
        until: Some(VirtNanos::from_secs(60)),
        stream_output: true,
        ..UpOptions::new(1)
    };
    let run = started(
        c.handle(Request::BootUp { prepared, options }, &streams)
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
                &streams,
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
    let at = at.expect("the workload started");
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
            let args: Vec<OsString> = [TEST_NAME, "--exact", "--nocapture", "--test-threads=1"]
                .into_iter()
                .map(OsString::from)
                .collect();
            let exe = std::env::current_exe().unwrap();
            let status = helper_vm::run(&config, &exe, &args, &files).unwrap();
            assert_eq!(status, 0, "the scenario failed inside the helper VM");
        }
    }
}
