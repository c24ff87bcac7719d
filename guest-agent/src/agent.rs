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

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use guest_agent::protocol::{
    encode_frame, AgentToHost, ErrorContext, ExitStatus, FrameDecoder, HostToAgent, NodeSpec,
    Stream, MAX_OUTPUT_CHUNK, PROTOCOL_VERSION,
};

mod disks;
mod local_outputs;

use crate::clock::{self, ClockChange};
use crate::composer;
use crate::container::{self, Command, NodeNamespaces, NodePlan, SdkMounts, Setup};
use crate::disk::Disk;
use crate::history::HistoryLines;
use crate::local_output::LocalOutputs;
use crate::netlink::{link_index, Netlink};
use crate::sdk::{SdkEvent, SdkReady, SdkServer};
use crate::sys::{self, NsId};
use local_outputs::proc_root;

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

    /// Reads up to `max_chunks` chunks from one output pipe and sends each
    /// as an `output` message. Returns whether the pipe is still open and
    /// may hold more.
    fn read_output(
        &mut self,
        owner: &Owner,
        stream: Stream,
        buffer: &mut [u8],
        max_chunks: usize,
    ) -> bool {
        for _ in 0..max_chunks {
            let Some(running) = self.running_mut(owner) else {
                return false;
            };
            let slot = running.pipe(stream);
            let Some(fd) = slot.as_ref() else {
                return false;
            };
            match sys::read(fd.as_fd(), buffer) {
                Ok(0) => {
                    *slot = None;
                    return false;
                }
                Ok(n) => {
                    // History lines of a template command count as the
                    // workload's.
                    let node = match owner {
                        Owner::Node(name) => Some(name.clone()),
                        Owner::Workload | Owner::Command(_) => None,
                    };
                    let history = match (stream, self.running_mut(owner)) {
                        (Stream::Stdout, Some(running)) => running.history.push(&buffer[..n]),
                        _ => Vec::new(),
                    };
                    let data = buffer[..n].to_vec();
                    self.send(&match owner {
                        Owner::Node(name) => AgentToHost::Output {
                            node: Some(name.clone()),
                            stream,
                            data,
                        },
                        Owner::Workload => AgentToHost::Output {
                            node: None,
                            stream,
                            data,
                        },
                        Owner::Command(id) => AgentToHost::CommandOutput {
                            id: *id,
                            stream,
                            data,
                        },
                    });
                    for json in history {
                        self.send(&AgentToHost::History {
                            node: node.clone(),
                            json,
                        });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    *slot = None;
                    self.send_error(
                        ErrorContext::Output,
                        format!("read from {owner:?} {stream:?}: {e}"),
                    );
                    return false;
                }
            }
        }
        true
    }

    /// Sends what is left in a finished process's pipes, then closes them.
    /// Bounded: a process outside the node's PID namespace (only possible
    /// for the root workload's background children) may keep a pipe open
    /// and writing; what it writes after this is lost (EPIPE).
    fn drain_and_close(&mut self, owner: &Owner, buffer: &mut [u8]) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            self.read_output(owner, stream, buffer, MAX_DRAIN_CHUNKS);
            if let Some(running) = self.running_mut(owner) {
                *running.pipe(stream) = None;
            }
        }
    }

    /// Reads up to `max_chunks` chunks of the shell's terminal output and
    /// sends each. Returns whether the terminal may hold more.
    fn read_shell(&mut self, buffer: &mut [u8], max_chunks: usize) -> bool {
        for _ in 0..max_chunks {
            let Some(master) = self.shell.as_ref().and_then(|s| s.master.as_ref()) else {
                return false;
            };
            match sys::read(master.as_fd(), buffer) {
                Ok(n) if n > 0 => self.send(&AgentToHost::ShellOutput {
                    data: buffer[..n].to_vec(),
                }),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                // EOF, or EIO: no process holds the terminal any more.
                _ => {
                    if let Some(shell) = &mut self.shell {
                        shell.master = None;
                    }
                    return false;
                }
            }
        }
        true
    }

    fn reap_children(&mut self, buffer: &mut [u8]) -> io::Result<()> {
        while let Some((pid, status)) = sys::reap_any()? {
            if self.shell.as_ref().is_some_and(|s| s.pid == pid) {
                self.read_shell(buffer, MAX_DRAIN_CHUNKS);
                self.shell = None;
                self.send(&AgentToHost::ShellExited { status });
                continue;
            }
            if self.workload.as_ref().is_some_and(|w| w.running.pid == pid) {
                self.drain_and_close(&Owner::Workload, buffer);
                // What it wrote last, before its end (the host ends the
                // run there).
                self.read_local_outputs();
                self.workload = None;
                self.workload_status = Some(status);
                self.send(&AgentToHost::WorkloadExited { status });
                continue;
            }
            let command = self
                .commands
                .iter()
                .find(|(_, running)| running.pid == pid)
                .map(|(id, _)| *id);
            if let Some(id) = command {
                self.drain_and_close(&Owner::Command(id), buffer);
                self.read_local_outputs();
                self.commands.remove(&id);
                self.send(&AgentToHost::CommandExited { id, status });
                continue;
            }
            let name = self
                .nodes
                .iter()
                .find(|(_, node)| node.running.as_ref().is_some_and(|r| r.pid == pid))
                .map(|(name, _)| name.clone());
            let Some(name) = name else {
                // An orphan reparented to us (PID 1 / subreaper): just reaped.
                continue;
            };
            let owner = Owner::Node(name.clone());
            self.drain_and_close(&owner, buffer);
            // What it wrote last, through the directories held (its /tmp
            // ended with it).
            self.nodes.get_mut(&name).expect("node exists").running = None;
            self.read_local_output(&name);
            let node = self.nodes.get_mut(&name).expect("node exists");
            node.running = None;
            node.pidns = None;
            let restart = std::mem::take(&mut node.restart_pending) && !self.shutting_down;
            let crashed = std::mem::take(&mut node.crash_pending);
            self.send(&AgentToHost::Exited {
                node: name.clone(),
                status,
            });
            if crashed {
                self.release_disk(&name);
            } else if restart {
                if let Err(message) = self.start_node(&name) {
                    self.send_error(ErrorContext::Restart { node: name }, message);
                }
            }
        }
        Ok(())
    }

    fn read_channel(&mut self, buffer: &mut [u8]) {
        match sys::read(self.channel.as_fd(), buffer) {
            Ok(0) => {
                self.channel_open = false;
                self.begin_shutdown();
                return;
            }
            Ok(n) => self.decoder.push(&buffer[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) => {
                eprintln!("detvisor-agent: reading the channel: {e}");
                self.channel_open = false;
                self.begin_shutdown();
                return;
            }
        }
        loop {
            match self.decoder.next_message::<HostToAgent>() {
                Ok(Some(message)) => self.handle(message),
                Ok(None) => break,
                Err(error) => {
                    let fatal = error.is_fatal();
                    self.send_error(ErrorContext::Channel, error.to_string());
                    if fatal {
                        // The framing is lost: nothing more can be understood.
                        self.begin_shutdown();
                        break;
                    }
                }
            }
        }
    }

    fn send(&mut self, message: &AgentToHost) {
        if !self.channel_open {
            return;
        }
        let frame = match encode_frame(message) {
            Ok(frame) => frame,
            Err(error) => {
                let fallback = AgentToHost::Error {
                    context: ErrorContext::Encode,
                    message: error.to_string(),
                };
                encode_frame(&fallback).expect("a short error message encodes")
            }
        };
        if let Err(error) = sys::write_all(self.channel.as_fd(), &frame) {
            eprintln!("detvisor-agent: writing the channel: {error}");
            self.channel_open = false;
            self.begin_shutdown();
        }
    }

    fn send_error(&mut self, context: ErrorContext, message: String) {
        self.send(&AgentToHost::Error { context, message });
    }

    fn handle(&mut self, message: HostToAgent) {
        let context = message.error_context();
        let failed_command = match &message {
            HostToAgent::StartCommand { id, .. } => Some(*id),
            _ => None,
        };
        let result = if self.shutting_down {
            Err("the agent is shutting down".to_string())
        } else if let HostToAgent::Hello { version } = message {
            self.hello(version)
        } else if let HostToAgent::Reseed { bytes } = &message {
            // The kernel's, not the nodes': fine before hello.
            sys::reseed_kernel_rng(bytes).map_err(|e| e.to_string())
        } else if !self.greeted {
            Err("expected hello first".to_string())
        } else {
            match message {
                HostToAgent::Hello { .. } => unreachable!("handled above"),
                HostToAgent::CreateNode(spec) => self.create_node(spec),
                HostToAgent::StartWorkload { node, command, env } => {
                    self.start_workload(node, &command, &env)
                }
                HostToAgent::Pause { node } => self.pause(&node, true),
                HostToAgent::Resume { node } => self.pause(&node, false),
                HostToAgent::Kill { node, signal } => self.kill(&node, signal),
                HostToAgent::Restart { node } => self.restart(&node),
                HostToAgent::Crash { node } => self.crash(&node),
                HostToAgent::MountDisk { node } => self.mount_disk(&node),
                HostToAgent::FillDisk { node } => self.fill_disk(&node),
                HostToAgent::FreeDisk { node } => self.free_disk(&node),
                HostToAgent::StepClock { node, by_ns } => {
                    self.change_clock(&node, ClockChange::Step(by_ns))
                }
                HostToAgent::DriftClock { node, ppm } => {
                    self.change_clock(&node, ClockChange::Rate(ppm))
                }
                HostToAgent::Shutdown => {
                    self.begin_shutdown();
                    Ok(())
                }
                HostToAgent::OpenShell {
                    node,
                    rows,
                    cols,
                    term,
                } => self.open_shell(node, rows, cols, term),
                HostToAgent::ShellInput { data } => self.shell_input(&data),
                HostToAgent::Reseed { .. } => unreachable!("handled above"),
                HostToAgent::Random { id, value } => {
                    if let Some(sdk) = &mut self.sdk {
                        sdk.answer_random(id, value);
                    }
                    Ok(())
                }
                HostToAgent::ListTemplate { node, template } => {
                    self.list_template(&node, &template)
                }
                HostToAgent::StartCommand {
                    id,
                    node,
                    template,
                    command,
                    env,
                } => self.start_command(id, &node, &template, &command, &env),
                HostToAgent::KillCommand { id } => self.kill_command(id),
            }
        };
        if let Err(message) = result {
            self.send_error(context, message);
            if let Some(id) = failed_command {
                // The host waits for every run's end: this one ends here.
                self.send(&AgentToHost::CommandExited {
                    id,
                    status: ExitStatus::Code(127),
                });
            }
        }
    }

    fn hello(&mut self, version: u32) -> Result<(), String> {
        if version != PROTOCOL_VERSION {
            return Err(format!(
                "the host speaks protocol version {version}, the agent {PROTOCOL_VERSION}"
            ));
        }
        self.greeted = true;
        self.send(&AgentToHost::Ready {
            version: PROTOCOL_VERSION,
        });
        Ok(())
    }

    fn create_node(&mut self, spec: NodeSpec) -> Result<(), String> {
        if spec.name.is_empty() {
            return Err("empty node name".to_string());
        }
        if self.nodes.contains_key(&spec.name) {
            return Err(format!("node {:?} exists", spec.name));
        }
        let address = match (&spec.nic, &spec.address) {
            (None, Some(_)) => return Err("an address needs a nic".to_string()),
            (_, Some(address)) => Some(parse_ipv4_cidr(address)?),
            (_, None) => None,
        };
        let command = Command::new(&spec.command, &spec.env).map_err(|e| e.to_string())?;
        let hostname = spec.hostname.as_deref().unwrap_or(&spec.name);
        let disk = spec.disk.as_ref().map(Disk::new).transpose()?;
        let mut plan = NodePlan::new(
            Path::new(&spec.rootfs),
            hostname,
            disk.as_ref().map(Disk::mount_spec),
        )
        .map_err(|e| e.to_string())?;
        if let Some(sdk) = &mut self.sdk {
            sdk.add_node(&spec.name)
                .map_err(context_error("the node's SDK socket"))?;
            plan.add_sdk(&SdkMounts {
                shim: sdk.shim_path(),
                assert_command: self.own_executable.clone(),
                socket_dir: sdk.node_dir(&spec.name),
            })
            .map_err(|e| e.to_string())?;
        }
        let netns = self.new_netns()?;
        self.configure_network(netns.as_fd(), spec.nic.as_deref(), address)?;
        let timens = clock::new_timens(self.own_timens.as_ref().map(AsFd::as_fd))
            .map_err(|e| e.to_string())?;
        let mut local_outputs = LocalOutputs::default();
        if local_outputs.add_from_env(&spec.env) {
            self.watch_local_outputs()?;
        }
        self.nodes.insert(
            spec.name.clone(),
            Node {
                command,
                plan,
                netns,
                timens,
                running: None,
                pidns: None,
                restart_pending: false,
                disk,
                crash_pending: false,
                start_when_mounted: false,
                local_outputs,
            },
        );
        if let Err(message) = self.start_node(&spec.name) {
            // The node never ran: forget it (and its network namespace).
            self.nodes.remove(&spec.name);
            return Err(message);
        }
        Ok(())
    }

    /// A new network namespace, held by a descriptor. The agent enters it
    /// only for the duration of `unshare` + `open` and returns at once.
    fn new_netns(&self) -> Result<OwnedFd, String> {
        sys::unshare(libc::CLONE_NEWNET).map_err(context_error("unshare(CLONE_NEWNET)"))?;
        let netns = sys::open(Path::new("/proc/self/ns/net"), libc::O_RDONLY);
        self.return_to_root_netns();
        netns.map_err(context_error("open the new network namespace"))
    }

    fn return_to_root_netns(&self) {
        // Always possible for root; if it failed, the agent would keep
        // working in a node's namespace, so stop right here.
        sys::setns(self.root_netns.as_fd(), libc::CLONE_NEWNET)
            .expect("return to the agent's network namespace");
    }

    fn configure_network(
        &self,
        netns: BorrowedFd<'_>,
        nic: Option<&str>,
        address: Option<(Ipv4Addr, u8)>,
    ) -> Result<(), String> {
        if let Some(nic) = nic {
            let index = link_index(nic).map_err(|e| e.to_string())?;
            Netlink::open()
                .and_then(|mut netlink| netlink.move_link_to_netns(index, netns))
                .map_err(context_error(&format!("move {nic} into the node")))?;
        }
        sys::setns(netns, libc::CLONE_NEWNET).map_err(context_error("enter the node's netns"))?;
        let result = (|| -> Result<(), String> {
            let mut netlink = Netlink::open().map_err(context_error("netlink socket"))?;
            let lo = link_index("lo").map_err(|e| e.to_string())?;
            netlink
                .set_link_up(lo)
                .map_err(context_error("set lo up"))?;
            if let Some(nic) = nic {
                let index = link_index(nic).map_err(|e| e.to_string())?;
                if let Some((ip, prefix_len)) = address {
                    netlink
                        .add_ipv4_address(index, ip, prefix_len)
                        .map_err(context_error(&format!("add {ip}/{prefix_len} to {nic}")))?;
                }
                netlink
                    .set_link_up(index)
                    .map_err(context_error(&format!("set {nic} up")))?;
            }
            Ok(())
        })();
        self.return_to_root_netns();
        result
    }

    fn start_node(&mut self, name: &str) -> Result<(), String> {
        let node = self.nodes.get_mut(name).expect("node exists");
        let setup = Setup::NewNode {
            plan: &node.plan,
            netns: node.netns.as_fd(),
            timens: node.timens.as_ref().map(AsFd::as_fd),
        };
        let spawned = if node.local_outputs.is_empty() {
            container::spawn(&node.command, &setup, self.devnull.as_fd(), None)?
        } else {
            // Its files' directories, held before it runs: a node may end
            // (and its /tmp with it) before any read.
            let outputs = &mut node.local_outputs;
            outputs.forget();
            container::spawn_then(&node.command, &setup, self.devnull.as_fd(), &mut |pid| {
                outputs.look_up(&proc_root(pid))
            })?
        };
        node.pidns = sys::ns_id(Path::new(&format!("/proc/{}/ns/pid", spawned.pid))).ok();
        node.running = Some(Running {
            pid: spawned.pid,
            stdout: Some(spawned.stdout),
            stderr: Some(spawned.stderr),
            history: HistoryLines::default(),
        });
        self.send(&AgentToHost::NodeStarted {
            name: name.to_string(),
            pid: spawned.pid,
        });
        Ok(())
    }

    fn running_node(&self, name: &str) -> Result<(&Node, libc::pid_t), String> {
        let node = self
            .nodes
            .get(name)
            .ok_or_else(|| format!("no node {name:?}"))?;
        let pid = node
            .running
            .as_ref()
            .ok_or_else(|| format!("node {name:?} is not running"))?
            .pid;
        Ok((node, pid))
    }

    fn start_workload(
        &mut self,
        node: Option<String>,
        command: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        if self.workload.is_some() {
            return Err("a workload is already running".to_string());
        }
        let command = Command::new(command, env).map_err(|e| e.to_string())?;
        self.add_local_outputs(node.as_deref(), env)?;
        let spawned = match &node {
            None => container::spawn(&command, &Setup::Root, self.devnull.as_fd(), None)?,
            Some(name) => {
                let (_, pid) = self.running_node(name)?;
                let namespaces = NodeNamespaces::of(pid).map_err(|e| e.to_string())?;
                let setup = Setup::EnterNode {
                    namespaces: &namespaces,
                    own_pidns: self.own_pidns.as_fd(),
                };
                container::spawn(&command, &setup, self.devnull.as_fd(), None)?
            }
        };
        let pid = spawned.pid;
        self.workload = Some(Workload {
            running: Running {
                pid,
                stdout: Some(spawned.stdout),
                stderr: Some(spawned.stderr),
                history: HistoryLines::default(),
            },
        });
        self.workload_status = None;
        self.send(&AgentToHost::WorkloadStarted { node, pid });
        Ok(())
    }

    /// Lists template `template` as node `node` sees its root.
    fn list_template(&mut self, node: &str, template: &str) -> Result<(), String> {
        let (_, pid) = self.running_node(node)?;
        let commands = composer::list_for_process(pid, template)?;
        self.send(&AgentToHost::TemplateCommands {
            template: template.to_string(),
            commands,
        });
        Ok(())
    }

    /// Starts a template's command inside `node`, as a workload is started
    /// (its own session and process group, output on pipes).
    fn start_command(
        &mut self,
        id: u32,
        node: &str,
        template: &str,
        command: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        if self.commands.contains_key(&id) {
            return Err(format!("command run {id} is already running"));
        }
        let path = composer::command_path(template, command)?;
        let command = Command::new(&[path], env).map_err(|e| e.to_string())?;
        let (_, pid) = self.running_node(node)?;
        self.add_local_outputs(Some(node), env)?;
        let namespaces = NodeNamespaces::of(pid).map_err(|e| e.to_string())?;
        let setup = Setup::EnterNode {
            namespaces: &namespaces,
            own_pidns: self.own_pidns.as_fd(),
        };
        let spawned = container::spawn(&command, &setup, self.devnull.as_fd(), None)?;
        self.commands.insert(
            id,
            Running {
                pid: spawned.pid,
                stdout: Some(spawned.stdout),
                stderr: Some(spawned.stderr),
                history: HistoryLines::default(),
            },
        );
        self.send(&AgentToHost::CommandStarted {
            id,
            pid: spawned.pid,
        });
        Ok(())
    }

    /// SIGKILL a command run's process group (it leads its own session),
    /// then itself. One that has ended already is no error: the host may
    /// ask before it hears of the end.
    fn kill_command(&mut self, id: u32) -> Result<(), String> {
        if let Some(running) = self.commands.get(&id) {
            let _ = sys::kill(-running.pid, libc::SIGKILL);
            let _ = sys::kill(running.pid, libc::SIGKILL);
        }
        Ok(())
    }

    /// SIGSTOP (`stop`) or SIGCONT every process in the node's PID
    /// namespace, found by scanning /proc; scans again until a scan finds
    /// no process not yet signaled (one forked between scan and signal).
    fn pause(&mut self, name: &str, stop: bool) -> Result<(), String> {
        let (node, _) = self.running_node(name)?;
        let pidns = node
            .pidns
            .ok_or_else(|| format!("node {name:?} has no PID namespace"))?;
        let signal = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        let mut signaled = BTreeSet::new();
        for _ in 0..64 {
            let pids = sys::pids_in_pid_ns(pidns).map_err(context_error("scan /proc"))?;
            let new: Vec<_> = pids.into_iter().filter(|p| !signaled.contains(p)).collect();
            if new.is_empty() {
                break;
            }
            for pid in new {
                // A process may exit in between: ESRCH is fine.
                let _ = sys::kill(pid, signal);
                signaled.insert(pid);
            }
        }
        let node = name.to_string();
        self.send(&if stop {
            AgentToHost::Paused { node }
        } else {
            AgentToHost::Resumed { node }
        });
        Ok(())
    }

    fn kill(&mut self, name: &str, signal: i32) -> Result<(), String> {
        if !(1..=64).contains(&signal) {
            return Err(format!("invalid signal {signal}"));
        }
        let (_, pid) = self.running_node(name)?;
        sys::kill(pid, signal).map_err(context_error(&format!("kill {pid}")))
    }

    /// Steps or re-rates the node's realtime clock (running or not: its
    /// time namespace outlives its processes) and reports the result.
    fn change_clock(&mut self, name: &str, change: ClockChange) -> Result<(), String> {
        let node = self
            .nodes
            .get(name)
            .ok_or_else(|| format!("no node {name:?}"))?;
        let (Some(timens), Some(own)) = (&node.timens, &self.own_timens) else {
            return Err(
                "the guest kernel has no time namespaces (CONFIG_TIME_NS and the \
                 0003-timens patch): nodes share the guest's clock"
                    .to_string(),
            );
        };
        let state =
            clock::change(timens.as_fd(), own.as_fd(), change).map_err(|e| e.to_string())?;
        self.send(&AgentToHost::ClockSet {
            node: name.to_string(),
            offset_ns: state.offset_ns,
            rate_ppm: state.rate_ppm,
        });
        Ok(())
    }

    fn restart(&mut self, name: &str) -> Result<(), String> {
        let node = self.node_mut(name)?;
        match &node.running {
            Some(running) => {
                node.restart_pending = true;
                // Started again when reaped (see reap_children).
                sys::kill(running.pid, libc::SIGKILL).map_err(context_error("kill"))
            }
            None if node.disk.as_ref().is_some_and(|d| !d.ready()) => {
                // After a crash: started once the disk takes writes (mount_disk).
                node.start_when_mounted = true;
                Ok(())
            }
            None => self.start_node(name),
        }
    }

    fn node_mut(&mut self, name: &str) -> Result<&mut Node, String> {
        self.nodes
            .get_mut(name)
            .ok_or_else(|| format!("no node {name:?}"))
    }

    /// Pauses every running node, then starts `sh` on a new pseudo-terminal
    /// (in the root namespaces, or inside `node`).
    fn open_shell(
        &mut self,
        node: Option<String>,
        rows: u16,
        cols: u16,
        term: Option<String>,
    ) -> Result<(), String> {
        if self.shell.is_some() {
            return Err("a shell is already open".to_string());
        }
        let namespaces = match &node {
            Some(name) => {
                let (_, pid) = self.running_node(name)?;
                Some(NodeNamespaces::of(pid).map_err(context_error("the node's namespaces"))?)
            }
            None => None,
        };
        let (master, slave) = sys::open_pty(rows, cols).map_err(context_error("open a pty"))?;
        sys::set_nonblocking(master.as_fd()).map_err(context_error("fcntl"))?;
        let mut env = BTreeMap::new();
        env.insert("TERM".to_string(), term.unwrap_or_else(|| "vt100".into()));
        env.insert("HOME".to_string(), "/".to_string());
        let prompt = match &node {
            Some(name) => format!("(fork) {name}:\\w # "),
            None => "(fork) \\w # ".to_string(),
        };
        env.insert("PS1".to_string(), prompt);
        let command =
            Command::new(&["sh".to_string(), "-i".to_string()], &env).map_err(|e| e.to_string())?;
        // What the user looks at stays that moment: every running node is
        // stopped, and none restarts behind the shell's back.
        let running: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, node)| node.running.is_some())
            .map(|(name, _)| name.clone())
            .collect();
        for node in self.nodes.values_mut() {
            node.restart_pending = false;
        }
        for name in &running {
            self.pause(name, true)?;
        }
        let spawned = match &namespaces {
            None => container::spawn(
                &command,
                &Setup::Root,
                self.devnull.as_fd(),
                Some(slave.as_fd()),
            ),
            Some(namespaces) => {
                let setup = Setup::EnterNode {
                    namespaces,
                    own_pidns: self.own_pidns.as_fd(),
                };
                container::spawn(&command, &setup, self.devnull.as_fd(), Some(slave.as_fd()))
            }
        };
        let spawned = match spawned {
            Ok(spawned) => spawned,
            Err(message) => {
                // No shell: leave the nodes as they were.
                for name in &running {
                    let _ = self.pause(name, false);
                }
                return Err(message);
            }
        };
        drop(slave);
        self.shell = Some(Shell {
            pid: spawned.pid,
            master: Some(master),
            input: Vec::new(),
        });
        self.send(&AgentToHost::ShellOpened { pid: spawned.pid });
        Ok(())
    }

    /// Queues typed bytes for the shell's terminal and writes what it takes
    /// now; the rest goes out as the terminal drains (POLLOUT).
    fn shell_input(&mut self, data: &[u8]) -> Result<(), String> {
        let shell = self
            .shell
            .as_mut()
            .filter(|s| s.master.is_some())
            .ok_or_else(|| "no shell is open".to_string())?;
        shell.input.extend_from_slice(data);
        self.write_shell_input()
    }

    /// Writes queued input to the shell's terminal until it would block.
    fn write_shell_input(&mut self) -> Result<(), String> {
        let Some(shell) = self.shell.as_mut() else {
            return Ok(());
        };
        let Some(master) = shell.master.as_ref() else {
            shell.input.clear();
            return Ok(());
        };
        while !shell.input.is_empty() {
            match sys::write(master.as_fd(), &shell.input) {
                Ok(n) => {
                    shell.input.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    shell.input.clear();
                    return Err(format!("write to the shell's terminal: {e}"));
                }
            }
        }
        Ok(())
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
        if let Some(workload) = &self.workload {
            // Its process group (it is a session leader), then itself.
            let _ = sys::kill(-workload.running.pid, libc::SIGKILL);
            let _ = sys::kill(workload.running.pid, libc::SIGKILL);
        }
    }
}

/// `a.b.c.d/len`.
fn parse_ipv4_cidr(text: &str) -> Result<(Ipv4Addr, u8), String> {
    let invalid = || format!("invalid address {text:?} (expected a.b.c.d/len)");
    let (ip, len) = text.split_once('/').ok_or_else(invalid)?;
    let ip: Ipv4Addr = ip.parse().map_err(|_| invalid())?;
    let len: u8 = len.parse().map_err(|_| invalid())?;
    if len > 32 {
        return Err(invalid());
    }
    Ok((ip, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_ipv4_cidr() {
        assert_eq!(
            parse_ipv4_cidr("192.0.2.1/24"),
            Ok((Ipv4Addr::new(192, 0, 2, 1), 24))
        );
        for bad in ["192.0.2.1", "192.0.2.1/33", "192.0.2/24", "x/1", "1.2.3.4/"] {
            assert!(parse_ipv4_cidr(bad).is_err(), "{bad}");
        }
    }
}
