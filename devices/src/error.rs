//! Errors of the device models. Guest accesses never fail (a guest can send
//! anything); only restoring a saved state that cannot describe a real device
//! does.

use crate::bus::BusError;
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DevicesError {
    #[error(
        "serial state holds {len} bytes in its receive FIFO, more than the {capacity} it can hold"
    )]
    SerialFifoOverflow { len: usize, capacity: usize },
    #[error("RTC state has {len} bytes of CMOS RAM, expected {expected}")]
    CmosRamLength { len: usize, expected: usize },
    #[error("HPET state has {len} timers, expected {expected}")]
    HpetTimerCount { len: usize, expected: usize },
    #[error("a virtqueue cannot have a maximum size of {max_size}: it must be a power of two in 1..=32768")]
    VirtqueueMaxSize { max_size: u16 },
    #[error("virtqueue state is invalid: {reason}")]
    VirtqueueState { reason: String },
    #[error("virtio state has {len} queues, the device has {expected}")]
    VirtqueueCount { len: usize, expected: usize },
    #[error("virtio state has status {status:#x}, which has bits no device status has")]
    VirtioStatus { status: u32 },
    #[error("virtio devices need guest memory: attach it first")]
    NoGuestMemory,
    #[error("all {max} virtio-mmio slots are taken")]
    VirtioSlotsExhausted { max: usize },
    #[error("a virtio {kind} device is already attached")]
    VirtioAlreadyAttached { kind: &'static str },
    #[error("no virtio {kind} device is attached")]
    VirtioNotAttached { kind: &'static str },
    #[error("state has {len} virtio devices, the machine has {expected}")]
    VirtioDeviceCount { len: usize, expected: usize },
    #[error("state of virtio slot {slot} is for another kind of device")]
    VirtioDeviceKind { slot: usize },
    #[error(transparent)]
    Bus(#[from] BusError),
}
