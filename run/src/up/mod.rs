//! `detvisor up cluster.toml`: a multi-node system under test in one guest.
//!
//! The guest's PID 1 is the agent (`detvisor-agent`), reached over a virtio
//! console. [`Conductor`] is the host side of that conversation: a pure state
//! machine fed with the agent's messages and the virtual time, answering with
//! the messages to send. The session loop calls it after every exit, so every
//! message reaches the guest at an exit chosen by guest output or virtual
//! time: the whole run, faults included, is a function of the seed.

mod assemble;
pub mod composer;
mod conductor;
mod disk;
mod driver;
mod event;
mod launch;
mod output;

pub use assemble::assemble;
pub use conductor::{run_status, Conductor, Note, ShellEvent, SETUP_FAILED};
pub use disk::{disk_image, disk_serial, DiskError};
pub use driver::{send_message, DriveError, UpDriver, UpState};
pub use event::UpEvent;
pub use launch::{
    prepare, run, Initrd, PrepareError, PreparedUp, UpError, UpOptions, UpSummary,
    DEFAULT_RAM_BYTES,
};
pub use output::{event_line, EventSink, OutputError, OutputSink, UpOutput};

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
