//! A campaign as one typed API, for the CLI and a server alike: start one
//! from its file, resume one from its directory, run it with a
//! [`Progress`], list its findings, replay one. Where the runs happen is
//! decided here too: a run library per worker in this process, or a helper
//! VM per worker (each sized for the run, all checked against the host's
//! memory before anything starts).

use crate::budget::{Budget, WallBudget};
use crate::engine::{CampaignSummary, Engine, EngineError, Progress};
use crate::failure_moment::FailureMoment;
use crate::findings::{self, FindingError, LoadedFinding};
use crate::judges::JudgesError;
use crate::listing::{self, ListError};
use crate::replay::{ReplayError, ReplayReport};
use crate::shard::Shard;
use crate::shrink_finding::Shrinking;
use crate::spec::{CampaignFile, CampaignSpec, SpecError, MAX_BATCH_WIDTH};
use crate::store::{NewCampaignDir, Store, StoreError};
use helper_vm::client::{NeedsError, Placed, RemoteError};
use helper_vm::{HostVmMode, Placement};
use run::api::Request;
use run::client::{Calls, InProcess, Runner, RunnerError};
use run::up::{PreparedUp, UpOptions};
use serde::Serialize;
use std::path::{Path, PathBuf};
use vmm::VirtNanos;

#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Manifest(#[from] run::manifest::ManifestError),
    #[error(transparent)]
    Prepare(#[from] run::up::PrepareError),
    #[error(transparent)]
    Judges(#[from] JudgesError),
    #[error(transparent)]
    Finding(#[from] FindingError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    List(#[from] ListError),
    #[error(transparent)]
    Replay(#[from] ReplayError),
    #[error(transparent)]
    Needs(#[from] NeedsError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("turning seccomp off (--no-seccomp)")]
    Seccomp(#[source] RunnerError),
    /// Helper VMs the host's available memory cannot hold (QEMU would be
    /// killed half-way instead).
    #[error("--jobs {workers}: {workers} helper VMs of {memory_mib} MiB need {needed} MiB, and this host has {available_mib} MiB available")]
    Memory {
        workers: u32,
        memory_mib: u32,
        needed: u64,
        available_mib: u64,
    },
    #[error("directory {}", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `--resume` with a shard other than the one the campaign was
    /// created as.
    #[error("{}: the campaign is shard {recorded}, not {given}: a shard keeps its part of the search for its whole life", dir.display())]
    ShardChanged {
        dir: PathBuf,
        recorded: Shard,
        given: Shard,
    },
    #[error("creating {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type Result<T, E = CampaignError> = std::result::Result<T, E>;

/// Where a campaign's runs happen (`--host-vm`, `--no-seccomp`).
#[derive(Clone, Copy, Debug)]
pub struct Place {
    pub host_vm: HostVmMode,
    /// Whether the guests run under the VMM's seccomp filter.
    pub seccomp: bool,
}

/// A runner of a campaign's worker: the run library on a thread of its
/// own, or a helper VM.
pub type WorkerRunner = Placed<InProcess>;

/// What overrides the campaign's own budget for this run of it.
#[derive(Clone, Copy, Debug, Default)]
pub struct BudgetOverride {
    /// Wall time (`Some(WallBudget(None))`: no limit).
    pub wall: Option<WallBudget>,
    /// Branches in all (0: no limit).
    pub branches: Option<u64>,
}

impl BudgetOverride {
    fn budget(self, spec: &CampaignSpec) -> Budget {
        Budget {
            wall: crate::budget::wall_duration(
                self.wall.map_or_else(|| spec.wall_budget(), |wall| wall.0),
            ),
            branches: self.branches.unwrap_or(spec.max_branches),
        }
    }
}

/// A new campaign: its file, its directory, and how it runs.
#[derive(Clone, Debug)]
pub struct NewCampaign {
    pub file: PathBuf,
    pub out: PathBuf,
    pub budget: BudgetOverride,
    /// Workers (0: one per core, at most [`MAX_BATCH_WIDTH`]).
    pub jobs: u32,
    pub place: Place,
    /// The part of the search this campaign runs ([`Shard::WHOLE`]: all).
    pub shard: Shard,
}

/// A campaign ready to run: its workers started, its database open (and
/// locked) until it is dropped.
pub struct Campaign {
    engine: Engine<'static>,
    budget: Budget,
}

impl Campaign {
    /// Starts a new campaign: everything checked (the directory, the file,
    /// the manifest, the helper VMs' memory) before the directory is claimed
    /// or any helper VM starts. The file's warnings go to `progress`.
    pub fn start(new: &NewCampaign, progress: &mut dyn Progress) -> Result<Campaign> {
        NewCampaignDir::check(&new.out).map_err(StoreError::from)?;
        let campaign = CampaignFile::load(&new.file)?;
        for warning in &campaign.warnings {
            progress.warning(warning);
        }
        let budget = new.budget.budget(&campaign.spec);
        let manifest = run::manifest::load(&campaign.spec.manifest)?;
        campaign.check_manifest(&manifest)?;
        let mut spec = campaign.spec;
        spec.shard = new.shard;
        let prepared = run::up::prepare(&manifest, &[], None, None)?;
        let judge = crate::judges::campaign_judge(&spec)?;
        let faults = crate::judges::fault_source(&spec, &prepared)?;
        let plan = plan(new.place, &prepared, workers(new.jobs), Sizing::of(&spec))?;
        let checkpoint_share = plan.checkpoint_share;
        // Claimed (created and locked) before any helper VM starts or any
        // file is written there.
        let claimed = NewCampaignDir::claim(&new.out).map_err(StoreError::from)?;
        let (runners, there) = plan.start(&[claimed.path()])?;
        let mut engine = Engine::create(
            boxed(runners),
            spec,
            &prepared,
            there,
            claimed,
            judge,
            faults,
        )?;
        engine.size_checkpoints(checkpoint_share);
        Ok(Campaign { engine, budget })
    }

    /// The campaign in `dir`, to continue (killed, interrupted or out of
    /// budget): its spec (its shard included) and run are its own, checked
    /// before any VM starts; `shard`, when given, must be the campaign's.
    pub fn resume(
        dir: &Path,
        budget: BudgetOverride,
        jobs: u32,
        place: Place,
        shard: Option<Shard>,
    ) -> Result<Campaign> {
        let dir = absolute(dir)?;
        let store = Store::open(&dir)?;
        let meta = store.campaign_meta()?;
        if let Some(given) = shard.filter(|&given| given != meta.spec.shard) {
            return Err(CampaignError::ShardChanged {
                dir,
                recorded: meta.spec.shard,
                given,
            });
        }
        let host_run = findings::resolve(&dir, &meta.run)?;
        store.check_paths(&host_run.node_names)?;
        let budget = budget.budget(&meta.spec);
        let judge = crate::judges::campaign_judge(&meta.spec)?;
        let faults = crate::judges::fault_source(&meta.spec, &host_run)?;
        let plan = plan(place, &host_run, workers(jobs), Sizing::of(&meta.spec))?;
        let checkpoint_share = plan.checkpoint_share;
        let (runners, there) = plan.start(&[&dir])?;
        // The store stays open (and locked) from here to the campaign's end.
        let mut engine = Engine::resume_store(
            boxed(runners),
            &dir,
            store,
            judge,
            |_| faults,
            |_, _| Ok(there),
        )?;
        engine.size_checkpoints(checkpoint_share);
        Ok(Campaign { engine, budget })
    }

    /// What this run of the campaign may spend.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// Branches taken so far (a resumed campaign's earlier runs' included).
    pub fn branches(&self) -> u64 {
        self.engine.branches()
    }

    /// Findings so far (a resumed campaign's earlier runs' included).
    pub fn findings(&self) -> usize {
        self.engine.findings()
    }

    /// The part of the search this campaign runs.
    pub fn shard(&self) -> Shard {
        self.engine.spec().shard
    }

    /// Runs the campaign until its budget is spent or `stop` says so.
    pub fn run(
        &mut self,
        progress: &mut dyn Progress,
        stop: &dyn Fn() -> bool,
    ) -> Result<CampaignSummary> {
        Ok(self.engine.run(self.budget, progress, stop)?)
    }
}

/// A campaign's findings, one row each, as `detvisor findings --json`
/// prints them (field names and order are that JSON's).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FindingLine {
    pub digest: String,
    pub dir: PathBuf,
    /// The failure moment as `finding.json` holds it (findings written
    /// before it was kept have none here: [`findings::failure_moment`]
    /// computes theirs, which a listing does not, to stay cheap). In the
    /// keys' sorted place, as the line's other keys.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_moment: Option<FailureMoment>,
    /// Faults of the shrunk path.
    pub faults: usize,
    /// Faults of the path as it was found.
    pub found_faults: usize,
    /// Steps of the path as it was found.
    pub found_steps: usize,
    pub key: String,
    pub number: u32,
    /// How the path was shrunk (findings written before steps and ends
    /// were shrunk have none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shrinking: Option<Shrinking>,
    /// Steps of the shrunk path.
    pub steps: usize,
    pub summary: String,
    /// Where the shrunk path ends.
    pub virtual_ns: VirtNanos,
}

impl FindingLine {
    /// The line of `finding.json` in the finding directory `dir`.
    pub fn read(dir: &Path) -> Result<FindingLine> {
        Ok(Self::of_file(dir.to_owned(), findings::read_file(dir)?))
    }

    pub(crate) fn of_file(dir: PathBuf, file: findings::FindingFile) -> FindingLine {
        FindingLine {
            digest: file.digest,
            dir,
            faults: file.path.fault_count(),
            found_faults: file.found_path.fault_count(),
            found_steps: file.found_path.steps.len(),
            key: file.key,
            number: file.number,
            shrinking: file.shrinking,
            steps: file.path.steps.len(),
            summary: file.summary,
            virtual_ns: file.virtual_ns,
            failure_moment: file.failure_moment,
        }
    }

    /// What shrinking made of the path, for people: its faults (or none),
    /// and its minimal path (steps, failure moment, end).
    pub fn shrunk(&self) -> String {
        let count = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
        let faults = if self.found_faults == 0 {
            "no faults".to_string()
        } else {
            format!(
                "{} after shrinking from {}",
                count(self.faults, "fault"),
                self.found_faults
            )
        };
        match (self.shrinking, self.failure_moment) {
            (Some(shrinking), Some(moment)) => {
                let end = if shrinking.ends_at_failure {
                    " and ends there".to_string()
                } else {
                    format!(", ends at {}", self.virtual_ns)
                };
                format!(
                    "{faults}; minimal path: {} (of {} found), fails at {}{end}",
                    count(self.steps, "step"),
                    self.found_steps,
                    moment.virtual_ns
                )
            }
            // Written before steps and ends were shrunk.
            _ if self.found_faults == 0 => format!(
                "{faults}; {}, not shrunk; ends at {}",
                count(self.steps, "step"),
                self.virtual_ns
            ),
            _ => format!("{faults}; ends at {}", self.virtual_ns),
        }
    }
}

/// The findings of the campaign in `dir`, in order (readable while the
/// campaign runs).
pub fn findings(dir: &Path) -> Result<Vec<FindingLine>> {
    Ok(listing::list(dir)?
        .into_iter()
        .map(|listing::Listed { dir, file }| FindingLine::of_file(dir, file))
        .collect())
}

/// Replays the finding in `finding` (a `DIR/findings/NNNN`, wherever it was
/// copied) bit for bit, its nodes' logs into `logs` when given, telling
/// `progress` how far it has come (see [`crate::replay::ReplayProgress`]).
pub fn replay(
    finding: &Path,
    logs: Option<&Path>,
    place: Place,
    progress: &mut dyn FnMut(crate::replay::ReplayProgress),
) -> Result<ReplayReport> {
    let dir = absolute(finding)?;
    let finding = findings::load(&dir)?;
    let judge = crate::judges::campaign_judge(&finding.file.spec)?;
    let logs = match logs {
        Some(logs) => {
            std::fs::create_dir_all(logs).map_err(|source| CampaignError::CreateDir {
                path: logs.to_path_buf(),
                source,
            })?;
            Some(absolute(logs)?)
        }
        None => None,
    };
    let shared: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    let (mut runners, there) = plan(place, &finding.run, 1, Sizing::Count)?.start(&shared)?;
    let loaded = LoadedFinding {
        run: there,
        ..finding
    };
    Ok(crate::replay::replay_loaded(
        &mut runners[0],
        &loaded,
        judge.as_ref(),
        logs.as_deref(),
        progress,
    )?)
}

/// `workers` runners of `prepared`, placed as `place` says (a run library
/// each here, or a helper VM each, checked against the host's memory
/// first), sharing the directories `shared` (which exist) with them; the
/// run as the runners see it. For a caller that drives a finding's run
/// itself (the debugger's verification and likelihood).
pub fn start_runners(
    place: Place,
    prepared: &PreparedUp,
    workers: u32,
    shared: &[&Path],
) -> Result<(Vec<WorkerRunner>, PreparedUp)> {
    plan(place, prepared, workers.max(1), Sizing::Count)?.start(shared)
}

/// Workers for `jobs`: 0 is one per core of this host (at most
/// [`MAX_BATCH_WIDTH`]).
pub fn workers(jobs: u32) -> u32 {
    if jobs > 0 {
        return jobs;
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get() as u32)
        .min(MAX_BATCH_WIDTH)
}

fn absolute(dir: &Path) -> Result<PathBuf> {
    dir.canonicalize()
        .map_err(|source| CampaignError::Directory {
            path: dir.to_path_buf(),
            source,
        })
}

/// Boxes runners for the engine's workers.
fn boxed(runners: Vec<WorkerRunner>) -> Vec<Box<dyn Runner + Send>> {
    runners
        .into_iter()
        .map(|r| Box::new(r) as Box<dyn Runner + Send>)
        .collect()
}

/// Where the runs of a campaign will happen, decided and checked (the
/// helper VMs' memory against the host's) before anything is written or
/// started: a refusal leaves nothing behind.
struct Plan {
    workers: u32,
    place: Place,
    planned: Planned,
    /// Bytes each worker's checkpoints may hold, when the campaign sizes
    /// them from the memory available ([`crate::sizing`]).
    checkpoint_share: Option<u64>,
}

enum Planned {
    Here(PreparedUp),
    /// What each worker's helper VM holds; `there` is the run as the
    /// helper VMs see it.
    HelperVm {
        reason: String,
        needs: Vec<helper_vm::client::Needs>,
        there: PreparedUp,
    },
}

/// A plan for `workers` runners of `prepared`: here, a run library each; in
/// the helper VM, a helper VM each (one vCPU: measured faster than one
/// helper VM with a vCPU per worker, whose multi-threaded TCG also changed
/// the guest's digest; see docs/campaigns.md).
fn plan(place: Place, prepared: &PreparedUp, workers: u32, sizing: Sizing) -> Result<Plan> {
    let available = || helper_vm::client::available_memory_mib().map(|mib| mib << 20);
    let mut checkpoint_share = None;
    let planned = match helper_vm::placement(place.host_vm) {
        Placement::Host => {
            if sizing == Sizing::FromMemory {
                checkpoint_share = available().and_then(|bytes| {
                    crate::sizing::checkpoint_share(bytes, workers, prepared.ram_bytes)
                });
            }
            Planned::Here(prepared.clone())
        }
        Placement::HelperVm { reason } => {
            let mut needs = Vec::new();
            let mut there = prepared.clone();
            for _ in 0..workers {
                // A worker boots the run as `BootUp` with its own options
                // later: what the helper VM holds is the run's.
                let mut request = Request::BootUp {
                    prepared: prepared.clone(),
                    options: UpOptions::new(0),
                };
                needs.push(helper_vm::client::needs(&mut request)?);
                if let Request::BootUp { prepared, .. } = request {
                    there = prepared;
                }
            }
            let checkpoint_bytes = match sizing {
                Sizing::FromMemory => {
                    let run_bytes = u64::from(needs[0].memory_mib) << 20;
                    checkpoint_share = available().and_then(|bytes| {
                        crate::sizing::checkpoint_share(bytes, workers, run_bytes)
                    });
                    checkpoint_share
                }
                Sizing::Bytes(bytes) => Some(bytes),
                Sizing::Count => None,
            };
            // Each helper VM holds its worker's checkpoints too.
            let checkpoint_mib = checkpoint_bytes.map_or(0, |bytes| bytes.div_ceil(1 << 20));
            for needs in &mut needs {
                needs.memory_mib = needs
                    .memory_mib
                    .saturating_add(u32::try_from(checkpoint_mib).unwrap_or(u32::MAX));
            }
            check_host_memory(workers, needs[0].memory_mib)?;
            Planned::HelperVm {
                reason,
                needs,
                there,
            }
        }
    };
    Ok(Plan {
        workers,
        place,
        planned,
        checkpoint_share,
    })
}

/// How a plan's workers' checkpoints are bounded: what a helper VM must
/// hold besides its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sizing {
    /// By a share of the memory available ([`crate::sizing`]).
    FromMemory,
    /// By the campaign file's `checkpoint_memory`.
    Bytes(u64),
    /// By a count alone (or no campaign runs).
    Count,
}

impl Sizing {
    fn of(spec: &CampaignSpec) -> Sizing {
        match spec.checkpoint_memory {
            _ if spec.size_checkpoints_from_memory => Sizing::FromMemory,
            Some(bytes) => Sizing::Bytes(bytes),
            None => Sizing::Count,
        }
    }
}

impl Plan {
    /// Starts the planned runners, sharing `shared` (directories that
    /// exist) with the helper VMs; the run as the runners see it.
    fn start(self, shared: &[&Path]) -> Result<(Vec<WorkerRunner>, PreparedUp)> {
        let seccomp = self.place.seccomp;
        let (mut runners, there) = match self.planned {
            Planned::Here(prepared) => (
                (0..self.workers)
                    .map(|_| Placed::new(Placement::Host, InProcess::new, None, seccomp, false))
                    .collect::<Vec<_>>(),
                prepared,
            ),
            Planned::HelperVm {
                reason,
                needs,
                there,
            } => {
                if self.workers > 1 {
                    tracing::info!("{} workers, a helper VM each", self.workers);
                }
                // One after the other, on this thread: QEMU is tied to the
                // thread that starts it (it is killed when that thread ends).
                let runners = needs
                    .into_iter()
                    .map(|mut needs| {
                        for dir in shared {
                            needs.share(dir)?;
                        }
                        let placement = Placement::HelperVm {
                            reason: reason.clone(),
                        };
                        let mut runner =
                            Placed::new(placement, InProcess::new, None, seccomp, false);
                        runner.start(needs)?;
                        Ok(runner)
                    })
                    .collect::<Result<Vec<_>>>()?;
                (runners, there)
            }
        };
        // The filter is on by default wherever the runs are (a worker's
        // thread here, the whole serving process in a helper VM); a runner
        // turns it off before its first request, said here for all.
        if !seccomp {
            for runner in &mut runners {
                Calls::new(runner)
                    .seccomp(false)
                    .map_err(CampaignError::Seccomp)?;
            }
        }
        Ok((runners, there))
    }
}

/// Refuses `workers` helper VMs of `memory_mib` each that the host's
/// available memory cannot hold.
fn check_host_memory(workers: u32, memory_mib: u32) -> Result<()> {
    let Some(available_mib) = helper_vm::client::available_memory_mib() else {
        return Ok(());
    };
    let needed = u64::from(workers) * u64::from(memory_mib);
    if needed > available_mib {
        return Err(CampaignError::Memory {
            workers,
            memory_mib,
            needed,
            available_mib,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `findings --json` printed each finding with `serde_json::json!`
    /// (keys sorted): the typed row writes the same line.
    #[test]
    fn test_a_finding_line_is_the_json_findings_printed() {
        let line = FindingLine {
            digest: "ab".into(),
            dir: "/c/findings/0001".into(),
            faults: 1,
            found_faults: 3,
            found_steps: 2,
            key: "property:x".into(),
            number: 1,
            shrinking: None,
            steps: 1,
            summary: "x broke".into(),
            virtual_ns: VirtNanos(5),
            failure_moment: None,
        };
        let by_hand = serde_json::json!({
            "number": 1, "key": "property:x", "summary": "x broke",
            "faults": 1, "found_faults": 3, "steps": 1, "found_steps": 2,
            "virtual_ns": 5, "digest": "ab",
            "dir": PathBuf::from("/c/findings/0001"),
        });
        assert_eq!(
            serde_json::to_string(&line).unwrap(),
            serde_json::to_string(&by_hand).unwrap()
        );
        // A finding that keeps its failure moment: one key more, sorted.
        let moment = FailureMoment {
            exit: 40,
            virtual_ns: VirtNanos(4),
            record: Some(2),
        };
        let line = FindingLine {
            failure_moment: Some(moment),
            ..line
        };
        assert_eq!(
            serde_json::to_string(&line).unwrap(),
            r#"{"digest":"ab","dir":"/c/findings/0001","failure_moment":{"exit":40,"virtual_ns":4,"record":2},"faults":1,"found_faults":3,"found_steps":2,"key":"property:x","number":1,"steps":1,"summary":"x broke","virtual_ns":5}"#
        );
        // Shrunk in steps and end too: one key more, sorted.
        let shrinking = Shrinking {
            fault_trials: 5,
            step_trials: 1,
            ends_at_failure: true,
        };
        let line = FindingLine {
            shrinking: Some(shrinking),
            ..line
        };
        let text = serde_json::to_string(&line).unwrap();
        assert!(
            text.contains(r#""number":1,"shrinking":{"fault_trials":5,"step_trials":1,"ends_at_failure":true},"steps":1,"#),
            "{text}"
        );
    }

    /// The line `findings` prints for a finding's shrinking: a finding
    /// without faults says its minimal path, not "0 faults after shrinking
    /// from 0"; one written before steps were shrunk says as much.
    #[test]
    fn test_a_finding_without_faults_says_its_minimal_path() {
        let moment = FailureMoment {
            exit: 2_500,
            virtual_ns: VirtNanos::from_micros(2_500_000),
            record: Some(9),
        };
        let shrinking = Shrinking {
            fault_trials: 0,
            step_trials: 2,
            ends_at_failure: true,
        };
        let line = FindingLine {
            digest: "ab".into(),
            dir: "/c/findings/0001".into(),
            failure_moment: Some(moment),
            faults: 0,
            found_faults: 0,
            found_steps: 3,
            key: "property:x".into(),
            number: 1,
            shrinking: Some(shrinking),
            steps: 1,
            summary: "x broke".into(),
            virtual_ns: VirtNanos::from_micros(2_500_000),
        };
        assert_eq!(
            line.shrunk(),
            "no faults; minimal path: 1 step (of 3 found), fails at 2.5s and ends there"
        );
        let faults = FindingLine {
            faults: 2,
            found_faults: 3,
            found_steps: 2,
            steps: 2,
            shrinking: Some(Shrinking {
                ends_at_failure: false,
                ..shrinking
            }),
            virtual_ns: VirtNanos::from_secs(4),
            ..line.clone()
        };
        assert_eq!(
            faults.shrunk(),
            "2 faults after shrinking from 3; minimal path: 2 steps (of 2 found), fails at 2.5s, ends at 4s"
        );
        let old = FindingLine {
            shrinking: None,
            failure_moment: None,
            steps: 3,
            ..line.clone()
        };
        assert_eq!(old.shrunk(), "no faults; 3 steps, not shrunk; ends at 2.5s");
        let old = FindingLine {
            shrinking: None,
            ..faults
        };
        assert_eq!(old.shrunk(), "2 faults after shrinking from 3; ends at 4s");
    }

    #[test]
    fn test_jobs_zero_is_one_worker_per_core_at_most_the_batch_width() {
        assert_eq!(workers(3), 3);
        let all = workers(0);
        assert!((1..=MAX_BATCH_WIDTH).contains(&all));
    }
}
