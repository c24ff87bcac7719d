//! Virtual time. Only this module knows how time advances.
//!
//! The guest cannot observe host time: every clock it reads (HPET, PM timer,
//! RTC) is computed from the `VirtNanos` kept here. The exit clock advances by
//! a fixed cost per guest-caused exit and, when the guest halts with nothing to
//! do, jumps straight to the next timer deadline. The step clock advances
//! by a fixed cost per single-stepped instruction instead (the session
//! steps every instruction, see `vm/step_clock.rs`). Which one a machine
//! has is [`Clock`]; the devices see only `now`.

use devices::{ClockKind, VirtNanos};
use devices::{Persist, RestoreError};
use serde::{Deserialize, Serialize};

/// What kind of event moved the vCPU out of guest mode, as far as time is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimedExit {
    /// A port or MMIO access, an MSR access, an interrupt window: the guest ran
    /// some instructions and then touched the machine.
    Access,
    /// HLT: the guest waits for an interrupt.
    Halt,
}

pub trait VirtualClock {
    fn now(&self) -> VirtNanos;
    /// Accounts for one guest-caused exit.
    fn on_exit(&mut self, exit: TimedExit);
    /// Jumps forward to `deadline` (never backwards): used when the guest idles.
    fn advance_to(&mut self, deadline: VirtNanos);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClockState {
    pub now: VirtNanos,
    /// Absent for the exit clock, so its states (and every digest and
    /// snapshot made with it) read and hash as before the other clocks.
    #[serde(default, skip_serializing_if = "ClockKind::is_exit")]
    pub kind: ClockKind,
}

/// Every guest-caused exit costs this much virtual time. It stands for the
/// guest instructions executed since the previous exit, which this clock
/// cannot count; any fixed value is deterministic. 200 ns is 20 ticks of the
/// 100 MHz HPET: small enough that Linux's HPET next-event check (counter
/// read, comparator write, counter read must leave >= 128 of its minimum 192
/// ticks) passes, large enough that polling loops progress quickly.
pub const EXIT_COST: VirtNanos = VirtNanos(200);

/// The clock that advances by a fixed cost per exit and jumps on idle.
#[derive(Clone, Debug, Default)]
pub struct ExitClock {
    now: VirtNanos,
}

impl ExitClock {
    pub fn new() -> Self {
        ExitClock::default()
    }
}

impl VirtualClock for ExitClock {
    fn now(&self) -> VirtNanos {
        self.now
    }

    fn on_exit(&mut self, _exit: TimedExit) {
        // A halt costs the same as any exit: the jump to the next deadline is
        // made separately, by the run loop, only when nothing is pending.
        self.now = self.now.saturating_add(EXIT_COST);
    }

    fn advance_to(&mut self, deadline: VirtNanos) {
        self.now = self.now.max(deadline);
    }
}

/// Virtual time per single-stepped instruction: a machine that retires
/// one instruction a nanosecond (a REP iteration, which single-stepping
/// counts as one step, counts as one instruction).
pub const STEP_COST: VirtNanos = VirtNanos(1);

/// The clock that advances by [`STEP_COST`] per counted instruction and
/// jumps on idle. Exits cost nothing of their own: the exiting
/// instruction is one of the counted steps.
#[derive(Clone, Debug, Default)]
pub struct StepClock {
    now: VirtNanos,
}

impl StepClock {
    /// Accounts for `steps` instructions the guest ran.
    pub fn on_steps(&mut self, steps: u64) {
        self.now = self
            .now
            .saturating_add(VirtNanos(steps.saturating_mul(STEP_COST.0)));
    }
}

impl VirtualClock for StepClock {
    fn now(&self) -> VirtNanos {
        self.now
    }

    fn on_exit(&mut self, _exit: TimedExit) {}

    fn advance_to(&mut self, deadline: VirtNanos) {
        self.now = self.now.max(deadline);
    }
}

/// A machine's clock: one of the backends.
#[derive(Clone, Debug)]
pub enum Clock {
    Exit(ExitClock),
    Step(StepClock),
}

/// Why a machine cannot have the clock asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    #[error(
        "the pmu clock needs a usable hardware counter of guest retired instructions, \
         and this build drives none (`detvisor check` says what this host offers)"
    )]
    PmuNotDriven,
}

impl Clock {
    pub fn new(kind: ClockKind) -> Result<Clock, ClockError> {
        match kind {
            ClockKind::Exit => Ok(Clock::Exit(ExitClock::new())),
            ClockKind::Step => Ok(Clock::Step(StepClock::default())),
            ClockKind::Pmu => Err(ClockError::PmuNotDriven),
        }
    }

    pub fn kind(&self) -> ClockKind {
        match self {
            Clock::Exit(_) => ClockKind::Exit,
            Clock::Step(_) => ClockKind::Step,
        }
    }

    /// Accounts for `steps` single-stepped instructions: virtual time
    /// under the step clock, nothing under the exit clock (there stepping
    /// is observation).
    pub fn on_steps(&mut self, steps: u64) {
        if let Clock::Step(clock) = self {
            clock.on_steps(steps);
        }
    }

    fn inner(&self) -> &dyn VirtualClock {
        match self {
            Clock::Exit(clock) => clock,
            Clock::Step(clock) => clock,
        }
    }

    fn inner_mut(&mut self) -> &mut dyn VirtualClock {
        match self {
            Clock::Exit(clock) => clock,
            Clock::Step(clock) => clock,
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::Exit(ExitClock::new())
    }
}

impl VirtualClock for Clock {
    fn now(&self) -> VirtNanos {
        self.inner().now()
    }

    fn on_exit(&mut self, exit: TimedExit) {
        self.inner_mut().on_exit(exit);
    }

    fn advance_to(&mut self, deadline: VirtNanos) {
        self.inner_mut().advance_to(deadline);
    }
}

impl Persist for Clock {
    type State = ClockState;

    fn save(&self) -> ClockState {
        ClockState {
            now: self.now(),
            kind: self.kind(),
        }
    }

    /// Refused across backends: a state made by one clock is not a moment
    /// of a history of another.
    fn restore(&mut self, state: &ClockState) -> Result<(), RestoreError> {
        if state.kind != self.kind() {
            return Err(RestoreError::ClockKind {
                saved: state.kind,
                machine: self.kind(),
            });
        }
        match self {
            Clock::Exit(clock) => clock.now = state.now,
            Clock::Step(clock) => clock.now = state.now,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_each_exit_costs_fixed_time() {
        let mut clock = ExitClock::new();
        clock.on_exit(TimedExit::Access);
        clock.on_exit(TimedExit::Halt);
        assert_eq!(clock.now(), VirtNanos(2 * EXIT_COST.0));
    }

    #[test]
    fn test_advance_to_never_goes_backwards() {
        let mut clock = ExitClock::new();
        clock.advance_to(VirtNanos::from_secs(5));
        clock.advance_to(VirtNanos::from_secs(1));
        assert_eq!(clock.now(), VirtNanos::from_secs(5));
    }

    #[test]
    fn test_the_step_clock_counts_instructions_and_not_exits() {
        let mut clock = Clock::new(ClockKind::Step).unwrap();
        clock.on_exit(TimedExit::Access);
        clock.on_steps(1500);
        assert_eq!(clock.now(), VirtNanos(1500 * STEP_COST.0));
        clock.advance_to(VirtNanos::from_micros(3));
        clock.on_steps(1);
        assert_eq!(clock.now(), VirtNanos(3001));
        // Under the exit clock a step is observation.
        let mut exit = Clock::default();
        exit.on_steps(1500);
        assert_eq!(exit.now(), VirtNanos::ZERO);
    }

    #[test]
    fn test_a_state_keeps_its_clock_and_another_clock_refuses_it() {
        let mut step = Clock::new(ClockKind::Step).unwrap();
        step.on_steps(7);
        let state = step.save();
        assert_eq!(
            serde_json::to_string(&state).unwrap(),
            r#"{"now":7,"kind":"step"}"#
        );
        // The exit clock's state reads as it always did.
        let exit_state = Clock::default().save();
        assert_eq!(serde_json::to_string(&exit_state).unwrap(), r#"{"now":0}"#);
        let err = Clock::default().restore(&state).unwrap_err().to_string();
        assert!(
            err.contains("made with the step clock, this machine has the exit clock"),
            "{err}"
        );
        assert!(Clock::new(ClockKind::Step)
            .unwrap()
            .restore(&exit_state)
            .is_err());
        assert_eq!(
            Clock::new(ClockKind::Pmu).unwrap_err(),
            ClockError::PmuNotDriven
        );
    }

    fn advanced(kind: ClockKind, nanos: u64) -> Clock {
        let mut clock = Clock::new(kind).unwrap();
        clock.advance_to(VirtNanos(nanos));
        clock
    }

    devices::persist_round_trip_tests! {
        mod clock_persist {
            fresh: Clock::default(),
            saved: advanced(ClockKind::Exit, 1234),
            mutate: |clock: &mut Clock| clock.on_exit(TimedExit::Access),
        }
    }

    devices::persist_round_trip_tests! {
        mod step_clock_persist {
            fresh: Clock::new(ClockKind::Step).unwrap(),
            saved: advanced(ClockKind::Step, 1234),
            mutate: |clock: &mut Clock| clock.on_steps(3),
        }
    }
}
