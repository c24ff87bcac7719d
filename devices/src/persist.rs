//! Saving and restoring device state: one trait, [`Persist`], for every
//! stateful device, one error, [`RestoreError`], and one round-trip test
//! macro for the tests, `persist_round_trip_tests!`.
//!
//! A device's state is a plain serde value (its `...State` type); snapshots
//! store it as JSON and the run digest hashes that JSON, so a state type's
//! serialized form is part of the on-disk format. [`Persist::save`] never
//! fails. [`Persist::restore`] checks the state first
//! ([`Persist::validate`]) and fails with nothing changed when the state
//! cannot describe this device: a state that was corrupted, hand-written or
//! saved on a machine configured differently gets an error, never a panic.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use thiserror::Error;

/// A device whose whole state can be saved and restored in place.
///
/// What is not in the state (a console writer, the configuration a device
/// was built with, a NIC's cable) stays as it is across a restore; the
/// configuration is what [`Persist::validate`] checks the state against.
pub trait Persist {
    /// Everything the device's behaviour depends on, as plain data.
    type State: Serialize + DeserializeOwned + Clone + PartialEq + Debug;

    /// The device's current state.
    fn save(&self) -> Self::State;

    /// Checks, changing nothing, that `state` describes a device like this
    /// one; [`Persist::restore`] fails exactly when this does. By default
    /// every state does.
    fn validate(&self, _state: &Self::State) -> Result<(), RestoreError> {
        Ok(())
    }

    /// Puts the device in `state`. On error nothing has changed.
    fn restore(&mut self, state: &Self::State) -> Result<(), RestoreError>;
}

/// Why a saved state cannot be restored. A nested error (in a slot or a
/// queue) is part of the message: there is no separate `source` to print.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RestoreError {
    #[error("the state is for the {found} PIC, this is the {expected}")]
    PicRole {
        found: &'static str,
        expected: &'static str,
    },
    /// A state that does not fit the part it is restored into (beyond the
    /// devices: a part of a run saved with the machine).
    #[error("the saved {part} does not fit: {reason}")]
    Incompatible { part: &'static str, reason: String },
    #[error("the state was saved {} the clock page, this machine is {} it", if *saved { "with" } else { "without" }, if *machine { "with" } else { "without" })]
    ClockPage { saved: bool, machine: bool },
    #[error("the state was made with the {saved} clock, this machine has the {machine} clock: one history keeps one clock")]
    ClockKind {
        saved: crate::ClockKind,
        machine: crate::ClockKind,
    },
    #[error("HPET state has {len} timers, expected {expected}")]
    HpetTimerCount { len: usize, expected: usize },
    #[error("RTC state has {len} bytes of CMOS RAM, expected {expected}")]
    CmosRamLength { len: usize, expected: usize },
    #[error("RTC state selects CMOS register {index}, beyond the {count} there are")]
    CmosIndexOutOfRange { index: u8, count: usize },
    #[error(
        "serial state holds {len} bytes in its receive FIFO, more than the {capacity} it can hold"
    )]
    SerialFifoOverflow { len: usize, capacity: usize },
    #[error("virtqueue state has maximum size {max_size}, the queue has {expected}")]
    VirtqueueMaxSize { max_size: u16, expected: u16 },
    #[error("virtqueue state is invalid: {reason}")]
    VirtqueueState { reason: String },
    #[error("the rings of the ready queue are not inside guest memory")]
    RingsOutsideMemory,
    #[error("queue {queue}: {error}")]
    InQueue {
        queue: usize,
        error: Box<RestoreError>,
    },
    #[error("virtio state has {len} queues, the device has {expected}")]
    VirtqueueCount { len: usize, expected: usize },
    #[error("virtio state has status {status:#x}, which has bits no device status has")]
    VirtioStatus { status: u32 },
    #[error("state has {len} virtio devices, the machine has {expected}")]
    VirtioDeviceCount { len: usize, expected: usize },
    #[error("the state is for a virtio {found} device, the slot holds a virtio {expected}")]
    VirtioDeviceKind {
        found: &'static str,
        expected: &'static str,
    },
    #[error("virtio slot {slot}: {error}")]
    InVirtioSlot {
        slot: usize,
        error: Box<RestoreError>,
    },
    #[error(
        "the switch state's port {port} does not match the NIC in virtio slot {port} \
         (one is missing, or their addresses differ)"
    )]
    SwitchPortMismatch { port: usize },
    #[error("the switch state has frames or links for port {port}, which it does not have")]
    SwitchUnknownPort { port: usize },
    #[error("the saved disk is over base image {saved}, the attached one over {attached}")]
    DiskBase { saved: String, attached: String },
    #[error("saved disk block {block}: {reason}")]
    DiskBlock { block: u64, reason: &'static str },
}

impl RestoreError {
    /// This error, as found in queue `queue`.
    pub fn in_queue(self, queue: usize) -> Self {
        RestoreError::InQueue {
            queue,
            error: Box::new(self),
        }
    }

    /// This error, as found in virtio slot `slot`.
    pub fn in_virtio_slot(self, slot: usize) -> Self {
        RestoreError::InVirtioSlot {
            slot,
            error: Box::new(self),
        }
    }
}

/// Generates a device's round-trip tests in a module `$name`:
/// * `restores_into_fresh_device`: the state `saved` saves goes through JSON
///   and into the device `fresh`, which then saves the same state;
/// * `restore_undoes_changes`: after `mutate` changes `saved`, restoring
///   the state saved before brings it back.
///
/// `fresh` and `saved` are expressions building a device (`saved` one in
/// an interesting state); `mutate` is a closure taking `&mut` the device.
/// They are evaluated inside the generated module, which sees everything
/// the calling module does.
///
/// ```ignore
/// persist_round_trip_tests! {
///     mod pic_persist {
///         fresh: Pic::new(),
///         saved: initialized_pic(),
///         mutate: |pic| pic.pulse_irq(0),
///     }
/// }
/// ```
#[cfg(any(test, feature = "persist-testing"))]
#[macro_export]
macro_rules! persist_round_trip_tests {
    (mod $name:ident { fresh: $fresh:expr, saved: $saved:expr, mutate: $mutate:expr $(,)? }) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn restores_into_fresh_device() {
                $crate::persist::round_trip::assert_restores_into_fresh($saved, $fresh);
            }

            #[test]
            fn restore_undoes_changes() {
                $crate::persist::round_trip::assert_restore_undoes($saved, $mutate);
            }
        }
    };
}
#[cfg(test)]
pub(crate) use persist_round_trip_tests;

/// The checks behind `persist_round_trip_tests!` (for other crates' tests,
/// with the `persist-testing` feature).
#[cfg(any(test, feature = "persist-testing"))]
#[doc(hidden)]
pub mod round_trip {
    use super::Persist;

    /// Saves `device`, sends the state through JSON (the snapshot format),
    /// restores it into `fresh` and checks that `fresh` saves the same
    /// state, serialized to the same bytes.
    pub fn assert_restores_into_fresh<D: Persist>(device: D, mut fresh: D) {
        let saved = device.save();
        let json = serde_json::to_vec(&saved).expect("a state serializes");
        let decoded: D::State = serde_json::from_slice(&json).expect("a saved state deserializes");
        assert_eq!(decoded, saved, "the state changed on its way through JSON");
        fresh.restore(&decoded).expect("a saved state restores");
        let resaved = fresh.save();
        assert_eq!(resaved, saved, "the restored device saves another state");
        let rejson = serde_json::to_vec(&resaved).expect("a state serializes");
        assert_eq!(rejson, json, "the restored state serializes differently");
    }

    /// Saves `device`, changes it with `mutate`, restores the saved state
    /// and checks that the device is back to it.
    pub fn assert_restore_undoes<D: Persist>(mut device: D, mutate: impl FnOnce(&mut D)) {
        let saved = device.save();
        mutate(&mut device);
        assert_ne!(device.save(), saved, "the mutation changed nothing");
        device.restore(&saved).expect("a saved state restores");
        assert_eq!(device.save(), saved, "restore did not undo the mutation");
    }
}
