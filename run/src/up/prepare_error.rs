//! Why an `up` run's guest could not be assembled: the one error of the
//! host-side preparation, raised by the checks of the manifest and its
//! faults (`launch`) and by building the nodes' trees (`assemble`) alike.

use crate::faults::{FaultAction, FaultError};
use crate::guest::GuestImageError;
use crate::units::RamError;
use image_builder::ImageError;
use std::path::PathBuf;

/// Why an `up` run's guest could not be assembled (image errors are boxed: they are large) ([`super::prepare`], [`super::assemble`]).
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Faults(#[from] FaultError),
    #[error("fault {action}: the workload's own node can be partitioned, not paused, killed or restarted (its end is the run's end)")]
    WorkloadNodeFault { action: FaultAction },
    #[error("machine.mem")]
    Mem(#[source] RamError),
    /// The RAM the caller gave (`--mem`).
    #[error(transparent)]
    Ram(RamError),
    #[error(transparent)]
    Guest(#[from] GuestImageError),
    #[error("cannot read the initrd")]
    ReadInitrd(#[source] hostfile::ReadError),
    #[error("packing the guest initramfs")]
    Pack(#[source] Box<ImageError>),
    #[error("cannot read the agent {}", path.display())]
    ReadAgent {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Adding the agent or a node's tree to the initramfs.
    #[error(transparent)]
    Overlay(#[from] Box<ImageError>),
    #[error("node {name}")]
    Node {
        name: String,
        #[source]
        source: Box<PrepareError>,
    },
    #[error("cannot read the node image")]
    ReadNodeImage(#[source] hostfile::ReadError),
    #[error("node image {}", path.display())]
    NodeImage {
        path: PathBuf,
        #[source]
        source: Box<ImageError>,
    },
    /// `step`: "OCI reference", "reading OCI layout", "flattening OCI layout".
    #[error("{step} {reference}")]
    Oci {
        step: &'static str,
        reference: String,
        #[source]
        source: Box<ImageError>,
    },
    #[error("reading rootfs directory {}", dir.display())]
    ReadRootfs {
        dir: PathBuf,
        #[source]
        source: Box<ImageError>,
    },
    #[error("node {node}: no `command` in the manifest and none in its image")]
    NoCommand { node: String },
    #[error("node {node}: its disk")]
    Disk {
        node: String,
        #[source]
        source: super::DiskError,
    },
    #[error("fault {action}: node {node} has no disk (give it one: disk = \"64M\")")]
    NoDisk { action: FaultAction, node: String },
    #[error("fault {action}: the workload runs inside node {node}, which therefore cannot crash (its namespaces, so its file system, would outlive the crash)")]
    CrashWorkloadNode { action: FaultAction, node: String },
}
