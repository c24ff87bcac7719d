//! A held run as a debugger moves through it: forward by single steps
//! and runs to breakpoints, backward by returning to a checkpoint kept in
//! the run and replaying deterministically, as rr and QEMU's replay do.
//!
//! Every place is an instruction position (`exit:N+insn:K`, see
//! `vmm::position`). A hit of a software breakpoint is found at exit
//! granularity (the guest stops there, `vmm::vm::breakpoints`) and then
//! located exactly: the run is reset to the checkpoint kept before the
//! run that hit it, replayed to the hit's exit and stepped to the address.
//! A checkpoint is kept before each run of [`CHUNK_EXITS`] exits and at
//! each located hit, so a replay is at most that long; the oldest are let
//! go past [`MAX_KEPT`] (the start is always kept).

use run::api::{CheckpointId, Position, RunId, Until};
use run::client::{Calls, Runner, RunnerError};
use run::driven::{BreakpointRun, Watch};
use run::inspect::Registers;
use run::moment::Moment;
use vmm::exit::StopReason;
use vmm::position::InsnPosition;
use vmm::stall::StallTimeout;
use vmm::vm::MAX_INSN_STEPS;

/// Exits one run toward a breakpoint takes before a checkpoint is kept
/// and a debugger's interrupt is looked for.
pub const CHUNK_EXITS: u64 = 20_000;

/// Checkpoints kept at once besides the start.
pub const MAX_KEPT: usize = 32;

/// Why the timeline could not move.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    #[error(transparent)]
    Runner(#[from] RunnerError),
    #[error("{target} is before the start of this session ({start})")]
    BeforeStart {
        target: InsnPosition,
        start: InsnPosition,
    },
    #[error("replaying to {target} ended at {reached}{}", stop.map(|s| format!(" ({s:?})")).unwrap_or_default())]
    NotReached {
        target: InsnPosition,
        reached: InsnPosition,
        stop: Option<StopReason>,
    },
    #[error(
        "the breakpoint at {address:#x} was hit after exit {exit}, but stepping that interval \
         did not reach it (a handler's first instruction is entered within the step that \
         delivers its interrupt)"
    )]
    HitNotLocated { address: u64, exit: u64 },
    #[error("the guest has stopped ({stop:?}) at {at}: it runs no further")]
    Stopped { stop: StopReason, at: InsnPosition },
}

pub type Result<T, E = TimelineError> = std::result::Result<T, E>;

/// Where a move ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// One instruction done (forward or backward).
    Step,
    /// At the software breakpoint at this address.
    Breakpoint(u64),
    /// Just after a write to the watched range at this address (the
    /// instruction that wrote it, or the exit whose handling did).
    Watch(u64),
    /// At the start of the session: nothing earlier to go back to.
    Start,
    /// The debugger asked to stop (between two runs of exits).
    Interrupted,
    /// The guest stopped for good.
    Ended(StopReason),
}

#[derive(Clone, Copy, Debug)]
struct Kept {
    at: InsnPosition,
    checkpoint: CheckpointId,
}

/// A held run and the checkpoints kept in it.
pub struct Timeline {
    runner: Box<dyn Runner>,
    run: RunId,
    start: Kept,
    /// Oldest first.
    kept: Vec<Kept>,
    at: Position,
    /// The software breakpoints (kernel addresses).
    pub breakpoints: std::collections::BTreeSet<u64>,
    /// The watched ranges (address, length): a write to one stops a run
    /// after the instruction that made it.
    pub watches: std::collections::BTreeSet<(u64, u64)>,
    branched: bool,
}

fn insn_position(position: &Position) -> InsnPosition {
    InsnPosition {
        exit: position.exits,
        steps: position.insn_steps,
    }
}

impl Timeline {
    /// Restores `moment` (a position `exit:N+insn:K` included) in the
    /// runner and holds it: the session's start.
    pub fn open(mut runner: Box<dyn Runner>, moment: Moment) -> Result<Timeline> {
        let mut calls = Calls::new(&mut *runner);
        let (run, at) = calls.restore(moment, None, StallTimeout::default(), false)?;
        let (checkpoint, _) = calls.checkpoint(run)?;
        let start = Kept {
            at: insn_position(&at),
            checkpoint,
        };
        Ok(Timeline {
            runner,
            run,
            start,
            kept: Vec::new(),
            at,
            breakpoints: Default::default(),
            watches: Default::default(),
            branched: false,
        })
    }

    fn calls(&mut self) -> Calls<'_> {
        Calls::new(&mut *self.runner)
    }

    /// Where the run stands.
    pub fn position(&self) -> Position {
        self.at
    }

    /// The session's first position.
    pub fn start(&self) -> InsnPosition {
        self.start.at
    }

    pub fn registers(&mut self) -> Result<Registers> {
        let run = self.run;
        Ok(self.calls().registers(run)?)
    }

    /// The guest's RAM hashed at the present (as `seek` reports it).
    pub fn memory_digest(&mut self) -> Result<String> {
        let run = self.run;
        Ok(self.calls().memory_digest(run)?)
    }

    /// Writes guest virtual memory (up to the first byte not mapped):
    /// the present becomes a branch point (see [`Timeline::branch_here`]).
    pub fn write(&mut self, address: u64, bytes: &[u8]) -> Result<u64> {
        self.ended()?;
        let run = self.run;
        let written = self.calls().write_virtual(run, address, bytes.to_vec())?;
        self.branch_here()?;
        Ok(written)
    }

    /// Sets the general registers, RIP and RFLAGS: the present becomes a
    /// branch point (see [`Timeline::branch_here`]).
    pub fn set_registers(&mut self, registers: Registers) -> Result<()> {
        self.ended()?;
        let run = self.run;
        self.calls().set_registers(run, registers)?;
        self.branch_here()
    }

    /// After a write, the run is a new history from the present: every
    /// checkpoint kept before it (the start's too) belongs to the old one
    /// and is let go, and the present is the new start, so reverse
    /// execution stops here (gdb: "No more reverse-execution history").
    fn branch_here(&mut self) -> Result<()> {
        let run = self.run;
        self.forget_kept()?;
        let old = self.start.checkpoint;
        let (checkpoint, at) = self.calls().checkpoint(run)?;
        self.calls().drop_checkpoint(run, old)?;
        self.at = at;
        self.start = Kept {
            at: insn_position(&at),
            checkpoint,
        };
        self.branched = true;
        Ok(())
    }

    /// Whether a write made this session's history a branch of the one
    /// it started on.
    pub fn branched(&self) -> bool {
        self.branched
    }

    /// Guest virtual memory, up to the first byte not mapped.
    pub fn read(&mut self, address: u64, len: u64) -> Result<Vec<u8>> {
        let run = self.run;
        Ok(self.calls().read_virtual(run, address, len)?)
    }

    fn here(&self) -> InsnPosition {
        insn_position(&self.at)
    }

    fn ended(&self) -> Result<()> {
        match self.at.stop {
            Some(stop) => Err(TimelineError::Stopped {
                stop,
                at: self.here(),
            }),
            None => Ok(()),
        }
    }

    /// Keeps a checkpoint at the present (unless one is kept here).
    fn keep(&mut self) -> Result<()> {
        let here = self.here();
        if self.start.at == here || self.kept.iter().any(|k| k.at == here) {
            return Ok(());
        }
        let run = self.run;
        let (checkpoint, _) = self.calls().checkpoint(run)?;
        self.kept.push(Kept {
            at: here,
            checkpoint,
        });
        if self.kept.len() > MAX_KEPT {
            let oldest = self.kept.remove(0);
            self.calls().drop_checkpoint(run, oldest.checkpoint)?;
        }
        Ok(())
    }

    /// Keeps a checkpoint at the present, for later moves back to near it.
    pub fn keep_here(&mut self) -> Result<()> {
        self.keep()
    }

    /// Lets every kept checkpoint go but the start's.
    pub fn forget_kept(&mut self) -> Result<()> {
        let run = self.run;
        for kept in std::mem::take(&mut self.kept) {
            self.calls().drop_checkpoint(run, kept.checkpoint)?;
        }
        Ok(())
    }

    /// The latest kept checkpoint at or before `target`.
    fn kept_before(&self, target: InsnPosition) -> Kept {
        self.kept
            .iter()
            .filter(|k| k.at <= target)
            .max_by_key(|k| k.at)
            .copied()
            .filter(|k| k.at >= self.start.at)
            .unwrap_or(self.start)
    }

    fn reset_to(&mut self, kept: Kept) -> Result<()> {
        let run = self.run;
        self.at = self.calls().reset(run, kept.checkpoint)?;
        Ok(())
    }

    /// Replays from the nearest checkpoint to `target`'s exit, or runs on
    /// from the present when that is nearer.
    fn reach_exit(&mut self, target: InsnPosition) -> Result<()> {
        let kept = self.kept_before(target);
        let here = self.here();
        if !(here <= target && here >= kept.at && self.at.stop.is_none()) {
            self.reset_to(kept)?;
        }
        if self.at.exits < target.exit {
            let run = self.run;
            self.at = self.calls().run_until(run, Until::Exit(target.exit))?;
            if self.at.exits != target.exit {
                return Err(TimelineError::NotReached {
                    target,
                    reached: self.here(),
                    stop: self.at.stop,
                });
            }
        }
        Ok(())
    }

    /// Goes to `target` exactly (a position of this session's history).
    pub fn goto(&mut self, target: InsnPosition) -> Result<()> {
        if target < self.start.at {
            return Err(TimelineError::BeforeStart {
                target,
                start: self.start.at,
            });
        }
        self.reach_exit(target)?;
        let here = self.here();
        if here.steps < target.steps {
            let run = self.run;
            let (at, _, _) = self
                .calls()
                .step_insns(run, target.steps - here.steps, true)?;
            self.at = at;
        }
        if self.here() != target {
            return Err(TimelineError::NotReached {
                target,
                reached: self.here(),
                stop: self.at.stop,
            });
        }
        Ok(())
    }

    /// One instruction forward (an exit met is taken as the free run
    /// takes it).
    pub fn step(&mut self) -> Result<Stop> {
        self.ended()?;
        let run = self.run;
        let (at, _, _) = self.calls().step_insns(run, 1, false)?;
        self.at = at;
        Ok(match at.stop {
            Some(stop) => Stop::Ended(stop),
            None => Stop::Step,
        })
    }

    /// Runs on to the first breakpoint, the guest's end, or until
    /// `interrupted` says so (asked between runs of [`CHUNK_EXITS`]).
    pub fn cont(&mut self, interrupted: &mut dyn FnMut() -> bool) -> Result<Stop> {
        self.ended()?;
        loop {
            if interrupted() {
                return Ok(Stop::Interrupted);
            }
            match self.run_chunk(Until::Steps(CHUNK_EXITS))? {
                Some(stop) => return Ok(stop),
                None => continue,
            }
        }
    }

    /// One run toward the breakpoints, a checkpoint kept before it: the
    /// stop it made, `None` at `until`.
    fn run_chunk(&mut self, until: Until) -> Result<Option<Stop>> {
        self.keep()?;
        let from = self.here();
        let run = self.run;
        let breakpoints = self.breakpoints.iter().copied().collect();
        let watches = self.watch_list();
        let (at, ran) = self
            .calls()
            .run_to_breakpoint(run, breakpoints, watches, until)?;
        match ran {
            BreakpointRun::Hit { address } => {
                self.locate(address, at.exits, from)?;
                Ok(Some(Stop::Breakpoint(address)))
            }
            BreakpointRun::Changed { address } => {
                self.locate_change(at.exits, from)?;
                Ok(Some(Stop::Watch(address)))
            }
            BreakpointRun::Ended { stop } => {
                self.at = at;
                Ok(stop.map(Stop::Ended))
            }
        }
    }

    /// Finds the exact position of a hit at `address` after exit `exit`,
    /// of a run from `from` (where a checkpoint is kept): from there,
    /// replayed to the exit and stepped to the address; a checkpoint is
    /// kept at the hit. (A checkpoint kept later, at a hit found before,
    /// is past this one.)
    fn locate(&mut self, address: u64, exit: u64, from: InsnPosition) -> Result<()> {
        let kept = self.kept_before(from);
        // The run stands at the hit with its step unknown: a reset first.
        self.reset_to(kept)?;
        self.reach_exit(InsnPosition { exit, steps: 0 }.max(kept.at))?;
        let run = self.run;
        let (at, reached) = self.calls().step_to(run, address, MAX_INSN_STEPS)?;
        self.at = at;
        if !reached || at.exits != exit {
            return Err(TimelineError::HitNotLocated { address, exit });
        }
        self.keep()
    }

    fn watch_list(&self) -> Vec<Watch> {
        self.watches
            .iter()
            .map(|&(address, len)| Watch { address, len })
            .collect()
    }

    /// Finds the exact position of a watched range's change, seen after
    /// exit `exit` of a run from `from`: the interval before that exit is
    /// replayed and stepped until the bytes differ; where stepping reaches
    /// the exit unchanged, the exit's handling wrote them (a device), and
    /// the position is after it. A checkpoint is kept there.
    fn locate_change(&mut self, exit: u64, from: InsnPosition) -> Result<()> {
        let kept = self.kept_before(from);
        self.reset_to(kept)?;
        let interval = InsnPosition {
            exit: exit.saturating_sub(1),
            steps: 0,
        };
        self.reach_exit(interval.max(kept.at))?;
        let run = self.run;
        let watches = self.watch_list();
        let (at, _) = self.calls().step_to_change(run, watches, MAX_INSN_STEPS)?;
        self.at = at;
        if at.exits != exit && at.exits + 1 != exit {
            return Err(TimelineError::NotReached {
                target: InsnPosition { exit, steps: 0 },
                reached: self.here(),
                stop: at.stop,
            });
        }
        self.keep()
    }

    /// One instruction back.
    pub fn reverse_step(&mut self) -> Result<Stop> {
        let here = self.here();
        if here <= self.start.at {
            return Ok(Stop::Start);
        }
        if here.steps > 0 {
            self.goto(InsnPosition {
                exit: here.exit,
                steps: here.steps - 1,
            })?;
            return Ok(Stop::Step);
        }
        // The last boundary of the interval before: its length is counted
        // by stepping it whole (to this exit), then reached again.
        let from = InsnPosition {
            exit: here.exit - 1,
            steps: 0,
        }
        .max(self.start.at);
        self.goto(from)?;
        let run = self.run;
        let (at, stepped, _) = self.calls().step_insns(run, MAX_INSN_STEPS, true)?;
        self.at = at;
        if at.exits != here.exit {
            return Err(TimelineError::NotReached {
                target: here,
                reached: self.here(),
                stop: at.stop,
            });
        }
        self.goto(InsnPosition {
            exit: from.exit,
            steps: from.steps + stepped,
        })?;
        Ok(Stop::Step)
    }

    /// Back to the last breakpoint hit or watched change before the
    /// present (found by replaying from the start with them set), or to
    /// the start when there is none.
    pub fn reverse_cont(&mut self) -> Result<Stop> {
        let target = self.here();
        let start = self.start;
        self.reset_to(start)?;
        let mut last = None;
        loop {
            let until = Until::Exit(target.exit + 1);
            match self.run_chunk(until)? {
                Some(Stop::Breakpoint(address)) if self.here() < target => {
                    last = Some((self.here(), Stop::Breakpoint(address)));
                    // Past it, to look for the next.
                    let run = self.run;
                    let (at, _, _) = self.calls().step_insns(run, 1, false)?;
                    self.at = at;
                    if at.stop.is_some() {
                        break;
                    }
                }
                Some(Stop::Watch(address)) if self.here() < target => {
                    last = Some((self.here(), Stop::Watch(address)));
                }
                Some(Stop::Breakpoint(_)) | Some(Stop::Watch(_)) | Some(Stop::Ended(_)) => break,
                Some(_) => break,
                None if self.at.exits > target.exit => break,
                None => continue,
            }
        }
        match last {
            Some((at, stop)) => {
                self.goto(at)?;
                Ok(stop)
            }
            None => {
                self.reset_to(start)?;
                Ok(Stop::Start)
            }
        }
    }

    /// Lets the run go.
    pub fn close(mut self) -> Result<()> {
        let run = self.run;
        self.calls().close(run)?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "timeline_tests.rs"]
mod tests;
