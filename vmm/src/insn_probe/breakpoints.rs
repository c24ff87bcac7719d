//! Whether KVM's hardware breakpoints fire for the VMM at the right RIP, and
//! whether a guest `INT3` is reported to the VMM.

use super::guest::{
    Cpl, ProbeVm, Stop, AFTER_REP, COUNT_ENTRY, INT3_AT, INT3_ENTRY, INT3_REPORT, LOOP_DEC,
};
use kvm_bindings::{KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_USE_HW_BP, KVM_GUESTDBG_USE_SW_BP};
use kvm_ioctls::Kvm;
use serde::{Deserialize, Serialize};

/// Loop iterations of the hardware-breakpoint run: DR0 on the loop's `dec`
/// fires once per iteration, DR1 after the REP once.
pub const BP_LOOPS: u32 = 10;
const DB_VECTOR: u32 = 1;
const BP_VECTOR: u32 = 3;
/// RFLAGS.RF: resume without the instruction breakpoint firing again.
const RFLAGS_RF: u64 = 1 << 16;

/// What the hardware-breakpoint run saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HwBreakpoints {
    /// Hits expected: DR0 [`BP_LOOPS`] times, then DR1 once.
    pub expected_hits: u64,
    /// Hits at the address of the breakpoint DR6 names.
    pub hits: u64,
    /// The first hit that was not where it should be, described.
    pub misplaced: Option<String>,
    /// The guest still reported its own count at the end.
    pub guest_finished: bool,
}

impl HwBreakpoints {
    pub fn fire(&self) -> bool {
        self.hits == self.expected_hits && self.misplaced.is_none() && self.guest_finished
    }
}

/// What a guest `INT3` did with `KVM_GUESTDBG_USE_SW_BP`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Int3Report {
    /// A KVM_EXIT_DEBUG with exception 3 came back.
    pub reported: bool,
    /// Where KVM said it was, against where the `int3` is.
    pub pc: Option<u64>,
    pub int3_at: u64,
    /// After moving RIP past the `int3`, the guest ran on to its report.
    pub resumed: bool,
    /// What came back instead, if not the debug exit.
    pub instead: Option<String>,
}

/// Runs the counting guest with DR0 on the loop and DR1 after the REP.
pub fn probe_hw_breakpoints(kvm: &Kvm) -> Result<HwBreakpoints, String> {
    let mut vm = ProbeVm::new(kvm, Cpl::Kernel, COUNT_ENTRY, BP_LOOPS, 3)?;
    // DR7: L0 and L1 enabled, both execute breakpoints of length 1 (R/W and
    // LEN fields zero).
    let dr7 = 0b101;
    vm.set_debug(
        KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP,
        [LOOP_DEC, AFTER_REP, 0, 0, 0, 0, 0, dr7],
    )?;
    let expected_hits = u64::from(BP_LOOPS) + 1;
    let mut hits = 0u64;
    let mut misplaced = None;
    for _ in 0..expected_hits * 2 + 4 {
        match vm.run()? {
            Stop::Report(count) => {
                return Ok(HwBreakpoints {
                    expected_hits,
                    hits,
                    misplaced,
                    guest_finished: count == 3 * BP_LOOPS,
                })
            }
            Stop::Debug { exception, pc, dr6 } => {
                let want = if hits < u64::from(BP_LOOPS) {
                    LOOP_DEC
                } else {
                    AFTER_REP
                };
                let which = if dr6 & 1 != 0 {
                    LOOP_DEC
                } else if dr6 & 2 != 0 {
                    AFTER_REP
                } else {
                    0
                };
                if exception != DB_VECTOR || pc != want || which != want {
                    misplaced.get_or_insert(format!(
                        "hit {} was exception {exception} at {pc:#x} (dr6 {dr6:#x}), expected {want:#x}",
                        hits + 1
                    ));
                }
                hits += 1;
                vm.edit_regs(|r| r.rflags |= RFLAGS_RF)?;
            }
            other @ Stop::Other(_) => {
                return Err(format!(
                    "the guest stopped with {} after {hits} breakpoint hits",
                    other.describe()
                ))
            }
        }
    }
    Ok(HwBreakpoints {
        expected_hits,
        hits,
        misplaced: misplaced.or(Some("the guest never reached its report".into())),
        guest_finished: false,
    })
}

/// Runs the `int3` entry with software breakpoints reported to the VMM.
pub fn probe_int3(kvm: &Kvm) -> Result<Int3Report, String> {
    let mut vm = ProbeVm::new(kvm, Cpl::Kernel, INT3_ENTRY, 0, 0)?;
    vm.set_debug(KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_SW_BP, [0; 8])?;
    let mut report = Int3Report {
        reported: false,
        pc: None,
        int3_at: INT3_AT,
        resumed: false,
        instead: None,
    };
    match vm.run()? {
        Stop::Debug {
            exception: BP_VECTOR,
            pc,
            ..
        } => {
            report.reported = true;
            report.pc = Some(pc);
        }
        other => {
            report.instead = Some(other.describe());
            return Ok(report);
        }
    }
    // Continue past the int3 as a debugger removing its breakpoint would:
    // the instruction is one byte.
    let rip = vm.rip()?;
    if rip == INT3_AT {
        vm.edit_regs(|r| r.rip = INT3_AT + 1)?;
    }
    vm.set_debug(0, [0; 8])?;
    report.resumed = vm.run()? == Stop::Report(INT3_REPORT);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakpoints_fire_only_with_every_hit_in_place() {
        let good = HwBreakpoints {
            expected_hits: 11,
            hits: 11,
            misplaced: None,
            guest_finished: true,
        };
        assert!(good.fire());
        assert!(!HwBreakpoints {
            hits: 10,
            ..good.clone()
        }
        .fire());
        assert!(!HwBreakpoints {
            misplaced: Some("x".into()),
            ..good.clone()
        }
        .fire());
        assert!(!HwBreakpoints {
            guest_finished: false,
            ..good
        }
        .fire());
    }
}
