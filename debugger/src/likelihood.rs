//! When a finding's failure became likely: from K moments along its
//! failing history before the failure, M branches each with new seeds (and
//! faults drawn from the campaign's profile, as the search draws them),
//! each judged by the campaign's judge; P(failure) per moment with a 95%
//! Wilson interval, as JSON and as an SVG plot.
//!
//! Exactly:
//!
//! - **Points.** The root moment is the time of the finding's first step
//!   (the end of its path when it has none), `F` its failure moment's time.
//!   Point `i` of `K` is planned at `root + i * (F - root) / K` (integer
//!   nanoseconds, rounded down), `i = 0..K`: the first at the root, the last
//!   one spacing before the failure. Each is reached on the finding's own
//!   history (its steps up to and at that time taken) and stands where that
//!   run stopped, at the first boundary between two exits at or after the
//!   planned time: the point's moment is named by that reached time.
//! - **Seeds.** Branch `j` of point `i` is re-keyed with the first `u64` of
//!   the entropy stream `likelihood-point-{i}-branch-{j}` keyed by the base
//!   seed (the campaign's seed unless one is given): fixed for a finding,
//!   so a run of `likelihood` is repeatable, and independent between
//!   branches and points.
//! - **Faults.** Each branch adds the faults the campaign's `[faults]`
//!   profile draws from its seed for one slice (`fuzzer::judges::
//!   fault_source`, as the engine draws a branch's), `at=+` from the branch
//!   point; none when the profile draws none.
//! - **A branch** is the point's history, then (at the point's instant,
//!   after the history's own actions there) the re-key and the faults; it
//!   runs until the failure moment's time plus one slice of the campaign
//!   (a failure that comes a little later than on the finding's history
//!   counts), or until the guest stops. It *failed* when the campaign's
//!   judge, over every record from the boot to its end, reports the
//!   finding's failure key; it stops early once it has.
//! - **P** is failures / branches; the interval is Wilson's score interval
//!   at 95% (it stays inside 0..1 and is not empty at 0 or M failures).
//!
//! Each worker is a [`Session`] of its own (its own run, here or in a
//! helper VM) that takes the next point in time order: it reaches the
//! point (replaying forward from its last kept checkpoint), keeps it, and
//! every branch of the point resets to that checkpoint and runs only the
//! branch (each branch reports the virtual time it simulated).

use crate::budget::{BudgetError, Limits, SharedBudget, Usage};
use crate::moment::{Action, MomentId};
use crate::session::{Session, SessionError, SessionOptions};
use crate::source::{Source, SourceError};
use fuzzer::campaign::{CampaignError, Place};
use fuzzer::judges::JudgesError;
use run::moment::When;
use run::records::sdk::SdkRecord;
use run::records::{GuestRecord, RecordBody};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use vmm::entropy::EntropyStream;
use vmm::VirtNanos;

/// Why a likelihood could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum LikelihoodError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("{}: a directory of snapshots; likelihood needs a finding (its failure, its campaign's judge and fault profile)", dir.display())]
    NotAFinding { dir: PathBuf },
    #[error("{what} must be at least 1")]
    Zero { what: &'static str },
    #[error("{}: the finding fails at {failure}, not after its root moment at {root}: there is no moment before the failure to branch from", dir.display())]
    FailsAtRoot {
        dir: PathBuf,
        root: VirtNanos,
        failure: VirtNanos,
    },
    #[error(transparent)]
    Judges(#[from] JudgesError),
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Runners(Box<CampaignError>),
    #[error("drawing the plot: {message}")]
    Plot { message: String },
    #[error("worker {worker} of likelihood panicked")]
    Panicked { worker: usize },
}

impl From<CampaignError> for LikelihoodError {
    fn from(error: CampaignError) -> Self {
        LikelihoodError::Runners(Box::new(error))
    }
}

pub type Result<T, E = LikelihoodError> = std::result::Result<T, E>;

/// What to measure.
#[derive(Clone, Debug)]
pub struct LikelihoodOptions {
    /// K: moments along the failing history.
    pub points: u32,
    /// M: branches from each.
    pub branches: u32,
    /// The base of the branches' seeds (default: the campaign's seed).
    pub seed: Option<u64>,
    /// What the whole measurement may spend (checked before it starts) and
    /// each worker's session too.
    pub limits: Limits,
}

/// A point as planned, before anything runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedPoint {
    pub planned_ns: VirtNanos,
    /// Its branches' seeds, in order.
    pub seeds: Vec<u64>,
}

/// What will be measured: the finding, its points and seeds, how far each
/// branch runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The finding's directory, absolute.
    pub dir: PathBuf,
    /// The failure key a branch must show (a slug).
    pub key: String,
    pub root_ns: VirtNanos,
    pub failure_ns: VirtNanos,
    /// Where every branch stops at the latest.
    pub end_ns: VirtNanos,
    pub seed: u64,
    pub points: Vec<PlannedPoint>,
}

/// One branch's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BranchOutcome {
    pub seed: u64,
    /// Its first moment (the point's history, re-keyed, its faults added).
    pub moment: MomentId,
    /// Faults the profile drew for it.
    pub faults: usize,
    /// The finding's failure was reported.
    pub failed: bool,
    /// Every failure the judge reported (slugs), the finding's included.
    pub failures: Vec<String>,
    /// Where it ended.
    pub end_ns: VirtNanos,
    /// Virtual time run for it (from the point's kept checkpoint).
    pub simulated_ns: VirtNanos,
}

/// The estimate at one point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PointEstimate {
    /// The point's moment, on the finding's own history.
    pub moment: MomentId,
    /// Its digest there.
    pub digest: String,
    pub planned_ns: VirtNanos,
    /// Its time (where the run stood).
    pub virtual_ns: VirtNanos,
    pub branches: u32,
    pub failures: u32,
    pub p: f64,
    /// The 95% Wilson interval.
    pub low: f64,
    pub high: f64,
    pub outcomes: Vec<BranchOutcome>,
}

/// A likelihood measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Likelihood {
    /// The finding's directory.
    pub finding: PathBuf,
    /// Its failure key (a slug).
    pub key: String,
    /// Its failure moment.
    pub failure: MomentId,
    pub failure_ns: VirtNanos,
    pub root_ns: VirtNanos,
    /// Where every branch stopped at the latest.
    pub end_ns: VirtNanos,
    /// The base of the seeds.
    pub seed: u64,
    /// Of the intervals.
    pub confidence: f64,
    pub points: Vec<PointEstimate>,
    /// What the workers used, summed over them (wall time too).
    pub used: Usage,
}

/// Planned times of `points` points from `root` to just before `failure`.
pub fn point_times(root: VirtNanos, failure: VirtNanos, points: u32) -> Vec<VirtNanos> {
    let span = u128::from(failure.0.saturating_sub(root.0));
    (0..points)
        .map(|i| VirtNanos(root.0 + (span * u128::from(i) / u128::from(points.max(1))) as u64))
        .collect()
}

/// The seed of branch `branch` at point `point`.
pub fn branch_seed(base: u64, point: u32, branch: u32) -> u64 {
    EntropyStream::new(base, &format!("likelihood-point-{point}-branch-{branch}")).next_u64()
}

/// Wilson's score interval of `failures` out of `n` at 95%.
pub fn wilson(failures: u32, n: u32) -> (f64, f64) {
    let rate = crate::rate::Rate::wilson(failures, n);
    (rate.low, rate.high)
}

/// The plan for `dir`'s finding: its points and seeds.
pub fn plan(dir: &Path, options: &LikelihoodOptions) -> Result<Plan> {
    if options.points == 0 {
        return Err(LikelihoodError::Zero { what: "points" });
    }
    if options.branches == 0 {
        return Err(LikelihoodError::Zero { what: "branches" });
    }
    let source = Source::open(dir)?;
    let Some(finding) = source.finding() else {
        return Err(LikelihoodError::NotAFinding {
            dir: source.dir().to_owned(),
        });
    };
    let file = &finding.finding.file;
    let root_ns = file
        .path
        .steps
        .first()
        .map_or(file.path.end_ns, |s| s.at_ns);
    let failure_ns = finding.failure.virtual_ns;
    if failure_ns <= root_ns {
        return Err(LikelihoodError::FailsAtRoot {
            dir: finding.dir.clone(),
            root: root_ns,
            failure: failure_ns,
        });
    }
    let seed = options.seed.unwrap_or(file.spec.seed);
    let points = point_times(root_ns, failure_ns, options.points)
        .into_iter()
        .enumerate()
        .map(|(i, planned_ns)| PlannedPoint {
            planned_ns,
            seeds: (0..options.branches)
                .map(|j| branch_seed(seed, i as u32, j))
                .collect(),
        })
        .collect();
    Ok(Plan {
        dir: finding.dir.clone(),
        key: file.key.clone(),
        root_ns,
        failure_ns,
        end_ns: failure_ns.saturating_add(file.spec.slice_ns),
        seed,
        points,
    })
}

impl Plan {
    /// Refuses a plan that would pass `limits` or a `shared` budget it runs
    /// within (before anything runs, so that no worker starts for a plan
    /// refused later): the workers, the branches from one moment and in
    /// all, and the virtual time the branches run (the replays to the
    /// points come on top).
    pub fn check(
        &self,
        limits: &Limits,
        workers: u32,
        shared: &[SharedBudget],
    ) -> Result<(), BudgetError> {
        let mut budget =
            crate::budget::Budget::new(limits.clone(), None).within(shared.iter().cloned());
        budget.begin("likelihood")?;
        budget.check_workers(u64::from(workers))?;
        let per_point = self.points.first().map_or(0, |p| p.seeds.len() as u64);
        // From one moment (siblings), then in all (from many moments).
        budget.check_branches(per_point, 0, 1, 0)?;
        let all = per_point * self.points.len() as u64;
        let in_all = Limits {
            siblings: u64::MAX,
            ..limits.clone()
        };
        crate::budget::Budget::new(in_all, None)
            .within(shared.iter().cloned())
            .check_branches(all, 0, 1, 0)?;
        let virtual_ns: u64 = self
            .points
            .iter()
            .map(|p| per_point * self.end_ns.0.saturating_sub(p.planned_ns.0))
            .sum();
        budget.check_virtual(VirtNanos(virtual_ns))
    }
}

/// A worker's runner and what its session is made of: the session itself
/// is made on the worker's thread (a run's state stays on the thread that
/// made it).
pub struct Seat {
    runner: Box<dyn run::client::Runner + Send>,
    dir: PathBuf,
    /// The run as the runner sees it (its files in the helper VM).
    there: run::up::PreparedUp,
    options: SessionOptions,
}

impl Seat {
    fn session(self) -> Result<Session> {
        let source = Source::open(&self.dir)?;
        Ok(Session::new(source, Box::new(self.runner), self.options).with_run_as_seen(self.there))
    }
}

/// `workers` seats on `dir`'s finding (at most one per point), their runs
/// placed as `place` says: here, or a helper VM each.
pub fn sessions(
    dir: &Path,
    place: Place,
    workers: u32,
    options: &dyn Fn() -> SessionOptions,
) -> Result<Vec<Seat>> {
    let source = Source::open(dir)?;
    let Some(finding) = source.finding() else {
        return Err(LikelihoodError::NotAFinding {
            dir: source.dir().to_owned(),
        });
    };
    let (runners, there) =
        fuzzer::campaign::start_runners(place, &finding.finding.run, workers, &[])?;
    Ok(runners
        .into_iter()
        .map(|runner| Seat {
            runner: Box::new(runner),
            dir: source.dir().to_owned(),
            there: there.clone(),
            options: options(),
        })
        .collect())
}

/// `workers` seats on `dir`'s finding, each on a runner `runner` makes
/// (one that takes the run's files as the host names them).
pub fn seats_on(
    dir: &Path,
    workers: u32,
    runner: &dyn Fn() -> Box<dyn run::client::Runner + Send>,
    options: &dyn Fn() -> SessionOptions,
) -> Result<Vec<Seat>> {
    let source = Source::open(dir)?;
    let Some(finding) = source.finding() else {
        return Err(LikelihoodError::NotAFinding {
            dir: source.dir().to_owned(),
        });
    };
    Ok((0..workers.max(1))
        .map(|_| Seat {
            runner: runner(),
            dir: source.dir().to_owned(),
            there: finding.finding.run.clone(),
            options: options(),
        })
        .collect())
}

/// What a measurement tells as it goes: each point once measured (its
/// index in time order).
pub type Progress<'a> = &'a (dyn Fn(usize, &PointEstimate) + Sync);

/// Measures `plan` with `sessions` (one worker each, on `plan`'s finding).
pub fn measure(plan: &Plan, seats: Vec<Seat>, progress: Progress<'_>) -> Result<Likelihood> {
    let failure = MomentId::of_source(&plan.dir, When::Failure);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Mutex<Vec<Option<PointEstimate>>> = Mutex::new(vec![None; plan.points.len()]);
    let outcomes: Vec<Result<Usage>> = std::thread::scope(|scope| {
        let handles: Vec<_> = seats
            .into_iter()
            .map(|seat| {
                let (next, stop, results) = (&next, &stop, &results);
                scope.spawn(move || -> Result<Usage> {
                    let mut session = seat.session()?;
                    let Some(finding) = session.finding() else {
                        return Err(LikelihoodError::NotAFinding {
                            dir: session.source().dir().to_owned(),
                        });
                    };
                    let spec = &finding.finding.file.spec;
                    let judge = fuzzer::judges::campaign_judge(spec)?;
                    let faults = fuzzer::judges::fault_source(spec, &finding.finding.run)?;
                    let worker = Worker {
                        plan,
                        judge: judge.as_ref(),
                        faults: faults.as_ref(),
                        slice: spec.slice_ns,
                    };
                    let outcome = loop {
                        let index = next.fetch_add(1, Ordering::SeqCst);
                        if index >= plan.points.len() || stop.load(Ordering::SeqCst) {
                            break Ok(());
                        }
                        match worker.point(&mut session, index) {
                            Ok(estimate) => {
                                progress(index, &estimate);
                                results.lock().expect("results")[index] = Some(estimate)
                            }
                            Err(e) => {
                                stop.store(true, Ordering::SeqCst);
                                break Err(e);
                            }
                        }
                    };
                    let used = session.budget.session().clone();
                    let closed = session.close();
                    outcome?;
                    closed?;
                    Ok(used)
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(worker, handle)| {
                handle
                    .join()
                    .unwrap_or(Err(LikelihoodError::Panicked { worker }))
            })
            .collect()
    });
    let mut used = Usage::default();
    for outcome in outcomes {
        let worker = outcome?;
        used.wall = VirtNanos(used.wall.0 + worker.wall.0);
        used.virtual_time = VirtNanos(used.virtual_time.0 + worker.virtual_time.0);
        used.branches_created += worker.branches_created;
        used.bytes += worker.bytes;
        used.disk_bytes += worker.disk_bytes;
    }
    let points = results
        .into_inner()
        .expect("results")
        .into_iter()
        .map(|point| point.expect("every point measured when no worker failed"))
        .collect();
    Ok(Likelihood {
        finding: plan.dir.clone(),
        key: plan.key.clone(),
        failure,
        failure_ns: plan.failure_ns,
        root_ns: plan.root_ns,
        end_ns: plan.end_ns,
        seed: plan.seed,
        confidence: 0.95,
        points,
        used,
    })
}

/// One worker's view of the measurement.
struct Worker<'a> {
    plan: &'a Plan,
    judge: &'a dyn fuzzer::judge::Judge,
    faults: &'a dyn fuzzer::engine::FaultSource,
    /// The finding's path.
    /// The campaign's slice, which a branch's faults are drawn for.
    slice: VirtNanos,
}

impl Worker<'_> {
    /// Every branch of point `index`.
    fn point(&self, session: &mut Session, index: usize) -> Result<PointEstimate> {
        let planned = &self.plan.points[index];
        let (at, _) = session.call("likelihood point", |s| {
            let at = s.reach(&MomentId::of_source(
                &self.plan.dir,
                When::Time(planned.planned_ns),
            ))?;
            // Named by the time it stands at (the same machine; a step of
            // the finding's between the two is taken).
            s.reach(&at.moment.at(When::Time(at.virtual_ns)))
        })?;
        let mut outcomes = Vec::with_capacity(planned.seeds.len());
        for &seed in &planned.seeds {
            let faults = self.faults.draw(seed, self.slice);
            let moment = branch_moment(&at.moment, at.virtual_ns, seed, &faults);
            let ((failures, end_ns), spent) =
                session.call("likelihood branch", |s| self.branch(s, &moment))?;
            outcomes.push(BranchOutcome {
                seed,
                failed: holds(&failures, &self.plan.key),
                moment,
                faults: faults.len(),
                failures,
                end_ns,
                simulated_ns: spent.call.virtual_time,
            });
        }
        let branches = outcomes.len() as u32;
        let failures = outcomes.iter().filter(|o| o.failed).count() as u32;
        let (low, high) = wilson(failures, branches);
        Ok(PointEstimate {
            moment: at.moment.clone(),
            digest: at.digest,
            planned_ns: planned.planned_ns,
            virtual_ns: at.virtual_ns,
            branches,
            failures,
            p: f64::from(failures) / f64::from(branches.max(1)),
            low,
            high,
            outcomes,
        })
    }

    /// Runs the branch whose first moment is `moment` to the plan's end or
    /// the finding's failure; the failures judged and where it ended.
    fn branch(
        &self,
        session: &mut Session,
        moment: &MomentId,
    ) -> Result<(Vec<String>, VirtNanos), SessionError> {
        let siblings = session.siblings_of(moment);
        session.budget.check_branches(
            1,
            siblings,
            moment.depth() as u64,
            session.branches_alive(),
        )?;
        session.reach(moment)?;
        session.budget.branched(1);
        session.note_branch(moment);
        let property = property_of(&self.plan.key);
        let failing = |record: &GuestRecord| match (&property, &record.body) {
            (Some(id), RecordBody::Sdk { json }) => matches!(
                SdkRecord::parse(json),
                Ok(SdkRecord::Assert(assertion)) if &assertion.id == id && assertion.hit && !assertion.condition
            ),
            _ => false,
        };
        loop {
            let found = session.run_until_record(self.plan.end_ns, &failing)?;
            let failures: Vec<String> = self
                .judge
                .check(&[session.records()])
                .into_iter()
                .map(|f| f.key.slug())
                .collect();
            if found.is_none() || holds(&failures, &self.plan.key) {
                let end = session.present().map_or(VirtNanos::ZERO, |p| p.virtual_ns);
                return Ok((failures, end));
            }
        }
    }
}

/// The first moment of a branch from `point` (a moment of the finding's
/// own history, standing at `at`) re-keyed with `seed` and `faults` added.
/// It comes after the history's own actions at that instant, as the point
/// does (a moment at a time comes after the actions taken at it, and a
/// branch continues the source's actions up to its first instant), so the
/// point's kept checkpoint is a prefix of its history and the branch
/// starts from it.
pub fn branch_moment(
    point: &MomentId,
    at: VirtNanos,
    seed: u64,
    faults: &[run::faults::Fault],
) -> MomentId {
    let mut moment = point.at(When::Time(at));
    moment.actions.push(Action::Seed { at, seed });
    moment
        .actions
        .extend(faults.iter().map(|fault| Action::Fault {
            at,
            fault: fault.clone(),
        }));
    moment
}

/// Whether `failures` (slugs) hold the finding's failure `key`: the same
/// slug, or a key an old finding's (`file:line`) maps to
/// ([`fuzzer::failure::FailureKey::matches`]).
fn holds(failures: &[String], key: &str) -> bool {
    use fuzzer::failure::FailureKey;
    let finding = FailureKey::from_slug(key).ok();
    failures.iter().any(|f| {
        f == key
            || matches!((&finding, FailureKey::from_slug(f)), (Some(a), Ok(b)) if a.matches(&b))
    })
}

/// The property id of a property's failure key, for stopping a branch at
/// the record that broke it.
fn property_of(slug: &str) -> Option<String> {
    match fuzzer::failure::FailureKey::from_slug(slug).ok()? {
        fuzzer::failure::FailureKey::Property { id, .. }
        | fuzzer::failure::FailureKey::PropertyAtLine { id, .. } => Some(id),
        _ => None,
    }
}

/// Seconds, for the plot's axis.
fn seconds(t: VirtNanos) -> f64 {
    t.0 as f64 / 1e9
}

/// The plot: P(failure) against virtual time as steps from each point to
/// the next (the last to the failure), each point's 95% interval as an
/// error bar (one circle a point), the failure moment as a red line. Text
/// is drawn as SVG text: no font is read.
pub fn svg(likelihood: &Likelihood) -> Result<String> {
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let plot = |e: &dyn std::fmt::Display| LikelihoodError::Plot {
        message: e.to_string(),
    };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (900, 540)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot(&e))?;
        let failure = seconds(likelihood.failure_ns);
        let first = likelihood
            .points
            .first()
            .map_or(seconds(likelihood.root_ns), |p| seconds(p.virtual_ns));
        let margin = ((failure - first) * 0.05).max(0.001);
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "P({}) from {} points x {} branches",
                    likelihood.key,
                    likelihood.points.len(),
                    likelihood.points.first().map_or(0, |p| p.branches)
                ),
                ("sans-serif", 18),
            )
            .margin(20)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d((first - margin)..(failure + margin), 0f64..1.05f64)
            .map_err(|e| plot(&e))?;
        chart
            .configure_mesh()
            .x_desc("virtual time (s)")
            .y_desc("P(failure), 95% Wilson interval")
            .draw()
            .map_err(|e| plot(&e))?;
        let mut steps = Vec::new();
        for (i, point) in likelihood.points.iter().enumerate() {
            let until = likelihood
                .points
                .get(i + 1)
                .map_or(failure, |next| seconds(next.virtual_ns));
            steps.push((seconds(point.virtual_ns), point.p));
            steps.push((until, point.p));
        }
        chart
            .draw_series(LineSeries::new(steps, BLUE.stroke_width(2)))
            .map_err(|e| plot(&e))?;
        chart
            .draw_series(likelihood.points.iter().map(|point| {
                ErrorBar::new_vertical(
                    seconds(point.virtual_ns),
                    point.low,
                    point.p,
                    point.high,
                    BLUE.filled(),
                    10,
                )
            }))
            .map_err(|e| plot(&e))?;
        chart
            .draw_series(LineSeries::new(
                [(failure, 0.0), (failure, 1.05)],
                RED.stroke_width(2),
            ))
            .map_err(|e| plot(&e))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("failure at {} ", likelihood.failure_ns),
                (failure, 1.04),
                ("sans-serif", 14)
                    .into_font()
                    .color(&RED)
                    .pos(Pos::new(HPos::Right, VPos::Top)),
            )))
            .map_err(|e| plot(&e))?;
        root.present().map_err(|e| plot(&e))?;
    }
    Ok(out)
}

/// Plans, places `workers` sessions and measures: the whole verb.
pub fn likelihood(
    dir: &Path,
    options: &LikelihoodOptions,
    place: Place,
    workers: u32,
    progress: Progress<'_>,
) -> Result<Likelihood> {
    let plan = plan(dir, options)?;
    let workers = workers.clamp(1, plan.points.len() as u32);
    plan.check(&options.limits, workers, &[])?;
    let limits = options.limits.clone();
    let sessions = sessions(dir, place, workers, &|| SessionOptions {
        limits: limits.clone(),
        ..SessionOptions::default()
    })?;
    measure(&plan, sessions, progress)
}

#[cfg(test)]
mod tests;
