//! Whether a perf counter of guest-only retired instructions and retired
//! conditional branches works on the vCPU thread, as a `pmu` clock needs.

use super::guest::{Cpl, ProbeVm, Stop, COUNT_ENTRY, UNCOUNTED};
use kvm_ioctls::Kvm;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};

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

/// The CPU perf would count on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuModel {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
}

impl CpuModel {
    /// Why this model's counters are not trusted, if they are not: the
    /// microarchitectures rr refuses to count on.
    pub fn unreliable(&self) -> Option<&'static str> {
        match (self.vendor.as_str(), self.family, self.model) {
            ("GenuineIntel", 6, 0x0f | 0x16 | 0x17 | 0x1d) => {
                Some("Intel Merom/Penryn: no reliable retired-branch counter")
            }
            ("AuthenticAMD", f, _) if f < 0x17 => {
                Some("AMD before Zen: no reliable retired-conditional-branch counter")
            }
            _ => None,
        }
    }

    /// The raw perf event of retired conditional branches on this model.
    fn conditional_branch_event(&self) -> Option<u64> {
        match self.vendor.as_str() {
            "GenuineIntel" => Some(0x5101c4), // BR_INST_RETIRED.CONDITIONAL
            "AuthenticAMD" => Some(0x5100d1), // Zen: retired conditional branches
            _ => None,
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
        if let Some(why) = self.cpu.as_ref().and_then(CpuModel::unreliable) {
            return Some(format!("counters known unreliable on this CPU ({why})"));
        }
        if self.instructions.usable() || self.conditional_branches.usable() {
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
            cpu: cpu_model(),
            hardware_pmu,
            instructions: failed(),
            conditional_branches: failed(),
        }
    }
}

/// `struct perf_event_attr` up to `config1` (PERF_ATTR_SIZE_VER0).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_RAW: u32 = 4;
const PERF_COUNT_HW_INSTRUCTIONS: u64 = 1;
const FLAG_DISABLED: u64 = 1 << 0;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
const FLAG_EXCLUDE_HOST: u64 = 1 << 19;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
// _IO('$', 0), _IO('$', 1), _IO('$', 3)
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
const PERF_EVENT_IOC_RESET: libc::c_ulong = 0x2403;

/// Opens a disabled guest-only counter on this thread.
fn open_counter(type_: u32, config: u64) -> Result<File, Counter> {
    let attr = PerfEventAttr {
        type_,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config,
        flags: FLAG_DISABLED | FLAG_EXCLUDE_HOST | FLAG_EXCLUDE_HV,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid perf_event_attr of the size it states and
    // lives across the call; pid 0 / cpu -1 counts this thread anywhere.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            0 as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        return Err(Counter::OpenFailed {
            errno: error.raw_os_error().unwrap_or(0),
            error: error.to_string(),
        });
    }
    let fd = i32::try_from(fd).map_err(|_| Counter::Failed {
        reason: "perf_event_open returned no descriptor".into(),
    })?;
    // SAFETY: `fd` was just returned by perf_event_open and nothing else
    // owns it.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn counter_ioctl(file: &File, request: libc::c_ulong) -> Result<(), Counter> {
    use std::os::fd::AsRawFd;
    // SAFETY: a perf event descriptor this function's caller owns; these
    // requests take no argument.
    if unsafe { libc::ioctl(file.as_raw_fd(), request as _, 0) } < 0 {
        return Err(Counter::Failed {
            reason: format!("perf ioctl: {}", std::io::Error::last_os_error()),
        });
    }
    Ok(())
}

/// Counts one unstepped run of the counting guest with one counter.
fn count_guest(kvm: &Kvm, type_: u32, config: u64, expected: u64) -> Counter {
    let run = || -> Result<Counter, Counter> {
        let mut vm = ProbeVm::new(kvm, Cpl::Kernel, COUNT_ENTRY, PMU_LOOPS, 0)
            .map_err(|reason| Counter::Failed { reason })?;
        let counter = open_counter(type_, config)?;
        counter_ioctl(&counter, PERF_EVENT_IOC_RESET)?;
        counter_ioctl(&counter, PERF_EVENT_IOC_ENABLE)?;
        let stop = vm.run();
        counter_ioctl(&counter, PERF_EVENT_IOC_DISABLE)?;
        match stop {
            Ok(Stop::Report(_)) => {}
            Ok(other) => {
                return Err(Counter::Failed {
                    reason: format!("the counted guest stopped with {}", other.describe()),
                })
            }
            Err(reason) => return Err(Counter::Failed { reason }),
        }
        let mut bytes = [0u8; 8];
        (&counter)
            .read_exact(&mut bytes)
            .map_err(|e| Counter::Failed {
                reason: format!("reading the counter: {e}"),
            })?;
        Ok(Counter::Counted {
            count: u64::from_ne_bytes(bytes),
            expected,
        })
    };
    run().unwrap_or_else(|c| c)
}

fn cpu_model() -> Option<CpuModel> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    };
    Some(CpuModel {
        vendor: field("vendor_id")?,
        family: field("cpu family")?.parse().ok()?,
        model: field("model")?.parse().ok()?,
    })
}

/// Tries both counters on this thread around a run of the counting guest.
pub fn probe_pmu(kvm: &Kvm, hardware_pmu: bool) -> PmuProbe {
    let cpu = cpu_model();
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
    fn the_size_is_perf_attr_size_ver0() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 64);
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
        let zen = CpuModel {
            vendor: "AuthenticAMD".into(),
            family: 0x19,
            model: 1,
        };
        assert_eq!(probe(good, Some(zen)).why_unavailable(), None);
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
        };
        let why = probe(good, Some(penryn)).why_unavailable().unwrap();
        assert!(
            why.starts_with("counters known unreliable on this CPU (Intel Merom/Penryn"),
            "{why}"
        );
    }
}
