//! The run API as typed calls: a [`Runner`] answers [`Request`]s somewhere
//! (in this process, [`Local`] or [`InProcess`]; in a helper VM, the
//! `helper-vm` crate's runners), and [`Calls`] over any runner has one
//! method per request kind, each checking its answer's kind here, once, so
//! that no caller matches a [`Response`] by hand.

use crate::api::{CheckpointId, Controller, Position, Reply, Request, Response, RunId, Until};
use crate::audit::{AuditOptions, AuditSummary};
use crate::branch::BranchRequest;
use crate::faults::Fault;
use crate::inspect::{ExecOutcome, ExecRequest, FileContents, InspectReport, ProcessRow};
use crate::moment::Moment;
use crate::outcome::RunSummary;
use crate::plain::GuestSpec;
use crate::records::GuestRecord;
use crate::seeds::{SeedsReport, SeedsRequest};
use crate::shell::ShellRequest;
use crate::snapshots::{SeekReport, SnapshotDetails, SnapshotPlan, SnapshotRow};
use crate::soak::{SoakReport, SoakRequest};
use crate::streams::Streams;
use crate::up::{PreparedUp, UpOptions, UpSummary};
use std::path::{Path, PathBuf};
use vmm::stall::StallTimeout;
use vmm::vm::{CheckpointMemory, LoadStats};
use vmm::VirtNanos;

/// Why a call failed: the run library's error chain as text (the same
/// whether the run is here or in a helper VM), or an answer of the wrong
/// kind (a bug between the caller and the runner).
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("{request}: {message}")]
    Failed {
        request: &'static str,
        message: String,
    },
    #[error("{request}: unexpected answer {answer}")]
    Unexpected {
        request: &'static str,
        answer: String,
    },
}

impl RunnerError {
    /// The failure as the run library said it, without the request's name:
    /// for a caller that names what it did itself (the CLI, one verb a
    /// process).
    pub fn into_cause(self) -> String {
        match self {
            RunnerError::Failed { message, .. } => message,
            unexpected => format!("internal error: {unexpected}"),
        }
    }
}

/// Answers run requests, somewhere.
pub trait Runner {
    fn call(&mut self, request: Request) -> Reply;
}

/// A borrowed runner (a campaign's only worker, its caller's).
impl<R: Runner + ?Sized> Runner for &mut R {
    fn call(&mut self, request: Request) -> Reply {
        (**self).call(request)
    }
}

impl<R: Runner + ?Sized> Runner for Box<R> {
    fn call(&mut self, request: Request) -> Reply {
        (**self).call(request)
    }
}

/// The run library on the calling thread, its output on `streams`.
pub struct Local<S> {
    controller: Controller,
    streams: S,
}

impl<S: Streams> Local<S> {
    pub fn new(streams: S) -> Self {
        Local {
            controller: Controller::new(),
            streams,
        }
    }

    /// For a process that is detvisor's own (the CLI's): once a guest is set
    /// up, the seccomp filter covers every thread of the process (a stdin
    /// pump and a terminal's among them), not only the one that runs it.
    pub fn process_wide(streams: S) -> Self {
        vmm::seccomp::set_scope(vmm::seccomp::Scope::Process);
        Self::new(streams)
    }
}

impl<S> Local<S> {
    /// The streams the requests' output went to (e.g. captured).
    pub fn streams(&self) -> &S {
        &self.streams
    }
}

impl<S: Streams> Runner for Local<S> {
    fn call(&mut self, request: Request) -> Reply {
        self.controller
            .handle(request, &self.streams)
            .map_err(|e| crate::chain(&e))
    }
}

/// The run library in this process, on a thread of its own: a run's state
/// (its output callbacks among it) may not move between threads, and a
/// campaign's workers each call their runner from a thread of the
/// campaign's. The thread ends when the runner is dropped.
pub struct InProcess {
    requests: Option<crossbeam_channel::Sender<Request>>,
    replies: crossbeam_channel::Receiver<Reply>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The run library thread's stack: a guest's exits are handled on it, as
/// they would be on a main thread's (8 MiB), with room to spare.
pub const RUN_THREAD_STACK: usize = 32 << 20;

impl InProcess {
    pub fn new() -> Self {
        let (requests, incoming) = crossbeam_channel::bounded::<Request>(1);
        let (outgoing, replies) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("run-library".into())
            .stack_size(RUN_THREAD_STACK)
            .spawn(move || {
                let mut local = Local::new(crate::streams::Discard);
                for request in incoming {
                    if outgoing.send(local.call(request)).is_err() {
                        break;
                    }
                }
            })
            .expect("starting the run library's thread");
        InProcess {
            requests: Some(requests),
            replies,
            thread: Some(thread),
        }
    }
}

impl Default for InProcess {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop (its runs closed with it).
        drop(self.requests.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Runner for InProcess {
    fn call(&mut self, request: Request) -> Reply {
        let lost = || "the run library's thread ended (it panicked)".to_string();
        self.requests
            .as_ref()
            .expect("open until dropped")
            .send(request)
            .map_err(|_| lost())?;
        self.replies.recv().map_err(|_| lost())?
    }
}

/// Typed calls over a [`Runner`]: each checks its answer's kind.
pub struct Calls<'a> {
    pub runner: &'a mut dyn Runner,
}

fn unexpected(request: &'static str, answer: Response) -> RunnerError {
    let mut answer = format!("{answer:?}");
    answer.truncate(200);
    RunnerError::Unexpected { request, answer }
}

/// Sends `$request` (named `$name` in errors) and takes the answer that
/// matches `$pattern`; any other is [`RunnerError::Unexpected`].
macro_rules! answer {
    ($calls:expr, $name:expr, $request:expr, $pattern:pat => $value:expr) => {{
        let name = $name;
        match $calls.call(name, $request)? {
            $pattern => Ok($value),
            other => Err(unexpected(name, other)),
        }
    }};
}

impl<'a> Calls<'a> {
    pub fn new(runner: &'a mut dyn Runner) -> Self {
        Calls { runner }
    }

    fn call(&mut self, name: &'static str, request: Request) -> Result<Response, RunnerError> {
        self.runner
            .call(request)
            .map_err(|message| RunnerError::Failed {
                request: name,
                message,
            })
    }

    /// A plain run to its end (`Request::Run`).
    pub fn run(
        &mut self,
        guest: GuestSpec,
        snapshots: Option<SnapshotPlan>,
        pcap: Option<PathBuf>,
        trace: Option<PathBuf>,
    ) -> Result<RunSummary, RunnerError> {
        let request = Request::Run {
            guest,
            snapshots,
            pcap,
            trace,
        };
        answer!(self, "running", request, Response::Summary(summary) => summary)
    }

    pub fn audit(
        &mut self,
        guest: GuestSpec,
        options: AuditOptions,
    ) -> Result<AuditSummary, RunnerError> {
        let request = Request::Audit { guest, options };
        answer!(self, "auditing", request, Response::Audit(summary) => summary)
    }

    pub fn soak(&mut self, request: SoakRequest) -> Result<SoakReport, RunnerError> {
        answer!(self, "soaking", Request::Soak(request), Response::Soak(report) => report)
    }

    pub fn up(
        &mut self,
        prepared: PreparedUp,
        options: UpOptions,
    ) -> Result<UpSummary, RunnerError> {
        let request = Request::Up { prepared, options };
        answer!(self, "running the system", request, Response::Up(summary) => summary)
    }

    pub fn branch(&mut self, request: BranchRequest) -> Result<RunSummary, RunnerError> {
        answer!(self, "branching", Request::Branch(request), Response::Summary(summary) => summary)
    }

    pub fn branch_seeds(&mut self, request: SeedsRequest) -> Result<SeedsReport, RunnerError> {
        let request = Request::BranchSeeds(request);
        answer!(self, "branching per seed", request, Response::Seeds(report) => report)
    }

    pub fn seek(&mut self, moment: Moment) -> Result<SeekReport, RunnerError> {
        answer!(self, "seeking", Request::Seek { moment }, Response::Seek(report) => report)
    }

    /// The shell's exit status.
    pub fn shell(&mut self, request: ShellRequest) -> Result<u8, RunnerError> {
        answer!(self, "opening a shell", Request::Shell(request), Response::Shell { status } => status)
    }

    pub fn list_snapshots(&mut self, dir: PathBuf) -> Result<Vec<SnapshotRow>, RunnerError> {
        let request = Request::ListSnapshots { dir };
        answer!(self, "listing snapshots", request, Response::Snapshots { rows } => rows)
    }

    pub fn snapshot_info(&mut self, dir: PathBuf) -> Result<SnapshotDetails, RunnerError> {
        let request = Request::SnapshotInfo { dir };
        answer!(self, "reading a snapshot", request, Response::SnapshotDetails(details) => details)
    }

    pub fn host_report(&mut self) -> Result<vmm::probe::HostReport, RunnerError> {
        answer!(self, "probing the host", Request::HostReport, Response::HostReport(report) => report)
    }

    pub fn trace_report(
        &mut self,
        path: PathBuf,
    ) -> Result<vmm::trace::report::TraceReport, RunnerError> {
        let request = Request::TraceReport { path };
        answer!(self, "reading a trace", request, Response::TraceReport(report) => report)
    }

    /// Starts a held run (`Boot`, `BootUp` or `Restore`).
    pub fn start(&mut self, request: Request) -> Result<(RunId, Position), RunnerError> {
        answer!(self, "starting the run", request, Response::Started { run, position } => (run, position))
    }

    pub fn boot(&mut self, guest: GuestSpec) -> Result<(RunId, Position), RunnerError> {
        self.start(Request::Boot { guest })
    }

    pub fn boot_up(
        &mut self,
        prepared: PreparedUp,
        options: UpOptions,
    ) -> Result<(RunId, Position), RunnerError> {
        self.start(Request::BootUp { prepared, options })
    }

    pub fn restore(
        &mut self,
        moment: Moment,
        until: Option<VirtNanos>,
        stall_timeout: StallTimeout,
        stream_output: bool,
    ) -> Result<(RunId, Position), RunnerError> {
        self.start(Request::Restore {
            moment,
            until,
            stall_timeout,
            stream_output,
        })
    }

    fn position(&mut self, name: &'static str, request: Request) -> Result<Position, RunnerError> {
        answer!(self, name, request, Response::Position(position) => position)
    }

    pub fn run_until(&mut self, run: RunId, until: Until) -> Result<Position, RunnerError> {
        self.position("running", Request::RunUntil { run, until })
    }

    /// Single-steps a held run (see `Request::StepInsns`): where it stands
    /// after, the steps taken and the exits met.
    pub fn step_insns(
        &mut self,
        run: RunId,
        count: u64,
        within_interval: bool,
    ) -> Result<(Position, u64, u64), RunnerError> {
        let request = Request::StepInsns {
            run,
            count,
            within_interval,
        };
        answer!(self, "single-stepping", request, Response::Stepped { position, stepped, exits } => (position, stepped, exits))
    }

    /// Steps within the interval to `address` (see `Request::StepTo`).
    pub fn step_to(
        &mut self,
        run: RunId,
        address: u64,
        max: u64,
    ) -> Result<(Position, bool), RunnerError> {
        let request = Request::StepTo { run, address, max };
        answer!(self, "stepping to an address", request, Response::SteppedTo { position, reached } => (position, reached))
    }

    /// Steps within the interval until a watched range changes (see
    /// `Request::StepToChange`).
    pub fn step_to_change(
        &mut self,
        run: RunId,
        watches: Vec<crate::driven::Watch>,
        max: u64,
    ) -> Result<(Position, Option<u64>), RunnerError> {
        let request = Request::StepToChange { run, watches, max };
        answer!(self, "stepping to a change", request, Response::SteppedToChange { position, changed } => (position, changed))
    }

    /// Runs on to the first breakpoint reached (see `Request::RunToBreakpoint`).
    pub fn run_to_breakpoint(
        &mut self,
        run: RunId,
        breakpoints: Vec<u64>,
        watches: Vec<crate::driven::Watch>,
        until: Until,
    ) -> Result<(Position, crate::driven::BreakpointRun), RunnerError> {
        let request = Request::RunToBreakpoint {
            run,
            breakpoints,
            watches,
            until,
        };
        answer!(self, "running to a breakpoint", request, Response::Breakpoint { position, ran } => (position, ran))
    }

    pub fn registers(&mut self, run: RunId) -> Result<crate::inspect::Registers, RunnerError> {
        answer!(self, "reading registers", Request::Registers { run }, Response::Registers(registers) => registers)
    }

    /// Writes guest virtual memory (see `Request::WriteVirtual`): how many
    /// bytes were written.
    pub fn write_virtual(
        &mut self,
        run: RunId,
        address: u64,
        bytes: Vec<u8>,
    ) -> Result<u64, RunnerError> {
        let request = Request::WriteVirtual {
            run,
            address,
            bytes,
        };
        answer!(self, "writing guest memory", request, Response::Written { written } => written)
    }

    /// Sets the general registers (see `Request::SetRegisters`).
    pub fn set_registers(
        &mut self,
        run: RunId,
        registers: crate::inspect::Registers,
    ) -> Result<crate::inspect::Registers, RunnerError> {
        let request = Request::SetRegisters { run, registers };
        answer!(self, "setting registers", request, Response::Registers(registers) => registers)
    }

    /// The guest's RAM hashed (see `Request::MemoryDigest`).
    pub fn memory_digest(&mut self, run: RunId) -> Result<String, RunnerError> {
        answer!(self, "hashing guest memory", Request::MemoryDigest { run }, Response::MemoryDigest { memory_hash } => memory_hash)
    }

    /// Guest virtual memory (see `Request::ReadVirtual`).
    pub fn read_virtual(
        &mut self,
        run: RunId,
        address: u64,
        len: u64,
    ) -> Result<Vec<u8>, RunnerError> {
        let request = Request::ReadVirtual { run, address, len };
        answer!(self, "reading guest memory", request, Response::Memory { bytes } => bytes)
    }

    pub fn collect_records(&mut self, run: RunId) -> Result<Position, RunnerError> {
        self.position("collecting records", Request::CollectRecords { run })
    }

    pub fn take_records(&mut self, run: RunId) -> Result<Vec<GuestRecord>, RunnerError> {
        answer!(self, "taking records", Request::TakeRecords { run }, Response::Records { records } => records)
    }

    pub fn checkpoint(&mut self, run: RunId) -> Result<(CheckpointId, Position), RunnerError> {
        answer!(
            self,
            "checkpointing",
            Request::Checkpoint { run },
            Response::Checkpoint { checkpoint, position } => (checkpoint, position)
        )
    }

    pub fn reset(&mut self, run: RunId, checkpoint: CheckpointId) -> Result<Position, RunnerError> {
        self.position("resetting", Request::Reset { run, checkpoint })
    }

    pub fn rekey(&mut self, run: RunId, seed: u64) -> Result<Position, RunnerError> {
        self.position("re-keying", Request::Rekey { run, seed })
    }

    pub fn inject(&mut self, run: RunId, fault: Fault) -> Result<Position, RunnerError> {
        self.position("injecting a fault", Request::InjectFault { run, fault })
    }

    pub fn outcome(&mut self, run: RunId) -> Result<RunSummary, RunnerError> {
        answer!(self, "reading the outcome", Request::Outcome { run }, Response::Summary(summary) => summary)
    }

    /// Lets a checkpoint go (its pages are freed in the runner); what the
    /// run's checkpoints hold after.
    pub fn drop_checkpoint(
        &mut self,
        run: RunId,
        checkpoint: CheckpointId,
    ) -> Result<CheckpointMemory, RunnerError> {
        let request = Request::DropCheckpoint { run, checkpoint };
        answer!(self, "dropping a checkpoint", request, Response::CheckpointMemory(memory) => memory)
    }

    /// How much the run's checkpoints hold.
    pub fn checkpoint_memory(&mut self, run: RunId) -> Result<CheckpointMemory, RunnerError> {
        let request = Request::CheckpointMemory { run };
        answer!(self, "reading checkpoint memory", request, Response::CheckpointMemory(memory) => memory)
    }

    /// Sets the most bytes the run's checkpoints may hold (`None`: no limit).
    pub fn checkpoint_budget(
        &mut self,
        run: RunId,
        bytes: Option<u64>,
    ) -> Result<CheckpointMemory, RunnerError> {
        let request = Request::CheckpointBudget { run, bytes };
        answer!(self, "setting the checkpoint budget", request, Response::CheckpointMemory(memory) => memory)
    }

    /// A full snapshot of the run's present in `dir`.
    pub fn snapshot(&mut self, run: RunId, dir: &Path) -> Result<SnapshotRow, RunnerError> {
        let request = Request::Snapshot {
            run,
            dir: dir.to_owned(),
        };
        answer!(self, "taking a snapshot", request, Response::Snapshot(row) => row)
    }

    /// Writes the run's present moment to disk (see `Request::Spill`).
    pub fn spill(
        &mut self,
        run: RunId,
        dir: &Path,
        id: &str,
        parent: Option<String>,
    ) -> Result<SnapshotRow, RunnerError> {
        let request = Request::Spill {
            run,
            dir: dir.to_owned(),
            id: id.to_owned(),
            parent,
        };
        answer!(self, "spilling a moment", request, Response::Snapshot(row) => row)
    }

    /// Loads a spilled moment back into the run, in place.
    pub fn load_in_place(
        &mut self,
        run: RunId,
        dir: &Path,
    ) -> Result<(Position, LoadStats), RunnerError> {
        let request = Request::LoadInPlace {
            run,
            dir: dir.to_owned(),
        };
        answer!(self, "loading a spilled moment", request, Response::Loaded { position, stats } => (position, stats))
    }

    /// Runs a command in a held `up` run (see [`crate::inspect`]).
    pub fn exec(&mut self, run: RunId, exec: ExecRequest) -> Result<ExecOutcome, RunnerError> {
        answer!(self, "running a command in the guest", Request::Exec { run, exec }, Response::Exec(outcome) => outcome)
    }

    /// The first `limit` bytes of `path` as node `node` sees it (`None`:
    /// the guest's file), and where the run stands after.
    pub fn read_file(
        &mut self,
        run: RunId,
        node: Option<String>,
        path: String,
        limit: u64,
    ) -> Result<(FileContents, Position), RunnerError> {
        let request = Request::ReadFile {
            run,
            node,
            path,
            limit,
        };
        answer!(self, "reading a file in the guest", request, Response::File { bytes, size, truncated, position } => (FileContents { bytes, size, truncated }, position))
    }

    /// The processes of node `node` (`None`: of the guest), and where the
    /// run stands after.
    pub fn processes(
        &mut self,
        run: RunId,
        node: Option<String>,
    ) -> Result<(Vec<ProcessRow>, Position), RunnerError> {
        let request = Request::Processes { run, node };
        answer!(self, "listing the guest's processes", request, Response::Processes { processes, position } => (processes, position))
    }

    /// The machine at the run's present (registers, devices, nodes).
    pub fn inspect(&mut self, run: RunId) -> Result<InspectReport, RunnerError> {
        answer!(self, "inspecting the machine", Request::Inspect { run }, Response::Inspect(report) => report)
    }

    /// A shell in the held run as it stands (see [`Request::ShellIn`]): its
    /// exit status.
    pub fn shell_in(
        &mut self,
        run: RunId,
        label: String,
        terminal: crate::shell::Terminal,
    ) -> Result<u8, RunnerError> {
        let request = Request::ShellIn {
            run,
            label,
            terminal,
        };
        answer!(self, "opening a shell", request, Response::Shell { status } => status)
    }

    pub fn close(&mut self, run: RunId) -> Result<(), RunnerError> {
        answer!(self, "closing the run", Request::Close { run }, Response::Closed => ())
    }

    /// Whether runs set up from now on install the seccomp filter; the
    /// filters on the answering thread.
    pub fn seccomp(&mut self, enabled: bool) -> Result<Option<u32>, RunnerError> {
        answer!(
            self,
            "setting seccomp",
            Request::Seccomp { enabled },
            Response::Seccomp { thread_filters, .. } => thread_filters
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runner that answers every request with the same response.
    struct Always(Response);

    impl Runner for Always {
        fn call(&mut self, _: Request) -> Reply {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn test_an_answer_of_another_kind_is_an_error_naming_the_request() {
        let mut runner = Always(Response::Closed);
        let error = Calls::new(&mut runner)
            .outcome(RunId(1))
            .unwrap_err()
            .to_string();
        assert_eq!(error, "reading the outcome: unexpected answer Closed");
        let mut calls = Calls::new(&mut runner);
        calls.close(RunId(1)).unwrap();
    }

    /// The inspection calls unpack their answers, and refuse another kind.
    #[test]
    fn test_the_inspection_calls_unpack_their_answers() {
        let at = Position {
            exits: 9,
            virtual_ns: VirtNanos(3),
            insn_steps: 0,
            stop: None,
        };
        let mut runner = Always(Response::File {
            bytes: b"abc".to_vec(),
            size: 10,
            truncated: true,
            position: at,
        });
        let (file, position) = Calls::new(&mut runner)
            .read_file(RunId(1), Some("n1".into()), "/etc/motd".into(), 3)
            .unwrap();
        assert_eq!(
            (file.bytes.as_slice(), file.size, file.truncated),
            (&b"abc"[..], 10, true)
        );
        assert_eq!(position, at);
        let error = Calls::new(&mut runner)
            .processes(RunId(1), None)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("listing the guest's processes: unexpected answer File"),
            "{error}"
        );
        let mut runner = Always(Response::Processes {
            processes: Vec::new(),
            position: at,
        });
        let (rows, position) = Calls::new(&mut runner).processes(RunId(1), None).unwrap();
        assert!(rows.is_empty());
        assert_eq!(position, at);
    }

    #[test]
    fn test_a_failure_keeps_the_library_s_text() {
        struct Failing;
        impl Runner for Failing {
            fn call(&mut self, _: Request) -> Reply {
                Err("no run RunId(3) is held".into())
            }
        }
        let error = Calls::new(&mut Failing).close(RunId(3)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "closing the run: no run RunId(3) is held"
        );
        assert_eq!(error.into_cause(), "no run RunId(3) is held");
    }

    /// The library on a thread of its own answers as it would here, and
    /// its errors are the library's chains.
    #[test]
    fn test_in_process_answers_on_its_thread() {
        let mut runner = InProcess::new();
        let mut calls = Calls::new(&mut runner);
        let error = calls.outcome(RunId(9)).unwrap_err().into_cause();
        assert_eq!(
            error,
            "no run RunId(9) is held (it was closed, or never started)"
        );
        let rows = calls.list_snapshots(PathBuf::from("/nonexistent/detvisor-snapshots"));
        assert!(rows.is_err());
    }
}
