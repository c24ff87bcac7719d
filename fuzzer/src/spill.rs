//! Checkpoints spilled to disk: a live checkpoint the campaign lets go
//! (beyond `live_checkpoints`, or past `checkpoint_memory`) is first written
//! to `DIR/spill/` as a snapshot of the run (incremental over the one
//! written before it), and going back to its moment later loads it into the
//! run in place (only the pages that differ; every live checkpoint stays
//! valid) instead of replaying the path from a live ancestor. A moment
//! loaded back has its digest checked against the tree's.
//!
//! The files serve this process only: opening removes whatever an earlier
//! process left (a resumed campaign trusts none of it), finishing removes
//! the directory.
//!
//! `spill/` is bounded: `search.spill_limit` bytes for all workers (each
//! gets its share), by default half the free space of the campaign
//! directory's file system when the campaign starts. A moment whose
//! snapshot would take `spill/` past its bound, or whose write fails (a
//! full disk), is let go without being kept on disk: its snapshot is
//! removed, the campaign goes on (going back to that moment replays from
//! the root or a live ancestor, as without spilling), and a line says so.
//! The worker writes no more after that.

use run::api::{CheckpointId, Position, RunId};
use run::client::{Calls, RunnerError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The spilled moments' directory in a campaign directory.
pub const SPILL_DIR: &str = "spill";
/// Every this many spills one is full: it bounds the chain a load maps.
const FULL_EVERY: u32 = 32;

#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error("moment {node} loaded back from {} has digest {actual}, not its own {expected}", dir.display())]
    Digest {
        node: u64,
        dir: PathBuf,
        expected: String,
        actual: String,
    },
}

type Result<T, E = SpillError> = std::result::Result<T, E>;

/// What spilling cost, for progress lines and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpillStats {
    pub written: u64,
    pub write_ms: u64,
    pub loaded: u64,
    pub load_ms: u64,
}

impl std::ops::AddAssign for SpillStats {
    fn add_assign(&mut self, other: Self) {
        self.written += other.written;
        self.write_ms += other.write_ms;
        self.loaded += other.loaded;
        self.load_ms += other.load_ms;
    }
}

/// The moments of a campaign's tree that are on disk.
pub struct Spill {
    dir: PathBuf,
    /// Bytes this worker's spilled moments may take on disk.
    limit: u64,
    /// Bytes they take (allocated blocks).
    bytes: u64,
    /// Set when a write failed or the limit was reached: no more writes.
    stopped: bool,
    /// Lines to say (why writes stopped), taken by [`Spill::take_notes`].
    notes: Vec<String>,
    /// Tree node → snapshot id.
    on_disk: BTreeMap<u64, String>,
    /// The last snapshot written (the next one's parent) and how many
    /// since the last full one.
    last: Option<String>,
    since_full: u32,
    pub stats: SpillStats,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpillError + '_ {
    move |source| SpillError::Io {
        path: path.to_owned(),
        source,
    }
}

impl Spill {
    /// An empty spill directory `dir` (what an earlier process left there
    /// is removed, never trusted).
    /// Its moments may take `limit` bytes on disk.
    pub fn open(dir: &Path, limit: u64) -> Result<Self> {
        let dir = dir.to_owned();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        Ok(Spill {
            dir,
            limit,
            bytes: 0,
            stopped: false,
            notes: Vec::new(),
            on_disk: BTreeMap::new(),
            last: None,
            since_full: 0,
            stats: SpillStats::default(),
        })
    }

    /// Whether `node`'s moment is on disk.
    pub fn holds(&self, node: u64) -> bool {
        self.on_disk.contains_key(&node)
    }

    /// The lines saying why writes stopped, once each.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// Stops writing, saying `why`; removes what was written of the
    /// snapshot `id` (its directory, or the work directory of a write cut
    /// short, `.`-named), so a full disk gets that space back at once.
    fn stop(&mut self, id: &str, why: String) {
        let _ = std::fs::remove_dir_all(self.dir.join(id));
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with('.') {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        self.stopped = true;
        self.notes.push(format!(
            "{why}: checkpoints let go from now on are not kept on disk ({}); the campaign goes on, replaying their moments from the root or a live ancestor when it needs them",
            self.dir.display()
        ));
    }

    /// Writes `node`'s moment (held by `checkpoint`, not the present) to
    /// disk unless it is there already or writes have stopped; the run is
    /// back at `present` after.
    fn write(
        &mut self,
        calls: &mut Calls<'_>,
        run: RunId,
        node: u64,
        checkpoint: CheckpointId,
        present: CheckpointId,
    ) -> Result<()> {
        if self.holds(node) || self.stopped {
            return Ok(());
        }
        let started = Instant::now();
        calls.reset(run, checkpoint)?;
        let id = format!("node-{node:08}");
        let parent = if self.since_full == 0 {
            None
        } else {
            self.last.clone()
        };
        let written = calls.spill(run, &self.dir, &id, parent);
        // Back at the present whatever became of the write: a runner that
        // cannot do that is broken, and that ends the campaign.
        calls.reset(run, present)?;
        if let Err(e) = written {
            self.stop(&id, format!("writing moment {node} to spill/ failed ({e})"));
            return Ok(());
        }
        let size = disk_bytes(&self.dir.join(&id)).map_err(io(&self.dir))?;
        if self.bytes.saturating_add(size) > self.limit {
            self.stop(
                &id,
                format!(
                    "spill/ reached its bound: moment {node} takes {}, and this worker's share of the bound (search.spill_limit) is {} ({} in use)",
                    run::units::ByteSize(size),
                    run::units::ByteSize(self.limit),
                    run::units::ByteSize(self.bytes)
                ),
            );
            return Ok(());
        }
        self.bytes += size;
        self.since_full = (self.since_full + 1) % FULL_EVERY;
        self.last = Some(id.clone());
        self.on_disk.insert(node, id);
        self.stats.written += 1;
        self.stats.write_ms += started.elapsed().as_millis() as u64;
        Ok(())
    }

    /// The run at `node`'s spilled moment, in place; its digest checked
    /// against `digest` (the tree's).
    pub fn load(
        &mut self,
        calls: &mut Calls<'_>,
        run: RunId,
        node: u64,
        digest: &str,
    ) -> Result<Position> {
        let started = Instant::now();
        let dir = self.dir.join(&self.on_disk[&node]);
        let (position, _) = calls.load_in_place(run, &dir)?;
        let actual = calls.outcome(run)?.digest;
        if actual != digest {
            return Err(SpillError::Digest {
                node,
                dir,
                expected: digest.to_owned(),
                actual,
            });
        }
        self.stats.loaded += 1;
        self.stats.load_ms += started.elapsed().as_millis() as u64;
        Ok(position)
    }

    /// Removes `spill/` (the campaign is over in this process).
    pub fn finish(self) -> Result<SpillStats> {
        std::fs::remove_dir_all(&self.dir).map_err(io(&self.dir))?;
        Ok(self.stats)
    }
}

/// The disk space the files under `path` take (allocated blocks).
fn disk_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            total += disk_bytes(&entry?.path())?;
        }
    }
    Ok(total)
}

/// The default bound of `campaign`'s `spill/`: half the space free to
/// this process on its file system now (0 if that cannot be known).
pub fn default_limit(campaign: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(campaign.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs is plain old data, for which all zeroes is a value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs writes into the struct it is given and reads the
    // NUL-terminated path; both live across the call.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return 0;
    }
    (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64) / 2
}

/// Worker `index`'s spill directory in `campaign`: each worker's run holds
/// its own checkpoints, so each spills its own.
pub fn worker_dir(campaign: &Path, index: usize) -> PathBuf {
    campaign.join(SPILL_DIR).join(format!("w{index}"))
}

/// Removes `campaign`'s `spill/` and whatever is in it (before the workers
/// start, what an earlier process left; after them, their empty folders).
pub fn clear(campaign: &Path) -> Result<()> {
    let dir = campaign.join(SPILL_DIR);
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&dir)(e)),
        _ => Ok(()),
    }
}

/// Lets `node`'s `checkpoint` go, written to disk first when spilling;
/// `present` is the run's present moment's checkpoint (it is there after).
/// What the run's checkpoints hold then.
pub fn let_go(
    calls: &mut Calls<'_>,
    spill: Option<&mut Spill>,
    run: RunId,
    (node, checkpoint): (u64, CheckpointId),
    present: CheckpointId,
) -> Result<vmm::vm::CheckpointMemory> {
    if let Some(spill) = spill {
        spill.write(calls, run, node, checkpoint, present)?;
    }
    Ok(calls.drop_checkpoint(run, checkpoint)?)
}

/// Lets checkpoints of `live` (least recently used first; the root, node
/// 0, and the present, the last, are never let go) go while the run's
/// checkpoints hold more than `budget` bytes; the bytes they hold then
/// (`None`: no budget, not asked).
pub fn within_budget(
    calls: &mut Calls<'_>,
    mut spill: Option<&mut Spill>,
    run: RunId,
    live: &mut Vec<(u64, CheckpointId)>,
    budget: Option<u64>,
) -> Result<Option<u64>> {
    let Some(budget) = budget else {
        return Ok(None);
    };
    let mut memory = calls.checkpoint_memory(run)?;
    while memory.bytes > budget && live.len() > 2 {
        let present = live.last().expect("more than two").1;
        let Some(i) = live.iter().position(|(id, _)| *id != 0) else {
            break;
        };
        let old = live.remove(i);
        memory = let_go(calls, spill.as_deref_mut(), run, old, present)?;
    }
    Ok(Some(memory.bytes))
}
