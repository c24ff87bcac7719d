use super::*;
use crate::error::DevicesError;
use crate::layout;
use crate::persist::{Persist, RestoreError};
use crate::switch::{Fault, PortId, SwitchError};
use crate::virtio::{DiskCommand, DiskImage};
use crate::GuestMemory;
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

mod network;
mod virtio;
