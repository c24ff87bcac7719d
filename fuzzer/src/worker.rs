//! One worker of a campaign: a runner with its own run, booted to the
//! root moment, the moments it keeps as live checkpoints (least recently
//! used let go) and where its run is now. Workers run the branches of a
//! batch at once; what they find is judged afterwards, in branch order, by
//! the engine.

use crate::session::{apply_steps, boot_options, reach, SessionError};
use crate::spec::{CampaignSpec, DEFAULT_LIVE_CHECKPOINTS};
use crate::spill::{self, Spill, SpillError, SpillStats};
use crate::stats::{BranchParts, WorkerCounts};
use crate::step::Path as StepPath;
use crate::tree::TreeNode;
use run::api::{CheckpointId, Position, Request, RunId};
use run::client::{Calls, Runner, RunnerError};
use run::records::GuestRecord;
use run::up::PreparedUp;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Spill(#[from] SpillError),
}

pub(crate) type Result<T, E = WorkerError> = std::result::Result<T, E>;

pub(crate) struct Worker<'a> {
    runner: Box<dyn Runner + Send + 'a>,
    run: Option<RunId>,
    /// Live checkpoints, least recently used first; the root's is never let go.
    live: Vec<(u64, CheckpointId)>,
    /// How many it may keep (the root included).
    live_limit: u32,
    /// Let checkpoints go past this many bytes (the root's and the
    /// present's excepted).
    checkpoint_memory: Option<u64>,
    /// Where checkpoints let go are written (`None`: they are not kept),
    /// and the bytes they may take there.
    spill_dir: Option<(PathBuf, u64)>,
    /// Checkpoints let go that are on disk, once booted.
    spill: Option<Spill>,
    /// Where the run is now: at this node's moment exactly.
    at_node: Option<u64>,
    /// Steps replayed to reach moments neither live nor spilled, and the
    /// milliseconds that took.
    replayed_steps: u64,
    replay_ms: u64,
    /// Bytes the run's checkpoints held when last asked (with a memory
    /// bound only).
    held_bytes: u64,
}

/// What the root moment looked like to one worker.
pub(crate) struct Root {
    pub position: Position,
    pub records: Vec<GuestRecord>,
    pub digest: String,
}

/// A branch to run: node `id`, a child of `parent` along `path`.
pub(crate) struct BranchJob {
    pub id: u64,
    pub parent: u64,
    pub seed: u64,
    pub path: StepPath,
    /// Whether its moment may be branched in turn (above the depth limit),
    /// so worth keeping.
    pub keep: bool,
}

/// What a branch did, for the engine to judge.
pub(crate) struct BranchRun {
    pub position: Position,
    pub records: Vec<GuestRecord>,
    pub digest: String,
    pub wall_ms: u64,
    /// The worker's parts of `wall_ms` (its `judge_ms` and `commit_ms` are
    /// the engine's, 0 here).
    pub parts: BranchParts,
}

impl<'a> Worker<'a> {
    pub fn new(
        runner: Box<dyn Runner + Send + 'a>,
        live_limit: u32,
        checkpoint_memory: Option<u64>,
        spill_dir: Option<(PathBuf, u64)>,
    ) -> Self {
        Worker {
            runner,
            run: None,
            live: Vec::new(),
            live_limit,
            checkpoint_memory,
            spill_dir,
            spill: None,
            at_node: None,
            replayed_steps: 0,
            replay_ms: 0,
            held_bytes: 0,
        }
    }

    /// Bounds the checkpoints by `share` bytes, and by `count` (the
    /// campaign's sized backstop); without a share, by the default count.
    pub fn size_checkpoints(&mut self, share: Option<u64>, count: u32) {
        match share {
            Some(bytes) => {
                self.checkpoint_memory = Some(bytes);
                self.live_limit = count;
            }
            None => self.live_limit = DEFAULT_LIVE_CHECKPOINTS,
        }
    }

    fn calls(&mut self) -> Calls<'_> {
        Calls {
            runner: &mut *self.runner,
        }
    }

    /// The runner's calls and the spill, borrowed together.
    fn calls_and_spill(&mut self) -> (Calls<'_>, Option<&mut Spill>) {
        let calls = Calls {
            runner: &mut *self.runner,
        };
        (calls, self.spill.as_mut())
    }

    /// Removes this worker's spilled checkpoints (the campaign is over in
    /// this process); what spilling cost.
    pub fn finish_spill(&mut self) -> Result<SpillStats> {
        match self.spill.take() {
            Some(spill) => Ok(spill.finish()?),
            None => Ok(SpillStats::default()),
        }
    }

    /// What this worker counted in this run (see [`crate::stats`]).
    pub fn counts(&self) -> WorkerCounts {
        WorkerCounts {
            spill: self.spill.as_ref().map(|s| s.stats).unwrap_or_default(),
            replayed_steps: self.replayed_steps,
            replay_ms: self.replay_ms,
            live_checkpoints: self.live.len() as u64,
            checkpoint_bytes: self.held_bytes,
        }
    }

    /// What the spill has to say (why it stopped writing), once.
    pub fn take_notes(&mut self) -> Vec<String> {
        self.spill
            .as_mut()
            .map(Spill::take_notes)
            .unwrap_or_default()
    }

    fn run_id(&self) -> RunId {
        self.run.expect("the run was booted")
    }

    /// Boots and runs to the root moment; keeps it.
    pub fn boot(&mut self, prepared: &PreparedUp, spec: &CampaignSpec) -> Result<Root> {
        let mut calls = self.calls();
        let (run, _) = calls.start(Request::BootUp {
            prepared: prepared.clone(),
            options: boot_options(spec, None),
        })?;
        calls.collect_records(run)?;
        let (position, records) = reach(&mut calls, run, &spec.root)?;
        let digest = calls.outcome(run)?.digest;
        let (checkpoint, _) = calls.checkpoint(run)?;
        self.run = Some(run);
        self.live = vec![(0, checkpoint)];
        self.at_node = Some(0);
        if let Some((dir, limit)) = &self.spill_dir {
            self.spill = Some(Spill::open(dir, *limit)?);
        }
        Ok(Root {
            position,
            records,
            digest,
        })
    }

    /// Whether `node`'s moment is on this worker's disk.
    fn spilled(&self, node: u64) -> bool {
        self.spill.as_ref().is_some_and(|s| s.holds(node))
    }

    /// Steps of `node`'s path this worker would replay to reach it (0 when
    /// it is live or spilled here): the cost of running a branch of it here.
    pub fn replay_cost(&self, node: u64, nodes: &[TreeNode]) -> u32 {
        let mut ancestor = node;
        while !self.live.iter().any(|(id, _)| *id == ancestor) && !self.spilled(ancestor) {
            ancestor = nodes[ancestor as usize]
                .row
                .parent
                .expect("the root is always live");
        }
        nodes[node as usize].row.depth - nodes[ancestor as usize].row.depth
    }

    /// The run at `node`'s moment: reset to it if it is live, or to its
    /// nearest live or spilled ancestor (a spilled one loaded back in place
    /// and kept) and replayed from there (then kept).
    fn go_to(&mut self, node: u64, nodes: &[TreeNode]) -> Result<Position> {
        let run = self.run_id();
        let mut ancestor = node;
        let checkpoint = loop {
            if let Some(i) = self.live.iter().position(|(id, _)| *id == ancestor) {
                let entry = self.live.remove(i);
                self.live.push(entry);
                break Some(entry.1);
            }
            if self.spilled(ancestor) {
                break None;
            }
            ancestor = nodes[ancestor as usize]
                .row
                .parent
                .expect("the root is always live");
        };
        let mut position = match checkpoint {
            Some(checkpoint) => self.calls().reset(run, checkpoint)?,
            None => {
                let digest = &nodes[ancestor as usize].row.digest;
                let (mut calls, spill) = self.calls_and_spill();
                let spill = spill.expect("it holds the moment");
                let position = spill.load(&mut calls, run, ancestor, digest)?;
                self.keep(ancestor)?;
                position
            }
        };
        if ancestor != node {
            let from = nodes[ancestor as usize].row.depth as usize;
            let path = &nodes[node as usize].row.path;
            self.replayed_steps += (path.steps.len() - from) as u64;
            let started = Instant::now();
            let mut calls = self.calls();
            position = apply_steps(&mut calls, run, &path.steps[from..], path.end_ns)?;
            drop(calls.take_records(run)?);
            self.replay_ms += started.elapsed().as_millis() as u64;
            self.keep(node)?;
        }
        self.at_node = Some(node);
        Ok(position)
    }

    /// Keeps the present moment (node `node`'s) as a live checkpoint, when
    /// the campaign keeps more than the root.
    fn keep(&mut self, node: u64) -> Result<()> {
        if self.live_limit <= 1 {
            return Ok(());
        }
        let run = self.run_id();
        let (checkpoint, _) = self.calls().checkpoint(run)?;
        self.live.push((node, checkpoint));
        while self.live.len() > self.live_limit as usize {
            // The least recently used, never the root.
            let i = self
                .live
                .iter()
                .position(|(id, _)| *id != 0)
                .expect("more than the root");
            let old = self.live.remove(i);
            let (mut calls, spill) = self.calls_and_spill();
            spill::let_go(&mut calls, spill, run, old, checkpoint)?;
        }
        let budget = self.checkpoint_memory;
        let mut calls = Calls {
            runner: &mut *self.runner,
        };
        if let Some(bytes) =
            spill::within_budget(&mut calls, self.spill.as_mut(), run, &mut self.live, budget)?
        {
            self.held_bytes = bytes;
        }
        Ok(())
    }

    /// Runs `job`: to its parent's moment, then its own step (re-key,
    /// faults, a slice); its records and digest, its moment kept if it may
    /// be branched.
    pub fn branch(&mut self, job: &BranchJob, nodes: &[TreeNode]) -> Result<BranchRun> {
        let started = Instant::now();
        let ms = |since: Instant| since.elapsed().as_millis() as u64;
        self.go_to(job.parent, nodes)?;
        let restore_ms = ms(started);
        let running = Instant::now();
        let run = self.run_id();
        let step = job.path.steps.last().expect("a child has a step");
        let mut calls = self.calls();
        let position = apply_steps(&mut calls, run, std::slice::from_ref(step), job.path.end_ns)?;
        let records = calls.take_records(run)?;
        let digest = calls.outcome(run)?.digest;
        let run_ms = ms(running);
        let keeping = Instant::now();
        self.at_node = None;
        if job.keep && position.stop.is_none() {
            self.keep(job.id)?;
            self.at_node = Some(job.id);
        }
        Ok(BranchRun {
            position,
            records,
            digest,
            wall_ms: ms(started),
            parts: BranchParts {
                restore_ms,
                run_ms,
                keep_ms: ms(keeping),
                ..Default::default()
            },
        })
    }

    /// Replays `path` from the root; the records of its steps (the root's
    /// stretch not included) and where it ended.
    pub fn replay_from_root(&mut self, path: &StepPath) -> Result<(Vec<GuestRecord>, Position)> {
        let run = self.run_id();
        let root = self
            .live
            .iter()
            .find(|(id, _)| *id == 0)
            .expect("the root is live")
            .1;
        self.at_node = None;
        let mut calls = self.calls();
        calls.reset(run, root)?;
        let position = apply_steps(&mut calls, run, &path.steps, path.end_ns)?;
        Ok((calls.take_records(run)?, position))
    }

    /// The digest of the run where it is now.
    pub fn digest(&mut self) -> Result<String> {
        let run = self.run_id();
        Ok(self.calls().outcome(run)?.digest)
    }
}

/// A worker per runner; each spills to its own `DIR/spill/wN/` when the
/// campaign keeps checkpoints beyond the root and spills them.
pub(crate) fn workers<'a>(
    runners: Vec<Box<dyn Runner + Send + 'a>>,
    spec: &CampaignSpec,
    dir: &Path,
) -> Vec<Worker<'a>> {
    let spills = spec.spill && spec.live_checkpoints > 1;
    // Each worker's share of the bound.
    let share = spills.then(|| {
        let limit = spec
            .spill_limit
            .unwrap_or_else(|| crate::spill::default_limit(dir));
        limit / runners.len().max(1) as u64
    });
    runners
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let spill_dir = share.map(|share| (crate::spill::worker_dir(dir, i), share));
            // Sized from memory later (Engine::size_checkpoints); until
            // then, by the count a campaign without a bound gets.
            let live = if spec.size_checkpoints_from_memory {
                DEFAULT_LIVE_CHECKPOINTS
            } else {
                spec.live_checkpoints
            };
            Worker::new(r, live, spec.checkpoint_memory, spill_dir)
        })
        .collect()
}
