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

mod disks;
mod names;

use crate::acpi_pm::{AcpiPm, AcpiPmBlock, AcpiPmState};
use crate::bus::{Bus, BusDevice};
use crate::clock_page::ClockPage;
use crate::error::DevicesError;
use crate::hpet::{Hpet, HpetState};
use crate::layout;
use crate::persist::{Persist, RestoreError};
use crate::pic::{Pic, PicPorts, PicState};
use crate::rtc::{Rtc, RtcState};
use crate::serial::{ConsoleWriter, SerialPort, SerialState};
use crate::status::{
    GuestEvent, I8042Port, I8042State, PostPort, StatusPort, StatusPortState, I8042,
};
use crate::switch::{Fault, FrameTap, NetworkConfig, PortId, Switch, SwitchError, SwitchState};
use crate::time::VirtNanos;
use crate::virtio::{
    RxOutcome, VirtioBlk, VirtioBlkState, VirtioConsole, VirtioConsoleState, VirtioDevice,
    VirtioMmioState, VirtioMmioTransport, VirtioNet, VirtioNetCounters, VirtioNetState, VirtioRng,
    VirtioRngState, VirtioViolation,
};
use crate::GuestMemory;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Number of 16550 registers at COM1.
const COM1_LEN: u64 = 8;
/// Index and data ports.
const RTC_LEN: u64 = 2;
/// Command and data ports of each PIC; ELCR1 and ELCR2.
const PIC_LEN: u64 = 2;
const ELCR_LEN: u64 = 2;
/// Number of ISA interrupt lines.
const ISA_IRQ_LINES: u8 = 16;

/// The machine's configuration as far as devices are concerned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicesConfig {
    /// Wall-clock time the RTC shows at virtual time zero, in Unix seconds.
    pub rtc_epoch_unix_secs: i64,
}

/// What owns a bus range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceId {
    PicMaster,
    PicSlave,
    Elcr,
    Com1,
    Rtc,
    I8042Data,
    I8042Command,
    Post,
    AcpiPm1Event,
    AcpiPm1Control,
    AcpiPmTimer,
    Status,
    ClockPageExit,
    Hpet,
    /// A virtio-mmio slot, by index.
    Virtio(usize),
}

/// A virtio device in its virtio-mmio slot (boxed: the transports differ
/// widely in size).
enum VirtioSlotDevice {
    Rng(Box<VirtioMmioTransport<VirtioRng>>),
    Console(Box<VirtioMmioTransport<VirtioConsole>>),
    Net(Box<VirtioMmioTransport<VirtioNet>>),
    Blk(Box<VirtioMmioTransport<VirtioBlk>>),
}

/// Runs `$body` with `$transport` bound to the slot's transport, whatever
/// its backend.
macro_rules! with_transport {
    ($device:expr, $transport:ident => $body:expr) => {
        match $device {
            VirtioSlotDevice::Rng($transport) => $body,
            VirtioSlotDevice::Console($transport) => $body,
            VirtioSlotDevice::Net($transport) => $body,
            VirtioSlotDevice::Blk($transport) => $body,
        }
    };
}

impl VirtioSlotDevice {
    fn kind_name(&self) -> &'static str {
        match self {
            VirtioSlotDevice::Rng(_) => "rng",
            VirtioSlotDevice::Console(_) => "console",
            VirtioSlotDevice::Net(_) => "net",
            VirtioSlotDevice::Blk(_) => "blk",
        }
    }
}

/// Checks a transport's and its backend's states against them.
fn validate_virtio_device<D: VirtioDevice + Persist>(
    transport: &VirtioMmioTransport<D>,
    transport_state: &VirtioMmioState,
    backend_state: &D::State,
) -> Result<(), RestoreError> {
    transport.validate(transport_state)?;
    transport.device().validate(backend_state)
}

/// Restores a transport and its backend, once both states are validated.
fn restore_virtio_device<D: VirtioDevice + Persist>(
    transport: &mut VirtioMmioTransport<D>,
    transport_state: &VirtioMmioState,
    backend_state: &D::State,
) -> Result<(), RestoreError> {
    transport.restore(transport_state)?;
    transport.device_mut().restore(backend_state)
}

/// The transport and the backend; the rings are checked against guest
/// memory by [`VirtioDevices`].
impl Persist for VirtioSlotDevice {
    type State = VirtioDeviceState;

    fn save(&self) -> VirtioDeviceState {
        let backend = match self {
            VirtioSlotDevice::Rng(transport) => VirtioBackendState::Rng(transport.device().save()),
            VirtioSlotDevice::Console(transport) => {
                VirtioBackendState::Console(transport.device().save())
            }
            VirtioSlotDevice::Net(transport) => VirtioBackendState::Net(transport.device().save()),
            VirtioSlotDevice::Blk(transport) => VirtioBackendState::Blk(transport.device().save()),
        };
        VirtioDeviceState {
            transport: with_transport!(self, transport => transport.save()),
            backend,
        }
    }

    fn validate(&self, state: &VirtioDeviceState) -> Result<(), RestoreError> {
        let transport_state = &state.transport;
        match (self, &state.backend) {
            (VirtioSlotDevice::Rng(transport), VirtioBackendState::Rng(backend)) => {
                validate_virtio_device(transport, transport_state, backend)
            }
            (VirtioSlotDevice::Console(transport), VirtioBackendState::Console(backend)) => {
                validate_virtio_device(transport, transport_state, backend)
            }
            (VirtioSlotDevice::Net(transport), VirtioBackendState::Net(backend)) => {
                validate_virtio_device(transport, transport_state, backend)
            }
            (VirtioSlotDevice::Blk(transport), VirtioBackendState::Blk(backend)) => {
                validate_virtio_device(transport, transport_state, backend)
            }
            (device, backend) => Err(RestoreError::VirtioDeviceKind {
                found: backend.kind_name(),
                expected: device.kind_name(),
            }),
        }
    }

    fn restore(&mut self, state: &VirtioDeviceState) -> Result<(), RestoreError> {
        self.validate(state)?;
        let transport_state = &state.transport;
        match (self, &state.backend) {
            (VirtioSlotDevice::Rng(transport), VirtioBackendState::Rng(backend)) => {
                restore_virtio_device(transport, transport_state, backend)
            }
            (VirtioSlotDevice::Console(transport), VirtioBackendState::Console(backend)) => {
                restore_virtio_device(transport, transport_state, backend)
            }
            (VirtioSlotDevice::Net(transport), VirtioBackendState::Net(backend)) => {
                restore_virtio_device(transport, transport_state, backend)
            }
            (VirtioSlotDevice::Blk(transport), VirtioBackendState::Blk(backend)) => {
                restore_virtio_device(transport, transport_state, backend)
            }
            // Refused by `validate`.
            (device, backend) => Err(RestoreError::VirtioDeviceKind {
                found: backend.kind_name(),
                expected: device.kind_name(),
            }),
        }
    }
}

/// The virtio devices and the guest memory their queues live in.
struct VirtioDevices {
    memory: GuestMemory,
    slots: Vec<VirtioSlotDevice>,
}

/// The devices slot by slot, each state checked against its slot's device
/// and its rings against guest memory.
impl Persist for VirtioDevices {
    type State = Vec<VirtioDeviceState>;

    fn save(&self) -> Vec<VirtioDeviceState> {
        self.slots.iter().map(VirtioSlotDevice::save).collect()
    }

    fn validate(&self, states: &Vec<VirtioDeviceState>) -> Result<(), RestoreError> {
        if states.len() != self.slots.len() {
            return Err(RestoreError::VirtioDeviceCount {
                len: states.len(),
                expected: self.slots.len(),
            });
        }
        for (slot, (device, state)) in self.slots.iter().zip(states).enumerate() {
            device
                .validate(state)
                .and_then(|()| state.transport.check_rings_in(&self.memory))
                .map_err(|error| error.in_virtio_slot(slot))?;
        }
        Ok(())
    }

    fn restore(&mut self, states: &Vec<VirtioDeviceState>) -> Result<(), RestoreError> {
        self.validate(states)?;
        for (slot, (device, state)) in self.slots.iter_mut().zip(states).enumerate() {
            device
                .restore(state)
                .map_err(|error| error.in_virtio_slot(slot))?;
        }
        Ok(())
    }
}

/// The virtio console among `slots`, if one is attached.
fn console_of(slots: &mut [VirtioSlotDevice]) -> Option<&mut VirtioMmioTransport<VirtioConsole>> {
    slots.iter_mut().find_map(|device| match device {
        VirtioSlotDevice::Console(transport) => Some(transport.as_mut()),
        VirtioSlotDevice::Rng(_) | VirtioSlotDevice::Net(_) | VirtioSlotDevice::Blk(_) => None,
    })
}

/// Where an attached virtio device sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioSlot {
    /// Attach order, from 0.
    pub index: usize,
    pub mmio_base: u64,
    pub irq: u8,
}

impl VirtioSlot {
    fn new(index: usize) -> Option<Self> {
        Some(VirtioSlot {
            index,
            mmio_base: layout::virtio_mmio_base(index)?,
            irq: layout::virtio_mmio_irq(index)?,
        })
    }

    /// The kernel command-line entry declaring this device, e.g.
    /// `virtio_mmio.device=4K@0xd0000000:5`.
    pub fn cmdline_fragment(&self) -> String {
        layout::virtio_mmio_cmdline_fragment(self.index).unwrap_or_default()
    }

    /// The switch port of the NIC in this slot.
    pub fn port(&self) -> PortId {
        PortId(self.index)
    }
}

/// Saved state of a virtio device's backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VirtioBackendState {
    Rng(VirtioRngState),
    Console(VirtioConsoleState),
    Net(VirtioNetState),
    Blk(VirtioBlkState),
}

impl VirtioBackendState {
    fn kind_name(&self) -> &'static str {
        match self {
            VirtioBackendState::Rng(_) => "rng",
            VirtioBackendState::Console(_) => "console",
            VirtioBackendState::Net(_) => "net",
            VirtioBackendState::Blk(_) => "blk",
        }
    }
}

/// Saved state of one virtio device: its transport (status, features,
/// queues with their addresses, indexes and ready flags) and its backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioDeviceState {
    pub transport: VirtioMmioState,
    pub backend: VirtioBackendState,
}

/// Saved state of every device and of the aggregate itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicesState {
    pub now: VirtNanos,
    pub pic: PicState,
    pub hpet: HpetState,
    pub rtc: RtcState,
    pub acpi_pm: AcpiPmState,
    pub serial: SerialState,
    pub status_port: StatusPortState,
    pub i8042: I8042State,
    /// Guest events not yet taken by the VMM, oldest first.
    pub pending_events: Vec<GuestEvent>,
    pub unhandled_accesses: u64,
    /// Virtio devices in slot order; absent in states saved without them.
    #[serde(default)]
    pub virtio: Vec<VirtioDeviceState>,
    /// The network switch, with the frames in flight; absent in states
    /// saved without one.
    #[serde(default)]
    pub switch: Option<SwitchState>,
    /// Whether the machine has the clock page (its contents are guest memory).
    #[serde(default)]
    pub clock_page: bool,
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

fn build_pio_bus() -> Bus<DeviceId> {
    let ranges = [
        (layout::PIC_MASTER_PORT, PIC_LEN, DeviceId::PicMaster),
        (layout::PIC_SLAVE_PORT, PIC_LEN, DeviceId::PicSlave),
        (layout::ELCR_PORT, ELCR_LEN, DeviceId::Elcr),
        (layout::COM1_PORT, COM1_LEN, DeviceId::Com1),
        (layout::RTC_PORT, RTC_LEN, DeviceId::Rtc),
        (layout::I8042_DATA_PORT, 1, DeviceId::I8042Data),
        (layout::I8042_COMMAND_PORT, 1, DeviceId::I8042Command),
        (layout::POST_PORT, 1, DeviceId::Post),
        (
            layout::ACPI_PM1A_EVT_PORT,
            u64::from(layout::ACPI_PM1A_EVT_LEN),
            DeviceId::AcpiPm1Event,
        ),
        (
            layout::ACPI_PM1A_CNT_PORT,
            u64::from(layout::ACPI_PM1A_CNT_LEN),
            DeviceId::AcpiPm1Control,
        ),
        (
            layout::ACPI_PM_TMR_PORT,
            u64::from(layout::ACPI_PM_TMR_LEN),
            DeviceId::AcpiPmTimer,
        ),
        (layout::STATUS_PORT, 1, DeviceId::Status),
        (layout::CLOCK_PAGE_EXIT_PORT, 1, DeviceId::ClockPageExit),
    ];
    let mut bus = Bus::new();
    for (port, len, id) in ranges {
        bus.insert(u64::from(port), len, id)
            .expect("the fixed port layout has overlapping ranges");
    }
    bus
}

fn build_mmio_bus() -> Bus<DeviceId> {
    let mut bus = Bus::new();
    bus.insert(layout::HPET_BASE, layout::HPET_LEN, DeviceId::Hpet)
        .expect("the fixed MMIO layout has overlapping ranges");
    bus
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

    /// Gives the guest the clock page (`clock_page`) in `memory`: its
    /// clockevent deadline then counts among the device deadlines and
    /// raises IRQ 0. Call it before the first exit.
    pub fn attach_clock_page(&mut self, memory: GuestMemory) {
        self.clock_page = Some(ClockPage::new(memory));
    }

    /// The kernel command-line entry for the clock page, if attached.
    pub fn clock_page_cmdline(&self) -> Option<String> {
        self.clock_page
            .as_ref()
            .map(|_| ClockPage::cmdline_fragment())
    }

    /// Publishes the exit count and the time in the clock page, if any.
    /// Only at guest-caused exits (see `clock_page`).
    pub fn publish_clock_page(&self, exits: u64, now: VirtNanos) {
        if let Some(page) = &self.clock_page {
            page.publish(exits, now);
        }
    }

    /// How many clock-page deadlines have fired (a diagnostic).
    pub fn clock_page_deadlines_fired(&self) -> u64 {
        self.clock_page.as_ref().map_or(0, ClockPage::fired)
    }

    /// Gives the devices the guest memory virtio queues live in. Call it
    /// once, before attaching virtio devices; a later call replaces the
    /// handle and keeps the devices.
    pub fn attach_guest_memory(&mut self, memory: GuestMemory) {
        match &mut self.virtio {
            Some(virtio) => virtio.memory = memory,
            None => {
                self.virtio = Some(VirtioDevices {
                    memory,
                    slots: Vec::new(),
                })
            }
        }
    }

    /// Attaches a virtio-rng whose bytes are the ChaCha20 stream keyed by `key`.
    pub fn attach_virtio_rng(&mut self, key: [u8; 32]) -> Result<VirtioSlot, DevicesError> {
        let transport = VirtioMmioTransport::new(VirtioRng::new(key))?;
        self.attach_virtio(VirtioSlotDevice::Rng(Box::new(transport)))
    }

    /// Attaches the virtio-console control channel (one port, /dev/hvc0 in
    /// the guest).
    /// Re-keys the virtio-rng stream (an alternate history from this moment
    /// on): the device continues with the stream `key` from its start.
    /// Returns false when no virtio-rng is attached.
    pub fn rekey_virtio_rng(&mut self, key: [u8; 32]) -> bool {
        let Some(virtio) = &mut self.virtio else {
            return false;
        };
        for device in virtio.slots.iter_mut() {
            if let VirtioSlotDevice::Rng(transport) = device {
                *transport.device_mut() = VirtioRng::new(key);
                return true;
            }
        }
        false
    }

    /// Re-keys the switch's stream (an alternate history from this moment
    /// on): its draws continue from the start of the stream `key`. Frames
    /// already in flight keep their delivery times. Returns false when no
    /// switch is attached.
    pub fn rekey_switch(&mut self, key: [u8; 32]) -> bool {
        match &mut self.switch {
            Some(switch) => {
                switch.rekey(key);
                true
            }
            None => false,
        }
    }

    pub fn attach_virtio_console(&mut self) -> Result<VirtioSlot, DevicesError> {
        let transport = VirtioMmioTransport::new(VirtioConsole::new())?;
        self.attach_virtio(VirtioSlotDevice::Console(Box::new(transport)))
    }

    /// Attaches a virtio-net NIC with address `mac`; there may be one per
    /// node, as far as slots go. Its switch port is [`VirtioSlot::port`].
    /// If a switch is attached, the NIC joins it at once.
    pub fn attach_virtio_net(&mut self, mac: [u8; 6]) -> Result<VirtioSlot, DevicesError> {
        let transport = VirtioMmioTransport::new(VirtioNet::new(mac))?;
        let slot = self.attach_virtio(VirtioSlotDevice::Net(Box::new(transport)))?;
        if let Some(switch) = &mut self.switch {
            switch.add_port(slot.port(), mac);
        }
        Ok(slot)
    }

    /// Attaches the network switch: every NIC, attached before or after,
    /// is on the port of its slot index. Its draws come from the ChaCha20
    /// stream keyed by `key`; every link follows `config` until overridden.
    pub fn attach_switch(
        &mut self,
        key: [u8; 32],
        config: NetworkConfig,
    ) -> Result<(), SwitchError> {
        if self.switch.is_some() {
            return Err(SwitchError::AlreadyAttached);
        }
        let mut switch = Switch::new(key, config)?;
        for (port, mac) in self.virtio_net_macs() {
            switch.add_port(port, mac);
        }
        self.switch = Some(switch);
        Ok(())
    }

    /// The switch ports of the attached NICs, in attach order (NIC `i` of the
    /// guest, `eth<i>`, is on the `i`-th).
    pub fn nic_ports(&self) -> Vec<PortId> {
        self.virtio_net_macs()
            .into_iter()
            .map(|(port, _)| port)
            .collect()
    }

    /// The attached NICs' ports and addresses, in slot order.
    fn virtio_net_macs(&self) -> Vec<(PortId, [u8; 6])> {
        let Some(virtio) = &self.virtio else {
            return Vec::new();
        };
        virtio
            .slots
            .iter()
            .enumerate()
            .filter_map(|(index, device)| match device {
                VirtioSlotDevice::Net(transport) => Some((PortId(index), transport.device().mac())),
                _ => None,
            })
            .collect()
    }

    /// The switch, for its counters, ports, partition and frames in flight.
    pub fn switch(&self) -> Option<&Switch> {
        self.switch.as_ref()
    }

    fn switch_mut(&mut self) -> Result<&mut Switch, SwitchError> {
        self.switch.as_mut().ok_or(SwitchError::NotAttached)
    }

    /// Schedules a network fault at virtual time `at` (see
    /// [`Switch::schedule_fault`]); ports are NIC slot indexes.
    pub fn schedule_network_fault(
        &mut self,
        at: VirtNanos,
        fault: Fault,
    ) -> Result<(), SwitchError> {
        self.switch_mut()?.schedule_fault(at, fault)
    }

    /// Sends every frame event of the switch from now on to `tap` (or, with
    /// `None`, nowhere). Observing changes nothing in the run.
    pub fn set_frame_tap(&mut self, tap: Option<Box<dyn FrameTap>>) -> Result<(), SwitchError> {
        self.switch_mut()?.record_frames(tap.is_some());
        self.frame_tap = tap;
        Ok(())
    }

    /// Replaces the default link configuration, for frames sent from now on.
    pub fn set_network_config(&mut self, config: NetworkConfig) -> Result<(), SwitchError> {
        self.switch_mut()?.set_config(config)
    }

    /// Overrides (or, with `None`, stops overriding) the configuration of
    /// the directed link `from` -> `to`, for frames sent from now on.
    pub fn set_link_config(
        &mut self,
        from: PortId,
        to: PortId,
        config: Option<NetworkConfig>,
    ) -> Result<(), SwitchError> {
        self.switch_mut()?.set_link_config(from, to, config)
    }

    /// The counters of the NIC in slot `slot`, if it is one.
    pub fn virtio_net_counters(&self, slot: usize) -> Option<VirtioNetCounters> {
        match self.virtio.as_ref()?.slots.get(slot)? {
            VirtioSlotDevice::Net(transport) => Some(transport.device().counters()),
            _ => None,
        }
    }

    fn attach_virtio(&mut self, device: VirtioSlotDevice) -> Result<VirtioSlot, DevicesError> {
        let virtio = self.virtio.as_mut().ok_or(DevicesError::NoGuestMemory)?;
        let kind = device.kind_name();
        // One NIC and one disk per node; one of every other kind.
        if !matches!(device, VirtioSlotDevice::Net(_) | VirtioSlotDevice::Blk(_))
            && virtio.slots.iter().any(|other| other.kind_name() == kind)
        {
            return Err(DevicesError::VirtioAlreadyAttached { kind });
        }
        let index = virtio.slots.len();
        let slot = VirtioSlot::new(index).ok_or(DevicesError::VirtioSlotsExhausted {
            max: layout::VIRTIO_MMIO_MAX_DEVICES,
        })?;
        self.mmio_bus.insert(
            slot.mmio_base,
            layout::VIRTIO_MMIO_STRIDE,
            DeviceId::Virtio(index),
        )?;
        virtio.slots.push(device);
        Ok(slot)
    }

    /// The attached virtio devices' slots, in attach order.
    pub fn virtio_slots(&self) -> Vec<VirtioSlot> {
        let count = self.virtio.as_ref().map_or(0, |virtio| virtio.slots.len());
        (0..count).filter_map(VirtioSlot::new).collect()
    }

    /// The kernel command-line entries declaring every attached virtio
    /// device, space-separated (empty if there are none).
    pub fn virtio_cmdline(&self) -> String {
        self.virtio_slots()
            .iter()
            .map(VirtioSlot::cmdline_fragment)
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The rule a virtio device's driver broke, for each device now broken,
    /// by slot index.
    pub fn virtio_violations(&self) -> Vec<(usize, VirtioViolation)> {
        let Some(virtio) = &self.virtio else {
            return Vec::new();
        };
        virtio
            .slots
            .iter()
            .enumerate()
            .filter_map(|(index, device)| {
                with_transport!(device, transport => transport.violation()).map(|v| (index, v))
            })
            .collect()
    }

    /// Queues bytes for the guest on the virtio console and delivers, at
    /// `now`, as many as the receive buffers the guest has posted hold
    /// (raising its interrupt); the rest go as the guest posts more. Call
    /// only at deterministic points of the run.
    pub fn enqueue_virtio_console_input(
        &mut self,
        now: VirtNanos,
        bytes: &[u8],
    ) -> Result<(), DevicesError> {
        self.advance_to(now);
        let not_attached = || DevicesError::VirtioNotAttached { kind: "console" };
        let VirtioDevices { memory, slots } = self.virtio.as_mut().ok_or_else(not_attached)?;
        let console = console_of(slots).ok_or_else(not_attached)?;
        console.device_mut().enqueue_input(bytes);
        console.deliver(memory, self.now);
        self.forward_interrupts();
        Ok(())
    }

    /// Everything the guest sent on the virtio console since the last call
    /// (empty if there is no console). Taking it has no guest-visible effect.
    pub fn take_virtio_console_output(&mut self) -> Vec<u8> {
        self.virtio
            .as_mut()
            .and_then(|virtio| console_of(&mut virtio.slots))
            .map(|console| console.device_mut().take_output())
            .unwrap_or_default()
    }

    /// A port read. Each byte of a wide access is decoded on its own (ISA
    /// devices are 8-bit); bytes of ports no device owns read 0xff.
    pub fn pio_read(&mut self, now: VirtNanos, port: u16, data: &mut [u8]) {
        self.advance_to(now);
        let mut any_unowned = false;
        for (i, byte) in data.iter_mut().enumerate() {
            let address = u64::from(port) + i as u64;
            // Port addresses are 16 bits: a wide access at 0xffff does not wrap.
            let owner = (address <= u64::from(u16::MAX))
                .then(|| self.pio_bus.resolve(address))
                .flatten();
            match owner {
                Some((id, offset)) => {
                    let mut one = [0u8];
                    self.dispatch_read(id, offset, &mut one);
                    *byte = one[0];
                }
                None => {
                    *byte = 0xff;
                    any_unowned = true;
                }
            }
        }
        if any_unowned {
            self.unhandled_accesses += 1;
        }
        self.after_access();
    }

    /// A port write; bytes for ports no device owns are dropped.
    pub fn pio_write(&mut self, now: VirtNanos, port: u16, data: &[u8]) {
        self.advance_to(now);
        let mut any_unowned = false;
        for (i, &byte) in data.iter().enumerate() {
            let address = u64::from(port) + i as u64;
            let owner = (address <= u64::from(u16::MAX))
                .then(|| self.pio_bus.resolve(address))
                .flatten();
            match owner {
                Some((id, offset)) => self.dispatch_write(id, offset, &[byte]),
                None => any_unowned = true,
            }
        }
        if any_unowned {
            self.unhandled_accesses += 1;
        }
        self.after_access();
    }

    /// An MMIO read; returns false (and reads all ones) if no device owns `addr`.
    pub fn mmio_read(&mut self, now: VirtNanos, addr: u64, data: &mut [u8]) -> bool {
        self.advance_to(now);
        let owned = match self.mmio_bus.resolve(addr) {
            Some((id, offset)) => {
                self.dispatch_read(id, offset, data);
                true
            }
            None => {
                data.fill(0xff);
                self.unhandled_accesses += 1;
                false
            }
        };
        self.after_access();
        owned
    }

    /// An MMIO write; returns false (and drops it) if no device owns `addr`.
    pub fn mmio_write(&mut self, now: VirtNanos, addr: u64, data: &[u8]) -> bool {
        self.advance_to(now);
        let owned = match self.mmio_bus.resolve(addr) {
            Some((id, offset)) => {
                self.dispatch_write(id, offset, data);
                true
            }
            None => {
                self.unhandled_accesses += 1;
                false
            }
        };
        self.after_access();
        owned
    }

    fn dispatch_read(&mut self, id: DeviceId, offset: u64, data: &mut [u8]) {
        match id {
            DeviceId::PicMaster => self.pic.read(PicPorts::Master, offset, data),
            DeviceId::PicSlave => self.pic.read(PicPorts::Slave, offset, data),
            DeviceId::Elcr => self.pic.read(PicPorts::Elcr, offset, data),
            DeviceId::Com1 => self.serial.read(offset, data),
            DeviceId::Rtc => self.rtc.read(offset, data),
            DeviceId::I8042Data => self.i8042.read(I8042Port::Data, offset, data),
            DeviceId::I8042Command => self.i8042.read(I8042Port::Command, offset, data),
            DeviceId::Post => self.post.read(offset, data),
            DeviceId::AcpiPm1Event => self.acpi_pm.read(AcpiPmBlock::Pm1Event, offset, data),
            DeviceId::AcpiPm1Control => self.acpi_pm.read(AcpiPmBlock::Pm1Control, offset, data),
            DeviceId::AcpiPmTimer => self.acpi_pm.read(AcpiPmBlock::Timer, offset, data),
            DeviceId::Status => self.status_port.read(offset, data),
            // The port only makes an exit (which refreshes the clock page).
            DeviceId::ClockPageExit => data.fill(0),
            DeviceId::Hpet => self.hpet.read(offset, data),
            DeviceId::Virtio(index) => {
                match self
                    .virtio
                    .as_mut()
                    .and_then(|virtio| virtio.slots.get_mut(index))
                {
                    Some(device) => {
                        with_transport!(device, transport => transport.read(offset, data))
                    }
                    None => data.fill(0xff),
                }
            }
        }
    }

    fn dispatch_write(&mut self, id: DeviceId, offset: u64, data: &[u8]) {
        match id {
            DeviceId::PicMaster => self.pic.write(PicPorts::Master, offset, data),
            DeviceId::PicSlave => self.pic.write(PicPorts::Slave, offset, data),
            DeviceId::Elcr => self.pic.write(PicPorts::Elcr, offset, data),
            DeviceId::Com1 => self.serial.write(offset, data),
            DeviceId::Rtc => self.rtc.write(offset, data),
            DeviceId::I8042Data => self.i8042.write(I8042Port::Data, offset, data),
            DeviceId::I8042Command => self.i8042.write(I8042Port::Command, offset, data),
            DeviceId::Post => self.post.write(offset, data),
            DeviceId::AcpiPm1Event => self.acpi_pm.write(AcpiPmBlock::Pm1Event, offset, data),
            DeviceId::AcpiPm1Control => self.acpi_pm.write(AcpiPmBlock::Pm1Control, offset, data),
            DeviceId::AcpiPmTimer => self.acpi_pm.write(AcpiPmBlock::Timer, offset, data),
            DeviceId::Status => self.status_port.write(offset, data),
            DeviceId::ClockPageExit => {}
            DeviceId::Hpet => self.hpet.write(offset, data),
            DeviceId::Virtio(index) => {
                let now = self.now;
                if let Some(VirtioDevices { memory, slots }) = &mut self.virtio {
                    if let Some(device) = slots.get_mut(index) {
                        with_transport!(device, transport => transport.write(offset, data, memory, now));
                    }
                }
            }
        }
    }

    /// Fires what the access made due at the same instant, collects guest
    /// events and forwards interrupt edges.
    fn after_access(&mut self) {
        self.advance_devices();
        self.pending_events.extend(
            self.status_port
                .take_event()
                .into_iter()
                .chain(self.i8042.take_event()),
        );
        self.forward_interrupts();
    }

    fn advance_devices(&mut self) {
        self.hpet.advance_to(self.now);
        self.rtc.advance_to(self.now);
        self.acpi_pm.advance_to(self.now);
        self.advance_network();
        self.advance_disks();
        // The page is read only here, inside a device step, i.e. at a
        // guest-caused exit.
        if let Some(page) = &mut self.clock_page {
            if page.take_due(self.now) {
                self.pic.pulse_irq(layout::IRQ_TIMER);
            }
        }
    }

    /// Submits what the NICs transmitted to the switch at `now`, in slot
    /// order, then delivers every frame due by `now` into its NIC.
    fn advance_network(&mut self) {
        let Some(VirtioDevices { memory, slots }) = &mut self.virtio else {
            return;
        };
        let now = self.now;
        for (index, device) in slots.iter_mut().enumerate() {
            let VirtioSlotDevice::Net(transport) = device else {
                continue;
            };
            let frames = transport.device_mut().take_transmitted();
            let Some(switch) = &mut self.switch else {
                continue;
            };
            for frame in frames {
                // Every NIC is a port of the switch, so this cannot fail.
                let _ = switch.submit(now, PortId(index), frame);
            }
        }
        let Some(switch) = &mut self.switch else {
            return;
        };
        for (port, frame) in switch.due(now) {
            if let Some(VirtioSlotDevice::Net(transport)) = slots.get_mut(port.0) {
                let _: RxOutcome = transport.deliver(frame, memory, now);
            }
        }
        if let Some(tap) = &mut self.frame_tap {
            let mut events = switch.take_frame_events();
            // Drops at submit (now) come before deliveries due earlier:
            // sorted, every batch's events are later than the last batch's.
            events.sort_by_key(|event| event.at);
            for event in &events {
                tap.frame(event);
            }
        }
    }

    /// Turns every interrupt a device raised into an edge on its PIC line.
    /// The order is fixed, though it cannot matter: an edge only sets an IRR bit.
    fn forward_interrupts(&mut self) {
        let hpet_edges = self.hpet.take_irq_edges();
        for line in 0..ISA_IRQ_LINES {
            if hpet_edges & (1 << line) != 0 {
                self.pic.pulse_irq(line);
            }
        }
        if self.rtc.take_irq_edge() && !self.hpet.legacy_replacement() {
            self.pic.pulse_irq(layout::IRQ_RTC);
        }
        if self.serial.take_interrupt() {
            self.pic.pulse_irq(layout::IRQ_COM1);
        }
        if let Some(virtio) = &self.virtio {
            for (index, device) in virtio.slots.iter().enumerate() {
                if let Some(irq) = layout::virtio_mmio_irq(index) {
                    let level = with_transport!(device, transport => transport.interrupt_pending());
                    self.pic.set_irq_level(irq, level);
                }
            }
        }
    }

    /// Advances every device to `now`, firing the timers due at or before it.
    pub fn advance_to(&mut self, now: VirtNanos) {
        self.now = self.now.max(now);
        self.advance_devices();
        self.forward_interrupts();
    }

    /// The earliest virtual time at which a device will raise an interrupt
    /// by itself (HPET timers; the RTC unless the HPET has disconnected it;
    /// the switch's next frame delivery; a disk's delayed FLUSH or scheduled
    /// fault).
    pub fn next_deadline(&self) -> Option<VirtNanos> {
        let rtc = if self.hpet.legacy_replacement() {
            None
        } else {
            self.rtc.next_deadline()
        };
        let network = self.switch.as_ref().and_then(Switch::next_deadline);
        let disks = self
            .disks()
            .filter_map(|transport| transport.device().next_deadline())
            .min();
        let clock_page = self.clock_page.as_ref().and_then(ClockPage::deadline);
        [self.hpet.next_deadline(), rtc, network, disks, clock_page]
            .into_iter()
            .flatten()
            .min()
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

    /// Checks that `state`'s switch (if any) has exactly the state's NICs
    /// as ports, with their addresses, and carries frames between them only.
    /// (Every other switch state is valid, see [`Switch::from_state`].)
    fn validate_switch(state: &DevicesState) -> Result<(), RestoreError> {
        let Some(switch) = &state.switch else {
            return Ok(());
        };
        let nics: Vec<(PortId, [u8; 6])> = state
            .virtio
            .iter()
            .enumerate()
            .filter_map(|(index, device)| match &device.backend {
                VirtioBackendState::Net(net) => Some((PortId(index), net.mac)),
                _ => None,
            })
            .collect();
        let ports: Vec<(PortId, [u8; 6])> = switch
            .ports
            .iter()
            .map(|(&port, saved)| (port, saved.mac))
            .collect();
        if let Some(&(port, _)) = ports
            .iter()
            .find(|port| !nics.contains(port))
            .or_else(|| nics.iter().find(|nic| !ports.contains(nic)))
        {
            return Err(RestoreError::SwitchPortMismatch { port: port.0 });
        }
        let is_port = |port: &PortId| switch.ports.contains_key(port);
        let named = switch
            .in_flight
            .values()
            .flat_map(|frame| [frame.from, frame.to])
            .chain(switch.blocked.iter().flat_map(|&(from, to)| [from, to]))
            .chain(switch.port_latency.keys().copied())
            .chain(switch.port_loss.keys().copied())
            .chain(
                switch
                    .link_configs
                    .iter()
                    .flat_map(|(from, links)| std::iter::once(*from).chain(links.keys().copied())),
            );
        for port in named {
            if !is_port(&port) {
                return Err(RestoreError::SwitchUnknownPort { port: port.0 });
            }
        }
        Ok(())
    }
}

/// Every device, the machine's own state (time, events not yet taken, the
/// count of unhandled accesses) and the switch. The console writer is kept.
impl Persist for Devices {
    type State = DevicesState;

    fn save(&self) -> DevicesState {
        DevicesState {
            now: self.now,
            pic: self.pic.save(),
            hpet: self.hpet.save(),
            rtc: self.rtc.save(),
            acpi_pm: self.acpi_pm.save(),
            serial: self.serial.save(),
            status_port: self.status_port.save(),
            i8042: self.i8042.save(),
            pending_events: self.pending_events.iter().copied().collect(),
            unhandled_accesses: self.unhandled_accesses,
            virtio: self
                .virtio
                .as_ref()
                .map_or_else(Vec::new, VirtioDevices::save),
            switch: self.switch.as_ref().map(Switch::save),
            clock_page: self.clock_page.is_some(),
        }
    }

    fn validate(&self, state: &DevicesState) -> Result<(), RestoreError> {
        self.pic.validate(&state.pic)?;
        self.hpet.validate(&state.hpet)?;
        self.rtc.validate(&state.rtc)?;
        self.acpi_pm.validate(&state.acpi_pm)?;
        self.serial.validate(&state.serial)?;
        self.status_port.validate(&state.status_port)?;
        self.i8042.validate(&state.i8042)?;
        if state.clock_page != self.clock_page.is_some() {
            return Err(RestoreError::ClockPage {
                saved: state.clock_page,
                machine: self.clock_page.is_some(),
            });
        }
        match &self.virtio {
            Some(virtio) => virtio.validate(&state.virtio)?,
            None if state.virtio.is_empty() => {}
            None => {
                return Err(RestoreError::VirtioDeviceCount {
                    len: state.virtio.len(),
                    expected: 0,
                })
            }
        }
        Self::validate_switch(state)
    }

    /// Restores every device. The state is checked first, so on error
    /// nothing has changed.
    fn restore(&mut self, state: &DevicesState) -> Result<(), RestoreError> {
        self.validate(state)?;
        self.now = state.now;
        self.pic.restore(&state.pic)?;
        self.hpet.restore(&state.hpet)?;
        self.rtc.restore(&state.rtc)?;
        self.acpi_pm.restore(&state.acpi_pm)?;
        self.serial.restore(&state.serial)?;
        self.status_port.restore(&state.status_port)?;
        self.i8042.restore(&state.i8042)?;
        self.pending_events = state.pending_events.iter().copied().collect();
        self.unhandled_accesses = state.unhandled_accesses;
        if let Some(virtio) = &mut self.virtio {
            virtio.restore(&state.virtio)?;
        }
        // The switch holds no host resource: the state describes all of it,
        // so a state without one leaves the machine without one.
        self.switch = state.switch.as_ref().map(Switch::from_state);
        if let (Some(switch), Some(_)) = (&mut self.switch, &self.frame_tap) {
            switch.record_frames(true);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::{DiskCommand, DiskImage};
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    const EPOCH_2024: i64 = 1_704_067_200;
    const MASTER_VECTOR_BASE: u8 = 0x30;
    const SLAVE_VECTOR_BASE: u8 = 0x38;
    const HPET: u64 = layout::HPET_BASE;

    #[derive(Clone, Default)]
    struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedBuffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn new_devices() -> (Devices, SharedBuffer) {
        let output = SharedBuffer::default();
        let devices = Devices::new(
            DevicesConfig {
                rtc_epoch_unix_secs: EPOCH_2024,
            },
            Box::new(output.clone()),
        );
        (devices, output)
    }

    fn outb(devices: &mut Devices, now: u64, port: u16, value: u8) {
        devices.pio_write(VirtNanos(now), port, &[value]);
    }

    fn inb(devices: &mut Devices, now: u64, port: u16) -> u8 {
        let mut data = [0u8];
        devices.pio_read(VirtNanos(now), port, &mut data);
        data[0]
    }

    fn writel(devices: &mut Devices, now: u64, offset: u64, value: u32) {
        assert!(devices.mmio_write(VirtNanos(now), HPET + offset, &value.to_le_bytes()));
    }

    fn readl(devices: &mut Devices, now: u64, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        assert!(devices.mmio_read(VirtNanos(now), HPET + offset, &mut data));
        u32::from_le_bytes(data)
    }

    /// init_8259A(0), then unmask `master_mask`/`slave_mask`.
    fn init_pic(devices: &mut Devices, master_mask: u8, slave_mask: u8) {
        for (port, value) in [
            (0x21, 0xff),
            (0xa1, 0xff),
            (0x20, 0x11),
            (0x21, MASTER_VECTOR_BASE),
            (0x21, 0x04),
            (0x21, 0x01),
            (0xa0, 0x11),
            (0xa1, SLAVE_VECTOR_BASE),
            (0xa1, 0x02),
            (0xa1, 0x01),
            (0xa1, slave_mask),
            (0x21, master_mask),
        ] {
            outb(devices, 0, port, value);
        }
    }

    /// hpet_enable() with legacy routing, then timer 0 in one-shot mode.
    fn enable_hpet_oneshot(devices: &mut Devices, now: u64) {
        writel(devices, now, 0x010, 0);
        writel(devices, now, 0x0f0, 0);
        writel(devices, now, 0x0f4, 0);
        writel(devices, now, 0x010, 0x3);
        writel(devices, now, 0x100, (1 << 2) | (1 << 8));
    }

    #[test]
    fn test_devices_are_send() {
        // Arrange
        fn assert_send<T: Send>() {}

        // Act / Assert
        assert_send::<Devices>();
    }

    #[test]
    fn test_devices_serial_output_reaches_writer() {
        // Arrange
        let (mut devices, output) = new_devices();

        // Act
        for &byte in b"boot ok\n" {
            outb(&mut devices, 100, 0x3f8, byte);
        }

        // Assert
        assert_eq!(output.0.lock().unwrap().as_slice(), b"boot ok\n");
    }

    #[test]
    fn test_devices_serial_thre_interrupt_reaches_pic_on_irq4() {
        // Arrange
        let (mut devices, _output) = new_devices();
        init_pic(&mut devices, 0xeb, 0xff);

        // Act
        outb(&mut devices, 10, 0x3f9, 0x02); // IER: THRE interrupt
        let pending = devices.has_pending_interrupt();
        let vector = devices.acknowledge_interrupt();

        // Assert
        assert!(pending);
        assert_eq!(vector, Some(MASTER_VECTOR_BASE + 4));
    }

    #[test]
    fn test_devices_console_input_raises_irq4_and_is_readable() {
        // Arrange
        let (mut devices, _output) = new_devices();
        init_pic(&mut devices, 0xeb, 0xff);
        outb(&mut devices, 0, 0x3f9, 0x01); // IER: received data

        // Act
        devices.enqueue_console_input(b"ls\n");
        let vector = devices.acknowledge_interrupt();
        let received: Vec<u8> = (0..3).map(|_| inb(&mut devices, 5, 0x3f8)).collect();

        // Assert
        assert_eq!(vector, Some(MASTER_VECTOR_BASE + 4));
        assert_eq!(received, b"ls\n");
    }

    #[test]
    fn test_devices_hpet_oneshot_fires_irq0_at_deadline() {
        // Arrange
        let (mut devices, _output) = new_devices();
        init_pic(&mut devices, 0xfa, 0xff);
        enable_hpet_oneshot(&mut devices, 1_000);
        let counter = readl(&mut devices, 2_000, 0x0f0);
        writel(&mut devices, 2_000, 0x108, counter + 1_000);

        // Act
        let deadline = devices.next_deadline();
        devices.advance_to(VirtNanos(11_999));
        let early = devices.has_pending_interrupt();
        devices.advance_to(VirtNanos(12_000));
        let on_time = devices.has_pending_interrupt();

        // Assert
        assert_eq!(counter, 100);
        assert_eq!(deadline, Some(VirtNanos(12_000)));
        assert!(!early);
        assert!(on_time);
        assert_eq!(devices.acknowledge_interrupt(), Some(MASTER_VECTOR_BASE));
        assert_eq!(
            devices.next_deadline(),
            Some(VirtNanos(12_000 + (1 << 32) * 10))
        );
    }

    #[test]
    fn test_devices_access_fires_due_timer_before_serving() {
        // Arrange
        let (mut devices, _output) = new_devices();
        init_pic(&mut devices, 0xfa, 0xff);
        enable_hpet_oneshot(&mut devices, 0);
        writel(&mut devices, 0, 0x108, 50);

        // Act: an unrelated access at a later time.
        let irr = {
            outb(&mut devices, 600, 0x20, 0x0a);
            inb(&mut devices, 600, 0x20)
        };

        // Assert
        assert_eq!(irr & 0x01, 0x01);
    }

    #[test]
    fn test_devices_hpet_timer1_reaches_irq8_through_cascade() {
        // Arrange
        let (mut devices, _output) = new_devices();
        init_pic(&mut devices, 0xfb, 0xfe);
        enable_hpet_oneshot(&mut devices, 0);
        writel(&mut devices, 0, 0x120, (1 << 2) | (1 << 8));

        // Act
        writel(&mut devices, 0, 0x128, 10);
        devices.advance_to(VirtNanos(100));

        // Assert
        assert_eq!(devices.acknowledge_interrupt(), Some(SLAVE_VECTOR_BASE));
    }

    #[test]
    fn test_devices_rtc_interrupt_disconnected_in_hpet_legacy_mode() {
        // Arrange
        let (mut devices, _output) = new_devices();
        init_pic(&mut devices, 0xfb, 0xfe);
        outb(&mut devices, 0, 0x70, 0x0b);
        outb(&mut devices, 0, 0x71, 0x12); // 24h, UIE
        let rtc_deadline = devices.next_deadline();

        // Act
        enable_hpet_oneshot(&mut devices, 0);
        let deadline_in_legacy_mode = devices.next_deadline();
        devices.advance_to(VirtNanos::from_secs(2));

        // Assert
        assert_eq!(rtc_deadline, Some(VirtNanos::from_secs(1)));
        assert_eq!(
            deadline_in_legacy_mode,
            Some(VirtNanos((0xffff_ffffu64) * 10))
        );
        assert!(!devices.has_pending_interrupt());
    }

    #[test]
    fn test_devices_rtc_update_interrupt_reaches_irq8() {
        // Arrange
        let (mut devices, _output) = new_devices();
        init_pic(&mut devices, 0xfb, 0xfe);
        outb(&mut devices, 0, 0x70, 0x0b);
        outb(&mut devices, 0, 0x71, 0x12);

        // Act
        devices.advance_to(VirtNanos::from_secs(1));

        // Assert
        assert_eq!(devices.acknowledge_interrupt(), Some(SLAVE_VECTOR_BASE));
    }

    #[test]
    fn test_devices_rtc_reads_time_through_ports() {
        // Arrange
        let (mut devices, _output) = new_devices();

        // Act
        outb(&mut devices, 90_000_000_000, 0x70, 0x00);
        let seconds = inb(&mut devices, 90_000_000_000, 0x71);
        outb(&mut devices, 90_000_000_000, 0x70, 0x02);
        let minutes = inb(&mut devices, 90_000_000_000, 0x71);

        // Assert
        assert_eq!((minutes, seconds), (0x01, 0x30));
    }

    #[test]
    fn test_devices_pm_timer_reads_as_32_bit_port() {
        // Arrange
        let (mut devices, _output) = new_devices();
        let mut data = [0u8; 4];

        // Act
        devices.pio_read(VirtNanos::from_secs(1), 0x608, &mut data);

        // Assert
        assert_eq!(u32::from_le_bytes(data), 3_579_545);
    }

    #[test]
    fn test_devices_status_port_write_records_exit() {
        // Arrange
        let (mut devices, _output) = new_devices();

        // Act
        outb(&mut devices, 5, layout::STATUS_PORT, 7);

        // Assert
        assert_eq!(devices.take_event(), Some(GuestEvent::Exit(7)));
        assert_eq!(devices.take_event(), None);
    }

    #[test]
    fn test_devices_i8042_reset_records_reset() {
        // Arrange
        let (mut devices, _output) = new_devices();

        // Act
        let status = inb(&mut devices, 5, 0x64);
        outb(&mut devices, 5, 0x64, 0xfe);

        // Assert
        assert_eq!(status, 0);
        assert_eq!(devices.take_event(), Some(GuestEvent::Reset));
    }

    #[test]
    fn test_devices_events_are_taken_in_order() {
        // Arrange
        let (mut devices, _output) = new_devices();

        // Act
        outb(&mut devices, 5, 0x64, 0xfe);
        outb(&mut devices, 6, layout::STATUS_PORT, 1);

        // Assert
        assert_eq!(devices.take_event(), Some(GuestEvent::Reset));
        assert_eq!(devices.take_event(), Some(GuestEvent::Exit(1)));
    }

    #[test]
    fn test_devices_unowned_port_reads_all_ones_and_is_counted() {
        // Arrange
        let (mut devices, _output) = new_devices();
        let mut data = [0u8; 4];

        // Act
        devices.pio_read(VirtNanos(1), 0x40, &mut data);
        devices.pio_write(VirtNanos(1), 0x43, &[0x34]);
        outb(&mut devices, 1, 0x80, 0x55);

        // Assert
        assert_eq!(data, [0xff; 4]);
        assert_eq!(devices.unhandled_accesses(), 2);
    }

    #[test]
    fn test_devices_unowned_mmio_returns_false() {
        // Arrange
        let (mut devices, _output) = new_devices();
        let mut data = [0u8; 8];

        // Act
        let read_owned = devices.mmio_read(VirtNanos(1), 0xfee0_0000, &mut data);
        let write_owned = devices.mmio_write(VirtNanos(1), 0, &[1]);

        // Assert
        assert!(!read_owned);
        assert!(!write_owned);
        assert_eq!(data, [0xff; 8]);
        assert_eq!(devices.unhandled_accesses(), 2);
    }

    #[test]
    fn test_devices_wide_pio_access_crossing_into_unowned_ports() {
        // Arrange
        let (mut devices, _output) = new_devices();
        let mut data = [0u8; 4];

        // Act: 0x3fe-0x401; only 0x3fe and 0x3ff are COM1's.
        devices.pio_read(VirtNanos(1), 0x3fe, &mut data);

        // Assert
        assert_eq!(data[2..], [0xff, 0xff]);
        assert_eq!(devices.unhandled_accesses(), 1);
    }

    #[test]
    fn test_devices_any_access_never_panics() {
        // Arrange
        let (mut devices, _output) = new_devices();
        let ports = [
            0x0000u16, 0x20, 0x21, 0x60, 0x64, 0x70, 0x71, 0x80, 0xa0, 0xa1, 0x3f8, 0x3ff, 0x4d0,
            0x4d1, 0x600, 0x603, 0x604, 0x605, 0x608, 0x60b, 0x610, 0xfffc, 0xffff,
        ];
        let addresses = [
            HPET,
            HPET + 1,
            HPET + 0x0f4,
            HPET + 0x108,
            HPET + 0x3ff,
            HPET + 0x400,
            u64::MAX,
            u64::MAX - 7,
        ];

        // Act
        for size in 0..=8 {
            for &port in &ports {
                let mut data = vec![0xa5u8; size];
                devices.pio_read(VirtNanos(size as u64), port, &mut data);
                devices.pio_write(VirtNanos(size as u64), port, &data);
            }
            for &address in &addresses {
                let mut data = vec![0x5au8; size];
                devices.mmio_read(VirtNanos(size as u64), address, &mut data);
                devices.mmio_write(VirtNanos(size as u64), address, &data);
            }
        }

        // Assert: reaching here is the point; the machine still works.
        devices.advance_to(VirtNanos(u64::MAX));
        let _ = devices.next_deadline();
        let _ = devices.acknowledge_interrupt();
    }

    #[test]
    fn test_devices_time_never_moves_backwards() {
        // Arrange
        let (mut devices, _output) = new_devices();
        devices.advance_to(VirtNanos::from_secs(2));

        // Act
        let mut data = [0u8; 4];
        devices.pio_read(VirtNanos::from_secs(1), 0x608, &mut data);

        // Assert
        assert_eq!(u32::from_le_bytes(data), (2 * 3_579_545) & 0xff_ffff);
    }

    /// Every legacy device in use: interrupts unmasked, the HPET armed,
    /// serial input pending, CMOS written, an exit and an unhandled access.
    fn use_devices(devices: &mut Devices) {
        init_pic(devices, 0xea, 0xfe);
        enable_hpet_oneshot(devices, 1_000);
        writel(devices, 2_000, 0x108, 5_000);
        outb(devices, 3_000, 0x3f9, 0x03);
        devices.enqueue_console_input(b"input");
        outb(devices, 3_000, 0x70, 0x40);
        outb(devices, 3_000, 0x71, 0x99);
        outb(devices, 3_000, layout::STATUS_PORT, 3);
        devices.pio_read(VirtNanos(3_000), 0x61, &mut [0u8]);
    }

    fn used_devices() -> Devices {
        let (mut devices, _output) = new_devices();
        use_devices(&mut devices);
        devices
    }

    /// Time moved on, the interrupt and exit taken, serial input read,
    /// CMOS and the HPET written.
    fn change_devices(devices: &mut Devices) {
        devices.advance_to(VirtNanos::from_secs(100));
        devices.acknowledge_interrupt();
        devices.take_event();
        inb(devices, 100, 0x3f8);
        outb(devices, 100, 0x70, 0x40);
        outb(devices, 100, 0x71, 0x00);
        writel(devices, 100, 0x010, 0);
    }

    crate::persist::persist_round_trip_tests! {
        mod devices_persist {
            fresh: new_devices().0,
            saved: used_devices(),
            mutate: change_devices,
        }
    }

    #[test]
    fn test_devices_restore_keeps_the_console_writer() {
        // Arrange
        let (mut devices, output) = new_devices();
        use_devices(&mut devices);
        let saved = devices.save();
        change_devices(&mut devices);

        // Act
        devices.restore(&saved).unwrap();
        outb(&mut devices, 3_000, 0x3f8, b'!');

        // Assert
        assert_eq!(output.0.lock().unwrap().as_slice(), b"!");
    }

    #[test]
    fn test_devices_restore_of_invalid_state_changes_nothing() {
        // Arrange
        let (mut devices, _output) = new_devices();
        outb(&mut devices, 5, 0x70, 0x40);
        outb(&mut devices, 5, 0x71, 0x77);
        let before = devices.save();
        let mut invalid = devices.save();
        invalid.pic.master.imr = 0x00;
        invalid.serial.in_buffer = vec![0; 1_000];

        // Act
        let result = devices.restore(&invalid);

        // Assert
        assert!(matches!(
            result,
            Err(RestoreError::SerialFifoOverflow { len: 1_000, .. })
        ));
        assert_eq!(devices.save(), before);
    }

    // Virtio devices.

    use crate::virtio::mmio::{INTERRUPT_CONFIG_CHANGE, INTERRUPT_USED_BUFFER};
    use crate::virtio::testing::{
        self as virtio_testing, initialize, read_bytes, readable, writable, write_bytes,
        DriverQueue, Registers, DATA_BASE, QUEUE0_BASE, QUEUE1_BASE, REG_INTERRUPT_ACK,
        REG_INTERRUPT_STATUS, REG_MAGIC, REG_QUEUE_NOTIFY,
    };
    use crate::virtio::{QueueFault, VirtioViolation};
    use rand_chacha::ChaCha20Rng;
    use rand_core::{RngCore, SeedableRng};

    const RNG_KEY: [u8; 32] = [0x42; 32];
    const VIRTIO0: u64 = layout::VIRTIO_MMIO_BASE;
    const VIRTIO1: u64 = layout::VIRTIO_MMIO_BASE + layout::VIRTIO_MMIO_STRIDE;
    /// IRQ2 (cascade), IRQ5 and IRQ6 unmasked.
    const MASTER_MASK_VIRTIO: u8 = !((1 << 2) | (1 << 5) | (1 << 6));

    /// Register access to a virtio window through `Devices::mmio_*`.
    struct Window<'a> {
        devices: &'a mut Devices,
        base: u64,
        now: u64,
    }

    impl Registers for Window<'_> {
        fn write32(&mut self, offset: u64, value: u32) {
            assert!(self.devices.mmio_write(
                VirtNanos(self.now),
                self.base + offset,
                &value.to_le_bytes()
            ));
        }

        fn read32(&mut self, offset: u64) -> u32 {
            let mut data = [0u8; 4];
            assert!(self
                .devices
                .mmio_read(VirtNanos(self.now), self.base + offset, &mut data));
            u32::from_le_bytes(data)
        }
    }

    fn window(devices: &mut Devices, base: u64) -> Window<'_> {
        Window {
            devices,
            base,
            now: 1_000,
        }
    }

    /// Devices with an rng in slot 0 and a console in slot 1, both
    /// initialized, and the PIC set up with IRQ5 and IRQ6 unmasked.
    struct VirtioMachine {
        devices: Devices,
        mem: GuestMemory,
        rng_queue: DriverQueue,
        receiveq: DriverQueue,
        transmitq: DriverQueue,
    }

    fn virtio_machine() -> VirtioMachine {
        let (mut devices, _output) = new_devices();
        let mem = virtio_testing::test_memory();
        devices.attach_guest_memory(mem.clone());
        devices.attach_virtio_rng(RNG_KEY).unwrap();
        devices.attach_virtio_console().unwrap();
        init_pic(&mut devices, MASTER_MASK_VIRTIO, 0xff);
        let rng_queue = DriverQueue::new(QUEUE0_BASE, 16);
        let receiveq = DriverQueue::new(QUEUE1_BASE, 16);
        let transmitq = DriverQueue::new(QUEUE1_BASE + 0x1000, 16);
        initialize(&mut window(&mut devices, VIRTIO0), &[&rng_queue]);
        initialize(&mut window(&mut devices, VIRTIO1), &[&receiveq, &transmitq]);
        VirtioMachine {
            devices,
            mem,
            rng_queue,
            receiveq,
            transmitq,
        }
    }

    fn rng_stream(len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        ChaCha20Rng::from_seed(RNG_KEY).fill_bytes(&mut bytes);
        bytes
    }

    #[test]
    fn test_devices_virtio_attach_requires_guest_memory() {
        // Arrange
        let (mut devices, _output) = new_devices();

        // Act
        let result = devices.attach_virtio_rng(RNG_KEY);

        // Assert
        assert_eq!(result, Err(DevicesError::NoGuestMemory));
        assert_eq!(devices.virtio_cmdline(), "");
        assert!(devices.save().virtio.is_empty());
    }

    #[test]
    fn test_devices_virtio_slots_and_cmdline() {
        // Arrange
        let (mut devices, _output) = new_devices();
        devices.attach_guest_memory(virtio_testing::test_memory());

        // Act
        let rng = devices.attach_virtio_rng(RNG_KEY).unwrap();
        let console = devices.attach_virtio_console().unwrap();

        // Assert
        assert_eq!((rng.index, rng.mmio_base, rng.irq), (0, 0xd000_0000, 5));
        assert_eq!(
            (console.index, console.mmio_base, console.irq),
            (1, 0xd000_1000, 6)
        );
        assert_eq!(devices.virtio_slots(), [rng, console]);
        assert_eq!(
            devices.virtio_cmdline(),
            "virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6"
        );
    }

    #[test]
    fn test_devices_virtio_same_kind_twice_is_an_error() {
        // Arrange
        let (mut devices, _output) = new_devices();
        devices.attach_guest_memory(virtio_testing::test_memory());
        devices.attach_virtio_console().unwrap();

        // Act
        let result = devices.attach_virtio_console();

        // Assert
        assert_eq!(
            result,
            Err(DevicesError::VirtioAlreadyAttached { kind: "console" })
        );
        assert_eq!(devices.virtio_slots().len(), 1);
    }

    #[test]
    fn test_devices_disks_are_numbered_and_their_faults_are_deadlines() {
        // Arrange
        let (mut devices, _output) = new_devices();
        devices.attach_guest_memory(virtio_testing::test_memory());
        let image = || Arc::new(DiskImage::from_bytes(&[0; 16 * 4096], "digest".into()).unwrap());
        devices.attach_virtio_console().unwrap();
        let first = devices.attach_virtio_blk(image(), "disk-a").unwrap();
        devices.attach_virtio_blk(image(), "disk-b").unwrap();

        // Act
        devices
            .schedule_disk(1, VirtNanos(5_000), DiskCommand::Crash)
            .unwrap();
        let deadline = devices.next_deadline();
        devices.advance_to(VirtNanos(5_000));
        let after = devices.next_deadline();
        let ended = devices.end_disk_crash(1);
        let missing = devices.schedule_disk(2, VirtNanos(1), DiskCommand::Crash);

        // Assert
        assert_eq!((first.index, first.irq), (1, 6));
        assert_eq!(deadline, Some(VirtNanos(5_000)));
        assert_eq!(after, None);
        assert_eq!(ended, Ok(true), "the crash was applied at its time");
        assert_eq!(devices.end_disk_crash(0), Ok(false));
        assert_eq!(missing, Err(DevicesError::NoSuchDisk { disk: 2 }));
        assert!(devices.disk_counters(1).is_some());
    }

    #[test]
    fn test_devices_virtio_windows_are_on_the_mmio_bus() {
        // Arrange
        let mut machine = virtio_machine();
        let mut data = [0u8; 4];

        // Act
        let magic0 = window(&mut machine.devices, VIRTIO0).read32(REG_MAGIC);
        let magic1 = window(&mut machine.devices, VIRTIO1).read32(REG_MAGIC);
        let beyond = machine.devices.mmio_read(
            VirtNanos(1),
            layout::VIRTIO_MMIO_BASE + 2 * layout::VIRTIO_MMIO_STRIDE,
            &mut data,
        );

        // Assert
        assert_eq!((magic0, magic1), (0x7472_6976, 0x7472_6976));
        assert!(!beyond);
    }

    #[test]
    fn test_devices_virtio_rng_end_to_end_raises_irq5_as_a_level() {
        // Arrange
        let mut machine = virtio_machine();
        machine
            .rng_queue
            .add_chain(&machine.mem, &[writable(DATA_BASE, 24)]);

        // Act
        window(&mut machine.devices, VIRTIO0).write32(REG_QUEUE_NOTIFY, 0);
        let vector = machine.devices.acknowledge_interrupt();
        outb(&mut machine.devices, 2_000, 0x20, 0x20); // EOI
        let pending_while_status_set = machine.devices.has_pending_interrupt();
        window(&mut machine.devices, VIRTIO0).write32(REG_INTERRUPT_ACK, INTERRUPT_USED_BUFFER);
        machine
            .rng_queue
            .add_chain(&machine.mem, &[writable(DATA_BASE + 24, 8)]);
        window(&mut machine.devices, VIRTIO0).write32(REG_QUEUE_NOTIFY, 0);
        let second_vector = machine.devices.acknowledge_interrupt();

        // Assert
        assert_eq!(vector, Some(MASTER_VECTOR_BASE + 5));
        assert!(!pending_while_status_set);
        assert_eq!(second_vector, Some(MASTER_VECTOR_BASE + 5));
        assert_eq!(machine.rng_queue.take_used(&machine.mem), [(0, 24), (1, 8)]);
        assert_eq!(read_bytes(&machine.mem, DATA_BASE, 32), rng_stream(32));
    }

    #[test]
    fn test_devices_virtio_console_end_to_end_on_irq6() {
        // Arrange
        let mut machine = virtio_machine();
        machine
            .receiveq
            .add_chain(&machine.mem, &[writable(DATA_BASE, 64)]);
        window(&mut machine.devices, VIRTIO1).write32(REG_QUEUE_NOTIFY, 0);
        write_bytes(&machine.mem, DATA_BASE + 0x100, b"agent ready\n");
        machine
            .transmitq
            .add_chain(&machine.mem, &[readable(DATA_BASE + 0x100, 12)]);

        // Act
        window(&mut machine.devices, VIRTIO1).write32(REG_QUEUE_NOTIFY, 1);
        let output = machine.devices.take_virtio_console_output();
        let transmit_vector = machine.devices.acknowledge_interrupt();
        outb(&mut machine.devices, 2_000, 0x20, 0x20);
        window(&mut machine.devices, VIRTIO1).write32(REG_INTERRUPT_ACK, INTERRUPT_USED_BUFFER);
        machine
            .devices
            .enqueue_virtio_console_input(VirtNanos(3_000), b"run node-1\n")
            .unwrap();
        let receive_vector = machine.devices.acknowledge_interrupt();

        // Assert
        assert_eq!(output, b"agent ready\n");
        assert_eq!(transmit_vector, Some(MASTER_VECTOR_BASE + 6));
        assert_eq!(receive_vector, Some(MASTER_VECTOR_BASE + 6));
        assert_eq!(machine.receiveq.take_used(&machine.mem), [(0, 11)]);
        assert_eq!(read_bytes(&machine.mem, DATA_BASE, 11), b"run node-1\n");
        assert!(machine.devices.take_virtio_console_output().is_empty());
    }

    #[test]
    fn test_devices_virtio_violation_raises_config_interrupt_and_is_reported() {
        // Arrange
        let mut machine = virtio_machine();
        machine
            .rng_queue
            .add_chain(&machine.mem, &[readable(DATA_BASE, 8)]);

        // Act
        window(&mut machine.devices, VIRTIO0).write32(REG_QUEUE_NOTIFY, 0);
        let vector = machine.devices.acknowledge_interrupt();
        let interrupt_status = window(&mut machine.devices, VIRTIO0).read32(REG_INTERRUPT_STATUS);

        // Assert
        assert_eq!(vector, Some(MASTER_VECTOR_BASE + 5));
        assert_eq!(interrupt_status, INTERRUPT_CONFIG_CHANGE);
        assert_eq!(
            machine.devices.virtio_violations(),
            [(
                0,
                VirtioViolation::Queue {
                    queue: 0,
                    fault: QueueFault::ReadOnlyDescriptor { index: 0 },
                }
            )]
        );
    }

    #[test]
    fn test_devices_enqueue_virtio_console_input_without_console_is_an_error() {
        // Arrange
        let (mut devices, _output) = new_devices();

        // Act
        let result = devices.enqueue_virtio_console_input(VirtNanos(1), b"x");

        // Assert
        assert_eq!(
            result,
            Err(DevicesError::VirtioNotAttached { kind: "console" })
        );
        assert!(devices.take_virtio_console_output().is_empty());
    }

    /// One rng request and one console message, as a deterministic workload.
    fn virtio_workload(machine: &mut VirtioMachine, data: u64) {
        machine
            .rng_queue
            .add_chain(&machine.mem, &[writable(data, 16)]);
        window(&mut machine.devices, VIRTIO0).write32(REG_QUEUE_NOTIFY, 0);
        write_bytes(&machine.mem, data + 0x100, b"tick");
        machine
            .transmitq
            .add_chain(&machine.mem, &[readable(data + 0x100, 4)]);
        window(&mut machine.devices, VIRTIO1).write32(REG_QUEUE_NOTIFY, 1);
    }

    #[test]
    fn test_devices_virtio_state_round_trip() {
        // Arrange
        let mut machine = virtio_machine();
        virtio_workload(&mut machine, DATA_BASE);
        machine
            .devices
            .enqueue_virtio_console_input(VirtNanos(2_000), b"pending")
            .unwrap();
        let saved = machine.devices.save();
        let json = serde_json::to_string(&saved).unwrap();
        let (rng_queue, transmitq) = (machine.rng_queue.clone(), machine.transmitq.clone());
        let memory_at_save = read_bytes(&machine.mem, 0, virtio_testing::MEMORY_SIZE as usize);
        virtio_workload(&mut machine, DATA_BASE + 0x1000);
        let first_continuation = read_bytes(&machine.mem, DATA_BASE + 0x1000, 16);

        // Act: rewind devices and memory, then run the same continuation.
        machine
            .devices
            .restore(&serde_json::from_str(&json).unwrap())
            .unwrap();
        let restored_state = machine.devices.save();
        write_bytes(&machine.mem, 0, &memory_at_save);
        machine.rng_queue = rng_queue;
        machine.transmitq = transmitq;
        virtio_workload(&mut machine, DATA_BASE + 0x1000);

        // Assert
        assert_eq!(restored_state, saved);
        assert_eq!(saved.virtio.len(), 2);
        assert_eq!(saved.virtio[0].transport.queues[0].next_avail, 1);
        assert!(saved.virtio[1].transport.queues.iter().all(|q| q.ready));
        assert_eq!(
            read_bytes(&machine.mem, DATA_BASE + 0x1000, 16),
            first_continuation
        );
        assert_eq!(first_continuation, rng_stream(32)[16..]);
        assert_eq!(machine.devices.take_virtio_console_output(), b"ticktick");
    }

    #[test]
    fn test_devices_virtio_restore_of_mismatched_state_changes_nothing() {
        // Arrange
        let mut machine = virtio_machine();
        let before = machine.devices.save();
        let mut too_few = before.clone();
        too_few.virtio.pop();
        let mut swapped = before.clone();
        swapped.virtio.swap(0, 1);
        let mut bad_queue = before.clone();
        bad_queue.virtio[1].transport.queues[1].size = 5;
        bad_queue.pic.master.imr = 0;

        // Act
        let results = [
            machine.devices.restore(&too_few),
            machine.devices.restore(&swapped),
            machine.devices.restore(&bad_queue),
        ];

        // Assert
        assert_eq!(
            results[0],
            Err(RestoreError::VirtioDeviceCount {
                len: 1,
                expected: 2
            })
        );
        assert_eq!(
            results[1],
            Err(RestoreError::VirtioDeviceKind {
                found: "console",
                expected: "rng"
            }
            .in_virtio_slot(0))
        );
        let bad_queue_message = results[2].as_ref().unwrap_err().to_string();
        assert!(
            bad_queue_message.starts_with("virtio slot 1: queue 1: virtqueue state is invalid: "),
            "{bad_queue_message}"
        );
        assert_eq!(machine.devices.save(), before);
    }

    #[test]
    fn test_devices_state_saved_without_virtio_still_restores() {
        // Arrange
        let (mut devices, _output) = new_devices();
        let mut json: serde_json::Value = serde_json::to_value(devices.save()).unwrap();
        json.as_object_mut().unwrap().remove("virtio");

        // Act
        let state: DevicesState = serde_json::from_value(json).unwrap();
        let result = devices.restore(&state);

        // Assert
        assert_eq!(result, Ok(()));
        assert!(state.virtio.is_empty());
    }

    #[test]
    fn test_devices_virtio_any_access_never_panics() {
        // Arrange
        let mut machine = virtio_machine();
        let mut garbage = 0x2545_f491_4f6c_dd1du64;

        // Act: every offset of both windows, every size, garbage values.
        for base in [VIRTIO0, VIRTIO1] {
            for offset in (0..layout::VIRTIO_MMIO_STRIDE).step_by(2) {
                for size in [1usize, 2, 4, 8] {
                    garbage ^= garbage << 13;
                    garbage ^= garbage >> 7;
                    garbage ^= garbage << 17;
                    let mut data = garbage.to_le_bytes()[..size].to_vec();
                    machine
                        .devices
                        .mmio_write(VirtNanos(offset), base + offset, &data);
                    machine
                        .devices
                        .mmio_read(VirtNanos(offset), base + offset, &mut data);
                }
            }
        }

        // Assert: the machine still works and its state still round-trips.
        let state = machine.devices.save();
        machine.devices.restore(&state).unwrap();
        assert_eq!(machine.devices.save(), state);
        let _ = machine.devices.acknowledge_interrupt();
    }

    // The network.

    use crate::switch::{LatencyDist, NetworkConfig};
    use crate::virtio::net::{NET_HDR_LEN, RECEIVEQ, TRANSMITQ};

    const SWITCH_KEY: [u8; 32] = [0x5e; 32];
    const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xa];
    const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xb];
    const LATENCY: u64 = 100_000;
    const RX_BUFFER_LEN: u32 = 1526;

    /// A NIC's queues and buffers in the test memory.
    struct Nic {
        base: u64,
        receiveq: DriverQueue,
        transmitq: DriverQueue,
        tx_buffer: u64,
        rx_buffer: u64,
    }

    /// Two NICs (A in slot 0 on IRQ5, B in slot 1 on IRQ6), initialized,
    /// joined by a switch with a fixed latency unless `switch` is false.
    struct NetMachine {
        devices: Devices,
        mem: GuestMemory,
        nics: [Nic; 2],
    }

    fn nic(index: u64) -> Nic {
        let queues = QUEUE0_BASE + index * 0x2000;
        Nic {
            base: layout::VIRTIO_MMIO_BASE + index * layout::VIRTIO_MMIO_STRIDE,
            receiveq: DriverQueue::new(queues, 16),
            transmitq: DriverQueue::new(queues + 0x1000, 16),
            tx_buffer: DATA_BASE + index * 0x4000,
            rx_buffer: DATA_BASE + index * 0x4000 + 0x2000,
        }
    }

    fn net_machine(switch: bool) -> NetMachine {
        let (mut devices, _output) = new_devices();
        let mem = virtio_testing::test_memory();
        devices.attach_guest_memory(mem.clone());
        devices.attach_virtio_net(MAC_A).unwrap();
        if switch {
            devices
                .attach_switch(
                    SWITCH_KEY,
                    NetworkConfig::reliable(LatencyDist::Fixed(VirtNanos(LATENCY))),
                )
                .unwrap();
        }
        // Joins the switch on attach.
        devices.attach_virtio_net(MAC_B).unwrap();
        init_pic(&mut devices, MASTER_MASK_VIRTIO, 0xff);
        let nics = [nic(0), nic(1)];
        for nic in &nics {
            initialize(
                &mut window(&mut devices, nic.base),
                &[&nic.receiveq, &nic.transmitq],
            );
        }
        NetMachine { devices, mem, nics }
    }

    fn ethernet_frame(to: [u8; 6], from: [u8; 6], payload: &[u8]) -> Vec<u8> {
        [&to[..], &from[..], &[0x88, 0xb5], payload].concat()
    }

    impl NetMachine {
        fn window(&mut self, nic: usize, now: u64) -> Window<'_> {
            Window {
                devices: &mut self.devices,
                base: self.nics[nic].base,
                now,
            }
        }

        /// NIC `nic` transmits `frame` at `now`; its transmit interrupt is
        /// acknowledged (PIC and device) right after.
        fn send(&mut self, nic: usize, now: u64, frame: &[u8]) {
            let buffer = self.nics[nic].tx_buffer;
            write_bytes(&self.mem, buffer, &[0; NET_HDR_LEN]);
            write_bytes(&self.mem, buffer + NET_HDR_LEN as u64, frame);
            let len = (NET_HDR_LEN + frame.len()) as u32;
            self.nics[nic]
                .transmitq
                .add_chain(&self.mem, &[readable(buffer, len)]);
            self.window(nic, now)
                .write32(REG_QUEUE_NOTIFY, TRANSMITQ as u32);
            self.devices.acknowledge_interrupt();
            outb(&mut self.devices, now, 0x20, 0x20); // EOI
            self.window(nic, now)
                .write32(REG_INTERRUPT_ACK, INTERRUPT_USED_BUFFER);
        }

        fn post_receive_buffer(&mut self, nic: usize, now: u64) {
            let buffer = self.nics[nic].rx_buffer;
            self.nics[nic]
                .receiveq
                .add_chain(&self.mem, &[writable(buffer, RX_BUFFER_LEN)]);
            self.window(nic, now)
                .write32(REG_QUEUE_NOTIFY, RECEIVEQ as u32);
        }

        /// The frames NIC `nic` received since the last call.
        fn received(&mut self, nic: usize) -> Vec<Vec<u8>> {
            let buffer = self.nics[nic].rx_buffer;
            self.nics[nic]
                .receiveq
                .take_used(&self.mem)
                .into_iter()
                .map(|(_, len)| read_bytes(&self.mem, buffer, len as usize)[NET_HDR_LEN..].to_vec())
                .collect()
        }
    }

    #[test]
    fn test_devices_frame_from_nic_a_reaches_nic_b_after_the_latency() {
        // Arrange
        let mut machine = net_machine(true);
        machine.post_receive_buffer(1, 1_000);
        let frame = ethernet_frame(MAC_B, MAC_A, b"hello from node a");
        let sent_at = 5_000;

        // Act
        machine.send(0, sent_at, &frame);
        let deadline = machine.devices.next_deadline();
        machine.devices.advance_to(VirtNanos(sent_at + LATENCY - 1));
        let early = (machine.received(1), machine.devices.has_pending_interrupt());
        machine.devices.advance_to(VirtNanos(sent_at + LATENCY));
        let vector = machine.devices.acknowledge_interrupt();

        // Assert
        assert_eq!(deadline, Some(VirtNanos(sent_at + LATENCY)));
        assert_eq!(early, (Vec::new(), false));
        assert_eq!(vector, Some(MASTER_VECTOR_BASE + 6));
        assert_eq!(machine.received(1), [frame]);
        assert_eq!(machine.devices.next_deadline(), None);
        let switch = machine.devices.switch().unwrap();
        assert_eq!(switch.counters(PortId(0)).unwrap().sent, 1);
        assert_eq!(switch.counters(PortId(1)).unwrap().delivered, 1);
        let counters = machine.devices.virtio_net_counters(1).unwrap();
        assert_eq!(counters.rx_frames, 1);
        assert_eq!(machine.devices.virtio_net_counters(0).unwrap().tx_frames, 1);
    }

    #[test]
    fn test_devices_frame_due_is_delivered_before_a_later_access_is_served() {
        // Arrange
        let mut machine = net_machine(true);
        machine.post_receive_buffer(0, 1_000);
        machine.send(1, 2_000, &ethernet_frame(MAC_A, MAC_B, b"reply"));

        // Act: any access after the delivery time, without advance_to.
        let status = machine
            .window(0, 2_000 + LATENCY + 7)
            .read32(REG_INTERRUPT_STATUS);

        // Assert
        assert_eq!(status, INTERRUPT_USED_BUFFER);
        assert_eq!(machine.received(0).len(), 1);
    }

    #[test]
    fn test_devices_several_nics_and_switch_in_any_attach_order() {
        // Arrange
        let (mut devices, _output) = new_devices();
        devices.attach_guest_memory(virtio_testing::test_memory());
        devices.attach_virtio_rng(RNG_KEY).unwrap();
        let first = devices.attach_virtio_net(MAC_A).unwrap();

        // Act
        devices
            .attach_switch(
                SWITCH_KEY,
                NetworkConfig::reliable(LatencyDist::Fixed(VirtNanos(1))),
            )
            .unwrap();
        let second = devices.attach_virtio_net(MAC_B).unwrap();
        let more: Vec<VirtioSlot> = (0..8)
            .map(|i| devices.attach_virtio_net([0x52, 0x54, 0, 0, 1, i]).unwrap())
            .collect();
        let again = devices.attach_switch(
            SWITCH_KEY,
            NetworkConfig::reliable(LatencyDist::Fixed(VirtNanos(1))),
        );

        // Assert
        assert_eq!((first.index, first.irq), (1, 6));
        assert_eq!((second.index, second.irq), (2, 7));
        assert_eq!(more.last().unwrap().irq, 13);
        assert_eq!(
            devices.attach_virtio_net([0x52, 0x54, 0, 0, 2, 0]),
            Err(DevicesError::VirtioSlotsExhausted { max: 11 })
        );
        assert_eq!(again, Err(SwitchError::AlreadyAttached));
        let ports = devices.switch().unwrap().ports();
        assert_eq!(ports.len(), 10);
        assert_eq!(ports[0], (PortId(1), MAC_A));
        assert_eq!(ports[1], (second.port(), MAC_B));
    }

    #[test]
    fn test_devices_without_a_switch_frames_go_nowhere() {
        // Arrange
        let mut machine = net_machine(false);
        machine.post_receive_buffer(1, 1_000);

        // Act
        machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"into the void"));
        machine.devices.advance_to(VirtNanos::from_secs(1));

        // Assert
        assert_eq!(machine.devices.next_deadline(), None);
        assert!(machine.received(1).is_empty());
        assert_eq!(machine.devices.virtio_net_counters(0).unwrap().tx_frames, 1);
        assert!(machine.devices.save().virtio[0].transport.queues[1].ready);
        assert_eq!(
            machine
                .devices
                .schedule_network_fault(VirtNanos(0), Fault::Heal),
            Err(SwitchError::NotAttached)
        );
    }

    /// (time, from, to, dropped) of frame events.
    type Kept = std::sync::Arc<std::sync::Mutex<Vec<(u64, usize, usize, bool)>>>;

    /// A tap keeping every frame event.
    struct KeepEvents(Kept);

    impl FrameTap for KeepEvents {
        fn frame(&mut self, event: &crate::switch::FrameEvent) {
            self.0.lock().unwrap().push((
                event.at.0,
                event.from.0,
                event.to.0,
                event.dropped.is_some(),
            ));
        }
    }

    #[test]
    fn test_devices_frame_tap_sees_deliveries_and_drops_in_time_order_and_changes_nothing() {
        // Arrange: A -> B blocked one way from 50 us.
        let run = |tap: bool| {
            let mut machine = net_machine(true);
            let events = Kept::default();
            if tap {
                let keep = KeepEvents(std::sync::Arc::clone(&events));
                machine.devices.set_frame_tap(Some(Box::new(keep))).unwrap();
            }
            machine.post_receive_buffer(1, 1_000);
            machine
                .devices
                .schedule_network_fault(
                    VirtNanos(50_000),
                    Fault::Block(crate::switch::Links {
                        from: vec![PortId(0)],
                        to: vec![PortId(1)],
                        both_ways: false,
                    }),
                )
                .unwrap();

            // Act
            machine.post_receive_buffer(0, 1_000);
            machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"cut in flight"));
            machine.send(1, 10_000, &ethernet_frame(MAC_A, MAC_B, b"the other way"));
            machine.devices.advance_to(VirtNanos(30_000));
            machine.send(0, 60_000, &ethernet_frame(MAC_B, MAC_A, b"cut at send"));
            machine.devices.advance_to(VirtNanos::from_secs(1));
            let kept = events.lock().unwrap().clone();
            (machine.devices.save(), kept)
        };
        let (quiet, none) = run(false);
        let (tapped, events) = run(true);

        // Assert
        assert_eq!(quiet, tapped);
        assert!(none.is_empty());
        assert_eq!(
            events,
            [
                (50_000, 0, 1, true),
                (60_000, 0, 1, true),
                (10_000 + LATENCY, 1, 0, false)
            ]
        );
    }

    #[test]
    fn test_devices_scheduled_partition_cuts_the_frame_in_flight() {
        // Arrange
        let mut machine = net_machine(true);
        machine.post_receive_buffer(1, 1_000);
        machine
            .devices
            .schedule_network_fault(
                VirtNanos(50_000),
                Fault::Partition(vec![vec![PortId(0)], vec![PortId(1)]]),
            )
            .unwrap();
        machine
            .devices
            .schedule_network_fault(VirtNanos(60_000), Fault::Heal)
            .unwrap();

        // Act
        machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"cut"));
        let deadline = machine.devices.next_deadline();
        machine.devices.advance_to(VirtNanos::from_secs(1));

        // Assert
        assert_eq!(deadline, None);
        assert!(machine.received(1).is_empty());
        let switch = machine.devices.switch().unwrap();
        assert_eq!(switch.counters(PortId(0)).unwrap().dropped_partition, 1);
        assert_eq!(switch.blocked_links(), []);
    }

    #[test]
    fn test_devices_state_round_trip_with_frames_in_flight() {
        // Arrange
        let mut machine = net_machine(true);
        machine.post_receive_buffer(1, 1_000);
        machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"in flight"));
        let saved = machine.devices.save();
        let json = serde_json::to_string(&saved).unwrap();
        let receiveq = machine.nics[1].receiveq.clone();
        let memory_at_save = read_bytes(&machine.mem, 0, virtio_testing::MEMORY_SIZE as usize);
        machine.devices.advance_to(VirtNanos(2_000 + LATENCY));
        let first_run = (machine.received(1), machine.devices.save());

        // Act
        machine
            .devices
            .restore(&serde_json::from_str(&json).unwrap())
            .unwrap();
        let restored_state = machine.devices.save();
        write_bytes(&machine.mem, 0, &memory_at_save);
        machine.nics[1].receiveq = receiveq;
        let deadline = machine.devices.next_deadline();
        machine.devices.advance_to(VirtNanos(2_000 + LATENCY));
        let second_run = (machine.received(1), machine.devices.save());

        // Assert
        assert_eq!(restored_state, saved);
        assert_eq!(saved.switch.as_ref().unwrap().in_flight.len(), 1);
        assert_eq!(deadline, Some(VirtNanos(2_000 + LATENCY)));
        assert_eq!(second_run, first_run);
        assert_eq!(first_run.0.len(), 1);
    }

    #[test]
    fn test_devices_restore_of_switch_not_matching_the_nics_changes_nothing() {
        // Arrange
        let mut machine = net_machine(true);
        machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"x"));
        let before = machine.devices.save();
        let mut other_mac = before.clone();
        other_mac
            .switch
            .as_mut()
            .unwrap()
            .ports
            .get_mut(&PortId(1))
            .unwrap()
            .mac = MAC_A;
        let mut missing_port = before.clone();
        missing_port
            .switch
            .as_mut()
            .unwrap()
            .ports
            .remove(&PortId(0));
        let mut frame_to_nowhere = before.clone();
        for frame in frame_to_nowhere
            .switch
            .as_mut()
            .unwrap()
            .in_flight
            .values_mut()
        {
            frame.to = PortId(5);
        }

        // Act
        let results = [
            machine.devices.restore(&other_mac),
            machine.devices.restore(&missing_port),
            machine.devices.restore(&frame_to_nowhere),
        ];

        // Assert
        assert_eq!(
            results,
            [
                Err(RestoreError::SwitchPortMismatch { port: 1 }),
                Err(RestoreError::SwitchPortMismatch { port: 0 }),
                Err(RestoreError::SwitchUnknownPort { port: 5 }),
            ]
        );
        assert_eq!(machine.devices.save(), before);
    }

    #[test]
    fn test_devices_state_without_switch_restores_and_detaches_it() {
        // Arrange
        let mut machine = net_machine(true);
        let mut json: serde_json::Value = serde_json::to_value(machine.devices.save()).unwrap();
        json.as_object_mut().unwrap().remove("switch");

        // Act
        let state: DevicesState = serde_json::from_value(json).unwrap();
        let result = machine.devices.restore(&state);

        // Assert
        assert_eq!(result, Ok(()));
        assert!(machine.devices.switch().is_none());
    }

    /// The virtio machine after its workload, console input pending.
    fn used_virtio_devices() -> Devices {
        let mut machine = virtio_machine();
        virtio_workload(&mut machine, DATA_BASE);
        machine
            .devices
            .enqueue_virtio_console_input(VirtNanos(2_000), b"pending")
            .unwrap();
        machine.devices
    }

    crate::persist::persist_round_trip_tests! {
        mod virtio_devices_persist {
            fresh: virtio_machine().devices,
            saved: used_virtio_devices(),
            mutate: |devices: &mut Devices| {
                devices
                    .enqueue_virtio_console_input(VirtNanos(3_000), b"more")
                    .unwrap();
            },
        }
    }

    /// Two NICs on the switch, frames in flight.
    fn used_net_devices() -> Devices {
        let mut machine = net_machine(true);
        machine.send(0, 1_000, &ethernet_frame(MAC_B, MAC_A, b"ping"));
        machine.devices
    }

    crate::persist::persist_round_trip_tests! {
        mod net_devices_persist {
            fresh: net_machine(true).devices,
            saved: used_net_devices(),
            mutate: |devices: &mut Devices| {
                devices.advance_to(VirtNanos::from_secs(1));
            },
        }
    }
}
