//! Where an interrupt window really opens: KVM's window exit, checked for the
//! STI shadow, corrected by single-stepping.
//!
//! When an interrupt is pending and the guest cannot take it, the loop asks
//! KVM for an exit as soon as it can (`request_interrupt_window`), and injects
//! there. The interrupt lands at that instruction boundary, and the guest
//! observes the boundary (Linux mixes the interrupted RIP into its entropy
//! pool), so the boundary must be a function of the guest's instructions
//! alone.
//!
//! On hardware it is: the window opens at the first boundary with IF=1 that is
//! not in the shadow of an `STI` (the one instruction after `STI` cannot be
//! interrupted). Nested under QEMU's TCG (the helper VM) it sometimes is not:
//! when a host event lands between `STI` and the next instruction, the shadow
//! is lost and KVM reports the window open one instruction early, inside the
//! shadow. Runs with one seed then inject at different RIPs and diverge.
//!
//! The guard makes the boundary exact. A window exit whose RIP follows an
//! `0xFB` byte (the `STI` opcode) is not believed: the loop single-steps one
//! instruction and looks again, until IF=1 at a boundary that does not follow
//! an `0xFB` byte. The correction is deterministic whichever way KVM erred:
//! an early exit inside the shadow is at the `STI`'s end, and stepping from
//! there walks through the boundary where a correct exit would have been, so
//! both continue identically from that point. A byte `0xFB` that ends some
//! other instruction (an immediate, say) costs a step that every run takes
//! alike. Nothing of this is an exit: steps are not counted, recorded or
//! timed, and only the final boundary becomes the window-open exit.
//!
//! `MOV SS`/`POP SS` shadows are not handled: 64-bit kernels do not open an
//! interrupt window with them.

/// The opcode of `STI`.
pub const STI_OPCODE: u8 = 0xfb;

/// Steps after one window exit before the guard gives up looking for the
/// shadow's end and takes the boundary it has (deterministically: the limit is
/// part of the run's definition). No real code runs into it.
pub const MAX_STEPS: u32 = 64;

/// A KVM_RUN return the guard has a say in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// KVM_EXIT_IRQ_WINDOW_OPEN.
    WindowOpen,
    /// KVM_EXIT_DEBUG after a single step.
    SingleStep,
    /// Any other exit (I/O, MMIO, HLT, MSR, ...): the guest's own.
    Other,
}

/// What the loop does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Handle the exit as the guest's (counted and recorded). For `WindowOpen`
    /// and `SingleStep` stops this is the window-open exit at this boundary.
    Deliver,
    /// Not an exit: execute one instruction (single-step on) and ask again.
    Step,
    /// Not an exit: the guest masked interrupts again while being stepped;
    /// stepping off, and wait for the window in hardware again.
    WaitForWindow,
    /// A single-step trap while not stepping: the loop lost track.
    Unexpected,
}

/// The guard's state: whether it is stepping, and what it has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowGuard {
    steps_this_window: Option<u32>,
    /// Window exits found inside a (possible) STI shadow.
    pub corrected_windows: u64,
    /// Instructions single-stepped in all.
    pub steps: u64,
}

impl WindowGuard {
    /// Whether single-stepping must be on for the next KVM_RUN.
    pub fn stepping(&self) -> bool {
        self.steps_this_window.is_some()
    }

    /// Decides about one KVM_RUN return. `interrupts_enabled` is the guest's
    /// RFLAGS.IF; `follows_sti` tells whether the byte before RIP is `STI`'s
    /// opcode (asked only when it matters: it costs a translation).
    pub fn on_stop(
        &mut self,
        stop: Stop,
        interrupts_enabled: bool,
        follows_sti: impl FnOnce() -> bool,
    ) -> Verdict {
        match (stop, self.steps_this_window) {
            (Stop::Other, _) => {
                // A guest-caused exit while stepping ends the stepping: the
                // exit is the guest's either way, and after it the loop
                // decides about the pending interrupt afresh.
                self.steps_this_window = None;
                Verdict::Deliver
            }
            (Stop::SingleStep, None) => Verdict::Unexpected,
            (Stop::WindowOpen, _) => {
                if interrupts_enabled && follows_sti() {
                    self.corrected_windows += 1;
                    self.step(0)
                } else {
                    self.steps_this_window = None;
                    Verdict::Deliver
                }
            }
            (Stop::SingleStep, Some(taken)) => {
                if !interrupts_enabled {
                    self.steps_this_window = None;
                    Verdict::WaitForWindow
                } else if taken < MAX_STEPS && follows_sti() {
                    self.step(taken)
                } else {
                    self.steps_this_window = None;
                    Verdict::Deliver
                }
            }
        }
    }

    fn step(&mut self, taken: u32) -> Verdict {
        self.steps_this_window = Some(taken + 1);
        self.steps += 1;
        Verdict::Step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_exit_after_other_code_is_delivered_without_stepping() {
        let mut g = WindowGuard::default();
        assert_eq!(
            g.on_stop(Stop::WindowOpen, true, || false),
            Verdict::Deliver
        );
        assert!(!g.stepping());
        assert_eq!(g.steps, 0);
    }

    #[test]
    fn the_sti_check_is_not_made_for_exits_that_do_not_need_it() {
        let mut g = WindowGuard::default();
        let never = || -> bool { panic!("follows_sti asked") };
        assert_eq!(g.on_stop(Stop::Other, true, never), Verdict::Deliver);
        assert_eq!(g.on_stop(Stop::WindowOpen, false, never), Verdict::Deliver);
    }

    #[test]
    fn a_window_exit_in_the_sti_shadow_steps_to_the_next_boundary() {
        let mut g = WindowGuard::default();
        // Early exit right after STI: step the instruction in the shadow.
        assert_eq!(g.on_stop(Stop::WindowOpen, true, || true), Verdict::Step);
        assert!(g.stepping());
        // The boundary after it is the window.
        assert_eq!(
            g.on_stop(Stop::SingleStep, true, || false),
            Verdict::Deliver
        );
        assert!(!g.stepping());
        assert_eq!((g.corrected_windows, g.steps), (1, 1));
    }

    /// The early exit and the correct one end at the same boundary: the
    /// early one walks through the correct one's starting point, where the
    /// same question gets the same answer.
    #[test]
    fn early_and_correct_window_exits_converge_on_one_boundary() {
        // Boundaries after `sti`: b0 (in the shadow), b1 (correct exit), b2.
        // The instruction before b1 happens to end in 0xFB too (an immediate).
        let follows_sti = |b: usize| [true, true, false][b];
        let walk = |start: usize| {
            let mut g = WindowGuard::default();
            let mut at = start;
            let mut v = g.on_stop(Stop::WindowOpen, true, || follows_sti(at));
            while v == Verdict::Step {
                at += 1;
                v = g.on_stop(Stop::SingleStep, true, || follows_sti(at));
            }
            (v, at)
        };
        assert_eq!(walk(0), (Verdict::Deliver, 2));
        assert_eq!(walk(1), (Verdict::Deliver, 2));
    }

    #[test]
    fn interrupts_masked_again_while_stepping_wait_for_the_hardware_window() {
        let mut g = WindowGuard::default();
        assert_eq!(g.on_stop(Stop::WindowOpen, true, || true), Verdict::Step);
        // The instruction in the shadow was `cli`.
        assert_eq!(
            g.on_stop(Stop::SingleStep, false, || true),
            Verdict::WaitForWindow
        );
        assert!(!g.stepping());
    }

    #[test]
    fn a_guest_exit_while_stepping_is_delivered_and_ends_the_stepping() {
        let mut g = WindowGuard::default();
        assert_eq!(g.on_stop(Stop::WindowOpen, true, || true), Verdict::Step);
        // `sti; hlt`: the stepped instruction exits on its own.
        assert_eq!(g.on_stop(Stop::Other, true, || true), Verdict::Deliver);
        assert!(!g.stepping());
    }

    #[test]
    fn stepping_stops_at_the_limit() {
        let mut g = WindowGuard::default();
        let mut v = g.on_stop(Stop::WindowOpen, true, || true);
        let mut steps = 0;
        while v == Verdict::Step {
            steps += 1;
            v = g.on_stop(Stop::SingleStep, true, || true);
        }
        assert_eq!(v, Verdict::Deliver);
        assert_eq!(steps, MAX_STEPS);
        assert_eq!(g.steps, u64::from(MAX_STEPS));
    }

    #[test]
    fn a_single_step_trap_while_not_stepping_is_unexpected() {
        let mut g = WindowGuard::default();
        assert_eq!(
            g.on_stop(Stop::SingleStep, true, || false),
            Verdict::Unexpected
        );
    }
}
