//! Snapshots of runs: taking them while a run goes on, listing and
//! describing them, and resuming (`branch`) or inspecting (`seek`) a moment
//! of a saved history.

use crate::conversation::{OutputError, UpDriver, UpOutput};
use crate::driven::{Driven, DrivenError, SavedState};
use crate::moment::Moment;
use serde::Deserialize;
use serde::Serialize;
use snapshot::{SnapshotError, SnapshotMeta, Target};
use std::path::{Path, PathBuf};
use vmm::exit::StopReason;
use vmm::vm::{MemoryError, ResumeConfig, Session, Until, VmError};
use vmm::VirtNanos;

/// Why snapshots could not be taken, listed, described or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotsError {
    #[error("creating snapshot directory {}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the snapshot interval {given} is shorter than the least, {MIN_SNAPSHOT_INTERVAL}")]
    IntervalTooShort { given: VirtNanos },
    #[error("starting the dirty log")]
    StartDirtyLog(#[source] VmError),
    #[error("reading the dirty log")]
    DirtyLog(#[source] VmError),
    #[error("writing snapshot {id}")]
    Write {
        id: String,
        #[source]
        source: SnapshotError,
    },
    #[error("resolving {:?}", moment.to_string())]
    Resolve {
        moment: Box<Moment>,
        #[source]
        source: SnapshotError,
    },
    #[error("listing snapshots in {}", dir.display())]
    List {
        dir: PathBuf,
        #[source]
        source: SnapshotError,
    },
    #[error("reading {}", dir.display())]
    Info {
        dir: PathBuf,
        #[source]
        source: SnapshotError,
    },
    /// Reading a snapshot's state or memory.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Vm(#[from] VmError),
    /// Running, capturing or outputting the run (between snapshots, or to
    /// the restored moment).
    #[error(transparent)]
    Driven(#[from] DrivenError),
    #[error(transparent)]
    Output(#[from] OutputError),
    /// Measuring the devices' state (`seek`).
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(
        "{moment}: the guest's next exit comes {steps} single step(s) after exit {exit}: \
         the positions between them are exit:{exit}+insn:0 to exit:{exit}+insn:{steps}"
    )]
    PastInterval {
        moment: Box<Moment>,
        exit: u64,
        steps: u64,
    },
}

type Result<T, E = SnapshotsError> = std::result::Result<T, E>;

/// Creates the snapshot directory `dir`.
fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| SnapshotsError::CreateDir {
        dir: dir.to_owned(),
        source,
    })
}

/// When a run takes snapshots, and where they go.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotPlan {
    /// Directory to write snapshots into (created if missing).
    pub dir: PathBuf,
    /// A snapshot every this much virtual time.
    pub every: Option<VirtNanos>,
    /// A snapshot once this many exits have been handled.
    pub at_exits: Vec<u64>,
}

/// The shortest `--snapshot-every`: one virtual millisecond. Shorter (down
/// to zero) would take a snapshot at nearly every exit, filling the disk
/// far faster than the run progresses.
pub const MIN_SNAPSHOT_INTERVAL: VirtNanos = VirtNanos(1_000_000);

impl SnapshotPlan {
    /// Checks the plan before anything runs.
    pub fn validate(&self) -> Result<()> {
        match self.every {
            Some(given) if given < MIN_SNAPSHOT_INTERVAL => {
                Err(SnapshotsError::IntervalTooShort { given })
            }
            _ => Ok(()),
        }
    }
}

/// Takes snapshots at the requested points while running a session to its end.
pub struct Snapshotter {
    root: PathBuf,
    every: Option<VirtNanos>,
    at_exits: Vec<u64>,
    /// The parent a full snapshot names (lineage only): the previous one.
    last_id: Option<String>,
    /// The snapshot the next one is incremental over, and the layers of
    /// its memory chain (`None`: the next is full): the previous one
    /// written, or, for a branch's first, the snapshot it was restored from
    /// (in another directory, named by a checked link).
    over: Option<(PathBuf, usize)>,
    pub taken: Vec<snapshot::SnapshotInfo>,
}

/// A chain of snapshots is at most this many layers deep: the next one
/// past it is full, which bounds the chain a restore maps (the others store
/// only the pages dirtied since the previous one).
const FULL_SNAPSHOT_EVERY: usize = 32;

impl Snapshotter {
    /// Snapshots of a run whose first is full (`parent`: the lineage it
    /// names, if any).
    pub fn new(plan: &SnapshotPlan, parent: Option<String>) -> Result<Snapshotter> {
        plan.validate()?;
        let root = &plan.dir;
        create_dir(root)?;
        let every = plan.every;
        let mut at_exits = plan.at_exits.clone();
        at_exits.sort_unstable();
        at_exits.dedup();
        Ok(Snapshotter {
            root: root.clone(),
            every,
            at_exits,
            last_id: parent,
            over: None,
            taken: Vec::new(),
        })
    }

    /// Snapshots of a branch whose first is incremental over `restored`,
    /// the snapshot the run was restored from: the run's dirty log must
    /// count from the restore on ([`restore_tracking_writes`]), so that it
    /// knows every page written since (the replay to the moment, the
    /// re-key, the branch).
    pub fn over_restored(
        plan: &SnapshotPlan,
        restored: &snapshot::SnapshotInfo,
    ) -> Result<Snapshotter> {
        let mut snapshotter = Snapshotter::new(plan, Some(restored.meta.id.clone()))?;
        let layers = snapshot::memory_chain(&restored.dir)?.len();
        snapshotter.over = Some((restored.dir.clone(), layers));
        Ok(snapshotter)
    }

    /// How many snapshots were written, and where.
    pub fn report(&self) -> String {
        format!(
            "detvisor: {} snapshot(s) written to {}",
            self.taken.len(),
            self.root.display()
        )
    }

    /// Runs to the end, stopping at each snapshot point to write one.
    pub fn run(&mut self, driven: &mut Driven) -> Result<StopReason> {
        loop {
            let exits = driven.session.exits();
            let next_exit = self.at_exits.iter().copied().find(|&e| e > exits);
            let next_time = self.every.map(|every| {
                let now = driven.session.now().0;
                VirtNanos((now / every.0 + 1) * every.0)
            });
            if let Some(stop) = driven.run_until(Until::first_of(next_exit, next_time))? {
                return Ok(stop);
            }
            self.take(driven)?;
        }
    }

    /// Writes one snapshot: incremental over the previous one (or, first
    /// in a branch, over the snapshot it was restored from) with the pages
    /// KVM's dirty log and the VMM's bitmap saw written since, else full
    /// (the first of a run, and when the chain would pass
    /// `FULL_SNAPSHOT_EVERY` layers).
    fn take(&mut self, driven: &mut Driven) -> Result<()> {
        let id = snapshot_id(driven);
        let (info, layers) = match self.over.take() {
            Some((parent_dir, layers)) if layers < FULL_SNAPSHOT_EVERY => {
                let dirty = driven
                    .session
                    .take_dirty_pages()
                    .map_err(SnapshotsError::DirtyLog)?;
                let (meta, state) = snapshot_meta(driven, None)?;
                let info = snapshot::write_incremental_snapshot_over(
                    &self.root,
                    &meta,
                    &state,
                    driven.session.memory(),
                    &dirty,
                    &parent_dir,
                )
                .map_err(|source| SnapshotsError::Write {
                    id: id.clone(),
                    source,
                })?;
                (info, layers + 1)
            }
            _ => {
                // Dirty pages are counted from this full snapshot on.
                driven
                    .session
                    .start_dirty_log()
                    .map_err(SnapshotsError::StartDirtyLog)?;
                let info = write_full_snapshot(&self.root, driven, self.last_id.clone())?;
                (info, 1)
            }
        };
        self.over = Some((info.dir.clone(), layers));
        self.last_id = Some(id);
        self.taken.push(info);
        Ok(())
    }
}

/// A snapshot's id: the exit it was taken at.
fn snapshot_id(driven: &Driven) -> String {
    format!("exit-{:012}", driven.session.exits())
}

/// The state to save now and the metadata describing it.
fn snapshot_meta(
    driven: &mut Driven,
    parent: Option<String>,
) -> Result<(SnapshotMeta, SavedState)> {
    let state = driven.capture()?;
    let session = &driven.session;
    let mut meta = SnapshotMeta::new(
        snapshot_id(driven),
        session.now(),
        session.exits(),
        state.session.ram_bytes,
        state.session.seed,
    );
    meta.parent = parent;
    meta.clock = state.session.machine.clock.kind;
    Ok((meta, state))
}

/// Writes a full snapshot of `driven` now into `root` (its id is the exit
/// index). The dirty log is left alone, so a live checkpoint stays usable.
pub fn write_full_snapshot(
    root: &Path,
    driven: &mut Driven,
    parent: Option<String>,
) -> Result<snapshot::SnapshotInfo> {
    let (meta, state) = snapshot_meta(driven, parent)?;
    create_dir(root)?;
    snapshot::write_snapshot(root, &meta, &state, driven.session.memory()).map_err(|source| {
        SnapshotsError::Write {
            id: meta.id.clone(),
            source,
        }
    })
}

/// The snapshot `moment` is restored from and what to replay forward to
/// ([`Moment::resolve`]): done before anything starts too, so that a
/// moment naming no snapshot is one error, not one per worker or one after
/// a helper VM has booted.
pub fn resolve(moment: &Moment) -> Result<snapshot::Resolved> {
    moment.resolve().map_err(|source| SnapshotsError::Resolve {
        moment: Box::new(moment.clone()),
        source,
    })
}

/// The directories of snapshots a restore of `moment` reads: its own, and
/// those of the parents its chain links to in other directories (a
/// branch's snapshots over the moment it was restored from), each once,
/// as real paths. A place that sees only some directories (the helper VM)
/// must see all of them.
pub fn chain_roots(moment: &Moment) -> Result<Vec<PathBuf>> {
    let resolved = resolve(moment)?;
    let mut roots: Vec<PathBuf> = Vec::new();
    for layer in snapshot::memory_chain(&resolved.snapshot.dir)? {
        let dir = layer.dir.canonicalize().map_err(|source| {
            SnapshotsError::Snapshot(SnapshotError::Io {
                path: layer.dir.clone(),
                op: "canonicalize",
                source,
            })
        })?;
        let root = dir.parent().map_or(dir.clone(), Path::to_path_buf);
        if !roots.contains(&root) {
            roots.push(root);
        }
    }
    Ok(roots)
}

/// Whether the snapshot `moment` is restored from is of an `up` run.
pub fn is_up(moment: &Moment) -> Result<bool> {
    let resolved = resolve(moment)?;
    let (_, saved): (SnapshotMeta, SavedState) = snapshot::read_snapshot(&resolved.snapshot.dir)?;
    Ok(saved.up.is_some())
}

/// The snapshots in `root`, oldest first (`detvisor snapshot ls`).
pub fn list(root: &Path) -> Result<Vec<SnapshotRow>> {
    let infos = snapshot::list(root).map_err(|source| SnapshotsError::List {
        dir: root.to_owned(),
        source,
    })?;
    Ok(infos.iter().map(SnapshotRow::from).collect())
}

/// One snapshot as listings show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRow {
    pub id: String,
    pub parent: Option<String>,
    /// Where the parent is when it is in another directory (a branch's
    /// first snapshot, over the moment the branch started from): its path
    /// relative to this snapshot's directory of snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_path: Option<String>,
    pub virtual_ns: VirtNanos,
    pub exit_index: u64,
    pub ram_bytes: u64,
    pub seed: u64,
    pub incremental: bool,
    pub state_bytes: u64,
    pub memory_pages_stored: u64,
    pub disk_bytes: u64,
    pub dir: PathBuf,
}

impl From<&snapshot::SnapshotInfo> for SnapshotRow {
    fn from(info: &snapshot::SnapshotInfo) -> Self {
        SnapshotRow {
            id: info.meta.id.clone(),
            parent: info.meta.parent.clone(),
            parent_path: info.meta.parent_link.as_ref().map(|link| link.path.clone()),
            virtual_ns: info.meta.virtual_ns,
            exit_index: info.meta.exit_index,
            ram_bytes: info.meta.ram_bytes,
            seed: info.meta.seed,
            incremental: info.incremental,
            state_bytes: info.state_bytes,
            memory_pages_stored: info.memory_pages_stored,
            disk_bytes: info.disk_bytes,
            dir: info.dir.clone(),
        }
    }
}

/// One snapshot in detail (`detvisor snapshot info`): its metadata and a
/// summary of the saved state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SnapshotDetails {
    /// `run` or `up` (a multi-node run driven by the agent).
    pub kind: String,
    /// The nodes of an `up` run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    #[serde(flatten)]
    pub row: SnapshotRow,
    pub rip: u64,
    pub rsp: u64,
    pub console_bytes: u64,
    pub injected_interrupts: u64,
    pub cpu_model_version: u32,
    /// Frames the switch holds, not yet delivered (none without a network).
    pub frames_in_flight: usize,
}

/// The snapshot in `dir` (DIR/ID) in detail.
pub fn info(dir: &Path) -> Result<SnapshotDetails> {
    let info = snapshot::info(dir).map_err(|source| SnapshotsError::Info {
        dir: dir.to_owned(),
        source,
    })?;
    let (_, saved): (SnapshotMeta, SavedState) = snapshot::read_snapshot(dir)?;
    let state = &saved.session;
    Ok(SnapshotDetails {
        kind: if saved.up.is_some() { "up" } else { "run" }.into(),
        nodes: saved
            .up
            .as_ref()
            .map(|up| up.node_names.clone())
            .unwrap_or_default(),
        row: SnapshotRow::from(&info),
        rip: state.vcpu.regs.rip,
        rsp: state.vcpu.regs.rsp,
        console_bytes: state.console_bytes,
        injected_interrupts: state.injected_interrupts,
        cpu_model_version: state.cpu_model_version,
        frames_in_flight: state
            .devices
            .switch
            .as_ref()
            .map_or(0, |switch| switch.in_flight.len()),
    })
}

/// A session restored from a saved moment and replayed to the exact target.
pub struct Restored {
    pub driven: Driven,
    pub snapshot: snapshot::SnapshotInfo,
    pub target: Target,
    /// Set when the guest stopped before the target was reached.
    pub stopped_early: Option<vmm::exit::StopReason>,
}

/// Where a restored `up` run's node output and events go (unused for `run`
/// snapshots, whose guest console is the `console` of [`restore`]).
pub struct NodeOutput {
    pub out: Box<dyn std::io::Write>,
    /// Where event lines (node started, faults, ...) go, if anywhere.
    pub events: Option<Box<dyn std::io::Write>>,
}

impl NodeOutput {
    pub fn discard() -> Self {
        NodeOutput {
            out: Box::new(std::io::sink()),
            events: None,
        }
    }
}

/// Restores `moment`: the snapshot it names, replayed exactly to its
/// target.
pub fn restore(
    moment: &Moment,
    resume: &ResumeConfig,
    console: Box<dyn std::io::Write + Send>,
    input: Option<vmm::vm::ConsoleInput>,
    node_output: NodeOutput,
) -> Result<Restored> {
    restore_impl(moment, resume, console, input, node_output, false)
}

/// [`restore`], with the dirty log counting from the restore on, before
/// the replay to the moment: the run's next incremental snapshot can be
/// written over the snapshot it was restored from
/// ([`Snapshotter::over_restored`]).
pub fn restore_tracking_writes(
    moment: &Moment,
    resume: &ResumeConfig,
    console: Box<dyn std::io::Write + Send>,
    input: Option<vmm::vm::ConsoleInput>,
    node_output: NodeOutput,
) -> Result<Restored> {
    restore_impl(moment, resume, console, input, node_output, true)
}

fn restore_impl(
    moment: &Moment,
    resume: &ResumeConfig,
    console: Box<dyn std::io::Write + Send>,
    input: Option<vmm::vm::ConsoleInput>,
    node_output: NodeOutput,
    track_writes: bool,
) -> Result<Restored> {
    let resolved = resolve(moment)?;
    let dir = &resolved.snapshot.dir;
    let (_, saved): (SnapshotMeta, SavedState) = snapshot::read_snapshot(dir)?;
    // The pages the snapshot stores, from its checksummed index (SEEK_DATA
    // is not available on every file system, e.g. 9p).
    let data_ranges: Vec<(u64, u64)> = snapshot::memory_chain(dir)?
        .iter()
        .flat_map(|layer| layer.runs.iter().map(|run| run.byte_range()))
        .collect();
    let memory = match snapshot::memory_file(dir) {
        Ok((file, len)) => vmm::vm::memory_from_file(file, len)?,
        // An incremental snapshot: its base image with each layer's pages
        // mapped over it, all private and lazy.
        Err(snapshot::SnapshotError::Incremental { .. }) => {
            let (ptr, len) = snapshot::map_memory_private(dir)?.into_raw();
            // SAFETY: `into_raw` handed the mapping over; it is never unmapped
            // and nothing else refers to it.
            unsafe { vmm::vm::memory_from_mapping(ptr, len as u64)? }
        }
        Err(e) => return Err(e.into()),
    };
    let mut session = Session::resume(resume, &saved.session, memory, data_ranges, console, input)?;
    if track_writes {
        // Nothing has written guest RAM yet: it is the snapshot's, and
        // every page written from here on is in the log.
        session
            .start_dirty_log()
            .map_err(SnapshotsError::StartDirtyLog)?;
    }
    let up = match saved.up {
        Some(state) => {
            let output = UpOutput::plain(&state.node_names, node_output.out, node_output.events)?;
            Some(UpDriver::from_state(state, output))
        }
        None => None,
    };
    let mut driven = Driven { session, up };
    let mut stopped_early = match resolved.target {
        Target::ExitIndex(n) => driven.run_until(Until::Exit(n))?,
        Target::VirtualTime(t) => driven.run_until(Until::Time(t))?,
        Target::Snapshot | Target::Latest => None,
    };
    let steps = moment.insn_steps();
    if steps > 0 && stopped_early.is_none() {
        let from = driven.session.insn_position();
        let stepped = driven.session.step_insns(steps, true)?;
        if stepped.exits > 0 && stepped.stop.is_none() {
            return Err(SnapshotsError::PastInterval {
                moment: Box::new(moment.clone()),
                exit: from.exit,
                steps: stepped.stepped,
            });
        }
        stopped_early = stepped.stop;
    }
    Ok(Restored {
        driven,
        snapshot: resolved.snapshot,
        target: resolved.target,
        stopped_early,
    })
}

/// What `seek` reports about a moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeekReport {
    pub snapshot: String,
    pub target: String,
    pub exit_index: u64,
    /// Single steps after that exit (`exit:N+insn:K`'s K).
    #[serde(default)]
    pub insn_steps: u64,
    pub virtual_ns: VirtNanos,
    pub rip: u64,
    pub rsp: u64,
    pub rflags: u64,
    pub cr3: u64,
    pub console_bytes: u64,
    pub injected_interrupts: u64,
    pub devices_state_bytes: usize,
    pub stopped_early: Option<vmm::exit::StopReason>,
    /// The general registers, RIP, RFLAGS and CR3.
    #[serde(default)]
    pub regs: Option<crate::inspect::Registers>,
    /// The privilege level the guest's code runs at (CS's low bits).
    #[serde(default)]
    pub cpl: u8,
    /// The guest's whole RAM hashed (see `Session::memory_digest`).
    #[serde(default)]
    pub memory_hash: Option<String>,
}

impl SeekReport {
    /// One line for people.
    pub fn human(&self) -> String {
        format!(
            "{} (from snapshot {}): {}, virtual {}, rip={:#x} rsp={:#x} rflags={:#x} cr3={:#x}",
            self.target,
            self.snapshot,
            vmm::position::InsnPosition {
                exit: self.exit_index,
                steps: self.insn_steps
            },
            self.virtual_ns,
            self.rip,
            self.rsp,
            self.rflags,
            self.cr3
        )
    }
}

/// Replays to `moment` and reports the machine there.
pub fn seek(moment: &Moment) -> Result<SeekReport> {
    let mut restored = restore(
        moment,
        &ResumeConfig::default(),
        Box::new(std::io::sink()),
        None,
        NodeOutput::discard(),
    )?;
    let session = &mut restored.driven.session;
    let state = session.capture()?;
    let position = session.insn_position();
    let target = match moment.insn_steps() {
        0 => restored.target.to_string(),
        steps => format!("{} and {steps} single step(s)", restored.target),
    };
    Ok(SeekReport {
        snapshot: restored.snapshot.meta.id.clone(),
        target,
        exit_index: position.exit,
        insn_steps: position.steps,
        regs: Some(crate::inspect::Registers::of(&state.vcpu)),
        cpl: (state.vcpu.sregs.cs.selector & 3) as u8,
        memory_hash: Some(session.memory_digest_hex()),
        virtual_ns: session.now(),
        rip: state.vcpu.regs.rip,
        rsp: state.vcpu.regs.rsp,
        rflags: state.vcpu.regs.rflags,
        cr3: state.vcpu.sregs.cr3,
        console_bytes: state.console_bytes,
        injected_interrupts: state.injected_interrupts,
        devices_state_bytes: serde_json::to_vec(&state.devices)?.len(),
        stopped_early: restored.stopped_early,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none");
        let e = list(&missing).unwrap_err();
        let SnapshotsError::List { source, .. } = &e else {
            panic!("{e:?}");
        };
        let cause = crate::chain(source);
        let text = format!("{:#}", anyhow::Error::from(e));
        assert_eq!(
            text,
            format!("listing snapshots in {}: {cause}", missing.display())
        );
        for (every, shown) in [(VirtNanos::ZERO, "0s"), (VirtNanos(999_999), "999.999us")] {
            let plan = SnapshotPlan {
                dir: dir.path().into(),
                every: Some(every),
                at_exits: Vec::new(),
            };
            let e = Snapshotter::new(&plan, None).err().unwrap();
            assert_eq!(
                format!("{:#}", anyhow::Error::from(e)),
                format!("the snapshot interval {shown} is shorter than the least, 1ms")
            );
        }
        let plan = SnapshotPlan {
            dir: dir.path().into(),
            every: Some(MIN_SNAPSHOT_INTERVAL),
            at_exits: Vec::new(),
        };
        plan.validate().expect("1ms is allowed");
    }
}
