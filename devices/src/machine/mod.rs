//! The machine's devices as one value the VMM drives: port and MMIO
//! dispatch, virtual time, interrupt routing into the PIC, guest events and
//! the saved state of everything.
//!
//! Every access first advances all devices to the access's `now`, so timers
//! due are fired before the access is served; after the access, timers made
//! due by it (a comparator written in the past) fire, and every interrupt
//! edge raised is forwarded to the PIC. Time never moves backwards: a `now`
//! earlier than one already seen is treated as that one.
//!
//! Interrupt wiring (all edges into the PIC, as on a PC's ISA lines):
//! HPET timer 0 -> IRQ0 and timer 1 -> IRQ8 (LegacyReplacement routing);
//! the RTC -> IRQ8, disconnected while the HPET's LegacyReplacement is on
//! (as on real chipsets); COM1 -> IRQ4. The ACPI SCI (IRQ9) is never raised.
//!
//! Virtio devices are optional: after [`Devices::attach_guest_memory`], each
//! `attach_virtio_*` call takes the next virtio-mmio slot (a 4 KiB window
//! from `layout::VIRTIO_MMIO_BASE` and the next of `layout::VIRTIO_MMIO_IRQS`).
//! Their lines are levels, not edges: each is high while the device's
//! InterruptStatus is non-zero. Queue work happens inside the MMIO write
//! that triggers it (QueueNotify, DRIVER_OK) or inside the VMM's call that
//! delivers console input, so it stays at deterministic points.
//!
//! The network: any number of virtio-net NICs (one per node, as slots
//! allow) and, once [`Devices::attach_switch`] is called, a [`Switch`]
//! joining them, each NIC on the port numbered by its slot index. Every
//! device step (each access, before and after it is served, and each
//! [`Devices::advance_to`]) first submits the frames the NICs transmitted
//! to the switch at the current time, then delivers into the destination
//! NICs every frame due by then, in (time, sequence) order, raising their
//! interrupts. [`Devices::next_deadline`] includes the next delivery, so an
//! idle guest jumps straight to it. Without a switch a NIC has no cable:
//! its frames are taken and discarded. No frame ever reaches the host.
//!
//! Disks (`disks`): one virtio-blk device per node that has one, numbered
//! among the disks in attach order; every device step applies each disk's
//! scheduled faults due by then and completes its delayed FLUSHes due by
//! then, and [`Devices::next_deadline`] includes the next of either.
//!
//! The parts: `access` (the buses and what owns their addresses), `step`
//! (virtual time, deadlines and interrupt routing), `slots` (the virtio
//! slots), `network` (the NICs and the switch), `disks`, `names` (who owns
//! an address, for traces) and `state` (the saved state of it all).

mod access;
mod device_id;
mod disks;
mod names;
mod network;
mod slots;
mod state;
mod step;

use crate::acpi_pm::AcpiPm;
use crate::bus::Bus;
use crate::clock_page::ClockPage;
use crate::hpet::Hpet;
use crate::pic::Pic;
use crate::rtc::Rtc;
use crate::serial::{ConsoleWriter, SerialPort};
use crate::status::{GuestEvent, PostPort, StatusPort, I8042};
use crate::switch::{FrameTap, Switch};
use crate::time::VirtNanos;
use access::{build_mmio_bus, build_pio_bus};
use device_id::DeviceId;
use serde::{Deserialize, Serialize};
use slots::VirtioDevices;
use std::collections::VecDeque;

pub use slots::{VirtioBackendState, VirtioDeviceState, VirtioSlot};
pub use state::DevicesState;

/// The machine's configuration as far as devices are concerned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicesConfig {
    /// Wall-clock time the RTC shows at virtual time zero, in Unix seconds.
    pub rtc_epoch_unix_secs: i64,
}

pub struct Devices {
    now: VirtNanos,
    pio_bus: Bus<DeviceId>,
    mmio_bus: Bus<DeviceId>,
    pic: Pic,
    hpet: Hpet,
    rtc: Rtc,
    acpi_pm: AcpiPm,
    serial: SerialPort,
    status_port: StatusPort,
    i8042: I8042,
    post: PostPort,
    pending_events: VecDeque<GuestEvent>,
    unhandled_accesses: u64,
    /// Present once guest memory is attached.
    virtio: Option<VirtioDevices>,
    /// The network between the NICs, once attached.
    switch: Option<Switch>,
    /// The clock page, when the machine boots with it (see `clock_page`).
    clock_page: Option<ClockPage>,
    /// Where the switch's frame events go, if anywhere (an observer: not
    /// part of the state).
    frame_tap: Option<Box<dyn FrameTap>>,
}

impl Devices {
    pub fn new(config: DevicesConfig, console_out: Box<dyn std::io::Write + Send>) -> Self {
        Devices {
            now: VirtNanos::ZERO,
            pio_bus: build_pio_bus(),
            mmio_bus: build_mmio_bus(),
            pic: Pic::new(),
            hpet: Hpet::new(),
            rtc: Rtc::new(config.rtc_epoch_unix_secs),
            acpi_pm: AcpiPm::new(),
            serial: SerialPort::new(console_out as ConsoleWriter),
            status_port: StatusPort::new(),
            i8042: I8042::new(),
            post: PostPort,
            pending_events: VecDeque::new(),
            unhandled_accesses: 0,
            virtio: None,
            switch: None,
            clock_page: None,
            frame_tap: None,
        }
    }

    /// The PIC's INTR output.
    pub fn has_pending_interrupt(&self) -> bool {
        self.pic.has_pending_interrupt()
    }

    /// The INTA cycle: the vector to inject (see [`Pic::acknowledge`]).
    pub fn acknowledge_interrupt(&mut self) -> Option<u8> {
        self.pic.acknowledge()
    }

    /// The oldest status-port exit or reset request not yet taken.
    pub fn take_event(&mut self) -> Option<GuestEvent> {
        self.pending_events.pop_front()
    }

    /// Queues console input for COM1. The received-data interrupt (if the
    /// guest enabled it) is raised now, so call this only at deterministic
    /// points of the run.
    pub fn enqueue_console_input(&mut self, bytes: &[u8]) {
        self.serial.enqueue_input(bytes);
        self.forward_interrupts();
    }

    /// Accesses (PIO or MMIO) that touched an address no device owns.
    pub fn unhandled_accesses(&self) -> u64 {
        self.unhandled_accesses
    }
}

#[cfg(test)]
mod tests;
