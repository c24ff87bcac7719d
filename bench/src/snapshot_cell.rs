//! One cell of `bench snapshot` (per (RAM, dirty %), on a thread of its own in the worker's
//! process): boot the guest and let it dirty its RAM, snapshot it against the baselines,
//! restore it (step by step, and as a run-API caller on fresh threads), then forks and resets.

use anyhow::{bail, Context, Result};
use run::driven::SavedState;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use snapshot::SnapshotMeta;
use vmm::vm::Session as VmSession;

use super::machine::fs_type;
use super::process::last_lines;
use super::snapshot_memory::{
    cow_pages, full_copy, memory_revert, nonzero_pages, resident_pages, MemRevert, PAGE,
};
use super::snapshot_restore::{
    child_restore, restore_and_teardown, restore_to_first_exit, ChildRestore, RestorePhases,
    Staging,
};
use super::stats::{median, ms};
use crate::say;
use run::guest;

/// Printed by the guest once the dirtying command has finished.
const SNAP_MARKER: &[u8] = b"detvisor-bench-dirtied";
/// A 63-character line (64 bytes with its newline) the guest writes into its RAM: non-zero, so
/// the sparse snapshot format has to store it.
const SNAP_FILLER: &str = "detvisor-snapshot-benchmark-filler-0123456789abcdefghijklmnopqrs";

/// Longest burst the reset calibration tries, in exits.
const BURST_MAX_EXITS: u64 = 20_000;

/// One cell: a guest RAM size and the percentage of it the guest dirties.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct CellSpec {
    pub mem: String,
    pub ram_bytes: u64,
    pub dirty_pct: f64,
}

impl CellSpec {
    /// Bytes the guest writes: `dirty_pct` of RAM, whole pages.
    pub fn dirty_bytes(&self) -> u64 {
        let bytes = (self.ram_bytes as f64 * self.dirty_pct / 100.0) as u64;
        bytes / PAGE as u64 * PAGE as u64
    }

    /// "RAM/dirty%".
    pub fn label(&self) -> String {
        format!("{}/{}%", self.mem, self.dirty_pct)
    }
}

/// A directory snapshots are written to.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct SnapLocation {
    /// "L1 tmpfs", "9p share", "host tmp".
    pub name: String,
    pub dir: PathBuf,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct CellPlan {
    pub spec: CellSpec,
    pub runs: u32,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
    /// Each cell writes into a subdirectory of each.
    pub locations: Vec<SnapLocation>,
    pub forks: u32,
    pub resets: u32,
    pub burst_pages: u64,
    pub tag: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct LocationResult {
    pub name: String,
    pub dir: PathBuf,
    /// File system type (statfs).
    pub fs: String,
    /// `Session::capture` per run.
    pub capture_ms: Vec<f64>,
    /// `snapshot::write_snapshot` per run (zero-page scan, writes, CRC, fsyncs, rename).
    pub write_ms: Vec<f64>,
    /// capture + write per run.
    pub snapshot_ms: Vec<f64>,
    /// Baseline per run: all of guest RAM into one file here, 8 MiB writes, then fsync.
    pub full_copy_ms: Vec<f64>,
    pub full_copy_error: Option<String>,
    /// Of the first snapshot.
    pub stored_pages: u64,
    pub disk_bytes: u64,
    pub state_bytes: u64,
    /// Warm restores (after `cold_restore` in the same process).
    pub restores: Vec<RestorePhases>,
    /// The first restore of the cell process, untimed in the statistics.
    pub cold_restore: Option<RestorePhases>,
    /// 9p only: warm restores mapping memory.img over 9p without staging.
    pub direct_restores: Vec<RestorePhases>,
    pub child_restores: Vec<ChildRestore>,
    pub error: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ForkResult {
    pub store: String,
    pub iterations: u32,
    pub total_ms: f64,
    pub per_sec: f64,
    /// Each iteration: read_snapshot .. first exit, then teardown.
    pub iteration_ms: Vec<f64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ResetResult {
    pub store: String,
    /// Exits per burst (counted from the resume, the first exit included).
    pub burst_exits: u64,
    /// Copy-on-write pages after a burst (anonymous pages of the private mapping, from
    /// /proc/self/pagemap): guest RAM the burst wrote.
    pub dirty_pages: u64,
    /// Whether the calibration reached the requested page count within BURST_MAX_EXITS.
    pub reached_target: bool,
    /// The same count after one more reset (the guest is deterministic: it should match).
    pub dirty_pages_check: Option<u64>,
    pub iterations: u32,
    pub total_ms: f64,
    pub per_sec: f64,
    /// Medians per iteration: restore through the first exit, the rest of the burst, teardown.
    pub restore_ms: f64,
    pub burst_ms: f64,
    pub teardown_ms: f64,
    /// The same loop in place: one restore and `Session::checkpoint`, then per
    /// iteration the burst and `Session::reset_to` (dirty pages copied back,
    /// state restored, no new VM).
    #[serde(default)]
    pub in_place: Option<InPlaceResets>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct InPlaceResets {
    /// `Session::checkpoint` once: capture + copy of the pages written since
    /// the restore (the others are the snapshot file's, shared).
    pub checkpoint_ms: f64,
    /// Pages the checkpoint copied.
    #[serde(default)]
    pub checkpoint_pages: u64,
    pub total_ms: f64,
    pub per_sec: f64,
    /// Medians per iteration.
    pub reset_ms: f64,
    pub burst_ms: f64,
    /// Pages `reset_to` copied back from the checkpoint, median ...
    pub pages_copied: f64,
    /// ... and fetched instead: returned to the snapshot file's page
    /// (`MADV_DONTNEED`), kept by the checkpoint from then on (after the
    /// first reset, 0); together the pages the dirty log saw written.
    #[serde(default)]
    pub pages_fetched: f64,
    /// Pages the checkpoint kept after the last reset.
    #[serde(default)]
    pub checkpoint_pages_at_end: u64,
    /// Two more bursts after resets ended with the same digest (records,
    /// memory, devices, console): the reset is exact.
    pub identical: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct PageCounts {
    /// Pages of guest RAM.
    pub ram: u64,
    /// Pages of non-zero data the guest command wrote (the dirty fraction).
    pub written: u64,
    /// Pages the host has backed (mincore) at the snapshot: touched since boot by the guest or
    /// the VMM (transparent huge pages may round this up).
    pub resident: u64,
    /// Non-zero pages at the snapshot (= what a full snapshot stores).
    pub nonzero: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct CellResult {
    pub mem: String,
    pub ram_bytes: u64,
    pub dirty_pct: f64,
    pub ok: bool,
    pub error: Option<String>,
    /// Non-fatal problems.
    pub warnings: Vec<String>,
    pub guest_command: String,
    /// Session::boot to the marker line (kernel boot, init, the dirtying command).
    pub boot_and_dirty_ms: f64,
    pub exits_at_snapshot: u64,
    pub virtual_ns_at_snapshot: vmm::VirtNanos,
    pub pages: PageCounts,
    /// Per run: scanning all of guest RAM for non-zero pages (write_snapshot's first step, same
    /// algorithm), alone.
    pub zero_scan_ms: Vec<f64>,
    /// Per run: all of guest RAM copied into a pre-faulted buffer (in-memory baseline).
    pub memcpy_ms: Vec<f64>,
    pub locations: Vec<LocationResult>,
    pub forks: Option<ForkResult>,
    pub resets: Option<ResetResult>,
    pub memory_revert: Option<MemRevert>,
    /// Wall time of the cell process, and its time limit.
    pub cell_wall_ms: f64,
}

impl CellResult {
    /// An empty result of the cell `spec`.
    pub fn of(spec: &CellSpec) -> Self {
        CellResult::default().with_spec(spec)
    }

    /// The cell `spec`, not measured because of `why`.
    pub fn failed(spec: &CellSpec, why: String) -> Self {
        CellResult {
            error: Some(why),
            ..CellResult::of(spec)
        }
    }

    /// This result, as the one of the cell `spec`.
    pub fn with_spec(self, spec: &CellSpec) -> Self {
        CellResult {
            mem: spec.mem.clone(),
            ram_bytes: spec.ram_bytes,
            dirty_pct: spec.dirty_pct,
            ..self
        }
    }
}

/// A console that discards the guest's output but notices [`SNAP_MARKER`] and keeps a tail.
struct MarkerConsole {
    seen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tail: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Write for MarkerConsole {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        use std::sync::atomic::Ordering;
        let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.extend_from_slice(buf);
        if !self.seen.load(Ordering::Relaxed)
            && tail.windows(SNAP_MARKER.len()).any(|w| w == SNAP_MARKER)
        {
            self.seen.store(true, Ordering::Relaxed);
        }
        if tail.len() > 4096 {
            let cut = tail.len() - 2048;
            tail.drain(..cut);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub fn snap_guest_script(dirty_bytes: u64) -> String {
    let marker = String::from_utf8_lossy(SNAP_MARKER);
    format!(
        "yes {SNAP_FILLER} | head -c {dirty_bytes} > /dev/shm/dirty; echo {marker}; i=0; \
         while :; do [ $((i % 8)) = 0 ] && echo .; printf %16384s $i > /dev/shm/b$((i % 64)); \
         i=$((i + 1)); done"
    )
}

/// Measures the cell `plan` describes.
pub fn measure_cell(plan: &CellPlan) -> CellResult {
    let started = Instant::now();
    let mut result = CellResult {
        guest_command: snap_guest_script(plan.spec.dirty_bytes()),
        ..CellResult::of(&plan.spec)
    };
    if let Err(e) = cell(plan, &mut result) {
        result.error = Some(format!("{e:#}"));
    }
    result.ok = result.error.is_none();
    result.cell_wall_ms = ms(started.elapsed());
    for loc in &plan.locations {
        let _ = fs::remove_dir_all(loc.dir.join(cell_dir_name(&plan.spec)));
    }
    result
}

fn cell_dir_name(spec: &CellSpec) -> String {
    format!("cell-{}-{}pct", spec.mem, spec.dirty_pct)
}

fn cell(plan: &CellPlan, result: &mut CellResult) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let tag = &plan.tag;
    let spec = &plan.spec;
    let command = vec!["sh".to_string(), "-c".into(), result.guest_command.clone()];
    let config = vmm::vm::VmConfig {
        exit_path: vmm::ExitPath::default(),
        kernel: plan.kernel.clone(),
        initrd: guest::initrd_with_command(&plan.initrd, &command)?,
        cmdline: plan.cmdline.clone(),
        ram_bytes: spec.ram_bytes,
        seed: 0,
        until: None,
        rtc_epoch_unix_secs: 1_704_067_200,
        record: vmm::record::RecordConfig::default(),
        perturbation: None,
        network: None,
        control_channel: false,
        stall_timeout: Default::default(),
        disks: Vec::new(),
        clock: vmm::ClockKind::Exit,
        pmu_counter: Default::default(),
    };

    // 1. Boot and dirty.
    let seen = Arc::new(AtomicBool::new(false));
    let tail = Arc::new(Mutex::new(Vec::new()));
    let console = MarkerConsole {
        seen: seen.clone(),
        tail: tail.clone(),
    };
    let t = Instant::now();
    let mut session = VmSession::boot(&config, Box::new(console), None)?;
    while !seen.load(Ordering::Relaxed) {
        let exits = session.exits();
        if let Some(stop) = session.run_until(vmm::vm::Until::Exit(exits + 1))? {
            let tail = tail.lock().unwrap_or_else(|e| e.into_inner()).clone();
            bail!(
                "the guest stopped ({stop:?}) before printing the marker; console ends with:\n{}",
                last_lines(&String::from_utf8_lossy(&tail), 8)
            );
        }
    }
    result.boot_and_dirty_ms = ms(t.elapsed());
    result.exits_at_snapshot = session.exits();
    result.virtual_ns_at_snapshot = session.now();
    let ram_pages = spec.ram_bytes / PAGE as u64;
    result.pages = PageCounts {
        ram: ram_pages,
        written: spec.dirty_bytes() / PAGE as u64,
        resident: resident_pages(session.memory()).unwrap_or(0),
        nonzero: nonzero_pages(session.memory()),
    };
    say!(
        "{tag}: booted and wrote {} MiB in {:.1} s (exit {}); {} of {} pages non-zero, {} resident",
        spec.dirty_bytes() >> 20,
        result.boot_and_dirty_ms / 1000.0,
        result.exits_at_snapshot,
        result.pages.nonzero,
        ram_pages,
        result.pages.resident
    );

    // 2. Snapshots against the baselines.
    for loc in &plan.locations {
        let dir = loc.dir.join(cell_dir_name(spec));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        result.locations.push(LocationResult {
            name: loc.name.clone(),
            fs: fs_type(&dir),
            dir,
            ..LocationResult::default()
        });
    }
    let mut buffer = vec![1u8; session.memory().len()];
    // One untimed warm-up per store: the first writes into memory the machine has not used yet
    // pay for it once (under the helper VM, QEMU backing L1's RAM on first touch).
    for loc in &mut result.locations {
        let warm = SavedState::of_run(session.capture().context("capturing the VM state")?);
        let meta = SnapshotMeta::new(
            "warm-up",
            session.now(),
            session.exits(),
            warm.session.ram_bytes,
            warm.session.seed,
        );
        if let Err(e) = snapshot::write_snapshot(&loc.dir, &meta, &warm, session.memory()) {
            loc.error = Some(format!("writing the warm-up snapshot: {e}"));
            continue;
        }
        let _ = fs::remove_dir_all(loc.dir.join("warm-up"));
        if let Err(e) = full_copy(session.memory(), &loc.dir.join("full-copy.img")) {
            loc.full_copy_error = Some(format!("warm-up: {e}"));
        }
    }
    for run in 1..=plan.runs {
        let t = Instant::now();
        let n = nonzero_pages(session.memory());
        result.zero_scan_ms.push(ms(t.elapsed()));
        if n != result.pages.nonzero {
            result.warnings.push(format!(
                "run {run}: {n} non-zero pages, first count {}",
                result.pages.nonzero
            ));
        }
        let t = Instant::now();
        buffer.copy_from_slice(session.memory());
        result.memcpy_ms.push(ms(t.elapsed()));
        for loc in &mut result.locations {
            if loc.error.is_some() {
                continue;
            }
            let id = format!("run-{run}");
            let t0 = Instant::now();
            let state = SavedState::of_run(session.capture().context("capturing the VM state")?);
            let t1 = Instant::now();
            let meta = SnapshotMeta::new(
                id.clone(),
                session.now(),
                session.exits(),
                state.session.ram_bytes,
                state.session.seed,
            );
            let written = snapshot::write_snapshot(&loc.dir, &meta, &state, session.memory());
            let t2 = Instant::now();
            let info = match written {
                Ok(i) => i,
                Err(e) => {
                    loc.error = Some(format!("writing snapshot {id}: {e}"));
                    continue;
                }
            };
            loc.capture_ms.push(ms(t1 - t0));
            loc.write_ms.push(ms(t2 - t1));
            loc.snapshot_ms.push(ms(t2 - t0));
            if run == 1 {
                loc.stored_pages = info.memory_pages_stored;
                loc.disk_bytes = info.disk_bytes;
                loc.state_bytes = info.state_bytes;
            } else {
                let _ = fs::remove_dir_all(loc.dir.join(&id));
            }
            match full_copy(session.memory(), &loc.dir.join("full-copy.img")) {
                Ok(d) => loc.full_copy_ms.push(ms(d)),
                Err(e) => loc.full_copy_error = Some(e.to_string()),
            }
            say!(
                "{tag}: run {run}/{} {}: snapshot {:.1} ms (capture {:.2} + write {:.1}), \
                 {} pages, {} KiB on disk; full copy {}",
                plan.runs,
                loc.name,
                ms(t2 - t0),
                ms(t1 - t0),
                ms(t2 - t1),
                info.memory_pages_stored,
                info.disk_bytes >> 10,
                loc.full_copy_ms
                    .last()
                    .filter(|_| loc.full_copy_error.is_none())
                    .map_or("failed".into(), |v| format!("{v:.1} ms")),
            );
        }
    }
    drop(buffer);
    drop(session);

    // 3. Restores: in process, then as child processes.
    for loc in &mut result.locations {
        if loc.error.is_some() {
            continue;
        }
        let dir = loc.dir.join("run-1");
        // The first restore in a process runs cold code (under TCG: not yet translated); it is
        // kept apart, and the timed ones below are warm.
        match restore_and_teardown(&dir, Staging::On9p) {
            Ok(p) => {
                say!(
                    "{tag}: first (cold, untimed) restore in this process from {}: {:.1} ms",
                    loc.name,
                    p.total_ms
                );
                loc.cold_restore = Some(p);
            }
            Err(e) => {
                loc.error = Some(format!("restore: {e:#}"));
                continue;
            }
        }
        for run in 1..=plan.runs {
            match restore_and_teardown(&dir, Staging::On9p) {
                Ok(p) => {
                    say!(
                        "{tag}: restore {run}/{} from {}: {:.1} ms to the first exit (read {:.1}, \
                         map {:.1}, resume {:.1}, first exit {:.1}), teardown {:.1} ms",
                        plan.runs,
                        loc.name,
                        p.total_ms,
                        p.read_ms,
                        p.map_ms,
                        p.resume_ms,
                        p.first_exit_ms,
                        p.teardown_ms.unwrap_or(0.0)
                    );
                    loc.restores.push(p);
                }
                Err(e) => {
                    loc.error = Some(format!("restore: {e:#}"));
                    break;
                }
            }
        }
        if loc.fs == "9p" {
            for run in 1..=plan.runs {
                match restore_and_teardown(&dir, Staging::Never) {
                    Ok(p) => {
                        say!(
                            "{tag}: restore {run}/{} from {}, memory.img mapped directly: {:.1} ms \
                             to the first exit (map {:.1}, first exit {:.1})",
                            plan.runs, loc.name, p.total_ms, p.map_ms, p.first_exit_ms
                        );
                        loc.direct_restores.push(p);
                    }
                    Err(e) => {
                        loc.error = Some(format!("restore without staging: {e:#}"));
                        break;
                    }
                }
            }
        }
        for run in 1..=plan.runs {
            let c = child_restore(&dir);
            say!(
                "{tag}: child restore {run}/{} from {}: {}",
                plan.runs,
                loc.name,
                if c.ok {
                    format!(
                        "{:.1} ms to the first exit, {:.1} ms until reaped",
                        c.to_first_exit_ms.unwrap_or(0.0),
                        c.wall_ms
                    )
                } else {
                    format!("FAILED: {}", c.error.as_deref().unwrap_or("?"))
                }
            );
            loc.child_restores.push(c);
        }
    }

    // 4. Forks and resets, from the first store (the in-memory one when measured).
    let Some(source) = result
        .locations
        .iter()
        .find(|l| l.error.is_none())
        .map(|l| (l.name.clone(), l.dir.join("run-1")))
    else {
        bail!("no snapshot could be written or restored");
    };
    let (store, dir) = source;
    if plan.forks > 0 {
        let mut fr = ForkResult {
            store: store.clone(),
            iterations: plan.forks,
            ..ForkResult::default()
        };
        let t = Instant::now();
        for _ in 0..plan.forks {
            let i = Instant::now();
            restore_and_teardown(&dir, Staging::On9p)?;
            fr.iteration_ms.push(ms(i.elapsed()));
        }
        fr.total_ms = ms(t.elapsed());
        fr.per_sec = f64::from(plan.forks) / (fr.total_ms / 1000.0);
        say!(
            "{tag}: {} sequential restores + first exit + teardown in {:.0} ms: {:.1} forks/s",
            plan.forks,
            fr.total_ms,
            fr.per_sec
        );
        result.forks = Some(fr);
    }
    if plan.resets > 0 {
        result.resets = Some(resets(plan, &store, &dir)?);
        match memory_revert(&dir, plan.burst_pages, 200) {
            Ok(m) => result.memory_revert = Some(m),
            Err(e) => result.warnings.push(format!("memory revert: {e:#}")),
        }
    }
    Ok(())
}

/// Calibrates the burst (fewest exits after resume that dirty `burst_pages` pages), then
/// times `resets` iterations of restore + burst + teardown.
fn resets(plan: &CellPlan, store: &str, dir: &Path) -> Result<ResetResult> {
    let tag = &plan.tag;
    let (mut session, _) = restore_to_first_exit(dir, Staging::On9p)?;
    let start = session.exits() - 1;
    let mut dirty = cow_pages(session.memory())?;
    while dirty < plan.burst_pages && session.exits() - start < BURST_MAX_EXITS {
        // One exit at a time for the first 512, then in steps of ~1/64 of the burst so far.
        let step = ((session.exits() - start) / 64).max(1);
        if let Some(stop) = session.run_until(vmm::vm::Until::Exit(session.exits() + step))? {
            bail!("the restored guest stopped during the burst calibration: {stop:?}");
        }
        dirty = cow_pages(session.memory())?;
    }
    let burst = session.exits() - start;
    drop(session);
    let mut r = ResetResult {
        store: store.into(),
        burst_exits: burst,
        dirty_pages: dirty,
        reached_target: dirty >= plan.burst_pages,
        iterations: plan.resets,
        ..ResetResult::default()
    };
    let (mut restore, mut burst_t, mut teardown) = (Vec::new(), Vec::new(), Vec::new());
    let t = Instant::now();
    for _ in 0..plan.resets {
        let (mut s, phases) = restore_to_first_exit(dir, Staging::On9p)?;
        let b = Instant::now();
        if let Some(stop) = s.run_until(vmm::vm::Until::Exit(start + burst))? {
            bail!("the restored guest stopped during a burst: {stop:?}");
        }
        let d = Instant::now();
        drop(s);
        restore.push(phases.total_ms);
        burst_t.push(ms(d - b));
        teardown.push(ms(d.elapsed()));
    }
    r.total_ms = ms(t.elapsed());
    r.per_sec = f64::from(plan.resets) / (r.total_ms / 1000.0);
    r.restore_ms = median(&mut restore).unwrap_or(0.0);
    r.burst_ms = median(&mut burst_t).unwrap_or(0.0);
    r.teardown_ms = median(&mut teardown).unwrap_or(0.0);
    // One more, untimed, to check that the burst dirties the same pages again.
    let (mut s, _) = restore_to_first_exit(dir, Staging::On9p)?;
    if s.run_until(vmm::vm::Until::Exit(start + burst))?.is_none() {
        r.dirty_pages_check = cow_pages(s.memory()).ok();
    }
    drop(s);
    say!(
        "{tag}: resets: burst of {burst} exits dirties {dirty} pages; {} resets in {:.0} ms: \
         {:.1} resets/s (restore {:.1} + burst {:.1} + teardown {:.1} ms)",
        plan.resets,
        r.total_ms,
        r.per_sec,
        r.restore_ms,
        r.burst_ms,
        r.teardown_ms
    );
    let p = in_place_resets(plan, dir, start + burst)?;
    say!(
        "{tag}: in-place resets: checkpoint {:.1} ms ({} pages kept); {} resets in {:.0} ms: \
         {:.1} resets/s (burst {:.1} + reset {:.1} ms, {:.0} pages copied back, {:.0} fetched \
         from the file; {} pages kept at the end), identical: {}",
        p.checkpoint_ms,
        p.checkpoint_pages,
        plan.resets,
        p.total_ms,
        p.per_sec,
        p.burst_ms,
        p.reset_ms,
        p.pages_copied,
        p.pages_fetched,
        p.checkpoint_pages_at_end,
        p.identical
    );
    r.in_place = Some(p);
    Ok(r)
}

/// The reset loop in place: restore once, checkpoint after the first exit,
/// then `resets` times run to exit `burst_end` and `reset_to` the checkpoint.
fn in_place_resets(plan: &CellPlan, dir: &Path, burst_end: u64) -> Result<InPlaceResets> {
    let (mut s, _) = restore_to_first_exit(dir, Staging::On9p)?;
    let c = Instant::now();
    let checkpoint = s.checkpoint()?;
    let mut p = InPlaceResets {
        checkpoint_ms: ms(c.elapsed()),
        checkpoint_pages: checkpoint.pages_kept(),
        ..InPlaceResets::default()
    };
    let (mut reset_t, mut burst_t) = (Vec::new(), Vec::new());
    let (mut copied, mut fetched) = (Vec::new(), Vec::new());
    let t = Instant::now();
    for _ in 0..plan.resets {
        let b = Instant::now();
        if let Some(stop) = s.run_until(vmm::vm::Until::Exit(burst_end))? {
            bail!("the guest stopped during an in-place burst: {stop:?}");
        }
        let r = Instant::now();
        let stats = s.reset_to(&checkpoint)?;
        reset_t.push(ms(r.elapsed()));
        burst_t.push(ms(r - b));
        copied.push(stats.pages_copied as f64);
        fetched.push(stats.pages_fetched as f64);
    }
    p.total_ms = ms(t.elapsed());
    p.per_sec = f64::from(plan.resets) / (p.total_ms / 1000.0);
    p.reset_ms = median(&mut reset_t).unwrap_or(0.0);
    p.burst_ms = median(&mut burst_t).unwrap_or(0.0);
    p.pages_copied = median(&mut copied).unwrap_or(0.0);
    p.pages_fetched = median(&mut fetched).unwrap_or(0.0);
    p.checkpoint_pages_at_end = s.checkpoint_memory().pages;
    // Untimed: two more bursts must end in the same state.
    let mut digest_of_burst = || -> Result<String> {
        if let Some(stop) = s.run_until(vmm::vm::Until::Exit(burst_end))? {
            bail!("the guest stopped during an in-place burst: {stop:?}");
        }
        let digest = s.outcome(vmm::exit::StopReason::TimeLimit).digest;
        s.reset_to(&checkpoint)?;
        Ok(digest)
    };
    p.identical = digest_of_burst()? == digest_of_burst()?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_bytes_are_whole_pages() {
        let spec = CellSpec {
            mem: "256M".into(),
            ram_bytes: 256 << 20,
            dirty_pct: 0.1,
        };
        assert_eq!(spec.dirty_bytes() % PAGE as u64, 0);
        assert_eq!(spec.dirty_bytes() / PAGE as u64, 65);
        assert!(snap_guest_script(4096).contains("head -c 4096 "));
    }

    #[test]
    fn failed_cells_keep_their_spec() {
        let spec = CellSpec {
            mem: "1G".into(),
            ram_bytes: 1 << 30,
            dirty_pct: 10.0,
        };
        let c = CellResult::failed(&spec, "why".into());
        assert_eq!(
            (c.mem.as_str(), c.ram_bytes, c.dirty_pct),
            ("1G", 1 << 30, 10.0)
        );
        assert_eq!((c.ok, c.error.as_deref()), (false, Some("why")));
        let c = CellResult {
            mem: "x".into(),
            cell_wall_ms: 5.0,
            ..CellResult::default()
        }
        .with_spec(&spec);
        assert_eq!((c.mem.as_str(), c.cell_wall_ms), ("1G", 5.0));
    }
}
