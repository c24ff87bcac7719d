//! The tree of checkpoints, through the run library's requests: a run whose
//! workload writes memory as it goes is checkpointed at three moments (A;
//! B further on; C on another branch, after a reset to A and a re-key),
//! each moment also written as a snapshot. The run is then reset among the
//! three in several orders, run a few exits on from each, and every outcome
//! (digest, memory digest, exits, time) is compared with that of a run
//! restored separately from the moment's snapshot: the in-place moves, and
//! the memory digest kept up to date from changed pages, agree with whole
//! restores and whole-RAM hashes. Two moments are then spilled to disk
//! (`Spill`: B full, C incremental over it) and loaded back in place
//! (`LoadInPlace`) from elsewhere in the tree: each comes back with the
//! moment's digest and runs on exactly as the restored run, and the live
//! checkpoints stay exact around the loads.
//!
//! Where this host's KVM cannot run Linux, this test binary runs itself
//! inside the helper VM on the shipped files, as run/tests/library.rs does.

use run::api::{CheckpointId, Controller, Position, Request, Response, RunId, Until};
use run::manifest;
use run::moment::Moment;
use run::streams::Captured;
use run::up::{Initrd, PreparedUp, UpOptions};
use run::RunSummary;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use vmm::VirtNanos;

const TEST_NAME: &str =
    "test_resets_among_three_checkpoints_in_any_order_match_separately_restored_runs";

/// The workload fills a fresh 64 KiB file in /tmp (tmpfs: guest RAM) with
/// random bytes every 50 ms, so every moment's RAM differs.
const ONE_NODE: &str = r#"
[[node]]
name = "n1"
rootfs = "root"
command = ["sh", "-c", "while true; do sleep 1; done"]

[workload]
node = "n1"
command = ["sh", "-c", "i=0; while [ $i -lt 60 ]; do dd if=/dev/urandom of=/tmp/f$i bs=4096 count=16 2>/dev/null; i=$((i+1)); sleep 0.05; done; echo wrote; exit 7"]
"#;

/// Where the shipped plan is inside the helper VM.
const SHIPPED_PLAN: &str = "/payload/files/prepared.json";

/// Exits run on from a moment before its outcome is read.
const ON: u64 = 6;

fn prepare(dir: &Path) -> PreparedUp {
    let bin = dir.join("root/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).expect("busybox-static is installed");
    for applet in ["sh", "echo", "sleep", "dd", "true"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let manifest = manifest::parse(ONE_NODE, dir).unwrap();
    run::up::prepare(&manifest, &[], None, None).unwrap()
}

fn position(response: Response) -> Position {
    match response {
        Response::Position(position) => position,
        other => panic!("expected a position, got {other:?}"),
    }
}

fn started(response: Response) -> RunId {
    match response {
        Response::Started { run, .. } => run,
        other => panic!("expected a started run, got {other:?}"),
    }
}

/// What is compared of an outcome (not wall times).
#[derive(Debug, PartialEq, Eq, Clone)]
struct Seen {
    at: Position,
    digest: String,
    memory: String,
    exits: u64,
    virtual_ns: VirtNanos,
    seed: u64,
}

struct Run<'a> {
    c: &'a mut Controller,
    streams: &'a Captured,
    run: RunId,
}

impl Run<'_> {
    fn ask(&mut self, request: Request) -> Response {
        self.c
            .handle(request, self.streams)
            .unwrap_or_else(|e| panic!("{e:#}\n{}", self.streams.stderr_text()))
    }

    fn steps(&mut self, n: u64) -> Position {
        let run = self.run;
        position(self.ask(Request::RunUntil {
            run,
            until: Until::Steps(n),
        }))
    }

    fn checkpoint(&mut self) -> (CheckpointId, Position) {
        let run = self.run;
        match self.ask(Request::Checkpoint { run }) {
            Response::Checkpoint {
                checkpoint,
                position,
            } => (checkpoint, position),
            other => panic!("expected a checkpoint, got {other:?}"),
        }
    }

    fn reset(&mut self, checkpoint: CheckpointId) -> Position {
        let run = self.run;
        position(self.ask(Request::Reset { run, checkpoint }))
    }

    fn snapshot(&mut self, dir: &Path) -> Moment {
        let run = self.run;
        match self.ask(Request::Snapshot {
            run,
            dir: dir.to_path_buf(),
        }) {
            Response::Snapshot(row) => Moment::Snapshot(dir.join(&row.id)),
            other => panic!("expected a snapshot, got {other:?}"),
        }
    }

    /// `ON` exits on, then the outcome.
    fn on_and_outcome(&mut self) -> Seen {
        let at = self.steps(ON);
        let run = self.run;
        let summary: RunSummary = match self.ask(Request::Outcome { run }) {
            Response::Summary(summary) => summary,
            other => panic!("expected a summary, got {other:?}"),
        };
        // The final hash's cost: a whole scan for a restored run, the pages
        // changed since the previous digest for one moved in place.
        eprintln!(
            "outcome of {:?} at exit {}: finishing took {} ms",
            self.run, at.exits, summary.wall_finish_ms
        );
        Seen {
            at,
            digest: summary.digest,
            memory: summary.digest_parts.memory,
            exits: summary.exits,
            virtual_ns: summary.virtual_ns,
            seed: summary.seed,
        }
    }

    /// Writes the present to `dir` as `id` (over `parent`); its path.
    fn spill(&mut self, dir: &Path, id: &str, parent: Option<&str>) -> PathBuf {
        let run = self.run;
        let started = std::time::Instant::now();
        let row = match self.ask(Request::Spill {
            run,
            dir: dir.to_path_buf(),
            id: id.into(),
            parent: parent.map(str::to_owned),
        }) {
            Response::Snapshot(row) => row,
            other => panic!("expected a snapshot, got {other:?}"),
        };
        eprintln!(
            "spill {id}: {} ms, incremental {}, {} pages stored",
            started.elapsed().as_millis(),
            row.incremental,
            row.memory_pages_stored
        );
        dir.join(id)
    }

    fn load(&mut self, dir: &Path) -> Position {
        let run = self.run;
        let started = std::time::Instant::now();
        match self.ask(Request::LoadInPlace {
            run,
            dir: dir.to_path_buf(),
        }) {
            Response::Loaded { position, stats } => {
                eprintln!(
                    "load {}: {} ms, {stats:?}",
                    dir.display(),
                    started.elapsed().as_millis()
                );
                position
            }
            other => panic!("expected a load, got {other:?}"),
        }
    }

    fn digest(&mut self) -> String {
        let run = self.run;
        match self.ask(Request::Outcome { run }) {
            Response::Summary(summary) => summary.digest,
            other => panic!("expected a summary, got {other:?}"),
        }
    }

    fn memory(&mut self, request: Request) -> vmm::vm::CheckpointMemory {
        match self.ask(request) {
            Response::CheckpointMemory(memory) => memory,
            other => panic!("expected checkpoint memory, got {other:?}"),
        }
    }
}

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
    let mut r = Run {
        c: &mut c,
        streams: &streams,
        run,
    };
    let mut started = false;
    for _ in 0..200_000 {
        let p = r.steps(4);
        assert!(p.stop.is_none(), "ended early: {}", streams.stderr_text());
        if streams
            .stderr_text()
            .contains("workload started in node n1")
        {
            started = true;
            break;
        }
    }
    assert!(started, "the workload started");

    // A, B on from it, and C on another branch from A.
    let mut moments: BTreeMap<&str, (CheckpointId, Position, Moment)> = BTreeMap::new();
    r.steps(4);
    let (a, at_a) = r.checkpoint();
    moments.insert("A", (a, at_a, r.snapshot(&scratch.join("a"))));
    r.steps(12);
    let (b, at_b) = r.checkpoint();
    moments.insert("B", (b, at_b, r.snapshot(&scratch.join("b"))));
    assert_eq!(r.reset(a), at_a);
    r.ask(Request::Rekey { run, seed: 2 });
    r.steps(12);
    let (c_id, at_c) = r.checkpoint();
    moments.insert("C", (c_id, at_c, r.snapshot(&scratch.join("c"))));
    assert_eq!(at_b.exits, at_c.exits);
    let memory = r.memory(Request::CheckpointMemory { run });
    assert_eq!(memory.checkpoints, 3);
    eprintln!("checkpoint memory: {memory:?}");

    // Each moment as a separately restored run.
    let mut expected: BTreeMap<&str, Seen> = BTreeMap::new();
    for (&name, (_, at, moment)) in &moments {
        let restored = started_run(r.ask(Request::Restore {
            moment: moment.clone(),
            until: None,
            stall_timeout: Default::default(),
            stream_output: true,
        }));
        let mut other = Run {
            c: &mut *r.c,
            streams: &streams,
            run: restored,
        };
        let seen = other.on_and_outcome();
        assert_eq!(seen.at.exits, at.exits + ON, "{name}");
        other.ask(Request::Close { run: restored });
        expected.insert(name, seen);
    }
    assert_ne!(expected["A"].digest, expected["B"].digest);
    assert_ne!(expected["B"].digest, expected["C"].digest);
    assert_ne!(expected["B"].memory, expected["C"].memory);
    assert_eq!(expected["C"].seed, 2);

    // In place, in several orders (each move from wherever the previous
    // one left the run, ON exits past a moment).
    for name in ["A", "C", "B", "A", "C", "B", "B", "C", "A", "B"] {
        let (id, at, _) = &moments[name];
        assert_eq!(r.reset(*id), *at, "reset to {name}");
        let seen = r.on_and_outcome();
        assert_eq!(seen, expected[name], "{name} in place vs restored");
    }

    // Spilled to disk (B full, C over it) and loaded back in place from
    // elsewhere: the moment's digest, then the restored run's outcome; the
    // live checkpoints stay exact around the loads.
    let spill_dir = scratch.join("spill");
    let (b_id, at_b, _) = moments["B"].clone();
    let (c_id, at_c, _) = moments["C"].clone();
    r.reset(b_id);
    let b_digest = r.digest();
    let b_file = r.spill(&spill_dir, "b", None);
    r.reset(c_id);
    let c_digest = r.digest();
    let c_file = r.spill(&spill_dir, "c", Some("b"));
    for (name, file, at, digest) in [
        ("C", &c_file, at_c, &c_digest),
        ("B", &b_file, at_b, &b_digest),
        ("C", &c_file, at_c, &c_digest),
    ] {
        let (a_id, _, _) = moments["A"];
        r.reset(a_id);
        r.steps(ON);
        assert_eq!(r.load(file), at, "{name} loaded");
        assert_eq!(&r.digest(), digest, "{name} loaded: the moment's digest");
        assert_eq!(r.on_and_outcome(), expected[name], "{name} loaded, on");
        for other in ["A", "B", "C"] {
            let (id, _, _) = &moments[other];
            r.reset(*id);
            assert_eq!(r.on_and_outcome(), expected[other], "{other} after a load");
        }
    }

    // Dropping B: refused from then on, the others still exact.
    let before = r.memory(Request::CheckpointMemory { run });
    let after = r.memory(Request::DropCheckpoint { run, checkpoint: b });
    assert_eq!(after.checkpoints, 2);
    assert!(after.pages <= before.pages);
    let error =
        r.c.handle(Request::Reset { run, checkpoint: b }, &streams)
            .unwrap_err();
    assert!(error.to_string().contains("no checkpoint"), "{error}");
    for name in ["C", "A"] {
        let (id, _, _) = &moments[name];
        r.reset(*id);
        assert_eq!(
            r.on_and_outcome(),
            expected[name],
            "{name} after dropping B"
        );
    }
    // B back from disk, kept again (as a campaign does): exact.
    assert_eq!(r.load(&b_file), at_b);
    let (b_again, _) = r.checkpoint();
    for name in ["A", "B", "C", "B"] {
        let id = if name == "B" {
            b_again
        } else {
            moments[name].0
        };
        r.reset(id);
        assert_eq!(r.on_and_outcome(), expected[name], "{name}, B from disk");
    }
    let after = r.memory(Request::CheckpointMemory { run });

    // A budget below what is held refuses the next checkpoint, naming it.
    r.memory(Request::CheckpointBudget {
        run,
        bytes: Some(after.bytes),
    });
    r.steps(12);
    let error =
        r.c.handle(Request::Checkpoint { run }, &streams)
            .unwrap_err();
    assert!(format!("{error:#}").contains("budget"), "{error:#}");
}

fn started_run(response: Response) -> RunId {
    started(response)
}

#[test]
fn test_resets_among_three_checkpoints_in_any_order_match_separately_restored_runs() {
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
