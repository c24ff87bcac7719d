//! The stall guard: a run always ends, even when its guest executes without
//! ever making a VM exit.
//!
//! Virtual time moves only at guest-caused exits, so a guest spinning in
//! user space (`while :; do :; done`) never reaches `--until`, and interrupts
//! (injected only at exits) never preempt it. Where no instruction counter
//! can preempt the guest (every host detvisor runs on today), the guard
//! measures *wall* time without a guest-caused exit and ends the run
//! when it exceeds the stall timeout.
//!
//! How: a POSIX timer (`timer_create` with `SIGEV_THREAD_ID`) aimed at the
//! thread that runs the vCPU sends it [`stall_signal`] periodically. The
//! signal is blocked in that thread outside `KVM_RUN` and unblocked inside it
//! (`KVM_SET_SIGNAL_MASK`), so it interrupts only guest execution, never a
//! host system call of the VMM. An interrupted `KVM_RUN` is a host event: the
//! exit loop looks at the guard and, unless the guest has gone the whole
//! timeout without an exit, enters the guest again without counting,
//! recording or timing anything, as for any `EINTR`. A look that does not
//! stop the run leaves the history untouched.
//!
//! The stop itself is a limit of detvisor on this host, not an event of the
//! history: it is reported as its own outcome (`stalled`), with the last
//! guest-caused exit, its RIP and the virtual time, all of which are the
//! same in every run of one seed; the digest of a stalled run leaves out
//! guest memory (which the guest kept changing after its last exit).

use devices::time::DurationError;
use devices::VirtNanos;
use kvm_bindings::KVMIO;
use kvm_ioctls::VcpuFd;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Once;
use std::time::{Duration, Instant};
use vmm_sys_util::ioctl::ioctl_with_ref;
use vmm_sys_util::ioctl_iow_nr;

ioctl_iow_nr!(
    KVM_SET_SIGNAL_MASK,
    KVMIO,
    0x8b,
    kvm_bindings::kvm_signal_mask
);

/// Wall time a guest may execute without a VM exit before the run ends as
/// `stalled`. Written and read with the duration grammar of virtual times
/// (`60s`, `500ms`); `0` turns the guard off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StallTimeout(pub Duration);

impl StallTimeout {
    /// On hardware KVM: a minute of guest execution without one exit is far
    /// beyond any kernel or service (timer ticks need exits, but every
    /// syscall that touches a device, every idle HLT is one).
    pub const HARDWARE: StallTimeout = StallTimeout(Duration::from_secs(60));
    /// In the helper VM (nested KVM under QEMU TCG) the same wall time is
    /// about 100x less guest work; the default there is ten times the
    /// hardware one, a compromise between sparing long computations and
    /// ending a hang within minutes.
    pub const HELPER_VM: StallTimeout = StallTimeout(Duration::from_secs(600));

    /// Whether the guard is on.
    pub fn enabled(self) -> bool {
        !self.0.is_zero()
    }

    /// How often the guard looks: often enough to stop within an eighth of
    /// the timeout, at most once per 10 ms and at least once a second.
    fn period(self) -> Duration {
        (self.0 / 8).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

impl Default for StallTimeout {
    fn default() -> Self {
        StallTimeout::HARDWARE
    }
}

impl FromStr for StallTimeout {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let nanos: VirtNanos = text.parse()?;
        Ok(StallTimeout(Duration::from_nanos(nanos.0)))
    }
}

impl fmt::Display for StallTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX);
        VirtNanos(nanos).fmt(f)
    }
}

/// Why the stall guard could not be set up for a vCPU thread: which step
/// failed, and the OS's error.
#[derive(Debug, thiserror::Error)]
#[error("the stall guard: {what}")]
pub struct StallGuardError {
    what: &'static str,
    #[source]
    source: std::io::Error,
}

/// The real-time signal that interrupts `KVM_RUN` for the guard to look.
pub fn stall_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN() + 1
}

extern "C" fn on_stall_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Nothing to do: the signal's only purpose is to make KVM_RUN return EINTR.
}

/// The guard of one session: the timeout, the exit count its last look saw
/// and since when, and the timer aimed at the thread running the vCPU.
///
/// It reads the wall clock only when it looks (a few times per timeout),
/// never per exit: a look that finds a new exit count starts the measure
/// again. So the run stops between the timeout and the timeout plus one
/// period after the last exit.
#[derive(Debug)]
pub(crate) struct StallGuard {
    timeout: StallTimeout,
    /// The exit count at the last look, and the wall time it was first seen
    /// (`None`: no look since the guard was armed).
    seen: Option<(u64, Instant)>,
    timer: Option<ThreadTimer>,
}

impl StallGuard {
    pub(crate) fn new(timeout: StallTimeout) -> Self {
        StallGuard {
            timeout,
            seen: None,
            timer: None,
        }
    }

    pub(crate) fn timeout(&self) -> StallTimeout {
        self.timeout
    }

    /// Changes the timeout (the timer follows at the next [`Self::arm`]).
    pub(crate) fn set_timeout(&mut self, timeout: StallTimeout) {
        if timeout != self.timeout {
            self.timeout = timeout;
            self.timer = None;
        }
    }

    /// Called before the exit loop enters the guest for a run: makes sure
    /// the timer is aimed at this thread and starts the measure over at the
    /// next look (time the VMM spent between runs is not the guest's).
    pub(crate) fn arm(&mut self, vcpu: &VcpuFd) -> Result<(), StallGuardError> {
        self.seen = None;
        if !self.timeout.enabled() {
            self.timer = None;
            return Ok(());
        }
        let tid = current_tid();
        if self.timer.as_ref().is_some_and(|timer| timer.tid == tid) {
            return Ok(());
        }
        self.timer = None;
        self.timer = Some(ThreadTimer::start(vcpu, tid, self.timeout.period())?);
        Ok(())
    }

    /// Whether the guest, at `exits` exits as of `now`, has run the whole
    /// timeout without a new exit since the look that first saw that count.
    pub(crate) fn stalled_at(&mut self, exits: u64, now: Instant) -> bool {
        match self.seen {
            Some((seen, since)) if seen == exits => {
                self.timeout.enabled() && now.saturating_duration_since(since) >= self.timeout.0
            }
            _ => {
                self.seen = Some((exits, now));
                false
            }
        }
    }

    /// Called when `KVM_RUN` was interrupted, with the exits handled so far:
    /// takes this guard's signal if it is pending (it stays pending
    /// otherwise, since the thread blocks it, and would interrupt every
    /// later `KVM_RUN` at once), then says whether the guest has stalled.
    pub(crate) fn look(&mut self, exits: u64) -> bool {
        if self.timer.is_some() {
            take_pending(stall_signal());
        }
        self.stalled_at(exits, Instant::now())
    }

    /// Takes this guard's signal if it is pending, judging nothing: for
    /// what enters the guest without making exits on purpose (single
    /// steps as an observer, bounded by their own count). The wall time
    /// they take is not the guest's: the guard's watch starts afresh.
    pub(crate) fn take_signal(&mut self) {
        if self.timer.is_some() {
            take_pending(stall_signal());
        }
        self.seen = None;
    }
}

/// Takes `signal` if it is pending for this thread (blocked there, so only
/// `sigtimedwait` can take it), without waiting.
fn take_pending(signal: libc::c_int) {
    // SAFETY: plain data; the calls read the set and write nothing else.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        let now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // EAGAIN when it was not pending: nothing to take.
        libc::sigtimedwait(&set, std::ptr::null_mut(), &now);
    }
}

/// This thread's id (asked of the kernel once per thread: `arm` runs before
/// every step of a stepped run, and the pmu clock's counter is checked
/// before every entry).
pub(crate) fn current_tid() -> libc::pid_t {
    thread_local! {
        // SAFETY: gettid has no preconditions and cannot fail.
        static TID: libc::pid_t = unsafe { libc::gettid() };
    }
    TID.with(|tid| *tid)
}

/// A periodic POSIX timer that signals one thread, which blocks the signal
/// except inside `KVM_RUN`.
#[derive(Debug)]
struct ThreadTimer {
    id: libc::timer_t,
    tid: libc::pid_t,
}

// SAFETY: a timer_t is a kernel handle (an integer in a pointer); any thread
// may delete it.
unsafe impl Send for ThreadTimer {}

/// `KVM_SET_SIGNAL_MASK`'s argument: the length of the kernel's sigset (8
/// bytes on x86-64) and the set.
#[repr(C)]
struct KvmSignalMask {
    len: u32,
    sigset: u64,
}

impl ThreadTimer {
    fn start(vcpu: &VcpuFd, tid: libc::pid_t, period: Duration) -> Result<Self, StallGuardError> {
        let signal = stall_signal();
        static HANDLER: Once = Once::new();
        let mut registered = Ok(());
        HANDLER.call_once(|| {
            registered = vmm_sys_util::signal::register_signal_handler(signal, on_stall_signal)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno()));
        });
        registered.map_err(|source| StallGuardError {
            what: "registering its signal handler",
            source,
        })?;

        // Blocked in this thread outside KVM_RUN; KVM_RUN runs with the
        // thread's mask minus the signal.
        // SAFETY: sigset_t is plain data; the libc calls only write into the
        // sets we pass and read the signal number.
        let mut thread_mask: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; `block` is a valid, initialized set.
        let rc = unsafe {
            let mut block: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut block);
            libc::sigaddset(&mut block, signal);
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut thread_mask)
        };
        if rc != 0 {
            return Err(StallGuardError {
                what: "blocking its signal",
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        // The kernel's sigset is a 64-bit mask, bit n-1 for signal n; the
        // first 8 bytes of glibc's sigset_t are that mask.
        // SAFETY: sigset_t is at least 8 bytes of plain data.
        let mut mask: u64 =
            unsafe { std::ptr::read_unaligned(&thread_mask as *const _ as *const u64) };
        mask &= !(1u64 << (signal - 1));
        let kvm_mask = KvmSignalMask {
            len: 8,
            sigset: mask,
        };
        // SAFETY: `vcpu` is a valid vCPU fd; KVM_SET_SIGNAL_MASK reads the
        // header and `len` bytes of set that follow it, all inside `kvm_mask`.
        if unsafe { ioctl_with_ref(vcpu, KVM_SET_SIGNAL_MASK(), &kvm_mask) } != 0 {
            return Err(StallGuardError {
                what: "KVM_SET_SIGNAL_MASK",
                source: std::io::Error::last_os_error(),
            });
        }

        // SAFETY: sigevent is plain data; zero is a valid start for it.
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = signal;
        event.sigev_notify_thread_id = tid;
        let mut id: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `event` and `id` are valid for the call; the kernel copies
        // the event and writes the new timer's id.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut id) } != 0 {
            return Err(StallGuardError {
                what: "timer_create",
                source: std::io::Error::last_os_error(),
            });
        }
        let timer = ThreadTimer { id, tid };
        let interval = libc::timespec {
            tv_sec: period.as_secs() as libc::time_t,
            tv_nsec: period.subsec_nanos() as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: interval,
            it_value: interval,
        };
        // SAFETY: `timer.id` is the timer just created; `spec` is read only.
        if unsafe { libc::timer_settime(timer.id, 0, &spec, std::ptr::null_mut()) } != 0 {
            return Err(StallGuardError {
                what: "timer_settime",
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(timer)
    }
}

impl Drop for ThreadTimer {
    fn drop(&mut self) {
        // SAFETY: the id is a timer this value created and deletes once.
        unsafe {
            libc::timer_delete(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run's error names the guard's failed step once and keeps the OS's
    /// error as its cause (the chain `detvisor` prints).
    #[test]
    fn test_a_guard_error_reads_as_one_step_and_its_cause() {
        use std::error::Error as _;
        let error = crate::vm::VmError::from(StallGuardError {
            what: "timer_create",
            source: std::io::Error::from_raw_os_error(libc::EAGAIN),
        });
        assert_eq!(error.to_string(), "the stall guard: timer_create");
        let cause = error.source().unwrap();
        assert_eq!(
            cause.to_string(),
            std::io::Error::from_raw_os_error(libc::EAGAIN).to_string()
        );
        assert!(cause.source().is_none());
    }

    #[test]
    fn test_timeout_grammar_round_trips() {
        for text in ["60s", "500ms", "10m", "0"] {
            let timeout: StallTimeout = text.parse().unwrap();
            assert_eq!(
                timeout.to_string().parse::<StallTimeout>().unwrap(),
                timeout
            );
        }
        assert_eq!(
            "5s".parse::<StallTimeout>().unwrap().0,
            Duration::from_secs(5)
        );
        assert!("soon".parse::<StallTimeout>().is_err());
    }

    #[test]
    fn test_stalled_only_after_the_whole_timeout_without_an_exit() {
        let mut guard = StallGuard::new(StallTimeout(Duration::from_secs(5)));
        let start = Instant::now();
        // The first look starts the measure.
        assert!(!guard.stalled_at(10, start));
        assert!(!guard.stalled_at(10, start + Duration::from_secs(4)));
        assert!(guard.stalled_at(10, start + Duration::from_secs(5)));
        // A new exit starts it again.
        let seen = start + Duration::from_secs(6);
        assert!(!guard.stalled_at(11, seen));
        assert!(!guard.stalled_at(11, seen + Duration::from_millis(4999)));
        assert!(guard.stalled_at(11, seen + Duration::from_secs(5)));
    }

    #[test]
    fn test_zero_timeout_never_stalls() {
        let mut guard = StallGuard::new("0".parse().unwrap());
        let start = Instant::now();
        assert!(!guard.stalled_at(3, start));
        assert!(!guard.stalled_at(3, start + Duration::from_secs(1_000_000)));
    }

    #[test]
    fn test_period_is_an_eighth_within_bounds() {
        assert_eq!(StallTimeout::HARDWARE.period(), Duration::from_secs(1));
        assert_eq!(
            StallTimeout(Duration::from_secs(2)).period(),
            Duration::from_millis(250)
        );
        assert_eq!(
            StallTimeout(Duration::from_millis(1)).period(),
            Duration::from_millis(10)
        );
    }
}
