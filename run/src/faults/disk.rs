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

#[cfg(test)]
mod tests {
    use super::*;

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
}
