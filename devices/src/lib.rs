//! Device models for detvisor.
//!
//! Every device here is a side-effect-free state machine: it sees virtual time
//! only as a `VirtNanos` passed in, raises interrupts only through the PIC model,
//! and never reads host time or host randomness. Each implements
//! [`Persist`]: a serde `...State` it saves and restores, so the VMM can
//! capture and compare it. Virtio devices
//! (see `virtio`) also read and write guest memory, through the handle the
//! VMM attaches, and only inside the access or call that makes them.
//!
//! The VMM drives them all through [`Devices`] (see `machine`), including
//! the simulated network: virtio-net NICs joined by a [`Switch`] that
//! delivers frames in virtual time.

pub mod acpi_pm;
pub mod bus;
pub mod clock_kind;
pub mod clock_page;
pub mod error;
pub mod hpet;
pub mod layout;
pub mod machine;
pub mod pcap;
pub mod persist;
pub mod pic;
pub mod rtc;
pub mod serial;
pub mod status;
pub mod switch;
pub mod time;
pub mod virtio;

pub use bus::{Bus, BusDevice, BusError};
pub use clock_kind::{ClockKind, UnknownClock};
pub use clock_page::{ClockPage, ExitPath, ExitPathError};
pub use error::DevicesError;
pub use machine::{
    Devices, DevicesConfig, DevicesState, VirtioBackendState, VirtioDeviceState, VirtioSlot,
};
pub use persist::{Persist, RestoreError};
pub use status::GuestEvent;
pub use switch::{
    FrameEvent, FrameTap, LatencyDist, NetworkConfig, PortCounters, PortId, Switch, SwitchError,
    SwitchState, MAX_LATENCY,
};
pub use time::{DurationError, VirtNanos};

/// Guest RAM as the devices and the VMM see it: one mmap'ed region with a
/// dirty bitmap, so the pages the VMM itself writes (virtqueue used rings,
/// receive buffers) are known to incremental snapshots beside KVM's dirty
/// log of the guest's own writes.
pub type GuestMemory = vm_memory::GuestMemoryMmap<vm_memory::bitmap::AtomicBitmap>;
