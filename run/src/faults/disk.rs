//! The disk faults the VMM carries out on a node's virtio-blk disk, at
//! their exact virtual times (the disk's own schedule, saved in its device
//! state): how its FLUSH requests complete.
//!
//! ```text
//! at=<time> disk <node> fsync-delay=<duration> [for=<duration>]   FLUSH completes that much later
//! at=<time> disk <node> fsync-error [for=<duration>]              FLUSH fails (EIO for fsync)
//! at=<time> disk <node> fsync-ok                                  FLUSH normal again (for='s undo)
//! at=<time> disk <node> full [for=<duration>]                     the agent fills the file system
//! at=<time> disk <node> free                                      the agent removes its filler
//! at=<time> crash <node>                                          kill -9, unflushed writes lost
//! ```
//!
//! `full`/`free` and `crash` are the agent's ([`NodeFault`]); `crash` also
//! crashes the disk at its exact time (see `UpDriver::inject`).

use super::{ActionError, FaultAction, NodeFault};
use devices::virtio::{DiskCommand, FlushMode};
use devices::VirtNanos;
use std::fmt;

/// A change of how a node's disk completes FLUSH requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiskFault {
    FsyncDelay { node: String, delay: VirtNanos },
    FsyncError { node: String },
    FsyncOk { node: String },
}

impl DiskFault {
    pub fn node(&self) -> &str {
        match self {
            DiskFault::FsyncDelay { node, .. }
            | DiskFault::FsyncError { node }
            | DiskFault::FsyncOk { node } => node,
        }
    }

    /// The disk's command that carries the fault out.
    pub fn to_command(&self) -> DiskCommand {
        DiskCommand::SetFlush(match self {
            DiskFault::FsyncDelay { delay, .. } => FlushMode::Delay { delay: *delay },
            DiskFault::FsyncError { .. } => FlushMode::Error,
            DiskFault::FsyncOk { .. } => FlushMode::Normal,
        })
    }

    /// The inverse of [`DiskFault::to_command`] for node `node`'s disk
    /// (`None`: a crash, which is the agent's fault's to announce).
    pub fn from_command(node: &str, command: &DiskCommand) -> Option<DiskFault> {
        let node = node.to_owned();
        match command {
            DiskCommand::SetFlush(FlushMode::Delay { delay }) => Some(DiskFault::FsyncDelay {
                node,
                delay: *delay,
            }),
            DiskCommand::SetFlush(FlushMode::Error) => Some(DiskFault::FsyncError { node }),
            DiskCommand::SetFlush(FlushMode::Normal) => Some(DiskFault::FsyncOk { node }),
            DiskCommand::Crash => None,
        }
    }

    /// What `for=` schedules after this fault.
    pub(super) fn undo(&self) -> Option<DiskFault> {
        match self {
            DiskFault::FsyncDelay { node, .. } | DiskFault::FsyncError { node } => {
                Some(DiskFault::FsyncOk { node: node.clone() })
            }
            DiskFault::FsyncOk { .. } => None,
        }
    }
}

impl fmt::Display for DiskFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskFault::FsyncDelay { node, delay } => {
                write!(f, "disk {node} fsync-delay={delay}")
            }
            DiskFault::FsyncError { node } => write!(f, "disk {node} fsync-error"),
            DiskFault::FsyncOk { node } => write!(f, "disk {node} fsync-ok"),
        }
    }
}

/// Why the words after `disk` are not a disk fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiskActionError {
    #[error("write disk <node> followed by one of fsync-delay=<duration>, fsync-error, fsync-ok, full, free")]
    Shape,
    #[error("fsync-delay=")]
    Delay(#[source] devices::DurationError),
    #[error(
        "unknown disk fault {kind:?} (fsync-delay=<duration>, fsync-error, fsync-ok, full, free)"
    )]
    Kind { kind: String },
}

/// The action of `disk <args>`.
pub(super) fn parse_disk(args: &[&str]) -> Result<FaultAction, ActionError> {
    let [node, kind] = args else {
        return Err(DiskActionError::Shape.into());
    };
    let node = (*node).to_owned();
    Ok(match kind.split_once('=') {
        Some(("fsync-delay", value)) => {
            let delay = crate::units::parse_duration(value).map_err(DiskActionError::Delay)?;
            FaultAction::Disk(DiskFault::FsyncDelay { node, delay })
        }
        Some(_) => {
            return Err(DiskActionError::Kind {
                kind: (*kind).to_owned(),
            }
            .into())
        }
        None => match *kind {
            "fsync-error" => FaultAction::Disk(DiskFault::FsyncError { node }),
            "fsync-ok" => FaultAction::Disk(DiskFault::FsyncOk { node }),
            "full" => FaultAction::Node(NodeFault::DiskFull { node }),
            "free" => FaultAction::Node(NodeFault::DiskFree { node }),
            other => {
                return Err(DiskActionError::Kind {
                    kind: other.to_owned(),
                }
                .into())
            }
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse_fault;
    use super::super::ScheduledFault;
    use super::*;

    #[test]
    fn test_disk_faults_parse_print_and_expand_for() {
        // Arrange / Act
        let delay = parse_fault("at=1s disk n1 fsync-delay=500ms for=10s").unwrap();
        let error = parse_fault("at=2s disk n1 fsync-error for=5s").unwrap();
        let full = parse_fault("at=3s disk n2 full for=1s").unwrap();
        let crash = parse_fault("at=4s crash n1").unwrap();

        // Assert
        let texts =
            |faults: &[ScheduledFault]| faults.iter().map(|f| f.to_string()).collect::<Vec<_>>();
        assert_eq!(
            texts(&delay),
            ["at=1s disk n1 fsync-delay=500ms", "at=11s disk n1 fsync-ok"]
        );
        assert_eq!(
            texts(&error),
            ["at=2s disk n1 fsync-error", "at=7s disk n1 fsync-ok"]
        );
        assert_eq!(texts(&full), ["at=3s disk n2 full", "at=4s disk n2 free"]);
        assert_eq!(texts(&crash), ["at=4s crash n1"]);
        assert_eq!(
            delay[0].action,
            FaultAction::Disk(DiskFault::FsyncDelay {
                node: "n1".into(),
                delay: VirtNanos(500_000_000)
            })
        );
    }

    #[test]
    fn test_disk_fault_commands_round_trip() {
        for fault in [
            DiskFault::FsyncDelay {
                node: "n1".into(),
                delay: VirtNanos(7),
            },
            DiskFault::FsyncError { node: "n1".into() },
            DiskFault::FsyncOk { node: "n1".into() },
        ] {
            assert_eq!(
                DiskFault::from_command("n1", &fault.to_command()),
                Some(fault)
            );
        }
        assert_eq!(DiskFault::from_command("n1", &DiskCommand::Crash), None);
    }

    #[test]
    fn test_bad_disk_faults_say_what_is_wrong() {
        let err = |text: &str| format!("{:#}", anyhow::Error::from(parse_fault(text).unwrap_err()));
        assert!(err("at=1s disk n1").contains("write disk <node> followed by"));
        assert!(err("at=1s disk n1 sideways").contains("unknown disk fault \"sideways\""));
        assert!(err("at=1s disk n1 fsync-delay=soon").contains("fsync-delay="));
        assert!(err("at=1s disk n1 fsync-ok for=1s").contains("for= applies to"));
        assert!(err("at=1s crash n1 n2").contains("crash takes exactly one node name"));
    }
}
