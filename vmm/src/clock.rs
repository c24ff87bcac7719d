//! Virtual time. Only this module knows how time advances.
//!
//! The guest cannot observe host time: every clock it reads (HPET, PM timer,
//! RTC) is computed from the `VirtNanos` kept here. The exit clock advances by
//! a fixed cost per guest-caused exit and, when the guest halts with nothing to
//! do, jumps straight to the next timer deadline. It is a trait so that an
//! instruction-counted clock can replace it without touching the devices.

use devices::VirtNanos;
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

impl Persist for ExitClock {
    type State = ClockState;

    fn save(&self) -> ClockState {
        ClockState { now: self.now }
    }

    fn restore(&mut self, state: &ClockState) -> Result<(), RestoreError> {
        self.now = state.now;
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

    fn advanced(nanos: u64) -> ExitClock {
        let mut clock = ExitClock::new();
        clock.advance_to(VirtNanos(nanos));
        clock
    }

    devices::persist_round_trip_tests! {
        mod clock_persist {
            fresh: ExitClock::new(),
            saved: advanced(1234),
            mutate: |clock: &mut ExitClock| clock.on_exit(TimedExit::Access),
        }
    }
}
