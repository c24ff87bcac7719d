//! The `pmu` clock's logic: reaching an exact count of guest retired
//! instructions with a hardware counter that stops the guest late.
//!
//! A perf counter's overflow interrupt arrives some instructions after the
//! count it was programmed for (its skid). So, as rr and Hermit do, the
//! overflow is programmed `skid_margin` events before the target, the guest
//! runs free until it fires, and the rest is single-stepped, one counted
//! instruction at a time, to the exact count. A counter that overshoots
//! the target anyway skids more than the margin allows: it is refused, not
//! believed. The counter is the history's: a restore sets it back to the
//! count the state was saved at.
//!
//! The logic here touches neither KVM nor perf: the counter and the vCPU
//! come in through [`GuestEventCounter`] and [`CountedVcpu`] (one object:
//! the vCPU thread owns both), so it is tested against a fake counter with
//! a configurable skid. The session drives it (`vm/pmu_run.rs`) with one
//! of two counters ([`PmuCounter`]): a hardware one ([`perf::PerfCounter`])
//! or one emulated by single steps ([`emulated::EmulatedCounter`]), which
//! runs the same loop on real KVM where no PMU exists (every machine here:
//! see docs/determinism.md).

pub mod emulated;
pub mod perf;

use serde::{Deserialize, Serialize};

/// A counter of guest-only events (retired instructions) on the vCPU thread.
pub trait GuestEventCounter {
    /// Events counted so far.
    fn read(&mut self) -> u64;
    /// Sets the count (a restore puts the history's count back).
    fn set(&mut self, count: u64);
    /// Interrupts the guest once `after` more events are counted (`None`:
    /// no interrupt).
    fn arm_overflow(&mut self, after: Option<u64>);
}

/// What a `pmu` clock counts. A history keeps one: its saved clock names
/// it, and a restore with another is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountedEvent {
    /// Guest-only retired conditional branches (rr's event: exact).
    RetiredConditionalBranches,
    /// Guest-only retired instructions (where no branch event is known).
    RetiredInstructions,
    /// Instructions the session single-stepped ([`emulated`]).
    EmulatedSteps,
}

impl std::fmt::Display for CountedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CountedEvent::RetiredConditionalBranches => "retired conditional branches",
            CountedEvent::RetiredInstructions => "retired instructions",
            CountedEvent::EmulatedSteps => "emulated single steps",
        })
    }
}

/// Which counter a fresh `pmu` run counts with (a restored one counts the
/// event its history counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PmuCounterChoice {
    /// The host's PMU (`detvisor check` says whether it has a usable one).
    #[default]
    Hardware,
    /// Single steps with an emulated skid: the pmu loop on hosts without
    /// a PMU, for tests (as slow as the step clock).
    Emulated,
}

impl PmuCounterChoice {
    pub fn is_hardware(&self) -> bool {
        *self == PmuCounterChoice::Hardware
    }
}

impl std::fmt::Display for PmuCounterChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PmuCounterChoice::Hardware => "hardware",
            PmuCounterChoice::Emulated => "emulated",
        })
    }
}

impl std::str::FromStr for PmuCounterChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hardware" => Ok(PmuCounterChoice::Hardware),
            "emulated" => Ok(PmuCounterChoice::Emulated),
            other => Err(format!(
                "unknown pmu counter {other:?} (hardware or emulated)"
            )),
        }
    }
}

/// The counter a session's `pmu` clock counts with.
pub trait PmuCounter: GuestEventCounter + Send + std::fmt::Debug {
    fn event(&self) -> CountedEvent;
    /// How far short of a target its overflow is set.
    fn skid_margin(&self) -> u64;
    /// Whether it counts the calling thread (a hardware counter counts the
    /// thread that opened it: a session run from another is given a new one).
    fn counts_this_thread(&self) -> bool;
    /// One instruction was single-stepped (a hardware counter counted it
    /// itself).
    fn on_single_step(&mut self) {}
    /// Whether a free run is emulated by single steps until [`Self::overflowed`].
    fn emulates_free_runs(&self) -> bool {
        false
    }
    fn overflowed(&self) -> bool {
        false
    }
    /// What went wrong with the counter since the last call, if anything.
    fn take_error(&mut self) -> Option<String> {
        None
    }
}

/// Opens the counter of `event` (a restored history's), or `choice`'s best.
pub fn open_counter(
    choice: PmuCounterChoice,
    event: Option<CountedEvent>,
) -> Result<Box<dyn PmuCounter>, perf::PmuUnavailable> {
    match (event, choice) {
        (Some(CountedEvent::EmulatedSteps), _) | (None, PmuCounterChoice::Emulated) => {
            Ok(Box::new(emulated::EmulatedCounter::default()))
        }
        (event, _) => Ok(Box::new(perf::PerfCounter::open(event)?)),
    }
}

/// How a run of the guest ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VcpuStop {
    /// The counter's overflow interrupt (free run) or the single step's
    /// trap (stepping): the guest only stopped.
    Counted,
    /// A guest-caused exit: the exit loop handles it.
    Exit,
}

/// The vCPU as the counter's driver sees it.
pub trait CountedVcpu {
    /// Runs the guest until the counter's overflow or an exit.
    fn run(&mut self) -> VcpuStop;
    /// Runs one instruction (or until the exit it makes).
    fn step(&mut self) -> VcpuStop;
}

/// Where [`run_to_count`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reached {
    /// Exactly at the target count.
    Target,
    /// At a guest exit before it, with this count.
    Exit { count: u64 },
}

/// The counter cannot be trusted to reach a count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PmuError {
    #[error(
        "the counter overshot its target: {counted} events where the overflow was set to \
         stop at most {margin} before {target} (it skids more than the margin: refused)"
    )]
    Overshot {
        target: u64,
        counted: u64,
        margin: u64,
    },
    #[error("the counter went backwards, from {was} to {now}")]
    Backwards { was: u64, now: u64 },
}

/// The counter's count in a saved state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmuCountState {
    pub count: u64,
}

/// Runs the guest to exactly `target` counted events, or to its first
/// exit before them: free with the overflow set `skid_margin` short, then
/// one step at a time.
pub fn run_to_count<G: GuestEventCounter + CountedVcpu>(
    guest: &mut G,
    target: u64,
    skid_margin: u64,
) -> Result<Reached, PmuError> {
    let mut last = guest.read();
    loop {
        if last == target {
            guest.arm_overflow(None);
            return Ok(Reached::Target);
        }
        if last > target {
            guest.arm_overflow(None);
            return Err(PmuError::Overshot {
                target,
                counted: last,
                margin: skid_margin,
            });
        }
        let remaining = target - last;
        let ran_free = remaining > skid_margin;
        let stop = if ran_free {
            guest.arm_overflow(Some(remaining - skid_margin));
            guest.run()
        } else {
            guest.arm_overflow(None);
            guest.step()
        };
        let now = guest.read();
        if now < last {
            return Err(PmuError::Backwards { was: last, now });
        }
        // A free run must stop short of the target: many boundaries share
        // one count (a counter of branches), and only stepping stops at
        // the first of them; an exit at the target's count ran past it.
        if ran_free && now >= target {
            guest.arm_overflow(None);
            return Err(PmuError::Overshot {
                target,
                counted: now,
                margin: skid_margin,
            });
        }
        last = now;
        if stop == VcpuStop::Exit && last < target {
            guest.arm_overflow(None);
            return Ok(Reached::Exit { count: last });
        }
    }
}

/// The state of a counter to save with a snapshot.
pub fn save_count(counter: &mut impl GuestEventCounter) -> PmuCountState {
    PmuCountState {
        count: counter.read(),
    }
}

/// Puts a saved count back (after a restore, before the guest runs).
pub fn restore_count(counter: &mut impl GuestEventCounter, state: &PmuCountState) {
    counter.set(state.count);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A guest that retires one instruction per step, exits at the
    /// instructions listed, and a counter whose overflow lands up to
    /// `skid` instructions late (a fixed pattern, so runs repeat).
    struct FakeMachine {
        retired: u64,
        exits_at: Vec<u64>,
        overflow_at: Option<u64>,
        skid: u64,
        skid_pattern: u64,
        /// What `set` added to the guest's own count (the counter's view).
        offset: i128,
        free_runs: u32,
        steps: u32,
    }

    impl FakeMachine {
        fn new(skid: u64, exits_at: Vec<u64>) -> Self {
            FakeMachine {
                retired: 0,
                exits_at,
                overflow_at: None,
                skid,
                skid_pattern: 0x9e37_79b9,
                offset: 0,
                free_runs: 0,
                steps: 0,
            }
        }

        fn counted(&self) -> u64 {
            (i128::from(self.retired) + self.offset) as u64
        }

        /// The next exit at or after the present instruction.
        fn next_exit(&self) -> Option<u64> {
            self.exits_at.iter().copied().find(|&at| at > self.retired)
        }
    }

    impl GuestEventCounter for FakeMachine {
        fn read(&mut self) -> u64 {
            self.counted()
        }

        fn set(&mut self, count: u64) {
            self.offset = i128::from(count) - i128::from(self.retired);
        }

        fn arm_overflow(&mut self, after: Option<u64>) {
            self.overflow_at = after.map(|n| self.counted() + n);
        }
    }

    impl CountedVcpu for FakeMachine {
        fn run(&mut self) -> VcpuStop {
            self.free_runs += 1;
            let overflow = self.overflow_at.expect("a free run has its overflow armed");
            // The interrupt lands 0..=skid instructions after the count.
            self.skid_pattern = self.skid_pattern.rotate_left(7) ^ 0x5bd1_e995;
            let late = self.skid_pattern % (self.skid + 1);
            let stop_counted = overflow + late;
            let stop_retired = (i128::from(stop_counted) - self.offset) as u64;
            match self.next_exit() {
                Some(exit) if exit <= stop_retired => {
                    self.retired = exit;
                    VcpuStop::Exit
                }
                _ => {
                    self.retired = stop_retired;
                    VcpuStop::Counted
                }
            }
        }

        fn step(&mut self) -> VcpuStop {
            self.steps += 1;
            self.retired += 1;
            if self.exits_at.contains(&self.retired) {
                VcpuStop::Exit
            } else {
                VcpuStop::Counted
            }
        }
    }

    proptest! {
        /// With a margin beyond the skid, every target is reached exactly,
        /// and most of the way is run free, not stepped.
        #[test]
        fn test_a_target_is_reached_exactly_within_the_margin(
            target in 1u64..2_000_000,
            skid in 0u64..200,
            spare in 1u64..50,
        ) {
            let mut machine = FakeMachine::new(skid, Vec::new());
            let margin = skid + spare;
            prop_assert_eq!(run_to_count(&mut machine, target, margin), Ok(Reached::Target));
            prop_assert_eq!(machine.retired, target);
            prop_assert!(u64::from(machine.steps) <= margin + 1);
        }
    }

    #[test]
    fn test_a_counter_that_skids_past_the_margin_is_refused() {
        let mut machine = FakeMachine::new(500, Vec::new());
        let err = (0..50)
            .find_map(|i| run_to_count(&mut machine, 100_000 * (i + 1), 10).err())
            .expect("a skid of up to 500 overshoots a margin of 10");
        assert!(
            matches!(err, PmuError::Overshot { margin: 10, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("skids more than the margin"),
            "{err}"
        );
    }

    /// A skid of exactly the margin lands some free runs on the target's
    /// count, where a counter of branches cannot tell which boundary of
    /// that count the guest stopped at: refused, not taken as the target.
    #[test]
    fn test_a_free_run_that_lands_on_the_target_is_refused() {
        let mut machine = FakeMachine::new(10, Vec::new());
        let landed = (0..500).find_map(|_| {
            let target = machine.retired + 100_000;
            match run_to_count(&mut machine, target, 10) {
                Err(PmuError::Overshot { counted, .. }) if counted == target => Some(counted),
                _ => None,
            }
        });
        assert!(landed.is_some(), "no free run landed on its target");
        // A guest exit at the target's count in a free run ran past it too
        // (a skid of up to 200 against a margin of 64: some patterns reach it).
        let refused = (0..50u64).any(|i| {
            let mut machine = FakeMachine::new(200, vec![50_000]);
            machine.skid_pattern ^= i.wrapping_mul(0x1000_0001);
            matches!(
                run_to_count(&mut machine, 50_000, 64),
                Err(PmuError::Overshot {
                    counted: 50_000,
                    ..
                })
            )
        });
        assert!(
            refused,
            "an exit at the target after a free run was accepted"
        );
    }

    #[test]
    fn test_an_exit_before_the_target_stops_there() {
        let mut machine = FakeMachine::new(30, vec![12_345, 50_000]);
        assert_eq!(
            run_to_count(&mut machine, 40_000, 64),
            Ok(Reached::Exit { count: 12_345 })
        );
        // The exit handled, the same target is reached from there.
        assert_eq!(run_to_count(&mut machine, 40_000, 64), Ok(Reached::Target));
        assert_eq!(machine.retired, 40_000);
        // An exit met while stepping the last stretch stops there too.
        let mut machine = FakeMachine::new(0, vec![49_990]);
        assert_eq!(
            run_to_count(&mut machine, 50_000, 64),
            Ok(Reached::Exit { count: 49_990 })
        );
    }

    /// A restore puts the history's count back: the counter then reads
    /// the saved count, and the same target lands on the same instruction
    /// as in the history that was never restored.
    #[test]
    fn test_the_count_is_restored_with_the_state() {
        let mut history = FakeMachine::new(40, Vec::new());
        run_to_count(&mut history, 70_000, 64).unwrap();
        let saved = save_count(&mut history);
        assert_eq!(saved, PmuCountState { count: 70_000 });
        run_to_count(&mut history, 90_000, 64).unwrap();

        // Another process: its counter started elsewhere; the guest's
        // state (70,000 retired) and the saved count are restored.
        let mut restored = FakeMachine::new(40, Vec::new());
        restored.retired = 70_000;
        restored.offset = 12_345_678;
        restore_count(&mut restored, &saved);
        assert_eq!(restored.read(), 70_000);
        run_to_count(&mut restored, 90_000, 64).unwrap();
        assert_eq!(restored.retired, history.retired);
    }
}
