//! The agent's state machine and event loop.
//!
//! One thread, one `poll` over: the SIGCHLD signalfd, the control channel,
//! and the read ends of every running process's stdout/stderr pipes. `poll`
//! has no timeout: the agent sleeps until the VMM writes to the channel, a
//! child writes output or a child exits, and never spins (the VMM's virtual
//! time only advances at exits, so a spinning agent would stop time).
//!
//! After each `poll`, ready descriptors are served in a fixed order: output
//! pipes (nodes by name, stdout before stderr, then the workload's), then
//! exited children, then the channel. Nodes live in a `BTreeMap`: nothing
//! the agent does depends on hash order, a thread's timing, or a clock, so
//! given the same sequence of system-call results (which the deterministic
//! VM provides) it sends the same bytes.
//!
//! Here: the agent's state and the loop. The work, by concern: `channel`
//! (requests read, dispatched and answered), `children` (output pipes and
//! exits), `nodes`, `workloads` (the workload and template commands),
//! `shell`, `inspect` (exec, read_file, processes), `disks` and
//! `local_outputs`.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use guest_agent::protocol::{
    AgentToHost, ErrorContext, ExitStatus, FrameDecoder, Stream, MAX_OUTPUT_CHUNK, PROTOCOL_VERSION,
};

mod channel;
mod children;
mod disks;
mod inspect;
mod local_outputs;
mod nodes;
mod shell;
mod workloads;

use crate::clock;
use crate::container::{Command, NodePlan};
use crate::disk::Disk;
use crate::history::HistoryLines;
use crate::local_output::LocalOutputs;
use crate::sdk::{SdkEvent, SdkReady, SdkServer};
use crate::sys::{self, NsId};

/// How the agent treats the system around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// PID 1 of a guest: mounts /proc, /sys, /dev..., powers off at the end.
    Guest,
    /// A process on a development host: first moves itself into a new
    /// network namespace (so NICs it moves can only be ones created there),
    /// touches nothing outside the namespaces it creates, exits at the end.
    Test,
}

/// A process the agent started and has not reaped yet.
#[derive(Debug)]
struct Running {
    pid: libc::pid_t,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    /// The unfinished line of stdout, for history lines.
    history: HistoryLines,
}

impl Running {
    fn pipe(&mut self, stream: Stream) -> &mut Option<OwnedFd> {
        match stream {
            Stream::Stdout => &mut self.stdout,
            Stream::Stderr => &mut self.stderr,
        }
    }
}

#[derive(Debug)]
struct Node {
    command: Command,
    plan: NodePlan,
    /// The node's network namespace, kept across restarts.
    netns: OwnedFd,
    /// The node's time namespace (its own realtime clock), kept across
    /// restarts; `None` if the kernel has no time namespaces.
    timens: Option<OwnedFd>,
    running: Option<Running>,
    /// The node's PID namespace while it runs (for pause/resume).
    pidns: Option<NsId>,
    restart_pending: bool,
    /// The node's data disk, if it has one.
    disk: Option<Disk>,
    /// A `crash` waits for the node's end to unmount its disk.
    crash_pending: bool,
    /// A start waits for the disk to be mounted again (after a crash).
    start_when_mounted: bool,
    /// The SDKs' fallback files (`ANTITHESIS_SDK_LOCAL_OUTPUT`) its own,
    /// its workloads' and its commands' environments named.
    local_outputs: LocalOutputs,
}

#[derive(Debug)]
struct Workload {
    running: Running,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Owner {
    Node(String),
    Workload,
    /// A test-composer command run, by its id.
    Command(u32),
}

#[derive(Clone, Debug)]
enum Ready {
    Sigchld,
    Channel,
    Pipe(Owner, Stream),
    Shell,
    ShellWritable,
    Sdk(SdkReady),
    LocalOutputTimer,
    /// An `exec`'s output pipe, by the request's id.
    ExecPipe(u64, Stream),
    ExecTimer(u64),
}

/// The shell a user opened in a fork, on a pseudo-terminal.
#[derive(Debug)]
struct Shell {
    pid: libc::pid_t,
    /// The terminal's master side (non-blocking); `None` once it reported
    /// the end (every process holding the slave side has gone).
    master: Option<OwnedFd>,
    /// Typed bytes the terminal has not taken yet.
    input: Vec<u8>,
}

pub struct Agent {
    channel: OwnedFd,
    channel_open: bool,
    decoder: FrameDecoder,
    sigchld: OwnedFd,
    devnull: OwnedFd,
    root_netns: OwnedFd,
    own_pidns: OwnedFd,
    /// The guest's time namespace; `None` without time namespaces.
    own_timens: Option<OwnedFd>,
    greeted: bool,
    shutting_down: bool,
    nodes: BTreeMap<String, Node>,
    workload: Option<Workload>,
    workload_status: Option<ExitStatus>,
    /// Test-composer command runs, by id (see `start_command`).
    commands: BTreeMap<u32, Running>,
    /// `exec` requests whose command runs, by id.
    execs: BTreeMap<u64, inspect::ExecRun>,
    shell: Option<Shell>,
    /// The SDK sockets (`None`: not started, see [`Agent::start_sdk`]).
    sdk: Option<SdkServer>,
    /// The agent's own executable, bind-mounted as `detvisor-assert`.
    own_executable: Option<std::path::PathBuf>,
    /// The fallback files the root workload's environment named.
    root_outputs: LocalOutputs,
    /// Fires once some environment named a local output file.
    local_output_timer: Option<OwnedFd>,
}

/// Chunks read at most from a finished process's pipes (or terminal).
const MAX_DRAIN_CHUNKS: usize = 64;

fn context_error(what: &str) -> impl Fn(io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Agent {
    /// Blocks SIGCHLD (before any child exists) and opens what the agent
    /// keeps for its lifetime.
    pub fn new(channel: OwnedFd) -> io::Result<Self> {
        let sigchld = sys::sigchld_fd()?;
        Ok(Self {
            channel,
            channel_open: true,
            decoder: FrameDecoder::default(),
            sigchld,
            devnull: sys::open(Path::new("/dev/null"), libc::O_RDWR)?,
            root_netns: sys::open(Path::new("/proc/self/ns/net"), libc::O_RDONLY)?,
            own_pidns: sys::open(Path::new("/proc/self/ns/pid"), libc::O_RDONLY)?,
            own_timens: clock::own_timens(),
            greeted: false,
            shutting_down: false,
            nodes: BTreeMap::new(),
            workload: None,
            workload_status: None,
            commands: BTreeMap::new(),
            execs: BTreeMap::new(),
            shell: None,
            sdk: None,
            own_executable: None,
            root_outputs: LocalOutputs::default(),
            local_output_timer: None,
        })
    }

    /// Opens the SDK sockets and installs the shim under `dir` (see
    /// `sdk.rs`); nodes created from now on get them.
    pub fn start_sdk(&mut self, dir: &Path) -> io::Result<()> {
        self.sdk = Some(SdkServer::start(dir)?);
        self.own_executable = std::env::current_exe().ok();
        Ok(())
    }

    /// The shim's file in the agent's namespace (once started).
    pub fn shim_path(&self) -> Option<std::path::PathBuf> {
        self.sdk.as_ref().map(SdkServer::shim_path)
    }

    /// The status of the last workload that ended, if any.
    pub fn workload_status(&self) -> Option<ExitStatus> {
        self.workload_status
    }

    /// Serves the channel until `shutdown` (or the channel's end) and every
    /// process the agent started is gone.
    pub fn run(&mut self) -> io::Result<()> {
        let mut buffer = vec![0u8; MAX_OUTPUT_CHUNK];
        self.send(&AgentToHost::Booted {
            version: PROTOCOL_VERSION,
        });
        loop {
            if self.shutting_down && self.nothing_running() {
                return Ok(());
            }
            let mut interest: Vec<(BorrowedFd<'_>, Ready)> =
                vec![(self.sigchld.as_fd(), Ready::Sigchld)];
            if self.channel_open {
                interest.push((self.channel.as_fd(), Ready::Channel));
            }
            let runs = self
                .nodes
                .iter()
                .filter_map(|(name, node)| {
                    Some((Owner::Node(name.clone()), node.running.as_ref()?))
                })
                .chain(
                    self.workload
                        .as_ref()
                        .map(|w| (Owner::Workload, &w.running)),
                )
                .chain(
                    self.commands
                        .iter()
                        .map(|(id, running)| (Owner::Command(*id), running)),
                );
            for (owner, running) in runs {
                for (pipe, stream) in [
                    (&running.stdout, Stream::Stdout),
                    (&running.stderr, Stream::Stderr),
                ] {
                    if let Some(fd) = pipe {
                        interest.push((fd.as_fd(), Ready::Pipe(owner.clone(), stream)));
                    }
                }
            }
            for (id, run) in &self.execs {
                for (pipe, stream) in [(&run.stdout, Stream::Stdout), (&run.stderr, Stream::Stderr)]
                {
                    if let Some(fd) = pipe {
                        interest.push((fd.as_fd(), Ready::ExecPipe(*id, stream)));
                    }
                }
                if let Some(timer) = &run.timer {
                    interest.push((timer.as_fd(), Ready::ExecTimer(*id)));
                }
            }
            if let Some(shell) = &self.shell {
                if let Some(master) = &shell.master {
                    interest.push((master.as_fd(), Ready::Shell));
                    if !shell.input.is_empty() {
                        interest.push((master.as_fd(), Ready::ShellWritable));
                    }
                }
            }
            if let Some(sdk) = &self.sdk {
                interest.extend(
                    sdk.interest()
                        .into_iter()
                        .map(|(fd, ready)| (fd, Ready::Sdk(ready))),
                );
            }
            if let Some(timer) = &self.local_output_timer {
                interest.push((timer.as_fd(), Ready::LocalOutputTimer));
            }
            let mut pollfds: Vec<libc::pollfd> = interest
                .iter()
                .map(|(fd, ready)| libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(fd),
                    events: match ready {
                        Ready::ShellWritable => libc::POLLOUT,
                        _ => libc::POLLIN,
                    },
                    revents: 0,
                })
                .collect();
            sys::poll_forever(&mut pollfds)?;
            let ready: Vec<Ready> = interest
                .into_iter()
                .zip(&pollfds)
                .filter(|(_, p)| p.revents != 0)
                .map(|((_, ready), _)| ready)
                .collect();

            for item in &ready {
                match item {
                    Ready::Pipe(owner, stream) => {
                        self.read_output(owner, *stream, &mut buffer, 1);
                    }
                    Ready::Shell => {
                        self.read_shell(&mut buffer, 1);
                    }
                    Ready::ShellWritable => {
                        if let Err(message) = self.write_shell_input() {
                            self.send_error(ErrorContext::ShellInput, message);
                        }
                    }
                    Ready::Sdk(ready) => self.serve_sdk(ready),
                    Ready::LocalOutputTimer => {
                        if let Some(timer) = &self.local_output_timer {
                            sys::drain_timerfd(timer.as_fd());
                        }
                        self.read_local_outputs();
                    }
                    Ready::ExecPipe(id, stream) => {
                        self.read_exec_output(*id, *stream, &mut buffer, 1);
                    }
                    Ready::ExecTimer(id) => self.exec_timed_out(*id),
                    Ready::Sigchld | Ready::Channel => {}
                }
            }
            if ready.iter().any(|r| matches!(r, Ready::Sigchld)) {
                sys::drain_signalfd(self.sigchld.as_fd())?;
                self.reap_children(&mut buffer)?;
            }
            if ready.iter().any(|r| matches!(r, Ready::Channel)) {
                self.read_channel(&mut buffer);
            }
        }
    }

    /// Serves one SDK socket and passes what its clients asked on.
    fn serve_sdk(&mut self, ready: &SdkReady) {
        let Some(sdk) = &mut self.sdk else {
            return;
        };
        let mut events = Vec::new();
        sdk.serve(ready, &mut events);
        for event in events {
            match event {
                SdkEvent::Record { node, json } => self.send(&AgentToHost::Sdk { node, json }),
                SdkEvent::RandomRequest { node, id } => {
                    self.send(&AgentToHost::RandomRequest { node, id })
                }
                SdkEvent::BadClient { node, message } => {
                    self.send_error(ErrorContext::Sdk { node }, message);
                }
            }
        }
    }

    fn nothing_running(&self) -> bool {
        self.workload.is_none()
            && self.commands.is_empty()
            && self.execs.is_empty()
            && self.shell.is_none()
            && self.nodes.values().all(|node| node.running.is_none())
    }

    fn running_mut(&mut self, owner: &Owner) -> Option<&mut Running> {
        match owner {
            Owner::Node(name) => self.nodes.get_mut(name)?.running.as_mut(),
            Owner::Workload => self.workload.as_mut().map(|w| &mut w.running),
            Owner::Command(id) => self.commands.get_mut(id),
        }
    }

    fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        if let Some(shell) = &self.shell {
            let _ = sys::kill(-shell.pid, libc::SIGKILL);
            let _ = sys::kill(shell.pid, libc::SIGKILL);
        }
        for node in self.nodes.values_mut() {
            node.restart_pending = false;
            if let Some(running) = &node.running {
                let _ = sys::kill(running.pid, libc::SIGKILL);
            }
        }
        for running in self.commands.values() {
            let _ = sys::kill(-running.pid, libc::SIGKILL);
            let _ = sys::kill(running.pid, libc::SIGKILL);
        }
        for run in self.execs.values() {
            let _ = sys::kill(-run.pid, libc::SIGKILL);
            let _ = sys::kill(run.pid, libc::SIGKILL);
        }
        if let Some(workload) = &self.workload {
            // Its process group (it is a session leader), then itself.
            let _ = sys::kill(-workload.running.pid, libc::SIGKILL);
            let _ = sys::kill(workload.running.pid, libc::SIGKILL);
        }
    }
}
