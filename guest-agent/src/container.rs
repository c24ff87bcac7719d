//! Starting processes: plain children (the workload in the root namespaces),
//! new containers (a node's PID 1) and processes entering a running node.
//!
//! # How a node's container is made
//! The agent keeps one network namespace per node (created with `unshare`,
//! held by a descriptor: see `agent.rs`), so the NIC and its address
//! survive restarts. Every start of the node's command is a raw
//! `clone(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC)`; the
//! child (PID 1 of the new PID namespace) then, before `execve`:
//! 1. resets signal dispositions and the signal mask, starts a new session,
//!    asks for SIGKILL if the agent dies (`PR_SET_PDEATHSIG`), puts stdin on
//!    /dev/null and stdout/stderr on two pipes the agent reads;
//! 2. joins the node's network namespace and its time namespace (`setns`;
//!    the time namespace, the node's own realtime clock, is also kept
//!    across restarts: see `clock.rs`);
//! 3. makes the whole mount tree private (so nothing propagates back to the
//!    agent's namespace), bind-mounts the node's root directory onto itself
//!    and mounts, under it: the node's data disk (ext4, if it has one: in
//!    this namespace only, so the file system lives exactly as long as the
//!    node's processes, see `disk.rs`), `proc` (of the new PID namespace), `sysfs` (of
//!    the node's network namespace, read-only), a tmpfs `/dev` with bind
//!    mounts of null, zero, full, random, urandom and tty from the agent's
//!    /dev, a private `devpts` instance on /dev/pts (with /dev/ptmx), tmpfs
//!    /dev/shm, the /dev/fd and /dev/std* links, and fresh tmpfs on /tmp
//!    and /run (so a restart sees an empty /tmp, like a reboot; the rest of
//!    the root directory persists);
//! 4. **switches root with `MS_MOVE` + `chroot`, not `pivot_root`**: in the
//!    guest the agent's root is the initramfs (rootfs), on which
//!    `pivot_root` fails with EINVAL. It moves the bind mount onto `/` and
//!    chroots into it (what `runc --no-pivot` does). The old root stays in
//!    the namespace's mount table, covered and unreachable by path;
//!    isolation from a root process that tries hard to escape a chroot is
//!    not a goal (the nodes are the system under test, not adversaries);
//! 5. sets the hostname (new UTS namespace) and execs the command, looking
//!    `argv[0]` up in the node's `PATH` like `execvp`.
//!
//! Everything the child needs (C strings, pointer arrays) is built before
//! `clone`, so the child only makes system calls: no allocation, no locks.
//! A failing step writes `(step, errno)` to a close-on-exec pipe and exits
//! 127; the parent reads that pipe until EOF (exec succeeded) or the error.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::sys::{self, cstring, path_cstring};

/// `PATH` for commands whose environment has none (also used for lookup).
pub const DEFAULT_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// Device nodes bind-mounted from the agent's /dev into a node's /dev.
const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// A command ready for `execve`.
#[derive(Debug)]
pub struct Command {
    argv: Vec<CString>,
    env: Vec<CString>,
    /// Paths to try in order (argv[0] itself if it has a `/`, else each
    /// `PATH` entry joined with it).
    candidates: Vec<CString>,
    program: String,
}

impl Command {
    pub fn new(argv: &[String], env: &BTreeMap<String, String>) -> io::Result<Self> {
        let Some(program) = argv.first() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
        };
        let mut env_strings = Vec::with_capacity(env.len() + 1);
        for (key, value) in env {
            if key.is_empty() || key.contains('=') {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("invalid environment variable name {key:?}"),
                ));
            }
            env_strings.push(cstring(&format!("{key}={value}"))?);
        }
        let path = match env.get("PATH") {
            Some(path) => path.as_str(),
            None => {
                env_strings.push(cstring(&format!("PATH={DEFAULT_PATH}"))?);
                DEFAULT_PATH
            }
        };
        let candidates = if program.contains('/') {
            vec![cstring(program)?]
        } else if program.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty program name",
            ));
        } else {
            path.split(':')
                .map(|dir| {
                    let dir = if dir.is_empty() { "." } else { dir };
                    cstring(&format!("{}/{program}", dir.trim_end_matches('/')))
                })
                .collect::<io::Result<_>>()?
        };
        Ok(Self {
            argv: argv.iter().map(|a| cstring(a)).collect::<io::Result<_>>()?,
            env: env_strings,
            candidates,
            program: program.clone(),
        })
    }
}

/// One step of a node's mount set-up, run by the child.
#[derive(Debug)]
enum Op {
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: libc::c_ulong,
        data: Option<CString>,
    },
    /// mkdir; an existing entry is fine.
    Mkdir(CString),
    /// Create an empty file (a bind-mount target).
    Touch(CString),
    /// symlink(target, link); an existing entry is fine.
    Symlink {
        target: CString,
        link: CString,
    },
    Chdir(CString),
    Chroot(CString),
}

/// Everything a node's PID 1 does between `clone` and `execve`.
#[derive(Debug)]
pub struct NodePlan {
    ops: Vec<(Op, String)>,
    hostname: CString,
    /// The node's root directory (canonical), for [`NodePlan::add_sdk`].
    rootfs: PathBuf,
}

/// What every node gets for the Antithesis SDKs (see `sdk.rs`): the shim
/// at `/usr/lib/libvoidstar.so`, `detvisor-assert` at
/// `/usr/bin/detvisor-assert`, and its own socket directory at
/// `/run/detvisor`. Bind mounts in the node's mount namespace only: the
/// node's files are not changed (an empty mount point is created if the
/// root lacks one).
#[derive(Clone, Debug)]
pub struct SdkMounts {
    pub shim: PathBuf,
    /// The agent's own executable (it is `detvisor-assert` by that name).
    pub assert_command: Option<PathBuf>,
    pub socket_dir: PathBuf,
}

/// Steps before the root switch at the end of every plan (chdir, move,
/// chroot, chdir).
const ROOT_SWITCH_OPS: usize = 4;

impl NodePlan {
    /// Builds the plan for root directory `rootfs` (absolute) and creates
    /// the mount points it needs in it (`proc sys dev tmp run`, and the
    /// disk's: `disk` is the device and its mount point inside the root).
    pub fn new(rootfs: &Path, hostname: &str, disk: Option<(&Path, &Path)>) -> io::Result<Self> {
        if !rootfs.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("root directory {rootfs:?} is not absolute"),
            ));
        }
        if hostname.is_empty() || hostname.len() > 64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid hostname {hostname:?}"),
            ));
        }
        let rootfs = std::fs::canonicalize(rootfs)
            .map_err(|e| io::Error::new(e.kind(), format!("root directory {rootfs:?}: {e}")))?;
        if !rootfs.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("root directory {rootfs:?} is not a directory"),
            ));
        }
        for dir in ["proc", "sys", "dev", "tmp", "run"] {
            std::fs::create_dir_all(rootfs.join(dir))
                .map_err(|e| io::Error::new(e.kind(), format!("mkdir {rootfs:?}/{dir}: {e}")))?;
        }
        let mut plan = PlanBuilder::default();
        let r = |sub: &str| -> PathBuf { rootfs.join(sub) };
        let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;
        plan.mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        )?;
        plan.mount(
            Some(&rootfs),
            &rootfs,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
        if let Some((device, inside)) = disk {
            let target = rootfs.join(inside.strip_prefix("/").unwrap_or(inside));
            std::fs::create_dir_all(&target)
                .map_err(|e| io::Error::new(e.kind(), format!("mkdir {target:?}: {e}")))?;
            plan.mount(Some(device), &target, Some("ext4"), 0, None)?;
        }
        plan.mount(
            Some(Path::new("proc")),
            &r("proc"),
            Some("proc"),
            nosuid_nodev | libc::MS_NOEXEC,
            None,
        )?;
        plan.mount(
            Some(Path::new("sysfs")),
            &r("sys"),
            Some("sysfs"),
            nosuid_nodev | libc::MS_NOEXEC | libc::MS_RDONLY,
            None,
        )?;
        plan.mount(
            Some(Path::new("tmpfs")),
            &r("dev"),
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("mode=0755"),
        )?;
        for device in DEVICES {
            let target = r("dev").join(device);
            plan.op(
                Op::Touch(path_cstring(&target)?),
                format!("create {target:?}"),
            );
            let source = Path::new("/dev").join(device);
            plan.mount(Some(&source), &target, None, libc::MS_BIND, None)?;
        }
        plan.mkdir(&r("dev/pts"))?;
        plan.mount(
            Some(Path::new("devpts")),
            &r("dev/pts"),
            Some("devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        )?;
        plan.symlink("pts/ptmx", &r("dev/ptmx"))?;
        plan.mkdir(&r("dev/shm"))?;
        plan.mount(
            Some(Path::new("shm")),
            &r("dev/shm"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=1777"),
        )?;
        plan.symlink("/proc/self/fd", &r("dev/fd"))?;
        plan.symlink("/proc/self/fd/0", &r("dev/stdin"))?;
        plan.symlink("/proc/self/fd/1", &r("dev/stdout"))?;
        plan.symlink("/proc/self/fd/2", &r("dev/stderr"))?;
        plan.mount(
            Some(Path::new("tmpfs")),
            &r("tmp"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=1777"),
        )?;
        plan.mount(
            Some(Path::new("tmpfs")),
            &r("run"),
            Some("tmpfs"),
            nosuid_nodev,
            Some("mode=0755"),
        )?;
        plan.op(
            Op::Chdir(path_cstring(&rootfs)?),
            format!("chdir {rootfs:?}"),
        );
        plan.mount(Some(&rootfs), Path::new("/"), None, libc::MS_MOVE, None)?;
        plan.op(Op::Chroot(cstring(".")?), format!("chroot {rootfs:?}"));
        plan.op(Op::Chdir(cstring("/")?), "chdir / (new root)".to_string());
        Ok(Self {
            ops: plan.ops,
            hostname: cstring(hostname)?,
            rootfs,
        })
    }

    /// Adds the SDK's bind mounts (after /run's tmpfs, before the root
    /// switch).
    pub fn add_sdk(&mut self, sdk: &SdkMounts) -> io::Result<()> {
        let r = |sub: &str| -> PathBuf { self.rootfs.join(sub) };
        let mut plan = PlanBuilder::default();
        for dir in ["usr", "usr/lib", "usr/bin"] {
            plan.mkdir(&r(dir))?;
        }
        let mut files = vec![(sdk.shim.as_path(), r("usr/lib/libvoidstar.so"))];
        if let Some(command) = &sdk.assert_command {
            files.push((command.as_path(), r("usr/bin/detvisor-assert")));
        }
        for (source, target) in files {
            plan.op(
                Op::Touch(path_cstring(&target)?),
                format!("create {target:?}"),
            );
            plan.mount(Some(source), &target, None, libc::MS_BIND, None)?;
        }
        plan.mkdir(&r("run/detvisor"))?;
        plan.mount(
            Some(&sdk.socket_dir),
            &r("run/detvisor"),
            None,
            libc::MS_BIND,
            None,
        )?;
        let at = self.ops.len() - ROOT_SWITCH_OPS;
        self.ops.splice(at..at, plan.ops);
        Ok(())
    }
}

#[derive(Default)]
struct PlanBuilder {
    ops: Vec<(Op, String)>,
}

impl PlanBuilder {
    fn op(&mut self, op: Op, what: String) {
        self.ops.push((op, what));
    }

    fn mount(
        &mut self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> io::Result<()> {
        let what = match (
            fstype,
            flags & libc::MS_BIND != 0,
            flags & libc::MS_MOVE != 0,
        ) {
            (Some(fstype), _, _) => format!("mount {fstype} on {target:?}"),
            (None, true, _) => format!("bind-mount {source:?} on {target:?}"),
            (None, _, true) => format!("move mount {source:?} to {target:?}"),
            _ => format!("change propagation of {target:?}"),
        };
        let op = Op::Mount {
            source: source.map(path_cstring).transpose()?,
            target: path_cstring(target)?,
            fstype: fstype.map(cstring).transpose()?,
            flags,
            data: data.map(cstring).transpose()?,
        };
        self.op(op, what);
        Ok(())
    }

    fn mkdir(&mut self, path: &Path) -> io::Result<()> {
        self.op(Op::Mkdir(path_cstring(path)?), format!("mkdir {path:?}"));
        Ok(())
    }

    fn symlink(&mut self, target: &str, link: &Path) -> io::Result<()> {
        self.op(
            Op::Symlink {
                target: cstring(target)?,
                link: path_cstring(link)?,
            },
            format!("symlink {link:?} -> {target}"),
        );
        Ok(())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(c: &[CString]) -> Vec<&str> {
        c.iter().map(|s| s.to_str().unwrap()).collect()
    }

    #[test]
    fn test_command_looks_program_up_in_path_and_adds_default_path() {
        // Act
        let command = Command::new(&["sh".into(), "-c".into()], &BTreeMap::new()).unwrap();

        // Assert
        assert_eq!(strings(&command.argv), ["sh", "-c"]);
        assert_eq!(strings(&command.env), [&format!("PATH={DEFAULT_PATH}")]);
        assert_eq!(
            strings(&command.candidates),
            ["/usr/sbin/sh", "/usr/bin/sh", "/sbin/sh", "/bin/sh"]
        );
    }

    #[test]
    fn test_command_with_slash_and_own_path() {
        // Arrange
        let env: BTreeMap<String, String> =
            [("PATH".into(), "/x:".into()), ("A".into(), "b c".into())].into();

        // Act
        let absolute = Command::new(&["/bin/true".into()], &env).unwrap();
        let looked_up = Command::new(&["prog".into()], &env).unwrap();

        // Assert
        assert_eq!(strings(&absolute.candidates), ["/bin/true"]);
        assert_eq!(strings(&absolute.env), ["A=b c", "PATH=/x:"]);
        assert_eq!(strings(&looked_up.candidates), ["/x/prog", "./prog"]);
    }

    #[test]
    fn test_command_rejects_bad_input() {
        let env: BTreeMap<String, String> = [("A=B".into(), "c".into())].into();
        assert!(Command::new(&[], &BTreeMap::new()).is_err());
        assert!(Command::new(&["".into()], &BTreeMap::new()).is_err());
        assert!(Command::new(&["a\0b".into()], &BTreeMap::new()).is_err());
        assert!(Command::new(&["sh".into()], &env).is_err());
    }

    #[test]
    fn test_node_plan_creates_mount_points_and_ends_with_the_root_switch() {
        // Arrange
        let dir = tempfile::tempdir().unwrap();

        // Act
        let plan = NodePlan::new(dir.path(), "n1", None).unwrap();

        // Assert
        for sub in ["proc", "sys", "dev", "tmp", "run"] {
            assert!(dir.path().join(sub).is_dir(), "{sub}");
        }
        let whats: Vec<&str> = plan.ops.iter().map(|(_, w)| w.as_str()).collect();
        assert_eq!(whats[0], "change propagation of \"/\"");
        assert!(whats[whats.len() - 3].starts_with("move mount"));
        assert!(whats[whats.len() - 2].starts_with("chroot"));
        assert_eq!(plan.hostname.to_str().unwrap(), "n1");
    }

    #[test]
    fn test_node_plan_mounts_the_disk_inside_the_root_after_binding_it() {
        // Arrange
        let dir = tempfile::tempdir().unwrap();

        // Act
        let disk = Some((Path::new("/dev/vda"), Path::new("/var/lib/n1")));
        let plan = NodePlan::new(dir.path(), "n1", disk).unwrap();

        // Assert
        assert!(dir.path().join("var/lib/n1").is_dir());
        let root = std::fs::canonicalize(dir.path()).unwrap();
        assert!(plan.ops[1].1.starts_with("bind-mount"));
        assert_eq!(
            plan.ops[2].1,
            format!("mount ext4 on {:?}", root.join("var/lib/n1"))
        );
    }

    #[test]
    fn test_sdk_mounts_come_after_run_and_before_the_root_switch() {
        let dir = tempfile::tempdir().unwrap();
        let mut plan = NodePlan::new(dir.path(), "n1", None).unwrap();
        let before = plan.ops.len();
        plan.add_sdk(&SdkMounts {
            shim: PathBuf::from("/run/detvisor/libvoidstar.so"),
            assert_command: Some(PathBuf::from("/detvisor-agent")),
            socket_dir: PathBuf::from("/run/detvisor/nodes/n1"),
        })
        .unwrap();
        let whats: Vec<&str> = plan.ops.iter().map(|(_, w)| w.as_str()).collect();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let at = |what: &str| whats.iter().position(|w| *w == what).expect(what);
        let run_tmpfs = at(&format!("mount tmpfs on {:?}", root.join("run")));
        let sockets = at(&format!(
            "bind-mount Some({:?}) on {:?}",
            Path::new("/run/detvisor/nodes/n1"),
            root.join("run/detvisor")
        ));
        let shim = at(&format!(
            "bind-mount Some({:?}) on {:?}",
            Path::new("/run/detvisor/libvoidstar.so"),
            root.join("usr/lib/libvoidstar.so")
        ));
        assert!(run_tmpfs < shim && shim < sockets);
        assert_eq!(whats.len(), before + 9);
        assert!(whats[whats.len() - 3].starts_with("move mount"));
    }

    #[test]
    fn test_node_plan_rejects_relative_or_missing_root_and_bad_hostname() {
        let dir = tempfile::tempdir().unwrap();
        assert!(NodePlan::new(Path::new("relative"), "n", None).is_err());
        assert!(NodePlan::new(&dir.path().join("missing"), "n", None).is_err());
        assert!(NodePlan::new(dir.path(), "", None).is_err());
        assert!(NodePlan::new(dir.path(), &"x".repeat(65), None).is_err());
    }
}
