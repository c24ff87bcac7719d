//! Snapshots from the command line: taking them during `run`, listing them,
//! and resuming (`branch`) or inspecting (`seek`) a moment of a saved history.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use snapshot::{SnapshotMeta, Target};
use std::path::{Path, PathBuf};
use vmm::vm::{ResumeConfig, Session, SessionState};
use vmm::VirtNanos;

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

    /// Runs `session` to its end, stopping at each snapshot point to write one.
    pub fn run(&mut self, session: &mut Session) -> Result<vmm::exit::StopReason> {
        loop {
            let exits = session.exits();
            let next_exit = self.at_exits.iter().copied().find(|&e| e > exits);
            let next_time = self.every.map(|every| {
                let now = session.now().0;
                VirtNanos((now / every.0 + 1) * every.0)
            });
            if let Some(stop) = session.run_until(next_exit, next_time)? {
                return Ok(stop);
            }
            self.take(session)?;
        }
    }

    /// Writes one snapshot: full the first time (and every
    /// `FULL_SNAPSHOT_EVERY`), else incremental over the previous one, with
    /// the pages KVM's dirty log and the VMM's bitmap saw written since.
    fn take(&mut self, session: &mut Session) -> Result<()> {
        let state = session.capture().context("capturing the VM state")?;
        let id = format!("exit-{:012}", session.exits());
        let mut meta = SnapshotMeta::new(
            id.clone(),
            session.now().0,
            session.exits(),
            state.ram_bytes,
            state.seed,
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
    let (_, state): (SnapshotMeta, SessionState) = snapshot::read_snapshot(dir)?;
    #[derive(Serialize)]
    struct Info {
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
    pub session: Session,
    pub snapshot: snapshot::SnapshotInfo,
    pub target: Target,
    /// Set when the guest stopped before the target was reached.
    pub stopped_early: Option<vmm::exit::StopReason>,
}

pub fn restore(
    spec: &str,
    resume: &ResumeConfig,
    console: Box<dyn std::io::Write + Send>,
    input: Option<vmm::vm::ConsoleInput>,
) -> Result<Restored> {
    let resolved = snapshot::resolve(spec).with_context(|| format!("resolving {spec:?}"))?;
    let dir = &resolved.snapshot.dir;
    let (_, state): (SnapshotMeta, SessionState) = snapshot::read_snapshot(dir)?;
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
    let mut session = Session::resume(resume, &state, memory, data_ranges, console, input)?;
    let stopped_early = match resolved.target {
        Target::ExitIndex(n) => session.run_until(Some(n), None)?,
        Target::VirtualTime(t) => session.run_until(None, Some(VirtNanos(t)))?,
        Target::Snapshot | Target::Latest => None,
    };
    Ok(Restored {
        session,
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
    )?;
    let state = restored.session.capture()?;
    let report = SeekReport {
        snapshot: restored.snapshot.meta.id.clone(),
        target: restored.target.to_string(),
        exit_index: restored.session.exits(),
        virtual_ns: restored.session.now().0,
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
