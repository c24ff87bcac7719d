//! Device models for detvisor.
//!
//! Every device here is a side-effect-free state machine: it sees virtual time
//! only as a `VirtNanos` passed in, raises interrupts only through the PIC model,
//! and never reads host time or host randomness. Each has a serde `...State`
//! and a `restore`, so the VMM can capture and compare it.

pub mod bus;
pub mod layout;
pub mod time;

pub use bus::{Bus, BusDevice, BusError};
pub use time::VirtNanos;
