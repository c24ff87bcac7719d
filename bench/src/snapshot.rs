//! `detvisor bench snapshot`: snapshot and restore latency, forks/s and resets/s against guest
//! RAM size and dirty fraction, with full-copy baselines.
//!
//! Layers:
//!
//! ```text
//!   host: `bench snapshot`        orchestrates, prints the table and the JSON line; starts the
//!                                 helper VM (with a 9p share) and sends it the worker's plan
//!     L1: the bench server        one call per session: the worker runs the cells in turn
//!       a thread per cell         (RAM, dirty %): boots the guest, snapshots, restores, forks,
//!                                 resets; under the cell time limit
//!         a thread per child      one restore + first exit through the run API
//! ```
//!
//! Without a helper VM (the host's KVM runs guests) the worker runs in this process.
//!
//! This module: the orchestration on the host; the worker is in [`super::snapshot_worker`], a
//! cell in [`super::snapshot_cell`], the report in [`super::snapshot_report`].

use anyhow::{bail, Context, Result};
use std::fs;
use std::path::Path;
use std::time::Duration;

use super::helper::{HelperLaunch, HELPER_VM_ALLOWANCE};
use super::machine::{loadavg, HostLoad, TempDir};
use super::report::{because, Session, Where, NOT_MEASURED};
use super::serve::BenchCall;
use super::snapshot_cell::{snap_guest_script, CellResult, CellSpec, SnapLocation};
use super::snapshot_memory::PAGE;
use super::snapshot_report::{
    print_snap_report, snap_definitions, snap_rows, SnapBenchReport, SNAP_ANCHORS,
};
use super::snapshot_worker::{worker, SnapWorkerPlan, SnapWorkerReport};
use super::{check_runs_and_timeout, SnapStore, SnapshotBenchArgs};
use crate::say;

use run::{guest, units};

// ---------------------------------------------------------------------------------------------
// The host side of `bench snapshot`.

/// Runs the worker in the helper VM: kernel and initrd shipped as payload files, `share`
/// mounted read-write at its own path.
fn helper_session(
    host_plan: &SnapWorkerPlan,
    share: Option<&Path>,
    memory_mib: u32,
    limit: Duration,
) -> (Session, Option<SnapWorkerReport>) {
    Session::record(|session| {
        let plan = SnapWorkerPlan {
            kernel: helper_vm::payload_path("bench/vmlinux").into(),
            initrd: helper_vm::payload_path("bench/initrd").into(),
            ..host_plan.clone()
        };
        let launch = HelperLaunch {
            memory_mib,
            files: vec![
                (host_plan.kernel.clone(), "bench/vmlinux".into()),
                (host_plan.initrd.clone(), "bench/initrd".into()),
            ],
            shared_dirs: share.into_iter().map(Path::to_path_buf).collect(),
        };
        launch.run(&BenchCall::Snapshot(plan), session, |_| {
            format!(
                "bench snapshot: starting the helper VM ({memory_mib} MiB; time limit {} s)",
                limit.as_secs()
            )
        })
    })
}

/// The cells of `--mem` x `--dirty`, checked.
fn cells(args: &SnapshotBenchArgs) -> Result<Vec<CellSpec>> {
    let mut mems = Vec::new();
    for m in &args.mem {
        let bytes = units::parse_size(m).with_context(|| format!("--mem {m}"))?;
        if bytes < 64 << 20 || bytes % PAGE as u64 != 0 {
            bail!("--mem {m}: guest RAM must be at least 64M and a multiple of 4 KiB");
        }
        mems.push((m.clone(), bytes));
    }
    for d in &args.dirty {
        if !(0.0..=40.0).contains(d) {
            bail!(
                "--dirty {d}: percentages must be within 0..=40 (the guest's /dev/shm holds \
                 half its RAM)"
            );
        }
    }
    if mems.is_empty() || args.dirty.is_empty() {
        bail!("--mem and --dirty need at least one value each");
    }
    Ok(mems
        .iter()
        .flat_map(|(mem, ram_bytes)| {
            args.dirty.iter().map(move |&dirty_pct| CellSpec {
                mem: mem.clone(),
                ram_bytes: *ram_bytes,
                dirty_pct,
            })
        })
        .collect())
}

/// `bench snapshot`: measures every cell, prints the report; 1 unless everything went well.
pub fn orchestrate(args: &SnapshotBenchArgs) -> Result<u8> {
    let loadavg_before = loadavg();
    check_runs_and_timeout(args.runs, args.timeout)?;
    let cells = cells(args)?;
    let image = guest::default_image()?;
    let placement = helper_vm::placement(args.host_vm);
    let use_helper = placement.in_helper_vm();
    let place = placement.name();
    let tmp = TempDir::new("detvisor-bench-snap-")
        .context("cannot create a temporary directory for the benchmark")?;
    let want_tmpfs = matches!(args.store, SnapStore::Tmpfs | SnapStore::Both);
    let want_share = matches!(args.store, SnapStore::Share | SnapStore::Both);
    let share = if use_helper && want_share {
        let dir = tmp.path().join("share");
        fs::create_dir(&dir)?;
        Some(dir.canonicalize()?)
    } else {
        None
    };
    if !use_helper && want_share && !want_tmpfs {
        bail!("--store share needs the helper VM (the 9p share exists only there)");
    }
    let max_ram_mib = cells.iter().map(|c| c.ram_bytes >> 20).max().unwrap_or(256);
    // The guest, a same-size copy buffer, a full-copy file in tmpfs, snapshots, the kernel.
    let memory_mib = u32::try_from(max_ram_mib * 3 + 1536)
        .unwrap_or(u32::MAX)
        .max(2048);
    let plan = SnapWorkerPlan {
        runs: args.runs,
        timeout_s: args.timeout,
        cells: cells.clone(),
        kernel: image.kernel.clone(),
        initrd: image.initrd.clone(),
        cmdline: guest::default_cmdline(),
        local: want_tmpfs.then(|| {
            if use_helper {
                "L1 tmpfs".to_string()
            } else {
                "host tmp".to_string()
            }
        }),
        shared: share.as_ref().map(|dir| SnapLocation {
            name: "9p share".into(),
            dir: dir.clone(),
        }),
        forks: args.forks,
        resets: args.resets,
        burst_pages: args.burst_pages,
        place: place.into(),
    };
    say!(
        "bench snapshot: {} cell(s) ({} x {}), {} run(s) each, guests in the {place}{}",
        cells.len(),
        args.mem.join(","),
        args.dirty
            .iter()
            .map(|d| format!("{d}%"))
            .collect::<Vec<_>>()
            .join(","),
        args.runs,
        because(&placement)
    );
    let limit = HELPER_VM_ALLOWANCE + Duration::from_secs(args.timeout * cells.len() as u64);
    let (session, report) = if use_helper {
        let (s, r) = helper_session(&plan, share.as_deref(), memory_mib, limit);
        (Some(s), r)
    } else {
        (None, Some(worker(&plan)))
    };
    let error = session.as_ref().and_then(|s| s.error.clone());
    let (cells_out, stores, l1_mem) = match report {
        Some(r) => (r.cells, r.locations, r.mem_total_kib),
        None => (
            cells
                .iter()
                .map(|c| CellResult::failed(c, NOT_MEASURED.into()))
                .collect(),
            Vec::new(),
            None,
        ),
    };
    let rows = snap_rows(&cells_out);
    let all_ok = error.is_none()
        && cells_out.iter().all(|c| c.ok && c.error.is_none())
        && rows.iter().all(|r| r.error.is_none());
    let report = SnapBenchReport {
        benchmark: "snapshot",
        runs: args.runs,
        mem: args.mem.clone(),
        dirty_pct: args.dirty.clone(),
        forks: args.forks,
        resets: args.resets,
        burst_pages: args.burst_pages,
        guest_command: snap_guest_script(0).replace("head -c 0", "head -c <dirty bytes>"),
        cmdline: guest::default_cmdline(),
        place: Where::from(&placement),
        clock: "Instant (CLOCK_MONOTONIC) of the machine running the step: L1's inside the \
                helper VM (under TCG without icount it follows the host's real time)",
        definitions: snap_definitions(),
        anchors: SNAP_ANCHORS,
        stores,
        l1_mem_total_kib: l1_mem,
        rows,
        cells: cells_out,
        helper_vm: session,
        error,
        host: HostLoad::since(loadavg_before),
        all_ok,
    };
    print_snap_report(&report)?;
    Ok(if all_ok { 0 } else { 1 })
}
