//! Restores for `bench snapshot`: step by step (as `snapshots::restore` does them, to the first
//! exit after resume), and as a caller of the run library's API makes one, on a fresh thread
//! with a `Controller` of its own (the "child" restores).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use run::api::Until;
use run::client::{Calls, Local, RunnerError};

use snapshot::SnapshotMeta;
use vmm::vm::Session as VmSession;

use super::machine::fs_type;
use super::snapshot_memory::stage_in_memfd;
use super::stats::ms;

/// Time limit of one child restore.
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
    /// Just before its thread starts to the first exit handled.
    pub to_first_exit_ms: Option<f64>,
    /// Just before its thread starts to its end (the run closed: VM teardown included).
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
    if let Some(stop) = session.run_until(vmm::vm::Until::Exit(exits + 1))? {
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

/// One restore of the snapshot `dir` as a caller of the run library makes it (`branch`, a
/// seeds worker): on a fresh thread, a `Controller` of its own, `Request::Restore`, then
/// `RunUntil` one more exit, then `Close`; timed from just before the thread starts.
pub fn child_restore(dir: &Path) -> ChildRestore {
    let moment = run::moment::Moment::Snapshot(dir.to_path_buf());
    let (tx, rx) = mpsc::channel();
    let started = Instant::now();
    let worker = thread::spawn(move || -> Result<()> {
        let mut here = Local::new(run::streams::Discard);
        let mut calls = Calls::new(&mut here);
        let failed = |e: RunnerError| anyhow::Error::msg(e.into_cause());
        let (run, _) = calls
            .restore(moment, None, Default::default(), false)
            .map_err(failed)?;
        let p = calls.run_until(run, Until::Steps(1)).map_err(failed)?;
        if p.stop.is_some() {
            bail!("the restored guest stopped at its first exit: {p:?}");
        }
        let _ = tx.send(Instant::now());
        calls.close(run).map_err(failed)?;
        Ok(())
    });
    let first_exit = rx.recv_timeout(RESTORE_CHILD_LIMIT).ok();
    let mut r = ChildRestore {
        to_first_exit_ms: first_exit.map(|at| ms(at.duration_since(started))),
        ..ChildRestore::default()
    };
    if first_exit.is_none() && !worker.is_finished() {
        // A thread cannot be killed: it is left to run on.
        r.wall_ms = ms(started.elapsed());
        r.error = Some(format!(
            "no first exit within the {} s time limit",
            RESTORE_CHILD_LIMIT.as_secs()
        ));
        return r;
    }
    let ended = worker.join();
    r.wall_ms = ms(started.elapsed());
    match ended {
        Ok(Ok(())) => r.ok = r.to_first_exit_ms.is_some(),
        Ok(Err(e)) => r.error = Some(format!("{e:#}")),
        Err(_) => r.error = Some("the restore's thread panicked".into()),
    }
    r
}
