//! The virtio-mmio transport driven as a guest's driver drives it: the
//! register protocol, queue set-up and rings, with the entropy device as the
//! device behind it.

use super::mmio::*;
use super::*;
use crate::persist::{Persist, RestoreError};
use crate::virtio::rng::{VirtioRng, RNG_QUEUE_SIZE};
use crate::virtio::testing::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};

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
