//! ACPI fixed hardware (PIIX-like): the PM1a event block (PM1_STS, PM1_EN),
//! the PM1a control block (PM1_CNT) and the 24-bit PM timer.
//!
//! The machine is in ACPI mode from reset: PM1_CNT.SCI_EN always reads 1, so
//! the guest never needs an SMI command port. No SCI is ever raised: nothing
//! in this machine generates ACPI events (no power or sleep button, no GPEs),
//! and TMR_STS is only a status bit the guest may poll. Sleep requests
//! (SLP_EN) are ignored: the guest ends a run through the status port.
//!
//! The PM timer counts at 3.579545 MHz from virtual time zero:
//! `ticks = now_ns * 3_579_545 / 1e9` (exact, in u128), masked to 24 bits.

use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use serde::{Deserialize, Serialize};

pub const PM_TIMER_HZ: u128 = 3_579_545;
const PM_TIMER_MASK: u64 = 0x00ff_ffff;
/// The timer's most significant bit; TMR_STS is set whenever it toggles.
const PM_TIMER_MSB_SHIFT: u32 = 23;

const STS_TMR: u16 = 1 << 0;

const CNT_SCI_EN: u16 = 1 << 0;
const CNT_BM_RLD: u16 = 1 << 1;
const CNT_SLP_TYP: u16 = 0x7 << 10;
/// Bits that read back; GBL_RLS and SLP_EN are write-only.
const CNT_STORED: u16 = CNT_BM_RLD | CNT_SLP_TYP;

/// Which of the ACPI fixed-hardware port blocks an access is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcpiPmBlock {
    /// PM1a_EVT_BLK: PM1_STS at offset 0, PM1_EN at offset 2.
    Pm1Event,
    /// PM1a_CNT_BLK: PM1_CNT.
    Pm1Control,
    /// PM_TMR_BLK: the 24-bit timer (read-only).
    Timer,
}

/// Saved state of the ACPI fixed hardware.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcpiPmState {
    pub now: VirtNanos,
    pub pm1_status: u16,
    pub pm1_enable: u16,
    pub pm1_control: u16,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AcpiPm {
    now: VirtNanos,
    pm1_status: u16,
    pm1_enable: u16,
    pm1_control: u16,
}

/// PM timer ticks elapsed at `now`, before masking to 24 bits.
pub fn pm_timer_ticks(now: VirtNanos) -> u64 {
    // u128 intermediate: now_ns * 3.58e6 overflows u64 after about 85 minutes.
    // The quotient fits in u64 for any u64 nanosecond count.
    (u128::from(now.as_nanos()) * PM_TIMER_HZ / 1_000_000_000) as u64
}

impl AcpiPm {
    pub fn new() -> Self {
        Self::default()
    }

    /// Advances to `now` (never backwards), latching TMR_STS if the timer's
    /// bit 23 toggled meanwhile.
    pub fn advance_to(&mut self, now: VirtNanos) {
        if now <= self.now {
            return;
        }
        let before = pm_timer_ticks(self.now) >> PM_TIMER_MSB_SHIFT;
        let after = pm_timer_ticks(now) >> PM_TIMER_MSB_SHIFT;
        if before != after {
            self.pm1_status |= STS_TMR;
        }
        self.now = now;
    }

    /// The PM timer register value at the device's current time.
    pub fn timer_value(&self) -> u32 {
        (pm_timer_ticks(self.now) & PM_TIMER_MASK) as u32
    }

    /// Byte `offset` of `block` (registers are little-endian; each byte of a
    /// wide access is decoded on its own, which reads the same value since
    /// time does not move within one access).
    fn read_byte(&self, block: AcpiPmBlock, offset: u64) -> u8 {
        let (register, byte_index) = match (block, offset) {
            (AcpiPmBlock::Pm1Event, 0..=1) => (u32::from(self.pm1_status), offset),
            (AcpiPmBlock::Pm1Event, 2..=3) => (u32::from(self.pm1_enable), offset - 2),
            (AcpiPmBlock::Pm1Control, 0..=1) => (
                u32::from((self.pm1_control & CNT_STORED) | CNT_SCI_EN),
                offset,
            ),
            (AcpiPmBlock::Timer, 0..=3) => (self.timer_value(), offset),
            _ => return 0xff,
        };
        register.to_le_bytes()[byte_index as usize]
    }

    fn write_byte(&mut self, block: AcpiPmBlock, offset: u64, value: u8) {
        let shift = 8 * (offset & 1);
        let bits = u16::from(value) << shift;
        let byte_mask = 0xffu16 << shift;
        match (block, offset) {
            // Write 1 to clear.
            (AcpiPmBlock::Pm1Event, 0..=1) => self.pm1_status &= !bits,
            (AcpiPmBlock::Pm1Event, 2..=3) => {
                self.pm1_enable = (self.pm1_enable & !byte_mask) | bits;
            }
            (AcpiPmBlock::Pm1Control, 0..=1) => {
                let stored = byte_mask & CNT_STORED;
                self.pm1_control = (self.pm1_control & !stored) | (bits & stored);
            }
            // The timer is read-only; anything else is outside the blocks.
            _ => {}
        }
    }

    pub fn read(&mut self, block: AcpiPmBlock, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = self.read_byte(block, offset.saturating_add(i as u64));
        }
    }

    pub fn write(&mut self, block: AcpiPmBlock, offset: u64, data: &[u8]) {
        for (i, &byte) in data.iter().enumerate() {
            self.write_byte(block, offset.saturating_add(i as u64), byte);
        }
    }
}

impl Persist for AcpiPm {
    type State = AcpiPmState;

    fn save(&self) -> AcpiPmState {
        AcpiPmState {
            now: self.now,
            pm1_status: self.pm1_status,
            pm1_enable: self.pm1_enable,
            pm1_control: self.pm1_control,
        }
    }

    fn restore(&mut self, state: &AcpiPmState) -> Result<(), RestoreError> {
        self.now = state.now;
        self.pm1_status = state.pm1_status;
        self.pm1_enable = state.pm1_enable;
        self.pm1_control = state.pm1_control;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_u32(pm: &mut AcpiPm, block: AcpiPmBlock, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        pm.read(block, offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn read_u16(pm: &mut AcpiPm, block: AcpiPmBlock, offset: u64) -> u16 {
        let mut data = [0u8; 2];
        pm.read(block, offset, &mut data);
        u16::from_le_bytes(data)
    }

    #[test]
    fn test_acpi_pm_timer_tick_math_is_exact() {
        // Arrange
        let cases = [
            (0, 0),
            (279, 0),
            (280, 1), // 280 ns * 3.579545 MHz = 1.0023 ticks
            (1_000_000_000, 3_579_545),
            (3_000_000_000, 10_738_635),
            (60_000_000_000, 214_772_700),
        ];

        for (nanos, ticks) in cases {
            // Act
            let actual = pm_timer_ticks(VirtNanos(nanos));

            // Assert
            assert_eq!(actual, ticks, "at {nanos} ns");
        }
    }

    #[test]
    fn test_acpi_pm_timer_reads_24_bit_value() {
        // Arrange
        let mut pm = AcpiPm::new();

        // Act
        pm.advance_to(VirtNanos::from_secs(60));
        let value = read_u32(&mut pm, AcpiPmBlock::Timer, 0);

        // Assert
        assert_eq!(value, 214_772_700 & 0xff_ffff);
        assert!(value <= 0xff_ffff);
    }

    #[test]
    fn test_acpi_pm_timer_does_not_overflow_at_large_times() {
        // Arrange
        let mut pm = AcpiPm::new();

        // Act
        pm.advance_to(VirtNanos(u64::MAX));

        // Assert
        let expected = (u128::from(u64::MAX) * 3_579_545 / 1_000_000_000) as u64 & 0xff_ffff;
        assert_eq!(u64::from(pm.timer_value()), expected);
    }

    #[test]
    fn test_acpi_pm_control_always_reports_sci_enabled() {
        // Arrange
        let mut pm = AcpiPm::new();

        // Act
        pm.write(AcpiPmBlock::Pm1Control, 0, &0u16.to_le_bytes());
        let after_clear = read_u16(&mut pm, AcpiPmBlock::Pm1Control, 0);
        pm.write(
            AcpiPmBlock::Pm1Control,
            0,
            &(0x2000u16 | (5 << 10)).to_le_bytes(),
        );
        let after_sleep = read_u16(&mut pm, AcpiPmBlock::Pm1Control, 0);

        // Assert
        assert_eq!(after_clear, 0x0001);
        assert_eq!(after_sleep, 0x0001 | (5 << 10), "SLP_EN reads 0");
    }

    #[test]
    fn test_acpi_pm_status_is_write_one_to_clear() {
        // Arrange
        let mut pm = AcpiPm::new();
        pm.advance_to(VirtNanos::from_secs(3)); // bit 23 toggles after 2.34 s
        let status = read_u16(&mut pm, AcpiPmBlock::Pm1Event, 0);

        // Act
        pm.write(AcpiPmBlock::Pm1Event, 0, &0u16.to_le_bytes());
        let after_zero_write = read_u16(&mut pm, AcpiPmBlock::Pm1Event, 0);
        pm.write(AcpiPmBlock::Pm1Event, 0, &1u16.to_le_bytes());
        let after_clear = read_u16(&mut pm, AcpiPmBlock::Pm1Event, 0);

        // Assert
        assert_eq!(status, STS_TMR);
        assert_eq!(after_zero_write, STS_TMR);
        assert_eq!(after_clear, 0);
    }

    #[test]
    fn test_acpi_pm_enable_register_is_storage() {
        // Arrange
        let mut pm = AcpiPm::new();

        // Act
        pm.write(AcpiPmBlock::Pm1Event, 2, &0x0121u16.to_le_bytes());

        // Assert
        assert_eq!(read_u16(&mut pm, AcpiPmBlock::Pm1Event, 2), 0x0121);
        assert_eq!(read_u32(&mut pm, AcpiPmBlock::Pm1Event, 0), 0x0121_0000);
    }

    #[test]
    fn test_acpi_pm_out_of_block_bytes_read_all_ones() {
        // Arrange
        let mut pm = AcpiPm::new();

        // Act
        let control_wide = read_u32(&mut pm, AcpiPmBlock::Pm1Control, 0);
        pm.write(AcpiPmBlock::Timer, 0, &[0xff; 8]);
        pm.write(AcpiPmBlock::Pm1Event, u64::MAX, &[0xff; 8]);

        // Assert
        assert_eq!(control_wide, 0xffff_0001);
        assert_eq!(pm.save(), AcpiPmState::default());
    }

    /// A timer past zero and PM1 registers written.
    fn used_pm() -> AcpiPm {
        let mut pm = AcpiPm::new();
        pm.advance_to(VirtNanos::from_secs(5));
        pm.write(AcpiPmBlock::Pm1Event, 2, &[0x01, 0x01]);
        pm.write(AcpiPmBlock::Pm1Control, 0, &[0x02, 0x14]);
        pm
    }

    crate::persist::persist_round_trip_tests! {
        mod acpi_pm_persist {
            fresh: AcpiPm::new(),
            saved: used_pm(),
            mutate: |pm: &mut AcpiPm| {
                pm.advance_to(VirtNanos::from_secs(50));
                pm.write(AcpiPmBlock::Pm1Event, 0, &[0xff, 0xff, 0x00, 0x00]);
            },
        }
    }
}
