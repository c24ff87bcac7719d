//! Tests of the virtio-blk device through its transport, with the driver's
//! side of the queue laid out by hand in a small guest memory.

use super::*;
use crate::virtio::mmio::{INTERRUPT_CONFIG_CHANGE, INTERRUPT_USED_BUFFER, STATUS_NEEDS_RESET};
use crate::virtio::testing::*;

const CAPACITY: usize = 64 * 1024;
const HEADER: u64 = DATA_BASE;
const DATA: u64 = DATA_BASE + 0x1000;
const STATUS: u64 = DATA_BASE + 0x800;

/// A 64 KiB base image whose block `n` is filled with byte `n + 1`, except
/// block 3, which is zeros.
fn base_image() -> Arc<DiskImage> {
    let mut bytes = vec![0u8; CAPACITY];
    for (index, block) in bytes.chunks_exact_mut(BLOCK_SIZE).enumerate() {
        if index != 3 {
            block.fill(index as u8 + 1);
        }
    }
    Arc::new(DiskImage::from_bytes(&bytes, "base-digest".into()).unwrap())
}

fn live_disk() -> (DirectTransport<VirtioBlk>, DriverQueue) {
    let mut device = DirectTransport::new(VirtioBlk::new(base_image(), "disk-n1").unwrap());
    let queue = DriverQueue::new(QUEUE0_BASE, BLK_QUEUE_SIZE);
    initialize(&mut device, &[&queue]);
    (device, queue)
}

fn header(mem: &GuestMemory, kind: u32, sector: u64) {
    let mut bytes = [0u8; 16];
    bytes[0..4].copy_from_slice(&kind.to_le_bytes());
    bytes[8..16].copy_from_slice(&sector.to_le_bytes());
    write_bytes(mem, HEADER, &bytes);
}

fn status(mem: &GuestMemory) -> u32 {
    u32::from(read_bytes(mem, STATUS, 1)[0])
}

/// Reads `len` bytes from `sector`; returns (status, data).
fn read(
    device: &mut DirectTransport<VirtioBlk>,
    queue: &mut DriverQueue,
    sector: u64,
    len: u32,
) -> (u32, Vec<u8>) {
    header(&device.mem, VIRTIO_BLK_T_IN, sector);
    write_bytes(&device.mem, STATUS, &[0xff]);
    queue.add_chain(
        &device.mem,
        &[
            readable(HEADER, 16),
            writable(DATA, len),
            writable(STATUS, 1),
        ],
    );
    device.write32(REG_QUEUE_NOTIFY, 0);
    (
        status(&device.mem),
        read_bytes(&device.mem, DATA, len as usize),
    )
}

/// Writes `bytes` at `sector`; returns the status.
fn write(
    device: &mut DirectTransport<VirtioBlk>,
    queue: &mut DriverQueue,
    sector: u64,
    bytes: &[u8],
) -> u32 {
    header(&device.mem, VIRTIO_BLK_T_OUT, sector);
    write_bytes(&device.mem, DATA, bytes);
    write_bytes(&device.mem, STATUS, &[0xff]);
    queue.add_chain(
        &device.mem,
        &[
            readable(HEADER, 16),
            readable(DATA, bytes.len() as u32),
            writable(STATUS, 1),
        ],
    );
    device.write32(REG_QUEUE_NOTIFY, 0);
    status(&device.mem)
}

/// Makes a FLUSH available; returns its head.
fn flush(device: &mut DirectTransport<VirtioBlk>, queue: &mut DriverQueue) -> u16 {
    header(&device.mem, VIRTIO_BLK_T_FLUSH, 0);
    write_bytes(&device.mem, STATUS, &[0xff]);
    let head = queue.add_chain(&device.mem, &[readable(HEADER, 16), writable(STATUS, 1)]);
    device.write32(REG_QUEUE_NOTIFY, 0);
    head
}

/// What a fresh disk over the same base reads at `sector` after the
/// device's durable state is carried over (its cache is not).
fn durable_sector(device: &DirectTransport<VirtioBlk>, sector: u64) -> Vec<u8> {
    let mut disk = VirtioBlk::new(base_image(), "disk-n1").unwrap();
    let mut state = device.transport.device().save();
    state.cache.clear();
    disk.restore(&state).unwrap();
    disk.read_range(sector * SECTOR_SIZE, 512)
}

#[test]
fn test_blk_offers_flush_and_reports_capacity_in_sectors() {
    // Arrange
    let mut device = DirectTransport::new(VirtioBlk::new(base_image(), "s").unwrap());

    // Act
    let id = device.read32(REG_DEVICE_ID);
    device.write32(REG_DEVICE_FEATURES_SEL, 0);
    let features = device.read32(REG_DEVICE_FEATURES);
    let capacity_low = device.read32(REG_CONFIG);
    let capacity_high = device.read32(REG_CONFIG + 4);
    let seg_max = device.read32(REG_CONFIG + 12);

    // Assert
    assert_eq!(id, 2);
    assert_ne!(features & (1 << VIRTIO_BLK_F_FLUSH), 0);
    assert_eq!(capacity_low, (CAPACITY as u64 / SECTOR_SIZE) as u32);
    assert_eq!(capacity_high, 0);
    assert_eq!(seg_max, u32::from(BLK_QUEUE_SIZE) - 2);
}

#[test]
fn test_blk_reads_the_base_image_and_zeros() {
    // Arrange
    let (mut device, mut queue) = live_disk();

    // Act: sectors 8..16 are block 1; sector 24 is in block 3 (zeros).
    let (block1_status, block1) = read(&mut device, &mut queue, 8, 4096);
    let (zero_status, zeros) = read(&mut device, &mut queue, 24, 512);

    // Assert
    assert_eq!(
        (block1_status, zero_status),
        (VIRTIO_BLK_S_OK, VIRTIO_BLK_S_OK)
    );
    assert!(block1.iter().all(|&b| b == 2));
    assert!(zeros.iter().all(|&b| b == 0));
    assert_eq!(
        queue.take_used(&device.mem),
        [(0, 4097), (3, 513)],
        "each used length is the data plus the status byte"
    );
    assert_eq!(device.read32(REG_INTERRUPT_STATUS), INTERRUPT_USED_BUFFER);
}

#[test]
fn test_blk_write_is_read_back_across_blocks_before_any_flush() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    let bytes: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();

    // Act: 1 KiB straddling blocks 0 and 1 (sectors 7 and 8).
    let written = write(&mut device, &mut queue, 7, &bytes);
    let (read_status, back) = read(&mut device, &mut queue, 6, 2048);

    // Assert
    assert_eq!((written, read_status), (VIRTIO_BLK_S_OK, VIRTIO_BLK_S_OK));
    assert!(back[..512].iter().all(|&b| b == 1), "rest of block 0 kept");
    assert_eq!(&back[512..1536], &bytes[..]);
    assert!(back[1536..].iter().all(|&b| b == 2), "rest of block 1 kept");
    assert_eq!(device.transport.device().cached_blocks(), 2);
}

#[test]
fn test_blk_flush_makes_the_cache_durable_and_crash_drops_what_was_not_flushed() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    write(&mut device, &mut queue, 0, &[0xaa; 512]);
    flush(&mut device, &mut queue);
    write(&mut device, &mut queue, 16, &[0xbb; 512]);

    // Act
    device
        .transport
        .device_mut()
        .schedule(device.now, DiskCommand::Crash);
    device.transport.device_mut().apply_due(device.now);
    let (_, flushed) = read(&mut device, &mut queue, 0, 512);
    let (_, unflushed) = read(&mut device, &mut queue, 16, 512);

    // Assert
    assert_eq!(status(&device.mem), VIRTIO_BLK_S_OK);
    assert!(flushed.iter().all(|&b| b == 0xaa));
    assert!(
        unflushed.iter().all(|&b| b == 3),
        "block 2 of the base again"
    );
    assert_eq!(device.transport.device().counters().flushes, 1);
}

#[test]
fn test_blk_writes_are_discarded_from_a_crash_until_its_end() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    device
        .transport
        .device_mut()
        .schedule(VirtNanos::ZERO, DiskCommand::Crash);

    // Act
    let during = write(&mut device, &mut queue, 0, &[0xcc; 512]);
    flush(&mut device, &mut queue);
    let (_, after_discard) = read(&mut device, &mut queue, 0, 512);
    let was_discarding = device.transport.device_mut().end_crash();
    write(&mut device, &mut queue, 0, &[0xdd; 512]);
    flush(&mut device, &mut queue);

    // Assert
    assert_eq!(during, VIRTIO_BLK_S_OK, "the guest is not told");
    assert!(after_discard.iter().all(|&b| b == 1));
    assert!(was_discarding);
    assert!(!device.transport.device().discarding());
    assert!(durable_sector(&device, 0).iter().all(|&b| b == 0xdd));
    assert_eq!(device.transport.device().counters().discarded_writes, 1);
}

#[test]
fn test_blk_flush_error_fails_and_keeps_the_cache_volatile() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    device
        .transport
        .device_mut()
        .schedule(VirtNanos::ZERO, DiskCommand::SetFlush(FlushMode::Error));
    write(&mut device, &mut queue, 0, &[0xee; 512]);

    // Act
    flush(&mut device, &mut queue);
    let failed = status(&device.mem);
    let durable_after_error = durable_sector(&device, 0);
    device
        .transport
        .device_mut()
        .schedule(device.now, DiskCommand::SetFlush(FlushMode::Normal));
    flush(&mut device, &mut queue);

    // Assert
    assert_eq!(failed, VIRTIO_BLK_S_IOERR);
    assert!(durable_after_error.iter().all(|&b| b == 1));
    assert_eq!(status(&device.mem), VIRTIO_BLK_S_OK);
    assert!(durable_sector(&device, 0).iter().all(|&b| b == 0xee));
    assert_eq!(device.transport.device().counters().failed_flushes, 1);
}

#[test]
fn test_blk_delayed_flush_completes_at_its_deadline_only() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    let delay = VirtNanos(500_000_000);
    device.transport.device_mut().schedule(
        VirtNanos::ZERO,
        DiskCommand::SetFlush(FlushMode::Delay { delay }),
    );
    write(&mut device, &mut queue, 0, &[0x11; 512]);
    queue.take_used(&device.mem);
    let submitted = device.now;

    // Act
    let head = flush(&mut device, &mut queue);
    let used_at_submit = queue.take_used(&device.mem);
    let deadline = device.transport.device().next_deadline();
    device.now = submitted.saturating_add(delay);
    let due_early = device
        .transport
        .device()
        .has_due_completion(VirtNanos(device.now.0 - 1));
    device.transport.process_queue(0, &device.mem, device.now);

    // Assert
    assert!(used_at_submit.is_empty());
    assert_eq!(deadline, Some(submitted.saturating_add(delay)));
    assert!(!due_early);
    assert_eq!(queue.take_used(&device.mem), [(u32::from(head), 1)]);
    assert_eq!(status(&device.mem), VIRTIO_BLK_S_OK);
    assert_eq!(device.transport.device().next_deadline(), None);
    assert!(durable_sector(&device, 0).iter().all(|&b| b == 0x11));
}

#[test]
fn test_blk_a_shorter_delay_completes_a_later_flush_first() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    let set_delay = |device: &mut DirectTransport<VirtioBlk>, ns: u64| {
        let now = device.now;
        let disk = device.transport.device_mut();
        disk.schedule(
            now,
            DiskCommand::SetFlush(FlushMode::Delay {
                delay: VirtNanos(ns),
            }),
        );
        disk.apply_due(now);
    };
    set_delay(&mut device, 500);
    let slow = flush(&mut device, &mut queue);
    set_delay(&mut device, 100);
    let fast = flush(&mut device, &mut queue);
    let start = device.now;

    // Act
    device.now = start.saturating_add(VirtNanos(100));
    device.transport.process_queue(0, &device.mem, device.now);
    let at_100 = queue.take_used(&device.mem);
    device.now = start.saturating_add(VirtNanos(500));
    device.transport.process_queue(0, &device.mem, device.now);
    let at_500 = queue.take_used(&device.mem);

    // Assert
    assert_eq!(at_100, [(u32::from(fast), 1)]);
    assert_eq!(at_500, [(u32::from(slow), 1)]);
    assert!(device
        .transport
        .device()
        .validate(&device.transport.device().save())
        .is_ok());
}

#[test]
fn test_blk_scheduled_commands_apply_in_time_order_and_set_the_deadline() {
    // Arrange
    let mut disk = VirtioBlk::new(base_image(), "s").unwrap();
    disk.schedule(VirtNanos(20), DiskCommand::SetFlush(FlushMode::Normal));
    disk.schedule(VirtNanos(10), DiskCommand::SetFlush(FlushMode::Error));

    // Act
    let deadline = disk.next_deadline();
    disk.apply_due(VirtNanos(15));
    let at_15 = disk.flush_mode();
    disk.apply_due(VirtNanos(20));

    // Assert
    assert_eq!(deadline, Some(VirtNanos(10)));
    assert_eq!(at_15, FlushMode::Error);
    assert_eq!(disk.flush_mode(), FlushMode::Normal);
    assert_eq!(disk.next_deadline(), None);
}

#[test]
fn test_blk_out_of_range_and_partial_sectors_fail_with_ioerr() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    let last_sector = CAPACITY as u64 / SECTOR_SIZE - 1;

    // Act
    let (beyond, _) = read(&mut device, &mut queue, last_sector, 1024);
    let overflow = write(&mut device, &mut queue, u64::MAX, &[0; 512]);
    let (partial, _) = read(&mut device, &mut queue, 0, 100);
    let (last, _) = read(&mut device, &mut queue, last_sector, 512);

    // Assert
    assert_eq!(beyond, VIRTIO_BLK_S_IOERR);
    assert_eq!(overflow, VIRTIO_BLK_S_IOERR);
    assert_eq!(partial, VIRTIO_BLK_S_IOERR);
    assert_eq!(last, VIRTIO_BLK_S_OK);
    assert_eq!(device.transport.device().counters().failed_requests, 3);
    assert_eq!(device.transport.violation(), None);
}

#[test]
fn test_blk_a_failed_read_writes_only_its_status_byte() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    write_bytes(&device.mem, DATA, &[0xcc; 4096]);

    // Act: a read past the end.
    let (status, data) = read(&mut device, &mut queue, CAPACITY as u64 / SECTOR_SIZE, 4096);

    // Assert
    assert_eq!(status, VIRTIO_BLK_S_IOERR);
    assert!(
        data.iter().all(|&b| b == 0xcc),
        "the data buffer is untouched"
    );
    assert_eq!(queue.take_used(&device.mem), [(0, 1)], "one byte written");
}

#[test]
fn test_blk_unknown_request_type_is_unsupported() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    header(&device.mem, 11, 0); // VIRTIO_BLK_T_DISCARD, not offered
    queue.add_chain(&device.mem, &[readable(HEADER, 16), writable(STATUS, 1)]);

    // Act
    device.write32(REG_QUEUE_NOTIFY, 0);

    // Assert
    assert_eq!(status(&device.mem), VIRTIO_BLK_S_UNSUPP);
    assert_eq!(device.transport.violation(), None);
}

#[test]
fn test_blk_get_id_answers_the_serial() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    header(&device.mem, VIRTIO_BLK_T_GET_ID, 0);
    queue.add_chain(
        &device.mem,
        &[
            readable(HEADER, 16),
            writable(DATA, 20),
            writable(STATUS, 1),
        ],
    );

    // Act
    device.write32(REG_QUEUE_NOTIFY, 0);

    // Assert
    assert_eq!(status(&device.mem), VIRTIO_BLK_S_OK);
    assert_eq!(&read_bytes(&device.mem, DATA, 8), b"disk-n1\0");
}

#[test]
fn test_blk_request_without_header_or_status_breaks_the_device() {
    // Arrange
    let (mut device, mut queue) = live_disk();
    queue.add_chain(&device.mem, &[readable(HEADER, 8), writable(STATUS, 1)]);

    // Act
    device.write32(REG_QUEUE_NOTIFY, 0);

    // Assert
    assert!(matches!(
        device.transport.violation(),
        Some(crate::virtio::VirtioViolation::Queue {
            fault: QueueFault::BlkRequestTooShort {
                readable: 8,
                writable: 1,
                ..
            },
            ..
        })
    ));
    assert_ne!(device.read32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
    assert_ne!(
        device.read32(REG_INTERRUPT_STATUS) & INTERRUPT_CONFIG_CHANGE,
        0
    );
}

#[test]
fn test_blk_image_must_be_whole_blocks_and_serial_short() {
    assert_eq!(
        DiskImage::from_bytes(&[0; 5000], "d".into()),
        Err(DiskImageError::NotWholeBlocks { len: 5000 })
    );
    assert_eq!(
        DiskImage::from_bytes(&[], "d".into()),
        Err(DiskImageError::Empty)
    );
    assert!(VirtioBlk::new(base_image(), "a-serial-longer-than-20").is_err());
}

#[test]
fn test_blk_restore_refuses_another_base_and_bad_blocks() {
    // Arrange
    let disk = VirtioBlk::new(base_image(), "s").unwrap();
    let other = Arc::new(DiskImage::from_bytes(&[1; CAPACITY], "other".into()).unwrap());
    let mut on_other = VirtioBlk::new(other, "s").unwrap();
    let mut beyond = disk.save();
    beyond.durable.push(SavedBlock {
        block: BlockNo(16),
        hex: "00".repeat(BLOCK_SIZE),
    });
    let mut short = disk.save();
    short.cache.push(SavedBlock {
        block: BlockNo(0),
        hex: "00".into(),
    });
    let mut fresh = VirtioBlk::new(base_image(), "s").unwrap();

    // Act / Assert
    assert!(matches!(
        on_other.restore(&disk.save()),
        Err(RestoreError::DiskBase { .. })
    ));
    assert_eq!(
        fresh.restore(&beyond),
        Err(RestoreError::DiskBlock {
            block: 16,
            reason: "beyond the disk's capacity"
        })
    );
    assert!(matches!(
        fresh.restore(&short),
        Err(RestoreError::DiskBlock { block: 0, .. })
    ));
}

/// A disk with durable and cached blocks, a fault mode, a pending FLUSH and
/// a scheduled command.
fn busy_disk() -> VirtioBlk {
    let mut disk = VirtioBlk::new(base_image(), "disk-n1").unwrap();
    disk.write_range(0, &[7; 512]);
    disk.persist_cache();
    disk.write_range(8192, &[9; 4096]);
    disk.flush_mode = FlushMode::Delay {
        delay: VirtNanos(5),
    };
    disk.pending.push(PendingFlush {
        head: 3,
        status_address: STATUS,
        used_len: 1,
        due: VirtNanos(100),
    });
    disk.schedule(VirtNanos(200), DiskCommand::Crash);
    disk.counters.writes = 2;
    disk
}

crate::persist::persist_round_trip_tests! {
    mod blk_persist {
        fresh: VirtioBlk::new(base_image(), "disk-n1").unwrap(),
        saved: busy_disk(),
        mutate: |disk: &mut VirtioBlk| {
            disk.write_range(4096, &[1; 512]);
            disk.apply(DiskCommand::Crash, VirtNanos(1));
        },
    }
}
