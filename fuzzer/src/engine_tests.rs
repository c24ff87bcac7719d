//! The search loop driven against a simulated run (no VM): a history whose
//! records and digest are a function of its path, failing when a `pause`
//! fault is in it. What a real guest does is tested end to end (tests/).

use super::*;
use crate::judge::Verdict;
use run::api::{CheckpointId, Request, Response, RunId, Until};
use run::faults::Fault;
use run::records::{GuestRecord, RecordBody};
use run::up::UpEvent;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use vmm::VirtNanos;

/// A run's whole state: the time, and what was done to it, in order.
#[derive(Clone, Debug, Default, Hash, serde::Serialize, serde::Deserialize)]
struct SimState {
    now: u64,
    events: Vec<String>,
}

#[derive(Default)]
struct Sim {
    state: SimState,
    checkpoints: BTreeMap<u64, SimState>,
    next: u64,
    records: Vec<GuestRecord>,
    /// Requests answered (for counting resets and replays).
    calls: Arc<Mutex<Vec<String>>>,
    /// Wall time each run request takes (to be killed in the middle of).
    delay: Option<std::time::Duration>,
    /// Seeds a random wall time (0..4 ms) for each run request: workers
    /// that finish in their own order.
    jitter: Option<u64>,
    /// Something done at boot that no other worker does (a run that is
    /// not deterministic).
    boot_salt: Option<String>,
}

fn record(at: u64, json: serde_json::Value) -> GuestRecord {
    GuestRecord {
        exit: at / 1_000,
        virtual_ns: vmm::VirtNanos(at),
        node: None,
        body: RecordBody::Sdk { json },
    }
}

/// A chunk of node `n1`'s output.
fn output(at: u64, text: &str) -> GuestRecord {
    serde_json::from_value(serde_json::json!({
        "exit": at / 1_000, "virtual_ns": at, "node": "n1",
        "body": {"kind": "output", "log": "n1", "stream": "stdout", "text": text},
    }))
    .expect("an output record")
}

impl Sim {
    /// Every checkpoint holds 1000 bytes.
    fn memory(&self) -> vmm::vm::CheckpointMemory {
        vmm::vm::CheckpointMemory {
            checkpoints: self.checkpoints.len() as u64,
            bytes: 1000 * self.checkpoints.len() as u64,
            ..Default::default()
        }
    }

    fn position(&self) -> Position {
        Position {
            exits: self.state.now / 1_000,
            virtual_ns: vmm::VirtNanos(self.state.now),
            insn_steps: 0,
            stop: None,
        }
    }
}

impl Runner for Sim {
    fn call(&mut self, request: Request) -> std::result::Result<Response, String> {
        let name = format!("{request:?}");
        self.calls
            .lock()
            .unwrap()
            .push(name.split_whitespace().next().unwrap_or("").to_string());
        Ok(match request {
            Request::BootUp { .. } => {
                self.state = SimState::default();
                self.state.events.extend(self.boot_salt.clone());
                Response::Started {
                    run: RunId(1),
                    position: self.position(),
                }
            }
            Request::CollectRecords { .. } => Response::Position(self.position()),
            Request::RunUntil { until, .. } => {
                let Until::Time(t) = until else {
                    return Err("only times".into());
                };
                if let Some(delay) = self.delay {
                    std::thread::sleep(delay);
                }
                if let Some(jitter) = &mut self.jitter {
                    *jitter = jitter.wrapping_mul(6364136223846793005).wrapping_add(1);
                    std::thread::sleep(std::time::Duration::from_micros((*jitter >> 33) % 4_000));
                }
                // Time moves in whole milliseconds, like exits.
                let target = t.0.div_ceil(1_000_000) * 1_000_000;
                while self.state.now < target {
                    self.state.now += 1_000_000;
                    if self.state.now == 1_000_000_000 {
                        self.records.push(GuestRecord {
                            body: RecordBody::Event {
                                event: UpEvent::SetupComplete,
                            },
                            ..record(self.state.now, serde_json::Value::Null)
                        });
                    }
                    if self.state.now.is_multiple_of(250_000_000) {
                        self.records.push(GuestRecord {
                            node: Some("n1".into()),
                            ..output(self.state.now, &format!("t={}\n", self.state.now))
                        });
                    }
                    let paused = self.state.events.iter().any(|e| e.contains("pause n1"));
                    let killed = self.state.events.iter().any(|e| e.contains("kill n2"));
                    if paused && killed && self.state.now.is_multiple_of(500_000_000) {
                        self.records.push(record(
                            self.state.now,
                            serde_json::json!({"fail": "pause+kill"}),
                        ));
                    }
                }
                Response::Position(self.position())
            }
            Request::Checkpoint { .. } => {
                self.next += 1;
                self.checkpoints.insert(self.next, self.state.clone());
                Response::Checkpoint {
                    checkpoint: CheckpointId(self.next),
                    position: self.position(),
                }
            }
            Request::Reset { checkpoint, .. } => {
                self.state = self
                    .checkpoints
                    .get(&checkpoint.0)
                    .ok_or("unknown checkpoint")?
                    .clone();
                self.records.clear();
                Response::Position(self.position())
            }
            Request::DropCheckpoint { checkpoint, .. } => {
                self.checkpoints
                    .remove(&checkpoint.0)
                    .ok_or("unknown checkpoint")?;
                Response::CheckpointMemory(self.memory())
            }
            Request::CheckpointMemory { .. } => Response::CheckpointMemory(self.memory()),
            // A moment on disk: its state as JSON, under its id.
            Request::Spill {
                dir, id, parent, ..
            } => {
                let path = dir.join(&id);
                std::fs::create_dir(&path).map_err(|e| e.to_string())?;
                let json = serde_json::to_string(&self.state).unwrap();
                std::fs::write(path.join("state.json"), json).map_err(|e| e.to_string())?;
                Response::Snapshot(
                    serde_json::from_value(serde_json::json!({
                        "id": id, "parent": parent, "virtual_ns": self.state.now,
                        "exit_index": 0, "ram_bytes": 0, "seed": 0, "incremental": false,
                        "state_bytes": 0, "memory_pages_stored": 0, "disk_bytes": 0, "dir": path,
                    }))
                    .map_err(|e| e.to_string())?,
                )
            }
            Request::LoadInPlace { dir, .. } => {
                let json =
                    std::fs::read_to_string(dir.join("state.json")).map_err(|e| e.to_string())?;
                self.state = serde_json::from_str(&json).map_err(|e| e.to_string())?;
                self.records.clear();
                Response::Loaded {
                    position: self.position(),
                    stats: Default::default(),
                }
            }
            Request::Rekey { seed, .. } => {
                self.state.events.push(format!("seed {seed}"));
                Response::Position(self.position())
            }
            Request::InjectFault { fault, .. } => {
                // As a run schedules it: `at=+` from the present.
                let now = Some(VirtNanos(self.state.now));
                for fault in fault.scheduled(now).map_err(|e| e.to_string())? {
                    self.state
                        .events
                        .push(format!("{} {}", fault.at.0, fault.action));
                }
                Response::Position(self.position())
            }
            Request::TakeRecords { .. } => Response::Records {
                records: std::mem::take(&mut self.records),
            },
            Request::Outcome { .. } => {
                let mut h = DefaultHasher::new();
                self.state.hash(&mut h);
                let mut summary: run::RunSummary = serde_json::from_value(serde_json::json!({}))
                    .unwrap_or_else(|_| panic_free_summary());
                summary.digest = format!("{:016x}", h.finish());
                Response::Summary(summary)
            }
            Request::Close { .. } => Response::Closed,
            other => return Err(format!("not simulated: {other:?}")),
        })
    }
}

fn panic_free_summary() -> run::RunSummary {
    serde_json::from_value(serde_json::json!({
        "exit_status": null, "stop": {"kind": "time_limit"}, "seed": 0, "virtual_ns": 0,
        "exits": 0, "exits_by_kind": {}, "injected_interrupts": 0, "irq_windows_stepped": 0,
        "single_steps": 0, "wall_ms": 0, "wall_setup_ms": 0, "wall_finish_ms": 0,
        "exits_per_sec": 0, "digest": "", "digest_parts": {"records": "", "memory": "",
        "devices": "", "console": ""}, "console_bytes": 0, "unhandled_accesses": 0,
        "vmm_peak_rss_beyond_guest_kib": null, "cpu_model_version": 0
    }))
    .expect("a summary")
}

/// Fails a history with a `{"fail": name}` record (a failure of the
/// command `name`); novelty for new keys.
#[derive(Default)]
struct FailJudge {
    seen: std::collections::BTreeSet<FailureKey>,
}

fn fails(path: &[&[GuestRecord]]) -> Vec<Failure> {
    let mut keys = std::collections::BTreeSet::new();
    for record in path.iter().flat_map(|s| s.iter()) {
        if let RecordBody::Sdk { json } = &record.body {
            if let Some(key) = json.get("fail").and_then(|k| k.as_str()) {
                keys.insert(key.to_string());
            }
        }
    }
    keys.into_iter()
        .map(|name| Failure {
            summary: format!("{name} happened"),
            key: FailureKey::Command { name },
            details: serde_json::Value::Null,
            artifacts: vec![("note.txt".into(), b"x".to_vec())],
        })
        .collect()
}

impl Judge for FailJudge {
    fn judge(&mut self, path: &[&[GuestRecord]]) -> Verdict {
        let failures = fails(path);
        let novelty = failures
            .iter()
            .filter(|f| self.seen.insert(f.key.clone()))
            .count() as f64;
        Verdict { failures, novelty }
    }
    fn check(&self, path: &[&[GuestRecord]]) -> Vec<Failure> {
        fails(path)
    }
    fn end_of_campaign(&self) -> Vec<Failure> {
        Vec::new()
    }
    fn save(&self) -> String {
        serde_json::to_string(&self.seen).unwrap()
    }
    fn load(&mut self, saved: &str) -> std::result::Result<(), String> {
        self.seen = serde_json::from_str(saved).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// Draws a pause, a kill, both or a slow link from the seed.
struct Draw;

impl FaultSource for Draw {
    fn draw(&self, seed: u64, _slice_ns: vmm::VirtNanos) -> Vec<Fault> {
        let mut faults = vec!["at=+100ms slow n3 latency=5ms for=1s"];
        if !seed.is_multiple_of(3) {
            faults.push("at=+200ms pause n1 for=1s");
        }
        if seed.is_multiple_of(2) {
            faults.push("at=+300ms kill n2");
        }
        faults.push("at=+400ms loss n3 0.1 for=1s");
        run::faults::parse_faults(&faults).unwrap()
    }
}

fn spec(live: u32) -> CampaignSpec {
    let mut spec = CampaignSpec::parse(
        "manifest = \"m.toml\"\nseed = 5\n[search]\nslice = \"2s\"\nmax_depth = 3",
        Path::new("c.toml"),
        Path::new("/"),
    )
    .unwrap();
    spec.live_checkpoints = live;
    spec.size_checkpoints_from_memory = false;
    spec
}

fn prepared(dir: &Path) -> PreparedUp {
    let kernel = dir.join("vmlinux");
    std::fs::write(&kernel, b"kernel bytes").unwrap();
    serde_json::from_value(serde_json::json!({
        "kernel": kernel, "initrd": {"bytes": [1, 2, 3]}, "specs": [], "node_names": ["n1", "n2", "n3"],
        "workload": null, "network": serde_json::to_value(devices::NetworkConfig::reliable(devices::LatencyDist::Fixed(vmm::VirtNanos::ZERO))).unwrap(),
        "rtc_epoch_unix_secs": 0, "ram_bytes": 1, "faults": [], "disks": []
    }))
    .expect("a prepared run")
}

struct Quiet;
impl Progress for Quiet {
    fn root(&mut self, _: &Position, _: &str) {}
    fn branch(&mut self, _: &BranchReport) {}
    fn finding(&mut self, _: u32, _: &str, _: &str, _: &Path) {}
    fn warning(&mut self, _: &str) {}
}

fn campaign(dir: &Path, live: u32, branches: u64) -> (CampaignSummary, Vec<NodeRow>) {
    campaign_on(Sim::default(), dir, spec(live), branches)
}

/// A new campaign of `spec` in `dir` on `sim`, `branches` long.
fn campaign_on(
    sim: Sim,
    dir: &Path,
    spec: CampaignSpec,
    branches: u64,
) -> (CampaignSummary, Vec<NodeRow>) {
    let summary = try_campaign(dir, spec, branches, vec![sim]).unwrap();
    let nodes = Store::open(dir).unwrap().nodes().unwrap();
    (summary, nodes)
}

#[test]
fn test_a_campaign_finds_the_failure_shrinks_it_and_replays_it() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, nodes) = campaign(dir.path(), 1, 12);
    assert_eq!(summary.branches, 12);
    assert_eq!(nodes.len(), 13, "the root and one moment per branch");
    assert_eq!(summary.findings.len(), 1, "{:?}", summary.findings);
    let finding = findings::load(&findings::finding_dir(dir.path(), 1)).unwrap();
    assert_eq!(finding.file.key, "command:pause+kill");
    // Shrunk to the two faults that matter, from more.
    let faults: Vec<String> = finding
        .file
        .path
        .steps
        .iter()
        .flat_map(|s| &s.faults)
        .map(|f| f.to_string())
        .collect();
    assert_eq!(faults.len(), 2, "{faults:?}");
    assert!(faults.iter().any(|f| f.contains("pause n1")));
    assert!(faults.iter().any(|f| f.contains("kill n2")));
    assert!(finding.file.found_path.fault_count() > 2);
    // Replayed from a fresh runner: the same digest and the failure.
    let mut fresh = Sim::default();
    let mut told = Vec::new();
    let report = crate::replay::replay_loaded(
        &mut fresh,
        &finding,
        &FailJudge::default(),
        None,
        &mut |step| told.push(step),
    )
    .unwrap();
    assert!(report.reproduced, "{report:?}");
    // It told its progress: booting, the root, each slice of the path in
    // order up to its end, then judging.
    use crate::replay::ReplayProgress;
    let slices = finding.file.path.steps.len() + 1;
    assert_eq!(told.len(), slices + 3, "{told:?}");
    assert_eq!(told[0], ReplayProgress::Booting);
    let end = finding.file.path.end_ns;
    assert!(
        matches!(told[1], ReplayProgress::Root { slices: s, end: e, .. } if s == slices && e == end),
        "{told:?}"
    );
    for (i, step) in told[2..2 + slices].iter().enumerate() {
        let ReplayProgress::Slice { done, total, .. } = *step else {
            panic!("{told:?}");
        };
        assert_eq!((done, total), (i + 1, slices), "{told:?}");
    }
    assert_eq!(
        told[1 + slices],
        ReplayProgress::Slice {
            done: slices,
            total: slices,
            virtual_ns: report.virtual_ns,
            end
        }
    );
    assert_eq!(told[2 + slices], ReplayProgress::Judging);
    // Its failure moment was written with it: the first record of the
    // shrunk path's records that fails, as the replay sees it too.
    let written = finding
        .file
        .failure_moment
        .expect("written with the finding");
    let dir_1 = findings::finding_dir(dir.path(), 1);
    let records = findings::read_records(&dir_1).unwrap();
    let key = crate::failure::FailureKey::from_slug(&finding.file.key).unwrap();
    let judge = FailJudge::default();
    assert_eq!(
        crate::failure_moment::find(&records, &judge, &key),
        Some(written)
    );
    assert_eq!(finding.failure_moment, written);
    assert_eq!(report.failure_moment, Some(written));
    let index = written.record.expect("a record broke it");
    assert!(judge.check(&[&records[..index]]).is_empty());
    // Copied elsewhere, it still loads (no absolute path).
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("0001");
    std::fs::create_dir_all(copy.join("blobs")).unwrap();
    for entry in walk(&findings::finding_dir(dir.path(), 1)) {
        let relative = entry
            .strip_prefix(findings::finding_dir(dir.path(), 1))
            .unwrap();
        let to = copy.join(relative);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&entry, to).unwrap();
    }
    let moved = findings::load(&copy).unwrap();
    assert!(moved.run.kernel.starts_with(&copy));
    let text = std::fs::read_to_string(copy.join("run.json")).unwrap();
    assert!(
        !text.contains(dir.path().to_str().unwrap()),
        "no absolute paths"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn test_live_checkpoints_change_the_cost_not_the_search() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let (_, one) = campaign(a.path(), 1, 10);
    let (_, many) = campaign(b.path(), 4, 10);
    assert_eq!(one, many);
}

#[test]
fn test_a_resumed_campaign_continues_the_same_search() {
    let straight = tempfile::tempdir().unwrap();
    let (_, all) = campaign(straight.path(), 3, 9);
    let split = tempfile::tempdir().unwrap();
    let (first, _) = campaign(split.path(), 3, 4);
    assert_eq!(first.branches, 4);
    let mut sim = Sim::default();
    let summary = {
        let mut engine = Engine::resume(
            &mut sim,
            split.path(),
            Box::new(FailJudge::default()),
            |_| Box::new(Draw) as Box<dyn FaultSource>,
            |_, run| Ok(run),
        )
        .unwrap();
        engine
            .run(
                Budget {
                    wall: None,
                    branches: 9,
                },
                &mut Quiet,
                &|| false,
            )
            .unwrap()
    };
    assert_eq!(summary.branches, 9);
    assert_eq!(summary.branches_this_run, 5);
    // The stats add over both runs: every branch counted once, by worker
    // and by minute, the finding's time kept.
    let stats = Store::open(split.path()).unwrap().stats().unwrap().unwrap();
    assert_eq!(stats.branches_by_worker, vec![9]);
    assert_eq!(stats.branches_by_minute.iter().sum::<u64>(), 9);
    assert_eq!(stats.workers, 1);
    let resumed = Store::open(split.path()).unwrap().nodes().unwrap();
    assert_eq!(resumed, all);
    let a = Store::open(straight.path()).unwrap().findings().unwrap();
    let b = Store::open(split.path()).unwrap().findings().unwrap();
    assert_eq!(a, b);
    let found: Vec<u32> = stats.findings_at_ms.keys().copied().collect();
    assert_eq!(found, b.iter().map(|f| f.number).collect::<Vec<_>>());
}

/// `kill -9` at any moment of a campaign loses nothing already committed,
/// and `--resume` makes the same tree and findings as a campaign never
/// killed: a child process runs the campaign and is killed at several
/// moments; the parent resumes it each time.
#[test]
fn test_a_campaign_killed_at_any_moment_resumes_to_the_same_tree() {
    killed_and_resumed(1, 1);
}

/// As above, for batches of two on two workers: kills land in the middle of
/// batches too (some of a batch's branches committed).
#[test]
fn test_a_campaign_of_batches_killed_at_any_moment_resumes_to_the_same_tree() {
    killed_and_resumed(2, 2);
}

fn boxed(sims: Vec<Sim>) -> Vec<Box<dyn Runner + Send>> {
    sims.into_iter()
        .map(|s| Box::new(s) as Box<dyn Runner + Send>)
        .collect()
}

/// A campaign of batches `width` wide on `workers` workers, killed in a
/// child process at several moments and resumed each time, then finished:
/// the same tree and findings as a campaign never killed.
fn killed_and_resumed(width: u32, workers: usize) {
    let straight = tempfile::tempdir().unwrap();
    let (_, all, expected_findings) = campaign_with(
        straight.path(),
        width,
        10,
        (0..workers).map(|_| Sim::default()).collect(),
    );
    let dir = tempfile::tempdir().unwrap();
    for (round, kill_after_ms) in [35u64, 90, 160].into_iter().enumerate() {
        // SAFETY: the child only runs this test's code and then _exits; it
        // touches no lock another thread of the harness could hold mid-way
        // (it allocates, and glibc's malloc is fork-safe).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // The harness's other tests' descriptors (their campaigns' lock
            // files among them) are not this child's to hold.
            // SAFETY: closes descriptors this child inherited and does not use.
            unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
            let sims: Vec<Sim> = (0..workers)
                .map(|_| Sim {
                    delay: Some(std::time::Duration::from_millis(3)),
                    ..Sim::default()
                })
                .collect();
            // Killed before its database was whole, a campaign has none: it
            // starts again.
            let fresh = !dir.path().join(crate::store::DB_FILE).exists();
            let result = if fresh {
                let mut spec = spec(3);
                spec.batch_width = width;
                try_campaign(dir.path(), spec, 10, sims)
            } else {
                try_resume(dir.path(), boxed(sims), 10)
            };
            // SAFETY: ends the forked child without running the harness's
            // exit handlers.
            unsafe { libc::_exit(if result.is_ok() { 0 } else { 1 }) };
        }
        std::thread::sleep(std::time::Duration::from_millis(kill_after_ms));
        // SAFETY: signals the child forked above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let mut status = 0;
        // SAFETY: reaps that child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        // What was committed is whole: every node's path is one step longer
        // than its parent's, and every indexed finding has its directory.
        let _ = round;
        if !dir.path().join(crate::store::DB_FILE).exists() {
            continue;
        }
        let store = Store::open(dir.path()).unwrap();
        let nodes = store.nodes().unwrap();
        assert!(nodes.len() as u64 <= 11);
        for node in &nodes {
            if let Some(parent) = node.parent {
                assert_eq!(
                    node.path.steps.len(),
                    nodes[parent as usize].path.steps.len() + 1
                );
            }
        }
        for finding in store.findings().unwrap() {
            findings::load(&findings::finding_dir(dir.path(), finding.number)).unwrap();
        }
        assert_eq!(
            &all[..nodes.len()],
            &nodes[..],
            "round {round}: a prefix of the same search"
        );
    }
    let summary = resume_with(
        dir.path(),
        boxed((0..workers).map(|_| Sim::default()).collect()),
        10,
    );
    assert_eq!(summary.branches, 10);
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.nodes().unwrap(), all);
    assert_eq!(store.findings().unwrap(), expected_findings);
}

/// Resumes the campaign in `dir` with a worker per runner, to `branches`.
fn resume_with(dir: &Path, runners: Vec<Box<dyn Runner + Send>>, branches: u64) -> CampaignSummary {
    try_resume(dir, runners, branches).unwrap()
}

fn try_resume(
    dir: &Path,
    runners: Vec<Box<dyn Runner + Send>>,
    branches: u64,
) -> Result<CampaignSummary> {
    Engine::resume(
        runners,
        dir,
        Box::new(FailJudge::default()),
        |_| Box::new(Draw) as Box<dyn FaultSource>,
        |_, run| Ok(run),
    )
    .and_then(|engine| run_to(engine, branches))
}

/// Runs `engine` quietly to `branches` in all.
fn run_to(mut engine: Engine<'_>, branches: u64) -> Result<CampaignSummary> {
    engine.run(
        Budget {
            wall: None,
            branches,
        },
        &mut Quiet,
        &|| false,
    )
}

/// A new campaign of `spec` run by `sims` (one worker each), to `branches`.
fn try_campaign(
    dir: &Path,
    spec: CampaignSpec,
    branches: u64,
    sims: Vec<Sim>,
) -> Result<CampaignSummary> {
    let files = tempfile::tempdir().unwrap();
    let run = prepared(files.path());
    Engine::create(
        boxed(sims),
        spec,
        &run,
        run.clone(),
        crate::store::NewCampaignDir::claim(dir).map_err(crate::store::StoreError::from)?,
        Box::new(FailJudge::default()),
        Box::new(Draw),
    )
    .and_then(|engine| run_to(engine, branches))
}

/// A campaign of batches `width` wide run by `sims` (one worker each).
fn campaign_with(
    dir: &Path,
    width: u32,
    branches: u64,
    sims: Vec<Sim>,
) -> (CampaignSummary, Vec<NodeRow>, Vec<FindingRow>) {
    let mut spec = spec(3);
    spec.batch_width = width;
    let summary = try_campaign(dir, spec, branches, sims).unwrap();
    let store = Store::open(dir).unwrap();
    (summary, store.nodes().unwrap(), store.findings().unwrap())
}

fn jittery(seed: u64) -> Sim {
    Sim {
        jitter: Some(seed),
        ..Sim::default()
    }
}

/// The digests of the findings' shrunk paths, in order.
fn finding_digests(dir: &Path, rows: &[FindingRow]) -> Vec<String> {
    rows.iter()
        .map(|f| {
            findings::load(&findings::finding_dir(dir, f.number))
                .unwrap()
                .file
                .digest
        })
        .collect()
}

#[test]
fn test_batches_make_the_same_search_whatever_the_workers_timing_and_number() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let c = tempfile::tempdir().unwrap();
    let (sa, na, fa) = campaign_with(a.path(), 2, 12, vec![jittery(1), jittery(2)]);
    let (sb, nb, fb) = campaign_with(b.path(), 2, 12, vec![jittery(77), jittery(5)]);
    let (_, nc, fc) = campaign_with(c.path(), 2, 12, vec![Sim::default()]);
    assert_eq!((sa.branches, sa.batch_width, sa.workers), (12, 2, 2));
    assert_eq!(na.len(), 13);
    assert_eq!(na, nb, "two workers, other timings: the same tree");
    assert_eq!(na, nc, "one worker: the same tree");
    assert_eq!(fa, fb);
    assert_eq!(fa, fc);
    assert_eq!(sa.findings.len(), 1, "{:?}", sa.findings);
    assert_eq!(sb.findings, sa.findings);
    assert_eq!(
        finding_digests(a.path(), &fa),
        finding_digests(b.path(), &fb)
    );
    assert_eq!(
        finding_digests(a.path(), &fa),
        finding_digests(c.path(), &fc)
    );
    let store = Store::open(a.path()).unwrap();
    assert_eq!(store.meta("batch_width").unwrap().as_deref(), Some("2"));
    let spec: CampaignSpec = store.meta_json("spec").unwrap().unwrap();
    assert_eq!(spec.batch_width, 2);
    // Branches of one batch never descend from each other.
    for node in &na[1..] {
        let start = tree::batch_start(node.id - 1, 2);
        assert!(node.parent.unwrap() <= start, "{node:?}");
    }
}

#[test]
fn test_a_batch_cut_short_resumes_to_the_same_tree_with_any_workers() {
    let straight = tempfile::tempdir().unwrap();
    let (_, all, all_findings) = campaign_with(straight.path(), 2, 9, vec![jittery(3), jittery(4)]);
    // 3 branches: the second batch has one of its two committed, as a kill
    // after that branch's transaction leaves it.
    let split = tempfile::tempdir().unwrap();
    let (first, part, _) = campaign_with(split.path(), 2, 3, vec![jittery(9), jittery(8)]);
    assert_eq!(first.branches, 3);
    assert_eq!(&all[..4], &part[..]);
    // Resumed with one worker, then with three: the batch's width is the
    // campaign's.
    for (budget, sims) in [
        (6, vec![Sim::default()]),
        (9, vec![jittery(1), jittery(2), jittery(6)]),
    ] {
        let summary = resume_with(split.path(), boxed(sims), budget);
        assert_eq!(summary.branches, budget);
        assert_eq!(summary.batch_width, 2);
    }
    let store = Store::open(split.path()).unwrap();
    assert_eq!(store.nodes().unwrap(), all);
    assert_eq!(store.findings().unwrap(), all_findings);
}

#[test]
fn test_workers_that_reach_different_roots_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let odd = Sim {
        boot_salt: Some("a timer read twice".into()),
        ..Sim::default()
    };
    let error =
        try_campaign(dir.path(), spec(3), 0, vec![Sim::default(), odd]).expect_err("refused");
    let text = error.to_string();
    assert!(
        matches!(error, EngineError::WorkersDiverged { worker: 1, .. }),
        "{text}"
    );
    assert!(
        text.contains("worker 1") && text.contains("not deterministic"),
        "{text}"
    );
}

/// A finding's `logs/` hold its path's output from the boot through the
/// root and every step to the failure, in order, nothing missing.
#[test]
fn test_a_finding_holds_the_logs_of_its_whole_path() {
    let dir = tempfile::tempdir().unwrap();
    campaign(dir.path(), 1, 12);
    let finding_dir = findings::finding_dir(dir.path(), 1);
    let finding = findings::load(&finding_dir).unwrap();
    let text = std::fs::read_to_string(finding_dir.join("logs/n1.log")).unwrap();
    let times: Vec<u64> = text
        .lines()
        .map(|l| l.strip_prefix("t=").unwrap().parse().unwrap())
        .collect();
    let expected: Vec<u64> = (1..=finding.file.virtual_ns.0 / 250_000_000)
        .map(|i| i * 250_000_000)
        .collect();
    // Found two steps or more down; shrunk to the step of its faults.
    assert!(
        finding.file.found_path.steps.len() >= 2,
        "{:?}",
        finding.file.found_path
    );
    assert_eq!(times, expected);
}

/// A memory budget of three checkpoints: moments let go are spilled to
/// disk and loaded back in place (digest checked) rather than replayed, and
/// the search is the same as with one checkpoint and replays only.
#[path = "engine_silence_tests.rs"]
mod silence;

#[path = "engine_spill_tests.rs"]
mod spill_bound;

#[path = "engine_shard_tests.rs"]
mod shards;
#[path = "engine_shrink_tests.rs"]
mod shrinking;
