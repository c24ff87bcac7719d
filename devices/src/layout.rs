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

/// HPET registers.
pub const HPET_BASE: u64 = 0xfed0_0000;
pub const HPET_LEN: u64 = 0x400;
