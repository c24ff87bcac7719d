//! The host side of an `up` run's conversation with the in-guest agent
//! (`detvisor-agent`, the guest's PID 1, reached over a virtio console).
//! [`Conductor`] is a pure state machine fed with the agent's messages and
//! the virtual time, answering with the messages to send; [`UpDriver`] steps
//! a session through it after every exit, takes the run's faults, writes its
//! output ([`UpOutput`]) and keeps its records, so every message reaches the
//! guest at an exit chosen by guest output or virtual time: the whole run,
//! faults included, is a function of the seed. [`UpState`] is the driver's
//! saved state, the part of a snapshot that is not the machine's.

mod conductor;
mod driver;
mod output;
#[cfg(test)]
mod template_tests;

pub use conductor::{run_status, Conductor, Note, ShellEvent, SETUP_FAILED};
pub use driver::{send_message, DriveError, PendingFaults, UpDriver, UpState};
pub use output::{event_line, EventSink, OutputError, OutputSink, UpOutput};

/// Where node `name`'s root directory is in the guest.
pub fn node_root(name: &str) -> String {
    format!("/nodes/{name}")
}

/// The name the workload's output goes under (stdout prefix and log file)
/// when it runs inside a node.
pub const WORKLOAD_LOG: &str = crate::manifest::WORKLOAD_NODE;
