//! A counter emulated by single steps, for running the `pmu` clock's
//! machinery on real KVM where no PMU exists (every machine here).
//!
//! It counts the instructions the session single-steps (one event each,
//! [`CountedEvent::EmulatedSteps`]). A "free run" is emulated too: the
//! session steps until the overflow fires, and the overflow fires late, by
//! a skid of up to [`EMULATED_SKID`] events drawn from a fixed pattern, as
//! a hardware counter's interrupt lands late. So the session's pmu loop
//! (overflow set short of the target by the margin, the rest stepped to the
//! exact count, time taken from the count, the interrupt placed at the
//! count) runs on a real guest, and must land every deadline where the
//! step clock lands it. It is as slow as the step clock, and it proves
//! nothing about a hardware counter's own behaviour.

use super::{CountedEvent, GuestEventCounter, PmuCounter};

/// The most an emulated overflow lands after its count.
pub const EMULATED_SKID: u64 = 48;
/// The margin the session keeps: at least the skid.
pub const EMULATED_MARGIN: u64 = 64;

/// See the module.
#[derive(Debug, Clone)]
pub struct EmulatedCounter {
    count: u64,
    /// The count at which the armed overflow fires (its skid included).
    fires_at: Option<u64>,
    /// The skid pattern's state: a fixed sequence, so runs repeat.
    pattern: u64,
}

impl Default for EmulatedCounter {
    fn default() -> Self {
        EmulatedCounter {
            count: 0,
            fires_at: None,
            pattern: 0x9e37_79b9_7f4a_7c15,
        }
    }
}

impl GuestEventCounter for EmulatedCounter {
    fn read(&mut self) -> u64 {
        self.count
    }

    fn set(&mut self, count: u64) {
        self.count = count;
    }

    fn arm_overflow(&mut self, after: Option<u64>) {
        self.fires_at = after.map(|after| {
            self.pattern = self.pattern.rotate_left(13) ^ 0x5bd1_e995;
            self.count
                .saturating_add(after)
                .saturating_add(self.pattern % (EMULATED_SKID + 1))
        });
    }
}

impl PmuCounter for EmulatedCounter {
    fn event(&self) -> CountedEvent {
        CountedEvent::EmulatedSteps
    }

    fn skid_margin(&self) -> u64 {
        EMULATED_MARGIN
    }

    fn counts_this_thread(&self) -> bool {
        true
    }

    fn on_single_step(&mut self) {
        self.count += 1;
    }

    fn emulates_free_runs(&self) -> bool {
        true
    }

    fn overflowed(&self) -> bool {
        self.fires_at.is_some_and(|at| self.count >= at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overflow_fires_within_the_skid_and_not_before() {
        let mut counter = EmulatedCounter::default();
        let mut lates = Vec::new();
        for _ in 0..64 {
            counter.arm_overflow(Some(100));
            let armed_at = counter.read();
            while !counter.overflowed() {
                counter.on_single_step();
            }
            let late = counter.read() - armed_at - 100;
            assert!(late <= EMULATED_SKID, "{late}");
            lates.push(late);
        }
        // It does skid, by varying amounts.
        lates.sort_unstable();
        lates.dedup();
        assert!(lates.len() > 8, "{lates:?}");
        counter.arm_overflow(None);
        assert!(!counter.overflowed());
    }

    #[test]
    fn set_puts_a_saved_count_back() {
        let mut counter = EmulatedCounter::default();
        counter.on_single_step();
        counter.set(70_000);
        assert_eq!(counter.read(), 70_000);
    }
}
