//! Single-stepping the probe guest: whether the steps KVM reports are
//! exactly the guest's instructions (REP iterations included), how fast they
//! come, and whether the same holds at CPL 3.

use super::guest::{Cpl, ProbeVm, Stop, COUNT_ENTRY, UNCOUNTED};
use kvm_bindings::{KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP};
use kvm_ioctls::Kvm;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Loop iterations of the exactness runs (3 instructions each).
pub const EXACT_LOOPS: u32 = 300;
/// REP STOSB iterations of the second exactness run.
pub const EXACT_REP: u32 = 40;
/// How long the rate run steps.
pub const RATE_BUDGET: Duration = Duration::from_millis(1000);
/// Loop iterations of the free (unstepped) run the rate is compared with.
pub const FREE_LOOPS: u32 = 3_000_000;
/// Wall-time bound of one exactness run: stepping that has not reached the
/// guest's report by then is reported as too slow, never waited on.
const RUN_DEADLINE: Duration = Duration::from_secs(20);
const DB_VECTOR: u32 = 1;

/// How KVM's single step counts a `REP` string instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepCount {
    /// One step per iteration (the trap flag traps between iterations, as
    /// on hardware).
    PerIteration,
    /// One step for the whole instruction.
    WholeInstruction,
    /// Neither: this many steps for the probe's iterations.
    Other(u64),
}

impl RepCount {
    /// How `steps` steps for a REP of `iterations` iterations count.
    pub fn classify(steps: u64, iterations: u32) -> RepCount {
        if steps == u64::from(iterations) {
            RepCount::PerIteration
        } else if steps == 1 {
            RepCount::WholeInstruction
        } else {
            RepCount::Other(steps)
        }
    }
}

/// The two exactness runs at one privilege level.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepExactness {
    /// The guest's own count of its loop's instructions.
    pub guest_count: u64,
    /// Steps to the guest's report with a REP of no iterations.
    pub stepped: u64,
    /// What `stepped` must be: the guest's count, plus the instructions it
    /// does not count.
    pub expected: u64,
    /// REP iterations of the second run.
    pub rep_iterations: u32,
    /// Steps the REP took in the second run.
    pub rep_steps: u64,
    pub rep_count: RepCount,
}

impl StepExactness {
    /// Exact: every instruction one step, and a REP counted by a rule.
    pub fn exact(&self) -> bool {
        self.stepped == self.expected && !matches!(self.rep_count, RepCount::Other(_))
    }
}

/// Steps per second, and the same guest's speed unstepped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRate {
    pub steps: u64,
    pub micros: u64,
    /// Instructions the unstepped run executed, and its wall time.
    pub free_instructions: u64,
    pub free_micros: u64,
}

impl StepRate {
    pub fn steps_per_second(&self) -> u64 {
        per_second(self.steps, self.micros)
    }

    pub fn free_instructions_per_second(&self) -> u64 {
        per_second(self.free_instructions, self.free_micros)
    }
}

fn per_second(count: u64, micros: u64) -> u64 {
    let per = u128::from(count) * 1_000_000 / u128::from(micros.max(1));
    u64::try_from(per).unwrap_or(u64::MAX)
}

/// Single-steps a fresh counting guest until it reports; returns the steps
/// and the guest's report.
fn step_to_report(kvm: &Kvm, cpl: Cpl, loops: u32, rep: u32) -> Result<(u64, u64), String> {
    let mut vm = ProbeVm::new(kvm, cpl, COUNT_ENTRY, loops, rep)?;
    vm.set_debug(KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP, [0; 8])?;
    let limit = 3 * u64::from(loops) + u64::from(rep) + UNCOUNTED + 1000;
    let start = Instant::now();
    let mut steps = 0u64;
    loop {
        match vm.run()? {
            Stop::Report(count) => return Ok((steps, u64::from(count))),
            Stop::Debug { exception, pc, .. } if exception == DB_VECTOR => {
                steps += 1;
                if steps == 1 && cpl == Cpl::User && vm.cpl()? != 3 {
                    return Err(format!(
                        "the guest is not at CPL 3 after its first step (rip {pc:#x})"
                    ));
                }
            }
            Stop::Debug { exception, pc, .. } => {
                return Err(format!(
                    "a debug exit with exception {exception} at {pc:#x} while stepping"
                ));
            }
            other @ Stop::Other(_) => {
                return Err(format!(
                    "the guest stopped with {} after {steps} steps",
                    other.describe()
                ))
            }
        }
        if steps > limit {
            return Err(format!(
                "{steps} steps without reaching the guest's report (expected about {})",
                limit - 1000
            ));
        }
        if start.elapsed() > RUN_DEADLINE {
            return Err(format!(
                "stepping took more than {}s ({steps} steps)",
                RUN_DEADLINE.as_secs()
            ));
        }
    }
}

/// Whether single steps count the guest's instructions exactly at `cpl`.
pub fn probe_exactness(kvm: &Kvm, cpl: Cpl) -> Result<StepExactness, String> {
    let (stepped, guest_count) = step_to_report(kvm, cpl, EXACT_LOOPS, 0)?;
    let (stepped_rep, guest_count_rep) = step_to_report(kvm, cpl, EXACT_LOOPS, EXACT_REP)?;
    // The second run's uncounted instructions include the REP as one.
    let rep_steps = (stepped_rep + 1).saturating_sub(guest_count_rep + UNCOUNTED);
    Ok(StepExactness {
        guest_count,
        stepped,
        expected: guest_count + UNCOUNTED,
        rep_iterations: EXACT_REP,
        rep_steps,
        rep_count: RepCount::classify(rep_steps, EXACT_REP),
    })
}

/// Steps per second over [`RATE_BUDGET`], and the unstepped guest's speed.
pub fn probe_rate(kvm: &Kvm) -> Result<StepRate, String> {
    let mut vm = ProbeVm::new(kvm, Cpl::Kernel, COUNT_ENTRY, u32::MAX, 0)?;
    vm.set_debug(KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP, [0; 8])?;
    let start = Instant::now();
    let mut steps = 0u64;
    while start.elapsed() < RATE_BUDGET {
        match vm.run()? {
            Stop::Debug { exception, .. } if exception == DB_VECTOR => steps += 1,
            other => {
                return Err(format!(
                    "the rate run stopped with {} after {steps} steps",
                    other.describe()
                ))
            }
        }
    }
    let micros = elapsed_micros(start);

    let mut free = ProbeVm::new(kvm, Cpl::Kernel, COUNT_ENTRY, FREE_LOOPS, 0)?;
    let start = Instant::now();
    let count = match free.run()? {
        Stop::Report(count) => u64::from(count),
        other => {
            return Err(format!(
                "the unstepped run stopped with {}",
                other.describe()
            ))
        }
    };
    Ok(StepRate {
        steps,
        micros,
        free_instructions: count + UNCOUNTED,
        free_micros: elapsed_micros(start),
    })
}

fn elapsed_micros(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rep_counts_per_iteration_as_a_whole_or_otherwise() {
        assert_eq!(RepCount::classify(40, 40), RepCount::PerIteration);
        assert_eq!(RepCount::classify(1, 40), RepCount::WholeInstruction);
        assert_eq!(RepCount::classify(39, 40), RepCount::Other(39));
    }

    #[test]
    fn exactness_needs_the_count_and_a_rep_rule() {
        let exact = StepExactness {
            guest_count: 900,
            stepped: 904,
            expected: 904,
            rep_iterations: 40,
            rep_steps: 40,
            rep_count: RepCount::PerIteration,
        };
        assert!(exact.exact());
        assert!(!StepExactness {
            stepped: 903,
            ..exact.clone()
        }
        .exact());
        assert!(!StepExactness {
            rep_count: RepCount::Other(3),
            ..exact
        }
        .exact());
    }

    #[test]
    fn rates_are_per_second_and_survive_zero_time() {
        let rate = StepRate {
            steps: 5000,
            micros: 500_000,
            free_instructions: 9_000_004,
            free_micros: 0,
        };
        assert_eq!(rate.steps_per_second(), 10_000);
        assert_eq!(rate.free_instructions_per_second(), 9_000_004_000_000);
    }
}
