//! Thin, safe wrappers over the system calls the agent uses (parent side
//! only; the code that runs between clone and exec is in `container::spawn`).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use guest_agent::protocol::ExitStatus;

/// Turns a `-1` return into the `errno` error.
pub fn cvt(result: libc::c_int) -> io::Result<libc::c_int> {
    if result == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Retries a call while it fails with `EINTR`.
pub fn retry<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match call() {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

pub fn cstring(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{text:?} contains a NUL byte"),
        )
    })
}

pub fn path_cstring(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{path:?} contains a NUL byte"),
        )
    })
}

/// Opens `path` with `flags` | `O_CLOEXEC`.
pub fn open(path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = path_cstring(path)?;
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    let fd = retry(|| cvt(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, 0o666) }))?;
    // SAFETY: `open` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `path` relative to directory `dir` with `flags` | `O_CLOEXEC`.
pub fn openat(dir: BorrowedFd<'_>, path: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    let path = path_cstring(path)?;
    let raw = dir.as_raw_fd();
    let flags = flags | libc::O_CLOEXEC;
    // SAFETY: `dir` is an open descriptor and `path` a valid NUL-terminated
    // string, both outliving the call.
    let fd = retry(|| cvt(unsafe { libc::openat(raw, path.as_ptr(), flags, 0o666) }))?;
    // SAFETY: `openat` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pipe, both ends close-on-exec: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: `pipe2` returned two new descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a valid descriptor have no memory effects.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

/// One `read`, retried on `EINTR`. `WouldBlock` is returned as an error.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    retry(|| {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    })
}

/// One `write` (`EINTR` retried): how many bytes the descriptor took.
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    retry(|| {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes.
        let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    })
}

/// Writes all of `buf` (blocking descriptor).
pub fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let n = write(fd, buf)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n..];
    }
    Ok(())
}

/// A new pseudo-terminal: (master, slave), neither our controlling
/// terminal, the slave sized `rows` x `cols` when both are non-zero.
pub fn open_pty(rows: u16, cols: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: posix_openpt only returns a new descriptor (or -1).
    let master =
        cvt(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    // SAFETY: `master` was just returned to us and nothing else owns it.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // SAFETY: plain calls on the master descriptor.
    cvt(unsafe { libc::grantpt(master.as_raw_fd()) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::unlockpt(master.as_raw_fd()) })?;
    let mut name = [0 as libc::c_char; 64];
    // SAFETY: `name` is writable for its whole length, which we pass.
    let result = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    if result != 0 {
        return Err(io::Error::from_raw_os_error(result));
    }
    // SAFETY: ptsname_r wrote a NUL-terminated string into `name`.
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) };
    // SAFETY: `path` is NUL-terminated; open returns a new descriptor or -1.
    let slave = cvt(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: `slave` was just returned to us and nothing else owns it.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    if rows > 0 && cols > 0 {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from the pointer.
        cvt(unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCSWINSZ, &size) })?;
    }
    Ok((master, slave))
}

/// `poll` with no timeout: sleeps until one descriptor is ready or a signal
/// arrives (`EINTR` is retried). Never spins.
pub fn poll_forever(fds: &mut [libc::pollfd]) -> io::Result<()> {
    retry(|| {
        // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` pollfds.
        cvt(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) })
    })?;
    Ok(())
}

/// Blocks SIGCHLD for this (single-threaded) process and returns a
/// non-blocking signalfd that becomes readable when a child changes state.
pub fn sigchld_fd() -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialize it.
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `mask` is a valid sigset_t.
    unsafe {
        libc::sigemptyset(&mut mask);
        libc::sigaddset(&mut mask, libc::SIGCHLD);
    }
    // SAFETY: `mask` is initialized; the old mask is not requested.
    let rc = unsafe { libc::sigprocmask(libc::SIG_BLOCK, &mask, std::ptr::null_mut()) };
    cvt(rc)?;
    // SAFETY: `mask` is initialized; -1 asks for a new descriptor.
    let fd = cvt(unsafe { libc::signalfd(-1, &mask, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) })?;
    // SAFETY: `signalfd` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads (and discards) every pending signal from a non-blocking signalfd.
pub fn drain_signalfd(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    loop {
        match read(fd, &mut info) {
            Ok(_) => continue,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(error) => return Err(error),
        }
    }
}

pub fn exit_status(raw: libc::c_int) -> ExitStatus {
    if libc::WIFSIGNALED(raw) {
        ExitStatus::Signal(libc::WTERMSIG(raw))
    } else {
        ExitStatus::Code(libc::WEXITSTATUS(raw))
    }
}

/// Reaps one terminated child if any: `Ok(None)` when none is waiting
/// (or there are no children at all).
pub fn reap_any() -> io::Result<Option<(libc::pid_t, ExitStatus)>> {
    let mut raw = 0;
    // SAFETY: `raw` is a valid int for the status.
    match retry(|| cvt(unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) })) {
        Ok(0) => Ok(None),
        Ok(pid) => Ok(Some((pid, exit_status(raw)))),
        Err(error) if error.raw_os_error() == Some(libc::ECHILD) => Ok(None),
        Err(error) => Err(error),
    }
}

/// Waits for one specific child (used for children that failed before exec).
pub fn reap(pid: libc::pid_t) -> io::Result<ExitStatus> {
    let mut raw = 0;
    // SAFETY: `raw` is a valid int for the status.
    retry(|| cvt(unsafe { libc::waitpid(pid, &mut raw, 0) }))?;
    Ok(exit_status(raw))
}

/// Whether child `pid` has ended and waits to be reaped (it is left so).
pub fn has_ended(pid: libc::pid_t) -> bool {
    // SAFETY: an all-zero siginfo_t is a valid value for waitid to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid siginfo_t for waitid to write; WNOWAIT
    // leaves the child unreaped.
    let waited = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: waitid filled `info` (si_pid stays 0 when nothing ended).
    waited == 0 && unsafe { info.si_pid() } != 0
}

pub fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill has no memory effects.
    cvt(unsafe { libc::kill(pid, signal) })?;
    Ok(())
}

pub fn setns(fd: BorrowedFd<'_>, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: setns on a valid descriptor has no memory effects.
    cvt(unsafe { libc::setns(fd.as_raw_fd(), nstype) })?;
    Ok(())
}

pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare has no memory effects on this process's address space.
    cvt(unsafe { libc::unshare(flags) })?;
    Ok(())
}

/// `mount(2)`; `None` arguments are passed as NULL.
pub fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(cstring).transpose()?;
    let target = path_cstring(target)?;
    let fstype = fstype.map(cstring).transpose()?;
    let data = data.map(cstring).transpose()?;
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is NULL or a NUL-terminated string alive for the call.
    cvt(unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    })?;
    Ok(())
}

/// `fallocate(2)` with mode 0: allocates `len` bytes from `offset`.
pub fn fallocate(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    let (offset, len) = (
        libc::off_t::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?,
        libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?,
    );
    // SAFETY: fallocate has no memory effects on this process.
    cvt(unsafe { libc::fallocate(fd.as_raw_fd(), 0, offset, len) })?;
    Ok(())
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: `name` is valid for reads of `name.len()` bytes.
    cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })?;
    Ok(())
}

/// Puts a terminal into raw mode (no echo, no line editing, no CR/LF or
/// signal-character processing in either direction); no-op for other files.
pub fn make_raw_if_tty(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: isatty has no memory effects.
    if unsafe { libc::isatty(fd.as_raw_fd()) } != 1 {
        return Ok(());
    }
    // SAFETY: termios is plain data; tcgetattr fills it.
    let mut termios: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: `termios` is a valid termios for the call to fill.
    cvt(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut termios) })?;
    // SAFETY: `termios` is a valid, initialized termios.
    unsafe { libc::cfmakeraw(&mut termios) };
    termios.c_cc[libc::VMIN] = 1;
    termios.c_cc[libc::VTIME] = 0;
    // SAFETY: `termios` is a valid, initialized termios.
    cvt(unsafe { libc::tcsetattr(fd.as_raw_fd(), libc::TCSANOW, &termios) })?;
    // Whatever arrived before raw mode was line-edited: drop it (the host
    // sends nothing before the agent's first frame anyway).
    // SAFETY: tcflush has no memory effects.
    cvt(unsafe { libc::tcflush(fd.as_raw_fd(), libc::TCIFLUSH) })?;
    Ok(())
}

/// Identity of a namespace (the nsfs inode), comparable across processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NsId {
    dev: u64,
    ino: u64,
}

pub fn ns_id(path: &Path) -> io::Result<NsId> {
    let meta = std::fs::metadata(path)?;
    use std::os::unix::fs::MetadataExt;
    Ok(NsId {
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// PIDs (in the agent's namespace, ascending) of every live process whose
/// PID namespace is `ns`.
pub fn pids_in_pid_ns(ns: NsId) -> io::Result<Vec<libc::pid_t>> {
    let mut pids: Vec<libc::pid_t> = std::fs::read_dir("/proc")?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid: &libc::pid_t| {
            ns_id(Path::new(&format!("/proc/{pid}/ns/pid"))).is_ok_and(|id| id == ns)
        })
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// `RNDADDENTROPY`'s argument: bits credited, bytes, then the bytes.
#[repr(C)]
struct RandPoolInfo {
    entropy_count: libc::c_int,
    buf_size: libc::c_int,
    buf: [u8; MAX_RESEED_BYTES],
}

/// The most bytes one reseed mixes in.
pub const MAX_RESEED_BYTES: usize = 256;

/// `_IOW('R', 0x03, int[2])` and `_IO('R', 0x07)` from <linux/random.h>.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Mixes `bytes` into the kernel's input pool, credited in full, and makes
/// the CRNG reseed from the pool now: what the kernel hands out from then on
/// depends on `bytes` (a branch's seed), not only on what came before.
pub fn reseed_kernel_rng(bytes: &[u8]) -> io::Result<()> {
    if bytes.is_empty() || bytes.len() > MAX_RESEED_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} reseed bytes (1..={MAX_RESEED_BYTES})", bytes.len()),
        ));
    }
    let random = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    let mut info = RandPoolInfo {
        entropy_count: (bytes.len() * 8) as libc::c_int,
        buf_size: bytes.len() as libc::c_int,
        buf: [0; MAX_RESEED_BYTES],
    };
    info.buf[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: `random` is an open /dev/urandom; RNDADDENTROPY reads the
    // header and `buf_size` bytes after it, all inside `info`.
    cvt(unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY as _, &info) })?;
    // SAFETY: RNDRESEEDCRNG takes no argument.
    cvt(unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG as _) })?;
    Ok(())
}

/// A non-blocking CLOCK_MONOTONIC timer firing every `interval_ns`.
pub fn interval_timerfd(interval_ns: i64) -> io::Result<OwnedFd> {
    monotonic_timerfd(interval_ns, interval_ns)
}

/// A non-blocking CLOCK_MONOTONIC timer firing once, `after_ns` from now
/// (the guest's monotonic clock is virtual time: nothing here depends on
/// the host's).
pub fn oneshot_timerfd(after_ns: i64) -> io::Result<OwnedFd> {
    monotonic_timerfd(after_ns, 0)
}

fn monotonic_timerfd(first_ns: i64, interval_ns: i64) -> io::Result<OwnedFd> {
    // SAFETY: timerfd_create has no memory effects.
    let fd = cvt(unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    })?;
    // SAFETY: `timerfd_create` returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let spec = |ns: i64| libc::timespec {
        tv_sec: ns / 1_000_000_000,
        tv_nsec: ns % 1_000_000_000,
    };
    let value = libc::itimerspec {
        it_interval: spec(interval_ns),
        it_value: spec(first_ns.max(1)),
    };
    // SAFETY: `value` is a valid itimerspec; the old value is not asked for.
    cvt(unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &value, std::ptr::null_mut()) })?;
    Ok(fd)
}

/// Opens `path` (read-only, non-blocking, close-on-exec) resolved inside
/// the directory `root` as if it were `/` (`openat2` with
/// `RESOLVE_IN_ROOT`): absolute symbolic links and `..` stay inside it, as
/// they would for a process chrooted there.
pub fn open_in_root(root: BorrowedFd<'_>, path: &str) -> io::Result<OwnedFd> {
    let path = cstring(path)?;
    /// `struct open_how` of <linux/openat2.h> (libc's cannot be built).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT,
    };
    let fd = retry(|| {
        // SAFETY: `path` is NUL-terminated and `how` a valid open_how of
        // the size passed; both outlive the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                path.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        cvt(fd as libc::c_int)
    })?;
    // SAFETY: `openat2` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads a timerfd's expiration count (nothing if it has not fired).
pub fn drain_timerfd(fd: BorrowedFd<'_>) {
    let mut count = [0u8; 8];
    let _ = read(fd, &mut count);
}
