//! The fixed machine layout the guest sees: ports, MMIO ranges and IRQ lines.
//! The VMM's ACPI tables and kernel command line are built from these numbers.

/// 8259 PIC pair.
pub const PIC_MASTER_PORT: u16 = 0x20;
pub const PIC_SLAVE_PORT: u16 = 0xa0;
/// Edge/level control registers of the PIC pair.
pub const ELCR_PORT: u16 = 0x4d0;
/// Vector base the PIC is programmed with is chosen by the guest; these are the lines.
pub const IRQ_TIMER: u8 = 0;
pub const IRQ_COM1: u8 = 4;
pub const IRQ_RTC: u8 = 8;
pub const IRQ_ACPI_SCI: u8 = 9;

/// 16550A UART.
pub const COM1_PORT: u16 = 0x3f8;
/// MC146818 CMOS RTC index/data ports.
pub const RTC_PORT: u16 = 0x70;
/// i8042 data/command ports (only the CPU-reset command is modelled).
pub const I8042_DATA_PORT: u16 = 0x60;
pub const I8042_COMMAND_PORT: u16 = 0x64;
/// POST/IO-delay port: writes are accepted and ignored.
pub const POST_PORT: u16 = 0x80;

/// ACPI fixed hardware (PIIX-like): PM1a event block (status + enable).
pub const ACPI_PM1A_EVT_PORT: u16 = 0x600;
pub const ACPI_PM1A_EVT_LEN: u8 = 4;
/// PM1a control block (SCI_EN always set: the machine is in ACPI mode from reset).
pub const ACPI_PM1A_CNT_PORT: u16 = 0x604;
pub const ACPI_PM1A_CNT_LEN: u8 = 2;
/// 24-bit ACPI PM timer at 3.579545 MHz.
pub const ACPI_PM_TMR_PORT: u16 = 0x608;
pub const ACPI_PM_TMR_LEN: u8 = 4;

/// detvisor's guest status port: the guest init writes its command's exit
/// status here (one byte), which ends the run with that status.
pub const STATUS_PORT: u16 = 0x610;

/// detvisor's clock page (see `clock_page`): one page of low RAM, reserved
/// in the e820 map, where the VMM publishes virtual time at every exit.
pub const CLOCK_PAGE_ADDR: u64 = 0x9_f000;
/// Writing this port is an exit the VMM owns: the guest's clock reader
/// forces one after `clock_page::READS_PER_EXIT` reads without a new exit.
pub const CLOCK_PAGE_EXIT_PORT: u16 = 0x614;

/// HPET registers.
pub const HPET_BASE: u64 = 0xfed0_0000;
pub const HPET_LEN: u64 = 0x400;

/// virtio-mmio devices: one 4 KiB register window each, consecutive from
/// the base, in the 32-bit MMIO hole above the largest guest RAM (3 GiB).
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
pub const VIRTIO_MMIO_STRIDE: u64 = 0x1000;
/// ISA lines no other device uses, one per virtio device in attach order.
/// After the six lines a PC leaves free come COM2's line 3 (the kernel has
/// one UART) and the IDE lines 14 and 15 (there is no IDE), so that the
/// rng, the console and up to seven NICs (one per node) fit; then the
/// keyboard's line 1 (the guest kernel has no i8042 driver: CONFIG_SERIO is
/// off) and the FPU error line 13 (unused on x86-64), for the nodes' disks.
pub const VIRTIO_MMIO_IRQS: [u8; 11] = [5, 6, 7, 10, 11, 12, 3, 14, 15, 1, 13];
pub const VIRTIO_MMIO_MAX_DEVICES: usize = VIRTIO_MMIO_IRQS.len();

/// The base address of virtio-mmio slot `slot`.
pub fn virtio_mmio_base(slot: usize) -> Option<u64> {
    (slot < VIRTIO_MMIO_MAX_DEVICES).then(|| VIRTIO_MMIO_BASE + slot as u64 * VIRTIO_MMIO_STRIDE)
}

/// The interrupt line of virtio-mmio slot `slot`.
pub fn virtio_mmio_irq(slot: usize) -> Option<u8> {
    VIRTIO_MMIO_IRQS.get(slot).copied()
}

/// The kernel command-line entry declaring slot `slot` to Linux's
/// virtio_mmio driver (CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES), e.g.
/// `virtio_mmio.device=4K@0xd0000000:5`.
pub fn virtio_mmio_cmdline_fragment(slot: usize) -> Option<String> {
    let base = virtio_mmio_base(slot)?;
    let irq = virtio_mmio_irq(slot)?;
    Some(format!(
        "virtio_mmio.device={}K@{base:#x}:{irq}",
        VIRTIO_MMIO_STRIDE / 1024
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_virtio_mmio_slots_have_distinct_windows_and_lines() {
        // Arrange / Act
        let slots: Vec<(u64, u8)> = (0..VIRTIO_MMIO_MAX_DEVICES)
            .map(|slot| {
                (
                    virtio_mmio_base(slot).unwrap(),
                    virtio_mmio_irq(slot).unwrap(),
                )
            })
            .collect();

        // Assert
        assert_eq!(slots[0], (0xd000_0000, 5));
        assert_eq!(slots[5], (0xd000_5000, 12));
        assert_eq!(slots[8], (0xd000_8000, 15));
        for irq in [IRQ_TIMER, IRQ_COM1, IRQ_RTC, IRQ_ACPI_SCI, 2] {
            assert!(!VIRTIO_MMIO_IRQS.contains(&irq));
        }
        for (i, irq) in VIRTIO_MMIO_IRQS.iter().enumerate() {
            assert!(*irq < 16);
            assert!(!VIRTIO_MMIO_IRQS[..i].contains(irq));
        }
        assert!(
            virtio_mmio_base(VIRTIO_MMIO_MAX_DEVICES - 1).unwrap() + VIRTIO_MMIO_STRIDE
                <= HPET_BASE
        );
    }

    #[test]
    fn test_virtio_mmio_cmdline_fragment() {
        // Arrange / Act
        let first = virtio_mmio_cmdline_fragment(0);
        let third = virtio_mmio_cmdline_fragment(2);
        let beyond = virtio_mmio_cmdline_fragment(VIRTIO_MMIO_MAX_DEVICES);

        // Assert
        assert_eq!(first.as_deref(), Some("virtio_mmio.device=4K@0xd0000000:5"));
        assert_eq!(third.as_deref(), Some("virtio_mmio.device=4K@0xd0002000:7"));
        assert_eq!(beyond, None);
        assert_eq!(virtio_mmio_base(VIRTIO_MMIO_MAX_DEVICES), None);
    }
}
