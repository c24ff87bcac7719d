//! The [`Timeline`] as gdbstub's target: x86-64 registers, guest virtual
//! memory, `stepi`, `continue`, software breakpoints, `reverse-stepi`,
//! `reverse-continue`, and `monitor` commands.
//!
//! A write (memory, registers) makes the present a branch point: the
//! history after it is a new one, and reverse execution stops there.
//! Write watchpoints are compared exit to exit and located by stepping
//! the one interval where the bytes changed.

use crate::timeline::{Stop, Timeline, TimelineError};
use gdbstub::common::Signal;
use gdbstub::conn::ConnectionExt;
use gdbstub::stub::{run_blocking, SingleThreadStopReason};
use gdbstub::target::ext::base::reverse_exec::{
    ReplayLogPosition, ReverseCont, ReverseContOps, ReverseStep, ReverseStepOps,
};
use gdbstub::target::ext::base::singlethread::{
    SingleThreadBase, SingleThreadResume, SingleThreadResumeOps, SingleThreadSingleStep,
    SingleThreadSingleStepOps,
};
use gdbstub::target::ext::base::BaseOps;
use gdbstub::target::ext::breakpoints::{
    Breakpoints, BreakpointsOps, HwWatchpoint, HwWatchpointOps, SwBreakpoint, SwBreakpointOps,
    WatchKind,
};
use gdbstub::target::ext::monitor_cmd::{outputln, ConsoleOutput, MonitorCmd, MonitorCmdOps};
use gdbstub::target::{Target, TargetError, TargetResult};
use gdbstub_arch::x86::reg::X86_64CoreRegs;
use gdbstub_arch::x86::X86_64_SSE;

/// What gdb asked the target to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resume {
    Continue,
    Step,
    ReverseStep,
    ReverseContinue,
}

/// The timeline, and the move gdb asked for.
pub struct GdbTarget {
    pub timeline: Timeline,
    resume: Option<Resume>,
    /// The last error a move met, told to gdb's user by `monitor error`.
    pub last_error: Option<String>,
}

impl GdbTarget {
    pub fn new(timeline: Timeline) -> GdbTarget {
        GdbTarget {
            timeline,
            resume: None,
            last_error: None,
        }
    }

    /// Makes the move gdb asked for: the stop to report.
    fn make_move(
        &mut self,
        interrupted: &mut dyn FnMut() -> bool,
    ) -> Result<SingleThreadStopReason<u64>, TimelineError> {
        let stop = match self.resume.take() {
            Some(Resume::Continue) => self.timeline.cont(interrupted)?,
            Some(Resume::Step) | None => self.timeline.step()?,
            Some(Resume::ReverseStep) => self.timeline.reverse_step()?,
            Some(Resume::ReverseContinue) => self.timeline.reverse_cont()?,
        };
        Ok(match stop {
            Stop::Step => SingleThreadStopReason::DoneStep,
            Stop::Breakpoint(_) => SingleThreadStopReason::SwBreak(()),
            Stop::Watch(addr) => SingleThreadStopReason::Watch {
                tid: (),
                kind: WatchKind::Write,
                addr,
            },
            Stop::Start => SingleThreadStopReason::ReplayLog {
                tid: None,
                pos: ReplayLogPosition::Begin,
            },
            Stop::Interrupted => SingleThreadStopReason::Signal(Signal::SIGINT),
            Stop::Ended(reason) => match reason {
                vmm::exit::StopReason::GuestExit { status } => {
                    SingleThreadStopReason::Exited(status)
                }
                _ => SingleThreadStopReason::Terminated(Signal::SIGKILL),
            },
        })
    }
}

impl Target for GdbTarget {
    type Arch = X86_64_SSE;
    type Error = TimelineError;

    fn base_ops(&mut self) -> BaseOps<'_, Self::Arch, Self::Error> {
        BaseOps::SingleThread(self)
    }

    fn support_breakpoints(&mut self) -> Option<BreakpointsOps<'_, Self>> {
        Some(self)
    }

    fn support_monitor_cmd(&mut self) -> Option<MonitorCmdOps<'_, Self>> {
        Some(self)
    }

    // The guest is an x86-64 machine: gdb's own x86 breakpoint (INT3) is
    // never written; ours are HLTs the server places.
    fn guard_rail_implicit_sw_breakpoints(&self) -> bool {
        true
    }
}

/// A timeline error as gdb sees it: an `E` reply, the text kept for
/// `monitor error`.
fn non_fatal<T>(target: &mut GdbTarget, error: TimelineError) -> TargetResult<T, GdbTarget> {
    target.last_error = Some(error.to_string());
    Err(TargetError::NonFatal)
}

impl SingleThreadBase for GdbTarget {
    fn read_registers(&mut self, regs: &mut X86_64CoreRegs) -> TargetResult<(), Self> {
        let r = match self.timeline.registers() {
            Ok(r) => r,
            Err(e) => return non_fatal(self, e),
        };
        regs.regs = [
            r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8, r.r9, r.r10, r.r11,
            r.r12, r.r13, r.r14, r.r15,
        ];
        regs.rip = r.rip;
        regs.eflags = r.rflags as u32;
        let s = &r.segments;
        regs.segments.cs = s.cs.into();
        regs.segments.ss = s.ss.into();
        regs.segments.ds = s.ds.into();
        regs.segments.es = s.es.into();
        regs.segments.fs = s.fs.into();
        regs.segments.gs = s.gs.into();
        Ok(())
    }

    fn write_registers(&mut self, regs: &X86_64CoreRegs) -> TargetResult<(), Self> {
        let mut r = match self.timeline.registers() {
            Ok(r) => r,
            Err(e) => return non_fatal(self, e),
        };
        [
            r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8, r.r9, r.r10, r.r11,
            r.r12, r.r13, r.r14, r.r15,
        ] = regs.regs;
        r.rip = regs.rip;
        // EFLAGS' upper half is reserved (0).
        r.rflags = u64::from(regs.eflags);
        match self.timeline.set_registers(r) {
            Ok(()) => Ok(()),
            Err(e) => non_fatal(self, e),
        }
    }

    fn read_addrs(&mut self, start_addr: u64, data: &mut [u8]) -> TargetResult<usize, Self> {
        match self.timeline.read(start_addr, data.len() as u64) {
            Ok(bytes) => {
                data[..bytes.len()].copy_from_slice(&bytes);
                Ok(bytes.len())
            }
            Err(e) => non_fatal(self, e),
        }
    }

    fn write_addrs(&mut self, start_addr: u64, data: &[u8]) -> TargetResult<(), Self> {
        match self.timeline.write(start_addr, data) {
            Ok(written) if written == data.len() as u64 => Ok(()),
            Ok(_) => Err(TargetError::NonFatal),
            Err(e) => non_fatal(self, e),
        }
    }

    fn support_resume(&mut self) -> Option<SingleThreadResumeOps<'_, Self>> {
        Some(self)
    }
}

impl SingleThreadResume for GdbTarget {
    fn resume(&mut self, _signal: Option<Signal>) -> Result<(), Self::Error> {
        self.resume = Some(Resume::Continue);
        Ok(())
    }

    fn support_single_step(&mut self) -> Option<SingleThreadSingleStepOps<'_, Self>> {
        Some(self)
    }

    fn support_reverse_step(&mut self) -> Option<ReverseStepOps<'_, (), Self>> {
        Some(self)
    }

    fn support_reverse_cont(&mut self) -> Option<ReverseContOps<'_, (), Self>> {
        Some(self)
    }
}

impl SingleThreadSingleStep for GdbTarget {
    fn step(&mut self, _signal: Option<Signal>) -> Result<(), Self::Error> {
        self.resume = Some(Resume::Step);
        Ok(())
    }
}

impl ReverseStep<()> for GdbTarget {
    fn reverse_step(&mut self, _tid: ()) -> Result<(), Self::Error> {
        self.resume = Some(Resume::ReverseStep);
        Ok(())
    }
}

impl ReverseCont<()> for GdbTarget {
    fn reverse_cont(&mut self) -> Result<(), Self::Error> {
        self.resume = Some(Resume::ReverseContinue);
        Ok(())
    }
}

impl Breakpoints for GdbTarget {
    fn support_sw_breakpoint(&mut self) -> Option<SwBreakpointOps<'_, Self>> {
        Some(self)
    }

    fn support_hw_watchpoint(&mut self) -> Option<HwWatchpointOps<'_, Self>> {
        Some(self)
    }
}

/// Write watchpoints, compared exit to exit and located by stepping the
/// interval where the bytes changed (`Timeline`). Read watchpoints are not
/// offered: nothing short of stepping every instruction sees a read.
impl HwWatchpoint for GdbTarget {
    fn add_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        kind: WatchKind,
    ) -> TargetResult<bool, Self> {
        if kind != WatchKind::Write || len == 0 || len > run::driven::MAX_WATCH_BYTES {
            return Ok(false);
        }
        self.timeline.watches.insert((addr, len));
        Ok(true)
    }

    fn remove_hw_watchpoint(
        &mut self,
        addr: u64,
        len: u64,
        _kind: WatchKind,
    ) -> TargetResult<bool, Self> {
        Ok(self.timeline.watches.remove(&(addr, len)))
    }
}

impl SwBreakpoint for GdbTarget {
    fn add_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        if addr < vmm::vm::KERNEL_HALF {
            self.last_error =
                Some(vmm::vm::BreakpointError::UserAddress { address: addr }.to_string());
            return Ok(false);
        }
        self.timeline.breakpoints.insert(addr);
        Ok(true)
    }

    fn remove_sw_breakpoint(&mut self, addr: u64, _kind: usize) -> TargetResult<bool, Self> {
        Ok(self.timeline.breakpoints.remove(&addr))
    }
}

impl MonitorCmd for GdbTarget {
    fn handle_monitor_cmd(
        &mut self,
        cmd: &[u8],
        mut out: ConsoleOutput<'_>,
    ) -> Result<(), Self::Error> {
        let cmd = String::from_utf8_lossy(cmd);
        match cmd.trim() {
            "position" | "" => {
                let at = self.timeline.position();
                let position = vmm::position::InsnPosition {
                    exit: at.exits,
                    steps: at.insn_steps,
                };
                outputln!(out, "{position} at virtual {}", at.virtual_ns);
            }
            "start" => {
                let branched = if self.timeline.branched() {
                    " (a branch point: a write made a new history here)"
                } else {
                    ""
                };
                outputln!(out, "{}{branched}", self.timeline.start());
            }
            "digest" => {
                let at = self.timeline.position();
                let memory = self.timeline.memory_digest()?;
                outputln!(
                    out,
                    "exit:{}+insn:{} memory {memory}",
                    at.exits,
                    at.insn_steps
                );
            }
            "error" => match &self.last_error {
                Some(error) => outputln!(out, "{error}"),
                None => outputln!(out, "no error"),
            },
            other => outputln!(
                out,
                "unknown monitor command {other:?}: position, start, digest, error"
            ),
        }
        Ok(())
    }
}

/// Runs the move gdb asked for between its packets, looking for its
/// interrupt (Ctrl-C) between runs of exits.
pub enum EventLoop {}

impl run_blocking::BlockingEventLoop for EventLoop {
    type Target = GdbTarget;
    type Connection = Box<dyn ConnectionExt<Error = std::io::Error>>;
    type StopReason = SingleThreadStopReason<u64>;

    #[allow(clippy::type_complexity)]
    fn wait_for_stop_reason(
        target: &mut GdbTarget,
        conn: &mut Self::Connection,
    ) -> Result<
        run_blocking::Event<Self::StopReason>,
        run_blocking::WaitForStopReasonError<TimelineError, std::io::Error>,
    > {
        let mut incoming = None;
        let mut interrupted = || match conn.peek() {
            Ok(Some(_)) | Err(_) => {
                incoming = Some(());
                true
            }
            Ok(None) => false,
        };
        match target.make_move(&mut interrupted) {
            Ok(SingleThreadStopReason::Signal(Signal::SIGINT)) if incoming.is_some() => {
                let byte = conn
                    .read()
                    .map_err(run_blocking::WaitForStopReasonError::Connection)?;
                Ok(run_blocking::Event::IncomingData(byte))
            }
            Ok(stop) => Ok(run_blocking::Event::TargetStopped(stop)),
            // A move that failed stops where it ended; gdb is told by a
            // signal, and `monitor error` says why.
            Err(error) => {
                target.last_error = Some(error.to_string());
                Ok(run_blocking::Event::TargetStopped(
                    SingleThreadStopReason::Signal(Signal::SIGTRAP),
                ))
            }
        }
    }

    fn on_interrupt(_target: &mut GdbTarget) -> Result<Option<Self::StopReason>, TimelineError> {
        Ok(Some(SingleThreadStopReason::Signal(Signal::SIGINT)))
    }
}

/// Serves one gdb connection until gdb detaches or kills.
pub fn serve_connection(
    target: &mut GdbTarget,
    conn: Box<dyn ConnectionExt<Error = std::io::Error>>,
) -> Result<gdbstub::stub::DisconnectReason, String> {
    let gdb = gdbstub::stub::GdbStub::new(conn);
    gdb.run_blocking::<EventLoop>(target)
        .map_err(|e| e.to_string())
}
