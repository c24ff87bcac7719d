//! The search over the multiverse: boot once to the root moment, then
//! repeatedly choose a moment of the tree (weighted by what its branch
//! showed that was new), branch it with a new seed and drawn faults for a
//! slice of virtual time, judge the history, and keep new failures as
//! findings (shrunk first). State goes to the database after every branch;
//! a resumed campaign rebuilds the tree and continues the same search.

use crate::findings::{self, FindingFile, NewFinding, FINDING_FORMAT};
use crate::judge::{Failure, Judge};
use crate::runner::{Calls, Runner, RunnerError};
use crate::shrink::ddmin;
use crate::spec::{CampaignSpec, RootRule, ROOT_POLL_NS};
use crate::step::Path as StepPath;
use crate::store::{FindingRow, FinishedBranch, NodeRow, Store, StoreError};
use run::api::{CheckpointId, Position, Request, RunId, Until};
use run::faults::parse_fault_after;
use run::records::{GuestRecord, RecordBody};
use run::up::{PreparedUp, UpEvent, UpOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use vmm::entropy::EntropyStream;
use vmm::VirtNanos;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Finding(#[from] findings::FindingError),
    #[error(transparent)]
    Spill(#[from] crate::spill::SpillError),
    #[error("the run stopped ({stop}) at {at} before its root moment ({rule})")]
    StoppedBeforeRoot {
        stop: String,
        at: VirtNanos,
        rule: String,
    },
    #[error("the system under test did not report setup_complete within {wait} of virtual time")]
    NoSetupComplete { wait: VirtNanos },
    #[error("the fault profile drew {text:?}, which does not parse: {message}")]
    DrawnFault { text: String, message: String },
    #[error("resuming: the run reached its root moment with digest {now}, but the campaign was started from {then}: the manifest, its images or this detvisor changed")]
    RootMoved { then: String, now: String },
    #[error("campaign state: {0}")]
    Tally(String),
}

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Draws the faults of one branch.
pub trait FaultSource {
    /// Fault texts (`at=+<d>` from the branch point) for a branch of
    /// `slice_ns` re-keyed with `seed`.
    fn draw(&self, seed: u64, slice_ns: u64) -> Vec<String>;
}

/// What the campaign tells its user as it goes.
pub trait Progress {
    fn root(&mut self, position: &Position, digest: &str);
    fn branch(&mut self, report: &BranchReport);
    fn finding(&mut self, number: u32, key: &str, summary: &str, dir: &Path);
}

/// One finished branch, for progress lines.
#[derive(Clone, Debug)]
pub struct BranchReport {
    pub number: u64,
    pub parent: u64,
    pub depth: u32,
    pub seed: u64,
    pub faults: usize,
    pub end_ns: u64,
    pub failures: usize,
    pub novelty: f64,
    pub wall_ms: u64,
}

/// The moments a campaign keeps.
struct TreeNode {
    row: NodeRow,
    children: u32,
    records: Vec<GuestRecord>,
}

/// Limits on a campaign's run (this process's share; the database keeps
/// what earlier runs used).
#[derive(Clone, Copy, Debug, Default)]
pub struct Budget {
    pub wall_ms: u64,
    pub branches: u64,
}

/// What a campaign (or its part in this process) did.
#[derive(Clone, Debug, Default)]
pub struct CampaignSummary {
    pub branches: u64,
    pub branches_this_run: u64,
    pub findings: Vec<FindingRow>,
    pub end_failures: Vec<Failure>,
    pub wall_ms: u64,
    pub stopped_by: String,
    /// Checkpoints written to disk and loaded back in this process.
    pub spill: crate::spill::SpillStats,
}

pub struct Engine<'a> {
    calls: Calls<'a>,
    spec: CampaignSpec,
    dir: PathBuf,
    store: Store,
    judge: Box<dyn Judge + 'a>,
    faults: Box<dyn FaultSource + 'a>,
    prepared: PreparedUp,
    run: Option<RunId>,
    nodes: Vec<TreeNode>,
    /// Live checkpoints, least recently used first; the root's is never let go.
    live: Vec<(u64, CheckpointId)>,
    findings: BTreeMap<String, u32>,
    branches: u64,
    wall_before_ms: u64,
    /// Where the run is now: (node, at its moment exactly).
    at_node: Option<u64>,
    /// Checkpoints let go that are on disk (`None`: none are kept).
    spill: Option<crate::spill::Spill>,
}

/// Options for booting a campaign's run (the campaign's, or a replay's
/// with node logs): quiet, held, seeded by the campaign.
pub(crate) fn boot_options(spec: &CampaignSpec, logs: Option<&Path>) -> UpOptions {
    UpOptions {
        seed: spec.seed,
        until: None,
        runs: 1,
        logs: logs.map(Path::to_path_buf),
        stream_output: false,
        snapshots: None,
        stall_timeout: Default::default(),
        pcap: None,
        trace: None,
        records: None,
        exit_path: Default::default(),
    }
}

/// Seed of branch `k` of the campaign seeded `seed`.
pub fn branch_seed(seed: u64, k: u64) -> u64 {
    EntropyStream::new(seed, &format!("campaign-branch-seed-{k}")).next_u64()
}

impl<'a> Engine<'a> {
    /// A new campaign in `dir` (the spec and prepared run checked by the
    /// caller): `host_run` is the run as assembled here (its files are kept
    /// in the campaign's directory by digest), `prepared` the same run as the
    /// runner sees it (in a helper VM, its files are shipped there).
    pub fn create(
        runner: &'a mut dyn Runner,
        spec: CampaignSpec,
        host_run: &PreparedUp,
        prepared: PreparedUp,
        dir: &Path,
        judge: Box<dyn Judge + 'a>,
        faults: Box<dyn FaultSource + 'a>,
    ) -> Result<Self> {
        // The run's files go by digest into the directory first: a database
        // that exists names only files that do.
        let blobified = findings::blobify(dir, host_run)?;
        let store = Store::create(
            dir,
            &[
                (
                    "spec",
                    serde_json::to_string(&spec).expect("specs serialize"),
                ),
                (
                    "run",
                    serde_json::to_string(&blobified).expect("runs serialize"),
                ),
            ],
        )?;
        Ok(Engine {
            calls: Calls { runner },
            spec,
            dir: dir.to_owned(),
            store,
            judge,
            faults,
            prepared,
            run: None,
            nodes: Vec::new(),
            live: Vec::new(),
            findings: BTreeMap::new(),
            branches: 0,
            wall_before_ms: 0,
            at_node: None,
            spill: None,
        })
    }

    /// The campaign in `dir`, to continue: its spec and run as saved.
    pub fn resume(
        runner: &'a mut dyn Runner,
        dir: &Path,
        judge: Box<dyn Judge + 'a>,
        faults: impl FnOnce(&CampaignSpec) -> Box<dyn FaultSource + 'a>,
        resolve_run: impl FnOnce(&Path, PreparedUp) -> Result<PreparedUp>,
    ) -> Result<Self> {
        let store = Store::open(dir)?;
        Self::resume_store(runner, dir, store, judge, faults, resolve_run)
    }

    /// As [`Engine::resume`], with the campaign's database already open
    /// (and so locked: a caller that read the spec first keeps the lock
    /// until the campaign ends).
    pub fn resume_store(
        runner: &'a mut dyn Runner,
        dir: &Path,
        store: Store,
        judge: Box<dyn Judge + 'a>,
        faults: impl FnOnce(&CampaignSpec) -> Box<dyn FaultSource + 'a>,
        resolve_run: impl FnOnce(&Path, PreparedUp) -> Result<PreparedUp>,
    ) -> Result<Self> {
        let spec: CampaignSpec = store
            .meta_json("spec")?
            .ok_or_else(|| EngineError::Tally("no spec saved".into()))?;
        let saved_run: PreparedUp = store
            .meta_json("run")?
            .ok_or_else(|| EngineError::Tally("no run saved".into()))?;
        let prepared = resolve_run(dir, saved_run)?;
        let mut judge = judge;
        if let Some(tally) = store.meta("tally")? {
            judge.load(&tally).map_err(EngineError::Tally)?;
        }
        let mut nodes = Vec::new();
        for row in store.nodes()? {
            let records = store.records(row.id)?.unwrap_or_default();
            nodes.push(TreeNode {
                row,
                children: 0,
                records,
            });
        }
        for i in 0..nodes.len() {
            if let Some(parent) = nodes[i].row.parent {
                nodes[parent as usize].children += 1;
            }
        }
        let findings = store
            .findings()?
            .into_iter()
            .map(|f| (f.key, f.number))
            .collect();
        let branches = store.branches()?;
        let wall_before_ms = store.wall_ms()?;
        let faults = faults(&spec);
        Ok(Engine {
            calls: Calls { runner },
            spec,
            dir: dir.to_owned(),
            store,
            judge,
            faults,
            prepared,
            run: None,
            nodes,
            live: Vec::new(),
            findings,
            branches,
            wall_before_ms,
            at_node: None,
            spill: None,
        })
    }

    pub fn spec(&self) -> &CampaignSpec {
        &self.spec
    }

    /// Boots and runs to the root moment; records its stretch.
    fn reach_root(&mut self) -> Result<(RunId, Position, Vec<GuestRecord>)> {
        let (run, _) = self.calls.start(Request::BootUp {
            prepared: self.prepared.clone(),
            options: boot_options(&self.spec, None),
        })?;
        self.calls.collect_records(run)?;
        let (position, records) = reach(&mut self.calls, run, &self.spec.root)?;
        Ok((run, position, records))
    }

    /// Runs the campaign until a budget is spent or `stop` says so.
    pub fn run(
        &mut self,
        budget: Budget,
        progress: &mut dyn Progress,
        stop: &dyn Fn() -> bool,
    ) -> Result<CampaignSummary> {
        let started = Instant::now();
        let (run, position, root_records) = self.reach_root()?;
        self.run = Some(run);
        let digest = self.calls.outcome(run)?.digest;
        let (checkpoint, _) = self.calls.checkpoint(run)?;
        self.live = vec![(0, checkpoint)];
        self.at_node = Some(0);
        if self.spec.spill && self.spec.live_checkpoints > 1 {
            self.spill = Some(crate::spill::Spill::open(&self.dir)?);
        }
        if self.nodes.is_empty() {
            let row = NodeRow {
                id: 0,
                parent: None,
                depth: 0,
                path: StepPath {
                    steps: Vec::new(),
                    end_ns: position.virtual_ns,
                },
                end_exits: position.exits,
                end_ns: position.virtual_ns,
                digest: digest.clone(),
                score: 1.0,
                stopped: position.stop.is_some(),
            };
            // The root's stretch counts once, like any other.
            let verdict = self.judge.judge(&[&root_records]);
            let tally = self.judge.save();
            let records_json = serde_json::to_string(&root_records).expect("records serialize");
            self.store.commit_branch(&FinishedBranch {
                node: &row,
                records_json: &records_json,
                findings: &[],
                meta: &[("tally", tally)],
            })?;
            self.nodes.push(TreeNode {
                row,
                children: 0,
                records: root_records,
            });
            let _ = verdict;
        } else if self.nodes[0].row.digest != digest {
            return Err(EngineError::RootMoved {
                then: self.nodes[0].row.digest.clone(),
                now: digest,
            });
        }
        progress.root(&position, &digest);
        let mut this_run = 0u64;
        let stopped_by = loop {
            let wall_ms = started.elapsed().as_millis() as u64;
            if budget.wall_ms > 0 && wall_ms >= budget.wall_ms {
                break "wall-time budget".to_string();
            }
            if budget.branches > 0 && self.branches >= budget.branches {
                break "branch budget".to_string();
            }
            if stop() {
                break "interrupted".to_string();
            }
            if self.candidates().is_empty() {
                break "no moment left to branch (every run stopped or at the depth limit)"
                    .to_string();
            }
            let branch_started = Instant::now();
            let report = self.branch_once(progress, started)?;
            this_run += 1;
            progress.branch(&BranchReport {
                wall_ms: branch_started.elapsed().as_millis() as u64,
                ..report
            });
        };
        let wall_ms = self.wall_before_ms + started.elapsed().as_millis() as u64;
        self.store
            .commit_meta(&[("wall_ms", wall_ms.to_string())])?;
        let spill = match self.spill.take() {
            Some(spill) => spill.finish()?,
            None => Default::default(),
        };
        Ok(CampaignSummary {
            branches: self.branches,
            branches_this_run: this_run,
            findings: self.store.findings()?,
            end_failures: self.judge.end_of_campaign(),
            wall_ms,
            stopped_by,
            spill,
        })
    }

    /// Moments that may be branched.
    fn candidates(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|n| !n.row.stopped && n.row.depth < self.spec.max_depth)
            .map(|n| n.row.id)
            .collect()
    }

    /// Branch `k`'s moment: weighted by its branch's novelty, against how
    /// often it was branched already; drawn from the campaign's seed and `k`.
    fn choose(&self, k: u64) -> u64 {
        let candidates = self.candidates();
        let weights: Vec<f64> = candidates
            .iter()
            .map(|&id| {
                let node = &self.nodes[id as usize];
                (1.0 + 4.0 * node.row.score) / (1.0 + node.children as f64)
            })
            .collect();
        let total: f64 = weights.iter().sum();
        let mut stream = EntropyStream::new(self.spec.seed, &format!("campaign-choice-{k}"));
        let draw = (stream.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut acc = 0.0;
        for (id, w) in candidates.iter().zip(&weights) {
            acc += w;
            if draw < acc {
                return *id;
            }
        }
        *candidates.last().expect("candidates are not empty")
    }

    fn run_id(&self) -> RunId {
        self.run.expect("the run was booted")
    }

    /// The run at `node`'s moment: reset to it if it is live, or to its
    /// nearest live ancestor and replayed from there (then kept).
    fn go_to(&mut self, node: u64) -> Result<Position> {
        let run = self.run_id();
        let mut ancestor = node;
        let checkpoint = loop {
            if let Some(i) = self.live.iter().position(|(id, _)| *id == ancestor) {
                let entry = self.live.remove(i);
                self.live.push(entry);
                break Some(entry.1);
            }
            if self.spill.as_ref().is_some_and(|s| s.holds(ancestor)) {
                break None;
            }
            ancestor = self.nodes[ancestor as usize]
                .row
                .parent
                .expect("the root is always live");
        };
        let mut position = match checkpoint {
            Some(checkpoint) => self.calls.reset(run, checkpoint)?,
            None => {
                let digest = &self.nodes[ancestor as usize].row.digest;
                let spill = self.spill.as_mut().expect("it holds the moment");
                let position = spill.load(&mut self.calls, run, ancestor, digest)?;
                self.keep(ancestor)?;
                position
            }
        };
        if ancestor != node {
            let from = self.nodes[ancestor as usize].row.depth as usize;
            let path = self.nodes[node as usize].row.path.clone();
            position = apply_steps(&mut self.calls, run, &path.steps[from..], path.end_ns)?;
            drop(self.calls.take_records(run)?);
            self.keep(node)?;
        }
        self.at_node = Some(node);
        Ok(position)
    }

    /// Keeps the present moment (node `node`'s) as a live checkpoint, when
    /// the campaign keeps more than the root.
    fn keep(&mut self, node: u64) -> Result<()> {
        if self.spec.live_checkpoints <= 1 {
            return Ok(());
        }
        let (checkpoint, _) = self.calls.checkpoint(self.run_id())?;
        self.live.push((node, checkpoint));
        while self.live.len() > self.spec.live_checkpoints as usize {
            // The least recently used, never the root.
            let i = self
                .live
                .iter()
                .position(|(id, _)| *id != 0)
                .expect("more than the root");
            let old = self.live.remove(i);
            let (run, spill) = (self.run_id(), self.spill.as_mut());
            crate::spill::let_go(&mut self.calls, spill, run, old, checkpoint)?;
        }
        let budget = self.spec.checkpoint_memory;
        let (run, spill) = (self.run_id(), self.spill.as_mut());
        crate::spill::within_budget(&mut self.calls, spill, run, &mut self.live, budget)?;
        Ok(())
    }

    fn branch_once(
        &mut self,
        progress: &mut dyn Progress,
        started: Instant,
    ) -> Result<BranchReport> {
        let k = self.branches;
        let parent = self.choose(k);
        let seed = branch_seed(self.spec.seed, k);
        let faults = self.faults.draw(seed, self.spec.slice_ns);
        self.go_to(parent)?;
        let run = self.run_id();
        let parent_path = self.nodes[parent as usize].row.path.clone();
        let path = parent_path.child(seed, faults.clone(), self.spec.slice_ns);
        let step = path.steps.last().expect("a child has a step").clone();
        let position = apply_steps(
            &mut self.calls,
            run,
            std::slice::from_ref(&step),
            path.end_ns,
        )?;
        let records = self.calls.take_records(run)?;
        let digest = self.calls.outcome(run)?.digest;
        self.at_node = None;
        let id = self.nodes.len() as u64;
        let depth = self.nodes[parent as usize].row.depth + 1;
        self.nodes.push(TreeNode {
            row: NodeRow {
                id,
                parent: Some(parent),
                depth,
                path: path.clone(),
                end_exits: position.exits,
                end_ns: position.virtual_ns,
                digest,
                score: 0.0,
                stopped: position.stop.is_some(),
            },
            children: 0,
            records,
        });
        self.nodes[parent as usize].children += 1;
        let verdict = {
            let chain = path_records(&self.nodes, id);
            self.judge.judge(&chain)
        };
        // Failures already found are no news: branching their subtree again
        // would find them again.
        let new_failures = verdict
            .failures
            .iter()
            .filter(|f| !self.findings.contains_key(&f.key))
            .count();
        self.nodes[id as usize].row.score = verdict.novelty + new_failures as f64;
        if depth < self.spec.max_depth && position.stop.is_none() {
            self.keep(id)?;
            self.at_node = Some(id);
        }
        let mut new_findings = Vec::new();
        for failure in &verdict.failures {
            if self.findings.contains_key(&failure.key) {
                continue;
            }
            let row = self.make_finding(id, failure, progress)?;
            self.findings.insert(row.key.clone(), row.number);
            new_findings.push(row);
        }
        self.branches += 1;
        let wall_ms = self.wall_before_ms + started.elapsed().as_millis() as u64;
        let node = &self.nodes[id as usize];
        let records_json = serde_json::to_string(&node.records).expect("records serialize");
        self.store.commit_branch(&FinishedBranch {
            node: &node.row,
            records_json: &records_json,
            findings: &new_findings,
            meta: &[
                ("branches", self.branches.to_string()),
                ("wall_ms", wall_ms.to_string()),
                ("tally", self.judge.save()),
            ],
        })?;
        for row in &new_findings {
            progress.finding(
                row.number,
                &row.key,
                &row.summary,
                &findings::finding_dir(&self.dir, row.number),
            );
        }
        Ok(BranchReport {
            number: k + 1,
            parent,
            depth,
            seed,
            faults: step.faults.len(),
            end_ns: position.virtual_ns,
            failures: verdict.failures.len(),
            novelty: verdict.novelty,
            wall_ms: 0,
        })
    }

    /// Replays `path` from the root; the records of its steps (the root's
    /// stretch not included) and where it ended.
    fn replay_from_root(&mut self, path: &StepPath) -> Result<(Vec<GuestRecord>, Position)> {
        let run = self.run_id();
        let root = self
            .live
            .iter()
            .find(|(id, _)| *id == 0)
            .expect("the root is live")
            .1;
        self.calls.reset(run, root)?;
        self.at_node = None;
        let position = apply_steps(&mut self.calls, run, &path.steps, path.end_ns)?;
        Ok((self.calls.take_records(run)?, position))
    }

    /// Shrinks `failure`'s faults on `node`'s path, writes its directory.
    fn make_finding(
        &mut self,
        node: u64,
        failure: &Failure,
        progress: &mut dyn Progress,
    ) -> Result<FindingRow> {
        let _ = progress;
        let found = self.nodes[node as usize].row.path.clone();
        let positions = found.fault_positions();
        let key = failure.key.clone();
        let root_records = self.nodes[0].records.clone();
        let mut trial_error = None;
        let (kept, _trials) = ddmin(&positions, 48, |keep| {
            if trial_error.is_some() {
                return false;
            }
            let trial = found.with_faults(keep);
            match self.replay_from_root(&trial) {
                Ok((records, _)) => self
                    .judge
                    .check(&[&root_records, &records])
                    .iter()
                    .any(|f| f.key == key),
                Err(e) => {
                    trial_error = Some(e);
                    false
                }
            }
        });
        if let Some(e) = trial_error {
            return Err(e);
        }
        let shrunk = found.with_faults(&kept);
        // The shrunk path, once more: its digest and its failure's details.
        let (records, position) = self.replay_from_root(&shrunk)?;
        let digest = self.calls.outcome(self.run_id())?.digest;
        let failures = self.judge.check(&[&root_records, &records]);
        let (path, failure, digest, position, records) =
            match failures.into_iter().find(|f| f.key == key) {
                Some(shrunk_failure) => (shrunk, shrunk_failure, digest, position, records),
                // Shrinking must keep the failure; if the final replay
                // disagrees, keep the path as found.
                None => {
                    let (records, position) = self.replay_from_root(&found)?;
                    let digest = self.calls.outcome(self.run_id())?.digest;
                    (found.clone(), failure.clone(), digest, position, records)
                }
            };
        let number = findings::next_number(
            &self.dir,
            self.findings.values().max().copied().unwrap_or(0) + 1,
        );
        let run_file: PreparedUp = self
            .store
            .meta_json("run")?
            .ok_or_else(|| EngineError::Tally("no run saved".into()))?;
        let mut all_records = root_records.clone();
        all_records.extend(records);
        findings::write(
            &self.dir,
            &NewFinding {
                file: FindingFile {
                    format: FINDING_FORMAT,
                    number,
                    key: key.clone(),
                    summary: failure.summary.clone(),
                    details: failure.details.clone(),
                    path,
                    found_path: found,
                    digest,
                    exits: position.exits,
                    virtual_ns: position.virtual_ns,
                    spec: self.spec.clone(),
                },
                run: &run_file,
                failure: &failure,
                records: &all_records,
            },
        )?;
        Ok(FindingRow {
            number,
            key,
            summary: failure.summary,
            node,
        })
    }
}

/// The records of every stretch from the boot to `node`.
fn path_records(nodes: &[TreeNode], node: u64) -> Vec<&[GuestRecord]> {
    let mut chain = Vec::new();
    let mut at = Some(node);
    while let Some(id) = at {
        chain.push(nodes[id as usize].records.as_slice());
        at = nodes[id as usize].row.parent;
    }
    chain.reverse();
    chain
}

/// Runs `run` to its root moment; the records of the way there.
pub fn reach(
    calls: &mut Calls<'_>,
    run: RunId,
    rule: &RootRule,
) -> Result<(Position, Vec<GuestRecord>)> {
    let stopped = |position: &Position| EngineError::StoppedBeforeRoot {
        stop: format!("{:?}", position.stop),
        at: VirtNanos(position.virtual_ns),
        rule: format!("{rule:?}"),
    };
    match *rule {
        RootRule::At { at_ns } => {
            let position = calls.run_until(run, Until::Time(VirtNanos(at_ns)))?;
            if position.stop.is_some() {
                return Err(stopped(&position));
            }
            Ok((position, calls.take_records(run)?))
        }
        RootRule::SetupComplete { wait_ns } => {
            let mut records = Vec::new();
            let mut at = 0u64;
            loop {
                at += ROOT_POLL_NS;
                let position = calls.run_until(run, Until::Time(VirtNanos(at)))?;
                let taken = calls.take_records(run)?;
                let done = taken.iter().any(|r| {
                    matches!(
                        r.body,
                        RecordBody::Event {
                            event: UpEvent::SetupComplete
                        }
                    )
                });
                records.extend(taken);
                if done {
                    // The root's stretch keeps its output capped as one.
                    run::records::cap_output(&mut records, run::records::OUTPUT_CAP_BYTES);
                    return Ok((position, records));
                }
                if position.stop.is_some() {
                    return Err(stopped(&position));
                }
                if at >= wait_ns {
                    return Err(EngineError::NoSetupComplete {
                        wait: VirtNanos(wait_ns),
                    });
                }
            }
        }
    }
}

/// Takes `steps` from the present (each: run to its time, re-key, add its
/// faults), then runs to `end_ns`.
pub fn apply_steps(
    calls: &mut Calls<'_>,
    run: RunId,
    steps: &[crate::step::Step],
    end_ns: u64,
) -> Result<Position> {
    for step in steps {
        let position = calls.run_until(run, Until::Time(VirtNanos(step.at_ns)))?;
        if position.stop.is_some() {
            return Ok(position);
        }
        let position = calls.rekey(run, step.seed)?;
        for text in &step.faults {
            let faults =
                parse_fault_after(text, Some(VirtNanos(position.virtual_ns))).map_err(|e| {
                    EngineError::DrawnFault {
                        text: text.clone(),
                        message: e.to_string(),
                    }
                })?;
            for fault in faults {
                calls.inject(run, fault)?;
            }
        }
    }
    Ok(calls.run_until(run, Until::Time(VirtNanos(end_ns)))?)
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
