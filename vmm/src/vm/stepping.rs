//! The exit loop: entering the guest, handing each guest-caused exit to the
//! machine, placing interrupts, and recording the exit; and the ways to run
//! a session (one exit, up to a limit, to the end).
//!
//! Interrupt windows are not taken on trust: a window that may sit in an
//! STI shadow is single-stepped past first (see `irq_window` and
//! determinism.md), so where an interrupt lands depends on the guest alone.

use super::console::feed_console_input;
use super::kvm_exit::{complete, convert_exit, regs_hash, ResponseSlot};
use super::pmu_run::sync_counted_clock;
use super::session::devices_hash;
use super::step_clock::stopped;
use super::{kvm_err, Session, VmError};
use crate::cpu_model::MsrAccess;
use crate::exit::{AccessData, Completion, Exit, ExitAction, InterruptAction, StopReason};
use crate::irq_window;
use crate::kvm_util;
use crate::record::{ExitRecord, NO_HASH, NO_VECTOR};
use devices::{GuestMemory, VirtNanos};
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress};

/// How far a run goes before it is handed back (unless the guest stops
/// first): the one limit of every way to run on ([`Session::run_until`],
/// and whatever steps a session with more than its exits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Until {
    /// Until this many exits have been handled.
    Exit(u64),
    /// Until this virtual time.
    Time(VirtNanos),
    /// This many more exits.
    Steps(u64),
    /// Until this many exits have been handled or this virtual time,
    /// whichever comes first.
    ExitOrTime { exit: u64, time: VirtNanos },
    /// Until the guest stops.
    End,
}

impl Until {
    /// The limit of an exit count, a virtual time, both (whichever comes
    /// first) or neither (the end).
    pub fn first_of(exit: Option<u64>, time: Option<VirtNanos>) -> Until {
        match (exit, time) {
            (Some(exit), Some(time)) => Until::ExitOrTime { exit, time },
            (Some(exit), None) => Until::Exit(exit),
            (None, Some(time)) => Until::Time(time),
            (None, None) => Until::End,
        }
    }

    /// Whether a run that set out at `start` exits and has now handled
    /// `exits` at virtual time `now` has reached the limit.
    pub fn reached(self, start: u64, exits: u64, now: VirtNanos) -> bool {
        match self {
            Until::Exit(limit) => exits >= limit,
            Until::Time(limit) => now >= limit,
            Until::Steps(steps) => exits >= start.saturating_add(steps),
            Until::ExitOrTime { exit, time } => exits >= exit || now >= time,
            Until::End => false,
        }
    }

    /// The virtual time the limit ends at, if it has one.
    pub fn time(self) -> Option<VirtNanos> {
        match self {
            Until::Time(time) | Until::ExitOrTime { time, .. } => Some(time),
            Until::Exit(_) | Until::Steps(_) | Until::End => None,
        }
    }
}

/// Whether the byte before `rip` is `STI`'s opcode, i.e. whether the guest
/// may be in an STI shadow at this boundary. The guest runs with flat code
/// segments (base 0, 64-bit or compatibility mode), so RIP is the linear
/// address; a byte that is not mapped cannot have just executed.
fn follows_sti(vcpu: &VcpuFd, memory: &GuestMemory, rip: u64) -> bool {
    let Some(linear) = rip.checked_sub(1) else {
        return false;
    };
    match vcpu.translate_gva(linear) {
        Ok(t) if t.valid != 0 => memory
            .read_obj::<u8>(GuestAddress(t.physical_address))
            .is_ok_and(|byte| byte == irq_window::STI_OPCODE),
        _ => false,
    }
}

/// `follows_sti`, for kernel code only (CPL 0): user space cannot execute
/// `STI` (IOPL 0), and stepping user code could leave the trap flag in a
/// frame it saves (SYSCALL's R11, PUSHF), which would later trap for real.
pub(super) fn follows_sti_in_kernel(vcpu: &VcpuFd, memory: &GuestMemory, rip: u64) -> bool {
    follows_sti(vcpu, memory, rip)
        && vcpu
            .get_sregs()
            .is_ok_and(|sregs| sregs.cs.selector & 3 == 0)
}

/// What the window guard makes of a KVM_RUN return.
pub(super) fn window_stop(exit: &Exit) -> irq_window::Stop {
    match exit {
        Exit::IrqWindowOpen => irq_window::Stop::WindowOpen,
        Exit::SingleStep => irq_window::Stop::SingleStep,
        _ => irq_window::Stop::Other,
    }
}

/// Turns KVM's single-stepping of the guest on or off.
pub(super) fn set_single_step(vcpu: &VcpuFd, on: bool) -> Result<(), VmError> {
    let control = if on {
        kvm_bindings::KVM_GUESTDBG_ENABLE | kvm_bindings::KVM_GUESTDBG_SINGLESTEP
    } else {
        0
    };
    let debug = kvm_bindings::kvm_guest_debug {
        control,
        ..Default::default()
    };
    vcpu.set_guest_debug(&debug)
        .map_err(kvm_err("KVM_SET_GUEST_DEBUG"))
}

impl Session {
    /// Enters the guest until it makes an exit of its own and handles that
    /// exit (the exit clock, and the pmu clock's free runs; the step clock
    /// steps instead: `step_clock`). `None`: the pmu clock's counter
    /// stopped the guest before it exited.
    pub(super) fn step_exit(&mut self) -> Result<Option<ExitAction>, VmError> {
        if let Some(stop) = self.before_entry()? {
            return Ok(Some(ExitAction::Stop(stop)));
        }
        loop {
            self.install_breakpoints();
            let (exit, slot) = match self.vm.vcpu.run() {
                Ok(vcpu_exit) => convert_exit(vcpu_exit),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    (Exit::Interrupted, ResponseSlot::None)
                }
                Err(e) => {
                    self.breakpoints.remove(&self.vm.memory);
                    return Err(kvm_err("KVM_RUN")(e));
                }
            };
            // An exit's time is the count at that exit.
            sync_counted_clock(&mut self.counter, &mut self.machine.clock);
            // The guest's bytes back before anything reads guest memory; a
            // HLT at a breakpoint is a hit, not an exit (a HLT writes no
            // answer: its slot is not used past here).
            let patched = self.breakpoints.remove(&self.vm.memory);
            let slot = if exit == Exit::Hlt && !patched.is_empty() {
                let _ = slot;
                self.stop_at_hit(&patched)?;
                ResponseSlot::None
            } else {
                slot
            };
            // A signal to this thread is a host event, not a guest-caused
            // exit: it must not be counted or recorded, move the clock, feed
            // input or give an interrupt a chance to be injected. Enter again.
            if exit == Exit::Interrupted {
                if self.stall.look(self.machine.exits()) {
                    return Ok(Some(ExitAction::Stop(self.stalled())));
                }
                if let Some(violation) = crate::seccomp::take_violation() {
                    return Ok(Some(ExitAction::Stop(StopReason::SeccompViolation {
                        violation,
                    })));
                }
                if self.counter_stop() {
                    // Steps taken before it no longer say where the run
                    // is, and the next step must look for an event the
                    // interrupted entry left queued, as after an exit.
                    self.ran_free = true;
                    self.insn_steps = 0;
                    return Ok(None);
                }
                continue;
            }
            let stop = window_stop(&exit);
            // A guest exit (`Other`) keeps its response slot; the guard hears
            // of it after the response is written (below).
            let (exit, slot) = if stop == irq_window::Stop::Other {
                (exit, slot)
            } else {
                match self.check_window(stop)? {
                    irq_window::Verdict::Deliver => (Exit::IrqWindowOpen, ResponseSlot::None),
                    irq_window::Verdict::Step | irq_window::Verdict::WaitForWindow => continue,
                    irq_window::Verdict::Unexpected => (Exit::SingleStep, ResponseSlot::None),
                }
            };
            if let Some(input) = &self.input {
                feed_console_input(&mut self.machine, input, exit == Exit::Hlt);
            }
            let action = self.machine.handle_exit(&exit);
            if let ExitAction::Resume(completion) = &action {
                complete(slot, completion);
            }
            return self.finish_exit(stop, &exit, action).map(Some);
        }
    }

    /// What is done before the guest is entered after an exit: the time
    /// limit (a stop), the seccomp filter, the clock page.
    pub(super) fn before_entry(&mut self) -> Result<Option<StopReason>, VmError> {
        // The run's virtual-time limit ends it between two exits, before
        // the guest is entered again: the last exit was handled whole (its
        // interrupt decided, a driver's host side done after it), exactly
        // as when a run is handed back at that time (`Until::Time`). So the
        // moment a run reaches at its limit (`run`/`up`/`branch --until`)
        // is the one a campaign, a restore or a seek reaches at that time,
        // with the same exit count, virtual time and digest.
        if self
            .machine
            .until
            .is_some_and(|limit| self.machine.now() >= limit)
        {
            return Ok(Some(StopReason::TimeLimit));
        }
        // The pmu clock's counter counts this thread from the history's
        // count (a restore moved the clock's, not the counter's).
        self.ready_counter()?;
        // Set-up is over once the guest is about to run: from here on the
        // thread runs under the allowlist (a no-op once it does).
        crate::seccomp::ensure_installed()?;
        if let Some(violation) = crate::seccomp::take_violation() {
            return Ok(Some(StopReason::SeccompViolation { violation }));
        }
        if std::mem::take(&mut self.publish_before_entry) {
            self.machine.publish_clock_page();
        }
        Ok(None)
    }

    /// The rest of handling a guest exit once its answer is written: the
    /// window guard told of a guest exit met while stepping, the pending
    /// interrupt decided, the record made.
    pub(super) fn finish_exit(
        &mut self,
        stop: irq_window::Stop,
        exit: &Exit,
        action: ExitAction,
    ) -> Result<ExitAction, VmError> {
        if stop == irq_window::Stop::Other && self.window.stepping() {
            // The stepped instruction exited on its own: the exit is the
            // guest's, and stepping ends with it.
            self.check_window(stop)?;
        }
        let injected = match action {
            ExitAction::Resume(_) => self.decide_interrupt(exit)?,
            ExitAction::Stop(_) => NO_VECTOR,
        };
        self.record(exit, &action, injected);
        Ok(action)
    }

    /// The window-open exit at this boundary, found by the caller (no
    /// answer to write): handled as the loop handles KVM's.
    pub(super) fn take_window_exit(&mut self) -> Result<ExitAction, VmError> {
        let exit = Exit::IrqWindowOpen;
        if let Some(input) = &self.input {
            feed_console_input(&mut self.machine, input, false);
        }
        let action = self.machine.handle_exit(&exit);
        self.finish_exit(irq_window::Stop::WindowOpen, &exit, action)
    }

    /// Asks the window guard about a stop that may be (or end) the search
    /// for an interrupt window, and sets single-stepping and the window
    /// request to match its verdict.
    fn check_window(&mut self, stop: irq_window::Stop) -> Result<irq_window::Verdict, VmError> {
        let was_stepping = self.window.stepping();
        let interrupts_enabled = self.vm.vcpu.get_kvm_run().if_flag != 0;
        let rip = self.vm.vcpu.sync_regs().regs.rip;
        let vcpu = &self.vm.vcpu;
        let memory = &self.vm.memory;
        let verdict = self.window.on_stop(stop, interrupts_enabled, || {
            follows_sti_in_kernel(vcpu, memory, rip)
        });
        let stepping = self.window.stepping();
        // Armed again for every step: KVM paths that rewrite RFLAGS (its own
        // instruction emulation) may drop the trap flag it set.
        if stepping || was_stepping {
            set_single_step(&self.vm.vcpu, stepping)?;
        }
        let run = self.vm.vcpu.get_kvm_run();
        match verdict {
            // While stepping, a window request would end the step early.
            irq_window::Verdict::Step => run.request_interrupt_window = 0,
            irq_window::Verdict::WaitForWindow => run.request_interrupt_window = 1,
            irq_window::Verdict::Deliver | irq_window::Verdict::Unexpected => {}
        }
        Ok(verdict)
    }

    /// Injects a pending interrupt if the guest can take it, else asks KVM
    /// for an exit as soon as it can. Returns the injected vector or NO_VECTOR.
    ///
    /// An exit whose instruction completes only at the next entry (port,
    /// MMIO, MSR) and that follows an `STI` opcode byte may sit in the STI
    /// shadow: a correct host reports it not ready, a host that lost the
    /// shadow reports it ready. It counts as not ready on every host, so the
    /// interrupt waits for the window after the instruction either way.
    fn decide_interrupt(&mut self, exit: &Exit) -> Result<u16, VmError> {
        let run = self.vm.vcpu.get_kvm_run();
        let mut ready = run.ready_for_interrupt_injection != 0 && run.if_flag != 0;
        let incomplete = matches!(
            exit,
            Exit::IoIn { .. }
                | Exit::IoOut { .. }
                | Exit::MmioRead { .. }
                | Exit::MmioWrite { .. }
                | Exit::RdMsr { .. }
                | Exit::WrMsr { .. }
        );
        if ready && incomplete && self.machine.devices.has_pending_interrupt() {
            let rip = self.vm.vcpu.sync_regs().regs.rip;
            if follows_sti_in_kernel(&self.vm.vcpu, &self.vm.memory, rip) {
                ready = false;
            }
        }
        let (window, injected) = match self.machine.interrupt_action(ready) {
            InterruptAction::Inject(vector) => {
                kvm_util::inject_interrupt(&self.vm.vcpu, vector).map_err(VmError::Inject)?;
                self.injected_total += 1;
                (0, u16::from(vector))
            }
            InterruptAction::RequestWindow => (1, NO_VECTOR),
            InterruptAction::None => (0, NO_VECTOR),
        };
        self.vm.vcpu.get_kvm_run().request_interrupt_window = window;
        Ok(injected)
    }

    /// The stop of a run whose guest went the stall timeout without an exit.
    fn stalled(&self) -> StopReason {
        let exits = self.machine.exits();
        StopReason::Stalled {
            last_exit: exits.checked_sub(1),
            rip: self.last_exit_rip,
            timeout_ms: u64::try_from(self.stall.timeout().0.as_millis()).unwrap_or(u64::MAX),
        }
    }

    fn record(&mut self, exit: &Exit, action: &ExitAction, injected: u16) {
        // A new interval between exits begins: no steps into it yet.
        self.insn_steps = 0;
        self.ran_free = false;
        let regs = self.vm.vcpu.sync_regs().regs;
        self.last_exit_rip = regs.rip;
        let index = self.machine.exits() - 1;
        let data = match (exit, action) {
            (Exit::IoOut { data, .. } | Exit::MmioWrite { data, .. }, _) => *data,
            (_, ExitAction::Resume(Completion::Data(data))) => *data,
            (Exit::WrMsr { value, .. }, _) => AccessData::new(&value.to_le_bytes()),
            (_, ExitAction::Resume(Completion::Msr(MsrAccess::Value(v)))) => {
                AccessData::new(&v.to_le_bytes())
            }
            _ => AccessData::default(),
        };
        let device_hash = if self.recorder.wants_device_hash(index) {
            devices_hash(&self.machine.devices)
        } else {
            NO_HASH
        };
        let memory_hash = if self.recorder.wants_memory_hash(index) {
            self.memory_digest(false).0
        } else {
            NO_HASH
        };
        let record = ExitRecord {
            index,
            time: self.machine.now(),
            kind: exit.kind(),
            address: exit.address(),
            data: data.as_u64(),
            size: data.len() as u8,
            rip: regs.rip,
            regs_hash: regs_hash(&regs),
            injected,
            device_hash,
            memory_hash,
        };
        self.observe(&record);
        self.recorder.push(record);
    }

    /// Runs until the guest stops or `until` is reached, whichever is
    /// first (`None` when the limit was).
    pub fn run_until(&mut self, until: Until) -> Result<Option<StopReason>, VmError> {
        self.stall.arm(&self.vm.vcpu)?;
        let time = until.time();
        self.run_until_with(until, |session| Ok(stopped(session.step_toward(time)?)))
    }

    /// As [`Session::run_until`], each exit taken by `step` (`Some` when
    /// the guest stopped): for a caller that does more at every exit (an
    /// `up` run's conversation) and steps through [`Session::step_one`].
    pub fn run_until_with<E>(
        &mut self,
        until: Until,
        mut step: impl FnMut(&mut Session) -> Result<Option<StopReason>, E>,
    ) -> Result<Option<StopReason>, E> {
        let start = self.machine.exits();
        loop {
            if until.reached(start, self.machine.exits(), self.machine.now()) {
                return Ok(None);
            }
            if let Some(reason) = step(self)? {
                return Ok(Some(reason));
            }
        }
    }

    /// Runs one exit (`Some` when the guest stopped there).
    pub fn step_one(&mut self) -> Result<Option<StopReason>, VmError> {
        self.stall.arm(&self.vm.vcpu)?;
        Ok(stopped(self.step_toward(None)?))
    }

    /// Runs until the guest stops.
    pub fn run_to_end(&mut self) -> Result<StopReason, VmError> {
        self.stall.arm(&self.vm.vcpu)?;
        loop {
            if let Some(reason) = stopped(self.step_toward(None)?) {
                return Ok(reason);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_until_reaches_each_limit_and_the_first_of_two() {
        let at = |until: Until, exits: u64, ns: u64| until.reached(10, exits, VirtNanos(ns));
        assert!(!at(Until::Exit(12), 11, 0) && at(Until::Exit(12), 12, 0));
        assert!(!at(Until::Steps(2), 11, 0) && at(Until::Steps(2), 12, 0));
        assert!(!at(Until::Time(VirtNanos(5)), 99, 4) && at(Until::Time(VirtNanos(5)), 0, 5));
        let both = Until::first_of(Some(12), Some(VirtNanos(5)));
        assert!(!at(both, 11, 4) && at(both, 12, 0) && at(both, 0, 5));
        assert!(!at(Until::first_of(None, None), u64::MAX, u64::MAX));
        assert_eq!(Until::first_of(Some(3), None), Until::Exit(3));
        assert_eq!(
            Until::first_of(None, Some(VirtNanos(3))),
            Until::Time(VirtNanos(3))
        );
        assert!(at(Until::Steps(u64::MAX), u64::MAX, 0));
    }

    /// A request's `until` crosses into the helper VM as JSON.
    #[test]
    fn test_until_json_is_unchanged() {
        for (until, json) in [
            (Until::Exit(5), r#"{"exit":5}"#),
            (Until::Time(VirtNanos(7)), r#"{"time":7}"#),
            (Until::Steps(1), r#"{"steps":1}"#),
            (Until::End, r#""end""#),
            (
                Until::ExitOrTime {
                    exit: 2,
                    time: VirtNanos(3),
                },
                r#"{"exit_or_time":{"exit":2,"time":3}}"#,
            ),
        ] {
            assert_eq!(serde_json::to_string(&until).unwrap(), json);
            assert_eq!(serde_json::from_str::<Until>(json).unwrap(), until);
        }
    }
}
