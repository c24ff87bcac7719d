use super::*;

/// Runs `f` on a thread of its own named `name` (a filter cannot be taken
/// off, so the test harness's threads never get one).
fn on_thread<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}

/// The first violation is kept process-wide: tests that make and take
/// violations run one at a time.
static VIOLATIONS: Mutex<()> = Mutex::new(());

#[test]
fn the_allowlist_compiles_to_bpf_for_x86_64() {
    let program = compile().unwrap();
    assert!(!program.is_empty());
    // BPF programs are limited to 4096 instructions.
    assert!(program.len() < 4096, "{} instructions", program.len());
}

#[test]
fn the_allowlist_has_what_a_run_needs_and_not_what_it_does_not() {
    let rules = rules().unwrap();
    for nr in [
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_openat,
        libc::SYS_madvise,
        libc::SYS_futex,
        libc::SYS_clone3,
        libc::SYS_timer_settime,
        libc::SYS_rt_sigreturn,
        libc::SYS_exit_group,
    ] {
        assert_eq!(
            rules.get(&nr).map(Vec::len),
            Some(0),
            "{nr} allowed outright"
        );
    }
    // ioctl only with conditions: KVM's type, a terminal's requests and
    // the pmu counter's.
    assert_eq!(
        rules[&libc::SYS_ioctl].len(),
        1 + TERMINAL_IOCTLS.len() + crate::pmu_clock::perf::PERF_IOCTLS.len()
    );
    // perf_event_open only for this thread's counter.
    assert_eq!(rules[&libc::SYS_perf_event_open].len(), 1);
    // mmap and mprotect only without PROT_EXEC.
    assert_eq!(rules[&libc::SYS_mmap].len(), 1);
    assert_eq!(rules[&libc::SYS_mprotect].len(), 1);
    for nr in [
        libc::SYS_socket,
        libc::SYS_connect,
        libc::SYS_execve,
        libc::SYS_ptrace,
        libc::SYS_mount,
        libc::SYS_bpf,
        libc::SYS_process_vm_writev,
    ] {
        assert!(!rules.contains_key(&nr), "{nr} must not be allowed");
    }
}

#[test]
fn names_are_known_for_allowed_and_likely_refused_calls() {
    assert_eq!(syscall_name(libc::SYS_socket), Some("socket"));
    assert_eq!(syscall_name(libc::SYS_ioctl), Some("ioctl"));
    assert_eq!(syscall_name(libc::SYS_ptrace), Some("ptrace"));
    assert_eq!(syscall_name(100_000), None);
    // No number is listed twice (allowed and refused, or under two names).
    let mut numbers: Vec<i64> = ALLOWED
        .iter()
        .chain(REFUSED_NAMES)
        .map(|&(n, _)| n)
        .collect();
    numbers.sort_unstable();
    let before = numbers.len();
    numbers.dedup();
    assert_eq!(numbers.len(), before);
}

#[test]
fn the_filter_is_installed_on_the_thread_that_installs_it_only() {
    let before = thread_filters();
    let (filtered, status) = on_thread("seccomp-status", || {
        install_on_this_thread().unwrap();
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        (thread_filters(), status)
    });
    assert!(filtered.unwrap() >= 1, "{status}");
    assert!(status.lines().any(|l| l == "Seccomp:\t2"), "{status}");
    // The test's own thread is as it was.
    assert_eq!(thread_filters(), before);
}

#[test]
fn a_refused_call_traps_names_itself_and_fails_with_eperm() {
    let _one_at_a_time = VIOLATIONS.lock().unwrap();
    let (results, violations, tid) = on_thread("seccomp-victim", || {
        install_on_this_thread().unwrap();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let mut results = Vec::new();
        let mut violations = Vec::new();
        // SAFETY: socket(2) with constant arguments; the filter refuses it.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        results.push((fd, std::io::Error::last_os_error().raw_os_error()));
        violations.push(take_violation());
        // A terminal request outside the list: TIOCSTI (pushing input into
        // a terminal) is refused before it could act.
        let byte: u8 = b'x';
        // SAFETY: TIOCSTI reads one byte through the pointer given.
        let r = unsafe { libc::ioctl(0, libc::TIOCSTI, &byte) };
        results.push((r, std::io::Error::last_os_error().raw_os_error()));
        violations.push(take_violation());
        // Allowed calls still work after a violation.
        let file = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
        assert_eq!(file.trim(), "seccomp-victim");
        (results, violations, tid)
    });
    for (r, errno) in &results {
        assert_eq!((*r, *errno), (-1, Some(libc::EPERM)));
    }
    let socket = violations[0].expect("socket recorded");
    assert_eq!(socket.syscall, libc::SYS_socket);
    assert_eq!(socket.tid, tid);
    assert_eq!(socket.thread.as_str(), "seccomp-victim");
    assert_eq!(
        socket.to_string(),
        format!("seccomp refused syscall 41 (socket) on thread {tid} (seccomp-victim)")
    );
    assert_eq!(
        violations[1].expect("ioctl recorded").syscall,
        libc::SYS_ioctl
    );
    assert_eq!(take_violation(), None, "taken once");
}

/// W^X: memory mapped or changed under the filter is never executable.
#[test]
fn executable_memory_is_refused_and_other_memory_is_not() {
    let _one_at_a_time = VIOLATIONS.lock().unwrap();
    let (exec_map, exec_protect, violation) = on_thread("seccomp-wx", || {
        install_on_this_thread().unwrap();
        let len = 4096;
        let map = |prot| {
            // SAFETY: a fresh anonymous private mapping; nothing existing is touched.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    prot,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            (p, std::io::Error::last_os_error().raw_os_error())
        };
        let (exec, exec_errno) = map(libc::PROT_READ | libc::PROT_EXEC);
        let violation = take_violation();
        let (data, _) = map(libc::PROT_READ | libc::PROT_WRITE);
        assert_ne!(data, libc::MAP_FAILED, "a data mapping is allowed");
        // SAFETY: `data` is the mapping of `len` bytes made just above.
        let read_only = unsafe { libc::mprotect(data, len, libc::PROT_READ) };
        assert_eq!(read_only, 0, "dropping write access is allowed");
        // SAFETY: as above; the filter refuses this change.
        let r = unsafe { libc::mprotect(data, len, libc::PROT_READ | libc::PROT_EXEC) };
        let protect = (r, std::io::Error::last_os_error().raw_os_error());
        take_violation();
        // SAFETY: unmaps the mapping made above, no longer used.
        unsafe { libc::munmap(data, len) };
        ((exec as usize, exec_errno), protect, violation)
    });
    assert_eq!(exec_map, (libc::MAP_FAILED as usize, Some(libc::EPERM)));
    assert_eq!(exec_protect, (-1, Some(libc::EPERM)));
    assert_eq!(violation.expect("recorded").syscall, libc::SYS_mmap);
}

/// Opens a perf event of instructions for `pid` on `cpu`, as the filter
/// sees it: its result and errno.
fn perf_open(pid: libc::pid_t, cpu: libc::c_int) -> (i64, Option<i32>) {
    let mut attr = [0u64; 8];
    // type 0 (hardware), size 64, config 1 (instructions), disabled.
    attr[0] = 64 << 32;
    attr[1] = 1;
    attr[6] = 1;
    // SAFETY: a 64-byte perf_event_attr that lives across the call.
    let fd = unsafe { libc::syscall(libc::SYS_perf_event_open, attr.as_ptr(), pid, cpu, -1, 8) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    if fd >= 0 {
        // SAFETY: the descriptor was just opened here and is not used again.
        unsafe { libc::close(fd as i32) };
    }
    (fd, errno)
}

#[test]
fn perf_event_open_is_allowed_only_for_this_thread() {
    let _one_at_a_time = VIOLATIONS.lock().unwrap();
    let (own, other, cpu_wide, violation) = on_thread("seccomp-perf", || {
        install_on_this_thread().unwrap();
        let own = perf_open(0, -1);
        take_violation();
        let other = perf_open(1, -1);
        let violation = take_violation();
        let cpu_wide = perf_open(0, 0);
        take_violation();
        (own, other, cpu_wide, violation)
    });
    // This thread's counter passes the filter: it opens, or perf says why
    // not (ENOENT where there is no PMU), never EPERM from the filter.
    assert!(own.0 >= 0 || own.1 != Some(libc::EPERM), "{own:?}");
    assert_eq!(other, (-1, Some(libc::EPERM)));
    assert_eq!(cpu_wide, (-1, Some(libc::EPERM)));
    let violation = violation.expect("recorded");
    assert_eq!(violation.syscall, libc::SYS_perf_event_open);
}

#[test]
fn thread_names_round_trip_through_json() {
    let violation = Violation {
        syscall: 41,
        tid: 7,
        thread: ThreadName::new("a-very-long-thread-name"),
    };
    let text = serde_json::to_string(&violation).unwrap();
    assert_eq!(text, r#"{"syscall":41,"tid":7,"thread":"a-very-long-thr"}"#);
    assert_eq!(serde_json::from_str::<Violation>(&text).unwrap(), violation);
}

#[test]
fn the_handler_formats_numbers_without_allocating() {
    let mut m = Message::default();
    m.push_number(0);
    m.push(b" ");
    m.push_number(-41);
    m.push(b" ");
    m.push_number(i64::MAX);
    assert_eq!(&m.bytes[..m.len], b"0 -41 9223372036854775807");
}
