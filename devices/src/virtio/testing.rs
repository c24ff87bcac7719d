//! Test helpers: a small guest memory, the driver's side of a split
//! virtqueue laid out by hand in it, and Linux's initialization sequence
//! over any register access path.

use super::mmio::{
    VirtioMmioTransport, FEATURE_EVENT_IDX, FEATURE_VERSION_1, STATUS_ACKNOWLEDGE, STATUS_DRIVER,
    STATUS_DRIVER_OK, STATUS_FEATURES_OK,
};
use super::queue::need_event;
use super::VirtioDevice;
use crate::time::VirtNanos;
use crate::GuestMemory;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress};

pub const MEMORY_SIZE: u64 = 0x10_0000;
/// Where the tests put their queues and their data buffers.
pub const QUEUE0_BASE: u64 = 0x1_0000;
pub const QUEUE1_BASE: u64 = 0x2_0000;
pub const DATA_BASE: u64 = 0x8_0000;

pub const REG_MAGIC: u64 = 0x000;
pub const REG_VERSION: u64 = 0x004;
pub const REG_DEVICE_ID: u64 = 0x008;
pub const REG_DEVICE_FEATURES: u64 = 0x010;
pub const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
pub const REG_DRIVER_FEATURES: u64 = 0x020;
pub const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
pub const REG_QUEUE_SEL: u64 = 0x030;
pub const REG_QUEUE_NUM_MAX: u64 = 0x034;
pub const REG_QUEUE_NUM: u64 = 0x038;
pub const REG_QUEUE_READY: u64 = 0x044;
pub const REG_QUEUE_NOTIFY: u64 = 0x050;
pub const REG_INTERRUPT_STATUS: u64 = 0x060;
pub const REG_INTERRUPT_ACK: u64 = 0x064;
pub const REG_STATUS: u64 = 0x070;
pub const REG_QUEUE_DESC_LOW: u64 = 0x080;
pub const REG_QUEUE_DESC_HIGH: u64 = 0x084;
pub const REG_QUEUE_AVAIL_LOW: u64 = 0x090;
pub const REG_QUEUE_AVAIL_HIGH: u64 = 0x094;
pub const REG_QUEUE_USED_LOW: u64 = 0x0a0;
pub const REG_QUEUE_USED_HIGH: u64 = 0x0a4;
pub const REG_SHM_LEN_LOW: u64 = 0x0b0;
pub const REG_CONFIG_GENERATION: u64 = 0x0fc;
pub const REG_CONFIG: u64 = 0x100;

pub const STATUS_UP_TO_FEATURES_OK: u32 = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
pub const STATUS_LIVE: u32 = STATUS_UP_TO_FEATURES_OK | STATUS_DRIVER_OK;

pub fn test_memory() -> GuestMemory {
    GuestMemory::from_ranges(&[(GuestAddress(0), MEMORY_SIZE as usize)]).unwrap()
}

pub fn read_bytes(mem: &GuestMemory, address: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    mem.read_slice(&mut bytes, GuestAddress(address)).unwrap();
    bytes
}

pub fn write_bytes(mem: &GuestMemory, address: u64, bytes: &[u8]) {
    mem.write_slice(bytes, GuestAddress(address)).unwrap();
}

/// One buffer of a chain as the driver describes it.
#[derive(Clone, Copy, Debug)]
pub struct Buffer {
    pub address: u64,
    pub len: u32,
    pub device_writable: bool,
}

pub fn readable(address: u64, len: u32) -> Buffer {
    Buffer {
        address,
        len,
        device_writable: false,
    }
}

pub fn writable(address: u64, len: u32) -> Buffer {
    Buffer {
        address,
        len,
        device_writable: true,
    }
}

/// The driver's side of one split virtqueue: descriptor table, available
/// ring and used ring laid out back to back from `base`.
#[derive(Clone, Debug)]
pub struct DriverQueue {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    avail_idx: u16,
    next_descriptor: u16,
    used_seen: u16,
}

impl DriverQueue {
    pub fn new(base: u64, size: u16) -> Self {
        let desc = base;
        let avail = desc + 16 * u64::from(size);
        let used = (avail + 6 + 2 * u64::from(size)).next_multiple_of(4);
        DriverQueue {
            size,
            desc,
            avail,
            used,
            avail_idx: 0,
            next_descriptor: 0,
            used_seen: 0,
        }
    }

    pub fn write_descriptor(
        &self,
        mem: &GuestMemory,
        index: u16,
        address: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let mut entry = [0u8; 16];
        entry[0..8].copy_from_slice(&address.to_le_bytes());
        entry[8..12].copy_from_slice(&len.to_le_bytes());
        entry[12..14].copy_from_slice(&flags.to_le_bytes());
        entry[14..16].copy_from_slice(&next.to_le_bytes());
        write_bytes(mem, self.desc + 16 * u64::from(index), &entry);
    }

    /// Puts `head` in the next available-ring entry and publishes it.
    pub fn make_available(&mut self, mem: &GuestMemory, head: u16) {
        let slot = u64::from(self.avail_idx % self.size);
        write_bytes(mem, self.avail + 4 + 2 * slot, &head.to_le_bytes());
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.set_avail_idx(mem, self.avail_idx);
    }

    pub fn set_avail_idx(&mut self, mem: &GuestMemory, idx: u16) {
        self.avail_idx = idx;
        write_bytes(mem, self.avail + 2, &idx.to_le_bytes());
    }

    /// Writes `buffers` as a chain into fresh descriptors, makes it
    /// available and returns its head.
    pub fn add_chain(&mut self, mem: &GuestMemory, buffers: &[Buffer]) -> u16 {
        let head = self.next_descriptor;
        for (i, buffer) in buffers.iter().enumerate() {
            let index = head + i as u16;
            let last = i + 1 == buffers.len();
            let mut flags = if last { 0 } else { VRING_DESC_F_NEXT as u16 };
            if buffer.device_writable {
                flags |= VRING_DESC_F_WRITE as u16;
            }
            self.write_descriptor(mem, index, buffer.address, buffer.len, flags, index + 1);
        }
        self.next_descriptor = head + buffers.len() as u16;
        self.make_available(mem, head);
        head
    }

    /// The available index the driver published last.
    pub fn avail_idx(&self) -> u16 {
        self.avail_idx
    }

    /// The available ring's flags (VRING_AVAIL_F_NO_INTERRUPT is bit 0).
    pub fn set_avail_flags(&self, mem: &GuestMemory, flags: u16) {
        write_bytes(mem, self.avail, &flags.to_le_bytes());
    }

    /// used_event, after the available ring's entries.
    pub fn set_used_event(&self, mem: &GuestMemory, idx: u16) {
        write_bytes(
            mem,
            self.avail + 4 + 2 * u64::from(self.size),
            &idx.to_le_bytes(),
        );
    }

    /// avail_event, after the used ring's entries.
    pub fn avail_event(&self, mem: &GuestMemory) -> u16 {
        let bytes = read_bytes(mem, self.used + 4 + 8 * u64::from(self.size), 2);
        u16::from_le_bytes([bytes[0], bytes[1]])
    }

    pub fn set_avail_event(&self, mem: &GuestMemory, idx: u16) {
        write_bytes(
            mem,
            self.used + 4 + 8 * u64::from(self.size),
            &idx.to_le_bytes(),
        );
    }

    /// Linux's virtqueue_kick_prepare with EVENT_IDX: whether the driver,
    /// having published entries from available index `old` up to now,
    /// must notify.
    pub fn kick_needed(&self, mem: &GuestMemory, old: u16) -> bool {
        need_event(self.avail_event(mem), self.avail_idx, old)
    }

    pub fn used_idx(&self, mem: &GuestMemory) -> u16 {
        let bytes = read_bytes(mem, self.used + 2, 2);
        u16::from_le_bytes([bytes[0], bytes[1]])
    }

    /// Used element `i`: (descriptor head, bytes written).
    pub fn used_element(&self, mem: &GuestMemory, i: u16) -> (u32, u32) {
        let slot = u64::from(i % self.size);
        let bytes = read_bytes(mem, self.used + 4 + 8 * slot, 8);
        (
            u32::from_le_bytes(bytes[0..4].try_into().unwrap()),
            u32::from_le_bytes(bytes[4..8].try_into().unwrap()),
        )
    }

    /// The used elements added since the last call.
    pub fn take_used(&mut self, mem: &GuestMemory) -> Vec<(u32, u32)> {
        let used_idx = self.used_idx(mem);
        let mut elements = Vec::new();
        while self.used_seen != used_idx {
            elements.push(self.used_element(mem, self.used_seen));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        elements
    }
}

/// 32-bit register access to one virtio-mmio window, whatever carries it.
pub trait Registers {
    fn write32(&mut self, offset: u64, value: u32);
    fn read32(&mut self, offset: u64) -> u32;
}

/// A transport driven directly, with its guest memory.
pub struct DirectTransport<D> {
    pub transport: VirtioMmioTransport<D>,
    pub mem: GuestMemory,
    pub now: VirtNanos,
}

impl<D: VirtioDevice> DirectTransport<D> {
    pub fn new(device: D) -> Self {
        DirectTransport {
            transport: VirtioMmioTransport::new(device).unwrap(),
            mem: test_memory(),
            now: VirtNanos(1_000),
        }
    }
}

impl<D: VirtioDevice> Registers for DirectTransport<D> {
    fn write32(&mut self, offset: u64, value: u32) {
        self.transport
            .write(offset, &value.to_le_bytes(), &self.mem, self.now);
    }

    fn read32(&mut self, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        self.transport.read(offset, &mut data);
        u32::from_le_bytes(data)
    }
}

/// Sets up queue `index` at the rings of `queue`, as Linux's vm_setup_vq does.
pub fn setup_queue(registers: &mut impl Registers, index: u32, queue: &DriverQueue) {
    registers.write32(REG_QUEUE_SEL, index);
    registers.write32(REG_QUEUE_NUM, u32::from(queue.size));
    for (low, high, address) in [
        (REG_QUEUE_DESC_LOW, REG_QUEUE_DESC_HIGH, queue.desc),
        (REG_QUEUE_AVAIL_LOW, REG_QUEUE_AVAIL_HIGH, queue.avail),
        (REG_QUEUE_USED_LOW, REG_QUEUE_USED_HIGH, queue.used),
    ] {
        registers.write32(low, address as u32);
        registers.write32(high, (address >> 32) as u32);
    }
    registers.write32(REG_QUEUE_READY, 1);
}

/// Reset, ACKNOWLEDGE, DRIVER, accept VIRTIO_F_VERSION_1, FEATURES_OK.
pub fn negotiate(registers: &mut impl Registers) {
    negotiate_features(registers, FEATURE_VERSION_1);
}

/// Reset, ACKNOWLEDGE, DRIVER, accept `features`, FEATURES_OK.
pub fn negotiate_features(registers: &mut impl Registers, features: u64) {
    registers.write32(REG_STATUS, 0);
    registers.write32(REG_STATUS, STATUS_ACKNOWLEDGE);
    registers.write32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    registers.write32(REG_DRIVER_FEATURES_SEL, 1);
    registers.write32(REG_DRIVER_FEATURES, (features >> 32) as u32);
    registers.write32(REG_DRIVER_FEATURES_SEL, 0);
    registers.write32(REG_DRIVER_FEATURES, features as u32);
    registers.write32(REG_STATUS, STATUS_UP_TO_FEATURES_OK);
}

/// The whole initialization sequence with `queues` set up in order.
pub fn initialize(registers: &mut impl Registers, queues: &[&DriverQueue]) {
    initialize_with_features(registers, FEATURE_VERSION_1, queues);
}

/// The whole initialization sequence, accepting VERSION_1 and EVENT_IDX, as
/// Linux does when the device offers EVENT_IDX.
pub fn initialize_with_event_idx(registers: &mut impl Registers, queues: &[&DriverQueue]) {
    initialize_with_features(registers, FEATURE_VERSION_1 | FEATURE_EVENT_IDX, queues);
}

/// The whole initialization sequence, accepting `features`.
pub fn initialize_with_features(
    registers: &mut impl Registers,
    features: u64,
    queues: &[&DriverQueue],
) {
    negotiate_features(registers, features);
    for (index, queue) in queues.iter().enumerate() {
        setup_queue(registers, index as u32, queue);
    }
    registers.write32(REG_STATUS, STATUS_LIVE);
}
