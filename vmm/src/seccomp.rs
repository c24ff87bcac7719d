//! seccomp for the VMM: the allowlist the threads that run guests (and, in
//! processes detvisor owns, every thread) run under once a guest is set up,
//! and what happens when something outside it is tried.
//!
//! A guest is hostile or buggy by design; a flaw in a device model it can
//! reach should not hand it the host. Once a session has its KVM fds, its
//! guest memory and its files, the thread that enters the guest installs a
//! BPF filter (built with rust-vmm's `seccompiler`) before its first
//! `KVM_RUN`: file, memory (never executable), thread, timer and KVM calls are allowed (later
//! requests on the same thread open snapshots, spill, reset and boot again,
//! so those stay); network sockets, `execve`, `ptrace`, mounts, namespaces,
//! modules, BPF, perf, keys and ioctls other than KVM's and a terminal's
//! are not. A filter cannot be taken off: it holds for the thread (or the
//! process) from then on, and threads spawned later inherit it.
//!
//! Anything outside the list traps (`SECCOMP_RET_TRAP`): the SIGSYS
//! handler writes the syscall's number and name and the thread to stderr,
//! records the first violation for the run loop, and makes the call fail
//! with `EPERM`. The run loop looks before each entry and stops the run
//! with [`crate::exit::StopReason::SeccompViolation`], so the message ends
//! up in the run's summary (and crosses back out of the helper VM with it).
//!
//! The filter changes nothing the guest can observe: it only refuses calls
//! the VMM does not make on any path a run takes.

use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Why the filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp filter")]
    Build(#[source] seccompiler::BackendError),
    #[error("compiling the seccomp filter to BPF")]
    Compile(#[source] seccompiler::BackendError),
    #[error("installing the seccomp filter")]
    Install(#[source] seccompiler::Error),
    #[error("installing the SIGSYS handler")]
    Handler(#[source] std::io::Error),
}

/// Which threads a filter is installed on when a guest is about to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The calling thread only (and the threads it spawns afterwards): the
    /// default for a library in someone else's process.
    Thread,
    /// Every thread of the process (`SECCOMP_FILTER_FLAG_TSYNC`): for
    /// processes detvisor owns whole (the CLI running guests on this host,
    /// the server inside the helper VM).
    Process,
}

/// Whether runs started from now on install the filter (`--no-seccomp`
/// turns it off; a filter already installed stays).
static ENABLED: AtomicBool = AtomicBool::new(true);
/// 0: [`Scope::Thread`], 1: [`Scope::Process`].
static SCOPE: AtomicU8 = AtomicU8::new(0);
/// Set once a process-wide filter is in: nothing more to install anywhere.
static PROCESS_FILTERED: AtomicBool = AtomicBool::new(false);
/// Serializes process-wide installs (two threads starting runs at once).
static PROCESS_INSTALL: Mutex<()> = Mutex::new(());

thread_local! {
    /// Whether this thread runs under the filter already.
    static THREAD_FILTERED: Cell<bool> = const { Cell::new(false) };
}

/// Turns the filter on or off for runs that start from now on, in this
/// process (`run::api::Request::Seccomp`).
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::SeqCst);
}

/// Whether runs install the filter.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// Where the filter goes when a run installs it (see [`Scope`]).
pub fn set_scope(scope: Scope) {
    SCOPE.store(u8::from(scope == Scope::Process), Ordering::SeqCst);
}

fn scope() -> Scope {
    match SCOPE.load(Ordering::SeqCst) {
        0 => Scope::Thread,
        _ => Scope::Process,
    }
}

/// Installs the filter where [`set_scope`] says, unless it is off or this
/// thread runs under it already. Called by the run loop before each entry
/// into a guest, i.e. after the session's set-up: cheap when nothing is to
/// be done (an atomic load and a thread-local).
pub fn ensure_installed() -> Result<(), SeccompError> {
    if !enabled() || THREAD_FILTERED.with(Cell::get) || PROCESS_FILTERED.load(Ordering::Acquire) {
        return Ok(());
    }
    match scope() {
        Scope::Thread => install_on_this_thread(),
        Scope::Process => {
            let _one = PROCESS_INSTALL.lock().unwrap_or_else(|e| e.into_inner());
            if PROCESS_FILTERED.load(Ordering::Acquire) {
                return Ok(());
            }
            install_sigsys_handler()?;
            seccompiler::apply_filter_all_threads(program()?).map_err(SeccompError::Install)?;
            PROCESS_FILTERED.store(true, Ordering::Release);
            THREAD_FILTERED.with(|f| f.set(true));
            Ok(())
        }
    }
}

/// Installs the filter on the calling thread (whatever the settings say).
pub fn install_on_this_thread() -> Result<(), SeccompError> {
    install_sigsys_handler()?;
    seccompiler::apply_filter(program()?).map_err(SeccompError::Install)?;
    THREAD_FILTERED.with(|f| f.set(true));
    Ok(())
}

/// The filter as BPF, built once.
fn program() -> Result<&'static BpfProgram, SeccompError> {
    static PROGRAM: OnceLock<BpfProgram> = OnceLock::new();
    if let Some(program) = PROGRAM.get() {
        return Ok(program);
    }
    let built = compile()?;
    Ok(PROGRAM.get_or_init(|| built))
}

/// The allowlist compiled to BPF for x86_64.
pub fn compile() -> Result<BpfProgram, SeccompError> {
    BpfProgram::try_from(filter()?).map_err(SeccompError::Compile)
}

/// The allowlist as a `seccompiler` filter: allowed calls pass, anything
/// else traps.
pub fn filter() -> Result<SeccompFilter, SeccompError> {
    SeccompFilter::new(
        rules()?,
        SeccompAction::Trap,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(SeccompError::Build)
}

/// Every allowed syscall with its conditions (none: any arguments).
pub fn rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&(nr, _)| (nr, Vec::new())).collect();
    rules.insert(libc::SYS_ioctl, ioctl_rules()?);
    for nr in [libc::SYS_mmap, libc::SYS_mprotect] {
        rules.insert(nr, not_executable()?);
    }
    rules.insert(libc::SYS_perf_event_open, this_thread_counter()?);
    Ok(rules)
}

/// `perf_event_open` only for a counter of the calling thread on any CPU
/// (pid 0, cpu -1): the pmu clock's counter, which a session run from a
/// new thread opens again there. Not another process's, not a CPU-wide one.
fn this_thread_counter() -> Result<Vec<SeccompRule>, SeccompError> {
    let condition = |index, value| {
        SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
            .map_err(SeccompError::Build)
    };
    let rule = SeccompRule::new(vec![condition(1, 0)?, condition(2, u64::from(u32::MAX))?])
        .map_err(SeccompError::Build)?;
    Ok(vec![rule])
}

/// `mmap` and `mprotect` only without `PROT_EXEC` (their third argument):
/// the VMM loads no code once a guest runs, so memory it maps or changes
/// from then on is never executable (W^X), and code a compromised device
/// model wrote cannot be made runnable.
fn not_executable() -> Result<Vec<SeccompRule>, SeccompError> {
    let prot_exec = SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64);
    Ok(vec![argument_rule(2, prot_exec, 0)?])
}

/// A rule of one condition: argument `index` (its low 32 bits) compared
/// with `value` by `op`.
fn argument_rule(index: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompRule, SeccompError> {
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, value)
        .and_then(|c| SeccompRule::new(vec![c]))
        .map_err(SeccompError::Build)
}

/// `ioctl` only for KVM (all of its requests have type 0xAE: the VMM's
/// whole interface to the guest), for a terminal (raw mode and window
/// size for a console or a shell) and for the pmu clock's counter
/// (enable, disable, reset, period).
fn ioctl_rules() -> Result<Vec<SeccompRule>, SeccompError> {
    let request = |op: SeccompCmpOp, value: u64| argument_rule(1, op, value);
    let mut rules = vec![request(SeccompCmpOp::MaskedEq(0xff00), 0xae00)?];
    for &nr in TERMINAL_IOCTLS {
        rules.push(request(SeccompCmpOp::Eq, nr)?);
    }
    for &nr in crate::pmu_clock::perf::PERF_IOCTLS {
        rules.push(request(SeccompCmpOp::Eq, nr)?);
    }
    Ok(rules)
}

/// The terminal requests the CLI makes while a guest runs.
const TERMINAL_IOCTLS: &[u64] = &[
    libc::TCGETS,
    libc::TCSETS,
    libc::TCSETSW,
    libc::TCSETSF,
    libc::TIOCGWINSZ,
    libc::TIOCGPGRP,
    libc::FIONBIO,
    libc::FIOCLEX,
];

/// Syscalls the VMM makes after set-up, and why. `ioctl` is here for its
/// name; its rules are [`ioctl_rules`].
const ALLOWED: &[(i64, &str)] = &[
    // Files: consoles, traces, logs, snapshots written and read (spills,
    // restores, seeks), the helper VM's channel, /proc for the summary.
    (libc::SYS_read, "read"),
    (libc::SYS_write, "write"),
    (libc::SYS_readv, "readv"),
    (libc::SYS_writev, "writev"),
    (libc::SYS_pread64, "pread64"),
    (libc::SYS_pwrite64, "pwrite64"),
    (libc::SYS_preadv, "preadv"),
    (libc::SYS_pwritev, "pwritev"),
    (libc::SYS_preadv2, "preadv2"),
    (libc::SYS_pwritev2, "pwritev2"),
    (libc::SYS_lseek, "lseek"),
    (libc::SYS_open, "open"),
    (libc::SYS_openat, "openat"),
    (libc::SYS_close, "close"),
    (libc::SYS_close_range, "close_range"),
    (libc::SYS_fstat, "fstat"),
    (libc::SYS_stat, "stat"),
    (libc::SYS_lstat, "lstat"),
    (libc::SYS_newfstatat, "newfstatat"),
    (libc::SYS_statx, "statx"),
    (libc::SYS_statfs, "statfs"),
    (libc::SYS_fstatfs, "fstatfs"),
    (libc::SYS_access, "access"),
    (libc::SYS_faccessat, "faccessat"),
    (libc::SYS_faccessat2, "faccessat2"),
    (libc::SYS_getdents64, "getdents64"),
    (libc::SYS_getcwd, "getcwd"),
    (libc::SYS_readlink, "readlink"),
    (libc::SYS_readlinkat, "readlinkat"),
    (libc::SYS_mkdir, "mkdir"),
    (libc::SYS_mkdirat, "mkdirat"),
    (libc::SYS_rmdir, "rmdir"),
    (libc::SYS_unlink, "unlink"),
    (libc::SYS_unlinkat, "unlinkat"),
    (libc::SYS_rename, "rename"),
    (libc::SYS_renameat, "renameat"),
    (libc::SYS_renameat2, "renameat2"),
    (libc::SYS_link, "link"),
    (libc::SYS_linkat, "linkat"),
    (libc::SYS_ftruncate, "ftruncate"),
    (libc::SYS_fallocate, "fallocate"),
    (libc::SYS_fsync, "fsync"),
    (libc::SYS_fdatasync, "fdatasync"),
    (libc::SYS_fadvise64, "fadvise64"),
    (libc::SYS_fchmod, "fchmod"),
    (libc::SYS_fchmodat, "fchmodat"),
    (libc::SYS_utimensat, "utimensat"),
    (libc::SYS_umask, "umask"),
    (libc::SYS_fcntl, "fcntl"),
    (libc::SYS_flock, "flock"),
    (libc::SYS_dup, "dup"),
    (libc::SYS_dup2, "dup2"),
    (libc::SYS_dup3, "dup3"),
    (libc::SYS_pipe2, "pipe2"),
    (libc::SYS_copy_file_range, "copy_file_range"),
    (libc::SYS_sendfile, "sendfile"),
    (libc::SYS_ioctl, "ioctl"),
    // Waiting on several descriptors (stdin, the channel).
    (libc::SYS_poll, "poll"),
    (libc::SYS_ppoll, "ppoll"),
    (libc::SYS_select, "select"),
    (libc::SYS_pselect6, "pselect6"),
    (libc::SYS_epoll_create1, "epoll_create1"),
    (libc::SYS_epoll_ctl, "epoll_ctl"),
    (libc::SYS_epoll_wait, "epoll_wait"),
    (libc::SYS_epoll_pwait, "epoll_pwait"),
    (libc::SYS_eventfd2, "eventfd2"),
    // Memory: the allocator, guest RAM and snapshot mappings, checkpoints
    // (MADV_DONTNEED), the page scan. `mmap` and `mprotect` never
    // executable: their rules are [`not_executable`].
    (libc::SYS_mmap, "mmap"),
    (libc::SYS_munmap, "munmap"),
    (libc::SYS_mremap, "mremap"),
    (libc::SYS_mprotect, "mprotect"),
    (libc::SYS_madvise, "madvise"),
    (libc::SYS_brk, "brk"),
    (libc::SYS_mincore, "mincore"),
    (libc::SYS_msync, "msync"),
    // Threads: seed workers, stream pumps; their locks and exits.
    (libc::SYS_clone, "clone"),
    (libc::SYS_clone3, "clone3"),
    (libc::SYS_futex, "futex"),
    (libc::SYS_set_robust_list, "set_robust_list"),
    (libc::SYS_rseq, "rseq"),
    (libc::SYS_sched_yield, "sched_yield"),
    (libc::SYS_sched_getaffinity, "sched_getaffinity"),
    (libc::SYS_exit, "exit"),
    (libc::SYS_exit_group, "exit_group"),
    (libc::SYS_wait4, "wait4"),
    (libc::SYS_waitid, "waitid"),
    // Signals: the stall guard's timer signal, this filter's SIGSYS, abort.
    (libc::SYS_rt_sigaction, "rt_sigaction"),
    (libc::SYS_rt_sigprocmask, "rt_sigprocmask"),
    (libc::SYS_rt_sigreturn, "rt_sigreturn"),
    (libc::SYS_rt_sigtimedwait, "rt_sigtimedwait"),
    (libc::SYS_sigaltstack, "sigaltstack"),
    (libc::SYS_tgkill, "tgkill"),
    (libc::SYS_tkill, "tkill"),
    (libc::SYS_restart_syscall, "restart_syscall"),
    // Time (wall time only: the guest's time is virtual) and the stall
    // guard's per-thread timer.
    (libc::SYS_clock_gettime, "clock_gettime"),
    (libc::SYS_clock_getres, "clock_getres"),
    (libc::SYS_clock_nanosleep, "clock_nanosleep"),
    (libc::SYS_nanosleep, "nanosleep"),
    (libc::SYS_gettimeofday, "gettimeofday"),
    (libc::SYS_timer_create, "timer_create"),
    (libc::SYS_timer_settime, "timer_settime"),
    (libc::SYS_timer_gettime, "timer_gettime"),
    (libc::SYS_timer_delete, "timer_delete"),
    // Identity and limits (std and libc ask), randomness for hash maps
    // (never the guest's: its entropy is seeded), thread names.
    (libc::SYS_getpid, "getpid"),
    (libc::SYS_gettid, "gettid"),
    (libc::SYS_getppid, "getppid"),
    (libc::SYS_getuid, "getuid"),
    (libc::SYS_geteuid, "geteuid"),
    (libc::SYS_getgid, "getgid"),
    (libc::SYS_getegid, "getegid"),
    (libc::SYS_getrandom, "getrandom"),
    (libc::SYS_uname, "uname"),
    (libc::SYS_sysinfo, "sysinfo"),
    (libc::SYS_prlimit64, "prlimit64"),
    (libc::SYS_getrlimit, "getrlimit"),
    (libc::SYS_getrusage, "getrusage"),
    (libc::SYS_prctl, "prctl"),
    // The pmu clock's counter, opened again on a new vCPU thread; its
    // rules are [`this_thread_counter`].
    (libc::SYS_perf_event_open, "perf_event_open"),
];

/// Calls that are not allowed but likely to be what a compromised VMM
/// tries, named in the violation message.
const REFUSED_NAMES: &[(i64, &str)] = &[
    (libc::SYS_socket, "socket"),
    (libc::SYS_socketpair, "socketpair"),
    (libc::SYS_connect, "connect"),
    (libc::SYS_bind, "bind"),
    (libc::SYS_listen, "listen"),
    (libc::SYS_accept, "accept"),
    (libc::SYS_accept4, "accept4"),
    (libc::SYS_sendto, "sendto"),
    (libc::SYS_recvfrom, "recvfrom"),
    (libc::SYS_sendmsg, "sendmsg"),
    (libc::SYS_recvmsg, "recvmsg"),
    (libc::SYS_execve, "execve"),
    (libc::SYS_execveat, "execveat"),
    (libc::SYS_fork, "fork"),
    (libc::SYS_vfork, "vfork"),
    (libc::SYS_kill, "kill"),
    (libc::SYS_ptrace, "ptrace"),
    (libc::SYS_process_vm_readv, "process_vm_readv"),
    (libc::SYS_process_vm_writev, "process_vm_writev"),
    (libc::SYS_mount, "mount"),
    (libc::SYS_umount2, "umount2"),
    (libc::SYS_pivot_root, "pivot_root"),
    (libc::SYS_chroot, "chroot"),
    (libc::SYS_unshare, "unshare"),
    (libc::SYS_setns, "setns"),
    (libc::SYS_setuid, "setuid"),
    (libc::SYS_setgid, "setgid"),
    (libc::SYS_bpf, "bpf"),
    (libc::SYS_init_module, "init_module"),
    (libc::SYS_finit_module, "finit_module"),
    (libc::SYS_kexec_load, "kexec_load"),
    (libc::SYS_keyctl, "keyctl"),
    (libc::SYS_add_key, "add_key"),
    (libc::SYS_userfaultfd, "userfaultfd"),
    (libc::SYS_io_uring_setup, "io_uring_setup"),
    (libc::SYS_memfd_create, "memfd_create"),
    (libc::SYS_symlink, "symlink"),
    (libc::SYS_symlinkat, "symlinkat"),
    (libc::SYS_chdir, "chdir"),
    (libc::SYS_sched_setaffinity, "sched_setaffinity"),
    (libc::SYS_membarrier, "membarrier"),
    (libc::SYS_personality, "personality"),
    (libc::SYS_reboot, "reboot"),
];

/// The name of syscall `nr` where this module knows it (every allowed one
/// and the likely refused ones).
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    ALLOWED
        .iter()
        .chain(REFUSED_NAMES)
        .find(|&&(n, _)| n == nr)
        .map(|&(_, name)| name)
}

/// A thread's name as the kernel keeps it (at most 15 bytes), Copy so a
/// stop reason can hold it; (de)serialized as a string.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadName(pub [u8; 16]);

impl ThreadName {
    pub fn as_str(&self) -> String {
        let len = self.0.iter().position(|&b| b == 0).unwrap_or(16);
        String::from_utf8_lossy(&self.0[..len]).into_owned()
    }

    pub fn new(name: &str) -> Self {
        let mut bytes = [0u8; 16];
        let len = name.len().min(15);
        bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        ThreadName(bytes)
    }
}

impl Serialize for ThreadName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.as_str())
    }
}

impl<'de> Deserialize<'de> for ThreadName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(ThreadName::new(&name))
    }
}

/// A call the filter refused: which, and on which thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub syscall: i64,
    pub tid: i32,
    pub thread: ThreadName,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = syscall_name(self.syscall).unwrap_or("unknown");
        write!(
            f,
            "seccomp refused syscall {} ({name}) on thread {} ({})",
            self.syscall,
            self.tid,
            self.thread.as_str()
        )
    }
}

/// The first violation not yet taken: 0 none, 1 being written by the
/// handler, 2 complete.
static VIOLATION_STATE: AtomicU8 = AtomicU8::new(0);
static VIOLATION_SYSCALL: AtomicI64 = AtomicI64::new(0);
static VIOLATION_TID: AtomicI32 = AtomicI32::new(0);
static VIOLATION_THREAD: [AtomicU8; 16] = [const { AtomicU8::new(0) }; 16];

/// The first violation since the last call, taken (the run loop stops the
/// run with it).
pub fn take_violation() -> Option<Violation> {
    if VIOLATION_STATE.load(Ordering::Acquire) != 2 {
        return None;
    }
    let mut thread = [0u8; 16];
    for (b, a) in thread.iter_mut().zip(&VIOLATION_THREAD) {
        *b = a.load(Ordering::Relaxed);
    }
    let violation = Violation {
        syscall: VIOLATION_SYSCALL.load(Ordering::Relaxed),
        tid: VIOLATION_TID.load(Ordering::Relaxed),
        thread: ThreadName(thread),
    };
    VIOLATION_STATE.store(0, Ordering::Release);
    Some(violation)
}

/// The seccomp filters on the calling thread (`Seccomp_filters` in
/// /proc/thread-self/status; `Seccomp: 2` alone where the kernel is too old
/// to count them reads as 1), or `None` where /proc cannot tell.
pub fn thread_filters() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    match (field("Seccomp_filters:"), field("Seccomp:")) {
        (Some(n), _) => Some(n),
        (None, Some(2)) => Some(1),
        (None, Some(_)) => Some(0),
        (None, None) => None,
    }
}

fn install_sigsys_handler() -> Result<(), SeccompError> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let result = INSTALLED.get_or_init(|| {
        // SAFETY: a zeroed sigaction is a valid value to fill in; the
        // handler is an `extern "C"` function of the SA_SIGINFO signature,
        // and sigaction only reads the struct.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigsys as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    result
        .as_ref()
        .map_err(|&e| SeccompError::Handler(std::io::Error::from_raw_os_error(e)))
        .copied()
}

/// Where `si_syscall` lies in x86_64's `siginfo_t` for SIGSYS (in `int`s):
/// after si_signo, si_errno, si_code, padding, and `_call_addr`.
const SI_SYSCALL_INT_OFFSET: usize = 6;
/// `si_code` of a SIGSYS sent by seccomp.
const SYS_SECCOMP: i32 = 1;

/// The SIGSYS handler. Only async-signal-safe work: atomics, `write(2)`,
/// `gettid`, `prctl(PR_GET_NAME)` (all allowed by the filter), and the
/// refused call's return value set to `-EPERM` in the saved registers so
/// that the caller sees an error and unwinds to where the run stops.
extern "C" fn on_sigsys(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo_t for a SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    if code != SYS_SECCOMP {
        return;
    }
    // SAFETY: for SIGSYS from seccomp the siginfo_t holds `_sigsys`, whose
    // `_syscall` int lies at this offset on x86_64; the struct is 128 bytes.
    let syscall = unsafe { *(info as *const i32).add(SI_SYSCALL_INT_OFFSET) };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into the buffer given.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };

    if VIOLATION_STATE
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
    {
        VIOLATION_SYSCALL.store(i64::from(syscall), Ordering::Relaxed);
        VIOLATION_TID.store(tid, Ordering::Relaxed);
        for (a, &b) in VIOLATION_THREAD.iter().zip(&name) {
            a.store(b, Ordering::Relaxed);
        }
        VIOLATION_STATE.store(2, Ordering::Release);
    }

    let mut message = Message::default();
    message.push(b"detvisor: seccomp refused syscall ");
    message.push_number(i64::from(syscall));
    message.push(b" (");
    message.push(
        syscall_name(i64::from(syscall))
            .unwrap_or("unknown")
            .as_bytes(),
    );
    message.push(b") on thread ");
    message.push_number(i64::from(tid));
    message.push(b" (");
    let len = name.iter().position(|&b| b == 0).unwrap_or(16);
    message.push(&name[..len]);
    message.push(b"); the run stops\n");
    // SAFETY: writes from a live buffer of the given length.
    unsafe {
        libc::write(
            libc::STDERR_FILENO,
            message.bytes.as_ptr().cast(),
            message.len,
        )
    };

    // SAFETY: for a SA_SIGINFO handler `context` is the interrupted
    // thread's ucontext_t; its RAX is the refused call's return value.
    unsafe {
        let context = context.cast::<libc::ucontext_t>();
        (*context).uc_mcontext.gregs[libc::REG_RAX as usize] = -i64::from(libc::EPERM);
    }
}

/// A message built without allocating (in a signal handler).
struct Message {
    bytes: [u8; 160],
    len: usize,
}

impl Default for Message {
    fn default() -> Self {
        Message {
            bytes: [0; 160],
            len: 0,
        }
    }
}

impl Message {
    fn push(&mut self, part: &[u8]) {
        let n = part.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&part[..n]);
        self.len += n;
    }

    fn push_number(&mut self, n: i64) {
        if n < 0 {
            self.push(b"-");
        }
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut rest = n.unsigned_abs();
        loop {
            at -= 1;
            digits[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        self.push(&digits[at..]);
    }
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod tests;
