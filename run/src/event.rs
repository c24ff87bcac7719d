//! What happens in an `up` run that users are told about (a node started, a
//! fault, the workload exited...): one typed event, printed in one place.

use crate::composer::CommandKind;
use crate::faults::FaultAction;
use guest_agent::protocol::{ErrorContext, ExitStatus};
use serde::{Deserialize, Serialize};

/// One event of an `up` run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "event")]
pub enum UpEvent {
    NodeStarted {
        node: String,
        pid: i32,
    },
    /// The workload was started inside `node` (`None`: on its own).
    WorkloadStarted {
        node: Option<String>,
    },
    NodeExited {
        node: String,
        status: ExitStatus,
    },
    WorkloadExited {
        status: ExitStatus,
    },
    NodePaused {
        node: String,
    },
    NodeResumed {
        node: String,
    },
    /// After a crash: the node is gone and its file system unmounted
    /// (writes reach the disk again from here on).
    DiskReleased {
        node: String,
    },
    /// The node may mount its disk again (it does at its next start, and
    /// ext4's journal recovery runs then).
    DiskMounted {
        node: String,
    },
    /// The node's disk's free space was filled (`bytes` in the filler file).
    DiskFilled {
        node: String,
        bytes: u64,
    },
    DiskFreed {
        node: String,
    },
    /// A node's realtime clock now: its offset from the guest's and its drift.
    NodeClock {
        node: String,
        offset_ns: i64,
        rate_ppm: i32,
    },
    /// A fault was carried out (by the switch or the agent).
    Fault {
        action: FaultAction,
    },
    /// The agent reported an error.
    AgentError {
        context: ErrorContext,
        message: String,
    },
    /// The agent said `booted` a second time.
    AgentBootedTwice,
    /// The system under test said its set-up is complete (faults and
    /// test-composer commands begin here).
    SetupComplete,
    /// The agent speaks another protocol version.
    ProtocolMismatch {
        agent: u32,
        host: u32,
    },
    /// A frame on the control channel could not be read.
    ChannelError {
        message: String,
    },
    /// Output for a node the manifest does not declare, dropped.
    UnknownNodeOutput {
        node: String,
    },
    /// The test-composer template's commands, as listed in its directory
    /// (sorted, `helper_` files left out).
    TemplateCommands {
        template: String,
        commands: Vec<String>,
    },
    /// The template cannot run (no driver, or it could not be listed).
    TemplateRefused {
        template: String,
        message: String,
    },
    /// A template command started (`command`: its file name).
    CommandStarted {
        command: String,
        kind: CommandKind,
        pid: i32,
    },
    /// A template command ended by itself: a nonzero status is a failure,
    /// a zero one counts for "every command exits 0 at least once".
    CommandExited {
        command: String,
        kind: CommandKind,
        status: ExitStatus,
    },
    /// A template command was killed by the composer (when `eventually_`
    /// starts): no verdict on it.
    CommandKilled {
        command: String,
        kind: CommandKind,
    },
    /// Faults stop for good (the terminal command is about to run):
    /// pending node faults dropped, paused nodes resumed, the network healed.
    FaultsStopped,
}

impl UpEvent {
    /// Whether the workload starts here: it was started inside a node, or
    /// its own node (named [`crate::manifest::WORKLOAD_NODE`]) started.
    pub fn is_workload_start(&self) -> bool {
        match self {
            UpEvent::WorkloadStarted { .. } => true,
            UpEvent::NodeStarted { node, .. } => node == crate::manifest::WORKLOAD_NODE,
            UpEvent::CommandStarted { .. } => true,
            _ => false,
        }
    }
}

fn describe(status: &ExitStatus) -> String {
    match status {
        ExitStatus::Code(code) => format!("status {code}"),
        ExitStatus::Signal(signal) => format!("signal {signal}"),
    }
}

impl std::fmt::Display for UpEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpEvent::NodeStarted { node, pid } => write!(f, "node {node} started (pid {pid})"),
            UpEvent::WorkloadStarted { node: Some(node) } => {
                write!(f, "workload started in node {node}")
            }
            UpEvent::WorkloadStarted { node: None } => write!(f, "workload started"),
            UpEvent::NodeExited { node, status } => {
                write!(f, "node {node} exited ({})", describe(status))
            }
            UpEvent::WorkloadExited { status } => {
                write!(f, "workload exited ({})", describe(status))
            }
            UpEvent::NodePaused { node } => write!(f, "node {node} paused"),
            UpEvent::NodeResumed { node } => write!(f, "node {node} resumed"),
            UpEvent::DiskReleased { node } => {
                write!(f, "disk {node} released (node gone, file system unmounted)")
            }
            UpEvent::DiskMounted { node } => {
                write!(f, "disk {node} ready (mounted at the node's next start)")
            }
            UpEvent::DiskFilled { node, bytes } => {
                write!(f, "disk {node} full ({bytes} bytes filled)")
            }
            UpEvent::DiskFreed { node } => write!(f, "disk {node} freed"),
            UpEvent::NodeClock {
                node,
                offset_ns,
                rate_ppm,
            } => write!(
                f,
                "node {node} clock: realtime offset {}, drift {}",
                crate::units::step_text(*offset_ns),
                crate::units::ppm_text(*rate_ppm)
            ),
            UpEvent::Fault { action } => write!(f, "fault: {action}"),
            UpEvent::AgentError { context, message } => write!(f, "agent: {context}: {message}"),
            UpEvent::AgentBootedTwice => write!(f, "agent: booted twice"),
            UpEvent::SetupComplete => write!(f, "setup complete"),
            UpEvent::ProtocolMismatch { agent, host } => {
                write!(f, "agent speaks protocol {agent}, this detvisor {host}")
            }
            UpEvent::ChannelError { message } => write!(f, "control channel: {message}"),
            UpEvent::UnknownNodeOutput { node } => {
                write!(f, "agent: output for unknown node {node:?} dropped")
            }
            UpEvent::TemplateCommands { template, commands } => {
                write!(f, "template {template}: {}", commands.join(" "))
            }
            UpEvent::TemplateRefused { template, message } => {
                write!(f, "template {template} refused: {message}")
            }
            UpEvent::CommandStarted { command, kind, pid } => {
                write!(f, "command {command} ({kind}) started (pid {pid})")
            }
            UpEvent::CommandExited {
                command,
                kind,
                status,
            } => write!(
                f,
                "command {command} ({kind}) exited ({})",
                describe(status)
            ),
            UpEvent::CommandKilled { command, kind } => {
                write!(f, "command {command} ({kind}) killed")
            }
            UpEvent::FaultsStopped => write!(f, "faults stopped"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_events_print_as_before_and_round_trip() {
        let cases = [
            (
                UpEvent::NodeStarted {
                    node: "n1".into(),
                    pid: 12,
                },
                "node n1 started (pid 12)",
            ),
            (
                UpEvent::WorkloadStarted {
                    node: Some("n2".into()),
                },
                "workload started in node n2",
            ),
            (
                UpEvent::NodeExited {
                    node: "n3".into(),
                    status: ExitStatus::Signal(9),
                },
                "node n3 exited (signal 9)",
            ),
            (
                UpEvent::Fault {
                    action: "pause n2".parse().unwrap(),
                },
                "fault: pause n2",
            ),
            (
                UpEvent::NodeClock {
                    node: "n2".into(),
                    offset_ns: -1_500_000_000,
                    rate_ppm: 200,
                },
                "node n2 clock: realtime offset -1.5s, drift +200ppm",
            ),
            (
                UpEvent::Fault {
                    action: "drift n2 -50ppm".parse().unwrap(),
                },
                "fault: drift n2 -50ppm",
            ),
            (
                UpEvent::CommandStarted {
                    command: "parallel_driver_a.sh".into(),
                    kind: CommandKind::ParallelDriver,
                    pid: 40,
                },
                "command parallel_driver_a.sh (parallel_driver) started (pid 40)",
            ),
            (
                UpEvent::CommandExited {
                    command: "first_init.sh".into(),
                    kind: CommandKind::First,
                    status: ExitStatus::Code(1),
                },
                "command first_init.sh (first) exited (status 1)",
            ),
            (
                UpEvent::CommandKilled {
                    command: "anytime_c.sh".into(),
                    kind: CommandKind::Anytime,
                },
                "command anytime_c.sh (anytime) killed",
            ),
            (
                UpEvent::TemplateCommands {
                    template: "t".into(),
                    commands: vec!["first_a".into(), "anytime_b".into()],
                },
                "template t: first_a anytime_b",
            ),
            (UpEvent::FaultsStopped, "faults stopped"),
        ];
        for (event, text) in cases {
            assert_eq!(event.to_string(), text);
            let json = serde_json::to_string(&event).unwrap();
            assert_eq!(serde_json::from_str::<UpEvent>(&json).unwrap(), event);
        }
    }

    /// An agent error is kept in a campaign's records: its JSON is what
    /// it was when the context was text.
    #[test]
    fn test_an_agent_error_prints_and_serializes_its_context_as_text() {
        let event = UpEvent::AgentError {
            context: ErrorContext::Sdk {
                node: Some("n2".into()),
            },
            message: "an SDK record is not a JSON object: [1]".into(),
        };
        assert_eq!(
            event.to_string(),
            "agent: sdk n2: an SDK record is not a JSON object: [1]"
        );
        let json = r#"{"event":"agent_error","context":"sdk n2","message":"an SDK record is not a JSON object: [1]"}"#;
        assert_eq!(serde_json::to_string(&event).unwrap(), json);
        assert_eq!(serde_json::from_str::<UpEvent>(json).unwrap(), event);
    }

    #[test]
    fn test_workload_start_is_typed() {
        assert!(UpEvent::WorkloadStarted { node: None }.is_workload_start());
        assert!(UpEvent::NodeStarted {
            node: crate::manifest::WORKLOAD_NODE.into(),
            pid: 1
        }
        .is_workload_start());
        assert!(!UpEvent::NodeStarted {
            node: "n1".into(),
            pid: 1
        }
        .is_workload_start());
    }
}
