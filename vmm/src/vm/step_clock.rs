//! Running a session under the step clock ([`crate::clock::StepClock`]):
//! every instruction is single-stepped and costs [`crate::clock::STEP_COST`]
//! of virtual time, so guest computation moves the clock and a CPU-bound
//! guest is preempted on an exact instruction.
//!
//! The stepping is `insn_steps`' (the same mending of the trap flag, the
//! same handling of the exits met), with two differences, both there:
//! a step advances the clock (an exit met counts as its instruction's
//! step), and a device deadline the clock has reached asks for an
//! interrupt window, so the stepper takes an exit at the first boundary
//! where the guest can take an interrupt (IF=1, not after an `STI` byte).
//! That exit (kind `IrqWindowOpen`) fires the devices and injects, and is
//! counted and recorded like any other: positions stay (exit, steps since
//! it), and the history is a function of the seed alone.
//!
//! A time limit ends the run at the first instruction boundary at or after
//! it, which may be between two exits (`exit:N+insn:K`).

use super::stepping::set_single_step;
use super::{Session, StepRefusal, VmError};
use crate::exit::{ExitAction, StopReason};
use devices::{ClockKind, VirtNanos};

impl Session {
    /// Whether virtual time moves with counted instructions.
    pub(super) fn step_clocked(&self) -> bool {
        self.machine.clock.kind() == ClockKind::Step
    }

    /// The earliest deadline of a device or an `up` run's wake-up.
    pub(super) fn next_wake(&self) -> Option<VirtNanos> {
        [self.machine.devices.next_deadline(), self.machine.wakeup]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether a deadline (a device's, or an `up` run's wake-up) is due at
    /// the present instruction boundary under a counting clock (step or pmu).
    pub(super) fn counted_deadline_due(&self) -> bool {
        self.machine.clock.kind() != ClockKind::Exit
            && self.next_wake().is_some_and(|at| at <= self.machine.now())
    }

    /// Steps, counting, to the guest's next exit (handled, `Some`), or to
    /// the first boundary at or after `time` (`None`, single-stepping
    /// turned off).
    pub(super) fn step_counted(
        &mut self,
        time: Option<VirtNanos>,
    ) -> Result<Option<ExitAction>, VmError> {
        loop {
            if let Some(stop) = self.before_entry()? {
                return Ok(Some(ExitAction::Stop(stop)));
            }
            if time.is_some_and(|limit| self.machine.now() >= limit) {
                self.stall.take_signal();
                set_single_step(&self.vm.vcpu, false)?;
                return Ok(None);
            }
            match self.step_insn()? {
                Ok(None) => {}
                Ok(Some(action)) => return Ok(Some(action)),
                Err(refusal) => return self.end_stepping(refusal),
            }
        }
    }

    /// Ends a counting clock's stepping at a refusal, single-stepping
    /// turned off: a stop met inside the stepper's own entry check (a limit,
    /// a seccomp violation) is the run's stop; any other refusal is the
    /// error, naming the position.
    pub(super) fn end_stepping(
        &mut self,
        refusal: StepRefusal,
    ) -> Result<Option<ExitAction>, VmError> {
        set_single_step(&self.vm.vcpu, false)?;
        match refusal {
            StepRefusal::Stopped { reason } => Ok(Some(ExitAction::Stop(reason))),
            reason => Err(VmError::Step {
                at: self.insn_position(),
                reason,
            }),
        }
    }

    /// One exit's worth of the run under whichever clock the machine has
    /// (`None`: stopped at `time` between two exits, counting clocks only).
    pub(super) fn step_toward(
        &mut self,
        time: Option<VirtNanos>,
    ) -> Result<Option<ExitAction>, VmError> {
        match self.machine.clock.kind() {
            ClockKind::Step => self.step_counted(time),
            ClockKind::Pmu => self.step_pmu(time),
            ClockKind::Exit => self.step_exit(),
        }
    }
}

/// The stop a step toward a limit ended with, if it ended with one.
pub(super) fn stopped(action: Option<ExitAction>) -> Option<StopReason> {
    match action {
        Some(ExitAction::Stop(reason)) => Some(reason),
        _ => None,
    }
}
