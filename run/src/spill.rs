//! A live run's moments written to disk and loaded back into the same run
//! in place: the campaign's checkpoints spilled when memory runs short.
//! A spilled moment is an ordinary snapshot (docs/snapshots.md), full or
//! incremental over the previous one written by the same run (the pages the
//! dirty log and the resets changed since); loading it writes only the
//! pages of guest RAM that differ and keeps every live checkpoint of the
//! run valid ([`vmm::vm::Session::load_in_place`]).

use crate::driven::{Driven, DrivenError, SavedState};
use devices::Persist;
use snapshot::{SnapshotError, SnapshotMeta};
use std::path::{Path, PathBuf};
use vmm::vm::{LoadStats, VmError};

#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    #[error("creating {}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the dirty log")]
    DirtyLog(#[source] VmError),
    #[error("capturing the run's state")]
    Capture(#[source] DrivenError),
    #[error("writing the moment {id}")]
    Write {
        id: String,
        #[source]
        source: SnapshotError,
    },
    #[error("reading the moment {}", dir.display())]
    Read {
        dir: PathBuf,
        #[source]
        source: SnapshotError,
    },
    #[error("reading the pages of {}", dir.display())]
    ReadPages {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a moment of this run ({reason})", dir.display())]
    NotThisRun { dir: PathBuf, reason: String },
    #[error("loading {} in place", dir.display())]
    Load {
        dir: PathBuf,
        #[source]
        source: VmError,
    },
    #[error("loading {} in place: the `up` run's conversation", dir.display())]
    Up {
        dir: PathBuf,
        #[source]
        source: devices::RestoreError,
    },
}

/// Writes the run's present moment as snapshot `id` under `root`: over
/// `parent` (a snapshot in `root` this run wrote, the last one) with only
/// the pages changed since it, or full when `parent` is `None` (then the
/// next one may name it). The run's checkpoints stay usable.
pub fn write(
    root: &Path,
    id: &str,
    driven: &mut Driven,
    parent: Option<&str>,
) -> Result<snapshot::SnapshotInfo, SpillError> {
    std::fs::create_dir_all(root).map_err(|source| SpillError::CreateDir {
        dir: root.to_owned(),
        source,
    })?;
    let dirty = match parent {
        // Pages are counted from this full snapshot on.
        None => {
            driven
                .session
                .start_dirty_log()
                .map_err(SpillError::DirtyLog)?;
            None
        }
        Some(_) => Some(
            driven
                .session
                .take_dirty_pages()
                .map_err(SpillError::DirtyLog)?,
        ),
    };
    let state = driven.capture().map_err(SpillError::Capture)?;
    let session = &driven.session;
    let mut meta = SnapshotMeta::new(
        id,
        session.now(),
        session.exits(),
        state.session.ram_bytes,
        state.session.seed,
    );
    meta.parent = parent.map(str::to_owned);
    let memory = session.memory();
    let written = match &dirty {
        None => snapshot::write_snapshot(root, &meta, &state, memory),
        Some(pages) => snapshot::write_incremental_snapshot(root, &meta, &state, memory, pages),
    };
    written.map_err(|source| SpillError::Write {
        id: id.to_owned(),
        source,
    })
}

/// Returns the run, in place, to the moment saved in `dir` (written by
/// [`write`] from this run): its RAM, machine state and `up` conversation.
pub fn load_in_place(driven: &mut Driven, dir: &Path) -> Result<LoadStats, SpillError> {
    let read = |source| SpillError::Read {
        dir: dir.to_owned(),
        source,
    };
    let (_, saved): (SnapshotMeta, SavedState) = snapshot::read_snapshot(dir).map_err(read)?;
    if saved.up.is_some() != driven.up.is_some() {
        return Err(SpillError::NotThisRun {
            dir: dir.to_owned(),
            reason: "an `up` run and a plain one".into(),
        });
    }
    let chain = snapshot::memory_chain(dir).map_err(read)?;
    // The pages the snapshot stores, from its checksummed index.
    let stored: Vec<(u64, u64)> = chain
        .iter()
        .flat_map(|layer| layer.runs.iter().map(|run| run.byte_range()))
        .collect();
    let image =
        read_stored(&chain, saved.session.ram_bytes).map_err(|source| SpillError::ReadPages {
            dir: dir.to_owned(),
            source,
        })?;
    let stats = driven
        .session
        .load_in_place(&saved.session, &image, &stored)
        .map_err(|source| SpillError::Load {
            dir: dir.to_owned(),
            source,
        })?;
    if let (Some(up), Some(state)) = (&mut driven.up, &saved.up) {
        up.restore(state).map_err(|source| SpillError::Up {
            dir: dir.to_owned(),
            source,
        })?;
        // Reported on the path just left: not part of the moment's past.
        drop(up.take_records());
    }
    Ok(stats)
}

/// Guest RAM as `chain` (base first) stores it, read with one `pread` per
/// run of stored pages (a lazily mapped image would fault them in one page
/// at a time, each a round trip on a 9p share). The buffer is zeroed lazily
/// (a large allocation is fresh anonymous memory): only the stored pages
/// are touched, and the load reads nothing else of it.
fn read_stored(chain: &[snapshot::MemoryLayer], ram_bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut image = vec![0u8; ram_bytes as usize];
    for layer in chain {
        for run in &layer.runs {
            let (start, end) = run.byte_range();
            let end = end.min(ram_bytes);
            if start < end {
                layer
                    .file
                    .read_exact_at(&mut image[start as usize..end as usize], start)?;
            }
        }
    }
    Ok(image)
}
