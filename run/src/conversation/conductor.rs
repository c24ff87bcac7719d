//! The host side of the agent conversation: a pure state machine fed with
//! the agent's messages and the virtual time, answering with the messages
//! to send (hello, create_node, start_workload, faults, shutdown).

use crate::composer::{Action, Composer};
use crate::event::UpEvent;
use crate::faults::{FaultAction, NodeFault};
use crate::manifest::{SetupSignal, WorkloadPlan};
use crate::records::sdk::SdkRecord;
use devices::VirtNanos;
use guest_agent::protocol::{
    AgentToHost, ErrorContext, ExitStatus, HostToAgent, NodeSpec, Stream, PROTOCOL_VERSION,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, VecDeque};

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
    /// Something the guest reported for a caller that judges the run (see
    /// [`crate::records`]).
    Record {
        node: Option<String>,
        body: crate::records::RecordBody,
    },
    /// A crashed node's disk was unmounted: the VMM must stop discarding
    /// its writes before the agent mounts it again (sent with this note).
    EndDiskCrash { node: String },
    /// Output of a test-composer command (`command`: its file name, the
    /// name its output goes under).
    CommandOutput {
        command: String,
        stream: Stream,
        data: Vec<u8>,
    },
    /// Faults stopped for good (a template's terminal command starts): the
    /// switch's partitions must heal and its pending faults be undone.
    StopNetworkFaults,
    /// An answer to an inspection request (`exec`, `read_file`,
    /// `processes`, or an error naming one), for [`crate::inspect`]: never
    /// part of the run's conversation.
    Inspect(AgentToHost),
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
        context: ErrorContext,
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
    /// The agent's faults still to do, in time order.
    faults: VecDeque<(VirtNanos, NodeFault)>,
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
    /// Whether the system under test said its set-up is complete (the
    /// Antithesis SDK's `setup_complete`): faults and test-composer commands
    /// begin there, and a campaign takes its root moment there.
    #[serde(default)]
    setup_complete: bool,
    /// Where the SDKs' random values come from (`sdk-random`; see
    /// [`Conductor::seed_sdk_random`]). `None` in states saved before it
    /// existed: then the stream of seed 0.
    #[serde(default)]
    sdk_random: Option<vmm::entropy::EntropyStreamState>,
    /// The test-composer scheduler, when the workload is a template.
    #[serde(default)]
    composer: Option<Composer>,
    /// Nodes paused by a fault and not resumed yet (resumed when faults stop).
    #[serde(default)]
    paused: BTreeSet<String>,
}

/// The entry of a history line (`{"detvisor_history": ENTRY}`, that key
/// alone); `None` for any other line.
pub fn history_entry(line: &str) -> Option<serde_json::Value> {
    let serde_json::Value::Object(mut object) = serde_json::from_str(line).ok()? else {
        return None;
    };
    if object.len() != 1 {
        return None;
    }
    object.remove("detvisor_history")
}

/// Exit status when the guest could not be set up (a node failed to start).
pub const SETUP_FAILED: i32 = crate::exit_status::NO_STATUS as i32;

impl Conductor {
    /// A conversation with no faults yet (see [`Conductor::add_fault`]).
    pub fn new(nodes: Vec<NodeSpec>, workload: Option<WorkloadPlan>) -> Self {
        let composer = match &workload {
            Some(WorkloadPlan::Template(plan)) => {
                Some(Composer::new(&plan.template, plan.parallel_drivers, 0))
            }
            _ => None,
        };
        Conductor {
            composer,
            paused: BTreeSet::new(),
            nodes,
            workload,
            faults: VecDeque::new(),
            phase: Phase::Booting,
            running: BTreeSet::new(),
            ever_started: BTreeSet::new(),
            first_failure: None,
            status: None,
            setup_complete: false,
            sdk_random: None,
        }
    }

    /// The SDKs' random values come from the run's seed.
    pub fn seed_sdk_random(&mut self, seed: u64) {
        let stream = vmm::entropy::EntropyStream::new(seed, vmm::entropy::stream::SDK_RANDOM);
        self.sdk_random = Some(devices::Persist::save(&stream));
    }

    /// Re-keys the SDKs' random stream at a branch (seed `seed`, exit `exit`).
    pub fn rekey_sdk_random(&mut self, seed: u64, exit: u64) {
        let stream =
            vmm::entropy::EntropyStream::at_branch(seed, exit, vmm::entropy::stream::SDK_RANDOM);
        self.sdk_random = Some(devices::Persist::save(&stream));
    }

    /// The next value of the SDKs' random stream.
    fn next_sdk_random(&mut self) -> u64 {
        let mut stream = match &self.sdk_random {
            Some(state) => vmm::entropy::EntropyStream::from_state(state),
            None => vmm::entropy::EntropyStream::new(0, vmm::entropy::stream::SDK_RANDOM),
        };
        let value = stream.next_u64();
        self.sdk_random = Some(devices::Persist::save(&stream));
        value
    }

    /// Whether the system under test said its set-up is complete.
    pub fn setup_complete(&self) -> bool {
        self.setup_complete
    }

    /// The system under test said its set-up is complete (the first time
    /// counts; later ones are events of no consequence).
    pub fn mark_setup_complete(&mut self, notes: &mut Vec<Note>) {
        if !self.setup_complete {
            self.setup_complete = true;
            notes.push(Note::Event(UpEvent::SetupComplete));
            if let Some(composer) = &mut self.composer {
                composer.set_setup_complete();
            }
        }
    }

    /// Whether faults may happen now. Without a template always; with one,
    /// only while its drivers run: not before the set-up is complete,
    /// during `first_` commands, nor once `eventually_`/`finally_` stopped
    /// them (faults due meanwhile wait, or are dropped once stopped).
    pub fn faults_allowed(&self) -> bool {
        match &self.composer {
            None => true,
            Some(composer) => self.setup_complete && composer.faults_allowed(),
        }
    }

    /// The test-composer scheduler, when the workload is a template.
    pub fn composer(&self) -> Option<&Composer> {
        self.composer.as_ref()
    }

    /// The test composer's draws come from the run's `seed` (set before
    /// the run starts; a plain run draws nothing from it).
    pub fn seed_composer(&mut self, seed: u64) {
        if let Some(composer) = &mut self.composer {
            composer.seed(seed);
        }
    }

    /// Re-keys the test composer's draws at a branch (with `seed` at exit
    /// `exit`, as [`vmm::entropy::branch_key`] keys every stream).
    pub fn rekey_composer(&mut self, seed: u64, exit: u64) {
        if let Some(composer) = &mut self.composer {
            composer.rekey(seed, exit);
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

    /// Adds one of the agent's faults to the schedule (after those at the
    /// same time).
    pub fn add_fault(&mut self, at: VirtNanos, fault: NodeFault) {
        let index = self.faults.partition_point(|&(t, _)| t <= at);
        self.faults.insert(index, (at, fault));
    }

    /// The position of node `node`'s disk among the disks (those of the
    /// nodes that have one, in manifest order), if it has one.
    /// Whether node `node` runs now (paused or not), as the agent reported.
    pub fn is_running(&self, node: &str) -> bool {
        self.running.contains(node)
    }

    /// Whether node `node` was paused (by a fault, or for an inspection)
    /// and not resumed since.
    pub fn is_paused(&self, node: &str) -> bool {
        self.paused.contains(node)
    }

    pub fn disk_index(&self, node: &str) -> Option<usize> {
        self.nodes
            .iter()
            .filter(|n| n.disk.is_some())
            .position(|n| n.name == node)
    }

    /// The node whose disk is disk `index` (see [`Conductor::disk_index`]).
    pub fn disk_node(&self, index: usize) -> Option<&str> {
        self.nodes
            .iter()
            .filter(|n| n.disk.is_some())
            .nth(index)
            .map(|n| n.name.as_str())
    }

    /// The next virtual time at which [`Conductor::due`] has something to do.
    pub fn next_fault_time(&self) -> Option<VirtNanos> {
        if self.phase == Phase::ShuttingDown {
            return None;
        }
        // Faults held back wait for the composer, not for their time.
        let fault = self
            .faults
            .front()
            .map(|&(at, _)| at)
            .filter(|_| self.faults_allowed());
        let composer = self
            .composer
            .as_ref()
            .filter(|_| self.phase == Phase::Running)
            .and_then(Composer::next_wakeup);
        fault.into_iter().chain(composer).min()
    }

    /// One SDK record: kept (parsed), and `setup_complete` noted. A record
    /// that is not a JSON object is an agent error event.
    fn sdk_record(&mut self, node: Option<String>, json: &str, notes: &mut Vec<Note>) {
        let value = match serde_json::from_str::<serde_json::Value>(json) {
            Ok(value) if value.is_object() => value,
            Ok(_) => {
                notes.push(Note::Event(UpEvent::AgentError {
                    context: ErrorContext::Sdk { node },
                    message: format!("an SDK record is not a JSON object: {json:.200}"),
                }));
                return;
            }
            Err(error) => {
                notes.push(Note::Event(UpEvent::AgentError {
                    context: ErrorContext::Sdk { node },
                    message: format!("an SDK record is not JSON ({error}): {json:.200}"),
                }));
                return;
            }
        };
        // A JSON object that is no SDK record is kept all the same: a
        // campaign's judges report it.
        let setup_complete =
            SdkRecord::parse(&value).is_ok_and(|record| record.is_setup_complete());
        notes.push(Note::Record {
            node,
            body: crate::records::RecordBody::Sdk { json: value },
        });
        if setup_complete {
            self.mark_setup_complete(notes);
        }
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
                    self.all_started(send, notes);
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
                    self.all_started(send, notes);
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
                if self
                    .workload
                    .as_ref()
                    .and_then(WorkloadPlan::own_node)
                    .is_some_and(|w| w.name == node)
                {
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
            AgentToHost::Paused { node } => {
                self.paused.insert(node.clone());
                notes.push(Note::Event(UpEvent::NodePaused { node }))
            }
            AgentToHost::Resumed { node } => {
                self.paused.remove(&node);
                notes.push(Note::Event(UpEvent::NodeResumed { node }))
            }
            AgentToHost::TemplateCommands { template, commands } => {
                notes.push(Note::Event(UpEvent::TemplateCommands {
                    template: template.clone(),
                    commands: commands.clone(),
                }));
                if let Some(composer) = &mut self.composer {
                    if let Err(e) = composer.set_commands(&commands) {
                        notes.push(Note::Event(UpEvent::TemplateRefused {
                            template,
                            message: e.to_string(),
                        }));
                        self.finish(SETUP_FAILED, send);
                    }
                }
            }
            AgentToHost::CommandStarted { id, pid } => {
                if let Some(run) = self.composer.as_ref().and_then(|c| c.run(id)) {
                    notes.push(Note::Event(UpEvent::CommandStarted {
                        command: run.command.clone(),
                        kind: run.kind,
                        pid,
                    }));
                }
            }
            AgentToHost::CommandOutput { id, stream, data } => {
                if let Some(run) = self.composer.as_ref().and_then(|c| c.run(id)) {
                    notes.push(Note::CommandOutput {
                        command: run.command.clone(),
                        stream,
                        data,
                    });
                }
            }
            AgentToHost::CommandExited { id, status } => {
                if let Some(run) = self.composer.as_mut().and_then(|c| c.on_exited(id, status)) {
                    notes.push(Note::Event(if run.killed {
                        UpEvent::CommandKilled {
                            command: run.command,
                            kind: run.kind,
                        }
                    } else {
                        UpEvent::CommandExited {
                            command: run.command,
                            kind: run.kind,
                            status,
                        }
                    }));
                }
            }
            AgentToHost::DiskReleased { node } => {
                notes.push(Note::Event(UpEvent::DiskReleased { node: node.clone() }));
                notes.push(Note::EndDiskCrash { node: node.clone() });
                send.push(HostToAgent::MountDisk { node });
            }
            AgentToHost::DiskMounted { node } => {
                notes.push(Note::Event(UpEvent::DiskMounted { node }))
            }
            AgentToHost::DiskFilled { node, bytes } => {
                notes.push(Note::Event(UpEvent::DiskFilled { node, bytes }))
            }
            AgentToHost::DiskFreed { node } => notes.push(Note::Event(UpEvent::DiskFreed { node })),
            AgentToHost::ClockSet {
                node,
                offset_ns,
                rate_ppm,
            } => notes.push(Note::Event(UpEvent::NodeClock {
                node,
                offset_ns,
                rate_ppm,
            })),
            AgentToHost::Sdk { node, json } => self.sdk_record(node, &json, notes),
            AgentToHost::History { node, json } => {
                if let Some(json) = history_entry(&json) {
                    notes.push(Note::Record {
                        node,
                        body: crate::records::RecordBody::History { json },
                    });
                }
            }
            AgentToHost::RandomRequest { id, .. } => {
                let value = self.next_sdk_random();
                send.push(HostToAgent::Random { id, value });
            }
            message @ (AgentToHost::ExecOutput { .. }
            | AgentToHost::ExecExited { .. }
            | AgentToHost::FileChunk { .. }
            | AgentToHost::FileRead { .. }
            | AgentToHost::ProcessRows { .. }
            | AgentToHost::ProcessesListed { .. }
            | AgentToHost::Error {
                context:
                    ErrorContext::Exec { .. }
                    | ErrorContext::ReadFile { .. }
                    | ErrorContext::Processes { .. },
                ..
            }) => notes.push(Note::Inspect(message)),
            AgentToHost::Error {
                context: context @ (ErrorContext::OpenShell | ErrorContext::ShellInput),
                message,
            } => {
                notes.push(Note::Shell(ShellEvent::Failed { context, message }));
            }
            AgentToHost::Error {
                context: ErrorContext::ListTemplate { .. },
                message,
            } => {
                // The template cannot be listed: nothing would ever run.
                let template = self
                    .composer
                    .as_ref()
                    .map(|c| c.template().to_owned())
                    .unwrap_or_default();
                notes.push(Note::Event(UpEvent::TemplateRefused { template, message }));
                self.finish(SETUP_FAILED, send);
            }
            AgentToHost::Error { context, message } => {
                notes.push(Note::Event(UpEvent::AgentError {
                    context: context.clone(),
                    message,
                }));
                // Setting up failed: a node could not be made, or the
                // workload could not start (so nothing would ever end the run).
                let setup = matches!(
                    context,
                    ErrorContext::Hello | ErrorContext::CreateNode { .. } | ErrorContext::Channel
                ) && self.phase != Phase::Running;
                if setup || context == ErrorContext::StartWorkload {
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
        if let Some(composer) = &mut self.composer {
            let mut actions = Vec::new();
            composer.due(now, &mut actions);
            for action in actions {
                self.act(action, send, notes);
            }
        }
        let stopped = self.composer.as_ref().is_some_and(Composer::faults_stopped);
        if !self.faults_allowed() && !stopped {
            // They wait for the drivers (see `faults_allowed`).
            return;
        }
        while self.faults.front().is_some_and(|&(at, _)| at <= now) {
            let (_, fault) = self.faults.pop_front().expect("checked above");
            if stopped {
                // Added after the faults stopped (at a branch): dropped.
                continue;
            }
            notes.push(Note::Event(UpEvent::Fault {
                action: FaultAction::Node(fault.clone()),
            }));
            send.push(fault.into());
        }
    }

    /// Carries out what the test composer asks.
    fn act(&mut self, action: Action, send: &mut Vec<HostToAgent>, notes: &mut Vec<Note>) {
        let Some(WorkloadPlan::Template(plan)) = &self.workload else {
            return;
        };
        match action {
            Action::Start { id, command, .. } => {
                let mut env = self
                    .nodes
                    .iter()
                    .find(|n| n.name == plan.node)
                    .map(|n| n.env.clone())
                    .unwrap_or_default();
                env.extend(plan.env.clone());
                send.push(HostToAgent::StartCommand {
                    id,
                    node: plan.node.clone(),
                    template: plan.template.clone(),
                    command,
                    env,
                });
            }
            Action::Kill { id } => send.push(HostToAgent::KillCommand { id }),
            Action::StopFaults => {
                // Pending node faults go; paused nodes run again; the
                // switch heals (the driver's part).
                self.faults.clear();
                for node in std::mem::take(&mut self.paused) {
                    send.push(HostToAgent::Resume { node });
                }
                notes.push(Note::Event(UpEvent::FaultsStopped));
                notes.push(Note::StopNetworkFaults);
            }
            Action::Finish { status } => self.finish(status, send),
        }
    }

    fn all_started(&mut self, send: &mut Vec<HostToAgent>, notes: &mut Vec<Note>) {
        self.phase = Phase::Running;
        if let Some(WorkloadPlan::Template(plan)) = &self.workload {
            send.push(HostToAgent::ListTemplate {
                node: plan.node.clone(),
                template: plan.template.clone(),
            });
            if plan.setup == SetupSignal::Immediate {
                self.mark_setup_complete(notes);
            }
            return;
        }
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

/// The run's exit status: the workload's; without a workload, 0 when the
/// run reached its time limit (the nodes ran as long as asked).
pub fn run_status(conductor: &Conductor, stop: vmm::exit::StopReason) -> u8 {
    use vmm::exit::StopReason;
    if matches!(stop, StopReason::Stalled { .. }) {
        return crate::exit_status::STALLED;
    }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::conversation::node_root;
    use crate::faults::{parse_faults, schedule};
    use crate::manifest::{NodePlan, RootSource};
    use std::collections::BTreeMap;

    pub(crate) fn spec(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            rootfs: node_root(name),
            hostname: None,
            nic: None,
            address: None,
            env: BTreeMap::new(),
            command: vec!["sleep".into(), "100".into()],
            disk: None,
        }
    }

    pub(crate) fn conductor(workload: Option<WorkloadPlan>, faults: &[&str]) -> Conductor {
        let names = vec!["n1".to_string(), "n2".to_string()];
        let mut c = Conductor::new(vec![spec("n1"), spec("n2")], workload);
        for fault in schedule(&parse_faults(faults).unwrap(), &names).unwrap() {
            let FaultAction::Node(node_fault) = fault.action else {
                panic!("{fault}: the switch's, not the conductor's");
            };
            c.add_fault(fault.at, node_fault);
        }
        c
    }

    /// The workload `true`, inside `node`.
    pub(crate) fn in_node(node: &str) -> WorkloadPlan {
        WorkloadPlan::InNode {
            node: node.into(),
            command: vec!["true".into()],
            env: BTreeMap::new(),
        }
    }

    pub(crate) fn started(name: &str, pid: i32) -> AgentToHost {
        AgentToHost::NodeStarted {
            name: name.into(),
            pid,
        }
    }

    pub(crate) fn feed(c: &mut Conductor, m: AgentToHost) -> Vec<HostToAgent> {
        let mut send = Vec::new();
        let mut notes = Vec::new();
        c.on_message(m, &mut send, &mut notes);
        send
    }

    pub(crate) fn boot(c: &mut Conductor) {
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
    fn test_a_released_disk_ends_the_crash_and_is_mounted_again() {
        let mut with_disk = spec("n2");
        with_disk.disk = Some(guest_agent::protocol::NodeDisk {
            serial: "detvisor-n2".into(),
            mount: "/data".into(),
        });
        let mut c = Conductor::new(vec![spec("n1"), with_disk], None);
        assert_eq!((c.disk_index("n1"), c.disk_index("n2")), (None, Some(0)));
        assert_eq!(c.disk_node(0), Some("n2"));
        let (mut send, mut notes) = (Vec::new(), Vec::new());
        c.on_message(
            AgentToHost::DiskReleased { node: "n2".into() },
            &mut send,
            &mut notes,
        );
        assert_eq!(send, vec![HostToAgent::MountDisk { node: "n2".into() }]);
        assert_eq!(
            notes,
            vec![
                Note::Event(UpEvent::DiskReleased { node: "n2".into() }),
                Note::EndDiskCrash { node: "n2".into() }
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
                    context: ErrorContext::CreateNode { node: "n2".into() },
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
            context: ErrorContext::StartWorkload,
            message: "node \"n1\" is not running".into(),
        };
        assert_eq!(feed(&mut c, error), vec![HostToAgent::Shutdown]);
        assert_eq!(c.status(), Some(SETUP_FAILED));
    }

    #[test]
    fn test_faults_wait_for_the_nodes_and_go_in_time_order() {
        let mut c = conductor(None, &["at=1s pause n1 for=2s", "at=2s kill n2"]);
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
        // Each is announced as it is sent, as users wrote it.
        let announced: Vec<String> = notes
            .iter()
            .filter_map(|note| match note {
                Note::Event(event @ UpEvent::Fault { .. }) => Some(event.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(
            announced,
            [
                "fault: pause n1",
                "fault: kill n2 signal=9",
                "fault: resume n1"
            ]
        );
    }

    #[test]
    fn test_clock_faults_go_to_the_agent_and_its_answer_is_an_event() {
        let mut c = conductor(
            None,
            &["at=1s clock n2 -2s", "at=2s drift n1 +200ppm for=10s"],
        );
        boot(&mut c);
        feed(&mut c, started("n1", 2));
        feed(&mut c, started("n2", 3));
        let mut send = Vec::new();
        let mut notes = Vec::new();
        c.due(VirtNanos(12_000_000_000), &mut send, &mut notes);
        assert_eq!(
            send,
            vec![
                HostToAgent::StepClock {
                    node: "n2".into(),
                    by_ns: -2_000_000_000
                },
                HostToAgent::DriftClock {
                    node: "n1".into(),
                    ppm: 200
                },
                HostToAgent::DriftClock {
                    node: "n1".into(),
                    ppm: 0
                },
            ]
        );
        let mut notes = Vec::new();
        c.on_message(
            AgentToHost::ClockSet {
                node: "n2".into(),
                offset_ns: -2_000_000_000,
                rate_ppm: 0,
            },
            &mut send,
            &mut notes,
        );
        assert!(matches!(
            &notes[..],
            [Note::Event(event)] if event.to_string() == "node n2 clock: realtime offset -2s, drift 0ppm"
        ));
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
            disk: None,
        });
        let mut c = Conductor::new(vec![spec("n1"), own], Some(plan));
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

    fn notes_of(c: &mut Conductor, m: AgentToHost) -> (Vec<HostToAgent>, Vec<Note>) {
        let mut send = Vec::new();
        let mut notes = Vec::new();
        c.on_message(m, &mut send, &mut notes);
        (send, notes)
    }

    #[test]
    fn test_sdk_records_are_kept_and_setup_complete_is_noted_once() {
        let mut c = conductor(None, &[]);
        boot(&mut c);
        let setup = r#"{"antithesis_setup":{"status":"complete","details":{"a":1}}}"#;
        let message = AgentToHost::Sdk {
            node: Some("n1".into()),
            json: setup.into(),
        };
        let (send, notes) = notes_of(&mut c, message.clone());
        assert!(send.is_empty());
        assert_eq!(
            notes,
            vec![
                Note::Record {
                    node: Some("n1".into()),
                    body: crate::records::RecordBody::Sdk {
                        json: serde_json::from_str(setup).unwrap()
                    },
                },
                Note::Event(UpEvent::SetupComplete),
            ]
        );
        assert!(c.setup_complete());
        // A second one is a record, not a second event.
        let (_, notes) = notes_of(&mut c, message);
        assert_eq!(notes.len(), 1);
        // An assertion does not complete anything.
        let mut fresh = conductor(None, &[]);
        let (_, notes) = notes_of(
            &mut fresh,
            AgentToHost::Sdk {
                node: None,
                json: r#"{"antithesis_assert":{"hit":true}}"#.into(),
            },
        );
        assert!(matches!(
            notes.as_slice(),
            [Note::Record { node: None, .. }]
        ));
        assert!(!fresh.setup_complete());
    }

    #[test]
    fn test_a_bad_sdk_record_is_an_agent_error_not_a_record() {
        let mut c = conductor(None, &[]);
        for (json, says) in [("{nope", "is not JSON"), ("[1]", "not a JSON object")] {
            let (_, notes) = notes_of(
                &mut c,
                AgentToHost::Sdk {
                    node: Some("n2".into()),
                    json: json.into(),
                },
            );
            match notes.as_slice() {
                [Note::Event(UpEvent::AgentError { context, message })] => {
                    assert_eq!(
                        context,
                        &ErrorContext::Sdk {
                            node: Some("n2".into())
                        }
                    );
                    assert!(message.contains(says), "{message}");
                }
                other => panic!("{other:?}"),
            }
        }
        // The run goes on.
        assert_eq!(c.status(), None);
    }

    #[test]
    fn test_history_lines_keep_their_entry_and_others_are_ignored() {
        let mut c = conductor(None, &[]);
        let line = r#"{"detvisor_history":{"process":1,"op":2,"type":"invoke","f":"get","key":"k","value":null,"time_ns":3}}"#;
        let (_, notes) = notes_of(
            &mut c,
            AgentToHost::History {
                node: None,
                json: line.into(),
            },
        );
        assert_eq!(
            notes,
            vec![Note::Record {
                node: None,
                body: crate::records::RecordBody::History {
                    json: serde_json::json!({"process":1,"op":2,"type":"invoke","f":"get","key":"k","value":null,"time_ns":3})
                },
            }]
        );
        for other in [
            r#"{"detvisor_history":{},"x":1}"#,
            r#"{"detvisor_history" {}"#,
            r#"{"history":{}}"#,
        ] {
            let (_, notes) = notes_of(
                &mut c,
                AgentToHost::History {
                    node: None,
                    json: other.into(),
                },
            );
            assert!(notes.is_empty(), "{other}");
        }
    }

    #[test]
    fn test_random_requests_are_answered_from_the_seeded_stream_and_rekeyed() {
        let draw = |c: &mut Conductor, id| match feed(
            c,
            AgentToHost::RandomRequest {
                node: Some("n1".into()),
                id,
            },
        )
        .as_slice()
        {
            [HostToAgent::Random { id: got, value }] if *got == id => *value,
            other => panic!("{other:?}"),
        };
        let run = |seed| {
            let mut c = conductor(None, &[]);
            c.seed_sdk_random(seed);
            let first = draw(&mut c, 0);
            // Saved and restored in between: the stream goes on.
            let mut c: Conductor =
                serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
            (first, draw(&mut c, 1), c)
        };
        let (a1, a2, mut a) = run(7);
        let (b1, b2, _) = run(7);
        let (c1, _, _) = run(8);
        assert_eq!((a1, a2), (b1, b2));
        assert_ne!(a1, a2);
        assert_ne!(a1, c1);
        // A branch re-keys it: the same branch twice gives the same values.
        let mut b = a.clone();
        a.rekey_sdk_random(3, 500);
        b.rekey_sdk_random(3, 500);
        assert_eq!(draw(&mut a, 2), draw(&mut b, 2));
        let mut other = a.clone();
        other.rekey_sdk_random(4, 500);
        assert_ne!(draw(&mut a, 3), draw(&mut other, 3));
    }
}
