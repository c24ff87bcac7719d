//! Runs a session as an `up` run: after every exit the agent's output goes
//! to the conductor and its answers back to the agent; network faults are
//! put on the switch and announced as it carries them out.

use super::{Conductor, Note, OutputSink, ShellEvent, UpEvent, UpOutput, WORKLOAD_LOG};
use crate::faults::{FaultAction, TimedFault};
use anyhow::{bail, Context, Result};
use detvisor_agent::protocol::{
    encode_frame, AgentToHost, FrameDecoder, HostToAgent, MAX_FRAME_LEN,
};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Sends `message` to the agent now (at this exit). Outside the conductor's
/// loop only in forks (`detvisor shell`): a recorded run's messages come
/// from the conductor alone.
pub fn send_message(session: &mut vmm::vm::Session, message: &HostToAgent) -> Result<()> {
    let frame = encode_frame(message).context("encoding a message for the agent")?;
    session.send_on_control_channel(&frame)?;
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
        output.sink.drop_partial_lines();
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
                    Err(e) if e.is_fatal() => bail!("the control channel broke: {e}"),
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
    use crate::up::conductor::tests::{boot, conductor, in_node, started};

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
