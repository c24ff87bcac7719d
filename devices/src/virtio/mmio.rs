//! The virtio-mmio transport, version 2 (virtio 1.x spec 4.2.2): the
//! register file of one device in its 4 KiB MMIO window.
//!
//! Only the modern interface exists: the version register reads 2, the
//! device always offers VIRTIO_F_VERSION_1, and FEATURES_OK is refused
//! unless the driver accepted it (the legacy registers GuestPageSize,
//! QueueAlign and QueuePFN are ignored).
//!
//! Control registers are 32 bits wide and the driver must access them
//! whole and aligned (4.2.2.2); any other access to them reads zero and is
//! dropped. Device configuration space starts at 0x100 and is accessed at
//! any width.
//!
//! The device status follows the initialization sequence of spec 3.1.1:
//! ACKNOWLEDGE, then DRIVER, then FEATURES_OK, then DRIVER_OK, each bit
//! requiring the previous one, bits never cleared except by writing 0
//! (reset); FAILED may be set at any time. Writing any other sequence is a
//! violation. The device consumes buffers only while DRIVER_OK is set and
//! FAILED and DEVICE_NEEDS_RESET are not.
//!
//! Queue work is synchronous: a QueueNotify write processes that queue
//! before the write returns, and setting DRIVER_OK processes every ready
//! queue (buffers the driver made available before DRIVER_OK are not
//! consumed until then, spec 3.1.1). Used buffers set bit 0 of
//! InterruptStatus, unless the driver suppressed the interrupt; a violation
//! sets bit 1. The owner drives the device's interrupt line from
//! [`VirtioMmioTransport::interrupt_pending`] (level: high while
//! InterruptStatus is non-zero).
//!
//! Every device is offered VIRTIO_RING_F_EVENT_IDX besides its own
//! features. Each device step on a queue (a QueueNotify, DRIVER_OK, or a
//! step the VMM runs) is one batch: the backend's pass over the queue, then
//! avail_event published (another pass if the driver added buffers to a
//! ring the pass drained), then one interrupt decision for the used
//! elements the whole batch wrote, from the used index before and after it
//! (see [`super::queue`]). Buffers used before a violation are always
//! notified: the device interrupts then anyway.

use super::{QueueFault, RingPart, VirtioDevice, VirtioViolation, Virtqueue, VirtqueueState};
use crate::error::DevicesError;
use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use crate::GuestMemory;
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::{
    VIRTIO_MMIO_CONFIG, VIRTIO_MMIO_CONFIG_GENERATION, VIRTIO_MMIO_DEVICE_FEATURES,
    VIRTIO_MMIO_DEVICE_FEATURES_SEL, VIRTIO_MMIO_DEVICE_ID, VIRTIO_MMIO_DRIVER_FEATURES,
    VIRTIO_MMIO_DRIVER_FEATURES_SEL, VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INTERRUPT_STATUS,
    VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING, VIRTIO_MMIO_MAGIC_VALUE,
    VIRTIO_MMIO_QUEUE_AVAIL_HIGH, VIRTIO_MMIO_QUEUE_AVAIL_LOW, VIRTIO_MMIO_QUEUE_DESC_HIGH,
    VIRTIO_MMIO_QUEUE_DESC_LOW, VIRTIO_MMIO_QUEUE_NOTIFY, VIRTIO_MMIO_QUEUE_NUM,
    VIRTIO_MMIO_QUEUE_NUM_MAX, VIRTIO_MMIO_QUEUE_READY, VIRTIO_MMIO_QUEUE_SEL,
    VIRTIO_MMIO_QUEUE_USED_HIGH, VIRTIO_MMIO_QUEUE_USED_LOW, VIRTIO_MMIO_SHM_BASE_HIGH,
    VIRTIO_MMIO_SHM_BASE_LOW, VIRTIO_MMIO_SHM_LEN_HIGH, VIRTIO_MMIO_SHM_LEN_LOW,
    VIRTIO_MMIO_STATUS, VIRTIO_MMIO_VENDOR_ID, VIRTIO_MMIO_VERSION,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

/// "virt" in little-endian.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
/// The modern (virtio 1.x) register layout.
pub const MMIO_VERSION: u32 = 2;
/// Subsystem vendor ID: "detv". Drivers do not look at it.
pub const MMIO_VENDOR_ID: u32 = u32::from_le_bytes(*b"detv");

const REGISTER_BYTES: usize = 4;

const fn register(offset: u32) -> u64 {
    offset as u64
}

const MAGIC_VALUE: u64 = register(VIRTIO_MMIO_MAGIC_VALUE);
const VERSION: u64 = register(VIRTIO_MMIO_VERSION);
const DEVICE_ID: u64 = register(VIRTIO_MMIO_DEVICE_ID);
const VENDOR_ID: u64 = register(VIRTIO_MMIO_VENDOR_ID);
const DEVICE_FEATURES: u64 = register(VIRTIO_MMIO_DEVICE_FEATURES);
const DEVICE_FEATURES_SEL: u64 = register(VIRTIO_MMIO_DEVICE_FEATURES_SEL);
const DRIVER_FEATURES: u64 = register(VIRTIO_MMIO_DRIVER_FEATURES);
const DRIVER_FEATURES_SEL: u64 = register(VIRTIO_MMIO_DRIVER_FEATURES_SEL);
const QUEUE_SEL: u64 = register(VIRTIO_MMIO_QUEUE_SEL);
const QUEUE_NUM_MAX: u64 = register(VIRTIO_MMIO_QUEUE_NUM_MAX);
const QUEUE_NUM: u64 = register(VIRTIO_MMIO_QUEUE_NUM);
const QUEUE_READY: u64 = register(VIRTIO_MMIO_QUEUE_READY);
const QUEUE_NOTIFY: u64 = register(VIRTIO_MMIO_QUEUE_NOTIFY);
const INTERRUPT_STATUS: u64 = register(VIRTIO_MMIO_INTERRUPT_STATUS);
const INTERRUPT_ACK: u64 = register(VIRTIO_MMIO_INTERRUPT_ACK);
const STATUS: u64 = register(VIRTIO_MMIO_STATUS);
const QUEUE_DESC_LOW: u64 = register(VIRTIO_MMIO_QUEUE_DESC_LOW);
const QUEUE_DESC_HIGH: u64 = register(VIRTIO_MMIO_QUEUE_DESC_HIGH);
const QUEUE_AVAIL_LOW: u64 = register(VIRTIO_MMIO_QUEUE_AVAIL_LOW);
const QUEUE_AVAIL_HIGH: u64 = register(VIRTIO_MMIO_QUEUE_AVAIL_HIGH);
const QUEUE_USED_LOW: u64 = register(VIRTIO_MMIO_QUEUE_USED_LOW);
const QUEUE_USED_HIGH: u64 = register(VIRTIO_MMIO_QUEUE_USED_HIGH);
const SHM_LEN_LOW: u64 = register(VIRTIO_MMIO_SHM_LEN_LOW);
const SHM_LEN_HIGH: u64 = register(VIRTIO_MMIO_SHM_LEN_HIGH);
const SHM_BASE_LOW: u64 = register(VIRTIO_MMIO_SHM_BASE_LOW);
const SHM_BASE_HIGH: u64 = register(VIRTIO_MMIO_SHM_BASE_HIGH);
const CONFIG_GENERATION: u64 = register(VIRTIO_MMIO_CONFIG_GENERATION);
/// Start of device configuration space.
pub const CONFIG_SPACE: u64 = register(VIRTIO_MMIO_CONFIG);

pub const STATUS_ACKNOWLEDGE: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
pub const STATUS_DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
pub const STATUS_FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
pub const STATUS_DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
pub const STATUS_NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;
pub const STATUS_FAILED: u32 = VIRTIO_CONFIG_S_FAILED;
/// The bits the driver may set.
const DRIVER_STATUS_BITS: u32 =
    STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK | STATUS_FAILED;

/// InterruptStatus bit 0: the device used a buffer.
pub const INTERRUPT_USED_BUFFER: u32 = VIRTIO_MMIO_INT_VRING;
/// InterruptStatus bit 1: the configuration (here: DEVICE_NEEDS_RESET) changed.
pub const INTERRUPT_CONFIG_CHANGE: u32 = VIRTIO_MMIO_INT_CONFIG;

/// The feature every device offers and every driver must accept.
pub const FEATURE_VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
/// VIRTIO_RING_F_EVENT_IDX (bit 29): avail_event and used_event, offered by
/// every device.
pub const FEATURE_EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
/// The features the transport offers on every device, besides the backend's.
pub const TRANSPORT_FEATURES: u64 = FEATURE_VERSION_1 | FEATURE_EVENT_IDX;

/// Saved state of the transport (the backend saves its own).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioMmioState {
    pub status: u32,
    pub device_features_select: u32,
    pub driver_features_select: u32,
    pub driver_features: u64,
    pub queue_select: u32,
    pub interrupt_status: u32,
    pub config_generation: u32,
    pub queues: Vec<VirtqueueState>,
    /// Set while the device is broken: the first rule the driver broke.
    pub violation: Option<VirtioViolation>,
}

/// One virtio device as the guest sees it through its MMIO window.
#[derive(Debug)]
pub struct VirtioMmioTransport<D> {
    device: D,
    queues: Vec<Virtqueue>,
    status: u32,
    device_features_select: u32,
    driver_features_select: u32,
    driver_features: u64,
    queue_select: u32,
    interrupt_status: u32,
    config_generation: u32,
    violation: Option<VirtioViolation>,
}

impl<D: VirtioDevice> VirtioMmioTransport<D> {
    /// Fails only if the backend declares a queue size that is not a power
    /// of two in 1..=32768.
    pub fn new(device: D) -> Result<Self, DevicesError> {
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&max_size| Virtqueue::new(max_size))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(VirtioMmioTransport {
            device,
            queues,
            status: 0,
            device_features_select: 0,
            driver_features_select: 0,
            driver_features: 0,
            queue_select: 0,
            interrupt_status: 0,
            config_generation: 0,
            violation: None,
        })
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    pub fn queue(&self, index: usize) -> Option<&Virtqueue> {
        self.queues.get(index)
    }

    pub fn status(&self) -> u32 {
        self.status
    }

    pub fn interrupt_status(&self) -> u32 {
        self.interrupt_status
    }

    /// The level of the device's interrupt line.
    pub fn interrupt_pending(&self) -> bool {
        self.interrupt_status != 0
    }

    /// The rule the driver broke, while the device is broken.
    pub fn violation(&self) -> Option<VirtioViolation> {
        self.violation
    }

    /// The features the driver accepted (meaningful once FEATURES_OK is set).
    pub fn driver_features(&self) -> u64 {
        self.driver_features
    }

    fn offered_features(&self) -> u64 {
        self.device.device_features() | TRANSPORT_FEATURES
    }

    /// Whether the device consumes buffers now.
    fn is_live(&self) -> bool {
        self.status & STATUS_DRIVER_OK != 0
            && self.status & (STATUS_FAILED | STATUS_NEEDS_RESET) == 0
            && self.violation.is_none()
    }

    /// An MMIO read at `offset` within the window.
    pub fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE {
            self.device.read_config(offset - CONFIG_SPACE, data);
            return;
        }
        if data.len() != REGISTER_BYTES || !offset.is_multiple_of(REGISTER_BYTES as u64) {
            data.fill(0);
            return;
        }
        data.copy_from_slice(&self.read_register(offset).to_le_bytes());
    }

    fn read_register(&self, offset: u64) -> u32 {
        let selected_queue = usize::try_from(self.queue_select)
            .ok()
            .and_then(|index| self.queues.get(index));
        match offset {
            MAGIC_VALUE => MMIO_MAGIC,
            VERSION => MMIO_VERSION,
            DEVICE_ID => self.device.device_id(),
            VENDOR_ID => MMIO_VENDOR_ID,
            DEVICE_FEATURES => match self.device_features_select {
                0 => self.offered_features() as u32,
                1 => (self.offered_features() >> 32) as u32,
                _ => 0,
            },
            // 0 tells the driver the selected queue does not exist.
            QUEUE_NUM_MAX => selected_queue.map_or(0, |q| u32::from(q.max_size())),
            QUEUE_READY => selected_queue.map_or(0, |q| u32::from(q.ready())),
            INTERRUPT_STATUS => self.interrupt_status,
            STATUS => self.status,
            // No shared memory regions: a length (and base) of all ones (4.2.2).
            SHM_LEN_LOW | SHM_LEN_HIGH | SHM_BASE_LOW | SHM_BASE_HIGH => u32::MAX,
            CONFIG_GENERATION => self.config_generation,
            // Write-only and reserved registers.
            _ => 0,
        }
    }

    /// An MMIO write at `offset` within the window. Queue work it triggers
    /// (QueueNotify, DRIVER_OK) is done before this returns.
    pub fn write(&mut self, offset: u64, data: &[u8], mem: &GuestMemory, now: VirtNanos) {
        if offset >= CONFIG_SPACE {
            self.device.write_config(offset - CONFIG_SPACE, data);
            return;
        }
        let Ok(bytes) = <[u8; REGISTER_BYTES]>::try_from(data) else {
            return;
        };
        if !offset.is_multiple_of(REGISTER_BYTES as u64) {
            return;
        }
        let value = u32::from_le_bytes(bytes);
        match offset {
            DEVICE_FEATURES_SEL => self.device_features_select = value,
            DRIVER_FEATURES => self.write_driver_features(value),
            DRIVER_FEATURES_SEL => self.driver_features_select = value,
            QUEUE_SEL => self.queue_select = value,
            QUEUE_NUM => self.configure_selected_queue(|queue| queue.set_size(value)),
            QUEUE_READY => {
                self.configure_selected_queue(|queue| queue.set_ready(value != 0, mem));
            }
            QUEUE_NOTIFY => self.notify(value, mem, now),
            INTERRUPT_ACK => self.interrupt_status &= !value,
            STATUS => self.write_status(value, mem, now),
            QUEUE_DESC_LOW => self.set_queue_address(RingPart::DescriptorTable, false, value),
            QUEUE_DESC_HIGH => self.set_queue_address(RingPart::DescriptorTable, true, value),
            QUEUE_AVAIL_LOW => self.set_queue_address(RingPart::AvailRing, false, value),
            QUEUE_AVAIL_HIGH => self.set_queue_address(RingPart::AvailRing, true, value),
            QUEUE_USED_LOW => self.set_queue_address(RingPart::UsedRing, false, value),
            QUEUE_USED_HIGH => self.set_queue_address(RingPart::UsedRing, true, value),
            // Read-only registers, the legacy registers and SHMSel.
            _ => {}
        }
    }

    fn write_driver_features(&mut self, value: u32) {
        // Features are fixed once FEATURES_OK is accepted.
        if self.status & STATUS_FEATURES_OK != 0 {
            return;
        }
        let value = u64::from(value);
        self.driver_features = match self.driver_features_select {
            0 => (self.driver_features & !0xffff_ffff) | value,
            1 => (self.driver_features & 0xffff_ffff) | (value << 32),
            _ => self.driver_features,
        };
    }

    fn configure_selected_queue(
        &mut self,
        configure: impl FnOnce(&mut Virtqueue) -> Result<(), QueueFault>,
    ) {
        let selected = self.queue_select;
        let result = match usize::try_from(selected)
            .ok()
            .and_then(|index| self.queues.get_mut(index))
        {
            Some(queue) => configure(queue),
            None => {
                self.mark_broken(VirtioViolation::NoSuchQueue { queue: selected });
                return;
            }
        };
        if let Err(fault) = result {
            self.mark_broken(VirtioViolation::Queue {
                // Below the queue count, which fits in u16.
                queue: selected as u16,
                fault,
            });
        }
    }

    fn set_queue_address(&mut self, part: RingPart, high_half: bool, value: u32) {
        self.configure_selected_queue(|queue| queue.set_address_half(part, high_half, value));
    }

    fn notify(&mut self, value: u32, mem: &GuestMemory, now: VirtNanos) {
        // Without VIRTIO_F_NOTIFICATION_DATA the value is the queue index.
        match usize::try_from(value) {
            Ok(index) if index < self.queues.len() => self.process_queue(index, mem, now),
            _ => self.mark_broken(VirtioViolation::NoSuchQueue { queue: value }),
        }
    }

    fn write_status(&mut self, value: u32, mem: &GuestMemory, now: VirtNanos) {
        if value == 0 {
            self.reset();
            return;
        }
        let previous = self.status & DRIVER_STATUS_BITS;
        // DEVICE_NEEDS_RESET is the device's to set; the driver's copy of it
        // is ignored.
        let written = value & !STATUS_NEEDS_RESET;
        let added = written & !previous;
        let has = |bit: u32| written & bit != 0;
        let valid = written & !DRIVER_STATUS_BITS == 0
            && previous & !written == 0
            && (added & STATUS_DRIVER == 0 || has(STATUS_ACKNOWLEDGE))
            && (added & STATUS_FEATURES_OK == 0 || has(STATUS_DRIVER))
            && (added & STATUS_DRIVER_OK == 0 || has(STATUS_FEATURES_OK));
        if !valid {
            self.mark_broken(VirtioViolation::InvalidStatusTransition {
                previous: self.status,
                written: value,
            });
            return;
        }
        let mut accepted = written;
        if added & STATUS_FEATURES_OK != 0 && !self.features_acceptable() {
            // Spec 3.1.1: the device refuses the features by leaving
            // FEATURES_OK clear; the driver reads the status back and gives up.
            accepted &= !STATUS_FEATURES_OK;
            if added & STATUS_DRIVER_OK != 0 {
                self.mark_broken(VirtioViolation::InvalidStatusTransition {
                    previous: self.status,
                    written: value,
                });
                return;
            }
        }
        self.status = accepted | (self.status & STATUS_NEEDS_RESET);
        if accepted & added & STATUS_FEATURES_OK != 0 {
            let event_idx = event_idx_negotiated(self.status, self.driver_features);
            for queue in &mut self.queues {
                queue.set_event_idx(event_idx);
            }
        }
        if added & STATUS_DRIVER_OK != 0 {
            self.process_all_queues(mem, now);
        }
    }

    /// The driver accepted only offered features, and VIRTIO_F_VERSION_1.
    fn features_acceptable(&self) -> bool {
        self.driver_features & !self.offered_features() == 0
            && self.driver_features & FEATURE_VERSION_1 != 0
    }

    /// Processes what the driver made available on queue `index`, if the
    /// device is live and the queue ready. Call only at deterministic points.
    pub fn process_queue(&mut self, index: usize, mem: &GuestMemory, now: VirtNanos) {
        if !self.is_live() {
            return;
        }
        let Some(queue) = self.queues.get_mut(index) else {
            return;
        };
        if !queue.ready() {
            return;
        }
        let used_before = queue.next_used();
        let result = run_batch(&mut self.device, index, queue, mem, now);
        // Buffers used before a fault are the driver's: notify them too,
        // whatever the driver asked (the device interrupts for the fault).
        let interrupt = match result {
            Ok(()) => queue.needs_interrupt(mem, used_before),
            Err(_) => queue.next_used() != used_before,
        };
        if interrupt {
            self.interrupt_status |= INTERRUPT_USED_BUFFER;
        }
        if let Err(fault) = result {
            self.mark_broken(VirtioViolation::Queue {
                queue: index as u16,
                fault,
            });
        }
    }

    /// Processes every queue in order (see [`Self::process_queue`]).
    pub fn process_all_queues(&mut self, mem: &GuestMemory, now: VirtNanos) {
        for index in 0..self.queues.len() {
            self.process_queue(index, mem, now);
        }
    }

    /// Spec 2.1.2: DEVICE_NEEDS_RESET plus a configuration change
    /// notification; nothing more is processed until reset. The first
    /// violation is kept.
    fn mark_broken(&mut self, violation: VirtioViolation) {
        self.violation.get_or_insert(violation);
        self.status |= STATUS_NEEDS_RESET;
        self.interrupt_status |= INTERRUPT_CONFIG_CHANGE;
    }

    /// Device reset (status 0): back to the state before the driver's first
    /// access. The configuration generation keeps counting.
    fn reset(&mut self) {
        for queue in &mut self.queues {
            queue.reset();
        }
        self.device.reset();
        self.status = 0;
        self.device_features_select = 0;
        self.driver_features_select = 0;
        self.driver_features = 0;
        self.queue_select = 0;
        self.interrupt_status = 0;
        self.violation = None;
    }
}

/// Whether VIRTIO_RING_F_EVENT_IDX is in use: the driver accepted it and
/// the device accepted the driver's features (FEATURES_OK).
fn event_idx_negotiated(status: u32, driver_features: u64) -> bool {
    status & STATUS_FEATURES_OK != 0 && driver_features & FEATURE_EVENT_IDX != 0
}

/// One device step on queue `index`: the backend's pass, then avail_event
/// published; another pass while the driver made buffers available to a
/// ring the last pass drained (see [`Virtqueue::publish_avail_event`]).
fn run_batch<D: VirtioDevice>(
    device: &mut D,
    index: usize,
    queue: &mut Virtqueue,
    mem: &GuestMemory,
    now: VirtNanos,
) -> Result<(), QueueFault> {
    loop {
        queue.start_pass();
        device.process_queue(index, queue, mem, now)?;
        if !queue.publish_avail_event(mem)? {
            return Ok(());
        }
    }
}

impl VirtioMmioState {
    /// Checks that the ready queues have their rings inside `mem` (see
    /// [`VirtqueueState::check_rings_in`]): whoever holds guest memory calls
    /// it before [`Persist::restore`], which cannot.
    pub fn check_rings_in(&self, mem: &GuestMemory) -> Result<(), RestoreError> {
        for (index, queue) in self.queues.iter().enumerate() {
            queue
                .check_rings_in(mem)
                .map_err(|error| error.in_queue(index))?;
        }
        Ok(())
    }
}

/// The transport's registers and queues; the backend saves its own state.
impl<D: VirtioDevice> Persist for VirtioMmioTransport<D> {
    type State = VirtioMmioState;

    fn save(&self) -> VirtioMmioState {
        VirtioMmioState {
            status: self.status,
            device_features_select: self.device_features_select,
            driver_features_select: self.driver_features_select,
            driver_features: self.driver_features,
            queue_select: self.queue_select,
            interrupt_status: self.interrupt_status,
            config_generation: self.config_generation,
            queues: self.queues.iter().map(Virtqueue::save).collect(),
            violation: self.violation,
        }
    }

    /// One state per queue of the device, each valid for it, and a status
    /// made of device status bits.
    fn validate(&self, state: &VirtioMmioState) -> Result<(), RestoreError> {
        if state.queues.len() != self.queues.len() {
            return Err(RestoreError::VirtqueueCount {
                len: state.queues.len(),
                expected: self.queues.len(),
            });
        }
        if state.status & !(DRIVER_STATUS_BITS | STATUS_NEEDS_RESET) != 0 {
            return Err(RestoreError::VirtioStatus {
                status: state.status,
            });
        }
        let event_idx = event_idx_negotiated(state.status, state.driver_features);
        for (index, (queue, queue_state)) in self.queues.iter().zip(&state.queues).enumerate() {
            queue
                .validate(queue_state)
                .map_err(|error| error.in_queue(index))?;
            if queue_state.event_idx_enabled != event_idx {
                let reason = format!(
                    "event_idx_enabled is {}, but VIRTIO_RING_F_EVENT_IDX is {}negotiated",
                    queue_state.event_idx_enabled,
                    if event_idx { "" } else { "not " }
                );
                return Err(RestoreError::VirtqueueState { reason }.in_queue(index));
            }
        }
        Ok(())
    }

    /// Restores the transport; the backend is restored by its owner, and
    /// the rings are checked against guest memory by its holder
    /// ([`VirtioMmioState::check_rings_in`]).
    fn restore(&mut self, state: &VirtioMmioState) -> Result<(), RestoreError> {
        self.validate(state)?;
        for (index, (queue, queue_state)) in self.queues.iter_mut().zip(&state.queues).enumerate() {
            queue
                .restore(queue_state)
                .map_err(|error| error.in_queue(index))?;
        }
        self.status = state.status;
        self.device_features_select = state.device_features_select;
        self.driver_features_select = state.driver_features_select;
        self.driver_features = state.driver_features;
        self.queue_select = state.queue_select;
        self.interrupt_status = state.interrupt_status;
        self.config_generation = state.config_generation;
        self.violation = state.violation;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::rng::{VirtioRng, RNG_QUEUE_SIZE};
    use crate::virtio::testing::*;
    use virtio_bindings::virtio_ring::{
        VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
    };

    const KEY: [u8; 32] = [7; 32];
    const QUEUE_SIZE: u16 = 16;
    const NEXT: u16 = VRING_DESC_F_NEXT as u16;
    const WRITE: u16 = VRING_DESC_F_WRITE as u16;
    const INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

    fn new_rng() -> DirectTransport<VirtioRng> {
        DirectTransport::new(VirtioRng::new(KEY))
    }

    /// A live rng with queue 0 at QUEUE0_BASE.
    fn live_rng() -> (DirectTransport<VirtioRng>, DriverQueue) {
        let mut device = new_rng();
        let queue = DriverQueue::new(QUEUE0_BASE, QUEUE_SIZE);
        initialize(&mut device, &[&queue]);
        (device, queue)
    }

    fn assert_broken(device: &mut DirectTransport<VirtioRng>, expected: VirtioViolation) {
        assert_eq!(device.transport.violation(), Some(expected));
        assert_ne!(device.read32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
        assert_ne!(
            device.read32(REG_INTERRUPT_STATUS) & INTERRUPT_CONFIG_CHANGE,
            0
        );
        assert!(device.transport.interrupt_pending());
    }

    fn queue_fault(fault: QueueFault) -> VirtioViolation {
        VirtioViolation::Queue { queue: 0, fault }
    }

    /// Makes descriptor `head` available and notifies queue 0.
    fn offer_head(device: &mut DirectTransport<VirtioRng>, queue: &mut DriverQueue, head: u16) {
        queue.make_available(&device.mem, head);
        device.write32(REG_QUEUE_NOTIFY, 0);
    }

    #[test]
    fn test_mmio_identification_registers() {
        // Arrange
        let mut device = new_rng();

        // Act
        let magic = device.read32(REG_MAGIC);
        let version = device.read32(REG_VERSION);
        let device_id = device.read32(REG_DEVICE_ID);
        device.write32(REG_QUEUE_SEL, 0);
        let queue0_max = device.read32(REG_QUEUE_NUM_MAX);
        let queue0_ready = device.read32(REG_QUEUE_READY);
        device.write32(REG_QUEUE_SEL, 1);
        let queue1_max = device.read32(REG_QUEUE_NUM_MAX);

        // Assert
        assert_eq!(magic, 0x7472_6976);
        assert_eq!(version, 2);
        assert_eq!(device_id, 4);
        assert_eq!(queue0_max, u32::from(RNG_QUEUE_SIZE));
        assert_eq!(queue0_ready, 0);
        assert_eq!(queue1_max, 0);
        assert_eq!(device.read32(REG_SHM_LEN_LOW), u32::MAX);
        assert_eq!(device.read32(REG_CONFIG_GENERATION), 0);
        assert_eq!(device.transport.violation(), None);
    }

    #[test]
    fn test_mmio_device_features_offer_version_1_and_event_idx() {
        // Arrange
        let mut device = new_rng();

        // Act
        let words: Vec<u32> = (0..3)
            .map(|select| {
                device.write32(REG_DEVICE_FEATURES_SEL, select);
                device.read32(REG_DEVICE_FEATURES)
            })
            .collect();

        // Assert: bit 29 is EVENT_IDX; bit 32 is bit 0 of the high word.
        assert_eq!(words, [1 << 29, 1, 0]);
    }

    #[test]
    fn test_mmio_initialization_reaches_driver_ok() {
        // Arrange / Act
        let (mut device, queue) = live_rng();

        // Assert
        assert_eq!(device.read32(REG_STATUS), STATUS_LIVE);
        device.write32(REG_QUEUE_SEL, 0);
        assert_eq!(device.read32(REG_QUEUE_READY), 1);
        let saved = device.transport.save().queues[0];
        assert_eq!(
            (
                saved.size,
                saved.desc_table,
                saved.avail_ring,
                saved.used_ring
            ),
            (QUEUE_SIZE, queue.desc, queue.avail, queue.used)
        );
        assert_eq!(device.transport.violation(), None);
        assert!(!device.transport.interrupt_pending());
    }

    #[test]
    fn test_mmio_features_ok_refused_without_version_1() {
        // Arrange
        let mut device = new_rng();
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE);
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);

        // Act
        device.write32(REG_STATUS, STATUS_UP_TO_FEATURES_OK);

        // Assert: refused the spec's way, not a violation.
        assert_eq!(
            device.read32(REG_STATUS),
            STATUS_ACKNOWLEDGE | STATUS_DRIVER
        );
        assert_eq!(device.transport.violation(), None);
    }

    #[test]
    fn test_mmio_features_ok_refused_for_features_not_offered() {
        // Arrange
        let mut device = new_rng();
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE);
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        device.write32(REG_DRIVER_FEATURES_SEL, 1);
        device.write32(REG_DRIVER_FEATURES, 1);
        device.write32(REG_DRIVER_FEATURES_SEL, 0);
        device.write32(REG_DRIVER_FEATURES, 1 << 28); // INDIRECT_DESC, never offered

        // Act
        device.write32(REG_STATUS, STATUS_UP_TO_FEATURES_OK);

        // Assert
        assert_eq!(device.read32(REG_STATUS) & STATUS_FEATURES_OK, 0);
        assert_eq!(device.transport.violation(), None);
    }

    #[test]
    fn test_mmio_driver_features_fixed_after_features_ok() {
        // Arrange
        let mut device = new_rng();
        negotiate(&mut device);

        // Act
        device.write32(REG_DRIVER_FEATURES_SEL, 0);
        device.write32(REG_DRIVER_FEATURES, 0xffff_ffff);

        // Assert
        assert_eq!(device.transport.driver_features(), FEATURE_VERSION_1);
    }

    #[test]
    fn test_mmio_status_skipping_a_step_breaks_device() {
        // Arrange
        let mut device = new_rng();

        // Act
        device.write32(REG_STATUS, STATUS_DRIVER);

        // Assert
        assert_broken(
            &mut device,
            VirtioViolation::InvalidStatusTransition {
                previous: 0,
                written: STATUS_DRIVER,
            },
        );
    }

    #[test]
    fn test_mmio_status_driver_ok_before_features_ok_breaks_device() {
        // Arrange
        let mut device = new_rng();
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE);
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);

        // Act
        device.write32(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_DRIVER_OK,
        );

        // Assert
        assert_broken(
            &mut device,
            VirtioViolation::InvalidStatusTransition {
                previous: STATUS_ACKNOWLEDGE | STATUS_DRIVER,
                written: STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_DRIVER_OK,
            },
        );
    }

    #[test]
    fn test_mmio_status_clearing_a_bit_breaks_device() {
        // Arrange
        let mut device = new_rng();
        negotiate(&mut device);

        // Act
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE);

        // Assert
        assert_broken(
            &mut device,
            VirtioViolation::InvalidStatusTransition {
                previous: STATUS_UP_TO_FEATURES_OK,
                written: STATUS_ACKNOWLEDGE,
            },
        );
    }

    #[test]
    fn test_mmio_status_unknown_bit_breaks_device() {
        // Arrange
        let mut device = new_rng();

        // Act
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE | 0x10);

        // Assert
        assert!(matches!(
            device.transport.violation(),
            Some(VirtioViolation::InvalidStatusTransition { .. })
        ));
    }

    #[test]
    fn test_mmio_failed_stops_processing_without_a_violation() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        device.write32(REG_STATUS, STATUS_LIVE | STATUS_FAILED);

        // Act
        queue.add_chain(&device.mem, &[writable(DATA_BASE, 16)]);
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_eq!(device.transport.violation(), None);
        assert_eq!(queue.used_idx(&device.mem), 0);
        assert!(!device.transport.interrupt_pending());
    }

    #[test]
    fn test_mmio_notify_processes_synchronously_and_raises_used_interrupt() {
        // Arrange
        let (mut device, mut queue) = live_rng();

        // Act
        let head = queue.add_chain(&device.mem, &[writable(DATA_BASE, 32)]);
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_eq!(queue.take_used(&device.mem), [(u32::from(head), 32)]);
        assert_eq!(device.read32(REG_INTERRUPT_STATUS), INTERRUPT_USED_BUFFER);
    }

    #[test]
    fn test_mmio_interrupt_ack_clears_only_acknowledged_bits() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        queue.add_chain(&device.mem, &[writable(DATA_BASE, 8)]);
        device.write32(REG_QUEUE_NOTIFY, 0);
        device.write32(REG_QUEUE_NOTIFY, 9); // no such queue: broken, config interrupt

        // Act
        device.write32(REG_INTERRUPT_ACK, INTERRUPT_USED_BUFFER);
        let after_first_ack = device.read32(REG_INTERRUPT_STATUS);
        device.write32(REG_INTERRUPT_ACK, INTERRUPT_CONFIG_CHANGE);

        // Assert
        assert_eq!(after_first_ack, INTERRUPT_CONFIG_CHANGE);
        assert_eq!(device.read32(REG_INTERRUPT_STATUS), 0);
        assert!(!device.transport.interrupt_pending());
    }

    #[test]
    fn test_mmio_notify_before_driver_ok_waits_for_driver_ok() {
        // Arrange
        let mut device = new_rng();
        let mut queue = DriverQueue::new(QUEUE0_BASE, QUEUE_SIZE);
        negotiate(&mut device);
        setup_queue(&mut device, 0, &queue);
        queue.add_chain(&device.mem, &[writable(DATA_BASE, 8)]);

        // Act
        device.write32(REG_QUEUE_NOTIFY, 0);
        let used_before_driver_ok = queue.used_idx(&device.mem);
        device.write32(REG_STATUS, STATUS_LIVE);

        // Assert
        assert_eq!(used_before_driver_ok, 0);
        assert_eq!(queue.used_idx(&device.mem), 1);
        assert_eq!(device.transport.violation(), None);
    }

    #[test]
    fn test_mmio_reset_clears_broken_state_and_device_works_again() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        device.write32(REG_QUEUE_NOTIFY, 5);
        assert!(device.transport.violation().is_some());

        // Act
        device.write32(REG_STATUS, 0);
        let status_after_reset = device.read32(REG_STATUS);
        let interrupt_after_reset = device.read32(REG_INTERRUPT_STATUS);
        queue = DriverQueue::new(queue.desc, QUEUE_SIZE);
        initialize(&mut device, &[&queue]);
        queue.add_chain(&device.mem, &[writable(DATA_BASE, 8)]);
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_eq!(status_after_reset, 0);
        assert_eq!(interrupt_after_reset, 0);
        assert_eq!(device.transport.violation(), None);
        assert_eq!(queue.used_idx(&device.mem), 1);
    }

    #[test]
    fn test_mmio_invalid_queue_sizes_break_device() {
        for size in [0u32, 3, 12, u32::from(RNG_QUEUE_SIZE) * 2, 0x1_0010] {
            // Arrange
            let mut device = new_rng();
            negotiate(&mut device);
            device.write32(REG_QUEUE_SEL, 0);

            // Act
            device.write32(REG_QUEUE_NUM, size);

            // Assert
            assert_broken(
                &mut device,
                queue_fault(QueueFault::InvalidSize {
                    size,
                    max: RNG_QUEUE_SIZE,
                }),
            );
        }
    }

    #[test]
    fn test_mmio_misaligned_rings_break_device() {
        for (register, address, part) in [
            (REG_QUEUE_DESC_LOW, 0x1008u32, RingPart::DescriptorTable),
            (REG_QUEUE_AVAIL_LOW, 0x1001, RingPart::AvailRing),
            (REG_QUEUE_USED_LOW, 0x1002, RingPart::UsedRing),
        ] {
            // Arrange
            let mut device = new_rng();
            negotiate(&mut device);
            device.write32(REG_QUEUE_SEL, 0);

            // Act
            device.write32(register, address);

            // Assert
            assert_broken(
                &mut device,
                queue_fault(QueueFault::MisalignedRing {
                    part,
                    address: u64::from(address),
                }),
            );
        }
    }

    #[test]
    fn test_mmio_rings_outside_memory_break_device_and_queue_stays_not_ready() {
        // Arrange
        let mut device = new_rng();
        negotiate(&mut device);
        let queue = DriverQueue::new(QUEUE0_BASE, QUEUE_SIZE);
        device.write32(REG_QUEUE_SEL, 0);
        device.write32(REG_QUEUE_NUM, u32::from(QUEUE_SIZE));
        device.write32(REG_QUEUE_DESC_LOW, queue.desc as u32);
        device.write32(REG_QUEUE_AVAIL_LOW, queue.avail as u32);
        device.write32(REG_QUEUE_USED_LOW, queue.used as u32);
        device.write32(REG_QUEUE_USED_HIGH, 1); // 4 GiB up: no memory there

        // Act
        device.write32(REG_QUEUE_READY, 1);

        // Assert
        assert_broken(&mut device, queue_fault(QueueFault::RingOutsideMemory));
        assert_eq!(device.read32(REG_QUEUE_READY), 0);
    }

    #[test]
    fn test_mmio_ring_straddling_end_of_memory_breaks_device() {
        // Arrange: a 16-entry table needs 256 bytes; only 128 are left.
        let mut device = new_rng();
        negotiate(&mut device);
        let mut queue = DriverQueue::new(QUEUE0_BASE, QUEUE_SIZE);
        queue.desc = MEMORY_SIZE - 0x80;

        // Act
        setup_queue(&mut device, 0, &queue);

        // Assert
        assert_broken(&mut device, queue_fault(QueueFault::RingOutsideMemory));
    }

    #[test]
    fn test_mmio_avail_ring_at_address_zero_is_refused() {
        // Arrange
        let mut device = new_rng();
        negotiate(&mut device);
        let mut queue = DriverQueue::new(QUEUE0_BASE, QUEUE_SIZE);
        queue.avail = 0;

        // Act
        setup_queue(&mut device, 0, &queue);

        // Assert
        assert_broken(&mut device, queue_fault(QueueFault::RingOutsideMemory));
    }

    #[test]
    fn test_mmio_queue_write_while_ready_breaks_device() {
        // Arrange
        let (mut device, _queue) = live_rng();

        // Act
        device.write32(REG_QUEUE_SEL, 0);
        device.write32(REG_QUEUE_DESC_LOW, 0x4000);

        // Assert
        assert_broken(&mut device, queue_fault(QueueFault::WriteWhileReady));
    }

    #[test]
    fn test_mmio_configuring_a_missing_queue_breaks_device() {
        // Arrange
        let mut device = new_rng();
        negotiate(&mut device);

        // Act
        device.write32(REG_QUEUE_SEL, 3);
        let num_max = device.read32(REG_QUEUE_NUM_MAX);
        device.write32(REG_QUEUE_NUM, 16);

        // Assert
        assert_eq!(num_max, 0);
        assert_broken(&mut device, VirtioViolation::NoSuchQueue { queue: 3 });
    }

    #[test]
    fn test_mmio_notify_of_missing_queue_breaks_device() {
        // Arrange
        let (mut device, _queue) = live_rng();

        // Act
        device.write32(REG_QUEUE_NOTIFY, 0xffff_ffff);

        // Assert
        assert_broken(
            &mut device,
            VirtioViolation::NoSuchQueue { queue: 0xffff_ffff },
        );
    }

    #[test]
    fn test_mmio_narrow_and_misaligned_register_accesses_are_ignored() {
        // Arrange
        let mut device = new_rng();
        let mut narrow = [0xaau8; 2];
        let mut wide = [0xaau8; 8];

        // Act
        device.transport.read(REG_MAGIC, &mut narrow);
        device.transport.read(REG_MAGIC, &mut wide);
        device
            .transport
            .write(REG_STATUS, &[1, 0], &device.mem, device.now);
        device
            .transport
            .write(REG_STATUS + 1, &[1, 0, 0, 0], &device.mem, device.now);

        // Assert
        assert_eq!(narrow, [0, 0]);
        assert_eq!(wide, [0; 8]);
        assert_eq!(device.read32(REG_STATUS), 0);
        assert_eq!(device.transport.violation(), None);
    }

    #[test]
    fn test_mmio_config_space_reads_zero_at_any_width() {
        // Arrange
        let mut device = new_rng();

        // Act / Assert
        for (offset, len) in [(REG_CONFIG, 1), (REG_CONFIG + 2, 2), (0xff8, 8)] {
            let mut data = vec![0xaau8; len];
            device.transport.read(offset, &mut data);
            assert!(data.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn test_chain_loop_breaks_device() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        queue.write_descriptor(&device.mem, 0, DATA_BASE, 8, NEXT | WRITE, 1);
        queue.write_descriptor(&device.mem, 1, DATA_BASE + 8, 8, NEXT | WRITE, 0);

        // Act
        offer_head(&mut device, &mut queue, 0);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::ChainTooLong {
                head: 0,
                size: QUEUE_SIZE,
            }),
        );
        assert_eq!(queue.used_idx(&device.mem), 0);
    }

    #[test]
    fn test_chain_self_loop_breaks_device() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        queue.write_descriptor(&device.mem, 4, DATA_BASE, 8, NEXT | WRITE, 4);

        // Act
        offer_head(&mut device, &mut queue, 4);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::ChainTooLong {
                head: 4,
                size: QUEUE_SIZE,
            }),
        );
    }

    #[test]
    fn test_chain_next_index_out_of_range_breaks_device() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        queue.write_descriptor(&device.mem, 0, DATA_BASE, 8, NEXT | WRITE, QUEUE_SIZE);

        // Act
        offer_head(&mut device, &mut queue, 0);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::DescriptorIndexOutOfRange {
                index: QUEUE_SIZE,
                size: QUEUE_SIZE,
            }),
        );
    }

    #[test]
    fn test_chain_head_index_out_of_range_breaks_device() {
        // Arrange
        let (mut device, mut queue) = live_rng();

        // Act
        offer_head(&mut device, &mut queue, 0xffff);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::DescriptorIndexOutOfRange {
                index: 0xffff,
                size: QUEUE_SIZE,
            }),
        );
    }

    #[test]
    fn test_buffer_outside_memory_breaks_device_and_writes_nothing() {
        // Arrange: the buffer's first half is the last 8 bytes of memory.
        let (mut device, mut queue) = live_rng();
        let tail = MEMORY_SIZE - 8;
        write_bytes(&device.mem, tail, &[0xaa; 8]);
        queue.write_descriptor(&device.mem, 0, tail, 16, WRITE, 0);

        // Act
        offer_head(&mut device, &mut queue, 0);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::BufferOutsideMemory {
                index: 0,
                address: tail,
                len: 16,
            }),
        );
        assert_eq!(read_bytes(&device.mem, tail, 8), [0xaa; 8]);
    }

    #[test]
    fn test_buffer_address_overflow_breaks_device() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        let address = u64::MAX - 7;
        queue.write_descriptor(&device.mem, 0, address, 16, WRITE, 0);

        // Act
        offer_head(&mut device, &mut queue, 0);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::BufferAddressOverflow {
                index: 0,
                address,
                len: 16,
            }),
        );
    }

    #[test]
    fn test_chain_length_overflow_breaks_device() {
        // Arrange: 2 GiB + 2 GiB does not fit the used ring's 32-bit length.
        let (mut device, mut queue) = live_rng();
        queue.write_descriptor(&device.mem, 0, DATA_BASE, 0x8000_0000, NEXT | WRITE, 1);
        queue.write_descriptor(&device.mem, 1, DATA_BASE, 0x8000_0000, WRITE, 0);

        // Act
        offer_head(&mut device, &mut queue, 0);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::ChainLengthOverflow { head: 0 }),
        );
    }

    #[test]
    fn test_read_only_descriptor_the_device_must_write_breaks_device() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        write_bytes(&device.mem, DATA_BASE, &[0x55; 16]);

        // Act
        queue.add_chain(&device.mem, &[readable(DATA_BASE, 16)]);
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::ReadOnlyDescriptor { index: 0 }),
        );
        assert_eq!(read_bytes(&device.mem, DATA_BASE, 16), [0x55; 16]);
    }

    #[test]
    fn test_readable_after_writable_breaks_device() {
        // Arrange
        let (mut device, mut queue) = live_rng();

        // Act
        queue.add_chain(
            &device.mem,
            &[writable(DATA_BASE, 8), readable(DATA_BASE + 8, 8)],
        );
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::ReadableAfterWritable { index: 1 }),
        );
    }

    #[test]
    fn test_indirect_descriptor_breaks_device() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        queue.write_descriptor(&device.mem, 0, DATA_BASE, 32, INDIRECT, 0);

        // Act
        offer_head(&mut device, &mut queue, 0);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::IndirectDescriptor { index: 0 }),
        );
    }

    #[test]
    fn test_avail_index_jump_breaks_device() {
        // Arrange
        let (mut device, mut queue) = live_rng();

        // Act
        queue.set_avail_idx(&device.mem, QUEUE_SIZE + 1);
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_broken(
            &mut device,
            queue_fault(QueueFault::AvailIndexJump {
                distance: QUEUE_SIZE + 1,
                size: QUEUE_SIZE,
            }),
        );
        assert_eq!(queue.used_idx(&device.mem), 0);
    }

    #[test]
    fn test_buffers_used_before_a_fault_are_returned_and_notified() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        let good = queue.add_chain(&device.mem, &[writable(DATA_BASE, 8)]);
        queue.add_chain(&device.mem, &[readable(DATA_BASE + 8, 8)]);

        // Act
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_eq!(queue.take_used(&device.mem), [(u32::from(good), 8)]);
        assert_eq!(
            device.read32(REG_INTERRUPT_STATUS),
            INTERRUPT_USED_BUFFER | INTERRUPT_CONFIG_CHANGE
        );
    }

    #[test]
    fn test_broken_device_processes_nothing_until_reset() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        device.write32(REG_QUEUE_NOTIFY, 1);

        // Act
        queue.add_chain(&device.mem, &[writable(DATA_BASE, 8)]);
        device.write32(REG_QUEUE_NOTIFY, 0);
        device.transport.process_all_queues(&device.mem, device.now);

        // Assert
        assert_eq!(queue.used_idx(&device.mem), 0);
        assert_eq!(
            device.transport.violation(),
            Some(VirtioViolation::NoSuchQueue { queue: 1 })
        );
    }

    #[test]
    fn test_empty_buffer_is_never_accessed_wherever_it_points() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        queue.write_descriptor(&device.mem, 0, u64::MAX, 0, WRITE, 0);

        // Act
        offer_head(&mut device, &mut queue, 0);

        // Assert
        assert_eq!(device.transport.violation(), None);
        assert_eq!(queue.take_used(&device.mem), [(0, 0)]);
    }

    /// xorshift64: deterministic garbage for the abuse test.
    fn next_garbage(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn test_garbage_rings_never_panic_and_never_write_outside_buffers() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..300 {
            // Arrange: random descriptors, half of them pointing into a
            // sentinel-filled data area, and a random available ring.
            let (mut device, mut queue) = live_rng();
            let data_len = 0x1000u64;
            write_bytes(&device.mem, DATA_BASE, &vec![0xee; data_len as usize]);
            let mut in_bounds = Vec::new();
            for index in 0..QUEUE_SIZE {
                let garbage = next_garbage(&mut seed);
                let (address, len) = if garbage & 1 == 0 {
                    let offset = (garbage >> 8) % data_len;
                    let len = ((garbage >> 24) % (data_len - offset)) as u32;
                    (DATA_BASE + offset, len)
                } else {
                    (next_garbage(&mut seed), (garbage >> 32) as u32)
                };
                let flags = (garbage >> 40) as u16 & (NEXT | WRITE | INDIRECT);
                let next = ((garbage >> 48) as u16) % (QUEUE_SIZE + 2);
                queue.write_descriptor(&device.mem, index, address, len, flags, next);
                if garbage & 1 == 0 {
                    in_bounds.push((address, len));
                }
            }
            for _ in 0..1 + round % 4 {
                let head = (next_garbage(&mut seed) as u16) % (QUEUE_SIZE + 1);
                queue.make_available(&device.mem, head);
            }

            // Act
            device.write32(REG_QUEUE_NOTIFY, 0);

            // Assert: every changed data byte lies in some descriptor's buffer.
            let data = read_bytes(&device.mem, DATA_BASE, data_len as usize);
            for (offset, &byte) in data.iter().enumerate() {
                let address = DATA_BASE + offset as u64;
                if byte != 0xee {
                    assert!(
                        in_bounds
                            .iter()
                            .any(|&(start, len)| (start..start + u64::from(len)).contains(&address)),
                        "round {round}: byte at {address:#x} written outside every buffer"
                    );
                }
            }
            assert!(device.transport.violation().is_some() || queue.used_idx(&device.mem) > 0);
        }
    }

    #[test]
    fn test_mmio_state_round_trip_restores_queues_and_status() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        queue.add_chain(&device.mem, &[writable(DATA_BASE, 8)]);
        device.write32(REG_QUEUE_NOTIFY, 0);
        let saved = device.transport.save();
        let json = serde_json::to_string(&saved).unwrap();

        // Act
        let mut restored = DirectTransport::new(VirtioRng::new(KEY));
        restored.mem = device.mem.clone();
        restored
            .transport
            .restore(&serde_json::from_str(&json).unwrap())
            .unwrap();
        queue.add_chain(&restored.mem, &[writable(DATA_BASE + 8, 8)]);
        restored.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_eq!(saved.queues[0].next_avail, 1);
        assert_eq!(saved.queues[0].next_used, 1);
        assert_eq!(saved.status, STATUS_LIVE);
        assert_eq!(queue.used_idx(&restored.mem), 2);
        assert_eq!(restored.transport.save().queues[0].next_avail, 2);
        assert_eq!(restored.transport.violation(), None);
    }

    #[test]
    fn test_mmio_restore_rejects_state_no_device_could_have() {
        // Arrange
        let (mut device, _queue) = live_rng();
        let before = device.transport.save();
        let mut bad_size = before.clone();
        bad_size.queues[0].size = 3;
        let mut outside_memory = before.clone();
        outside_memory.queues[0].used_ring = MEMORY_SIZE;
        let mut misaligned = before.clone();
        misaligned.queues[0].desc_table = QUEUE0_BASE + 8;
        let mut wrong_count = before.clone();
        wrong_count.queues.push(before.queues[0]);
        let mut bad_status = before.clone();
        bad_status.status = 0x10;

        // Act
        let results: Vec<_> = [
            bad_size,
            outside_memory,
            misaligned,
            wrong_count,
            bad_status,
        ]
        .iter()
        .map(|state| {
            state
                .check_rings_in(&device.mem)
                .and_then(|()| device.transport.restore(state))
        })
        .collect();

        // Assert
        assert!(results.iter().all(Result::is_err));
        assert_eq!(device.transport.save(), before);
        assert_eq!(device.read32(REG_STATUS), STATUS_LIVE);
    }

    /// A live rng that used one buffer.
    fn used_rng() -> VirtioMmioTransport<VirtioRng> {
        let (mut device, mut queue) = live_rng();
        queue.add_chain(&device.mem, &[writable(DATA_BASE, 8)]);
        device.write32(REG_QUEUE_NOTIFY, 0);
        device.transport
    }

    crate::persist::persist_round_trip_tests! {
        mod transport_persist {
            fresh: new_rng().transport,
            saved: used_rng(),
            mutate: |transport: &mut VirtioMmioTransport<VirtioRng>| {
                transport.reset();
            },
        }
    }

    /// A queue configured and ready, as the driver leaves it.
    fn configured_queue() -> Virtqueue {
        let mem = test_memory();
        let driver = DriverQueue::new(QUEUE0_BASE, QUEUE_SIZE);
        let mut queue = Virtqueue::new(RNG_QUEUE_SIZE).unwrap();
        queue.set_size(u32::from(QUEUE_SIZE)).unwrap();
        for (part, address) in [
            (RingPart::DescriptorTable, driver.desc),
            (RingPart::AvailRing, driver.avail),
            (RingPart::UsedRing, driver.used),
        ] {
            queue.set_address_half(part, false, address as u32).unwrap();
        }
        queue.set_ready(true, &mem).unwrap();
        queue
    }

    crate::persist::persist_round_trip_tests! {
        mod virtqueue_persist {
            fresh: Virtqueue::new(RNG_QUEUE_SIZE).unwrap(),
            saved: configured_queue(),
            mutate: Virtqueue::reset,
        }
    }

    #[test]
    fn test_virtqueue_restore_rejects_another_maximum_size() {
        // Arrange
        let mut queue = Virtqueue::new(QUEUE_SIZE).unwrap();
        let state = configured_queue().save();

        // Act
        let result = queue.restore(&state);

        // Assert
        assert_eq!(
            result,
            Err(RestoreError::VirtqueueMaxSize {
                max_size: RNG_QUEUE_SIZE,
                expected: QUEUE_SIZE
            })
        );
    }
}
