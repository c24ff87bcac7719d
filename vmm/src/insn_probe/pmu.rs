//! Whether a perf counter of guest-only retired instructions and retired
//! conditional branches works on the vCPU thread, as a `pmu` clock needs.

use super::guest::{Cpl, ProbeVm, Stop, COUNT_ENTRY, UNCOUNTED};
pub use crate::pmu_clock::perf::CpuModel;
use crate::pmu_clock::perf::{
    event_ioctl, open_event, read_event, PerfError, PERF_COUNT_HW_INSTRUCTIONS,
    PERF_EVENT_IOC_DISABLE, PERF_EVENT_IOC_ENABLE, PERF_EVENT_IOC_RESET, PERF_TYPE_HARDWARE,
    PERF_TYPE_RAW,
};
use kvm_ioctls::Kvm;
use serde::{Deserialize, Serialize};

/// Loop iterations of the counted run.
pub const PMU_LOOPS: u32 = 10_000;
/// Instructions a counter may count beyond the guest's own (entry and exit
/// through KVM, overcounts), and still be believed.
const SLACK: u64 = 10_000;

/// The events a `pmu` clock could count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    RetiredInstructions,
    RetiredConditionalBranches,
}

impl Event {
    pub fn name(self) -> &'static str {
        match self {
            Event::RetiredInstructions => "retired instructions",
            Event::RetiredConditionalBranches => "retired conditional branches",
        }
    }
}

/// One counter's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Counter {
    /// Counted this much of the guest's run, which should have given at
    /// least `expected`.
    Counted { count: u64, expected: u64 },
    /// perf_event_open failed with this errno.
    OpenFailed { errno: i32, error: String },
    /// Something else went wrong.
    Failed { reason: String },
}

impl Counter {
    pub fn usable(&self) -> bool {
        matches!(self, Counter::Counted { count, expected } if *count >= *expected && *count <= expected + SLACK)
    }

    pub fn why_not(&self) -> Option<String> {
        match self {
            _ if self.usable() => None,
            Counter::Counted { count, expected } => Some(format!(
                "counted {count} where the guest ran at least {expected}"
            )),
            Counter::OpenFailed { error, .. } => Some(format!("perf_event_open: {error}")),
            Counter::Failed { reason } => Some(reason.clone()),
        }
    }
}

/// Both counters, on this CPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmuProbe {
    pub cpu: Option<CpuModel>,
    /// A hardware PMU is registered with perf (sysfs).
    pub hardware_pmu: bool,
    pub instructions: Counter,
    pub conditional_branches: Counter,
}

impl PmuProbe {
    /// Why a `pmu` clock cannot run here, or `None` if it can.
    pub fn why_unavailable(&self) -> Option<String> {
        let counts = self.instructions.usable() || self.conditional_branches.usable();
        // Without a PMU that is the reason; with one, the model may be.
        if counts || self.hardware_pmu {
            if let Some(why) = self.cpu.as_ref().and_then(CpuModel::unreliable) {
                return Some(format!("counters known unreliable on this CPU ({why})"));
            }
        }
        if counts {
            return None;
        }
        let lead = if self.hardware_pmu {
            "no usable guest-only counter"
        } else {
            "no usable PMU (perf has no hardware PMU here)"
        };
        Some(format!(
            "{lead}: {}: {}; {}: {}",
            Event::RetiredInstructions.name(),
            self.instructions.why_not().unwrap_or_default(),
            Event::RetiredConditionalBranches.name(),
            self.conditional_branches.why_not().unwrap_or_default()
        ))
    }
}

impl PmuProbe {
    /// No counter tried, for `reason`.
    pub fn unprobed(hardware_pmu: bool, reason: &str) -> PmuProbe {
        let failed = || Counter::Failed {
            reason: reason.to_string(),
        };
        PmuProbe {
            cpu: CpuModel::host(),
            hardware_pmu,
            instructions: failed(),
            conditional_branches: failed(),
        }
    }
}

impl From<PerfError> for Counter {
    fn from(error: PerfError) -> Counter {
        match error.open_errno() {
            Some(errno) => Counter::OpenFailed {
                errno,
                error: match error {
                    PerfError::Open(error) => error.to_string(),
                    other => other.to_string(),
                },
            },
            None => Counter::Failed {
                reason: error.to_string(),
            },
        }
    }
}

/// Counts one unstepped run of the counting guest with one counter.
fn count_guest(kvm: &Kvm, type_: u32, config: u64, expected: u64) -> Counter {
    let run = || -> Result<Counter, Counter> {
        let mut vm = ProbeVm::new(kvm, Cpl::Kernel, COUNT_ENTRY, PMU_LOOPS, 0)
            .map_err(|reason| Counter::Failed { reason })?;
        let counter = open_event(type_, config, None)?;
        event_ioctl(&counter, PERF_EVENT_IOC_RESET, "reset")?;
        event_ioctl(&counter, PERF_EVENT_IOC_ENABLE, "enable")?;
        let stop = vm.run();
        event_ioctl(&counter, PERF_EVENT_IOC_DISABLE, "disable")?;
        match stop {
            Ok(Stop::Report(_)) => {}
            Ok(other) => {
                return Err(Counter::Failed {
                    reason: format!("the counted guest stopped with {}", other.describe()),
                })
            }
            Err(reason) => return Err(Counter::Failed { reason }),
        }
        Ok(Counter::Counted {
            count: read_event(&counter)?,
            expected,
        })
    };
    run().unwrap_or_else(|c| c)
}

/// Tries both counters on this thread around a run of the counting guest.
pub fn probe_pmu(kvm: &Kvm, hardware_pmu: bool) -> PmuProbe {
    let cpu = CpuModel::host();
    let loops = u64::from(PMU_LOOPS);
    let instructions = count_guest(
        kvm,
        PERF_TYPE_HARDWARE,
        PERF_COUNT_HW_INSTRUCTIONS,
        3 * loops + UNCOUNTED,
    );
    let conditional_branches = match cpu.as_ref().and_then(CpuModel::conditional_branch_event) {
        Some(event) => count_guest(kvm, PERF_TYPE_RAW, event, loops),
        None => Counter::Failed {
            reason: "no known conditional-branch event for this CPU vendor".into(),
        },
    };
    PmuProbe {
        cpu,
        hardware_pmu,
        instructions,
        conditional_branches,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enoent() -> Counter {
        Counter::OpenFailed {
            errno: 2,
            error: "No such file or directory (os error 2)".into(),
        }
    }

    fn probe(instructions: Counter, cpu: Option<CpuModel>) -> PmuProbe {
        PmuProbe {
            cpu,
            hardware_pmu: false,
            instructions,
            conditional_branches: enoent(),
        }
    }

    #[test]
    fn no_pmu_says_why_for_both_counters() {
        let why = probe(enoent(), None).why_unavailable().unwrap();
        assert_eq!(
            why,
            "no usable PMU (perf has no hardware PMU here): retired instructions: \
             perf_event_open: No such file or directory (os error 2); retired conditional \
             branches: perf_event_open: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_counter_that_counts_the_guest_makes_the_clock_available() {
        let good = Counter::Counted {
            count: 30_010,
            expected: 30_004,
        };
        assert_eq!(probe(good.clone(), None).why_unavailable(), None);
        let skylake = CpuModel {
            vendor: "GenuineIntel".into(),
            family: 6,
            model: 0x55,
            hybrid: false,
        };
        assert_eq!(
            probe(good.clone(), Some(skylake.clone())).why_unavailable(),
            None
        );
        // Zen without rr's workaround, and a hybrid CPU, are refused.
        let zen = CpuModel {
            vendor: "AuthenticAMD".into(),
            family: 0x19,
            model: 1,
            hybrid: false,
        };
        let why = probe(good.clone(), Some(zen)).why_unavailable().unwrap();
        assert!(why.contains("SpecLockMap"), "{why}");
        let hybrid = CpuModel {
            hybrid: true,
            ..skylake
        };
        let why = probe(good, Some(hybrid)).why_unavailable().unwrap();
        assert!(why.contains("hybrid"), "{why}");
    }

    #[test]
    fn a_counter_that_misses_the_guest_is_not_usable() {
        let zero = Counter::Counted {
            count: 0,
            expected: 30_004,
        };
        assert!(!zero.usable());
        assert_eq!(
            zero.why_not().unwrap(),
            "counted 0 where the guest ran at least 30004"
        );
        assert!(!Counter::Counted {
            count: 30_004 + SLACK + 1,
            expected: 30_004
        }
        .usable());
    }

    #[test]
    fn a_known_unreliable_model_is_refused_even_with_a_counter() {
        let good = Counter::Counted {
            count: 30_004,
            expected: 30_004,
        };
        let penryn = CpuModel {
            vendor: "GenuineIntel".into(),
            family: 6,
            model: 0x17,
            hybrid: false,
        };
        let why = probe(good, Some(penryn)).why_unavailable().unwrap();
        assert!(
            why.starts_with("counters known unreliable on this CPU (Intel Merom/Penryn"),
            "{why}"
        );
    }
}
