//! A fix verified against an unpatched control: `detvisor verify FINDING
//! --image patched.img --seeds N`.
//!
//! A patched binary cannot be restored into the finding's snapshots, and the
//! same seed gives it another history, so the finding's fault schedule (its
//! run's faults and its path's steps, each at its virtual time) is replayed
//! from boot with N seeds on both systems side by side:
//!
//! - the **control** is the finding's own run (`run.json`: exactly what the
//!   campaign ran, its files by digest);
//! - the **patched** system is prepared from a manifest (the campaign's,
//!   `spec.manifest`, with every node image replaced by the patched one; or
//!   a patched manifest given whole), with the finding's kernel.
//!
//! Seeds ([`SeedChoice`]): at offset `d` in `0..N` the boot seed is the
//! campaign's seed + `d` and each step's seed is its own + `d` (wrapping), so
//! offset 0 is exactly the finding's history; the control must reproduce the
//! finding's digest there (its sanity check, reported).
//!
//! A history fails when the campaign's judge reports a failure of the
//! finding's kind ([`same_failure`]): the same property (id and place), the
//! same command, or the same checker on any key (a stale read under another
//! seed may hit another key: it is the same bug).
//!
//! The verdict ([`verdict`]) is `verified` only when the control reproduced
//! the finding, failed at least once, and the patched system never failed;
//! it states both failure rates with 95% Wilson intervals ([`Rate`]).

use crate::budget::{Budget, BudgetError, Cancelled, LogError, Spent};
pub use crate::rate::Rate;
use crate::source::{FindingSource, Source, SourceError};
use fuzzer::campaign::{CampaignError, Place};
use fuzzer::failure::{FailureKey, FailureSlugError};
use fuzzer::findings::{self, LoadedFinding};
use fuzzer::judge::Judge;
use fuzzer::judges::JudgesError;
use fuzzer::session::{apply_steps, boot_options, reach, SessionError};
use fuzzer::spec::CampaignSpec;
use fuzzer::step::{Path as StepPath, PathFaultError, Step};
use run::api::Request;
use run::client::{Calls, Runner, RunnerError};
use run::manifest::{Manifest, ManifestError, RootSource, WorkloadPlan};
use run::up::PreparedUp;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use vmm::VirtNanos;

/// The most seeds one verification runs.
pub const MAX_SEEDS: u32 = 4096;

/// Why a verification could not be made (a verdict of "not verified" is a
/// report, not an error).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("{}: a directory of snapshots, not a finding (verify replays a finding's faults)", path.display())]
    NotAFinding { path: PathBuf },
    #[error("{}: the finding's key", path.display())]
    Key {
        path: PathBuf,
        #[source]
        source: FailureSlugError,
    },
    #[error("--seeds {seeds}: give 1..={MAX_SEEDS}")]
    Seeds { seeds: u32 },
    #[error("{}: no such manifest{}", path.display(), if *given { "" } else { " (the finding's campaign read its manifest there; give the patched system's with --manifest)" })]
    ManifestMissing { path: PathBuf, given: bool },
    #[error("the patched system's manifest")]
    Manifest(#[source] Box<ManifestError>),
    #[error("{}: no such image", path.display())]
    ImageMissing { path: PathBuf },
    #[error("{}: no node runs from an image (`image = ...`), so there is none to replace; give a patched manifest with --manifest", manifest.display())]
    NoImage { manifest: PathBuf },
    #[error("preparing the patched system of {}", manifest.display())]
    Prepare {
        manifest: PathBuf,
        #[source]
        source: Box<run::up::PrepareError>,
    },
    #[error("the finding's path cannot run on the patched system of {} (a node it names is not there)", manifest.display())]
    PathNodes {
        manifest: PathBuf,
        #[source]
        source: PathFaultError,
    },
    #[error(transparent)]
    Judges(#[from] JudgesError),
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Cancelled(#[from] Cancelled),
    #[error("starting the {system} system's runners")]
    Runners {
        system: System,
        #[source]
        source: Box<CampaignError>,
    },
    #[error("the {system} system at seed offset {offset}")]
    Run {
        system: System,
        offset: u32,
        #[source]
        source: Box<RunError>,
    },
}

/// Why one history could not be run to its end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error(transparent)]
    Session(#[from] SessionError),
}

/// One of the two systems compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum System {
    /// The finding's own run, unpatched.
    Control,
    Patched,
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            System::Control => "unpatched control",
            System::Patched => "patched",
        })
    }
}

/// What the fix is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Patch {
    /// A node image replacing every node image of the finding's manifest
    /// (and the workload's own node's, when it runs from one of the same
    /// files).
    Image(PathBuf),
    /// A whole manifest of the patched system (its nodes named as the
    /// finding's).
    Manifest(PathBuf),
}

impl std::fmt::Display for Patch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Patch::Image(path) => write!(f, "image {}", path.display()),
            Patch::Manifest(path) => write!(f, "manifest {}", path.display()),
        }
    }
}

/// A verification asked for.
#[derive(Clone, Debug)]
pub struct VerifyRequest {
    /// A finding's directory, or a campaign's holding one finding.
    pub finding: PathBuf,
    pub patch: Patch,
    /// Histories per system (1..=[`MAX_SEEDS`]); offset 0, the finding's
    /// own, is always one.
    pub seeds: u32,
    /// Workers (0: one per core); each runs both systems, a runner each.
    pub jobs: u32,
    pub place: Place,
}

/// The seeds of one history: offset `offset` from the finding's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedChoice {
    pub offset: u32,
    /// The boot's seed: the campaign's + `offset`.
    pub boot: u64,
    /// Each step's re-key seed: the step's own + `offset`.
    pub steps: Vec<u64>,
}

impl SeedChoice {
    /// The seeds at `offset` from the finding's history (`spec_seed`, its
    /// path's steps), wrapping.
    pub fn at(spec_seed: u64, steps: &[Step], offset: u32) -> SeedChoice {
        let add = |seed: u64| seed.wrapping_add(u64::from(offset));
        SeedChoice {
            offset,
            boot: add(spec_seed),
            steps: steps.iter().map(|s| add(s.seed)).collect(),
        }
    }

    /// The offset these seeds are at from the finding's history, if they are
    /// one of the scheme's.
    pub fn offset_from(&self, spec_seed: u64, steps: &[Step]) -> Option<u32> {
        let offset = u32::try_from(self.boot.wrapping_sub(spec_seed)).ok()?;
        (SeedChoice::at(spec_seed, steps, offset) == *self).then_some(offset)
    }

    /// `steps` re-keyed with these seeds (times and faults kept).
    pub fn apply(&self, steps: &[Step]) -> Vec<Step> {
        steps
            .iter()
            .zip(&self.steps)
            .map(|(step, &seed)| Step {
                seed,
                ..step.clone()
            })
            .collect()
    }
}

/// Whether `key` is a failure of the finding's kind, `finding`: the same
/// property (id, file and function; an old finding's `file:line` key as
/// [`FailureKey::matches`] maps it), the same command, or the same checker
/// on any of its keys.
pub fn same_failure(finding: &FailureKey, key: &FailureKey) -> bool {
    match (finding, key) {
        (FailureKey::Checker { checker: a, .. }, FailureKey::Checker { checker: b, .. }) => a == b,
        _ => finding.matches(key),
    }
}

/// One system's history at one seed offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemRun {
    /// A failure of the finding's kind was seen.
    pub failed: bool,
    /// Every failure the judge saw (slugs), of the finding's kind or not.
    pub failures: Vec<String>,
    /// The run's digest at the path's end.
    pub digest: String,
    pub exits: u64,
    /// The virtual time reached (the path's end, unless the guest stopped).
    pub virtual_ns: VirtNanos,
    /// Why the guest stopped before the path's end, if it did.
    pub stopped: Option<String>,
}

/// Both systems at one seed offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedRow {
    pub seeds: SeedChoice,
    pub control: SystemRun,
    pub patched: SystemRun,
}

/// The control's sanity check: offset 0 is the finding's own history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlCheck {
    /// `finding.json`'s digest.
    pub expected_digest: String,
    /// The control's digest at offset 0.
    pub digest: String,
    pub reproduced: bool,
}

/// What a verification found, and what it spent.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    #[serde(flatten)]
    pub comparison: Comparison,
    pub spent: Spent,
}

/// Both systems over the seeds, and the verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub finding: PathBuf,
    /// The finding's failure key (slug).
    pub key: String,
    pub patch: Patch,
    /// The manifest the patched system was prepared from.
    pub manifest: PathBuf,
    pub workers: u32,
    /// One row per seed offset, in order.
    pub seeds: Vec<SeedRow>,
    pub control_check: ControlCheck,
    pub control: Rate,
    pub patched: Rate,
    pub verified: bool,
    /// One line: the verdict and the rates it rests on.
    pub verdict: String,
}

/// The verdict on the rates: verified only when the control reproduced the
/// finding, failed at least once, and the patched system never failed.
pub fn verdict(check: &ControlCheck, control: &Rate, patched: &Rate) -> (bool, String) {
    let rates = format!("patched failed {patched}, unpatched control failed {control}");
    if !check.reproduced {
        return (
            false,
            format!(
                "not verified: the control did not reproduce the finding at seed offset 0 (digest {}, finding.json's {}); {rates}",
                check.digest, check.expected_digest
            ),
        );
    }
    if patched.failed > 0 {
        return (
            false,
            format!("not verified: the patched system failed; {rates}"),
        );
    }
    if control.failed == 0 {
        return (
            false,
            format!("not verified: the unpatched control never failed, so the patched system's passing shows nothing; {rates}"),
        );
    }
    (true, format!("verified: {rates}"))
}

/// Replaces the image of every node of `manifest` that runs from one by
/// `image`, and the workload's own node's when it runs from one of the
/// same files; how many were replaced.
pub fn replace_images(manifest: &mut Manifest, image: &Path) -> usize {
    let same = |a: &Path, b: &Path| {
        a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    };
    let mut replaced = Vec::new();
    for node in &mut manifest.nodes {
        if let RootSource::Image(path) = &mut node.source {
            replaced.push(std::mem::replace(path, image.to_owned()));
        }
    }
    let own = match manifest.workload.as_mut() {
        Some(WorkloadPlan::OwnNode(node)) => Some(node),
        Some(WorkloadPlan::Template(plan)) => plan.own_node.as_deref_mut(),
        _ => None,
    };
    let mut count = replaced.len();
    if let Some(node) = own {
        if let RootSource::Image(path) = &mut node.source {
            if replaced.iter().any(|old| same(old, path)) {
                *path = image.to_owned();
                count += 1;
            }
        }
    }
    count
}

/// The patched system's manifest (where it was read) and run.
pub fn patched_run(
    finding: &LoadedFinding,
    patch: &Patch,
) -> Result<(PathBuf, PreparedUp), VerifyError> {
    let (manifest_path, given) = match patch {
        Patch::Image(_) => (finding.file.spec.manifest.clone(), false),
        Patch::Manifest(path) => (path.clone(), true),
    };
    if !manifest_path.is_file() {
        return Err(VerifyError::ManifestMissing {
            path: manifest_path,
            given,
        });
    }
    let mut manifest =
        run::manifest::load(&manifest_path).map_err(|e| VerifyError::Manifest(Box::new(e)))?;
    if let Patch::Image(image) = patch {
        let image = image
            .canonicalize()
            .ok()
            .filter(|p| p.is_file())
            .ok_or_else(|| VerifyError::ImageMissing {
                path: image.clone(),
            })?;
        if replace_images(&mut manifest, &image) == 0 {
            return Err(VerifyError::NoImage {
                manifest: manifest_path,
            });
        }
    }
    let prepared =
        run::up::prepare(&manifest, &[], None, Some(&finding.run.kernel)).map_err(|source| {
            VerifyError::Prepare {
                manifest: manifest_path.clone(),
                source: Box::new(source),
            }
        })?;
    finding
        .file
        .path
        .check_faults(&prepared.node_names)
        .map_err(|source| VerifyError::PathNodes {
            manifest: manifest_path.clone(),
            source,
        })?;
    Ok((manifest_path, prepared))
}

/// Runs `prepared` (as its runner sees it) from boot along `path` with
/// `seeds`, judged by `judge`.
pub fn run_history(
    runner: &mut dyn Runner,
    prepared: &PreparedUp,
    spec: &CampaignSpec,
    path: &StepPath,
    seeds: &SeedChoice,
    judge: &dyn Judge,
    finding_key: &FailureKey,
) -> Result<SystemRun, RunError> {
    let mut calls = Calls::new(runner);
    let mut options = boot_options(spec, None);
    options.seed = seeds.boot;
    let (run, _) = calls.start(Request::BootUp {
        prepared: prepared.clone(),
        options,
    })?;
    calls.collect_records(run)?;
    let (_, mut records) = reach(&mut calls, run, &spec.root)?;
    let position = apply_steps(&mut calls, run, &seeds.apply(&path.steps), path.end_ns)?;
    records.extend(calls.take_records(run)?);
    let digest = calls.outcome(run)?.digest;
    calls.close(run)?;
    let failures = judge.check(&[&records]);
    Ok(SystemRun {
        failed: failures.iter().any(|f| same_failure(finding_key, &f.key)),
        failures: failures.iter().map(|f| f.key.slug()).collect(),
        digest,
        exits: position.exits,
        virtual_ns: position.virtual_ns,
        stopped: position.stop.map(|stop| format!("{stop:?}")),
    })
}

/// What a verification says while it runs: each seed offset as both
/// systems finished it (in the order they finish).
pub type Progress<'a> = &'a (dyn Fn(&SeedRow) + Sync);

/// Verifies `request`'s patch against the finding's unpatched control,
/// within `budget` (workers and virtual time checked before anything
/// starts; what was simulated counted), each finished seed offset told to
/// `progress`.
pub fn verify(
    request: &VerifyRequest,
    budget: &mut Budget,
    progress: Progress<'_>,
) -> Result<VerifyReport, VerifyError> {
    verify_on(request, budget, progress, None)
}

/// Makes a runner that takes a run's files as the host names them (one
/// that ships them wherever its runs happen itself).
pub type MakeRunner<'a> = &'a dyn Fn() -> Box<dyn Runner + Send>;

/// [`verify`], its workers' runners (a control and a patched one each)
/// made by `runners` when given, instead of started for the request's
/// place: a caller that holds runners already (a server's, over one helper
/// VM) pays no start.
pub fn verify_on(
    request: &VerifyRequest,
    budget: &mut Budget,
    progress: Progress<'_>,
    runners: Option<MakeRunner<'_>>,
) -> Result<VerifyReport, VerifyError> {
    budget.begin("verify")?;
    let result = verify_within(request, budget, progress, runners);
    let spent = budget.end(if result.is_ok() { "ok" } else { "error" })?;
    result.map(|comparison| VerifyReport { comparison, spent })
}

fn verify_within(
    request: &VerifyRequest,
    budget: &mut Budget,
    progress: Progress<'_>,
    runners: Option<MakeRunner<'_>>,
) -> Result<Comparison, VerifyError> {
    if request.seeds == 0 || request.seeds > MAX_SEEDS {
        return Err(VerifyError::Seeds {
            seeds: request.seeds,
        });
    }
    let source = Source::open(&request.finding)?;
    let Source::Finding(opened) = source else {
        return Err(VerifyError::NotAFinding {
            path: source.dir().to_owned(),
        });
    };
    let FindingSource { dir, finding, .. } = *opened;
    let key = FailureKey::from_slug(&finding.file.key).map_err(|source| VerifyError::Key {
        path: dir.join(findings::FINDING_FILE),
        source,
    })?;
    let (manifest, patched) = patched_run(&finding, &request.patch)?;
    // Each worker makes its own judge; one the spec cannot make is
    // refused here, before any runner starts.
    fuzzer::judges::campaign_judge(&finding.file.spec)?;
    let workers = fuzzer::campaign::workers(request.jobs).min(request.seeds);
    budget.check_workers(u64::from(workers))?;
    let end = finding.file.path.end_ns.0;
    budget.check_virtual(VirtNanos(end.saturating_mul(2 * u64::from(request.seeds))))?;

    let start = |system, prepared: &PreparedUp| {
        let (runners, there) =
            fuzzer::campaign::start_runners(request.place, prepared, workers, &[]).map_err(
                |source| VerifyError::Runners {
                    system,
                    source: Box::new(source),
                },
            )?;
        let runners: Vec<Box<dyn Runner + Send>> = runners
            .into_iter()
            .map(|r| Box::new(r) as Box<dyn Runner + Send>)
            .collect();
        Ok::<_, VerifyError>((runners, there))
    };
    let ((control_runners, control_there), (patched_runners, patched_there)) = match runners {
        Some(make) => (
            ((0..workers).map(|_| make()).collect(), finding.run.clone()),
            ((0..workers).map(|_| make()).collect(), patched.clone()),
        ),
        None => (
            start(System::Control, &finding.run)?,
            start(System::Patched, &patched)?,
        ),
    };

    let rows = run_seeds(
        Systems {
            control: &control_there,
            patched: &patched_there,
        },
        control_runners.into_iter().zip(patched_runners).collect(),
        &finding,
        &key,
        request.seeds,
        progress,
        budget.cancel_flag(),
    )?;
    for row in &rows {
        budget.simulated(VirtNanos(
            row.control.virtual_ns.0 + row.patched.virtual_ns.0,
        ));
    }

    let control_check = ControlCheck {
        expected_digest: finding.file.digest.clone(),
        digest: rows[0].control.digest.clone(),
        reproduced: rows[0].control.digest == finding.file.digest && rows[0].control.failed,
    };
    let rate = |failed: usize| Rate::wilson(failed as u32, rows.len() as u32);
    let control = rate(rows.iter().filter(|r| r.control.failed).count());
    let patched_rate = rate(rows.iter().filter(|r| r.patched.failed).count());
    let (verified, verdict) = verdict(&control_check, &control, &patched_rate);
    Ok(Comparison {
        finding: dir,
        key: finding.file.key.clone(),
        patch: request.patch.clone(),
        manifest,
        workers,
        seeds: rows,
        control_check,
        control,
        patched: patched_rate,
        verified,
        verdict,
    })
}

/// Both systems' runs, as their runners see them.
#[derive(Clone, Copy)]
struct Systems<'a> {
    control: &'a PreparedUp,
    patched: &'a PreparedUp,
}

/// Runs offsets `0..seeds` on the workers (a control and a patched runner
/// each), each worker taking the next offset; the rows in offset order. The
/// first error stops every worker before its next offset.
fn run_seeds<R: Runner + Send>(
    systems: Systems<'_>,
    workers: Vec<(R, R)>,
    finding: &LoadedFinding,
    key: &FailureKey,
    seeds: u32,
    progress: Progress<'_>,
    cancel: Option<std::sync::Arc<AtomicBool>>,
) -> Result<Vec<SeedRow>, VerifyError> {
    let next = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    let rows = Mutex::new(Vec::new());
    let first_error = Mutex::new(None);
    let spec = &finding.file.spec;
    let path = &finding.file.path;
    std::thread::scope(|scope| {
        for (mut control, mut patched) in workers {
            let (next, stop, rows, first_error) = (&next, &stop, &rows, &first_error);
            let cancel = cancel.clone();
            scope.spawn(move || {
                let outcome = (|| -> Result<(), VerifyError> {
                    let judge = fuzzer::judges::campaign_judge(spec)?;
                    loop {
                        let offset = next.fetch_add(1, Ordering::SeqCst);
                        if offset >= seeds || stop.load(Ordering::SeqCst) {
                            return Ok(());
                        }
                        if cancel.as_ref().is_some_and(|c| c.load(Ordering::SeqCst)) {
                            return Err(Cancelled.into());
                        }
                        let choice = SeedChoice::at(spec.seed, &path.steps, offset);
                        let one = |system, runner: &mut R, prepared| {
                            run_history(runner, prepared, spec, path, &choice, judge.as_ref(), key)
                                .map_err(|source| VerifyError::Run {
                                    system,
                                    offset,
                                    source: Box::new(source),
                                })
                        };
                        let control_run = one(System::Control, &mut control, systems.control)?;
                        let patched_run = one(System::Patched, &mut patched, systems.patched)?;
                        let row = SeedRow {
                            seeds: choice,
                            control: control_run,
                            patched: patched_run,
                        };
                        progress(&row);
                        rows.lock().expect("rows").push(row);
                    }
                })();
                if let Err(error) = outcome {
                    stop.store(true, Ordering::SeqCst);
                    first_error.lock().expect("error").get_or_insert(error);
                }
            });
        }
    });
    if let Some(error) = first_error.into_inner().expect("error") {
        return Err(error);
    }
    let mut rows = rows.into_inner().expect("rows");
    rows.sort_by_key(|row| row.seeds.offset);
    Ok(rows)
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
