//! Starting a process: plain, as a new node's PID 1 (following its plan),
//! or inside a running node's namespaces; the child's failures reported
//! by step through a pipe.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use super::plan::{NodePlan, Op};
use super::Command;
use crate::sys;

/// Descriptors of a running node's namespaces and root, for `EnterNode`.
#[derive(Debug)]
pub struct NodeNamespaces {
    ipc: OwnedFd,
    uts: OwnedFd,
    net: OwnedFd,
    mnt: OwnedFd,
    pid: OwnedFd,
    /// Its time namespace (its realtime clock); `None` without them.
    time: Option<OwnedFd>,
    root: OwnedFd,
}

impl NodeNamespaces {
    /// Opens the namespaces of process `pid` (the node's PID 1).
    pub fn of(pid: libc::pid_t) -> io::Result<Self> {
        let open = |what: &str, flags| {
            let path = PathBuf::from(format!("/proc/{pid}/{what}"));
            sys::open(&path, flags).map_err(|e| io::Error::new(e.kind(), format!("{path:?}: {e}")))
        };
        Ok(Self {
            ipc: open("ns/ipc", libc::O_RDONLY)?,
            uts: open("ns/uts", libc::O_RDONLY)?,
            net: open("ns/net", libc::O_RDONLY)?,
            mnt: open("ns/mnt", libc::O_RDONLY)?,
            pid: open("ns/pid", libc::O_RDONLY)?,
            time: match open("ns/time", libc::O_RDONLY) {
                Ok(fd) => Some(fd),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            },
            root: open("root", libc::O_RDONLY | libc::O_DIRECTORY)?,
        })
    }
}

/// Where a new process goes.
pub enum Setup<'a> {
    /// The agent's own namespaces and root (the workload without a node).
    Root,
    /// A new container: a node's PID 1.
    NewNode {
        plan: &'a NodePlan,
        netns: BorrowedFd<'a>,
        /// The node's time namespace (`None`: the guest's).
        timens: Option<BorrowedFd<'a>>,
    },
    /// Into a running node's namespaces (like `nsenter -a -r`).
    EnterNode {
        namespaces: &'a NodeNamespaces,
        /// The agent's own PID namespace, to return to after the clone.
        own_pidns: BorrowedFd<'a>,
    },
}

/// A started process and the read ends (non-blocking) of its output pipes.
#[derive(Debug)]
pub struct Spawned {
    pub pid: libc::pid_t,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

// Steps the child reports failures of (op `i` of a plan is OP_BASE + i).
const STEP_STDIO: u32 = 1;
const STEP_SESSION: u32 = 2;
const STEP_PDEATHSIG: u32 = 3;
const STEP_NETNS: u32 = 4;
const STEP_HOSTNAME: u32 = 5;
const STEP_ENTER: [u32; 4] = [6, 7, 8, 9];
const STEP_ENTER_ROOT: u32 = 10;
const STEP_EXEC: u32 = 11;
const STEP_TIMENS: u32 = 12;
/// Not a failure: set up, waiting for the parent's go before exec.
const STEP_READY: u32 = 13;
const OP_BASE: u32 = 1000;

/// What the child needs, as raw values only (no allocation after clone).
struct ChildContext<'a> {
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    candidates: &'a [CString],
    devnull: libc::c_int,
    /// A terminal (pty slave) for stdin, stdout and stderr, made the
    /// process's controlling terminal; -1: /dev/null and the pipes.
    terminal: libc::c_int,
    stdout: libc::c_int,
    stderr: libc::c_int,
    status: libc::c_int,
    /// The read end of the go pipe, and its write end (closed by the
    /// child); -1: exec without waiting.
    go: libc::c_int,
    go_write: libc::c_int,
    setup: &'a Setup<'a>,
}

/// Starts `command` as described by `setup`, with stdin from `devnull` and
/// output to pipes, or everything on `terminal` (which becomes its
/// controlling terminal; the pipes then stay empty). On failure the message
/// names the step that failed, e.g. `mount proc on "/n1/proc": Operation not
/// permitted`.
pub fn spawn(
    command: &Command,
    setup: &Setup<'_>,
    devnull: BorrowedFd<'_>,
    terminal: Option<BorrowedFd<'_>>,
) -> Result<Spawned, String> {
    spawn_inner(command, setup, devnull, terminal, None)
}

/// As [`spawn`], and calls `ready` with the child's PID once the child
/// is set up (in its namespaces and root, its mounts made) and before it
/// execs: what `ready` opens through `/proc/<pid>/root` is the child's
/// view, however soon the program ends (e.g. a directory of a /tmp that
/// ends with the node's mount namespace).
pub fn spawn_then(
    command: &Command,
    setup: &Setup<'_>,
    devnull: BorrowedFd<'_>,
    ready: &mut dyn FnMut(libc::pid_t),
) -> Result<Spawned, String> {
    spawn_inner(command, setup, devnull, None, Some(ready))
}

fn spawn_inner(
    command: &Command,
    setup: &Setup<'_>,
    devnull: BorrowedFd<'_>,
    terminal: Option<BorrowedFd<'_>>,
    mut ready: Option<&mut dyn FnMut(libc::pid_t)>,
) -> Result<Spawned, String> {
    let io_error = |what: &str, e: io::Error| format!("{what}: {e}");
    let (stdout_r, stdout_w) = sys::pipe().map_err(|e| io_error("pipe", e))?;
    let (stderr_r, stderr_w) = sys::pipe().map_err(|e| io_error("pipe", e))?;
    let (status_r, status_w) = sys::pipe().map_err(|e| io_error("pipe", e))?;
    let go = match ready {
        Some(_) => Some(sys::pipe().map_err(|e| io_error("pipe", e))?),
        None => None,
    };
    let null_terminated = |strings: &[CString]| -> Vec<*const libc::c_char> {
        strings
            .iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let argv = null_terminated(&command.argv);
    let envp = null_terminated(&command.env);
    let context = ChildContext {
        argv: &argv,
        envp: &envp,
        candidates: &command.candidates,
        devnull: devnull.as_raw_fd(),
        terminal: terminal.map_or(-1, |fd| fd.as_raw_fd()),
        stdout: stdout_w.as_raw_fd(),
        stderr: stderr_w.as_raw_fd(),
        status: status_w.as_raw_fd(),
        go: go.as_ref().map_or(-1, |(r, _)| r.as_raw_fd()),
        go_write: go.as_ref().map_or(-1, |(_, w)| w.as_raw_fd()),
        setup,
    };
    let mut flags = libc::SIGCHLD as libc::c_ulong;
    match setup {
        Setup::Root => {}
        Setup::NewNode { .. } => {
            flags |=
                (libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC)
                    as libc::c_ulong;
        }
        Setup::EnterNode { namespaces, .. } => {
            // Children created from now on go into the node's PID namespace.
            sys::setns(namespaces.pid.as_fd(), libc::CLONE_NEWPID)
                .map_err(|e| io_error("enter the node's PID namespace", e))?;
        }
    }
    // SAFETY: a raw clone without CLONE_VM and without a new stack behaves
    // like fork: the child gets a copy of the address space. The agent is
    // single-threaded, so no lock is held by another thread in the copy, and
    // the child (`child_main`) only makes system calls on data prepared
    // above before it execs or exits.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid == 0 {
        // SAFETY: we are the freshly cloned child; see child_main's contract.
        unsafe { child_main(&context) }
    }
    let clone_error = (pid < 0).then(io::Error::last_os_error);
    if let Setup::EnterNode { own_pidns, .. } = setup {
        // Back to our own PID namespace for later children. This cannot
        // fail (the active namespace is always a valid target); if it did,
        // every later node would be created in the wrong namespace.
        sys::setns(*own_pidns, libc::CLONE_NEWPID)
            .expect("return to the agent's own PID namespace");
    }
    if let Some(error) = clone_error {
        return Err(io_error("clone", error));
    }
    let pid = pid as libc::pid_t;
    drop((stdout_w, stderr_w, status_w));
    let mut go_write = go.map(|(_, w)| w);
    let (mut report, mut got) = read_report(status_r.as_fd())?;
    if got == report.len() && u32::from_ne_bytes(report[..4].try_into().unwrap()) == STEP_READY {
        if let Some(ready) = &mut ready {
            ready(pid);
        }
        if let Some(go) = go_write.take() {
            // A failed write is no hang: the child also wakes at the end
            // of the pipe (its own copy of this end is closed).
            let _ = sys::write(go.as_fd(), b"g");
        }
        (report, got) = read_report(status_r.as_fd())?;
    }
    drop(go_write);
    if got == 0 {
        for fd in [&stdout_r, &stderr_r] {
            sys::set_nonblocking(fd.as_fd()).map_err(|e| io_error("fcntl", e))?;
        }
        return Ok(Spawned {
            pid,
            stdout: stdout_r,
            stderr: stderr_r,
        });
    }
    let _ = sys::reap(pid);
    if got < report.len() {
        return Err("the child failed before exec without a report".to_string());
    }
    let step = u32::from_ne_bytes(report[..4].try_into().unwrap());
    let errno = i32::from_ne_bytes(report[4..].try_into().unwrap());
    Err(format!(
        "{}: {}",
        describe(step, command, setup),
        io::Error::from_raw_os_error(errno)
    ))
}

/// The child's 8-byte report (a step and an errno) and how many of its
/// bytes came: 0 at the end of the pipe (the child exec'd).
fn read_report(status: BorrowedFd<'_>) -> Result<([u8; 8], usize), String> {
    let mut report = [0u8; 8];
    let mut got = 0;
    while got < report.len() {
        match sys::read(status, &mut report[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(format!("read the child's status pipe: {e}")),
        }
    }
    Ok((report, got))
}

fn describe(step: u32, command: &Command, setup: &Setup<'_>) -> String {
    const ENTER: [&str; 4] = ["IPC", "UTS", "network", "mount"];
    match step {
        STEP_STDIO => "set up stdio".to_string(),
        STEP_SESSION => "setsid".to_string(),
        STEP_PDEATHSIG => "prctl(PR_SET_PDEATHSIG)".to_string(),
        STEP_NETNS => "join the node's network namespace".to_string(),
        STEP_TIMENS => "join the node's time namespace".to_string(),
        STEP_HOSTNAME => "sethostname".to_string(),
        s if STEP_ENTER.contains(&s) => {
            format!(
                "enter the node's {} namespace",
                ENTER[(s - STEP_ENTER[0]) as usize]
            )
        }
        STEP_ENTER_ROOT => "chroot into the node's root".to_string(),
        STEP_EXEC => format!("exec {:?}", command.program),
        s if s >= OP_BASE => match setup {
            Setup::NewNode { plan, .. } => plan
                .ops
                .get((s - OP_BASE) as usize)
                .map_or_else(|| format!("step {s}"), |(_, what)| what.clone()),
            _ => format!("step {s}"),
        },
        s => format!("step {s}"),
    }
}

fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Reports `step` with the current errno on the status pipe and exits 127.
///
/// # Safety
/// Only in the cloned child.
unsafe fn fail(context: &ChildContext<'_>, step: u32) -> ! {
    let errno = errno();
    let mut report = [0u8; 8];
    report[..4].copy_from_slice(&step.to_ne_bytes());
    report[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: `report` is valid for 8 bytes; _exit never returns. A short
    // write is not retried: the parent then reports an unknown failure.
    unsafe {
        libc::write(context.status, report.as_ptr().cast(), report.len());
        libc::_exit(127)
    }
}

fn ptr(s: &Option<CString>) -> *const libc::c_char {
    s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())
}

/// The cloned child: set up, then exec (or report and exit).
///
/// # Safety
/// Must only run in the child of the raw clone in [`spawn`]. It makes
/// system calls only (nothing allocates or takes a lock) and never returns.
unsafe fn child_main(context: &ChildContext<'_>) -> ! {
    // SAFETY: all calls below are plain system calls on descriptors and
    // NUL-terminated strings prepared by the parent, alive in our copy of
    // its memory; `fail` and `_exit` end the process.
    unsafe {
        // Signals: the agent blocks SIGCHLD and Rust ignores SIGPIPE; both
        // would be inherited across exec.
        for signal in 1..=64 {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::signal(signal, libc::SIG_DFL);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        if libc::setsid() < 0 {
            fail(context, STEP_SESSION);
        }
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) < 0
        {
            fail(context, STEP_PDEATHSIG);
        }
        if context.terminal >= 0 {
            if libc::dup2(context.terminal, 0) < 0
                || libc::dup2(context.terminal, 1) < 0
                || libc::dup2(context.terminal, 2) < 0
                || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0
            {
                fail(context, STEP_STDIO);
            }
        } else if libc::dup2(context.devnull, 0) < 0
            || libc::dup2(context.stdout, 1) < 0
            || libc::dup2(context.stderr, 2) < 0
        {
            fail(context, STEP_STDIO);
        }
        match context.setup {
            Setup::Root => {}
            Setup::NewNode {
                plan,
                netns,
                timens,
            } => {
                if libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) < 0 {
                    fail(context, STEP_NETNS);
                }
                // The child is single-threaded, as joining a time
                // namespace requires; it applies to this process at once.
                if let Some(timens) = timens {
                    if libc::setns(timens.as_raw_fd(), libc::CLONE_NEWTIME) < 0 {
                        fail(context, STEP_TIMENS);
                    }
                }
                for (index, (op, _)) in plan.ops.iter().enumerate() {
                    if !run_op(op) {
                        fail(context, OP_BASE + index as u32);
                    }
                }
                if libc::sethostname(plan.hostname.as_ptr(), plan.hostname.as_bytes().len()) < 0 {
                    fail(context, STEP_HOSTNAME);
                }
            }
            Setup::EnterNode { namespaces, .. } => {
                let order = [
                    (&namespaces.ipc, libc::CLONE_NEWIPC),
                    (&namespaces.uts, libc::CLONE_NEWUTS),
                    (&namespaces.net, libc::CLONE_NEWNET),
                    (&namespaces.mnt, libc::CLONE_NEWNS),
                ];
                for (step, (fd, nstype)) in STEP_ENTER.iter().zip(order) {
                    if libc::setns(fd.as_raw_fd(), nstype) < 0 {
                        fail(context, *step);
                    }
                }
                if let Some(time) = &namespaces.time {
                    if libc::setns(time.as_raw_fd(), libc::CLONE_NEWTIME) < 0 {
                        fail(context, STEP_TIMENS);
                    }
                }
                if libc::fchdir(namespaces.root.as_raw_fd()) < 0
                    || libc::chroot(c".".as_ptr()) < 0
                    || libc::chdir(c"/".as_ptr()) < 0
                {
                    fail(context, STEP_ENTER_ROOT);
                }
            }
        }
        if context.go >= 0 {
            // Set up: the parent looks at us now (see `spawn_then`), then
            // says go (a byte, or the end of the pipe).
            let mut report = [0u8; 8];
            report[..4].copy_from_slice(&STEP_READY.to_ne_bytes());
            libc::close(context.go_write);
            libc::write(context.status, report.as_ptr().cast(), report.len());
            let mut byte = 0u8;
            libc::read(context.go, (&mut byte as *mut u8).cast(), 1);
            libc::close(context.go);
        }
        // Like execvp: try every candidate; remember EACCES over ENOENT.
        let mut saved = libc::ENOENT;
        for candidate in context.candidates {
            libc::execve(
                candidate.as_ptr(),
                context.argv.as_ptr(),
                context.envp.as_ptr(),
            );
            match errno() {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => saved = libc::EACCES,
                other => {
                    saved = other;
                    break;
                }
            }
        }
        *libc::__errno_location() = saved;
        fail(context, STEP_EXEC)
    }
}

/// Runs one plan step; false (with errno set) on failure.
///
/// # Safety
/// Only in the cloned child (it mounts, chdirs and chroots).
unsafe fn run_op(op: &Op) -> bool {
    // SAFETY: every pointer is NULL or a NUL-terminated string owned by `op`.
    unsafe {
        match op {
            Op::Mount {
                source,
                target,
                fstype,
                flags,
                data,
            } => {
                libc::mount(
                    ptr(source),
                    target.as_ptr(),
                    ptr(fstype),
                    *flags,
                    ptr(data).cast(),
                ) == 0
            }
            Op::Mkdir(path) => libc::mkdir(path.as_ptr(), 0o755) == 0 || errno() == libc::EEXIST,
            Op::Touch(path) => {
                let fd = libc::open(
                    path.as_ptr(),
                    libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                    0o644,
                );
                fd >= 0 && libc::close(fd) == 0
            }
            Op::Symlink { target, link } => {
                libc::symlink(target.as_ptr(), link.as_ptr()) == 0 || errno() == libc::EEXIST
            }
            Op::Chdir(path) => libc::chdir(path.as_ptr()) == 0,
            Op::Chroot(path) => libc::chroot(path.as_ptr()) == 0,
        }
    }
}
