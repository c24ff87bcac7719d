//! Runs a session as an `up` run: after every exit the agent's output goes
//! to the conductor and its answers back to the agent; network faults are
//! put on the switch and announced as it carries them out, from the
//! switch's own schedule.

use super::OutputError;
use super::{Conductor, Note, OutputSink, ShellEvent, UpOutput, WORKLOAD_LOG};
use crate::event::UpEvent;
use crate::faults::{DiskFault, FaultAction, FaultError, NetworkFault, NodeFault, ScheduledFault};
use crate::records::{GuestRecord, RecordBody, RecordLog};
use devices::switch::Fault as SwitchFault;
use devices::virtio::{DiskCommand, ScheduledDiskCommand};
use devices::{Persist, PortId, RestoreError, Switch, SwitchError, VirtNanos};
use guest_agent::protocol::{
    encode_frame, AgentToHost, FrameDecoder, FrameError, HostToAgent, Stream, MAX_FRAME_LEN,
};
use serde::{Deserialize, Serialize};
use vmm::vm::VmError;

/// Why an `up` run could not take a step, a message or a fault.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error(transparent)]
    Vm(#[from] VmError),
    #[error("encoding a message for the agent")]
    Encode(#[source] FrameError),
    #[error("fault {action} at {at}: that is before the run's present, {now}")]
    BeforePresent {
        action: FaultAction,
        at: VirtNanos,
        now: VirtNanos,
    },
    #[error(transparent)]
    Fault(#[from] FaultError),
    #[error("scheduling the fault {fault}")]
    Schedule {
        fault: NetworkFault,
        #[source]
        source: SwitchError,
    },
    #[error("the switch's fault {fault:?} is on a port of no node")]
    PortOfNoNode { fault: SwitchFault },
    /// The agent's frames cannot be read any further (the error is in the
    /// message: the channel's text, as it always read).
    #[error("the control channel broke: {0}")]
    ChannelBroke(FrameError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    RecordsFull(#[from] crate::records::RecordsFull),
    #[error("fault {action}: node {node} has no disk (give it one: disk = \"64M\")")]
    NoDisk { action: FaultAction, node: String },
    #[error("the disk of node {node}")]
    Disk {
        node: String,
        #[source]
        source: devices::DevicesError,
    },
}

type Result<T, E = DriveError> = std::result::Result<T, E>;

/// Sends `message` to the agent now (at this exit). Outside the conductor's
/// loop only in forks (`detvisor shell`): a recorded run's messages come
/// from the conductor alone.
pub fn send_message(session: &mut vmm::vm::Session, message: &HostToAgent) -> Result<()> {
    let frame = encode_frame(message).map_err(DriveError::Encode)?;
    session.send_on_control_channel(&frame)?;
    Ok(())
}

/// What an `up` run keeps on the host besides the VM, saved with its
/// snapshots: the conversation's state and the agent's unfinished frame.
/// Restored, it continues the very run. (Network faults are the switch's
/// state: see [`UpDriver::step`].)
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpState {
    pub conductor: Conductor,
    /// The start of an agent frame not complete yet.
    pub agent_frame_bytes: Vec<u8>,
    /// The nodes, in manifest order (output goes by these names).
    pub node_names: Vec<String>,
}

/// The switch's faults after `now`, in the order it will apply them: those
/// not announced yet (every one at or before `now` was, see [`UpDriver::step`]).
fn network_faults_after(switch: Option<&Switch>, now: VirtNanos) -> Vec<(VirtNanos, SwitchFault)> {
    let Some(switch) = switch else {
        return Vec::new();
    };
    let mut faults = switch.scheduled_faults();
    faults.retain(|&(at, _)| at > now);
    faults
}

/// Runs a session as an `up` run: after every exit, the agent's output goes
/// to the conductor and its answers to the agent; network faults are
/// announced as the switch carries them out.
pub struct UpDriver {
    conductor: Conductor,
    decoder: FrameDecoder,
    node_names: Vec<String>,
    output: UpOutput,
    send: Vec<HostToAgent>,
    notes: Vec<Note>,
    /// Shell news not taken yet (see [`UpDriver::take_shell_events`]).
    shell_events: Vec<ShellEvent>,
    /// Answers to inspection requests not taken yet (see
    /// [`UpDriver::take_inspect_answers`]).
    inspect_answers: Vec<AgentToHost>,
    /// See [`UpDriver::hold_conductor`]; never part of a recorded run.
    held: bool,
    /// What the guest reported, kept for a caller that judges the run
    /// (`None`: not collected; see [`UpDriver::collect_records`]).
    records: Option<RecordLog>,
    /// The exit the present step handled (for the records of faults).
    exit_now: u64,
    /// Set when the guest reported more records than are held: the step
    /// fails with it.
    records_full: Option<crate::records::RecordsFull>,
}

impl UpDriver {
    /// A run from boot, with `faults` (in time order) scheduled as
    /// [`UpDriver::inject`] does.
    pub fn start(
        session: &mut vmm::vm::Session,
        conductor: Conductor,
        faults: &[ScheduledFault],
        node_names: &[String],
        output: UpOutput,
    ) -> Result<Self> {
        let mut driver = Self::from_state(
            UpState {
                conductor,
                agent_frame_bytes: Vec::new(),
                node_names: node_names.to_vec(),
            },
            output,
        );
        for fault in faults {
            driver.inject(session, fault.clone())?;
        }
        Ok(driver)
    }

    /// Continues a saved run (the session restored from the same snapshot).
    pub fn from_state(state: UpState, output: UpOutput) -> Self {
        let mut decoder = FrameDecoder::new(MAX_FRAME_LEN);
        decoder.push(&state.agent_frame_bytes);
        UpDriver {
            conductor: state.conductor,
            decoder,
            node_names: state.node_names,
            output,
            send: Vec::new(),
            notes: Vec::new(),
            shell_events: Vec::new(),
            inspect_answers: Vec::new(),
            held: false,
            records: None,
            exit_now: 0,
            records_full: None,
        }
    }

    /// Adds `fault` to the run from now on: network faults go to the
    /// switch's schedule, node faults to the conductor's. A fault before
    /// `now`, or naming no node of the run, is refused.
    pub fn inject(&mut self, session: &mut vmm::vm::Session, fault: ScheduledFault) -> Result<()> {
        let now = session.now();
        if fault.at < now {
            return Err(DriveError::BeforePresent {
                action: fault.action,
                at: fault.at,
                now,
            });
        }
        fault.check_nodes(&self.node_names)?;
        let action = fault.action.clone();
        match fault.action {
            FaultAction::Network(network) => {
                let devices = session.devices_mut();
                let ports = devices.nic_ports();
                let on_switch = network
                    .to_switch(&self.node_names, &ports)
                    .map_err(FaultError::from)?;
                let scheduled = devices.schedule_network_fault(fault.at, on_switch);
                if let Err(source) = scheduled {
                    return Err(DriveError::Schedule {
                        fault: network,
                        source,
                    });
                }
                // Due now: announced now, as every fault at or before the
                // present is (see `step`).
                if fault.at <= now {
                    self.announce(fault.at, network);
                }
            }
            FaultAction::Disk(disk) => {
                let index = self.disk_of(&action, disk.node())?;
                self.schedule_disk(session, disk.node(), index, fault.at, disk.to_command())?;
                if fault.at <= now {
                    self.announce_fault(fault.at, FaultAction::Disk(disk));
                }
            }
            FaultAction::Node(node) => {
                match &node {
                    NodeFault::Crash { node: name } => {
                        // The disk (if any) crashes at the exact time; the
                        // agent kills the node at the first exit after it.
                        if let Some(index) = self.conductor.disk_index(name) {
                            self.schedule_disk(session, name, index, fault.at, DiskCommand::Crash)?;
                        }
                    }
                    NodeFault::DiskFull { node: name } | NodeFault::DiskFree { node: name } => {
                        self.disk_of(&action, name)?;
                    }
                    _ => {}
                }
                self.conductor.add_fault(fault.at, node)
            }
        }
        Ok(())
    }

    /// Has the agent mix `bytes` into the guest kernel's entropy pool and
    /// reseed its CRNG, now (at this exit): part of re-keying at a branch.
    pub fn reseed_guest(&mut self, session: &mut vmm::vm::Session, bytes: [u8; 64]) -> Result<()> {
        send_message(
            session,
            &HostToAgent::Reseed {
                bytes: bytes.to_vec(),
            },
        )
    }

    /// Re-keys the SDKs' random stream (part of re-keying at a branch).
    pub fn rekey_sdk_random(&mut self, seed: u64, exit: u64) {
        self.conductor.rekey_sdk_random(seed, exit);
    }

    /// Re-keys the test composer's draws at a branch (host state: nothing
    /// is sent to the guest).
    pub fn rekey_composer(&mut self, seed: u64, exit: u64) {
        self.conductor.rekey_composer(seed, exit);
    }

    /// Faults stopped for good (a template's terminal command starts): the
    /// switch heals now, and each network fault it still holds is healed
    /// at its own time, right after it (the switch has no way to cancel
    /// one). Link latency and loss changes (`slow`, `loss`) stay.
    fn stop_network_faults(&mut self, session: &mut vmm::vm::Session) -> Result<()> {
        let now = session.now();
        let Some(switch) = session.devices_mut().switch() else {
            return Ok(());
        };
        let mut times: Vec<VirtNanos> = switch
            .scheduled_faults()
            .into_iter()
            .map(|(at, _)| at)
            .filter(|&at| at > now)
            .collect();
        times.dedup();
        for at in std::iter::once(now).chain(times) {
            session
                .devices_mut()
                .schedule_network_fault(at, SwitchFault::Heal)
                .map_err(|source| DriveError::Schedule {
                    fault: NetworkFault::Heal,
                    source,
                })?;
        }
        self.announce(now, NetworkFault::Heal);
        Ok(())
    }

    /// The index of node `node`'s disk, or why `action` cannot have it.
    fn disk_of(&self, action: &FaultAction, node: &str) -> Result<usize> {
        self.conductor
            .disk_index(node)
            .ok_or_else(|| DriveError::NoDisk {
                action: action.clone(),
                node: node.to_owned(),
            })
    }

    fn schedule_disk(
        &self,
        session: &mut vmm::vm::Session,
        node: &str,
        index: usize,
        at: VirtNanos,
        command: DiskCommand,
    ) -> Result<()> {
        session
            .devices_mut()
            .schedule_disk(index, at, command)
            .map_err(|source| DriveError::Disk {
                node: node.to_owned(),
                source,
            })
    }

    fn announce_fault(&mut self, at: VirtNanos, action: FaultAction) {
        let event = UpEvent::Fault { action };
        (self.output.events)(at, &event);
        if let Some(log) = &mut self.records {
            // At the fault's own time; the exit is the one after which the
            // host carried it out (or saw the switch do it).
            let pushed = log.push(GuestRecord {
                exit: self.exit_now,
                virtual_ns: at,
                node: None,
                body: RecordBody::Event { event },
            });
            if let Err(full) = pushed {
                self.records_full.get_or_insert(full);
            }
        }
    }

    /// Announces the disks' faults of `pending` due by `now`, at their own
    /// times (a crash is the agent's fault's to announce).
    fn announce_disk_faults(
        &mut self,
        pending: Vec<(usize, ScheduledDiskCommand)>,
        now: VirtNanos,
    ) {
        let mut due: Vec<(VirtNanos, DiskFault)> = pending
            .into_iter()
            .filter(|(_, s)| s.at <= now)
            .filter_map(|(index, s)| {
                let node = self.conductor.disk_node(index)?;
                Some((s.at, DiskFault::from_command(node, &s.command)?))
            })
            .collect();
        // By time, then disk order (a stable sort keeps it).
        due.sort_by_key(|(at, _)| *at);
        for (at, fault) in due {
            self.announce_fault(at, FaultAction::Disk(fault));
        }
    }

    fn announce(&mut self, at: VirtNanos, fault: NetworkFault) {
        self.announce_fault(at, FaultAction::Network(fault));
    }

    /// Announces the switch's faults of `pending` due by `now` (node `i` on
    /// switch port `ports[i]`), at their own times.
    fn announce_network_faults(
        &mut self,
        pending: Vec<(VirtNanos, SwitchFault)>,
        now: VirtNanos,
        ports: &[PortId],
    ) -> Result<()> {
        for (at, fault) in pending.into_iter().take_while(|&(at, _)| at <= now) {
            let network =
                NetworkFault::from_switch(&fault, &self.node_names, ports).ok_or_else(|| {
                    DriveError::PortOfNoNode {
                        fault: fault.clone(),
                    }
                })?;
            self.announce(at, network);
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

    /// Whether the conductor is held (see [`UpDriver::hold_conductor`]).
    pub fn conductor_held(&self) -> bool {
        self.held
    }

    /// The run's nodes, in manifest order.
    pub fn node_names(&self) -> &[String] {
        &self.node_names
    }

    /// The agent's answers to inspection requests since the last call.
    pub fn take_inspect_answers(&mut self) -> Vec<AgentToHost> {
        std::mem::take(&mut self.inspect_answers)
    }

    /// What the agent reported about a fork's shell since the last call.
    pub fn take_shell_events(&mut self) -> Vec<ShellEvent> {
        std::mem::take(&mut self.shell_events)
    }

    /// From now on, keep what the guest reports (events, SDK records,
    /// history lines) until [`UpDriver::take_records`].
    pub fn collect_records(&mut self) {
        self.records.get_or_insert_with(RecordLog::default);
    }

    /// The records kept since the last call (none unless collecting).
    pub fn take_records(&mut self) -> Vec<GuestRecord> {
        self.records
            .as_mut()
            .map(RecordLog::take)
            .unwrap_or_default()
    }

    /// Keeps `body` as reported at this exit (when collecting).
    fn record(&mut self, session: &vmm::vm::Session, node: Option<String>, body: RecordBody) {
        if let Some(log) = &mut self.records {
            let pushed = log.push(GuestRecord {
                exit: session.exits(),
                virtual_ns: session.now(),
                node,
                body,
            });
            if let Err(full) = pushed {
                self.records_full.get_or_insert(full);
            }
        }
    }

    /// Keeps a chunk of `log`'s output (when collecting): a campaign's
    /// findings get the logs of their whole path from it.
    fn record_output(
        &mut self,
        session: &vmm::vm::Session,
        node: Option<String>,
        log: &str,
        stream: Stream,
        data: &[u8],
    ) {
        if self.records.is_some() {
            let text = String::from_utf8_lossy(data).into_owned();
            let body = RecordBody::Output {
                log: log.to_owned(),
                stream,
                text,
            };
            self.record(session, node, body);
        }
    }

    /// Prints the node output still held back (lines without an end).
    pub fn flush(&mut self) -> Result<(), OutputError> {
        self.output.sink.flush()
    }

    /// One exit and the conversation after it (`Some` when the guest stopped).
    ///
    /// Network faults are announced at the first exit at or after their
    /// time, from the switch's schedule: those it holds after the present
    /// before the exit and that are due after it. (The switch applies a
    /// fault lazily, maybe during the exit, so its schedule is read before.)
    /// Between two steps every network fault at or before the present has
    /// been announced, so a restored run announces exactly the rest.
    pub fn step(
        &mut self,
        session: &mut vmm::vm::Session,
    ) -> Result<Option<vmm::exit::StopReason>> {
        let pending = self.before_exit(session);
        if let Some(stop) = session.step_one()? {
            return Ok(Some(stop));
        }
        self.after_exit(session, pending)?;
        Ok(None)
    }

    /// What [`UpDriver::step`] does before the guest runs to its next exit
    /// (a caller that single-steps the guest toward an exit does it too,
    /// and [`UpDriver::after_exit`] once an exit was met).
    pub fn before_exit(&mut self, session: &mut vmm::vm::Session) -> PendingFaults {
        session.set_wakeup(self.conductor.next_fault_time());
        let before = session.now();
        let network = network_faults_after(session.devices_mut().switch(), before);
        let mut disk = session.devices_mut().scheduled_disk_commands();
        // Those at or before the present were announced already.
        disk.retain(|(_, s)| s.at > before);
        PendingFaults { network, disk }
    }

    /// The conversation after a guest exit the session handled.
    pub fn after_exit(
        &mut self,
        session: &mut vmm::vm::Session,
        pending: PendingFaults,
    ) -> Result<()> {
        let PendingFaults {
            network: pending,
            disk: disk_pending,
        } = pending;
        let now = session.now();
        self.exit_now = session.exits();
        if pending.first().is_some_and(|&(at, _)| at <= now) {
            let ports = session.devices_mut().nic_ports();
            self.announce_network_faults(pending, now, &ports)?;
        }
        if disk_pending.iter().any(|(_, s)| s.at <= now) {
            self.announce_disk_faults(disk_pending, now);
        }
        let bytes = session.take_control_output();
        if !bytes.is_empty() {
            self.decoder.push(&bytes);
            loop {
                match self.decoder.next_message::<AgentToHost>() {
                    Ok(Some(message)) => {
                        self.conductor
                            .on_message(message, &mut self.send, &mut self.notes)
                    }
                    Ok(None) => break,
                    Err(e) if e.is_fatal() => return Err(DriveError::ChannelBroke(e)),
                    Err(e) => self.notes.push(Note::Event(UpEvent::ChannelError {
                        message: e.to_string(),
                    })),
                }
            }
        }
        self.conductor.due(now, &mut self.send, &mut self.notes);
        for note in std::mem::take(&mut self.notes) {
            match note {
                Note::Event(event) => {
                    (self.output.events)(now, &event);
                    self.record(session, None, RecordBody::Event { event });
                }
                Note::Record { node, body } => self.record(session, node, body),
                Note::Shell(event) => self.shell_events.push(event),
                Note::Inspect(answer) => self.inspect_answers.push(answer),
                Note::EndDiskCrash { node } => {
                    if let Some(index) = self.conductor.disk_index(&node) {
                        session
                            .devices_mut()
                            .end_disk_crash(index)
                            .map_err(|source| DriveError::Disk { node, source })?;
                    }
                }
                Note::CommandOutput {
                    command,
                    stream,
                    data,
                } => {
                    self.output.sink.output(&command, stream, &data)?;
                    self.record_output(session, None, &command, stream, &data);
                }
                Note::StopNetworkFaults => self.stop_network_faults(session)?,
                Note::Output { node, stream, data } => match node {
                    None => {
                        self.output.sink.output(WORKLOAD_LOG, stream, &data)?;
                        self.record_output(session, None, WORKLOAD_LOG, stream, &data);
                    }
                    Some(name) if self.node_names.contains(&name) => {
                        self.output.sink.output(&name, stream, &data)?;
                        self.record_output(session, Some(name.clone()), &name, stream, &data);
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
        if let Some(full) = self.records_full.take() {
            return Err(full.into());
        }
        Ok(())
    }
}

/// The faults scheduled after the present before an exit, announced once
/// the exit passed them (see [`UpDriver::step`]).
pub struct PendingFaults {
    network: Vec<(VirtNanos, SwitchFault)>,
    disk: Vec<(usize, ScheduledDiskCommand)>,
}

/// The conversation's state and the agent's unfinished frame: saved with
/// the machine, restored in place when the session returns to a moment
/// (where it goes, node output and events, is not part of it).
impl Persist for UpDriver {
    type State = UpState;

    fn save(&self) -> UpState {
        UpState {
            conductor: self.conductor.clone(),
            agent_frame_bytes: self.decoder.buffered().to_vec(),
            node_names: self.node_names.clone(),
        }
    }

    fn validate(&self, state: &UpState) -> Result<(), RestoreError> {
        if state.node_names != self.node_names {
            return Err(RestoreError::Incompatible {
                part: "up run",
                reason: format!(
                    "its nodes are {}, this run's {}",
                    state.node_names.join(", "),
                    self.node_names.join(", ")
                ),
            });
        }
        Ok(())
    }

    fn restore(&mut self, state: &UpState) -> Result<(), RestoreError> {
        self.validate(state)?;
        let mut output = std::mem::replace(
            &mut self.output,
            UpOutput {
                sink: OutputSink::discard(),
                events: Box::new(|_, _| {}),
            },
        );
        // Unfinished lines belong to the history being left.
        output.sink.drop_partial_lines();
        // A caller collecting records goes on collecting (those of the
        // history being left are dropped).
        let collecting = self.records.is_some();
        *self = Self::from_state(state.clone(), output);
        if collecting {
            self.collect_records();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::conductor::tests::{boot, conductor, in_node, started};
    use crate::faults::{parse_faults, schedule};
    use devices::{LatencyDist, NetworkConfig, Persist};
    use std::cell::RefCell;
    use std::rc::Rc;

    fn secs_ms(s: u64, ms: u64) -> VirtNanos {
        VirtNanos(s * 1_000_000_000 + ms * 1_000_000)
    }

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let chain = |e: DriveError| format!("{:#}", anyhow::Error::from(e));
        let e = DriveError::Schedule {
            fault: NetworkFault::Heal,
            source: SwitchError::NotAttached,
        };
        assert_eq!(
            chain(e),
            "scheduling the fault heal: no network switch is attached"
        );
        let e = DriveError::from(OutputError::WriteLog(std::io::Error::other("disk full")));
        assert_eq!(chain(e), "writing a node log: disk full");
    }

    type Announced = Rc<RefCell<Vec<(VirtNanos, String)>>>;

    /// A driver restored from `state` whose events go to the returned list.
    fn restored(state: UpState) -> (UpDriver, Announced) {
        let announced: Announced = Rc::default();
        let seen = Rc::clone(&announced);
        let mut output =
            UpOutput::plain(&state.node_names, Box::new(std::io::sink()), None).unwrap();
        output.events = Box::new(move |at, event| seen.borrow_mut().push((at, event.to_string())));
        (UpDriver::from_state(state, output), announced)
    }

    /// What `step` does about network faults for an exit from `before` to
    /// `now`, the switch applying its faults during the exit (`touch`: it
    /// was asked about the network then, as a frame sent or delivered).
    fn exit(
        driver: &mut UpDriver,
        switch: &mut Switch,
        before: VirtNanos,
        now: VirtNanos,
        touch: bool,
    ) {
        let pending = network_faults_after(Some(switch), before);
        if touch {
            switch.due(now);
        }
        driver
            .announce_network_faults(pending, now, &PORTS)
            .unwrap();
    }

    /// The NICs' switch ports (virtio slots after the rng and the console).
    const PORTS: [PortId; 2] = [PortId(2), PortId(3)];

    #[test]
    fn test_a_restored_driver_announces_a_pending_partition_once_from_the_switch() {
        let names = vec!["n1".to_string(), "n2".to_string()];
        let mut switch = Switch::new(
            [7; 32],
            NetworkConfig::reliable(LatencyDist::Fixed(VirtNanos(1_000))),
        )
        .unwrap();
        for (i, port) in PORTS.iter().enumerate() {
            switch.add_port(*port, [2, 0, 0, 0, 0, i as u8]);
        }
        // What `inject` puts on the switch for `at=3s partition n1 | n2 for=1s`.
        for fault in schedule(
            &parse_faults(&["at=3s partition n1 | n2 for=1s"]).unwrap(),
            &names,
        )
        .unwrap()
        {
            let FaultAction::Network(network) = fault.action else {
                unreachable!()
            };
            switch
                .schedule_fault(fault.at, network.to_switch(&names, &PORTS).unwrap())
                .unwrap();
        }
        let up = UpState {
            conductor: conductor(None, &[]),
            agent_frame_bytes: Vec::new(),
            node_names: names.clone(),
        };
        // The run is snapshotted at 2 s: the switch's saved state alone
        // holds the faults.
        let saved = serde_json::to_string(&switch.save()).unwrap();
        let mut switch = Switch::from_state(&serde_json::from_str(&saved).unwrap());
        let (mut driver, announced) = restored(up.clone());
        let times = [
            secs_ms(2, 0),
            secs_ms(2, 500),
            secs_ms(3, 200),
            secs_ms(3, 700),
            secs_ms(4, 0),
            secs_ms(5, 0),
        ];
        for pair in times.windows(2) {
            // The switch applies the partition during the exit to 3.2 s
            // (and is not asked about the heal at all).
            exit(
                &mut driver,
                &mut switch,
                pair[0],
                pair[1],
                pair[1] == secs_ms(3, 200),
            );
        }
        assert_eq!(
            *announced.borrow(),
            [
                (secs_ms(3, 0), "fault: partition n1 | n2".to_string()),
                (secs_ms(4, 0), "fault: heal".to_string()),
            ]
        );

        // Snapshotted instead at 3.7 s, after the partition was announced
        // but before the switch was asked about the network (both faults
        // are still on its schedule): the partition is not announced again.
        let mut switch = Switch::from_state(&serde_json::from_str(&saved).unwrap());
        assert_eq!(switch.scheduled_faults().len(), 2);
        let (mut driver, announced) = restored(up);
        exit(
            &mut driver,
            &mut switch,
            secs_ms(3, 700),
            secs_ms(3, 900),
            false,
        );
        exit(
            &mut driver,
            &mut switch,
            secs_ms(3, 900),
            secs_ms(4, 100),
            false,
        );
        exit(
            &mut driver,
            &mut switch,
            secs_ms(4, 100),
            secs_ms(6, 0),
            true,
        );
        assert_eq!(
            *announced.borrow(),
            [(secs_ms(4, 0), "fault: heal".to_string())]
        );
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
        };
        let text = serde_json::to_string(&state).unwrap();
        let back: UpState = serde_json::from_str(&text).unwrap();
        assert_eq!(back, state);

        let output = UpOutput::plain(&names, Box::new(std::io::sink()), None).unwrap();
        let mut driver = UpDriver::from_state(back, output);
        assert_eq!(driver.save(), state);
        // Reset to another moment and back: each save is that moment.
        let other = UpState {
            conductor: conductor(None, &[]),
            agent_frame_bytes: Vec::new(),
            node_names: names.clone(),
        };
        driver.restore(&other).unwrap();
        assert_eq!(driver.save(), other);
        driver.restore(&state).unwrap();
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

    /// A caller collecting records (a campaign) goes on collecting after a
    /// return to a checkpoint; what was collected on the path left is gone.
    #[test]
    fn test_a_restored_driver_keeps_collecting_records() {
        let names = vec!["n1".to_string(), "n2".to_string()];
        let state = UpState {
            conductor: conductor(None, &[]),
            agent_frame_bytes: Vec::new(),
            node_names: names.clone(),
        };
        let output = UpOutput::plain(&names, Box::new(std::io::sink()), None).unwrap();
        let mut driver = UpDriver::from_state(state.clone(), output);
        driver.collect_records();
        driver.announce_fault(
            VirtNanos(5),
            FaultAction::Node(NodeFault::Pause { node: "n1".into() }),
        );
        driver.restore(&state).unwrap();
        assert!(driver.take_records().is_empty(), "the path left is dropped");
        driver.announce_fault(
            VirtNanos(6),
            FaultAction::Node(NodeFault::Pause { node: "n2".into() }),
        );
        let records = driver.take_records();
        assert_eq!(records.len(), 1, "still collecting after the restore");
        assert_eq!(records[0].virtual_ns, VirtNanos(6));
    }

    /// A driver of the two-node run at the state `conductor` is in.
    fn driver_at(conductor: Conductor) -> UpDriver {
        let names = vec!["n1".to_string(), "n2".to_string()];
        let state = UpState {
            conductor,
            agent_frame_bytes: Vec::new(),
            node_names: names.clone(),
        };
        let output = UpOutput::plain(&names, Box::new(std::io::sink()), None).unwrap();
        UpDriver::from_state(state, output)
    }

    fn booted() -> Conductor {
        let mut c = conductor(Some(in_node("n2")), &["at=5s pause n1 for=1s"]);
        boot(&mut c);
        c
    }

    devices::persist_round_trip_tests! {
        mod driver_persist {
            fresh: driver_at(conductor(None, &[])),
            saved: driver_at(booted()),
            mutate: |driver: &mut UpDriver| driver.decoder.push(b"\x00\x00"),
        }
    }

    #[test]
    fn test_a_state_of_other_nodes_is_refused_and_changes_nothing() {
        let mut driver = driver_at(booted());
        let before = driver.save();
        let mut other = before.clone();
        other.node_names = vec!["a".into(), "b".into()];
        let error = driver.restore(&other).unwrap_err();
        assert!(error.to_string().contains("its nodes are a, b"), "{error}");
        assert_eq!(driver.save(), before);
    }
}
