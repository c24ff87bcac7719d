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
    meta.clock = state.session.machine.clock.kind;
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

/// Guest RAM as `chain` (base first) stores it, each page read once, from
/// the last layer that stores it, with one `pread` per run of such pages (a
/// lazily mapped image would fault them in one page at a time, each a round
/// trip on a 9p share; reading every layer whole read the pages later
/// layers overwrite too, most of a long chain's bytes). The buffer is
/// zeroed lazily (a large allocation is fresh anonymous memory): only the
/// stored pages are touched, and the load reads nothing else of it.
fn read_stored(chain: &[snapshot::MemoryLayer], ram_bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut image = vec![0u8; ram_bytes as usize];
    for (layer, first, count) in topmost_runs(chain.iter().map(|l| l.runs.as_slice()), ram_bytes) {
        let start = first * PAGE_BYTES;
        let end = ((first + count) * PAGE_BYTES).min(ram_bytes);
        chain[layer]
            .file
            .read_exact_at(&mut image[start as usize..end as usize], start)?;
    }
    Ok(image)
}

const PAGE_BYTES: u64 = snapshot::PAGE_SIZE;

/// Runs of pages (layer, first page, count) that read guest RAM from a
/// chain whose layers (base first) store `layers`' page runs: each page
/// from the last layer storing it, in page order. Pages no layer stores
/// (zero) are in none.
fn topmost_runs<'a>(
    layers: impl Iterator<Item = &'a [snapshot::PageRun]>,
    ram_bytes: u64,
) -> Vec<(usize, u64, u64)> {
    const NONE: u32 = u32::MAX;
    let pages = ram_bytes.div_ceil(PAGE_BYTES) as usize;
    let mut owner = vec![NONE; pages];
    for (layer, runs) in layers.enumerate() {
        for run in runs {
            let first = (run.first as usize).min(pages);
            let last = (run.first.saturating_add(run.count) as usize).min(pages);
            owner[first..last].fill(layer as u32);
        }
    }
    let mut runs: Vec<(usize, u64, u64)> = Vec::new();
    for (page, &layer) in owner.iter().enumerate() {
        if layer == NONE {
            continue;
        }
        match runs.last_mut() {
            Some((l, first, count)) if *l == layer as usize && *first + *count == page as u64 => {
                *count += 1
            }
            _ => runs.push((layer as usize, page as u64, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapshot::PageRun;

    fn run(first: u64, count: u64) -> PageRun {
        PageRun { first, count }
    }

    /// Each page comes from the last layer that stores it, once; pages no
    /// layer stores are not read.
    #[test]
    fn test_each_page_is_read_from_its_last_layer_only() {
        let base = [run(0, 8)];
        let over = [run(2, 2), run(6, 1)];
        let top = [run(3, 4), run(10, 2)];
        let layers = [&base[..], &over[..], &top[..]];
        let runs = topmost_runs(layers.into_iter(), 12 * PAGE_BYTES);
        assert_eq!(
            runs,
            vec![(0, 0, 2), (1, 2, 1), (2, 3, 4), (0, 7, 1), (2, 10, 2)]
        );
        let pages: u64 = runs.iter().map(|r| r.2).sum();
        assert_eq!(pages, 10, "pages 8 and 9 are zero in every layer");
    }

    /// A run past the end of RAM (a corrupt index) is cut at the end.
    #[test]
    fn test_runs_past_the_end_are_cut() {
        let base = [run(2, u64::MAX)];
        let runs = topmost_runs([&base[..]].into_iter(), 4 * PAGE_BYTES);
        assert_eq!(runs, vec![(0, 2, 2)]);
    }
}
