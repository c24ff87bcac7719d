//! What an [`AgentToHost::Error`](super::AgentToHost::Error) is about: the
//! request that failed, or the part of the agent that went wrong. On the
//! wire it is one string, `WHAT` or `WHAT SUBJECT` (`hello`,
//! `create_node n1`, `sdk n2`, `kill_command 3`), printed and parsed here
//! only; the host decides a run's fate by its variant.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// What an agent error is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ErrorContext {
    Hello,
    CreateNode {
        node: String,
    },
    StartWorkload,
    Pause {
        node: String,
    },
    Resume {
        node: String,
    },
    Kill {
        node: String,
    },
    /// A `restart` request, or the restart of a node after its exit.
    Restart {
        node: String,
    },
    Crash {
        node: String,
    },
    MountDisk {
        node: String,
    },
    FillDisk {
        node: String,
    },
    FreeDisk {
        node: String,
    },
    StepClock {
        node: String,
    },
    DriftClock {
        node: String,
    },
    Shutdown,
    OpenShell,
    /// A `shell_input` request, or writing its bytes to the terminal later.
    ShellInput,
    Reseed,
    Random {
        id: u64,
    },
    ListTemplate {
        template: String,
    },
    StartCommand {
        command: String,
    },
    KillCommand {
        id: u32,
    },
    /// An `exec` request (its command could not start, or a bad request).
    Exec {
        id: u64,
    },
    ReadFile {
        id: u64,
    },
    Processes {
        id: u64,
    },
    /// An SDK client of node `node` (`None`: of the root namespaces'
    /// socket) misbehaved, or the record it wrote is not a JSON object.
    Sdk {
        node: Option<String>,
    },
    /// Reading a process's output.
    Output,
    /// The control channel: a frame the agent could not decode.
    Channel,
    /// A message the agent could not encode.
    Encode,
}

impl ErrorContext {
    /// The first word, and what follows it (if anything).
    fn parts(&self) -> (&'static str, Option<String>) {
        let named = |what, subject: &String| (what, Some(subject.clone()));
        match self {
            ErrorContext::Hello => ("hello", None),
            ErrorContext::CreateNode { node } => named("create_node", node),
            ErrorContext::StartWorkload => ("start_workload", None),
            ErrorContext::Pause { node } => named("pause", node),
            ErrorContext::Resume { node } => named("resume", node),
            ErrorContext::Kill { node } => named("kill", node),
            ErrorContext::Restart { node } => named("restart", node),
            ErrorContext::Crash { node } => named("crash", node),
            ErrorContext::MountDisk { node } => named("mount_disk", node),
            ErrorContext::FillDisk { node } => named("fill_disk", node),
            ErrorContext::FreeDisk { node } => named("free_disk", node),
            ErrorContext::StepClock { node } => named("step_clock", node),
            ErrorContext::DriftClock { node } => named("drift_clock", node),
            ErrorContext::Shutdown => ("shutdown", None),
            ErrorContext::OpenShell => ("open_shell", None),
            ErrorContext::ShellInput => ("shell_input", None),
            ErrorContext::Reseed => ("reseed", None),
            ErrorContext::Random { id } => ("random", Some(id.to_string())),
            ErrorContext::ListTemplate { template } => named("list_template", template),
            ErrorContext::StartCommand { command } => named("start_command", command),
            ErrorContext::KillCommand { id } => ("kill_command", Some(id.to_string())),
            ErrorContext::Exec { id } => ("exec", Some(id.to_string())),
            ErrorContext::ReadFile { id } => ("read_file", Some(id.to_string())),
            ErrorContext::Processes { id } => ("processes", Some(id.to_string())),
            ErrorContext::Sdk { node } => ("sdk", node.clone()),
            ErrorContext::Output => ("output", None),
            ErrorContext::Channel => ("channel", None),
            ErrorContext::Encode => ("encode", None),
        }
    }
}

impl fmt::Display for ErrorContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.parts() {
            (what, None) => f.write_str(what),
            (what, Some(subject)) => write!(f, "{what} {subject}"),
        }
    }
}

/// A text that names no error context.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not an agent error context: {0:?}")]
pub struct UnknownErrorContext(pub String);

impl FromStr for ErrorContext {
    type Err = UnknownErrorContext;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let unknown = || UnknownErrorContext(text.to_owned());
        let (what, subject) = match text.split_once(' ') {
            Some((what, subject)) => (what, Some(subject.to_owned())),
            None => (text, None),
        };
        let named = || subject.clone().ok_or_else(unknown);
        let request_id = || -> Result<u64, UnknownErrorContext> {
            subject
                .as_deref()
                .and_then(|id| id.parse().ok())
                .ok_or_else(unknown)
        };
        let alone = |context: ErrorContext| match subject {
            None => Ok(context),
            Some(_) => Err(unknown()),
        };
        match what {
            "hello" => alone(ErrorContext::Hello),
            "create_node" => Ok(ErrorContext::CreateNode { node: named()? }),
            "start_workload" => alone(ErrorContext::StartWorkload),
            "pause" => Ok(ErrorContext::Pause { node: named()? }),
            "resume" => Ok(ErrorContext::Resume { node: named()? }),
            "kill" => Ok(ErrorContext::Kill { node: named()? }),
            "restart" => Ok(ErrorContext::Restart { node: named()? }),
            "crash" => Ok(ErrorContext::Crash { node: named()? }),
            "mount_disk" => Ok(ErrorContext::MountDisk { node: named()? }),
            "fill_disk" => Ok(ErrorContext::FillDisk { node: named()? }),
            "free_disk" => Ok(ErrorContext::FreeDisk { node: named()? }),
            "step_clock" => Ok(ErrorContext::StepClock { node: named()? }),
            "drift_clock" => Ok(ErrorContext::DriftClock { node: named()? }),
            "shutdown" => alone(ErrorContext::Shutdown),
            "open_shell" => alone(ErrorContext::OpenShell),
            "shell_input" => alone(ErrorContext::ShellInput),
            "reseed" => alone(ErrorContext::Reseed),
            "random" => subject
                .as_deref()
                .and_then(|id| id.parse().ok())
                .map(|id| ErrorContext::Random { id })
                .ok_or_else(unknown),
            "list_template" => Ok(ErrorContext::ListTemplate { template: named()? }),
            "start_command" => Ok(ErrorContext::StartCommand { command: named()? }),
            "kill_command" => subject
                .as_deref()
                .and_then(|id| id.parse().ok())
                .map(|id| ErrorContext::KillCommand { id })
                .ok_or_else(unknown),
            "exec" => request_id().map(|id| ErrorContext::Exec { id }),
            "read_file" => request_id().map(|id| ErrorContext::ReadFile { id }),
            "processes" => request_id().map(|id| ErrorContext::Processes { id }),
            "sdk" => Ok(ErrorContext::Sdk { node: subject }),
            "output" => alone(ErrorContext::Output),
            "channel" => alone(ErrorContext::Channel),
            "encode" => alone(ErrorContext::Encode),
            _ => Err(unknown()),
        }
    }
}

impl Serialize for ErrorContext {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ErrorContext {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every context, with the text the agent has always sent for it.
    fn every_context() -> Vec<(ErrorContext, &'static str)> {
        let node = || "n1".to_string();
        vec![
            (ErrorContext::Hello, "hello"),
            (ErrorContext::CreateNode { node: node() }, "create_node n1"),
            (ErrorContext::StartWorkload, "start_workload"),
            (ErrorContext::Pause { node: node() }, "pause n1"),
            (ErrorContext::Resume { node: node() }, "resume n1"),
            (ErrorContext::Kill { node: node() }, "kill n1"),
            (ErrorContext::Restart { node: node() }, "restart n1"),
            (ErrorContext::Crash { node: node() }, "crash n1"),
            (ErrorContext::MountDisk { node: node() }, "mount_disk n1"),
            (ErrorContext::FillDisk { node: node() }, "fill_disk n1"),
            (ErrorContext::FreeDisk { node: node() }, "free_disk n1"),
            (ErrorContext::StepClock { node: node() }, "step_clock n1"),
            (ErrorContext::DriftClock { node: node() }, "drift_clock n1"),
            (ErrorContext::Shutdown, "shutdown"),
            (ErrorContext::OpenShell, "open_shell"),
            (ErrorContext::ShellInput, "shell_input"),
            (ErrorContext::Reseed, "reseed"),
            (
                ErrorContext::Random { id: u64::MAX },
                "random 18446744073709551615",
            ),
            (
                ErrorContext::ListTemplate {
                    template: "main".into(),
                },
                "list_template main",
            ),
            (
                ErrorContext::StartCommand {
                    command: "parallel_driver a.sh".into(),
                },
                "start_command parallel_driver a.sh",
            ),
            (ErrorContext::KillCommand { id: 3 }, "kill_command 3"),
            (ErrorContext::Exec { id: 7 }, "exec 7"),
            (ErrorContext::ReadFile { id: 8 }, "read_file 8"),
            (ErrorContext::Processes { id: 9 }, "processes 9"),
            (ErrorContext::Sdk { node: Some(node()) }, "sdk n1"),
            (ErrorContext::Sdk { node: None }, "sdk"),
            (ErrorContext::Output, "output"),
            (ErrorContext::Channel, "channel"),
            (ErrorContext::Encode, "encode"),
        ]
    }

    #[test]
    fn test_every_context_round_trips_through_its_wire_text() {
        for (context, text) in every_context() {
            assert_eq!(context.to_string(), text);
            assert_eq!(text.parse::<ErrorContext>(), Ok(context.clone()));
            let json = serde_json::to_string(&context).unwrap();
            assert_eq!(json, serde_json::to_string(text).unwrap());
            assert_eq!(
                serde_json::from_str::<ErrorContext>(&json).unwrap(),
                context
            );
        }
    }
}
