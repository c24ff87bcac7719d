//! Errors of building the machine's devices. Guest accesses never fail (a
//! guest can send anything); restoring a saved state has its own error,
//! [`crate::RestoreError`].

use crate::bus::BusError;
use thiserror::Error;
use virtio_bindings::virtio_blk::VIRTIO_BLK_ID_BYTES;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DevicesError {
    #[error("a virtqueue cannot have a maximum size of {max_size}: it must be a power of two in 1..=32768")]
    VirtqueueMaxSize { max_size: u16 },
    #[error("virtio devices need guest memory: attach it first")]
    NoGuestMemory,
    #[error("all {max} virtio-mmio slots are taken")]
    VirtioSlotsExhausted { max: usize },
    #[error("a virtio {kind} device is already attached")]
    VirtioAlreadyAttached { kind: &'static str },
    #[error("no virtio {kind} device is attached")]
    VirtioNotAttached { kind: &'static str },
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    DiskSerial(SerialError),
    #[error("no disk {disk} is attached")]
    NoSuchDisk { disk: usize },
}

/// Why a disk's serial cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("a disk serial has at most {VIRTIO_BLK_ID_BYTES} ASCII bytes, {serial:?} does not")]
pub struct SerialError {
    pub serial: String,
}
