//! The hardware counter behind the `pmu` clock: a perf event of guest-only
//! retired conditional branches (rr's choice: deterministic where retired
//! instructions overcount) or, where the CPU has no such event, retired
//! instructions, counted on the thread that enters the guest.
//!
//! Two descriptors, as rr keeps them: one only counts (it is read at every
//! stop), the other samples with the period [`GuestEventCounter::arm_overflow`]
//! asks for and, on overflow, sends [`overflow_signal`] to the vCPU's
//! thread. The counter counts only guest-mode events (`exclude_host`), so
//! its overflow comes while the thread is inside `KVM_RUN`, which then
//! returns `EINTR`: the guest only stopped, and the session steps on to
//! the exact count from there. The signal places nothing: where an
//! interrupt lands is decided by the count alone.
//!
//! This needs a PMU. No machine here has one (perf_event_open fails with
//! ENOENT on the host and in the helper VM), so this file's descriptors
//! were never opened here; its failure paths were (see docs/determinism.md).

use super::{CountedEvent, GuestEventCounter, PmuCounter};
use crate::stall::current_tid;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

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

pub(crate) const PERF_TYPE_HARDWARE: u32 = 0;
pub(crate) const PERF_TYPE_RAW: u32 = 4;
pub(crate) const PERF_COUNT_HW_INSTRUCTIONS: u64 = 1;
const FLAG_DISABLED: u64 = 1 << 0;
const FLAG_PINNED: u64 = 1 << 2;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
const FLAG_EXCLUDE_HOST: u64 = 1 << 19;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
// _IO('$', 0), _IO('$', 1), _IO('$', 3), _IOW('$', 4, u64)
pub(crate) const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
pub(crate) const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
pub(crate) const PERF_EVENT_IOC_RESET: libc::c_ulong = 0x2403;
pub(crate) const PERF_EVENT_IOC_PERIOD: libc::c_ulong = 0x4008_2404;
/// The perf requests the VMM makes once a guest runs (its seccomp filter
/// allows exactly these).
pub const PERF_IOCTLS: &[libc::c_ulong] = &[
    PERF_EVENT_IOC_ENABLE,
    PERF_EVENT_IOC_DISABLE,
    PERF_EVENT_IOC_RESET,
    PERF_EVENT_IOC_PERIOD,
];

/// The signal a counter's overflow sends to the vCPU's thread: its only
/// purpose is to make `KVM_RUN` return.
pub fn overflow_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN() + 2
}

extern "C" fn on_overflow_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Nothing to do: the session reads the counter when KVM_RUN returns.
}

/// Why a perf event could not be opened or driven. The system's error is
/// in the message (these are read as one line: `check` and the refusal
/// of `--clock pmu` print them), so there is no separate source.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    #[error("perf_event_open: {0}")]
    Open(std::io::Error),
    #[error("perf {what}: {error}")]
    Control {
        what: &'static str,
        error: std::io::Error,
    },
}

impl PerfError {
    /// The errno of a failed open (the probe reports it).
    pub fn open_errno(&self) -> Option<i32> {
        match self {
            PerfError::Open(error) => error.raw_os_error(),
            PerfError::Control { .. } => None,
        }
    }
}

/// Opens a disabled, guest-only event on this thread, sampling every
/// `period` events if given.
pub(crate) fn open_event(type_: u32, config: u64, period: Option<u64>) -> Result<File, PerfError> {
    let attr = PerfEventAttr {
        type_,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config,
        sample_period: period.unwrap_or(0),
        wakeup_events: u32::from(period.is_some()),
        flags: FLAG_DISABLED | FLAG_PINNED | FLAG_EXCLUDE_HOST | FLAG_EXCLUDE_HV,
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
        return Err(PerfError::Open(std::io::Error::last_os_error()));
    }
    let fd = i32::try_from(fd).map_err(|_| {
        PerfError::Open(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "perf_event_open returned no descriptor",
        ))
    })?;
    // SAFETY: `fd` was just returned by perf_event_open and nothing else
    // owns it.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// A perf request without an argument (`ENABLE`, `DISABLE`, `RESET`).
pub(crate) fn event_ioctl(
    file: &File,
    request: libc::c_ulong,
    what: &'static str,
) -> Result<(), PerfError> {
    // SAFETY: a perf event descriptor the caller owns; these requests take
    // no argument.
    if unsafe { libc::ioctl(file.as_raw_fd(), request as _, 0) } < 0 {
        return Err(PerfError::Control {
            what,
            error: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The event's count so far.
pub(crate) fn read_event(mut file: &File) -> Result<u64, PerfError> {
    let mut bytes = [0u8; 8];
    file.read_exact(&mut bytes)
        .map_err(|error| PerfError::Control {
            what: "read",
            error,
        })?;
    Ok(u64::from_ne_bytes(bytes))
}

/// `F_SETOWN_EX`'s argument.
#[repr(C)]
struct FOwnerEx {
    kind: libc::c_int,
    pid: libc::pid_t,
}
const F_OWNER_TID: libc::c_int = 0;
// <asm-generic/fcntl.h>: not in the libc crate.
const F_SETSIG: libc::c_int = 10;
const F_SETOWN_EX: libc::c_int = 15;

/// Makes `file`'s overflow send [`overflow_signal`] to thread `tid`.
fn signal_thread_on_overflow(file: &File, tid: libc::pid_t) -> Result<(), PerfError> {
    // Registered once; a failure is kept, so no later counter is armed
    // without the handler (the signal's default action ends the process).
    static HANDLER: OnceLock<Result<(), i32>> = OnceLock::new();
    let registered = HANDLER.get_or_init(|| {
        vmm_sys_util::signal::register_signal_handler(overflow_signal(), on_overflow_signal)
            .map_err(|e| e.errno())
    });
    registered.map_err(|errno| PerfError::Control {
        what: "overflow signal handler",
        error: std::io::Error::from_raw_os_error(errno),
    })?;
    let fd = file.as_raw_fd();
    let owner = FOwnerEx {
        kind: F_OWNER_TID,
        pid: tid,
    };
    let control = |what, rc: libc::c_int| {
        if rc < 0 {
            Err(PerfError::Control {
                what,
                error: std::io::Error::last_os_error(),
            })
        } else {
            Ok(())
        }
    };
    // SAFETY: fcntl on a descriptor this process owns; F_SETOWN_EX reads
    // the `owner` struct, which lives across the call.
    control("F_SETOWN_EX", unsafe {
        libc::fcntl(fd, F_SETOWN_EX, &owner as *const FOwnerEx)
    })?;
    // SAFETY: as above; F_SETSIG and F_SETFL take integers.
    control("F_SETSIG", unsafe {
        libc::fcntl(fd, F_SETSIG, overflow_signal())
    })?;
    // SAFETY: as above.
    control("F_SETFL", unsafe {
        libc::fcntl(fd, libc::F_SETFL, libc::O_ASYNC)
    })
}

/// The CPU perf counts on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CpuModel {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
    /// Two kinds of cores (perf has a `cpu_core` PMU): a raw event is one
    /// kind's.
    #[serde(default)]
    pub hybrid: bool,
}

impl CpuModel {
    /// This host's, from /proc/cpuinfo.
    pub fn host() -> Option<CpuModel> {
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
            hybrid: std::path::Path::new("/sys/bus/event_source/devices/cpu_core").exists(),
        })
    }

    /// Why this model's counters are not trusted, if they are not: the
    /// microarchitectures rr refuses to count on, Zen without the
    /// workaround rr needs there, and hybrid CPUs.
    pub fn unreliable(&self) -> Option<&'static str> {
        if self.hybrid {
            return Some(
                "a hybrid CPU: the counter of one kind of core stops counting when the vCPU's \
                 thread runs on the other",
            );
        }
        match (self.vendor.as_str(), self.family, self.model) {
            ("GenuineIntel", 6, 0x0f | 0x16 | 0x17 | 0x1d) => {
                Some("Intel Merom/Penryn: no reliable retired-branch counter")
            }
            ("AuthenticAMD", f, _) if f < 0x17 => {
                Some("AMD before Zen: no reliable retired-conditional-branch counter")
            }
            ("AuthenticAMD", _, _) => Some(
                "AMD Zen: retired conditional branches count exactly only with the \
                 SpecLockMap workaround rr applies, which detvisor does not",
            ),
            _ => None,
        }
    }

    /// The raw perf event of retired conditional branches on this model.
    pub fn conditional_branch_event(&self) -> Option<u64> {
        match (self.vendor.as_str(), self.family, self.model) {
            // Ice Lake, Tiger Lake, Rocket Lake, Alder and Raptor Lake,
            // Sapphire and Emerald Rapids, Meteor Lake: BR_INST_RETIRED.COND
            // (there 0x01 counts only taken ones).
            (
                "GenuineIntel",
                6,
                0x6a | 0x6c | 0x7d | 0x7e | 0x8c | 0x8d | 0x8f | 0x97 | 0x9a | 0xa7 | 0xaa | 0xac
                | 0xb7 | 0xba | 0xbf | 0xcf,
            ) => Some(0x5111c4),
            ("GenuineIntel", _, _) => Some(0x5101c4), // BR_INST_RETIRED.CONDITIONAL
            ("AuthenticAMD", _, _) => Some(0x5100d1), // Zen: retired conditional branches
            _ => None,
        }
    }

    /// Events the overflow may land after the one it was set for, as rr
    /// allows: Zen's interrupt comes later than Intel's.
    pub fn skid_margin(&self) -> u64 {
        match self.vendor.as_str() {
            "AuthenticAMD" => 1000,
            _ => 100,
        }
    }
}

/// A hardware counter of one event on the thread that opened it.
#[derive(Debug)]
pub struct PerfCounter {
    event: CountedEvent,
    /// Counts; read at every stop.
    counting: File,
    /// Samples with the armed period; its overflow signals `tid`.
    interrupt: File,
    /// The history's count when `counting` was last reset.
    base: u64,
    tid: libc::pid_t,
    margin: u64,
    /// The first error since the session last asked.
    error: Option<String>,
}

/// Why no hardware counter drives the `pmu` clock here.
#[derive(Debug, thiserror::Error)]
pub enum PmuUnavailable {
    #[error("this host's CPU is not known (/proc/cpuinfo has no vendor, family and model)")]
    UnknownCpu,
    #[error("counters known unreliable on this CPU ({0})")]
    Unreliable(&'static str),
    #[error(
        "no usable counter: retired conditional branches: {branches}; retired instructions: \
         {instructions}"
    )]
    NoCounter {
        branches: String,
        instructions: String,
    },
    #[error("the {event} counter: {error}")]
    Counter {
        event: CountedEvent,
        error: PerfError,
    },
}

impl PerfCounter {
    /// Opens a counter of `event` on this thread, or the best this CPU has
    /// (`None`: conditional branches, else instructions).
    pub fn open(event: Option<CountedEvent>) -> Result<PerfCounter, PmuUnavailable> {
        let cpu = CpuModel::host().ok_or(PmuUnavailable::UnknownCpu)?;
        let branches = |cpu: &CpuModel| match cpu.conditional_branch_event() {
            Some(config) => PerfCounter::open_event(
                CountedEvent::RetiredConditionalBranches,
                PERF_TYPE_RAW,
                config,
                cpu.skid_margin(),
            ),
            None => Err(PerfError::Open(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!("no known event for {}", cpu.vendor),
            ))),
        };
        let instructions = |cpu: &CpuModel| {
            PerfCounter::open_event(
                CountedEvent::RetiredInstructions,
                PERF_TYPE_HARDWARE,
                PERF_COUNT_HW_INSTRUCTIONS,
                cpu.skid_margin(),
            )
        };
        let wrap = |event| move |error| PmuUnavailable::Counter { event, error };
        // Opened first, so that a host without a PMU says so; a counter
        // that opens on a model known to count wrong is then refused.
        let counter = match event {
            Some(CountedEvent::RetiredConditionalBranches) => {
                branches(&cpu).map_err(wrap(CountedEvent::RetiredConditionalBranches))
            }
            Some(CountedEvent::RetiredInstructions) => {
                instructions(&cpu).map_err(wrap(CountedEvent::RetiredInstructions))
            }
            Some(other @ CountedEvent::EmulatedSteps) => Err(PmuUnavailable::Counter {
                event: other,
                error: PerfError::Open(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "not a hardware event",
                )),
            }),
            None => branches(&cpu).or_else(|b| {
                instructions(&cpu).map_err(|i| PmuUnavailable::NoCounter {
                    branches: b.to_string(),
                    instructions: i.to_string(),
                })
            }),
        }?;
        match cpu.unreliable() {
            Some(why) => Err(PmuUnavailable::Unreliable(why)),
            None => Ok(counter),
        }
    }

    fn open_event(
        event: CountedEvent,
        type_: u32,
        config: u64,
        margin: u64,
    ) -> Result<PerfCounter, PerfError> {
        let counting = open_event(type_, config, None)?;
        // The period is set at each arming; this one is never used.
        let interrupt = open_event(type_, config, Some(u64::MAX >> 1))?;
        let tid = current_tid();
        signal_thread_on_overflow(&interrupt, tid)?;
        event_ioctl(&counting, PERF_EVENT_IOC_RESET, "reset")?;
        event_ioctl(&counting, PERF_EVENT_IOC_ENABLE, "enable")?;
        Ok(PerfCounter {
            event,
            counting,
            interrupt,
            base: 0,
            tid,
            margin,
            error: None,
        })
    }

    fn failed(&mut self, error: PerfError) {
        self.error.get_or_insert_with(|| error.to_string());
    }

    fn arm(&mut self, after: Option<u64>) -> Result<(), PerfError> {
        event_ioctl(&self.interrupt, PERF_EVENT_IOC_DISABLE, "disable")?;
        let Some(period) = after else {
            return Ok(());
        };
        event_ioctl(&self.interrupt, PERF_EVENT_IOC_RESET, "reset")?;
        let period = period.max(1);
        // SAFETY: a perf descriptor this counter owns; PERIOD reads the u64
        // behind the pointer, which lives across the call.
        if unsafe {
            libc::ioctl(
                self.interrupt.as_raw_fd(),
                PERF_EVENT_IOC_PERIOD as _,
                &period as *const u64,
            )
        } < 0
        {
            return Err(PerfError::Control {
                what: "period",
                error: std::io::Error::last_os_error(),
            });
        }
        event_ioctl(&self.interrupt, PERF_EVENT_IOC_ENABLE, "enable")
    }
}

impl GuestEventCounter for PerfCounter {
    /// A counter that cannot be read (perf put a pinned event it could
    /// not schedule into an error state, and reads give nothing) reads as
    /// not moving, and its error is kept for [`PmuCounter::take_error`]:
    /// the session ends the run with it at its next entry.
    fn read(&mut self) -> u64 {
        match read_event(&self.counting) {
            Ok(count) => self.base.saturating_add(count),
            Err(error) => {
                self.failed(error);
                self.base
            }
        }
    }

    fn set(&mut self, count: u64) {
        match event_ioctl(&self.counting, PERF_EVENT_IOC_RESET, "reset") {
            Ok(()) => self.base = count,
            Err(error) => self.failed(error),
        }
    }

    fn arm_overflow(&mut self, after: Option<u64>) {
        if let Err(error) = self.arm(after) {
            self.failed(error);
            let _ = event_ioctl(&self.interrupt, PERF_EVENT_IOC_DISABLE, "disable");
        }
    }
}

impl PmuCounter for PerfCounter {
    fn event(&self) -> CountedEvent {
        self.event
    }

    fn skid_margin(&self) -> u64 {
        self.margin
    }

    fn counts_this_thread(&self) -> bool {
        self.tid == current_tid()
    }

    fn take_error(&mut self) -> Option<String> {
        self.error.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_is_perf_attr_size_ver0() {
        assert_eq!(std::mem::size_of::<PerfEventAttr>(), 64);
    }

    #[test]
    fn the_period_request_is_iow_dollar_4_u64() {
        // _IOW(type, nr, size) = (1 << 30) | (size << 16) | (type << 8) | nr
        assert_eq!(
            PERF_EVENT_IOC_PERIOD,
            (1 << 30) | (8 << 16) | ((b'$' as libc::c_ulong) << 8) | 4
        );
    }

    #[test]
    fn zen_skids_more_than_intel() {
        let model = |vendor: &str| CpuModel {
            vendor: vendor.into(),
            family: 0x19,
            model: 1,
            hybrid: false,
        };
        assert_eq!(model("AuthenticAMD").skid_margin(), 1000);
        assert_eq!(model("GenuineIntel").skid_margin(), 100);
    }

    /// Where perf has no hardware PMU (every machine here), opening says
    /// why for both events, naming perf_event_open's error. Where it has
    /// one, this test has nothing to check (tests/pmu_clock.rs runs the
    /// counter there).
    #[test]
    fn without_a_pmu_the_open_names_both_events() {
        let hardware = ["cpu", "cpu_core", "cpu_atom"].iter().any(|p| {
            std::path::Path::new("/sys/bus/event_source/devices")
                .join(p)
                .join("events")
                .exists()
        });
        if hardware {
            eprintln!("skipped: this host has a PMU");
            return;
        }
        match PerfCounter::open(None) {
            Err(PmuUnavailable::NoCounter {
                branches,
                instructions,
            }) => {
                assert_eq!(
                    instructions,
                    "perf_event_open: No such file or directory (os error 2)"
                );
                assert!(branches.starts_with("perf_event_open: "), "{branches}");
            }
            Err(PmuUnavailable::Unreliable(why)) => eprintln!("refused first for the model: {why}"),
            other => panic!("no PMU, yet: {other:?}"),
        }
    }
}
