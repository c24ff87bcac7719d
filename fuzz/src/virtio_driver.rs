//! What a virtio-mmio driver does to bring a device up (Linux's order), as
//! the register writes the guest-facing targets replay, and where a split
//! virtqueue keeps its rings: one sequence for `guest_devices_bus` and
//! `guest_virtio`, with the register offsets of the virtio specification
//! (`virtio-bindings`, as the device uses).

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_mmio;

/// A register's offset in the virtio-mmio window.
const fn register(offset: u32) -> u64 {
    offset as u64
}

pub const REG_MAGIC: u64 = register(virtio_mmio::VIRTIO_MMIO_MAGIC_VALUE);
pub const REG_VERSION: u64 = register(virtio_mmio::VIRTIO_MMIO_VERSION);
pub const REG_DEVICE_ID: u64 = register(virtio_mmio::VIRTIO_MMIO_DEVICE_ID);
pub const REG_DRIVER_FEATURES: u64 = register(virtio_mmio::VIRTIO_MMIO_DRIVER_FEATURES);
pub const REG_DRIVER_FEATURES_SEL: u64 = register(virtio_mmio::VIRTIO_MMIO_DRIVER_FEATURES_SEL);
pub const REG_QUEUE_SEL: u64 = register(virtio_mmio::VIRTIO_MMIO_QUEUE_SEL);
pub const REG_QUEUE_NUM: u64 = register(virtio_mmio::VIRTIO_MMIO_QUEUE_NUM);
pub const REG_QUEUE_READY: u64 = register(virtio_mmio::VIRTIO_MMIO_QUEUE_READY);
pub const REG_QUEUE_NOTIFY: u64 = register(virtio_mmio::VIRTIO_MMIO_QUEUE_NOTIFY);
pub const REG_STATUS: u64 = register(virtio_mmio::VIRTIO_MMIO_STATUS);
pub const REG_QUEUE_DESC_LOW: u64 = register(virtio_mmio::VIRTIO_MMIO_QUEUE_DESC_LOW);
pub const REG_QUEUE_AVAIL_LOW: u64 = register(virtio_mmio::VIRTIO_MMIO_QUEUE_AVAIL_LOW);
pub const REG_QUEUE_USED_LOW: u64 = register(virtio_mmio::VIRTIO_MMIO_QUEUE_USED_LOW);

/// VIRTIO_F_VERSION_1: the one feature a modern driver must take.
pub const FEATURE_VERSION_1: u64 = 1 << 32;

/// Where a split virtqueue of `size` entries whose descriptor table is at
/// `desc` keeps its rings: (descriptor table, available ring, used ring),
/// packed as the specification's legacy layout (used ring 4-byte aligned).
pub fn split_rings(desc: u64, size: u16) -> (u64, u64, u64) {
    let avail = desc + 16 * u64::from(size);
    let used = (avail + 6 + 2 * u64::from(size)).next_multiple_of(4);
    (desc, avail, used)
}

/// One queue the driver sets up: its size and where its descriptor table
/// is (the rings follow, at [`split_rings`]).
#[derive(Clone, Copy, Debug)]
pub struct QueueSetup {
    pub size: u16,
    pub desc: u64,
}

/// The register writes, (offset, value) in order, of a driver that resets
/// the device, acknowledges it, offers `features`, sets up `queues` (queue
/// `i` is `queues[i]`) and sets DRIVER_OK.
pub fn init_writes(features: u64, queues: &[QueueSetup]) -> Vec<(u64, u32)> {
    let acknowledged = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER;
    let features_ok = acknowledged | VIRTIO_CONFIG_S_FEATURES_OK;
    let mut writes = vec![
        (REG_STATUS, 0),
        (REG_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE),
        (REG_STATUS, acknowledged),
    ];
    for select in [1u32, 0] {
        writes.push((REG_DRIVER_FEATURES_SEL, select));
        writes.push((REG_DRIVER_FEATURES, (features >> (32 * select)) as u32));
    }
    writes.push((REG_STATUS, features_ok));
    for (index, queue) in queues.iter().enumerate() {
        let (desc, avail, used) = split_rings(queue.desc, queue.size);
        writes.push((REG_QUEUE_SEL, index as u32));
        writes.push((REG_QUEUE_NUM, u32::from(queue.size)));
        for (register, address) in [
            (REG_QUEUE_DESC_LOW, desc),
            (REG_QUEUE_AVAIL_LOW, avail),
            (REG_QUEUE_USED_LOW, used),
        ] {
            writes.push((register, address as u32));
            writes.push((register + 4, (address >> 32) as u32));
        }
        writes.push((REG_QUEUE_READY, 1));
    }
    writes.push((REG_STATUS, features_ok | VIRTIO_CONFIG_S_DRIVER_OK));
    writes
}
