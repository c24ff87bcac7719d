//! The run library's one typed request API: every verb of the CLI, and every
//! step a campaign engine or a server takes on a live run, is a [`Request`]
//! answered by a [`Response`] from a [`Controller`]. The same enum crosses
//! into the helper VM serialized, so no caller reaches a run any other way.

use crate::audit::{self, AuditOptions, AuditSummary};
use crate::branch::{self, BranchRequest};
use crate::driven::{Driven, DrivenCheckpoint};
use crate::faults::Fault;
use crate::inspect::{self, ExecOutcome, ExecRequest, InspectReport, ProcessRow};
use crate::moment::Moment;
use crate::outcome::RunSummary;
use crate::plain::{self, GuestSpec};
use crate::seeds::{self, SeedsReport, SeedsRequest};
use crate::shell::{self, ShellRequest};
use crate::snapshots::{self, NodeOutput, SeekReport, SnapshotDetails, SnapshotPlan, SnapshotRow};
use crate::soak::{self, SoakReport, SoakRequest, SoakTarget};
use crate::streams::Streams;
use crate::up::{self, PreparedUp, UpOptions, UpOutput, UpSummary};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use vmm::exit::StopReason;
use vmm::record::RecordConfig;
use vmm::stall::StallTimeout;
use vmm::vm::ResumeConfig;
use vmm::VirtNanos;

/// A live run held by a [`Controller`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunId(pub u64);

/// A moment of a live run kept in memory (see [`Request::Checkpoint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CheckpointId(pub u64);

/// How far [`Request::RunUntil`] runs: the VMM's one limit.
pub use vmm::vm::Until;

/// Everything the run library does, as one request.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "request")]
pub enum Request {
    /// Boot a plain run and run it to its end (`detvisor run`).
    Run {
        guest: GuestSpec,
        snapshots: Option<SnapshotPlan>,
        /// Capture every link's frames here (see [`crate::pcap`]).
        #[serde(default)]
        pcap: Option<PathBuf>,
        /// Write every exit here, a JSON line each (see [`crate::trace`]).
        #[serde(default)]
        trace: Option<PathBuf>,
    },
    /// Run a configuration several times and compare (`detvisor audit`).
    Audit {
        guest: GuestSpec,
        options: AuditOptions,
    },
    /// A determinism soak: runs until its directory holds the runs asked
    /// for, each compared with the stored reference (`detvisor soak`).
    Soak(SoakRequest),
    /// A multi-node run, assembled by [`up::prepare`] (`detvisor up`).
    Up {
        prepared: PreparedUp,
        options: UpOptions,
    },
    /// One alternate history from a saved moment (`detvisor branch`).
    Branch(BranchRequest),
    /// Many, one per seed (`detvisor branch --seeds`).
    BranchSeeds(SeedsRequest),
    /// The machine at an exact saved moment (`detvisor seek`).
    Seek { moment: Moment },
    /// A shell in a fork of a saved moment (`detvisor shell`).
    Shell(ShellRequest),
    /// The snapshots in a directory (`detvisor snapshot ls`).
    ListSnapshots { dir: PathBuf },
    /// One snapshot in detail (`detvisor snapshot info`).
    SnapshotInfo { dir: PathBuf },
    /// What this host's KVM offers (`detvisor check`).
    HostReport,
    /// Where a trace's exits went: by kind, by device, per virtual second
    /// (`detvisor trace`).
    TraceReport { path: PathBuf },

    /// Boot a plain run and hold it, stopped before its first exit.
    Boot { guest: GuestSpec },
    /// Boot an `up` run and hold it (node output to the stdout stream and
    /// events to stderr when `options.stream_output`; node logs into
    /// `options.logs` when given).
    BootUp {
        prepared: PreparedUp,
        options: UpOptions,
    },
    /// Restore a saved moment (replayed exactly to it) and hold it.
    Restore {
        moment: Moment,
        until: Option<VirtNanos>,
        #[serde(default)]
        stall_timeout: StallTimeout,
        /// The guest's console and the nodes' output go to the caller's
        /// streams (stdout, events to stderr); without it they are
        /// dropped, as a debugger's session wants: its records keep
        /// what it reads.
        #[serde(default)]
        stream_output: bool,
    },
    /// Run a held run on.
    RunUntil { run: RunId, until: Until },
    /// Keep the run's present moment in memory, to return to in place.
    /// A run keeps a tree of checkpoints, all alive until dropped: each new
    /// one is a child of the checkpoint the run was last reset to or taken
    /// at, and keeps only the pages written since (see docs/snapshots.md).
    Checkpoint { run: RunId },
    /// Return the run in place to any checkpoint of it: only the pages
    /// written since its last checkpoint or reset, and those that differ on
    /// the way through the two moments' common ancestor, are copied back.
    Reset {
        run: RunId,
        checkpoint: CheckpointId,
    },
    /// Let a checkpoint go (it can no longer be reset to): the pages only it
    /// needed are freed. Answers with the memory the run's checkpoints hold.
    DropCheckpoint {
        run: RunId,
        checkpoint: CheckpointId,
    },
    /// The host memory the run's checkpoints hold, and their budget.
    CheckpointMemory { run: RunId },
    /// The most bytes of pages the run's checkpoints may hold from now on
    /// (`None`: no limit): a checkpoint past it is refused, naming the
    /// figures, for the caller to drop older ones. Answers as
    /// `CheckpointMemory`.
    CheckpointBudget { run: RunId, bytes: Option<u64> },
    /// Write a full snapshot of the run's present into `dir`.
    Snapshot { run: RunId, dir: PathBuf },
    /// Writes the run's present moment as snapshot `id` in `dir`: full, or
    /// over `parent` (the previous one this run wrote there) with only the
    /// pages changed since (see [`crate::spill`]). Answers `Snapshot`.
    Spill {
        run: RunId,
        dir: PathBuf,
        id: String,
        parent: Option<String>,
    },
    /// Returns the run in place to the moment a `Spill` saved in `dir`: only
    /// the pages that differ are written, every live checkpoint stays valid.
    /// Answers `Loaded`.
    LoadInPlace { run: RunId, dir: PathBuf },
    /// Add a fault to an `up` run (at or after its present; `at=+2s`
    /// counts from it).
    InjectFault { run: RunId, fault: Fault },
    /// Re-key every seeded stream from here on: an alternate history.
    Rekey { run: RunId, seed: u64 },
    /// The run's outcome so far (the run stays held).
    Outcome { run: RunId },
    /// From now on keep what the guest of an `up` run reports (events, SDK
    /// records, history lines; see [`crate::records`]).
    CollectRecords { run: RunId },
    /// What the guest reported since the last `TakeRecords` (or since
    /// `CollectRecords`). A reset drops those not taken.
    TakeRecords { run: RunId },
    /// Run a command in a held `up` run, inside a node's namespaces or
    /// beside the nodes (see [`crate::inspect`] for the frozen and live
    /// modes). Answers `Exec`.
    Exec { run: RunId, exec: ExecRequest },
    /// The first `limit` bytes of a file as node `node` sees it (resolved
    /// inside its root; `None`: the guest's own file), every running node
    /// paused and the conductor held. Answers `File`.
    ReadFile {
        run: RunId,
        node: Option<String>,
        path: String,
        limit: u64,
    },
    /// The processes of node `node` (PIDs as its namespace sees them;
    /// `None`: every process of the guest), read from /proc, nodes paused
    /// and the conductor held. Answers `Processes`.
    Processes { run: RunId, node: Option<String> },
    /// The machine at the run's present: position, vCPU registers,
    /// devices, node states. Sends nothing to the guest. Answers `Inspect`.
    Inspect { run: RunId },
    /// An interactive shell in a held run as it stands (its terminal on
    /// the request's streams, input from its stdin up to Ctrl-D), `label`
    /// naming the moment for the user. The run is a fork from then on:
    /// every node is paused and the conductor held, so the caller resets it
    /// afterwards. Answers `Shell`.
    ShellIn {
        run: RunId,
        label: String,
        terminal: crate::shell::Terminal,
    },
    /// Single-step a held run `count` instructions as an observer (see
    /// `vmm::vm::insn_steps`); with `within_interval` the stepping ends at
    /// a guest exit met (handled). Answers `Stepped`.
    StepInsns {
        run: RunId,
        count: u64,
        within_interval: bool,
    },
    /// Single-step a held run within its interval until RIP is `address`
    /// (at most `max` steps). Answers `SteppedTo`.
    StepTo { run: RunId, address: u64, max: u64 },
    /// Run a held run on as `RunUntil` does, stopping at the first software
    /// breakpoint reached (kernel addresses; see `vmm::vm::breakpoints`).
    /// After a hit, the run's step within its interval is unknown until a
    /// `Reset`. Answers `Breakpoint`.
    RunToBreakpoint {
        run: RunId,
        breakpoints: Vec<u64>,
        /// Ranges whose change stops the run at the exit after it.
        #[serde(default)]
        watches: Vec<crate::driven::Watch>,
        until: Until,
    },
    /// Single-step a held run within its interval until a watched range
    /// changes (at most `max` steps). Answers `SteppedToChange`.
    StepToChange {
        run: RunId,
        watches: Vec<crate::driven::Watch>,
        max: u64,
    },
    /// The vCPU's registers at a held run's present. Answers `Registers`.
    Registers { run: RunId },
    /// Write guest virtual memory from `address` (through the guest's page
    /// tables, up to the first byte not mapped): a debugger's write, after
    /// which the run is a new history. Answers `Written`.
    WriteVirtual {
        run: RunId,
        address: u64,
        #[serde(with = "guest_agent::protocol::base64")]
        bytes: Vec<u8>,
    },
    /// Set the vCPU's general registers, RIP and RFLAGS (the segments in
    /// `registers` are not written): a debugger's write, after which the
    /// run is a new history. Answers `Registers`.
    SetRegisters {
        run: RunId,
        registers: crate::inspect::Registers,
    },
    /// The guest's whole RAM hashed (as `seek` reports it). Answers
    /// `MemoryDigest`.
    MemoryDigest { run: RunId },
    /// Up to `len` bytes of guest virtual memory from `address`, through
    /// the guest's page tables, up to the first byte not mapped. Answers
    /// `Memory`.
    ReadVirtual { run: RunId, address: u64, len: u64 },
    /// Let a held run go.
    Close { run: RunId },
    /// Whether runs started from now on in this process install the VMM's
    /// seccomp filter (on unless turned off; `--no-seccomp`, for
    /// debugging). A thread that runs under it already stays filtered: a
    /// filter cannot be taken off. See [`vmm::seccomp`]. Answers `Seccomp`.
    Seccomp { enabled: bool },
}

impl Request {
    /// The stall timeout of a request that runs a guest (host policy: the
    /// caller sets it for where the request runs).
    pub fn stall_timeout_mut(&mut self) -> Option<&mut StallTimeout> {
        match self {
            Request::Run { guest, .. } | Request::Audit { guest, .. } | Request::Boot { guest } => {
                Some(&mut guest.stall_timeout)
            }
            Request::Up { options, .. } | Request::BootUp { options, .. } => {
                Some(&mut options.stall_timeout)
            }
            Request::Soak(request) => Some(match &mut request.target {
                SoakTarget::Boot(guest) => &mut guest.stall_timeout,
                SoakTarget::Up { options, .. } => &mut options.stall_timeout,
            }),
            Request::Branch(request) => Some(&mut request.stall_timeout),
            Request::BranchSeeds(request) => Some(&mut request.stall_timeout),
            Request::Restore { stall_timeout, .. } => Some(stall_timeout),
            _ => None,
        }
    }
}

/// Where a held run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub exits: u64,
    pub virtual_ns: VirtNanos,
    /// Single steps since that exit (`exit:N+insn:K`'s K; not written
    /// when 0, so whole-exit positions read as they always did).
    #[serde(default, skip_serializing_if = "vmm::vm::is_zero")]
    pub insn_steps: u64,
    /// Set once the guest stopped (it runs no further).
    pub stop: Option<StopReason>,
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "response")]
pub enum Response {
    /// `Run`, `Branch`, `Outcome`.
    Summary(RunSummary),
    Audit(AuditSummary),
    Soak(SoakReport),
    Up(UpSummary),
    Seeds(SeedsReport),
    Seek(SeekReport),
    /// The shell's exit status.
    Shell {
        status: u8,
    },
    Snapshots {
        rows: Vec<SnapshotRow>,
    },
    SnapshotDetails(SnapshotDetails),
    HostReport(vmm::probe::HostReport),
    TraceReport(vmm::trace::report::TraceReport),
    /// `Boot`, `BootUp`, `Restore`.
    Started {
        run: RunId,
        position: Position,
    },
    /// `RunUntil`, `Reset`, `Rekey`, `InjectFault`.
    Position(Position),
    Checkpoint {
        checkpoint: CheckpointId,
        position: Position,
    },
    Snapshot(SnapshotRow),
    /// `DropCheckpoint`, `CheckpointMemory`, `CheckpointBudget`.
    CheckpointMemory(vmm::vm::CheckpointMemory),
    Loaded {
        position: Position,
        stats: vmm::vm::LoadStats,
    },
    /// `TakeRecords` (`CollectRecords` answers with `Position`).
    Records {
        records: Vec<crate::records::GuestRecord>,
    },
    Closed,
    Exec(ExecOutcome),
    File {
        /// Base64 in JSON.
        #[serde(with = "guest_agent::protocol::base64")]
        bytes: Vec<u8>,
        /// The file's whole size.
        size: u64,
        /// `bytes` is less than the whole file.
        truncated: bool,
        position: Position,
    },
    Processes {
        processes: Vec<ProcessRow>,
        position: Position,
    },
    Inspect(InspectReport),
    /// `StepInsns`.
    Stepped {
        position: Position,
        stepped: u64,
        exits: u64,
    },
    /// `StepToChange`: the range that changed, if one did.
    SteppedToChange {
        position: Position,
        changed: Option<u64>,
    },
    /// `StepTo`: whether RIP got to the address.
    SteppedTo {
        position: Position,
        reached: bool,
    },
    /// `RunToBreakpoint`.
    Breakpoint {
        position: Position,
        ran: crate::driven::BreakpointRun,
    },
    Registers(crate::inspect::Registers),
    /// `WriteVirtual`: how many bytes were written.
    Written {
        written: u64,
    },
    /// `MemoryDigest`: hex, as `SeekReport::memory_hash`.
    MemoryDigest {
        memory_hash: String,
    },
    /// `ReadVirtual`: the bytes read (fewer than asked where memory
    /// stops being mapped).
    Memory {
        #[serde(with = "guest_agent::protocol::base64")]
        bytes: Vec<u8>,
    },
    /// `Seccomp`: the setting now, and the filters on the thread that
    /// answered.
    Seccomp {
        enabled: bool,
        thread_filters: Option<u32>,
    },
}

/// A [`Response`], or the failure's whole chain of causes as text: what
/// crosses back from a detvisor serving requests inside the helper VM.
pub type Reply = Result<Response, String>;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("no run {0:?} is held (it was closed, or never started)")]
    UnknownRun(RunId),
    #[error("run {run:?} has no checkpoint {checkpoint:?}")]
    UnknownCheckpoint {
        run: RunId,
        checkpoint: CheckpointId,
    },
    /// A request failed after the seccomp filter refused a call (the call
    /// failed with EPERM, and that failure ended the request).
    #[error("{violation}")]
    SeccompViolation {
        violation: vmm::seccomp::Violation,
        #[source]
        source: Box<ApiError>,
    },
    #[error("run {0:?} has stopped; it runs no further (reset it to a checkpoint, or close it)")]
    Stopped(RunId),
    #[error("run {0:?} is a plain run: it has no nodes, so no fault can name one")]
    NoNodes(RunId),
    #[error(transparent)]
    Shell(#[from] crate::shell::ShellError),
    /// `Exec`, `ReadFile`, `Processes`, `Inspect`.
    #[error(transparent)]
    Inspect(#[from] crate::inspect::InspectError),
    /// Booting a held plain run.
    #[error(transparent)]
    Vm(#[from] vmm::vm::VmError),
    #[error(transparent)]
    Driven(#[from] crate::driven::DrivenError),
    #[error(transparent)]
    Drive(#[from] crate::up::DriveError),
    #[error(transparent)]
    Output(#[from] crate::up::OutputError),
    #[error(transparent)]
    Up(#[from] crate::up::UpError),
    #[error(transparent)]
    Plain(#[from] crate::plain::PlainError),
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    #[error(transparent)]
    Soak(#[from] crate::soak::SoakError),
    #[error(transparent)]
    Branch(#[from] crate::branch::BranchError),
    #[error(transparent)]
    Snapshots(#[from] crate::snapshots::SnapshotsError),
    #[error(transparent)]
    Spill(#[from] crate::spill::SpillError),
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
}

/// The most bytes one `ReadVirtual` answers with.
pub const MAX_READ_VIRTUAL: u64 = 1 << 20;

/// A run the controller holds.
struct Held {
    driven: Driven,
    checkpoints: BTreeMap<CheckpointId, DrivenCheckpoint>,
    stop: Option<StopReason>,
}

impl Held {
    fn position(&self) -> Position {
        crate::inspect::position(&self.driven, self.stop)
    }
}

/// Answers [`Request`]s, holding live runs between them.
#[derive(Default)]
pub struct Controller {
    runs: BTreeMap<RunId, Held>,
    next_id: u64,
}

impl Controller {
    pub fn new() -> Self {
        Controller::default()
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn held(&mut self, run: RunId) -> Result<&mut Held, ApiError> {
        self.runs.get_mut(&run).ok_or(ApiError::UnknownRun(run))
    }

    /// A held run that has not stopped (the guest's agent can still answer).
    fn running(&mut self, run: RunId) -> Result<&mut Held, ApiError> {
        let held = self.held(run)?;
        if held.stop.is_some() {
            return Err(ApiError::Stopped(run));
        }
        Ok(held)
    }

    fn hold(&mut self, driven: Driven, stop: Option<StopReason>) -> Response {
        let run = RunId(self.next_id());
        let held = Held {
            driven,
            checkpoints: BTreeMap::new(),
            stop,
        };
        let position = held.position();
        self.runs.insert(run, held);
        Response::Started { run, position }
    }

    /// Carries out one request, its output on `streams` (a held run keeps
    /// writing to the streams of the request that started it). A request
    /// that fails because the seccomp filter refused a call says which.
    pub fn handle(
        &mut self,
        request: Request,
        streams: &dyn Streams,
    ) -> Result<Response, ApiError> {
        self.answer(request, streams)
            .map_err(|source| match vmm::seccomp::take_violation() {
                Some(violation) => ApiError::SeccompViolation {
                    violation,
                    source: Box::new(source),
                },
                None => source,
            })
    }

    fn answer(&mut self, request: Request, streams: &dyn Streams) -> Result<Response, ApiError> {
        Ok(match request {
            Request::Seccomp { enabled } => {
                vmm::seccomp::set_enabled(enabled);
                Response::Seccomp {
                    enabled,
                    thread_filters: vmm::seccomp::thread_filters(),
                }
            }
            Request::Run {
                guest,
                snapshots,
                pcap,
                trace,
            } => {
                let input = if guest.command.is_empty() {
                    streams.stdin()
                } else {
                    None
                };
                let mut report = |line: &str| crate::streams::say(streams, line);
                Response::Summary(plain::run(
                    &guest,
                    snapshots.as_ref(),
                    pcap.as_deref(),
                    trace.as_deref(),
                    streams.stdout(),
                    input,
                    &mut report,
                )?)
            }
            Request::Audit { guest, options } => {
                let mut progress = |line: &str| crate::streams::say(streams, line);
                Response::Audit(audit::audit(&guest, &options, &mut progress)?)
            }
            Request::Soak(request) => {
                let mut progress = |line: &str| crate::streams::say(streams, line);
                Response::Soak(soak::soak(&request, &mut progress)?)
            }
            Request::Up { prepared, options } => {
                Response::Up(up::run(&prepared, &options, streams)?)
            }
            Request::Branch(request) => Response::Summary(branch::branch(&request, streams)?),
            Request::BranchSeeds(request) => {
                let mut progress = |done: seeds::SeedDone<'_>| {
                    if request.progress {
                        crate::streams::say(streams, &done.line());
                    }
                };
                Response::Seeds(seeds::branch_seeds(&request, &mut progress)?)
            }
            Request::Seek { moment } => Response::Seek(snapshots::seek(&moment)?),
            Request::Shell(request) => Response::Shell {
                status: shell::run(&request, streams)?,
            },
            Request::ListSnapshots { dir } => Response::Snapshots {
                rows: snapshots::list(&dir)?,
            },
            Request::SnapshotInfo { dir } => Response::SnapshotDetails(snapshots::info(&dir)?),
            Request::HostReport => Response::HostReport(vmm::probe::host_report_with_clocks()),
            Request::TraceReport { path } => Response::TraceReport(crate::trace::report(&path)?),

            Request::Boot { guest } => {
                let config = guest.vm_config(RecordConfig::default())?;
                let session = vmm::vm::Session::boot(&config, streams.stdout(), None)?;
                self.hold(Driven::plain(session), None)
            }
            Request::BootUp { prepared, options } => {
                let config = prepared.vm_config(&options)?;
                let out: Box<dyn std::io::Write> = if options.stream_output {
                    Box::new(streams.stdout())
                } else {
                    Box::new(std::io::sink())
                };
                // Events go with the output: a caller that wants neither (a
                // campaign) reads them as records instead.
                let events: Option<Box<dyn std::io::Write>> = options
                    .stream_output
                    .then(|| Box::new(streams.stderr()) as Box<dyn std::io::Write>);
                let mut output =
                    UpOutput::plain(&prepared.node_names, Box::new(std::io::sink()), events)?;
                output.sink =
                    crate::up::OutputSink::new(&prepared.node_names, options.logs.clone(), out)?;
                let driven = prepared.boot(&config, output)?;
                self.hold(driven, None)
            }
            Request::Restore {
                moment,
                until,
                stall_timeout,
                stream_output,
            } => {
                let resume = ResumeConfig {
                    until,
                    record: RecordConfig::default(),
                    stall_timeout,
                    clock: None,
                };
                let (console, node_output): (Box<dyn std::io::Write + Send>, _) = if stream_output {
                    let node_output = NodeOutput {
                        out: Box::new(streams.stdout()),
                        events: Some(Box::new(streams.stderr())),
                    };
                    (Box::new(streams.stdout()), node_output)
                } else {
                    (Box::new(std::io::sink()), NodeOutput::discard())
                };
                let restored = snapshots::restore(&moment, &resume, console, None, node_output)?;
                self.hold(restored.driven, restored.stopped_early)
            }
            Request::RunUntil { run, until } => {
                let held = self.held(run)?;
                if held.stop.is_some() {
                    return Err(ApiError::Stopped(run));
                }
                held.stop = held.driven.run_until(until)?;
                Response::Position(held.position())
            }
            Request::Checkpoint { run } => {
                let id = CheckpointId(self.next_id());
                let held = self.held(run)?;
                let checkpoint = held.driven.checkpoint()?;
                held.checkpoints.insert(id, checkpoint);
                Response::Checkpoint {
                    checkpoint: id,
                    position: held.position(),
                }
            }
            Request::Reset { run, checkpoint } => {
                let held = self.held(run)?;
                let saved = held
                    .checkpoints
                    .get_mut(&checkpoint)
                    .ok_or(ApiError::UnknownCheckpoint { run, checkpoint })?;
                held.driven.reset_to(saved)?;
                held.stop = None;
                Response::Position(held.position())
            }
            Request::DropCheckpoint { run, checkpoint } => {
                let held = self.held(run)?;
                let saved = held
                    .checkpoints
                    .remove(&checkpoint)
                    .ok_or(ApiError::UnknownCheckpoint { run, checkpoint })?;
                held.driven.release(saved)?;
                Response::CheckpointMemory(held.driven.session.checkpoint_memory())
            }
            Request::CheckpointMemory { run } => {
                let held = self.held(run)?;
                Response::CheckpointMemory(held.driven.session.checkpoint_memory())
            }
            Request::CheckpointBudget { run, bytes } => {
                let held = self.held(run)?;
                held.driven.session.set_checkpoint_budget(bytes);
                Response::CheckpointMemory(held.driven.session.checkpoint_memory())
            }
            Request::Snapshot { run, dir } => {
                let held = self.held(run)?;
                let info = snapshots::write_full_snapshot(&dir, &mut held.driven, None)?;
                Response::Snapshot(SnapshotRow::from(&info))
            }
            Request::Spill {
                run,
                dir,
                id,
                parent,
            } => {
                let held = self.held(run)?;
                let info = crate::spill::write(&dir, &id, &mut held.driven, parent.as_deref())?;
                Response::Snapshot(SnapshotRow::from(&info))
            }
            Request::LoadInPlace { run, dir } => {
                let held = self.held(run)?;
                let stats = crate::spill::load_in_place(&mut held.driven, &dir)?;
                held.stop = None;
                Response::Loaded {
                    position: held.position(),
                    stats,
                }
            }
            Request::InjectFault { run, fault } => {
                let held = self.held(run)?;
                if held.driven.up.is_none() {
                    return Err(ApiError::NoNodes(run));
                }
                held.driven.add_faults(std::slice::from_ref(&fault))?;
                Response::Position(held.position())
            }
            Request::Rekey { run, seed } => {
                let held = self.held(run)?;
                held.driven.rekey(seed)?;
                Response::Position(held.position())
            }
            Request::Outcome { run } => {
                let held = self.held(run)?;
                // A run still going is summed up as it stands.
                let stop = held.stop.unwrap_or(StopReason::TimeLimit);
                let seed = held.driven.session.seed();
                let exit_status = held.driven.exit_status(stop);
                let outcome = held.driven.outcome(stop)?;
                Response::Summary(RunSummary::new(seed, &outcome).with_exit_status(exit_status))
            }
            Request::CollectRecords { run } => {
                let held = self.held(run)?;
                let up = held.driven.up.as_mut().ok_or(ApiError::NoNodes(run))?;
                up.collect_records();
                Response::Position(held.position())
            }
            Request::TakeRecords { run } => {
                let held = self.held(run)?;
                let up = held.driven.up.as_mut().ok_or(ApiError::NoNodes(run))?;
                Response::Records {
                    records: up.take_records(),
                }
            }
            Request::Exec { run, exec } => {
                let held = self.running(run)?;
                let outcome = inspect::exec(&mut held.driven, &mut held.stop, run, &exec)?;
                Response::Exec(outcome)
            }
            Request::ReadFile {
                run,
                node,
                path,
                limit,
            } => {
                let held = self.running(run)?;
                let file = inspect::read_file(
                    &mut held.driven,
                    &mut held.stop,
                    run,
                    node.as_deref(),
                    &path,
                    limit,
                )?;
                Response::File {
                    bytes: file.bytes,
                    size: file.size,
                    truncated: file.truncated,
                    position: held.position(),
                }
            }
            Request::Processes { run, node } => {
                let held = self.running(run)?;
                let processes =
                    inspect::processes(&mut held.driven, &mut held.stop, run, node.as_deref())?;
                Response::Processes {
                    processes,
                    position: held.position(),
                }
            }
            Request::ShellIn {
                run,
                label,
                terminal,
            } => {
                let held = self.running(run)?;
                let status = crate::shell::shell_in(&mut held.driven, &label, &terminal, streams)?;
                Response::Shell { status }
            }
            Request::Inspect { run } => {
                let held = self.held(run)?;
                Response::Inspect(inspect::inspect(&mut held.driven, held.stop)?)
            }
            Request::StepInsns {
                run,
                count,
                within_interval,
            } => {
                let held = self.running(run)?;
                let done = held.driven.step_insns(count, within_interval)?;
                held.stop = done.stop;
                Response::Stepped {
                    position: held.position(),
                    stepped: done.stepped,
                    exits: done.exits,
                }
            }
            Request::StepTo { run, address, max } => {
                let held = self.running(run)?;
                let (done, reached) = held.driven.step_to_address(address, max)?;
                held.stop = done.stop;
                Response::SteppedTo {
                    position: held.position(),
                    reached,
                }
            }
            Request::StepToChange { run, watches, max } => {
                let held = self.running(run)?;
                let (done, changed) = held.driven.step_to_change(&watches, max)?;
                held.stop = done.stop;
                Response::SteppedToChange {
                    position: held.position(),
                    changed,
                }
            }
            Request::RunToBreakpoint {
                run,
                breakpoints,
                watches,
                until,
            } => {
                let held = self.running(run)?;
                let ran = held
                    .driven
                    .run_to_breakpoint(&breakpoints, &watches, until)?;
                if let crate::driven::BreakpointRun::Ended { stop } = ran {
                    held.stop = stop;
                }
                Response::Breakpoint {
                    position: held.position(),
                    ran,
                }
            }
            Request::Registers { run } => {
                let held = self.held(run)?;
                let (regs, sregs) = held
                    .driven
                    .session
                    .registers()
                    .map_err(crate::driven::DrivenError::from)?;
                Response::Registers(crate::inspect::Registers::from_kvm(&regs, &sregs))
            }
            Request::WriteVirtual {
                run,
                address,
                bytes,
            } => {
                let held = self.running(run)?;
                let written = held.driven.session.write_virtual(address, &bytes);
                Response::Written {
                    written: written as u64,
                }
            }
            Request::SetRegisters { run, registers } => {
                let held = self.running(run)?;
                let session = &mut held.driven.session;
                let (mut regs, sregs) = session
                    .registers()
                    .map_err(crate::driven::DrivenError::from)?;
                registers.write_general(&mut regs);
                session
                    .set_general_registers(&regs)
                    .map_err(crate::driven::DrivenError::from)?;
                Response::Registers(crate::inspect::Registers::from_kvm(&regs, &sregs))
            }
            Request::MemoryDigest { run } => {
                let held = self.held(run)?;
                Response::MemoryDigest {
                    memory_hash: held.driven.session.memory_digest_hex(),
                }
            }
            Request::ReadVirtual { run, address, len } => {
                let held = self.held(run)?;
                let len = len.min(MAX_READ_VIRTUAL) as usize;
                let mut bytes = vec![0; len];
                let read = held.driven.session.read_virtual(address, &mut bytes);
                bytes.truncate(read);
                Response::Memory { bytes }
            }
            Request::Close { run } => {
                self.runs.remove(&run).ok_or(ApiError::UnknownRun(run))?;
                Response::Closed
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every answer crosses into and out of the helper VM as JSON (an
    /// internally tagged enum cannot hold a bare sequence).
    #[test]
    fn test_records_answers_round_trip_through_json() {
        let response = Response::Records {
            records: vec![crate::records::GuestRecord {
                exit: 1,
                virtual_ns: VirtNanos(2),
                node: Some("n1".into()),
                body: crate::records::RecordBody::History {
                    json: serde_json::json!({"op": 1}),
                },
            }],
        };
        let text = serde_json::to_string(&response).unwrap();
        let back: Response = serde_json::from_str(&text).unwrap();
        assert!(matches!(back, Response::Records { records } if records.len() == 1));
    }

    /// Where a run stands reads and writes the JSON it did when its time
    /// was a bare number.
    #[test]
    fn test_a_position_json_is_unchanged() {
        let position = Position {
            exits: 3,
            virtual_ns: VirtNanos(1_500),
            insn_steps: 0,
            stop: None,
        };
        let text = r#"{"exits":3,"virtual_ns":1500,"stop":null}"#;
        assert_eq!(serde_json::to_string(&position).unwrap(), text);
        assert_eq!(serde_json::from_str::<Position>(text).unwrap(), position);
    }

    /// `--no-seccomp` is a request: it crosses into the helper VM as JSON
    /// and sets whether the runs set up afterwards install the filter.
    #[test]
    fn test_the_seccomp_request_turns_the_filter_off_and_on() {
        let request: Request = serde_json::from_str(
            &serde_json::to_string(&Request::Seccomp { enabled: false }).unwrap(),
        )
        .unwrap();
        let mut controller = Controller::new();
        let answer = controller
            .handle(request, &crate::streams::Discard)
            .unwrap();
        assert!(matches!(answer, Response::Seccomp { enabled: false, .. }));
        assert!(!vmm::seccomp::enabled());
        let answer = controller
            .handle(Request::Seccomp { enabled: true }, &crate::streams::Discard)
            .unwrap();
        assert!(matches!(answer, Response::Seccomp { enabled: true, .. }));
        assert!(vmm::seccomp::enabled());
    }

    /// A request that fails after the filter refused a call names the call
    /// (on a thread of its own: a filter cannot be taken off).
    #[test]
    fn test_a_request_failing_after_a_refused_call_names_it() {
        let (message, tid) = std::thread::Builder::new()
            .name("api-victim".into())
            .spawn(|| {
                vmm::seccomp::install_on_this_thread().unwrap();
                // SAFETY: socket(2) with constant arguments; the filter refuses it.
                let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
                assert_eq!(fd, -1);
                let error = Controller::new()
                    .handle(Request::Outcome { run: RunId(9) }, &crate::streams::Discard)
                    .unwrap_err();
                // SAFETY: gettid has no preconditions.
                (format!("{:#}", anyhow::Error::from(error)), unsafe {
                    libc::gettid()
                })
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(
            message,
            format!(
                "seccomp refused syscall 41 (socket) on thread {tid} (api-victim): \
                 no run RunId(9) is held (it was closed, or never started)"
            )
        );
    }

    #[test]
    fn test_an_error_chain_prints_each_cause_once() {
        let inner = crate::snapshots::SnapshotsError::CreateDir {
            dir: "/tmp".into(),
            source: std::io::Error::from_raw_os_error(libc::EISDIR),
        };
        let error = anyhow::Error::from(ApiError::from(inner));
        assert_eq!(
            format!("{error:#}"),
            "creating snapshot directory /tmp: Is a directory (os error 21)"
        );
        let fault = "at=1s kill".parse::<Fault>().unwrap_err();
        let error = anyhow::Error::from(ApiError::from(crate::up::DriveError::from(fault)));
        assert_eq!(
            format!("{error:#}"),
            "fault \"at=1s kill\": kill takes exactly one node name"
        );
        let unknown = anyhow::Error::from(ApiError::UnknownRun(RunId(3)));
        assert_eq!(
            format!("{unknown:#}"),
            "no run RunId(3) is held (it was closed, or never started)"
        );
    }
}
