//! The worker of `bench snapshot` (inside the helper VM, or on the host): the cells of its
//! plan in turn, each on a thread of its own under the time limit (a cell is in
//! [`crate::snapshot_cell`]).

use serde::{Deserialize, Serialize};
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::machine::{fs_type, mem_total_kib, uptime, TempDir};
use crate::process::{run_in_process, Watch};
use crate::report::WorkerReport;
use crate::say;
use crate::snapshot_cell::{measure_cell, CellPlan, CellResult, CellSpec, SnapLocation};
use crate::stats::ms;

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct SnapWorkerPlan {
    pub runs: u32,
    pub timeout_s: u64,
    pub cells: Vec<CellSpec>,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
    /// Write snapshots to a directory of the worker's own temp dir (L1's tmpfs).
    pub local: Option<String>,
    /// The 9p share (same path in L1 and on the host).
    pub shared: Option<SnapLocation>,
    pub forks: u32,
    pub resets: u32,
    pub burst_pages: u64,
    pub place: String,
}

#[derive(Serialize, Deserialize, Debug, Default)]
pub struct SnapWorkerReport {
    pub place: String,
    pub uptime_at_start_s: Option<f64>,
    pub elapsed_ms: f64,
    /// MemTotal of the machine the worker runs on (L1).
    pub mem_total_kib: Option<u64>,
    pub locations: Vec<(String, String)>,
    pub cells: Vec<CellResult>,
}

impl WorkerReport for SnapWorkerReport {
    fn elapsed_ms(&self) -> f64 {
        self.elapsed_ms
    }
}

/// Runs the cells of `plan` in turn, each on a thread of its own under the time limit.
pub fn worker(plan: &SnapWorkerPlan) -> SnapWorkerReport {
    let started = Instant::now();
    let tag = format!("bench snapshot [{}]", plan.place);
    let mut report = SnapWorkerReport {
        place: plan.place.clone(),
        uptime_at_start_s: uptime(),
        mem_total_kib: mem_total_kib(),
        ..SnapWorkerReport::default()
    };
    let fail_all = |report: &mut SnapWorkerReport, why: String| {
        for spec in &plan.cells {
            report.cells.push(CellResult::failed(spec, why.clone()));
        }
    };
    let scratch = match TempDir::new("detvisor-bench-snap-") {
        Ok(t) => t,
        Err(e) => {
            fail_all(
                &mut report,
                format!("cannot create a scratch directory: {e}"),
            );
            return report;
        }
    };
    let mut locations = Vec::new();
    if let Some(name) = &plan.local {
        let dir = scratch.path().join("snapshots");
        match fs::create_dir(&dir) {
            Ok(()) => locations.push(SnapLocation {
                name: name.clone(),
                dir,
            }),
            Err(e) => say!("{tag}: cannot create {}: {e}", dir.display()),
        }
    }
    locations.extend(plan.shared.iter().cloned());
    report.locations = locations
        .iter()
        .map(|l| {
            (
                l.name.clone(),
                format!("{} ({})", l.dir.display(), fs_type(&l.dir)),
            )
        })
        .collect();
    let limit = Duration::from_secs(plan.timeout_s);
    for spec in &plan.cells {
        let cell_tag = format!("{tag} {}", spec.label());
        let cell_plan = CellPlan {
            spec: spec.clone(),
            runs: plan.runs,
            kernel: plan.kernel.clone(),
            initrd: plan.initrd.clone(),
            cmdline: plan.cmdline.clone(),
            locations: locations.clone(),
            forks: plan.forks,
            resets: plan.resets,
            burst_pages: plan.burst_pages,
            tag: cell_tag.clone(),
        };
        let cell = run_cell(cell_plan, limit).with_spec(spec);
        if let Some(e) = &cell.error {
            say!("{cell_tag}: FAILED: {e}");
        }
        report.cells.push(cell);
    }
    report.elapsed_ms = ms(started.elapsed());
    report
}

/// Measures the cell on a thread of its own; one over `limit` is abandoned (and left to run on:
/// a thread cannot be killed) and counted as failed.
fn run_cell(plan: CellPlan, limit: Duration) -> CellResult {
    let done = run_in_process(move || measure_cell(&plan), limit, Watch::default());
    match done.result {
        Some(c) => c,
        None => CellResult {
            cell_wall_ms: ms(done.wall),
            error: Some(if done.timed_out {
                format!(
                    "the cell was abandoned at the {} s time limit",
                    limit.as_secs()
                )
            } else {
                "the cell's thread panicked".into()
            }),
            ..CellResult::default()
        },
    }
}
