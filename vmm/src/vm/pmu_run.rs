//! Running a session under the pmu clock ([`crate::clock::PmuClock`]):
//! virtual time follows a counter of guest events, and a deadline lands on
//! an exact count.
//!
//! Toward the next deadline (a device's, an `up` wake-up, the run's time
//! limit) the guest runs free with the counter's overflow set the counter's
//! skid margin short of the deadline's count, then is single-stepped to
//! the exact count ([`crate::pmu_clock::run_to_count`], the logic tested
//! against a fake counter). From there the step clock's loop takes over:
//! the deadline is due, so the stepper asks for an interrupt window and the
//! interrupt lands at the first boundary where the guest can take it. The
//! clock takes the counter's count at every stop (an exit, the overflow, a
//! step), so an exit's time is the count at that exit. A count past the
//! target is refused ([`crate::pmu_clock::PmuError::Overshot`]), never
//! believed: the interrupt would land late.
//!
//! The counter is the thread's: one that counts another thread is replaced,
//! and before every entry it is set to the history's count (a restore, in
//! place or from a snapshot, moves the clock's count, not the counter's).

use super::stepping::set_single_step;
use super::{Session, SetupError, VmError};
use crate::clock::{Clock, ClockError};
use crate::exit::ExitAction;
use crate::pmu_clock::{
    open_counter, run_to_count, CountedVcpu, GuestEventCounter, PmuCounter, PmuCounterChoice,
    Reached, VcpuStop,
};
use devices::{ClockKind, VirtNanos};

impl Session {
    /// Makes sure the counter counts this thread and holds the history's
    /// count (before every entry, stepped or free).
    pub(super) fn ready_counter(&mut self) -> Result<(), VmError> {
        let Some(pmu) = self.machine.clock.pmu() else {
            return Ok(());
        };
        let (event, counted) = (pmu.event(), pmu.counted());
        if !self
            .counter
            .as_ref()
            .is_some_and(|counter| counter.counts_this_thread())
        {
            self.counter = None;
            let counter = open_counter(PmuCounterChoice::Hardware, Some(event))
                .map_err(|e| SetupError::Clock(ClockError::from(e)))?;
            self.counter = Some(counter);
        }
        if let Some(counter) = self.counter.as_mut() {
            if counter.read() != counted {
                counter.set(counted);
            }
        }
        self.counter_failed()
    }

    /// The counter's failure since the last look, as the run's error.
    fn counter_failed(&mut self) -> Result<(), VmError> {
        let event = self.machine.clock.pmu().map(|pmu| pmu.event());
        match (event, self.counter.as_mut().and_then(|c| c.take_error())) {
            (Some(event), Some(reason)) => Err(VmError::PmuCounter { event, reason }),
            _ => Ok(()),
        }
    }

    /// Whether an interrupted `KVM_RUN` is the counter's stop (its
    /// overflow), as opposed to another host signal: always, once a pmu
    /// run has its counter (only the pmu clock has one).
    pub(super) fn counter_stop(&self) -> bool {
        self.counter.is_some()
    }

    /// The earliest time the pmu run must stop at exactly: the next device
    /// deadline or wake-up, `time`, the machine's limit.
    fn next_counted_deadline(&self, time: Option<VirtNanos>) -> Option<VirtNanos> {
        [self.next_wake(), time, self.machine.until]
            .into_iter()
            .flatten()
            .min()
    }

    /// One exit's worth of the run under the pmu clock (`None`: stopped at
    /// `time` between two exits).
    pub(super) fn step_pmu(
        &mut self,
        time: Option<VirtNanos>,
    ) -> Result<Option<ExitAction>, VmError> {
        if let Some(stop) = self.before_entry()? {
            return Ok(Some(ExitAction::Stop(stop)));
        }
        let deadline = self.next_counted_deadline(time);
        if deadline.is_some_and(|at| at <= self.machine.now()) {
            return self.step_counted(time);
        }
        let target = deadline.and_then(|at| self.machine.clock.pmu().map(|pmu| pmu.count_at(at)));
        let margin = self.counter.as_ref().map_or(0, |c| c.skid_margin());
        let mut run = CountedRun {
            session: self,
            action: None,
            error: None,
        };
        let reached = match target {
            Some(target) => run_to_count(&mut run, target, margin),
            // Nothing to stop at: free to the guest's next exit.
            None => {
                run.arm_overflow(None);
                while run.run() == VcpuStop::Counted {}
                Ok(Reached::Exit { count: 0 })
            }
        };
        let (action, error) = (run.action.take(), run.error.take());
        if let Some(error) = error {
            return Err(error);
        }
        self.counter_failed()?;
        reached?;
        if let Some(action) = action {
            return Ok(Some(action));
        }
        // At the deadline's count: due, so stepped to the window.
        self.step_counted(time)
    }

    /// A free run with a counter that has no hardware: single steps until
    /// its overflow fires (`None`) or the guest exits.
    fn emulated_free_run(&mut self) -> Result<Option<ExitAction>, VmError> {
        loop {
            match self.step_insn()? {
                Ok(None) => {
                    if self.counter.as_ref().is_some_and(|c| c.overflowed()) {
                        return Ok(None);
                    }
                }
                Ok(Some(action)) => return Ok(Some(action)),
                Err(refusal) => return self.end_stepping(refusal),
            }
        }
    }
}

/// The pmu clock takes the counter's count (at every stop). Free of the
/// session: the exit loop calls it while the exit's answer slot borrows
/// the vCPU.
pub(super) fn sync_counted_clock(counter: &mut Option<Box<dyn PmuCounter>>, clock: &mut Clock) {
    if let (Some(counter), Some(pmu)) = (counter.as_mut(), clock.pmu_mut()) {
        pmu.on_count(counter.read());
    }
}

/// One instruction was single-stepped: the step clock's tick, the
/// emulated counter's event, the pmu clock's new count; nothing under
/// the exit clock (stepping is observation there).
pub(super) fn count_step(counter: &mut Option<Box<dyn PmuCounter>>, clock: &mut Clock) {
    match clock.kind() {
        ClockKind::Exit => {}
        ClockKind::Step => clock.on_steps(1),
        ClockKind::Pmu => {
            if let Some(counter) = counter.as_mut() {
                counter.on_single_step();
            }
            sync_counted_clock(counter, clock);
        }
    }
}

/// The session as [`run_to_count`] drives it: the exits it meets are
/// handled as the exit loop handles them, and the first one ends the run.
struct CountedRun<'a> {
    session: &'a mut Session,
    action: Option<ExitAction>,
    error: Option<VmError>,
}

impl CountedRun<'_> {
    fn ended(&mut self, result: Result<Option<ExitAction>, VmError>) -> VcpuStop {
        match result {
            Ok(None) => VcpuStop::Counted,
            Ok(Some(action)) => {
                self.action = Some(action);
                VcpuStop::Exit
            }
            Err(error) => {
                self.error = Some(error);
                VcpuStop::Exit
            }
        }
    }
}

impl GuestEventCounter for CountedRun<'_> {
    fn read(&mut self) -> u64 {
        sync_counted_clock(&mut self.session.counter, &mut self.session.machine.clock);
        self.session
            .counter
            .as_mut()
            .map_or(0, |counter| counter.read())
    }

    fn set(&mut self, count: u64) {
        if let Some(counter) = self.session.counter.as_mut() {
            counter.set(count);
        }
    }

    fn arm_overflow(&mut self, after: Option<u64>) {
        if let Some(counter) = self.session.counter.as_mut() {
            counter.arm_overflow(after);
        }
    }
}

impl CountedVcpu for CountedRun<'_> {
    fn run(&mut self) -> VcpuStop {
        if self.action.is_some() || self.error.is_some() {
            return VcpuStop::Exit;
        }
        let emulated = self
            .session
            .counter
            .as_ref()
            .is_some_and(|c| c.emulates_free_runs());
        // A step (this run's, or the window exit that ended the last
        // one) leaves KVM's single-stepping on: off before running free,
        // or the entry would stop after one instruction, with the trap
        // flag in the frame of an interrupt delivered there.
        let result = if emulated {
            self.session.emulated_free_run()
        } else {
            set_single_step(&self.session.vm.vcpu, false).and_then(|()| self.session.step_exit())
        };
        self.ended(result)
    }

    fn step(&mut self) -> VcpuStop {
        if self.action.is_some() || self.error.is_some() {
            return VcpuStop::Exit;
        }
        let result = match self.session.step_insn() {
            Ok(Ok(action)) => Ok(action),
            Ok(Err(refusal)) => self.session.end_stepping(refusal),
            Err(error) => Err(error),
        };
        self.ended(result)
    }
}
