//! `detvisor up cluster.toml`: a multi-node system under test in one guest.
//!
//! The guest's PID 1 is the agent (`detvisor-agent`), reached over a virtio
//! console. [`Conductor`] is the host side of that conversation: a pure state
//! machine fed with the agent's messages and the virtual time, answering with
//! the messages to send. The session loop calls it after every exit, so every
//! message reaches the guest at an exit chosen by guest output or virtual
//! time: the whole run, faults included, is a function of the seed.

use crate::faults::{FaultAction, TimedFault};
use crate::manifest::{Manifest, NodePlan, RootSource, WorkloadPlan};

mod event;
mod launch;
use anyhow::{bail, Context, Result};
use detvisor_agent::protocol::{
    encode_frame, AgentToHost, ExitStatus, FrameDecoder, HostToAgent, NodeSpec, Stream,
    MAX_FRAME_LEN, PROTOCOL_VERSION,
};
use devices::VirtNanos;
pub use event::UpEvent;
use image_builder::{ImageConfig, RootFs};
pub use launch::{prepare, run, Initrd, PreparedUp, UpOptions, UpSummary, DEFAULT_RAM_BYTES};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where node `name`'s root directory is in the guest.
pub fn node_root(name: &str) -> String {
    format!("/nodes/{name}")
}

/// The guest's NIC for node `index` (in manifest order).
pub fn node_nic(index: usize) -> String {
    format!("eth{index}")
}

/// The name the workload's output goes under (stdout prefix and log file)
/// when it runs inside a node.
pub const WORKLOAD_LOG: &str = crate::manifest::WORKLOAD_NODE;

/// What the conductor reports to the loop besides messages to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// Something to tell the user (not node output).
    Event(UpEvent),
    /// Output of a node (`None`: the workload running inside a node).
    Output {
        node: Option<String>,
        stream: Stream,
        data: Vec<u8>,
    },
    /// News of a shell opened in a fork (`detvisor shell`).
    Shell(ShellEvent),
}

/// What the agent reports about a fork's shell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShellEvent {
    Opened {
        pid: i32,
    },
    /// Terminal output.
    Output(Vec<u8>),
    Exited(ExitStatus),
    /// `open_shell` or `shell_input` failed.
    Failed {
        context: String,
        message: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Phase {
    /// Waiting for `booted`.
    Booting,
    /// `hello` sent, waiting for `ready`.
    Greeting,
    /// Nodes requested, waiting for each `node_started`.
    Starting,
    /// Every node runs (and the workload, if any, was started).
    Running,
    /// `shutdown` sent.
    ShuttingDown,
}

/// The host side of the agent conversation. It is its own saved state (a
/// snapshot of an `up` run holds it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conductor {
    nodes: Vec<NodeSpec>,
    workload: Option<WorkloadPlan>,
    /// Agent-side faults still to do, in time order.
    faults: VecDeque<TimedFault>,
    phase: Phase,
    /// Nodes running now.
    running: BTreeSet<String>,
    /// Nodes that have started at least once (a node may exit before the
    /// last one starts; it still counts as started).
    ever_started: BTreeSet<String>,
    /// Without a workload: the first node that ended badly, whose status
    /// becomes the run's once every node has ended.
    first_failure: Option<i32>,
    /// The run's status once the workload ended (or a setup step failed).
    status: Option<i32>,
}

/// Exit status when the guest could not be set up (a node failed to start).
pub const SETUP_FAILED: i32 = crate::exit_status::NO_STATUS as i32;

impl Conductor {
    pub fn new(
        nodes: Vec<NodeSpec>,
        workload: Option<WorkloadPlan>,
        faults: &[TimedFault],
    ) -> Self {
        Conductor {
            nodes,
            workload,
            faults: faults
                .iter()
                .filter(|f| !f.action.is_network())
                .cloned()
                .collect(),
            phase: Phase::Booting,
            running: BTreeSet::new(),
            ever_started: BTreeSet::new(),
            first_failure: None,
            status: None,
        }
    }

    /// The run's status: the workload's (shell convention), or
    /// [`SETUP_FAILED`]; `None` while it runs or without a workload.
    pub fn status(&self) -> Option<i32> {
        self.status
    }

    /// Whether the run has a workload (whose end is the run's end).
    pub fn has_workload(&self) -> bool {
        self.workload.is_some()
    }

    /// Adds an agent-side fault to the schedule (after those at the same time).
    pub fn add_fault(&mut self, fault: TimedFault) {
        let at = self.faults.partition_point(|f| f.at <= fault.at);
        self.faults.insert(at, fault);
    }

    /// The next virtual time at which [`Conductor::due`] has something to do.
    pub fn next_fault_time(&self) -> Option<VirtNanos> {
        if self.phase == Phase::ShuttingDown {
            return None;
        }
        self.faults.front().map(|f| f.at)
    }

    /// Handles one message from the agent.
    pub fn on_message(
        &mut self,
        message: AgentToHost,
        send: &mut Vec<HostToAgent>,
        notes: &mut Vec<Note>,
    ) {
        match message {
            AgentToHost::Booted { version } => {
                if self.phase != Phase::Booting {
                    notes.push(Note::Event(UpEvent::AgentBootedTwice));
                    return;
                }
                if version != PROTOCOL_VERSION {
                    notes.push(Note::Event(UpEvent::ProtocolMismatch {
                        agent: version,
                        host: PROTOCOL_VERSION,
                    }));
                }
                send.push(HostToAgent::Hello {
                    version: PROTOCOL_VERSION,
                });
                self.phase = Phase::Greeting;
            }
            AgentToHost::Ready { .. } => {
                if self.phase != Phase::Greeting {
                    return;
                }
                send.extend(self.nodes.iter().cloned().map(HostToAgent::CreateNode));
                self.phase = Phase::Starting;
                if self.nodes.is_empty() {
                    self.all_started(send);
                }
            }
            AgentToHost::NodeStarted { name, pid } => {
                notes.push(Note::Event(UpEvent::NodeStarted {
                    node: name.clone(),
                    pid,
                }));
                self.running.insert(name.clone());
                self.ever_started.insert(name);
                if self.phase == Phase::Starting
                    && self
                        .nodes
                        .iter()
                        .all(|n| self.ever_started.contains(&n.name))
                {
                    self.all_started(send);
                }
            }
            AgentToHost::WorkloadStarted { node, .. } => {
                notes.push(Note::Event(UpEvent::WorkloadStarted { node }));
            }
            AgentToHost::Output { node, stream, data } => {
                notes.push(Note::Output { node, stream, data });
            }
            AgentToHost::Exited { node, status } => {
                self.running.remove(&node);
                notes.push(Note::Event(UpEvent::NodeExited {
                    node: node.clone(),
                    status,
                }));
                if matches!(&self.workload, Some(WorkloadPlan::OwnNode(w)) if w.name == node) {
                    self.finish(status.shell_code(), send);
                } else if self.workload.is_none() {
                    if status != ExitStatus::Code(0) {
                        self.first_failure.get_or_insert(status.shell_code());
                    }
                    // Nothing left to run: the run is over.
                    if self.phase == Phase::Running && self.running.is_empty() {
                        self.finish(self.first_failure.unwrap_or(0), send);
                    }
                }
            }
            AgentToHost::WorkloadExited { status } => {
                notes.push(Note::Event(UpEvent::WorkloadExited { status }));
                self.finish(status.shell_code(), send);
            }
            AgentToHost::ShellOpened { pid } => notes.push(Note::Shell(ShellEvent::Opened { pid })),
            AgentToHost::ShellOutput { data } => notes.push(Note::Shell(ShellEvent::Output(data))),
            AgentToHost::ShellExited { status } => {
                notes.push(Note::Shell(ShellEvent::Exited(status)))
            }
            AgentToHost::Paused { node } => notes.push(Note::Event(UpEvent::NodePaused { node })),
            AgentToHost::Resumed { node } => notes.push(Note::Event(UpEvent::NodeResumed { node })),
            AgentToHost::Error { context, message }
                if context == "open_shell" || context == "shell_input" =>
            {
                notes.push(Note::Shell(ShellEvent::Failed { context, message }));
            }
            AgentToHost::Error { context, message } => {
                notes.push(Note::Event(UpEvent::AgentError {
                    context: context.clone(),
                    message,
                }));
                // Setting up failed: a node could not be made, or the
                // workload could not start (so nothing would ever end the run).
                let setup = ["hello", "create_node", "channel"]
                    .iter()
                    .any(|step| context.starts_with(step))
                    && self.phase != Phase::Running;
                if setup || context.starts_with("start_workload") {
                    self.finish(SETUP_FAILED, send);
                }
            }
        }
    }

    /// Agent-side faults due at `now`. Faults that fall before every node
    /// runs wait until they do (an agent cannot pause a node it has not made).
    pub fn due(&mut self, now: VirtNanos, send: &mut Vec<HostToAgent>, notes: &mut Vec<Note>) {
        if self.phase != Phase::Running {
            return;
        }
        while self.faults.front().is_some_and(|f| f.at <= now) {
            let fault = self.faults.pop_front().expect("checked above");
            notes.push(Note::Event(UpEvent::Fault {
                action: fault.action.clone(),
            }));
            send.push(match fault.action {
                FaultAction::Pause(node) => HostToAgent::Pause { node },
                FaultAction::Resume(node) => HostToAgent::Resume { node },
                FaultAction::Kill { node, signal } => HostToAgent::Kill { node, signal },
                FaultAction::Restart(node) => HostToAgent::Restart { node },
                FaultAction::Partition(_) | FaultAction::Heal => continue,
            });
        }
    }

    fn all_started(&mut self, send: &mut Vec<HostToAgent>) {
        self.phase = Phase::Running;
        if let Some(WorkloadPlan::InNode { node, command, env }) = &self.workload {
            // The node's environment (its image's PATH among it) under the workload's own.
            let mut merged = self
                .nodes
                .iter()
                .find(|n| &n.name == node)
                .map(|n| n.env.clone())
                .unwrap_or_default();
            merged.extend(env.clone());
            send.push(HostToAgent::StartWorkload {
                node: Some(node.clone()),
                command: command.clone(),
                env: merged,
            });
        }
    }

    fn finish(&mut self, status: i32, send: &mut Vec<HostToAgent>) {
        if self.phase == Phase::ShuttingDown {
            return;
        }
        self.status = Some(status);
        self.phase = Phase::ShuttingDown;
        send.push(HostToAgent::Shutdown);
    }
}

/// A node's tree and image config from its source.
fn load_root(source: &RootSource) -> Result<(RootFs, ImageConfig)> {
    match source {
        RootSource::Image(path) => {
            let bytes = std::fs::read(path)
                .with_context(|| format!("cannot read node image {}", path.display()))?;
            let image = image_builder::NodeImage::load(&bytes)
                .with_context(|| format!("node image {}", path.display()))?;
            Ok((image.root, image.config))
        }
        RootSource::Oci(reference) => {
            let oci = image_builder::parse_oci_ref(reference)
                .with_context(|| format!("OCI reference {reference}"))?;
            let (config, layers) = image_builder::read_image(&oci)
                .with_context(|| format!("reading OCI layout {reference}"))?;
            let root = image_builder::flatten(&layers)
                .with_context(|| format!("flattening OCI layout {reference}"))?;
            Ok((root, config))
        }
        RootSource::Rootfs(dir) => {
            let root = RootFs::from_dir(dir)
                .with_context(|| format!("reading rootfs directory {}", dir.display()))?;
            Ok((root, ImageConfig::default()))
        }
    }
}

/// The agent's node requests and the overlay of the guest initramfs (the
/// agent plus every node's tree under `/nodes/<name>`), from a manifest.
pub fn assemble(manifest: &Manifest, agent: &Path) -> Result<(Vec<NodeSpec>, RootFs)> {
    let mut overlay = RootFs::new();
    let agent_bytes = std::fs::read(agent)
        .with_context(|| format!("cannot read the agent {}", agent.display()))?;
    overlay.add_file("detvisor-agent", 0o755, agent_bytes)?;
    overlay.add_dir("nodes", 0o755)?;
    let mut specs = Vec::new();
    for (index, node) in manifest.all_nodes().into_iter().enumerate() {
        let (root, config) =
            load_root(&node.source).with_context(|| format!("node {}", node.name))?;
        overlay
            .graft(&node_root(&node.name), &root)
            .with_context(|| format!("node {}", node.name))?;
        specs.push(node_spec(node, index, &config)?);
    }
    Ok((specs, overlay))
}

/// The agent's request for one node: the manifest's command and env over
/// the image's defaults.
fn node_spec(node: &NodePlan, index: usize, config: &ImageConfig) -> Result<NodeSpec> {
    let command = if node.command.is_empty() {
        config.argv()
    } else {
        node.command.clone()
    };
    if command.is_empty() {
        bail!(
            "node {}: no `command` in the manifest and none in its image",
            node.name
        );
    }
    let mut env: BTreeMap<String, String> = config
        .env
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    env.extend(node.env.clone());
    Ok(NodeSpec {
        name: node.name.clone(),
        rootfs: node_root(&node.name),
        hostname: node.hostname.clone(),
        nic: Some(node_nic(index)),
        address: Some(node.address.clone()),
        env,
        command,
    })
}

/// Prints node output line by line with the node's name in front, and keeps
/// each node's raw output in `<logs>/<node>.log`.
pub struct OutputSink {
    width: usize,
    partial: BTreeMap<(String, bool), Vec<u8>>,
    logs: Option<PathBuf>,
    files: BTreeMap<String, std::fs::File>,
    out: Box<dyn Write>,
}

impl OutputSink {
    pub fn new(names: &[String], logs: Option<PathBuf>, out: Box<dyn Write>) -> Result<Self> {
        if let Some(dir) = &logs {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the log directory {}", dir.display()))?;
        }
        Ok(OutputSink {
            width: names.iter().map(String::len).max().unwrap_or(0).max(8),
            partial: BTreeMap::new(),
            logs,
            files: BTreeMap::new(),
            out,
        })
    }

    /// A sink that drops everything.
    pub fn discard() -> Self {
        Self::new(&[], None, Box::new(std::io::sink()))
            .expect("without a log directory nothing can fail")
    }

    pub fn output(&mut self, node: &str, stream: Stream, data: &[u8]) -> Result<()> {
        if let Some(dir) = &self.logs {
            if !self.files.contains_key(node) {
                let path = dir.join(format!("{node}.log"));
                let file = std::fs::File::create(&path)
                    .with_context(|| format!("creating {}", path.display()))?;
                self.files.insert(node.to_string(), file);
            }
            let file = self.files.get_mut(node).expect("inserted above");
            file.write_all(data).context("writing a node log")?;
        }
        let key = (node.to_string(), stream == Stream::Stderr);
        let buffer = self.partial.entry(key).or_default();
        buffer.extend_from_slice(data);
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            write!(self.out, "{node:>width$} | ", width = self.width)?;
            self.out.write_all(&line)?;
        }
        Ok(())
    }

    /// Prints what is left without a final newline.
    pub fn flush(&mut self) -> Result<()> {
        for ((node, _), rest) in std::mem::take(&mut self.partial) {
            if !rest.is_empty() {
                write!(self.out, "{node:>width$} | ", width = self.width)?;
                self.out.write_all(&rest)?;
                writeln!(self.out)?;
            }
        }
        self.out.flush()?;
        Ok(())
    }
}

/// The run's exit status: the workload's; without a workload, 0 when the
/// run reached its time limit (the nodes ran as long as asked).
pub fn run_status(conductor: &Conductor, stop: vmm::exit::StopReason) -> u8 {
    use vmm::exit::StopReason;
    if let Some(status) = conductor.status() {
        return u8::try_from(status).unwrap_or(crate::exit_status::NO_STATUS);
    }
    match stop {
        StopReason::TimeLimit if !conductor.has_workload() => 0,
        StopReason::TimeLimit => crate::exit_status::TIME_LIMIT,
        StopReason::GuestExit { status } => status,
        _ => crate::exit_status::NO_STATUS,
    }
}

/// Sends `message` to the agent now (at this exit). Outside the conductor's
/// loop only in forks (`detvisor shell`): a recorded run's messages come
/// from the conductor alone.
pub fn send_message(session: &mut vmm::vm::Session, message: &HostToAgent) -> Result<()> {
    let frame = encode_frame(message).context("encoding a message for the agent")?;
    session.send_to_agent(&frame)?;
    Ok(())
}

/// What an `up` run keeps on the host besides the VM, saved with its
/// snapshots: the conversation's state, the agent's unfinished frame and the
/// network faults still to announce. Restored, it continues the very run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpState {
    pub conductor: Conductor,
    /// The start of an agent frame not complete yet.
    pub agent_frame_bytes: Vec<u8>,
    /// The nodes, in manifest order (output goes by these names).
    pub node_names: Vec<String>,
    /// Partitions and heals not announced yet (the switch carries them out;
    /// its own state holds the schedule).
    pub network_events: Vec<TimedFault>,
}

/// Called with each event (node started, fault, ...) and its time.
pub type EventSink = Box<dyn FnMut(VirtNanos, &UpEvent)>;

/// Where an `up` run's node output and events go.
pub struct UpOutput {
    pub sink: OutputSink,
    pub events: EventSink,
}

impl UpOutput {
    /// Node output to `out` (prefixed lines, no logs); event lines to
    /// `events` when given.
    pub fn plain(
        node_names: &[String],
        out: Box<dyn Write>,
        events: Option<Box<dyn Write>>,
    ) -> Result<Self> {
        let mut events = events;
        Ok(UpOutput {
            sink: OutputSink::new(node_names, None, out)?,
            events: Box::new(move |at, event| {
                if let Some(w) = &mut events {
                    // Event lines are for people; a closed stream loses none of the run.
                    let _ = writeln!(w, "{}", event_line(at, event));
                }
            }),
        })
    }
}

/// An event as one line for people, with its virtual time.
pub fn event_line(at: VirtNanos, event: &UpEvent) -> String {
    format!("detvisor: [{at}] {event}")
}

/// Puts a partition or heal on the switch's schedule (other faults are the
/// agent's: nothing to do here).
fn schedule_network_fault(
    session: &mut vmm::vm::Session,
    node_names: &[String],
    fault: &TimedFault,
) -> Result<()> {
    let ports = session.devices_mut().nic_ports();
    let result = match &fault.action {
        FaultAction::Partition(groups) => {
            let mut port_groups = Vec::new();
            for group in groups {
                let mut ports_of_group = Vec::new();
                for name in group {
                    let index = node_names
                        .iter()
                        .position(|n| n == name)
                        .with_context(|| format!("fault {}: no node {name:?}", fault.action))?;
                    ports_of_group.push(ports[index]);
                }
                port_groups.push(ports_of_group);
            }
            session
                .devices_mut()
                .schedule_partition(fault.at, port_groups)
        }
        FaultAction::Heal => session.devices_mut().schedule_heal(fault.at),
        _ => return Ok(()),
    };
    result.with_context(|| format!("scheduling the fault {}", fault.action))
}

/// Runs a session as an `up` run: after every exit, the agent's output goes
/// to the conductor and its answers to the agent; network faults are
/// announced as the switch carries them out.
pub struct UpDriver {
    conductor: Conductor,
    decoder: FrameDecoder,
    node_names: Vec<String>,
    network_events: VecDeque<TimedFault>,
    output: UpOutput,
    send: Vec<HostToAgent>,
    notes: Vec<Note>,
    /// Shell news not taken yet (see [`UpDriver::take_shell_events`]).
    shell_events: Vec<ShellEvent>,
    /// See [`UpDriver::hold_conductor`]; never part of a recorded run.
    held: bool,
}

impl UpDriver {
    /// A run from boot: schedules the partitions and heals on the switch.
    pub fn start(
        session: &mut vmm::vm::Session,
        conductor: Conductor,
        network_faults: &[TimedFault],
        node_names: &[String],
        output: UpOutput,
    ) -> Result<Self> {
        for fault in network_faults {
            schedule_network_fault(session, node_names, fault)?;
        }
        Ok(Self::restore(
            UpState {
                conductor,
                agent_frame_bytes: Vec::new(),
                node_names: node_names.to_vec(),
                network_events: network_faults.to_vec(),
            },
            output,
        ))
    }

    /// Continues a saved run (the session restored from the same snapshot).
    pub fn restore(state: UpState, output: UpOutput) -> Self {
        let mut decoder = FrameDecoder::new(MAX_FRAME_LEN);
        decoder.push(&state.agent_frame_bytes);
        UpDriver {
            conductor: state.conductor,
            decoder,
            node_names: state.node_names,
            network_events: state.network_events.into(),
            output,
            send: Vec::new(),
            notes: Vec::new(),
            shell_events: Vec::new(),
            held: false,
        }
    }

    /// Back to a saved state in place (the session reset to the same moment).
    pub fn reset(&mut self, state: &UpState) {
        let output = std::mem::replace(
            &mut self.output,
            UpOutput {
                sink: OutputSink::discard(),
                events: Box::new(|_, _| {}),
            },
        );
        // Unfinished lines belong to the history being left.
        let mut output = output;
        output.sink.partial.clear();
        *self = Self::restore(state.clone(), output);
    }

    /// The state to save between two steps.
    pub fn save(&self) -> UpState {
        UpState {
            conductor: self.conductor.clone(),
            agent_frame_bytes: self.decoder.buffered().to_vec(),
            node_names: self.node_names.clone(),
            network_events: self.network_events.iter().cloned().collect(),
        }
    }

    /// Adds `fault` to the run from now on: partitions and heals go to the
    /// switch, the rest to the conductor's schedule. A fault before `now`
    /// is refused.
    pub fn inject(&mut self, session: &mut vmm::vm::Session, fault: TimedFault) -> Result<()> {
        let now = session.now();
        if fault.at < now {
            bail!(
                "fault {} at {}: that is before the run's present, {now}",
                fault.action,
                fault.at
            );
        }
        for name in fault.action.nodes() {
            if !self.node_names.iter().any(|n| n == name) {
                bail!(
                    "fault {}: no node is named {name:?} (nodes: {})",
                    fault.action,
                    self.node_names.join(", ")
                );
            }
        }
        if fault.action.is_network() {
            schedule_network_fault(session, &self.node_names, &fault)?;
            let at = self.network_events.partition_point(|f| f.at <= fault.at);
            self.network_events.insert(at, fault);
        } else {
            self.conductor.add_fault(fault);
        }
        Ok(())
    }

    pub fn conductor(&self) -> &Conductor {
        &self.conductor
    }

    /// From now on the conductor's answers and faults are not sent: in a
    /// fork opened for a shell nothing may start, resume, restart or shut
    /// down what the user is looking at. (It still follows the agent.)
    pub fn hold_conductor(&mut self) {
        self.held = true;
    }

    /// What the agent reported about a fork's shell since the last call.
    pub fn take_shell_events(&mut self) -> Vec<ShellEvent> {
        std::mem::take(&mut self.shell_events)
    }

    /// Prints the node output still held back (lines without an end).
    pub fn flush(&mut self) -> Result<()> {
        self.output.sink.flush()
    }

    /// One exit and the conversation after it (`Some` when the guest stopped).
    pub fn step(
        &mut self,
        session: &mut vmm::vm::Session,
    ) -> Result<Option<vmm::exit::StopReason>> {
        session.set_wakeup(self.conductor.next_fault_time());
        if let Some(stop) = session.step_one()? {
            return Ok(Some(stop));
        }
        let now = session.now();
        while self.network_events.front().is_some_and(|f| f.at <= now) {
            let fault = self.network_events.pop_front().expect("checked above");
            (self.output.events)(
                fault.at,
                &UpEvent::Fault {
                    action: fault.action,
                },
            );
        }
        let bytes = session.take_agent_output();
        if !bytes.is_empty() {
            self.decoder.push(&bytes);
            loop {
                match self.decoder.next_message::<AgentToHost>() {
                    Ok(Some(message)) => {
                        self.conductor
                            .on_message(message, &mut self.send, &mut self.notes)
                    }
                    Ok(None) => break,
                    Err(e) if e.is_fatal() => bail!("the agent's channel broke: {e}"),
                    Err(e) => self.notes.push(Note::Event(UpEvent::ChannelError {
                        message: e.to_string(),
                    })),
                }
            }
        }
        self.conductor.due(now, &mut self.send, &mut self.notes);
        for note in std::mem::take(&mut self.notes) {
            match note {
                Note::Event(event) => (self.output.events)(now, &event),
                Note::Shell(event) => self.shell_events.push(event),
                Note::Output { node, stream, data } => match node {
                    None => self.output.sink.output(WORKLOAD_LOG, stream, &data)?,
                    Some(name) if self.node_names.contains(&name) => {
                        self.output.sink.output(&name, stream, &data)?
                    }
                    // The name becomes a log file's name: only declared nodes.
                    Some(name) => {
                        (self.output.events)(now, &UpEvent::UnknownNodeOutput { node: name })
                    }
                },
            }
        }
        for message in std::mem::take(&mut self.send) {
            if !self.held {
                send_message(session, &message)?;
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::schedule;

    fn spec(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            rootfs: node_root(name),
            hostname: None,
            nic: None,
            address: None,
            env: BTreeMap::new(),
            command: vec!["sleep".into(), "100".into()],
        }
    }

    fn conductor(workload: Option<WorkloadPlan>, faults: &[&str]) -> Conductor {
        let names = vec!["n1".to_string(), "n2".to_string()];
        let faults: Vec<String> = faults.iter().map(|s| s.to_string()).collect();
        Conductor::new(
            vec![spec("n1"), spec("n2")],
            workload,
            &schedule(&faults, &names).unwrap(),
        )
    }

    /// The workload `true`, inside `node`.
    fn in_node(node: &str) -> WorkloadPlan {
        WorkloadPlan::InNode {
            node: node.into(),
            command: vec!["true".into()],
            env: BTreeMap::new(),
        }
    }

    fn started(name: &str, pid: i32) -> AgentToHost {
        AgentToHost::NodeStarted {
            name: name.into(),
            pid,
        }
    }

    fn feed(c: &mut Conductor, m: AgentToHost) -> Vec<HostToAgent> {
        let mut send = Vec::new();
        let mut notes = Vec::new();
        c.on_message(m, &mut send, &mut notes);
        send
    }

    fn boot(c: &mut Conductor) {
        assert_eq!(
            feed(
                c,
                AgentToHost::Booted {
                    version: PROTOCOL_VERSION
                }
            ),
            vec![HostToAgent::Hello {
                version: PROTOCOL_VERSION
            }]
        );
        assert_eq!(
            feed(
                c,
                AgentToHost::Ready {
                    version: PROTOCOL_VERSION
                }
            ),
            vec![
                HostToAgent::CreateNode(spec("n1")),
                HostToAgent::CreateNode(spec("n2"))
            ]
        );
    }

    #[test]
    fn test_conversation_starts_nodes_then_workload_then_shuts_down() {
        let workload = in_node("n2");
        let mut c = conductor(Some(workload), &[]);
        boot(&mut c);
        assert!(feed(&mut c, started("n2", 3)).is_empty());
        assert_eq!(
            feed(&mut c, started("n1", 2)),
            vec![HostToAgent::StartWorkload {
                node: Some("n2".into()),
                command: vec!["true".into()],
                env: BTreeMap::new()
            }]
        );
        assert_eq!(c.status(), None);
        assert_eq!(
            feed(
                &mut c,
                AgentToHost::WorkloadExited {
                    status: ExitStatus::Signal(9)
                }
            ),
            vec![HostToAgent::Shutdown]
        );
        assert_eq!(c.status(), Some(137));
        // Exits during shutdown change nothing.
        assert!(feed(
            &mut c,
            AgentToHost::Exited {
                node: "n1".into(),
                status: ExitStatus::Signal(9)
            }
        )
        .is_empty());
        assert_eq!(c.status(), Some(137));
    }

    #[test]
    fn test_nothing_is_sent_before_booted_and_setup_errors_end_the_run() {
        let mut c = conductor(None, &[]);
        assert!(feed(&mut c, AgentToHost::Ready { version: 1 }).is_empty());
        boot(&mut c);
        assert_eq!(
            feed(
                &mut c,
                AgentToHost::Error {
                    context: "create_node n2".into(),
                    message: "exec \"sleep\": No such file or directory".into()
                }
            ),
            vec![HostToAgent::Shutdown]
        );
        assert_eq!(c.status(), Some(SETUP_FAILED));
    }

    #[test]
    fn test_a_node_that_ends_before_the_last_starts_still_counts_as_started() {
        let workload = in_node("n2");
        let mut c = conductor(Some(workload), &[]);
        boot(&mut c);
        feed(&mut c, started("n1", 2));
        feed(
            &mut c,
            AgentToHost::Exited {
                node: "n1".into(),
                status: ExitStatus::Code(0),
            },
        );
        let sent = feed(&mut c, started("n2", 3));
        assert!(
            matches!(sent[..], [HostToAgent::StartWorkload { .. }]),
            "{sent:?}"
        );
    }

    #[test]
    fn test_without_a_workload_the_run_ends_when_every_node_has_ended() {
        let mut c = conductor(None, &[]);
        boot(&mut c);
        feed(&mut c, started("n1", 2));
        feed(&mut c, started("n2", 3));
        assert!(feed(
            &mut c,
            AgentToHost::Exited {
                node: "n2".into(),
                status: ExitStatus::Signal(9)
            }
        )
        .is_empty());
        assert_eq!(
            feed(
                &mut c,
                AgentToHost::Exited {
                    node: "n1".into(),
                    status: ExitStatus::Code(0)
                }
            ),
            vec![HostToAgent::Shutdown]
        );
        assert_eq!(c.status(), Some(137));
        // A hostile status does not overflow.
        assert_eq!(ExitStatus::Signal(i32::MAX).shell_code(), i32::MAX);
    }

    #[test]
    fn test_a_workload_that_cannot_start_ends_the_run() {
        let workload = in_node("n1");
        let mut c = conductor(Some(workload), &[]);
        boot(&mut c);
        feed(&mut c, started("n1", 2));
        feed(&mut c, started("n2", 3));
        let error = AgentToHost::Error {
            context: "start_workload".into(),
            message: "node \"n1\" is not running".into(),
        };
        assert_eq!(feed(&mut c, error), vec![HostToAgent::Shutdown]);
        assert_eq!(c.status(), Some(SETUP_FAILED));
    }

    #[test]
    fn test_faults_wait_for_the_nodes_and_go_in_time_order() {
        let mut c = conductor(
            None,
            &[
                "at=1s pause n1 for=2s",
                "at=2s kill n2",
                "at=1s partition n1 | n2",
            ],
        );
        assert_eq!(c.next_fault_time(), Some(VirtNanos(1_000_000_000)));
        let mut send = Vec::new();
        let mut notes = Vec::new();
        // Due, but the nodes are not up yet.
        c.due(VirtNanos(5_000_000_000), &mut send, &mut notes);
        assert!(send.is_empty());
        boot(&mut c);
        feed(&mut c, started("n1", 2));
        feed(&mut c, started("n2", 3));
        c.due(VirtNanos(2_000_000_000), &mut send, &mut notes);
        assert_eq!(
            send,
            vec![
                HostToAgent::Pause { node: "n1".into() },
                HostToAgent::Kill {
                    node: "n2".into(),
                    signal: 9
                }
            ]
        );
        assert_eq!(c.next_fault_time(), Some(VirtNanos(3_000_000_000)));
        send.clear();
        c.due(VirtNanos(3_000_000_000), &mut send, &mut notes);
        assert_eq!(send, vec![HostToAgent::Resume { node: "n1".into() }]);
        assert_eq!(c.next_fault_time(), None);
    }

    #[test]
    fn test_own_node_workload_ends_the_run_when_it_exits() {
        let mut own = spec("workload");
        own.command = vec!["true".into()];
        let plan = WorkloadPlan::OwnNode(NodePlan {
            name: "workload".into(),
            source: RootSource::Rootfs("/r".into()),
            address: "192.0.2.3/24".into(),
            hostname: None,
            command: vec!["true".into()],
            env: BTreeMap::new(),
        });
        let mut c = Conductor::new(vec![spec("n1"), own], Some(plan), &[]);
        feed(
            &mut c,
            AgentToHost::Booted {
                version: PROTOCOL_VERSION,
            },
        );
        feed(
            &mut c,
            AgentToHost::Ready {
                version: PROTOCOL_VERSION,
            },
        );
        assert!(feed(
            &mut c,
            AgentToHost::Exited {
                node: "n1".into(),
                status: ExitStatus::Code(1)
            }
        )
        .is_empty());
        assert_eq!(
            feed(
                &mut c,
                AgentToHost::Exited {
                    node: "workload".into(),
                    status: ExitStatus::Code(3)
                }
            ),
            vec![HostToAgent::Shutdown]
        );
        assert_eq!(c.status(), Some(3));
    }

    #[test]
    fn test_output_sink_prefixes_whole_lines_and_logs_raw_bytes() {
        let dir = std::env::temp_dir().join(format!("detvisor-sink-{}", std::process::id()));
        let shared = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut sink = OutputSink::new(
            &["n1".into()],
            Some(dir.clone()),
            Box::new(Shared(shared.clone())),
        )
        .unwrap();
        sink.output("n1", Stream::Stdout, b"hel").unwrap();
        sink.output("n1", Stream::Stdout, b"lo\nwor").unwrap();
        sink.output("n1", Stream::Stderr, b"oops\n").unwrap();
        sink.flush().unwrap();
        let printed = String::from_utf8(shared.lock().unwrap().clone()).unwrap();
        assert_eq!(
            printed,
            "      n1 | hello\n      n1 | oops\n      n1 | wor\n"
        );
        assert_eq!(
            std::fs::read(dir.join("n1.log")).unwrap(),
            b"hello\nworoops\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn test_up_state_round_trips_and_a_restored_driver_continues_the_frame() {
        let names = vec!["n1".to_string(), "n2".to_string()];
        let mut running = conductor(Some(in_node("n2")), &["at=5s pause n1 for=1s"]);
        boot(&mut running);
        let frame = encode_frame(&started("n1", 7)).unwrap();
        let state = UpState {
            conductor: running,
            agent_frame_bytes: frame[..6].to_vec(),
            node_names: names.clone(),
            network_events: schedule(&["at=3s partition n1 | n2 for=2s".into()], &names).unwrap(),
        };
        let text = serde_json::to_string(&state).unwrap();
        let back: UpState = serde_json::from_str(&text).unwrap();
        assert_eq!(back, state);

        let output = UpOutput::plain(&names, Box::new(std::io::sink()), None).unwrap();
        let mut driver = UpDriver::restore(back, output);
        assert_eq!(driver.save(), state);
        // Reset to another moment and back: each save is that moment.
        let other = UpState {
            conductor: conductor(None, &[]),
            agent_frame_bytes: Vec::new(),
            node_names: names.clone(),
            network_events: Vec::new(),
        };
        driver.reset(&other);
        assert_eq!(driver.save(), other);
        driver.reset(&state);
        assert_eq!(driver.save(), state);
        // The rest of the frame completes the message begun before the save.
        driver.decoder.push(&frame[6..]);
        assert_eq!(
            driver.decoder.next_message::<AgentToHost>().unwrap(),
            Some(started("n1", 7))
        );
        // Unknown fields are refused, as everywhere in saved state.
        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        value["extra"] = serde_json::json!(1);
        assert!(serde_json::from_value::<UpState>(value).is_err());
    }
}
