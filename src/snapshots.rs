//! Snapshots from the command line: taking them during `run`, listing them,
//! and resuming (`branch`) or inspecting (`seek`) a moment of a saved history.

use crate::up::{self, UpDriver, UpOutput, UpState};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;
use serde::Serialize;
use snapshot::{SnapshotMeta, Target};
use std::path::{Path, PathBuf};
use vmm::exit::StopReason;
use vmm::vm::{Checkpoint, ResumeConfig, RunOutcome, Session, SessionState};
use vmm::VirtNanos;

/// What a snapshot's `state.bin` holds: the machine's state and, for an `up`
/// run, the host side of its agent conversation (`None` for `run`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedState {
    pub session: SessionState,
    pub up: Option<UpState>,
}

impl SavedState {
    /// The state of a plain `run` (no host-side driver).
    pub fn of_run(session: SessionState) -> Self {
        SavedState { session, up: None }
    }
}

/// A session with whatever runs it between exits: nothing for `run`, the
/// agent conversation for `up`. Everything that continues a saved history
/// (`branch`, `seek`, snapshots) steps it this way, so a resumed run takes
/// exactly the steps the original took.
pub struct Driven {
    pub session: Session,
    pub up: Option<UpDriver>,
}

/// A [`Driven`] moment in host memory, to return to in place.
pub struct DrivenCheckpoint {
    session: Checkpoint,
    up: Option<UpState>,
}

impl Driven {
    pub fn plain(session: Session) -> Self {
        Driven { session, up: None }
    }

    /// One exit (`Some` when the guest stopped there).
    pub fn step(&mut self) -> Result<Option<StopReason>> {
        match &mut self.up {
            Some(up) => up.step(&mut self.session),
            None => Ok(self.session.step_one()?),
        }
    }

    /// As [`Session::run_until`]: to an exit index or a virtual time, or
    /// until the guest stops.
    pub fn run_until(
        &mut self,
        exit_limit: Option<u64>,
        time_limit: Option<VirtNanos>,
    ) -> Result<Option<StopReason>> {
        loop {
            if exit_limit.is_some_and(|limit| self.session.exits() >= limit)
                || time_limit.is_some_and(|limit| self.session.now() >= limit)
            {
                return Ok(None);
            }
            if let Some(stop) = self.step()? {
                return Ok(Some(stop));
            }
        }
    }

    pub fn run_to_end(&mut self) -> Result<StopReason> {
        loop {
            if let Some(stop) = self.step()? {
                return Ok(stop);
            }
        }
    }

    /// The state to save between two exits.
    pub fn capture(&mut self) -> Result<SavedState> {
        Ok(SavedState {
            session: self.session.capture().context("capturing the VM state")?,
            up: self.up.as_ref().map(UpDriver::save),
        })
    }

    pub fn checkpoint(&mut self) -> Result<DrivenCheckpoint> {
        Ok(DrivenCheckpoint {
            session: self.session.checkpoint()?,
            up: self.up.as_ref().map(UpDriver::save),
        })
    }

    /// Back to `checkpoint`, in place (see [`Session::reset_to`]).
    pub fn reset_to(&mut self, checkpoint: &mut DrivenCheckpoint) -> Result<()> {
        self.session.reset_to(&mut checkpoint.session)?;
        if let (Some(up), Some(state)) = (&mut self.up, &checkpoint.up) {
            up.reset(state);
        }
        Ok(())
    }

    /// The run's exit status once it stopped with `stop`: the guest's, or
    /// under `up` the workload's (`None`: the guest reported none).
    pub fn exit_status(&self, stop: StopReason) -> Option<u8> {
        match &self.up {
            Some(up) => Some(up::run_status(up.conductor(), stop)),
            None => match stop {
                StopReason::GuestExit { status } => Some(status),
                _ => None,
            },
        }
    }

    /// The outcome so far (the session stays usable, e.g. for a reset).
    pub fn outcome(&mut self, stop: StopReason) -> Result<RunOutcome> {
        if let Some(up) = &mut self.up {
            up.flush()?;
        }
        Ok(self.session.outcome(stop))
    }
}

/// When `run` takes snapshots.
#[derive(Args, Debug, Clone, Default)]
pub struct SnapshotArgs {
    /// Directory to write snapshots into (created if missing).
    #[arg(long)]
    pub snapshots: Option<PathBuf>,
    /// Take a snapshot every this much virtual time (e.g. 500ms).
    #[arg(long, requires = "snapshots")]
    pub snapshot_every: Option<String>,
    /// Take a snapshot once this many exits have been handled (repeatable).
    #[arg(long, requires = "snapshots")]
    pub snapshot_at_exit: Vec<u64>,
}

impl SnapshotArgs {
    /// For a run inside the helper VM: these options with the directory
    /// created and made absolute, and that directory, which the helper shares
    /// at the same path (so the snapshots outlive it). `None` without
    /// `--snapshots`.
    pub fn forwarded(&self) -> Result<Option<(Vec<String>, PathBuf)>> {
        let Some(dir) = &self.snapshots else {
            return Ok(None);
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("snapshot directory {}", dir.display()))?;
        let mut args = vec!["--snapshots".to_string(), dir.display().to_string()];
        if let Some(every) = &self.snapshot_every {
            args.extend(["--snapshot-every".into(), every.clone()]);
        }
        for exit in &self.snapshot_at_exit {
            args.extend(["--snapshot-at-exit".into(), exit.to_string()]);
        }
        Ok(Some((args, dir)))
    }
}

/// Takes snapshots at the requested points while running a session to its end.
pub struct Snapshotter {
    root: PathBuf,
    every: Option<VirtNanos>,
    at_exits: Vec<u64>,
    last_id: Option<String>,
    /// Snapshots written since the last full one (0: the next is full).
    chain_len: usize,
    pub taken: Vec<snapshot::SnapshotInfo>,
}

/// Every this many snapshots one is full, which bounds the chain a restore
/// maps (the others store only the pages dirtied since the previous one).
const FULL_SNAPSHOT_EVERY: usize = 32;

impl Snapshotter {
    pub fn new(args: &SnapshotArgs, parent: Option<String>) -> Result<Option<Snapshotter>> {
        let Some(root) = &args.snapshots else {
            return Ok(None);
        };
        std::fs::create_dir_all(root)
            .with_context(|| format!("creating snapshot directory {}", root.display()))?;
        let every = args
            .snapshot_every
            .as_deref()
            .map(crate::units::parse_duration)
            .transpose()
            .context("--snapshot-every")?;
        if every == Some(VirtNanos::ZERO) {
            bail!("--snapshot-every must be longer than zero");
        }
        let mut at_exits = args.snapshot_at_exit.clone();
        at_exits.sort_unstable();
        at_exits.dedup();
        Ok(Some(Snapshotter {
            root: root.clone(),
            every,
            at_exits,
            last_id: parent,
            chain_len: 0,
            taken: Vec::new(),
        }))
    }

    /// Says how many snapshots were written, and where.
    pub fn report(&self) {
        eprintln!(
            "detvisor: {} snapshot(s) written to {}",
            self.taken.len(),
            self.root.display()
        );
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
            if let Some(stop) = driven.run_until(next_exit, next_time)? {
                return Ok(stop);
            }
            self.take(driven)?;
        }
    }

    /// Writes one snapshot: full the first time (and every
    /// `FULL_SNAPSHOT_EVERY`), else incremental over the previous one, with
    /// the pages KVM's dirty log and the VMM's bitmap saw written since.
    fn take(&mut self, driven: &mut Driven) -> Result<()> {
        let state = driven.capture()?;
        let session = &mut driven.session;
        let id = format!("exit-{:012}", session.exits());
        let mut meta = SnapshotMeta::new(
            id.clone(),
            session.now().0,
            session.exits(),
            state.session.ram_bytes,
            state.session.seed,
        );
        meta.parent = self.last_id.clone();
        let info = if self.chain_len == 0 {
            // Dirty pages are counted from this full snapshot on.
            session
                .start_dirty_log()
                .context("starting the dirty log")?;
            snapshot::write_snapshot(&self.root, &meta, &state, session.memory())
        } else {
            let dirty = session
                .take_dirty_pages()
                .context("reading the dirty log")?;
            snapshot::write_incremental_snapshot(
                &self.root,
                &meta,
                &state,
                session.memory(),
                &dirty,
            )
        }
        .with_context(|| format!("writing snapshot {id}"))?;
        self.chain_len = (self.chain_len + 1) % FULL_SNAPSHOT_EVERY;
        self.last_id = Some(id);
        self.taken.push(info);
        Ok(())
    }
}

/// Whether the snapshot `spec` names is of an `up` run.
pub fn is_up(spec: &str) -> Result<bool> {
    let resolved = snapshot::resolve(spec).with_context(|| format!("resolving {spec:?}"))?;
    let (_, saved): (SnapshotMeta, SavedState) = snapshot::read_snapshot(&resolved.snapshot.dir)?;
    Ok(saved.up.is_some())
}

/// `detvisor snapshot ls DIR`.
pub fn list(root: &Path, json: bool) -> Result<u8> {
    let infos =
        snapshot::list(root).with_context(|| format!("listing snapshots in {}", root.display()))?;
    if json {
        let rows: Vec<SnapshotRow> = infos.iter().map(SnapshotRow::from).collect();
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(0);
    }
    println!(
        "{:<20} {:<20} {:>16} {:>12} {:>10} {:>8}",
        "ID", "PARENT", "VIRTUAL TIME", "EXIT", "DISK", "PAGES"
    );
    for info in &infos {
        println!(
            "{:<20} {:<20} {:>16} {:>12} {:>9}K {:>8}",
            info.meta.id,
            info.meta.parent.as_deref().unwrap_or("-"),
            VirtNanos(info.meta.virtual_ns).to_string(),
            info.meta.exit_index,
            info.disk_bytes / 1024,
            info.memory_pages_stored
        );
    }
    Ok(0)
}

#[derive(Serialize)]
struct SnapshotRow {
    id: String,
    parent: Option<String>,
    virtual_ns: u64,
    exit_index: u64,
    ram_bytes: u64,
    seed: u64,
    incremental: bool,
    state_bytes: u64,
    memory_pages_stored: u64,
    disk_bytes: u64,
    dir: PathBuf,
}

impl From<&snapshot::SnapshotInfo> for SnapshotRow {
    fn from(info: &snapshot::SnapshotInfo) -> Self {
        SnapshotRow {
            id: info.meta.id.clone(),
            parent: info.meta.parent.clone(),
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

/// `detvisor snapshot info DIR/ID`: metadata plus a summary of the saved state.
pub fn info(dir: &Path) -> Result<u8> {
    let info = snapshot::info(dir).with_context(|| format!("reading {}", dir.display()))?;
    let (_, saved): (SnapshotMeta, SavedState) = snapshot::read_snapshot(dir)?;
    let state = &saved.session;
    #[derive(Serialize)]
    struct Info {
        /// `run` or `up` (a multi-node run driven by the agent).
        kind: &'static str,
        /// The nodes of an `up` run.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        nodes: Vec<String>,
        #[serde(flatten)]
        row: SnapshotRow,
        rip: u64,
        rsp: u64,
        console_bytes: u64,
        injected_interrupts: u64,
        cpu_model_version: u32,
        /// Frames the switch holds, not yet delivered (none without a network).
        frames_in_flight: usize,
    }
    let out = Info {
        kind: if saved.up.is_some() { "up" } else { "run" },
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
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(0)
}

/// A session restored from a snapshot spec and replayed to the exact target.
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
    /// Print events (node started, faults, ...) to stderr.
    pub events: bool,
}

impl NodeOutput {
    pub fn discard() -> Self {
        NodeOutput {
            out: Box::new(std::io::sink()),
            events: false,
        }
    }
}

pub fn restore(
    spec: &str,
    resume: &ResumeConfig,
    console: Box<dyn std::io::Write + Send>,
    input: Option<vmm::vm::ConsoleInput>,
    node_output: NodeOutput,
) -> Result<Restored> {
    let resolved = snapshot::resolve(spec).with_context(|| format!("resolving {spec:?}"))?;
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
    let session = Session::resume(resume, &saved.session, memory, data_ranges, console, input)?;
    let up = match saved.up {
        Some(state) => {
            let output = UpOutput::plain(&state.node_names, node_output.out, node_output.events)?;
            Some(UpDriver::restore(state, output))
        }
        None => None,
    };
    let mut driven = Driven { session, up };
    let stopped_early = match resolved.target {
        Target::ExitIndex(n) => driven.run_until(Some(n), None)?,
        Target::VirtualTime(t) => driven.run_until(None, Some(VirtNanos(t)))?,
        Target::Snapshot | Target::Latest => None,
    };
    Ok(Restored {
        driven,
        snapshot: resolved.snapshot,
        target: resolved.target,
        stopped_early,
    })
}

/// What `seek` reports about a moment.
#[derive(Serialize)]
pub struct SeekReport {
    pub snapshot: String,
    pub target: String,
    pub exit_index: u64,
    pub virtual_ns: u64,
    pub rip: u64,
    pub rsp: u64,
    pub rflags: u64,
    pub cr3: u64,
    pub console_bytes: u64,
    pub injected_interrupts: u64,
    pub devices_state_bytes: usize,
    pub stopped_early: Option<vmm::exit::StopReason>,
}

pub fn seek(spec: &str, json: bool) -> Result<u8> {
    let mut restored = restore(
        spec,
        &ResumeConfig::default(),
        Box::new(std::io::sink()),
        None,
        NodeOutput::discard(),
    )?;
    let session = &mut restored.driven.session;
    let state = session.capture()?;
    let report = SeekReport {
        snapshot: restored.snapshot.meta.id.clone(),
        target: restored.target.to_string(),
        exit_index: session.exits(),
        virtual_ns: session.now().0,
        rip: state.vcpu.regs.rip,
        rsp: state.vcpu.regs.rsp,
        rflags: state.vcpu.regs.rflags,
        cr3: state.vcpu.sregs.cr3,
        console_bytes: state.console_bytes,
        injected_interrupts: state.injected_interrupts,
        devices_state_bytes: serde_json::to_vec(&state.devices)?.len(),
        stopped_early: restored.stopped_early,
    };
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} (from snapshot {}): exit {}, virtual {}, rip={:#x} rsp={:#x} rflags={:#x} cr3={:#x}",
            report.target,
            report.snapshot,
            report.exit_index,
            VirtNanos(report.virtual_ns),
            report.rip,
            report.rsp,
            report.rflags,
            report.cr3
        );
    }
    Ok(0)
}
