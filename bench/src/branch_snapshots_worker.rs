//! The measured side of `bench branch-snapshots`: an `up` run that keeps snapshots, then the
//! same branch of one of its moments three ways, interleaved run by run: keeping no snapshots,
//! keeping them as `branch --snapshots` does (the first incremental over the snapshot it was
//! restored from), and keeping them with a full first snapshot (what `branch --snapshots` did
//! before, composed here from the run library's restore and `Snapshotter::new`). All three are
//! one history: their digests must agree.

use anyhow::{anyhow, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::machine::uptime;
use crate::process::{run_in_process, Watch};
use crate::report::WorkerReport;
use crate::say;
use crate::stats::ms;
use run::branch::BranchRequest;
use run::client::{Calls, Local, RunnerError};
use run::moment::Moment;
use run::snapshots::{NodeOutput, SnapshotPlan, Snapshotter};
use run::up::{PreparedUp, UpOptions};
use vmm::VirtNanos;

/// How a branch keeps its snapshots, or does not.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    /// No snapshots.
    Plain,
    /// `branch --snapshots`: the first incremental over the restored snapshot.
    Incremental,
    /// The first snapshot full (the behaviour before the incremental first).
    FullFirst,
}

impl Side {
    pub const ALL: [Side; 3] = [Side::Plain, Side::Incremental, Side::FullFirst];

    pub fn name(self) -> &'static str {
        match self {
            Side::Plain => "no snapshots",
            Side::Incremental => "snapshots, first incremental",
            Side::FullFirst => "snapshots, first full (before)",
        }
    }
}

/// What the worker runs; paths as seen where it runs.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct BranchSnapshotsPlan {
    pub runs: u32,
    pub timeout_s: u64,
    pub seed: u64,
    /// The branches' seed.
    pub branch_seed: u64,
    pub until: VirtNanos,
    /// The moment branched: `<scratch>/up@<at>`.
    pub at: VirtNanos,
    pub snapshot_every: VirtNanos,
    pub prepared: PreparedUp,
    /// Where the snapshots go (shared with the host when in the helper VM, as `detvisor`
    /// shares snapshot directories).
    pub scratch: PathBuf,
    /// Drop the page cache before each branch (only where the worker has the machine to
    /// itself, the helper VM): every `detvisor branch` starts a fresh helper VM, whose page
    /// cache holds none of the snapshot's pages.
    pub cold: bool,
    pub place: String,
}

/// One branch.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct BranchRun {
    pub side: Side,
    pub ok: bool,
    pub wall_ms: f64,
    pub digest: Option<String>,
    pub exits: Option<u64>,
    pub error: Option<String>,
    /// The branch's snapshots: how many, and its first's.
    pub snapshots: u64,
    pub first_incremental: Option<bool>,
    pub first_pages_stored: Option<u64>,
    pub disk_bytes: u64,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub struct BranchSnapshotsReport {
    pub place: String,
    pub uptime_at_start_s: Option<f64>,
    pub elapsed_ms: f64,
    /// The `up` run that made the snapshots branched from.
    pub up_wall_ms: Option<f64>,
    pub up_snapshots: u64,
    pub up_digest: Option<String>,
    pub moment: String,
    pub runs: Vec<BranchRun>,
    pub error: Option<String>,
}

impl WorkerReport for BranchSnapshotsReport {
    fn elapsed_ms(&self) -> f64 {
        self.elapsed_ms
    }
}

/// Runs `f` on a thread of its own (a run's seccomp filter stays there) within `limit`.
fn on_thread<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
    limit: Duration,
) -> (Result<T>, Duration) {
    let done = run_in_process(f, limit, Watch::default());
    let result = done.result.unwrap_or_else(|| {
        Err(if done.timed_out {
            anyhow!("abandoned at the {} s time limit", limit.as_secs())
        } else {
            anyhow!("the run's thread panicked")
        })
    });
    (result, done.wall)
}

fn cause(e: RunnerError) -> anyhow::Error {
    anyhow!(e.into_cause())
}

/// The branch `side` of `moment`, its snapshots (if any) into `dir`: its digest and exits.
fn branch(side: Side, moment: Moment, seed: u64, plan: SnapshotPlan) -> Result<(String, u64)> {
    match side {
        Side::Plain | Side::Incremental => {
            let request = BranchRequest {
                moment,
                until: None,
                seed: Some(seed),
                snapshots: (side == Side::Incremental).then_some(plan),
                events: false,
                faults: Vec::new(),
                stall_timeout: Default::default(),
                trace: None,
                clock: None,
            };
            let mut here = Local::new(run::streams::Captured::default());
            let summary = Calls::new(&mut here).branch(request).map_err(cause)?;
            Ok((summary.digest, summary.exits))
        }
        Side::FullFirst => {
            let mut restored = run::snapshots::restore(
                &moment,
                &vmm::vm::ResumeConfig::default(),
                Box::new(std::io::sink()),
                None,
                NodeOutput::discard(),
            )?;
            let driven = &mut restored.driven;
            driven.rekey(seed)?;
            let stop = match restored.stopped_early {
                Some(stop) => stop,
                None => {
                    Snapshotter::new(&plan, Some(restored.snapshot.meta.id.clone()))?.run(driven)?
                }
            };
            let outcome = driven.outcome(stop)?;
            let summary = run::outcome::RunSummary::new(seed, &outcome);
            Ok((summary.digest, summary.exits))
        }
    }
}

/// Writes back and drops this machine's page cache, so that the next restore reads the
/// snapshot's pages from the share again.
fn drop_page_cache() -> Result<()> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("dropping the page cache")
}

/// Fills in what `dir` holds: the snapshots, the first's kind and pages, the disk used.
fn describe_snapshots(run: &mut BranchRun, dir: &Path) -> Result<()> {
    let infos = snapshot::list(dir).with_context(|| format!("listing {}", dir.display()))?;
    run.snapshots = infos.len() as u64;
    run.first_incremental = infos.first().map(|i| i.incremental);
    run.first_pages_stored = infos.first().map(|i| i.memory_pages_stored);
    run.disk_bytes = infos.iter().map(|i| i.disk_bytes).sum();
    Ok(())
}

pub fn worker(plan: &BranchSnapshotsPlan) -> BranchSnapshotsReport {
    let started = Instant::now();
    let mut report = BranchSnapshotsReport {
        place: plan.place.clone(),
        uptime_at_start_s: uptime(),
        ..BranchSnapshotsReport::default()
    };
    if let Err(e) = measure(plan, &mut report) {
        report.error = Some(format!("{e:#}"));
    }
    report.elapsed_ms = ms(started.elapsed());
    report
}

fn measure(plan: &BranchSnapshotsPlan, report: &mut BranchSnapshotsReport) -> Result<()> {
    let limit = Duration::from_secs(plan.timeout_s);
    let up_dir = plan.scratch.join("up");
    let options = UpOptions {
        until: Some(plan.until),
        snapshots: Some(SnapshotPlan {
            dir: up_dir.clone(),
            every: Some(plan.snapshot_every),
            at_exits: Vec::new(),
        }),
        ..UpOptions::new(plan.seed)
    };
    let prepared = plan.prepared.clone();
    let (up, wall) = on_thread(
        move || {
            let mut here = Local::new(run::streams::Captured::default());
            Calls::new(&mut here).up(prepared, options).map_err(cause)
        },
        limit,
    );
    let up = up.context("the `up` run")?;
    report.up_wall_ms = Some(ms(wall));
    report.up_digest = serde_json::to_value(&up)?
        .get("digest")
        .and_then(|d| d.as_str())
        .map(str::to_owned);
    report.up_snapshots = snapshot::list(&up_dir)?.len() as u64;
    let moment: Moment = format!("{}@{}", up_dir.display(), plan.at).parse()?;
    report.moment = moment.to_string();
    say!(
        "bench [{}]: up run {:.1} s, {} snapshots; branching {} with seed {}",
        plan.place,
        wall.as_secs_f64(),
        report.up_snapshots,
        report.moment,
        plan.branch_seed
    );
    for i in 1..=plan.runs {
        for side in Side::ALL {
            let dir = plan.scratch.join(format!("branch-{side:?}-{i}"));
            let snapshots = SnapshotPlan {
                dir: dir.clone(),
                every: Some(plan.snapshot_every),
                at_exits: Vec::new(),
            };
            if plan.cold {
                drop_page_cache()?;
            }
            let (moment, seed) = (moment.clone(), plan.branch_seed);
            let (result, wall) = on_thread(move || branch(side, moment, seed, snapshots), limit);
            let mut run = BranchRun {
                side,
                ok: result.is_ok(),
                wall_ms: ms(wall),
                digest: None,
                exits: None,
                error: None,
                snapshots: 0,
                first_incremental: None,
                first_pages_stored: None,
                disk_bytes: 0,
            };
            match result {
                Ok((digest, exits)) => {
                    run.digest = Some(digest);
                    run.exits = Some(exits);
                }
                Err(e) => run.error = Some(format!("{e:#}")),
            }
            if side != Side::Plain && run.ok {
                if let Err(e) = describe_snapshots(&mut run, &dir) {
                    run.ok = false;
                    run.error = Some(format!("{e:#}"));
                }
            }
            // Each run writes a fresh directory; the next must not find this one's pages
            // in the page cache more than the first did.
            let _ = std::fs::remove_dir_all(&dir);
            say!(
                "bench [{}]: run {i}/{}: {}: {}",
                plan.place,
                plan.runs,
                side.name(),
                describe(&run)
            );
            report.runs.push(run);
        }
    }
    Ok(())
}

pub fn describe(r: &BranchRun) -> String {
    match &r.error {
        Some(e) => format!("FAILED: {e}"),
        None => {
            let mut s = format!("{:.1} s", r.wall_ms / 1000.0);
            if r.side != Side::Plain {
                s.push_str(&format!(
                    ", {} snapshot(s), the first {} ({} pages), {} MiB on disk",
                    r.snapshots,
                    match r.first_incremental {
                        Some(true) => "incremental",
                        Some(false) => "full",
                        None => "-",
                    },
                    r.first_pages_stored.unwrap_or(0),
                    r.disk_bytes >> 20
                ));
            }
            if let Some(d) = &r.digest {
                s.push_str(&format!(", digest {d}"));
            }
            s
        }
    }
}
