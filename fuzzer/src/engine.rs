//! The search over the multiverse: boot once to the root moment, then
//! repeatedly choose a moment of the tree (weighted by what its branch
//! showed that was new), branch it with a new seed and drawn faults for a
//! slice of virtual time, judge the history, and keep new failures as
//! findings (shrunk first). State goes to the database after every branch;
//! a resumed campaign rebuilds the tree and continues the same search.

pub use crate::budget::Budget;
use crate::failure::{FailureKey, FailureSlugError};
use crate::findings::{self, FindingFile, NewFinding, FINDING_FORMAT};
use crate::judge::{Failure, Judge};
use crate::spec::CampaignSpec;
use crate::stats::{BranchParts, CampaignStats, GoingBack, WorkerCounts, STATS_META};
use crate::step::Path as StepPath;
use crate::store::{FindingRow, FinishedBranch, NewCampaignDir, NodeRow, Store, StoreError};
use crate::tree::{self, path_records, TreeNode};
use crate::worker::{self, BranchJob, BranchRun, Root, Worker, WorkerError};
use run::api::Position;
use run::client::Runner;
use run::up::PreparedUp;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use vmm::entropy::EntropyStream;
use vmm::VirtNanos;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Finding(#[from] findings::FindingError),
    #[error(transparent)]
    Spill(#[from] crate::spill::SpillError),
    #[error(transparent)]
    Listing(#[from] crate::listing::ListError),
    #[error(transparent)]
    Shrink(#[from] crate::shrink_finding::ShrinkError),
    #[error("resuming: the run reached its root moment with digest {now}, but the campaign was started from {then}: the manifest, its images or this detvisor changed")]
    RootMoved { then: String, now: String },
    #[error("worker {worker} reached the root moment with digest {digest}, worker 0 with {first}: the run is not deterministic")]
    WorkersDiverged {
        worker: usize,
        digest: String,
        first: String,
    },
    #[error("a campaign needs at least one worker")]
    NoWorkers,
    #[error("campaign state: {0}")]
    Tally(String),
    #[error("campaign state: finding {number}")]
    FindingKey {
        number: u32,
        #[source]
        source: FailureSlugError,
    },
}

type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Draws the faults of one branch.
pub trait FaultSource {
    /// Faults (`at=+<d>` from the branch point) for a branch of
    /// `slice_ns` re-keyed with `seed`.
    fn draw(&self, seed: u64, slice_ns: VirtNanos) -> Vec<run::faults::Fault>;
}

/// What the campaign tells its user as it goes.
pub trait Progress {
    fn root(&mut self, position: &Position, digest: &str);
    fn branch(&mut self, report: &BranchReport);
    fn finding(&mut self, number: u32, key: &str, summary: &str, dir: &Path);
    /// Something the user must know now (e.g. the campaign cannot fail);
    /// said once, and kept in [`CampaignSummary::warnings`].
    fn warning(&mut self, text: &str);
}

/// One finished branch, for progress lines.
#[derive(Clone, Debug)]
pub struct BranchReport {
    pub number: u64,
    pub parent: u64,
    pub depth: u32,
    pub seed: u64,
    pub faults: usize,
    pub end_ns: VirtNanos,
    pub failures: usize,
    pub novelty: f64,
    pub wall_ms: u64,
    /// The worker that ran it.
    pub worker: usize,
}

/// What a campaign (or its part in this process) did.
#[derive(Clone, Debug, Default)]
pub struct CampaignSummary {
    pub branches: u64,
    pub branches_this_run: u64,
    /// Branches chosen together (the campaign's, fixed at its creation).
    pub batch_width: u32,
    /// Workers that ran this process's share.
    pub workers: usize,
    pub findings: Vec<FindingRow>,
    pub end_failures: Vec<Failure>,
    pub wall_ms: u64,
    pub stopped_by: String,
    /// Checkpoints written to disk and loaded back in this process.
    pub spill: crate::spill::SpillStats,
    /// What going back to moments cost this process's workers.
    pub going_back: GoingBack,
    /// What [`Progress::warning`] was told, in order.
    pub warnings: Vec<String>,
    /// What shrinking new findings cost in this process.
    pub shrinking: crate::shrink_finding::ShrinkStats,
}

pub struct Engine<'a> {
    workers: Vec<Worker<'a>>,
    spec: CampaignSpec,
    dir: PathBuf,
    store: Store,
    judge: Box<dyn Judge + 'a>,
    faults: Box<dyn FaultSource + 'a>,
    prepared: PreparedUp,
    nodes: Vec<TreeNode>,
    findings: BTreeMap<FailureKey, u32>,
    branches: u64,
    wall_before_ms: u64,
    /// Warnings given in this process (see [`crate::silence`]).
    warnings: Vec<String>,
    /// The first branches' records were looked at in this process.
    silence_checked: bool,
    /// What the campaign counted (see [`crate::stats`]), the workers'
    /// counts of this run not included.
    stats: CampaignStats,
    /// What shrinking cost in this process.
    shrink_stats: crate::shrink_finding::ShrinkStats,
}

/// Seed of branch `k` of the campaign seeded `seed` (a shard's branch
/// draws [`crate::shard::Shard::branch_seed`]).
pub fn branch_seed(seed: u64, k: u64) -> u64 {
    EntropyStream::new(seed, &format!("campaign-branch-seed-{k}")).next_u64()
}

impl<'a> Engine<'a> {
    /// A new campaign in the claimed directory `claimed` (the spec and
    /// prepared run checked by the caller; claimed before the runners
    /// started), run by one worker per runner: `host_run` is the run as
    /// assembled here (its files are kept in the campaign's directory by
    /// digest), `prepared` the same run as the runners see it (in a helper
    /// VM, its files are shipped there). A spec's batch width of 0 becomes
    /// the number of runners, for the campaign's whole life.
    pub fn create(
        runners: impl Into<Runners<'a>>,
        mut spec: CampaignSpec,
        host_run: &PreparedUp,
        prepared: PreparedUp,
        claimed: NewCampaignDir,
        judge: Box<dyn Judge + 'a>,
        faults: Box<dyn FaultSource + 'a>,
    ) -> Result<Self> {
        let dir = &claimed.path().to_owned();
        let Runners(runners) = runners.into();
        if runners.is_empty() {
            return Err(EngineError::NoWorkers);
        }
        if spec.batch_width == 0 {
            spec.batch_width = runners.len() as u32;
        }
        // The run's files go by digest into the directory first: a database
        // that exists names only files that do.
        let blobified = findings::blobify(dir, host_run)?;
        let stats = CampaignStats::default();
        let store = Store::create_in(
            claimed,
            &[
                (
                    "spec",
                    serde_json::to_string(&spec).expect("specs serialize"),
                ),
                (
                    "run",
                    serde_json::to_string(&blobified).expect("runs serialize"),
                ),
                ("batch_width", spec.batch_width.to_string()),
            ],
        )?;
        Ok(Engine {
            workers: worker::workers(runners, &spec, dir),
            spec,
            dir: dir.to_owned(),
            store,
            judge,
            faults,
            prepared,
            nodes: Vec::new(),
            findings: BTreeMap::new(),
            branches: 0,
            wall_before_ms: 0,
            warnings: Vec::new(),
            silence_checked: false,
            stats,
            shrink_stats: Default::default(),
        })
    }

    /// The campaign in `dir`, to continue with a worker per runner (any
    /// number: the search is the campaign's batch width's, whoever runs
    /// it): its spec and run as saved.
    pub fn resume(
        runners: impl Into<Runners<'a>>,
        dir: &Path,
        judge: Box<dyn Judge + 'a>,
        faults: impl FnOnce(&CampaignSpec) -> Box<dyn FaultSource + 'a>,
        resolve_run: impl FnOnce(&Path, PreparedUp) -> Result<PreparedUp>,
    ) -> Result<Self> {
        let store = Store::open(dir)?;
        Self::resume_store(runners, dir, store, judge, faults, resolve_run)
    }

    /// As [`Engine::resume`], with the campaign's database already open
    /// (and so locked: a caller that read the spec first keeps the lock
    /// until the campaign ends).
    pub fn resume_store(
        runners: impl Into<Runners<'a>>,
        dir: &Path,
        store: Store,
        judge: Box<dyn Judge + 'a>,
        faults: impl FnOnce(&CampaignSpec) -> Box<dyn FaultSource + 'a>,
        resolve_run: impl FnOnce(&Path, PreparedUp) -> Result<PreparedUp>,
    ) -> Result<Self> {
        let Runners(runners) = runners.into();
        if runners.is_empty() {
            return Err(EngineError::NoWorkers);
        }
        let meta = store.campaign_meta()?;
        let spec = meta.spec;
        let prepared = resolve_run(dir, meta.run)?;
        store.check_paths(&prepared.node_names)?;
        let mut judge = judge;
        if let Some(tally) = meta.tally {
            judge.load(&tally).map_err(EngineError::Tally)?;
        }
        let mut nodes = Vec::new();
        for row in store.nodes()? {
            let records = store.records(row.id)?.unwrap_or_default();
            nodes.push(TreeNode { row, records });
        }
        let rows = store.findings()?;
        let indexed: Vec<u32> = rows.iter().map(|f| f.number).collect();
        // A finding written by the branch in flight when the campaign was
        // killed: that branch runs again and writes it again.
        crate::listing::remove_unindexed(dir, &indexed)?;
        let findings = rows
            .into_iter()
            .map(|f| match FailureKey::from_slug(&f.key) {
                Ok(key) => Ok((key, f.number)),
                Err(source) => Err(EngineError::FindingKey {
                    number: f.number,
                    source,
                }),
            })
            .collect::<Result<_>>()?;
        let branches = store.branches()?;
        let wall_before_ms = store.wall_ms()?;
        let stats = store.meta_json(STATS_META)?.unwrap_or_default();
        let faults = faults(&spec);
        Ok(Engine {
            workers: worker::workers(runners, &spec, dir),
            spec,
            dir: dir.to_owned(),
            store,
            judge,
            faults,
            prepared,
            nodes,
            findings,
            branches,
            wall_before_ms,
            warnings: Vec::new(),
            silence_checked: false,
            stats,
            shrink_stats: Default::default(),
        })
    }

    /// Lets each worker's checkpoints hold `share` bytes (see
    /// [`crate::sizing`]) when the campaign sizes them from the memory
    /// available; with no share (too little spare, or not known) they are
    /// bounded by the default count instead.
    pub fn size_checkpoints(&mut self, share: Option<u64>) {
        if !self.spec.size_checkpoints_from_memory {
            return;
        }
        if let Some(bytes) = share {
            tracing::info!(
                "live checkpoints sized from the memory available: {} a worker",
                run::units::ByteSize(bytes)
            );
        }
        for worker in &mut self.workers {
            worker.size_checkpoints(share, self.spec.live_checkpoints);
        }
    }

    pub fn spec(&self) -> &CampaignSpec {
        &self.spec
    }

    /// Branches committed so far.
    pub fn branches(&self) -> u64 {
        self.branches
    }

    /// Distinct failures found so far.
    pub fn findings(&self) -> usize {
        self.findings.len()
    }

    /// Every worker boots and runs to the root moment, at once; they must
    /// all reach it with the same digest. Worker 0's records and position.
    fn reach_root(&mut self) -> Result<Root> {
        let (prepared, spec) = (&self.prepared, &self.spec);
        let roots: Vec<worker::Result<Root>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .workers
                .iter_mut()
                .map(|w| s.spawn(move || w.boot(prepared, spec)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a worker panicked"))
                .collect()
        });
        let mut roots = roots.into_iter().collect::<Result<Vec<Root>, _>>()?;
        for (worker, root) in roots.iter().enumerate().skip(1) {
            if root.digest != roots[0].digest {
                return Err(EngineError::WorkersDiverged {
                    worker,
                    digest: root.digest.clone(),
                    first: roots[0].digest.clone(),
                });
            }
        }
        Ok(roots.swap_remove(0))
    }

    /// Runs the campaign until a budget is spent or `stop` says so.
    pub fn run(
        &mut self,
        budget: Budget,
        progress: &mut dyn Progress,
        stop: &dyn Fn() -> bool,
    ) -> Result<CampaignSummary> {
        let started = Instant::now();
        let _campaign = tracing::info_span!(
            "campaign",
            dir = %self.dir.display(),
            shard = %self.spec.shard
        )
        .entered();
        crate::spill::clear(&self.dir)?;
        let Root {
            position,
            records: root_records,
            digest,
        } = tracing::info_span!("boot_to_root", workers = self.workers.len())
            .in_scope(|| self.reach_root())?;
        tracing::debug!(%digest, exits = position.exits, "root reached");
        self.stats.root_ms += started.elapsed().as_millis() as u64;
        self.stats.workers = self.stats.workers.max(self.workers.len() as u32);
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
            let _ = self.judge.judge(&[&root_records]);
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
                records: root_records,
            });
        } else if self.nodes[0].row.digest != digest {
            return Err(EngineError::RootMoved {
                then: self.nodes[0].row.digest.clone(),
                now: digest,
            });
        }
        progress.root(&position, &digest);
        self.warn_if_silent(progress);
        let width = self.spec.batch_width.max(1);
        let mut this_run = 0u64;
        let stopped_by = loop {
            if let Some(spent) = budget.spent(started.elapsed(), self.branches) {
                break spent.to_string();
            }
            if stop() {
                break "interrupted".to_string();
            }
            // The rest of the present batch (all of it, unless a kill or a
            // budget cut it short), as many at once as there are workers.
            let k = self.branches;
            let start = tree::batch_start(k, width);
            let Some(parents) = tree::choose_batch(
                &self.nodes,
                self.spec.seed,
                self.spec.shard,
                self.spec.max_depth,
                start,
                start + u64::from(width),
            ) else {
                break "no moment left to branch (every run stopped or at the depth limit)"
                    .to_string();
            };
            let mut end = (start + u64::from(width)).min(k + self.workers.len() as u64);
            if budget.branches > 0 {
                end = end.min(budget.branches);
            }
            let jobs: Vec<BranchJob> = (k..end)
                .map(|j| self.job(j, parents[(j - start) as usize]))
                .collect();
            let _wave =
                tracing::debug_span!("wave", first = k + 1, branches = jobs.len()).entered();
            let runs = self.run_wave(&jobs)?;
            let notes: Vec<String> = self
                .workers
                .iter_mut()
                .flat_map(|w| w.take_notes())
                .collect();
            for note in notes {
                self.warn(progress, note);
            }
            for (job, done) in jobs.into_iter().zip(runs) {
                let report = self.commit(job, done, progress, started)?;
                this_run += 1;
                progress.branch(&report);
                self.warn_if_silent(progress);
            }
        };
        let wall_ms = self.wall_before_ms + started.elapsed().as_millis() as u64;
        self.store.commit_meta(&[
            ("wall_ms", wall_ms.to_string()),
            (STATS_META, self.stats_now().to_json()),
        ])?;
        let going_back = GoingBack {
            counts: self.counts(),
            worker_ms: started.elapsed().as_millis() as u64 * self.workers.len() as u64,
        };
        let mut spill = crate::spill::SpillStats::default();
        for worker in &mut self.workers {
            spill += worker.finish_spill()?;
        }
        crate::spill::clear(&self.dir)?;
        Ok(CampaignSummary {
            branches: self.branches,
            branches_this_run: this_run,
            batch_width: width,
            workers: self.workers.len(),
            findings: self.store.findings()?,
            end_failures: self.judge.end_of_campaign(),
            wall_ms,
            stopped_by,
            spill,
            going_back,
            warnings: self.warnings.clone(),
            shrinking: self.shrink_stats,
        })
    }

    /// The campaign's stats with what the workers counted in this run.
    fn stats_now(&self) -> CampaignStats {
        self.stats.with_counts(self.counts())
    }

    /// What the workers counted in this run, summed.
    fn counts(&self) -> WorkerCounts {
        let mut counts = WorkerCounts::default();
        for worker in &self.workers {
            counts += worker.counts();
        }
        counts
    }

    /// Warns once (a resumed campaign again) when the root and the first
    /// branches delivered nothing a property could judge.
    fn warn_if_silent(&mut self, progress: &mut dyn Progress) {
        if self.silence_checked || self.nodes.len() <= crate::silence::CHECKED_BRANCHES {
            return;
        }
        self.silence_checked = true;
        if let Some(text) = crate::silence::warning(&self.nodes) {
            self.warn(progress, text);
        }
    }

    /// Says `text` once and keeps it for the summary.
    fn warn(&mut self, progress: &mut dyn Progress, text: String) {
        progress.warning(&text);
        self.warnings.push(text);
    }

    /// Branch `k` of `parent`: its seed (this shard's), its faults (drawn
    /// from the seed) and its path.
    fn job(&self, k: u64, parent: u64) -> BranchJob {
        let seed = self.spec.shard.branch_seed(self.spec.seed, k);
        let faults = self.faults.draw(seed, self.spec.slice_ns);
        let parent_row = &self.nodes[parent as usize].row;
        BranchJob {
            id: k + 1,
            parent,
            seed,
            path: parent_row.path.child(seed, faults, self.spec.slice_ns),
            keep: parent_row.depth + 1 < self.spec.max_depth,
        }
    }

    /// Runs `jobs` (at most one per worker) at once, each on the free
    /// worker where it is cheapest to reach (its parent live there, else
    /// the deepest live ancestor; ties to the lowest worker); their results
    /// in the jobs' order, with the worker that ran each.
    fn run_wave(&mut self, jobs: &[BranchJob]) -> worker::Result<Vec<(usize, BranchRun)>> {
        let mut placed: Vec<Option<usize>> = vec![None; self.workers.len()];
        for (j, job) in jobs.iter().enumerate() {
            let worker = (0..self.workers.len())
                .filter(|&w| placed[w].is_none())
                .min_by_key(|&w| (self.workers[w].replay_cost(job.parent, &self.nodes), w))
                .expect("a wave has at most one job per worker");
            placed[worker] = Some(j);
        }
        let nodes = &self.nodes;
        let mut results: Vec<(usize, worker::Result<(usize, BranchRun)>)> =
            std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .workers
                    .iter_mut()
                    .enumerate()
                    .filter_map(|(w, worker)| placed[w].map(|j| (w, j, worker)))
                    .map(|(w, j, worker)| {
                        let job = &jobs[j];
                        (
                            j,
                            s.spawn(move || worker.branch(job, nodes).map(|r| (w, r))),
                        )
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|(j, h)| (j, h.join().expect("a worker panicked")))
                    .collect()
            });
        results.sort_by_key(|(j, _)| *j);
        results.into_iter().map(|(_, r)| r).collect()
    }

    /// Judges branch `job` as `done` by `worker` and commits it: its
    /// moment, new findings (shrunk first), the judge's tally. Called in
    /// branch order, so verdicts and novelty do not depend on timing.
    fn commit(
        &mut self,
        job: BranchJob,
        (worker, done): (usize, BranchRun),
        progress: &mut dyn Progress,
        started: Instant,
    ) -> Result<BranchReport> {
        let id = job.id;
        debug_assert_eq!(id as usize, self.nodes.len());
        let depth = self.nodes[job.parent as usize].row.depth + 1;
        let faults = job.path.steps.last().map_or(0, |s| s.faults.len());
        self.nodes.push(TreeNode {
            row: NodeRow {
                id,
                parent: Some(job.parent),
                depth,
                path: job.path,
                end_exits: done.position.exits,
                end_ns: done.position.virtual_ns,
                digest: done.digest,
                score: 0.0,
                stopped: done.position.stop.is_some(),
            },
            records: done.records,
        });
        let judging = Instant::now();
        let verdict = {
            let chain = path_records(&self.nodes, id);
            self.judge.judge(&chain)
        };
        let parts = BranchParts {
            judge_ms: judging.elapsed().as_millis() as u64,
            ..done.parts
        };
        let judged_at_ms = self.wall_before_ms + started.elapsed().as_millis() as u64;
        // Failures already found are no news: branching their subtree again
        // would find them again.
        let new_failures = verdict
            .failures
            .iter()
            .filter(|f| !self.found(&f.key))
            .count();
        self.nodes[id as usize].row.score = verdict.novelty + new_failures as f64;
        let mut new_findings = Vec::new();
        for failure in &verdict.failures {
            if self.found(&failure.key) {
                continue;
            }
            let shrinking = Instant::now();
            let row = self.make_finding(id, failure)?;
            self.stats.shrink_ms += shrinking.elapsed().as_millis() as u64;
            let at_ms = self.wall_before_ms + started.elapsed().as_millis() as u64;
            self.stats.findings_at_ms.insert(row.number, at_ms);
            self.stats.found_at_ms.insert(row.number, judged_at_ms);
            self.findings.insert(failure.key.clone(), row.number);
            new_findings.push(row);
        }
        self.branches += 1;
        let wall_ms = self.wall_before_ms + started.elapsed().as_millis() as u64;
        self.stats.branch(worker, done.wall_ms, wall_ms);
        let committing = Instant::now();
        let node = &self.nodes[id as usize];
        let records_json = serde_json::to_string(&node.records).expect("records serialize");
        let tally = self.judge.save();
        // The transaction's own time is known only after it: counted in the
        // next commit's stats (and in the campaign's last).
        self.stats.branch_parts(parts);
        let stats = self.stats_now().to_json();
        self.store.commit_branch(&FinishedBranch {
            node: &node.row,
            records_json: &records_json,
            findings: &new_findings,
            meta: &[
                ("branches", self.branches.to_string()),
                ("wall_ms", wall_ms.to_string()),
                ("tally", tally),
                (STATS_META, stats),
            ],
        })?;
        self.stats.branch_parts(BranchParts {
            commit_ms: committing.elapsed().as_millis() as u64,
            ..BranchParts::default()
        });
        for row in &new_findings {
            progress.finding(
                row.number,
                &row.key,
                &row.summary,
                &findings::finding_dir(&self.dir, row.number),
            );
        }
        Ok(BranchReport {
            number: id,
            parent: job.parent,
            depth,
            seed: job.seed,
            faults,
            end_ns: done.position.virtual_ns,
            failures: verdict.failures.len(),
            novelty: verdict.novelty,
            wall_ms: done.wall_ms,
            worker,
        })
    }

    /// Whether the campaign has a finding of `key` already: the same key,
    /// or an old one (a campaign resumed from before property keys left
    /// the line out) that [matches](FailureKey::matches) it.
    fn found(&self, key: &FailureKey) -> bool {
        self.findings.contains_key(key) || self.findings.keys().any(|k| k.matches(key))
    }

    /// Shrinks `failure`'s path (`node`'s) on every worker at once
    /// ([`crate::shrink_finding`]), writes its directory.
    fn make_finding(&mut self, node: u64, failure: &Failure) -> Result<FindingRow> {
        let _shrink =
            tracing::info_span!("shrink", moment = node, key = %failure.key.slug()).entered();
        let found = self.nodes[node as usize].row.path.clone();
        let key = failure.key.clone();
        let root_records = self.nodes[0].records.clone();
        let root_end = self.nodes[0].row.end_ns;
        let judge = &self.judge;
        let shrunk = crate::shrink_finding::shrink(
            &mut self.workers,
            judge.as_ref(),
            &root_records,
            root_end,
            &found,
            &key,
        )?;
        self.shrink_stats += shrunk.stats;
        let (path, digest, position, records) =
            (shrunk.path, shrunk.digest, shrunk.position, shrunk.records);
        let failure = shrunk.failure.unwrap_or_else(|| failure.clone());
        let number = findings::next_number(
            &self.dir,
            self.findings.values().max().copied().unwrap_or(0) + 1,
        );
        let run_file = self.store.campaign_meta()?.run;
        let mut all_records = root_records.clone();
        all_records.extend(records);
        let failure_moment = crate::failure_moment::find_or_end(
            &all_records,
            judge.as_ref(),
            &key,
            position.exits,
            position.virtual_ns,
        );
        findings::write(
            &self.dir,
            &NewFinding {
                file: FindingFile {
                    format: FINDING_FORMAT,
                    number,
                    key: key.slug(),
                    summary: failure.summary.clone(),
                    details: failure.details.clone(),
                    path,
                    found_path: found,
                    digest,
                    exits: position.exits,
                    virtual_ns: position.virtual_ns,
                    spec: self.spec.clone(),
                    failure_moment: Some(failure_moment),
                    shrinking: Some(shrunk.shrinking),
                },
                run: &run_file,
                failure: &failure,
                records: &all_records,
            },
        )?;
        Ok(FindingRow {
            number,
            key: key.slug(),
            summary: failure.summary,
            node,
        })
    }
}

/// The runners of a campaign's workers: one borrowed (`&mut runner`), or
/// several boxed.
pub struct Runners<'a>(pub Vec<Box<dyn Runner + Send + 'a>>);

impl<'a, R: Runner + Send + 'a> From<&'a mut R> for Runners<'a> {
    fn from(runner: &'a mut R) -> Self {
        Runners(vec![Box::new(runner)])
    }
}

impl<'a> From<Vec<Box<dyn Runner + Send + 'a>>> for Runners<'a> {
    fn from(runners: Vec<Box<dyn Runner + Send + 'a>>) -> Self {
        Runners(runners)
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
