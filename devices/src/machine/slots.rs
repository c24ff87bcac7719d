//! The virtio-mmio slots: the device in each (whatever its backend, seen
//! through [`SlotDevice`]), where each sits, and their saved states.

use super::device_id::DeviceId;
use super::Devices;
use crate::error::DevicesError;
use crate::layout;
use crate::persist::{Persist, RestoreError};
use crate::switch::PortId;
use crate::time::VirtNanos;
use crate::virtio::{
    VirtioBlk, VirtioBlkState, VirtioConsole, VirtioConsoleState, VirtioDevice, VirtioMmioState,
    VirtioMmioTransport, VirtioNet, VirtioNetState, VirtioRng, VirtioRngState, VirtioViolation,
};
use crate::GuestMemory;
use serde::{Deserialize, Serialize};

/// A virtio device in its virtio-mmio slot (boxed: the transports differ
/// widely in size). The machine reaches the backend's type only where it
/// needs it (the NICs, the disks, the console, the rng); everything else
/// goes through [`VirtioSlotDevice::device`].
pub(super) enum VirtioSlotDevice {
    Rng(Box<VirtioMmioTransport<VirtioRng>>),
    Console(Box<VirtioMmioTransport<VirtioConsole>>),
    Net(Box<VirtioMmioTransport<VirtioNet>>),
    Blk(Box<VirtioMmioTransport<VirtioBlk>>),
}

impl VirtioSlotDevice {
    /// The device, whatever its backend.
    pub(super) fn device(&self) -> &dyn SlotDevice {
        match self {
            VirtioSlotDevice::Rng(transport) => transport.as_ref(),
            VirtioSlotDevice::Console(transport) => transport.as_ref(),
            VirtioSlotDevice::Net(transport) => transport.as_ref(),
            VirtioSlotDevice::Blk(transport) => transport.as_ref(),
        }
    }

    /// The device, whatever its backend, to act on.
    pub(super) fn device_mut(&mut self) -> &mut dyn SlotDevice {
        match self {
            VirtioSlotDevice::Rng(transport) => transport.as_mut(),
            VirtioSlotDevice::Console(transport) => transport.as_mut(),
            VirtioSlotDevice::Net(transport) => transport.as_mut(),
            VirtioSlotDevice::Blk(transport) => transport.as_mut(),
        }
    }
}

/// What the machine does with the device in any slot: its register window,
/// its interrupt line, the rule its driver broke, and the saved state of
/// its transport and backend together (the rings are checked against guest
/// memory by [`VirtioDevices`]).
pub(super) trait SlotDevice {
    /// The backend's kind, as errors and trace names say it.
    fn kind(&self) -> &'static str;
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8], memory: &GuestMemory, now: VirtNanos);
    fn interrupt_pending(&self) -> bool;
    fn violation(&self) -> Option<VirtioViolation>;
    fn save(&self) -> VirtioDeviceState;
    fn validate(&self, state: &VirtioDeviceState) -> Result<(), RestoreError>;
    /// Restores transport and backend, once both states are validated.
    fn restore(&mut self, state: &VirtioDeviceState) -> Result<(), RestoreError>;
}

/// A backend's kind and its variant of [`VirtioBackendState`].
trait SlotBackend: VirtioDevice + Persist {
    const KIND: &'static str;
    fn saved_as(state: Self::State) -> VirtioBackendState;
    /// The backend's state, if `state` is of this kind.
    fn saved_of(state: &VirtioBackendState) -> Option<&Self::State>;

    /// The backend's state in `state`, or the error naming both kinds.
    fn backend_state(state: &VirtioDeviceState) -> Result<&Self::State, RestoreError> {
        Self::saved_of(&state.backend).ok_or(RestoreError::VirtioDeviceKind {
            found: state.backend.kind_name(),
            expected: Self::KIND,
        })
    }
}

impl SlotBackend for VirtioRng {
    const KIND: &'static str = "rng";
    fn saved_as(state: VirtioRngState) -> VirtioBackendState {
        VirtioBackendState::Rng(state)
    }
    fn saved_of(state: &VirtioBackendState) -> Option<&VirtioRngState> {
        match state {
            VirtioBackendState::Rng(state) => Some(state),
            _ => None,
        }
    }
}

impl SlotBackend for VirtioConsole {
    const KIND: &'static str = "console";
    fn saved_as(state: VirtioConsoleState) -> VirtioBackendState {
        VirtioBackendState::Console(state)
    }
    fn saved_of(state: &VirtioBackendState) -> Option<&VirtioConsoleState> {
        match state {
            VirtioBackendState::Console(state) => Some(state),
            _ => None,
        }
    }
}

impl SlotBackend for VirtioNet {
    const KIND: &'static str = "net";
    fn saved_as(state: VirtioNetState) -> VirtioBackendState {
        VirtioBackendState::Net(state)
    }
    fn saved_of(state: &VirtioBackendState) -> Option<&VirtioNetState> {
        match state {
            VirtioBackendState::Net(state) => Some(state),
            _ => None,
        }
    }
}

impl SlotBackend for VirtioBlk {
    const KIND: &'static str = "blk";
    fn saved_as(state: VirtioBlkState) -> VirtioBackendState {
        VirtioBackendState::Blk(state)
    }
    fn saved_of(state: &VirtioBackendState) -> Option<&VirtioBlkState> {
        match state {
            VirtioBackendState::Blk(state) => Some(state),
            _ => None,
        }
    }
}

impl<D: SlotBackend> SlotDevice for VirtioMmioTransport<D> {
    fn kind(&self) -> &'static str {
        D::KIND
    }

    fn read(&mut self, offset: u64, data: &mut [u8]) {
        VirtioMmioTransport::read(self, offset, data);
    }

    fn write(&mut self, offset: u64, data: &[u8], memory: &GuestMemory, now: VirtNanos) {
        VirtioMmioTransport::write(self, offset, data, memory, now);
    }

    fn interrupt_pending(&self) -> bool {
        VirtioMmioTransport::interrupt_pending(self)
    }

    fn violation(&self) -> Option<VirtioViolation> {
        VirtioMmioTransport::violation(self)
    }

    fn save(&self) -> VirtioDeviceState {
        VirtioDeviceState {
            transport: Persist::save(self),
            backend: D::saved_as(self.device().save()),
        }
    }

    fn validate(&self, state: &VirtioDeviceState) -> Result<(), RestoreError> {
        let backend = D::backend_state(state)?;
        Persist::validate(self, &state.transport)?;
        self.device().validate(backend)
    }

    fn restore(&mut self, state: &VirtioDeviceState) -> Result<(), RestoreError> {
        SlotDevice::validate(self, state)?;
        let backend = D::backend_state(state)?;
        Persist::restore(self, &state.transport)?;
        self.device_mut().restore(backend)
    }
}

/// The virtio devices and the guest memory their queues live in.
pub(super) struct VirtioDevices {
    pub(super) memory: GuestMemory,
    pub(super) slots: Vec<VirtioSlotDevice>,
}

/// The devices slot by slot, each state checked against its slot's device
/// and its rings against guest memory.
impl Persist for VirtioDevices {
    type State = Vec<VirtioDeviceState>;

    fn save(&self) -> Vec<VirtioDeviceState> {
        self.slots.iter().map(|slot| slot.device().save()).collect()
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
                .device()
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
                .device_mut()
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
        _ => None,
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
    pub(super) fn new(index: usize) -> Option<Self> {
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
    pub(super) fn kind_name(&self) -> &'static str {
        match self {
            VirtioBackendState::Rng(_) => VirtioRng::KIND,
            VirtioBackendState::Console(_) => VirtioConsole::KIND,
            VirtioBackendState::Net(_) => VirtioNet::KIND,
            VirtioBackendState::Blk(_) => VirtioBlk::KIND,
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

impl Devices {
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

    /// Attaches the virtio-console control channel (one port, /dev/hvc0 in
    /// the guest).
    pub fn attach_virtio_console(&mut self) -> Result<VirtioSlot, DevicesError> {
        let transport = VirtioMmioTransport::new(VirtioConsole::new())?;
        self.attach_virtio(VirtioSlotDevice::Console(Box::new(transport)))
    }

    pub(super) fn attach_virtio(
        &mut self,
        device: VirtioSlotDevice,
    ) -> Result<VirtioSlot, DevicesError> {
        let virtio = self.virtio.as_mut().ok_or(DevicesError::NoGuestMemory)?;
        let kind = device.device().kind();
        // One NIC and one disk per node; one of every other kind.
        if !matches!(device, VirtioSlotDevice::Net(_) | VirtioSlotDevice::Blk(_))
            && virtio
                .slots
                .iter()
                .any(|other| other.device().kind() == kind)
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

    /// The attached virtio devices with their slot indexes, in slot order.
    pub(super) fn slot_devices(&self) -> impl Iterator<Item = (usize, &VirtioSlotDevice)> {
        self.virtio
            .iter()
            .flat_map(|virtio| virtio.slots.iter().enumerate())
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
        self.slot_devices()
            .filter_map(|(index, device)| device.device().violation().map(|v| (index, v)))
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
}
