//! `detvisor up cluster.toml`: a multi-node system under test in one guest.
//!
//! The guest is assembled on the host from the manifest ([`prepare`]), then
//! booted and driven to its end by the conversation with its agent
//! ([`crate::conversation`], re-exported here with the events and the test
//! composer, so that an `up` run's parts are reached under one name).

mod assemble;
mod disk;
mod launch;
mod prepare_error;

pub use crate::composer;
pub use crate::conversation::{
    event_line, node_root, run_status, send_message, Conductor, DriveError, EventSink, Note,
    OutputError, OutputSink, ShellEvent, UpDriver, UpOutput, UpState, SETUP_FAILED, WORKLOAD_LOG,
};
pub use crate::event::UpEvent;
pub use assemble::assemble;
pub use disk::{disk_image, disk_serial, DiskError};
pub use launch::{
    prepare, run, Initrd, PreparedUp, UpError, UpOptions, UpSummary, DEFAULT_RAM_BYTES,
};
pub use prepare_error::PrepareError;

/// The guest's NIC for node `index` (in manifest order).
pub fn node_nic(index: usize) -> String {
    format!("eth{index}")
}
