//! Virtio devices on the virtio-mmio transport, virtio 1.x ("modern") only.
//!
//! [`VirtioMmioTransport`] is the register file the guest sees (spec 4.2.2):
//! feature negotiation, the device status state machine, queue
//! configuration, notifications and the interrupt status. A backend
//! implementing [`VirtioDevice`] does the device-specific work on the
//! queues the transport hands it: [`VirtioRng`], [`VirtioConsole`] and
//! [`VirtioNet`].
//!
//! Everything the guest supplies (queue sizes, ring addresses, descriptor
//! chains, indexes, status values) is checked. A driver that breaks the
//! rules gets its device marked broken: DEVICE_NEEDS_RESET is set, a
//! configuration-change interrupt is raised (spec 2.1.2) and the device
//! processes nothing more until the driver resets it. Guest memory is only
//! touched inside ranges checked against the guest's memory map.
//!
//! Queue work happens synchronously, at points the VMM chooses
//! deterministically: inside the MMIO write of QueueNotify (or of the
//! status write that sets DRIVER_OK), or when the VMM itself asks a device
//! to deliver input.
//!
//! Every device offers VIRTIO_RING_F_EVENT_IDX, so that the driver
//! notifies, and the device interrupts, only when the other side needs it
//! (see [`queue`]); without it the device honours
//! VRING_AVAIL_F_NO_INTERRUPT. Both read guest memory only in those same
//! steps.

pub mod blk;
pub mod console;
pub mod mmio;
#[cfg(test)]
mod mmio_tests;
pub mod net;
pub mod queue;
pub mod rng;
#[cfg(test)]
mod suppression_tests;
#[cfg(test)]
pub(crate) mod testing;

pub use blk::{
    BlockNo, DiskCommand, DiskImage, DiskImageError, FlushMode, ScheduledDiskCommand, VirtioBlk,
    VirtioBlkCounters, VirtioBlkState,
};
pub use console::{VirtioConsole, VirtioConsoleState};
pub use mmio::{VirtioMmioState, VirtioMmioTransport};
pub use net::{RxOutcome, VirtioNet, VirtioNetCounters, VirtioNetState};
pub use queue::{BufferSegment, DescriptorChain, Virtqueue, VirtqueueState};
pub use rng::{VirtioRng, VirtioRngState};

use crate::time::VirtNanos;
use crate::GuestMemory;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A device backend behind the virtio-mmio transport.
///
/// The transport owns the queues and the negotiation; the backend only sees
/// a queue when there is work on it. Backends must be deterministic: the
/// same calls with the same guest memory produce the same results.
pub trait VirtioDevice {
    /// The virtio device ID (spec 5): 1 for a network card, 2 for a block
    /// device, 3 for a console, 4 for an entropy source.
    fn device_id(&self) -> u32;

    /// Device-specific feature bits offered to the driver. The transport
    /// adds VIRTIO_F_VERSION_1 and VIRTIO_RING_F_EVENT_IDX itself. None by
    /// default.
    fn device_features(&self) -> u64 {
        0
    }

    /// The maximum size of each queue, in queue order; its length is the
    /// number of queues. Every size must be a power of two, at most 32768.
    fn queue_max_sizes(&self) -> &'static [u16];

    /// Reads device configuration space at `offset`; bytes beyond the
    /// configuration space read as zero. By default there is none.
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    /// Writes device configuration space; writes to read-only or absent
    /// fields are ignored (by default, all of them).
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    /// Processes the buffers the driver made available on queue
    /// `queue_index`. An error is a driver violation: the transport then
    /// marks the device broken.
    ///
    /// With EVENT_IDX the driver notifies again only once the device has
    /// consumed every buffer it made available: a backend that leaves
    /// buffers in the ring (it has nothing to put in them yet) must be run
    /// again by its owner when it has, not wait for a QueueNotify.
    fn process_queue(
        &mut self,
        queue_index: usize,
        queue: &mut Virtqueue,
        mem: &GuestMemory,
        now: VirtNanos,
    ) -> Result<(), QueueFault>;

    /// The driver reset the device: forget what belonged to the driver
    /// (by default nothing: the device keeps no driver state of its own).
    fn reset(&mut self) {}
}

/// One of a queue's three guest-memory areas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RingPart {
    DescriptorTable,
    AvailRing,
    UsedRing,
}

/// A rule of the virtio spec that the driver broke on one queue.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq, Serialize, Deserialize)]
pub enum QueueFault {
    #[error("queue size {size} is zero, not a power of two or above the maximum {max}")]
    InvalidSize { size: u32, max: u16 },
    #[error("{part:?} address {address:#x} is not aligned as the spec requires")]
    MisalignedRing { part: RingPart, address: u64 },
    #[error("the rings are not inside guest memory")]
    RingOutsideMemory,
    #[error("queue configuration written while the queue is ready")]
    WriteWhileReady,
    #[error("the available index moved by {distance}, more than the queue size {size}")]
    AvailIndexJump { distance: u16, size: u16 },
    #[error("descriptor index {index} is outside the table of {size} entries")]
    DescriptorIndexOutOfRange { index: u16, size: u16 },
    #[error("the descriptor chain from head {head} has more than {size} descriptors (a loop)")]
    ChainTooLong { head: u16, size: u16 },
    #[error("descriptor {index} refers to an indirect table, which was not negotiated")]
    IndirectDescriptor { index: u16 },
    #[error("descriptor {index}: buffer {address:#x}+{len:#x} wraps the address space")]
    BufferAddressOverflow { index: u16, address: u64, len: u32 },
    #[error("descriptor {index}: buffer {address:#x}+{len:#x} is not inside guest memory")]
    BufferOutsideMemory { index: u16, address: u64, len: u32 },
    #[error("the descriptor chain from head {head} is longer than 2^32 bytes in total")]
    ChainLengthOverflow { head: u16 },
    #[error("device-readable descriptor {index} follows a device-writable one")]
    ReadableAfterWritable { index: u16 },
    #[error("descriptor {index} is read-only, but the device must write into it")]
    ReadOnlyDescriptor { index: u16 },
    #[error("descriptor {index} is device-writable on a queue the device only reads")]
    WritableDescriptor { index: u16 },
    #[error("guest memory could not be accessed at {address:#x}")]
    GuestMemory { address: u64 },
    #[error("the transmit chain from head {head} has {len} bytes, less than a virtio-net header")]
    NetHeaderTooShort { head: u16, len: u32 },
    #[error(
        "the transmit chain from head {head} asks for offloads never negotiated \
         (flags {flags:#x}, gso_type {gso_type:#x})"
    )]
    NetHeaderOffload { head: u16, flags: u8, gso_type: u8 },
    #[error(
        "the block request from head {head} has {readable} readable and {writable} writable \
         bytes: it needs a 16-byte header and a status byte"
    )]
    BlkRequestTooShort {
        head: u16,
        readable: u32,
        writable: u32,
    },
}

/// What made a device broken: the first rule the driver broke.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq, Serialize, Deserialize)]
pub enum VirtioViolation {
    #[error("queue {queue}: {fault}")]
    Queue { queue: u16, fault: QueueFault },
    #[error("queue {queue} does not exist")]
    NoSuchQueue { queue: u32 },
    #[error("status {written:#x} written after {previous:#x} is not a valid transition")]
    InvalidStatusTransition { previous: u32, written: u32 },
}
