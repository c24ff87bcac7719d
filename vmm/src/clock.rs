//! Virtual time. Only this module knows how time advances.
//!
//! The guest cannot observe host time: every clock it reads (HPET, PM timer,
//! RTC) is computed from the `VirtNanos` kept here. The exit clock advances by
//! a fixed cost per guest-caused exit and, when the guest halts with nothing to
//! do, jumps straight to the next timer deadline. The step clock advances
//! by a fixed cost per single-stepped instruction instead (the session
//! steps every instruction, see `vm/step_clock.rs`). Which one a machine
//! has is [`Clock`]; the devices see only `now`.

use crate::pmu_clock::perf::PmuUnavailable;
use crate::pmu_clock::{open_counter, CountedEvent, PmuCounter, PmuCounterChoice};
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
    /// The pmu clock's: what it counts, and the count at `now`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<CountedEvent>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub counted: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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

/// Virtual time per counted event under the pmu clock: a nominal machine
/// that retires one counted event a nanosecond. With conditional branches
/// (about one instruction in five to ten) time runs slower than the step
/// clock's per instruction; any fixed rate is deterministic.
pub const PMU_EVENT_COST: VirtNanos = VirtNanos(1);

/// The clock that advances by [`PMU_EVENT_COST`] per event a counter
/// counted (the session hands it the count at every stop) and jumps on
/// idle. Exits cost nothing of their own.
#[derive(Clone, Debug)]
pub struct PmuClock {
    now: VirtNanos,
    event: CountedEvent,
    /// The count `now` includes.
    counted: u64,
}

impl PmuClock {
    pub fn new(event: CountedEvent) -> Self {
        PmuClock {
            now: VirtNanos::ZERO,
            event,
            counted: 0,
        }
    }

    pub fn event(&self) -> CountedEvent {
        self.event
    }

    /// The history's count so far.
    pub fn counted(&self) -> u64 {
        self.counted
    }

    /// The counter reads `count`: the events since the last count move
    /// time (a count that went backwards moves nothing).
    pub fn on_count(&mut self, count: u64) {
        let events = count.saturating_sub(self.counted);
        self.counted = self.counted.max(count);
        self.now = self
            .now
            .saturating_add(VirtNanos(events.saturating_mul(PMU_EVENT_COST.0)));
    }

    /// The count at which the clock first reads `at` or later.
    pub fn count_at(&self, at: VirtNanos) -> u64 {
        let nanos = at.0.saturating_sub(self.now.0);
        self.counted
            .saturating_add(nanos.div_ceil(PMU_EVENT_COST.0.max(1)))
    }
}

impl VirtualClock for PmuClock {
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
    Pmu(PmuClock),
}

/// Why a machine cannot have the clock asked for.
#[derive(Debug, thiserror::Error)]
pub enum ClockError {
    #[error("the pmu clock counts with a counter: it is made with one (`Clock::open`)")]
    NeedsCounter,
    #[error("the pmu clock cannot run here (`detvisor check` says what this host offers)")]
    PmuUnavailable(#[from] PmuUnavailable),
}

impl Clock {
    /// The exit or step clock (the pmu clock needs its counter: [`Clock::open`]).
    pub fn new(kind: ClockKind) -> Result<Clock, ClockError> {
        match kind {
            ClockKind::Exit => Ok(Clock::Exit(ExitClock::new())),
            ClockKind::Step => Ok(Clock::Step(StepClock::default())),
            ClockKind::Pmu => Err(ClockError::NeedsCounter),
        }
    }

    /// A machine's clock of `kind` and, for the pmu clock, the counter it
    /// counts with, opened on this thread: of `event` (a restored
    /// history's) or the best `choice` gives.
    pub fn open(
        kind: ClockKind,
        choice: PmuCounterChoice,
        event: Option<CountedEvent>,
    ) -> Result<(Clock, Option<Box<dyn PmuCounter>>), ClockError> {
        if kind != ClockKind::Pmu {
            return Ok((Clock::new(kind)?, None));
        }
        let counter = open_counter(choice, event)?;
        Ok((Clock::Pmu(PmuClock::new(counter.event())), Some(counter)))
    }

    pub fn kind(&self) -> ClockKind {
        match self {
            Clock::Exit(_) => ClockKind::Exit,
            Clock::Step(_) => ClockKind::Step,
            Clock::Pmu(_) => ClockKind::Pmu,
        }
    }

    /// The pmu clock, if this is one.
    pub fn pmu(&self) -> Option<&PmuClock> {
        match self {
            Clock::Pmu(clock) => Some(clock),
            _ => None,
        }
    }

    pub fn pmu_mut(&mut self) -> Option<&mut PmuClock> {
        match self {
            Clock::Pmu(clock) => Some(clock),
            _ => None,
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
            Clock::Pmu(clock) => clock,
        }
    }

    fn inner_mut(&mut self) -> &mut dyn VirtualClock {
        match self {
            Clock::Exit(clock) => clock,
            Clock::Step(clock) => clock,
            Clock::Pmu(clock) => clock,
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
            event: self.pmu().map(PmuClock::event),
            counted: self.pmu().map_or(0, PmuClock::counted),
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
            Clock::Pmu(clock) => {
                if state.event != Some(clock.event) {
                    return Err(RestoreError::Incompatible {
                        part: "pmu clock",
                        reason: format!(
                            "its history counted {}, this machine's counter counts {}",
                            state.event.map_or("nothing".to_string(), |e| e.to_string()),
                            clock.event
                        ),
                    });
                }
                clock.now = state.now;
                clock.counted = state.counted;
            }
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
        assert!(matches!(
            Clock::new(ClockKind::Pmu),
            Err(ClockError::NeedsCounter)
        ));
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

    #[test]
    fn test_the_pmu_clock_moves_with_the_count_and_finds_a_deadline_count() {
        let mut clock = Clock::Pmu(PmuClock::new(CountedEvent::EmulatedSteps));
        clock.on_exit(TimedExit::Access);
        clock.on_steps(100);
        assert_eq!(clock.now(), VirtNanos::ZERO);
        let pmu = clock.pmu_mut().unwrap();
        pmu.on_count(1500);
        assert_eq!(pmu.now(), VirtNanos(1500 * PMU_EVENT_COST.0));
        // An idle jump moves time, not the count.
        pmu.advance_to(VirtNanos::from_micros(3));
        assert_eq!(pmu.counted(), 1500);
        assert_eq!(pmu.count_at(VirtNanos(3100)), 1600);
        assert_eq!(pmu.count_at(VirtNanos(10)), 1500);
        pmu.on_count(1600);
        assert_eq!(pmu.now(), VirtNanos(3100));
        let state = clock.save();
        assert_eq!(
            serde_json::to_string(&state).unwrap(),
            r#"{"now":3100,"kind":"pmu","event":"emulated_steps","counted":1600}"#
        );
        let mut other = Clock::Pmu(PmuClock::new(CountedEvent::RetiredConditionalBranches));
        let err = other.restore(&state).unwrap_err().to_string();
        assert!(
            err.contains("counted emulated single steps, this machine's counter counts retired conditional branches"),
            "{err}"
        );
    }

    fn counted(count: u64) -> Clock {
        let mut clock = Clock::Pmu(PmuClock::new(CountedEvent::RetiredConditionalBranches));
        if let Some(pmu) = clock.pmu_mut() {
            pmu.on_count(count);
        }
        clock
    }

    devices::persist_round_trip_tests! {
        mod pmu_clock_persist {
            fresh: counted(0),
            saved: counted(1234),
            mutate: |clock: &mut Clock| if let Some(pmu) = clock.pmu_mut() { pmu.on_count(2000) },
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
