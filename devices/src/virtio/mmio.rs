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
    pub(super) fn reset(&mut self) {
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
