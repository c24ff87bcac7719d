use super::*;
use crate::virtio::mmio::{INTERRUPT_CONFIG_CHANGE, INTERRUPT_USED_BUFFER};
use crate::virtio::testing::{
    self as virtio_testing, initialize, read_bytes, readable, writable, write_bytes, DriverQueue,
    Registers, DATA_BASE, QUEUE0_BASE, QUEUE1_BASE, REG_INTERRUPT_ACK, REG_INTERRUPT_STATUS,
    REG_MAGIC, REG_QUEUE_NOTIFY,
};
use crate::virtio::{QueueFault, VirtioViolation};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

pub(super) const RNG_KEY: [u8; 32] = [0x42; 32];
const VIRTIO0: u64 = layout::VIRTIO_MMIO_BASE;
const VIRTIO1: u64 = layout::VIRTIO_MMIO_BASE + layout::VIRTIO_MMIO_STRIDE;
/// IRQ2 (cascade), IRQ5 and IRQ6 unmasked.
pub(super) const MASTER_MASK_VIRTIO: u8 = !((1 << 2) | (1 << 5) | (1 << 6));

/// Register access to a virtio window through `Devices::mmio_*`.
pub(super) struct Window<'a> {
    pub(super) devices: &'a mut Devices,
    pub(super) base: u64,
    pub(super) now: u64,
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

pub(super) fn window(devices: &mut Devices, base: u64) -> Window<'_> {
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
