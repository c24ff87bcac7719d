//! Restores for `bench snapshot`: in process (as `snapshots::restore` does them, to the first
//! exit after resume), and in a child process of their own (`--restore-child`).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::{self, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use snapshot::SnapshotMeta;
use vmm::vm::Session as VmSession;

use super::machine::fs_type;
use super::process::{run_timed, ErrMode, Watch};
use super::snapshot_memory::stage_in_memfd;
use super::stats::ms;

/// The line a restore child prints once the first exit after resume has been handled.
const MARK_FIRST_EXIT: &str = "detvisor-bench-first-exit ";
/// Time limit of one restore child process.
const RESTORE_CHILD_LIMIT: Duration = Duration::from_secs(120);

/// The phases of one restore, in ms.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct RestorePhases {
    /// `snapshot::read_snapshot`: state.bin and memory.idx read and checked, state decoded.
    pub read_ms: f64,
    /// `memory_file` + `memory_chain` (the index again, for the data ranges), staging into a
    /// memfd when on 9p, `memory_from_file` (mmap MAP_PRIVATE).
    pub map_ms: f64,
    /// `Session::resume`: a new KVM VM over the mapping, vCPU and device state restored.
    pub resume_ms: f64,
    /// `run_until(exits + 1)`: enter the guest, take and handle its first exit.
    pub first_exit_ms: f64,
    /// read_snapshot call to the first exit handled.
    pub total_ms: f64,
    /// Dropping the session (KVM VM and mapping torn down); not part of `total_ms`.
    pub teardown_ms: Option<f64>,
    /// The memory file was on 9p and was copied into a memfd first.
    pub staged: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct ChildRestore {
    pub ok: bool,
    pub error: Option<String>,
    /// Just before spawn() to the arrival of its "first exit handled" line.
    pub to_first_exit_ms: Option<f64>,
    /// Just before spawn() to wait() returning (process exit and VM teardown included).
    pub wall_ms: f64,
    pub inner: Option<RestorePhases>,
}

/// How a restore gets the memory file's pages.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// Copy the stored pages into a memfd first when the file is on 9p (what
    /// `snapshots::restore` intends).
    On9p,
    /// Map the file as it is, wherever it is.
    Never,
}

/// Restores `dir` as `snapshots::restore` does (read_snapshot, memory_file, memory_chain,
/// staging on 9p, memory_from_file, Session::resume) and handles the first exit after resume.
pub fn restore_to_first_exit(dir: &Path, staging: Staging) -> Result<(VmSession, RestorePhases)> {
    let t0 = Instant::now();
    let (_, saved): (SnapshotMeta, run::driven::SavedState) = snapshot::read_snapshot(dir)
        .with_context(|| format!("reading snapshot {}", dir.display()))?;
    let state = saved.session;
    let t_read = Instant::now();
    let (file, len) = snapshot::memory_file(dir)?;
    let ranges: Vec<(u64, u64)> = snapshot::memory_chain(dir)?
        .iter()
        .flat_map(|layer| layer.runs.iter().map(|run| run.byte_range()))
        .collect();
    let staged = staging == Staging::On9p && fs_type(dir) == "9p";
    let file = if staged {
        stage_in_memfd(&file, len, &ranges)?
    } else {
        file
    };
    let memory = vmm::vm::memory_from_file(file, len)?;
    let t_map = Instant::now();
    let mut session = VmSession::resume(
        &vmm::vm::ResumeConfig::default(),
        &state,
        memory,
        ranges,
        Box::new(io::sink()),
        None,
    )?;
    let t_resume = Instant::now();
    let exits = session.exits();
    if let Some(stop) = session.run_until(Some(exits + 1), None)? {
        bail!("the restored guest stopped at its first exit: {stop:?}");
    }
    let t_first = Instant::now();
    Ok((
        session,
        RestorePhases {
            read_ms: ms(t_read - t0),
            map_ms: ms(t_map - t_read),
            resume_ms: ms(t_resume - t_map),
            first_exit_ms: ms(t_first - t_resume),
            total_ms: ms(t_first - t0),
            teardown_ms: None,
            staged,
        },
    ))
}

pub fn restore_and_teardown(dir: &Path, staging: Staging) -> Result<RestorePhases> {
    let (session, mut phases) = restore_to_first_exit(dir, staging)?;
    let t = Instant::now();
    drop(session);
    phases.teardown_ms = Some(ms(t.elapsed()));
    Ok(phases)
}

/// `bench snapshot --restore-child DIR`: one restore to the first exit, reported on stdout
/// as soon as it is handled; then the process tears the VM down and exits.
pub fn restore_child_main(dir: &Path) -> Result<u8> {
    let (session, phases) = restore_to_first_exit(dir, Staging::On9p)?;
    let mut out = io::stdout().lock();
    writeln!(out, "{MARK_FIRST_EXIT}{}", serde_json::to_string(&phases)?)?;
    out.flush()?;
    drop(out);
    drop(session);
    Ok(0)
}

/// One restore in a `--restore-child` process of its own, timed from just before spawn().
pub fn child_restore(dir: &Path) -> ChildRestore {
    let failed = |error: String| ChildRestore {
        error: Some(error),
        ..ChildRestore::default()
    };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return failed(format!("cannot locate the detvisor executable: {e}")),
    };
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "snapshot", "--restore-child"]).arg(dir);
    let finished = match run_timed(cmd, RESTORE_CHILD_LIMIT, ErrMode::Capture, Watch::default()) {
        Ok(f) => f,
        Err(e) => return failed(format!("{e:#}")),
    };
    let line = finished.first_line(MARK_FIRST_EXIT);
    let mut r = ChildRestore {
        wall_ms: ms(finished.wall),
        to_first_exit_ms: line.map(|(at, _)| ms(at.duration_since(finished.started))),
        inner: line.and_then(|(_, l)| serde_json::from_str(l).ok()),
        ..ChildRestore::default()
    };
    r.ok = finished.succeeded() && r.to_first_exit_ms.is_some();
    if !r.ok {
        r.error = Some(finished.failure("the restore child", RESTORE_CHILD_LIMIT));
    }
    r
}
