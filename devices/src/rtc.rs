//! A Motorola MC146818 CMOS real-time clock with 128 bytes of CMOS RAM at
//! ports 0x70 (index; bit 7, the NMI mask, is ignored) and 0x71 (data).
//!
//! The time of day is `base_unix_secs` plus the whole virtual seconds since
//! `base_time`; it starts at the configured epoch at virtual time zero. It
//! is presented in BCD or binary (register B DM bit) and 24- or 12-hour
//! format (register B 24/12 bit), with the century in register 0x32.
//!
//! The clock stops while register B's SET bit is set or register A's divider
//! is held in reset (DV = 11x): the time registers then become plain storage
//! that the guest writes, and when the clock restarts their contents become
//! the new time (so `hwclock -w` and Linux's `mc146818_set_time` work). A
//! time register written while the clock runs changes the time at once.
//! The day of week is always derived from the date.
//!
//! Register A's UIP bit always reads 0: updates are instantaneous, so
//! Linux's wait-for-UIP loops end at once. Register D reads 0x80 (valid RAM).
//!
//! Interrupts are modelled: the periodic (register A rate), alarm and
//! update-ended flags of register C are set as virtual time crosses their
//! boundaries, and IRQF rising produces one IRQ8 edge; reading register C
//! clears the flags. The alarm is compared once per clock second, and
//! [`Rtc::next_deadline`] reports the next boundary that could raise IRQF
//! (none while IRQF is already set: no new edge can happen before the guest
//! reads register C). If the clock is advanced over more than a day at
//! once, only the last day's seconds are checked against the alarm (the
//! alarm compares time of day only, so that covers every possible match).

use crate::bus::BusDevice;
use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use serde::{Deserialize, Serialize};

pub const CMOS_RAM_SIZE: usize = 128;

const REG_SECONDS: u8 = 0x00;
const REG_SECONDS_ALARM: u8 = 0x01;
const REG_MINUTES: u8 = 0x02;
const REG_MINUTES_ALARM: u8 = 0x03;
const REG_HOURS: u8 = 0x04;
const REG_HOURS_ALARM: u8 = 0x05;
const REG_DAY_OF_WEEK: u8 = 0x06;
const REG_DAY_OF_MONTH: u8 = 0x07;
const REG_MONTH: u8 = 0x08;
const REG_YEAR: u8 = 0x09;
const REG_A: u8 = 0x0a;
const REG_B: u8 = 0x0b;
const REG_C: u8 = 0x0c;
const REG_D: u8 = 0x0d;
/// The century register the ACPI FADT points at.
pub const REG_CENTURY: u8 = 0x32;

const TIME_REGISTERS: [u8; 8] = [
    REG_SECONDS,
    REG_MINUTES,
    REG_HOURS,
    REG_DAY_OF_WEEK,
    REG_DAY_OF_MONTH,
    REG_MONTH,
    REG_YEAR,
    REG_CENTURY,
];

const A_UIP: u8 = 0x80;
/// DV = 11x holds the divider chain in reset.
const A_DIVIDER_RESET: u8 = 0x60;
const A_RATE: u8 = 0x0f;
/// 32.768 kHz time base, 1024 Hz periodic rate: the reset value Linux expects.
const A_DEFAULT: u8 = 0x26;

const B_SET: u8 = 0x80;
const B_PIE: u8 = 0x40;
const B_AIE: u8 = 0x20;
const B_UIE: u8 = 0x10;
const B_BINARY: u8 = 0x04;
const B_24H: u8 = 0x02;
/// 24-hour, BCD, no interrupts.
const B_DEFAULT: u8 = B_24H;
const B_INTERRUPT_ENABLES: u8 = B_PIE | B_AIE | B_UIE;

const C_IRQF: u8 = 0x80;
const D_VALID_RAM: u8 = 0x80;

const HOUR_PM: u8 = 0x80;
const ALARM_DONT_CARE: u8 = 0xc0;

const NANOS_PER_SEC: u64 = 1_000_000_000;
const SECS_PER_DAY: i64 = 86_400;
const TIME_BASE_HZ: u128 = 32_768;

/// Saved state of the RTC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RtcState {
    pub index: u8,
    /// All 128 bytes; the time registers hold meaningful values only while
    /// the clock is stopped.
    pub cmos: Vec<u8>,
    pub base_unix_secs: i64,
    pub base_time: VirtNanos,
    pub now: VirtNanos,
    pub pending_irq_edge: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rtc {
    index: u8,
    cmos: [u8; CMOS_RAM_SIZE],
    base_unix_secs: i64,
    base_time: VirtNanos,
    now: VirtNanos,
    pending_irq_edge: bool,
}

/// A broken-down UTC time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CivilTime {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 1 = Sunday, as the MC146818 counts.
    day_of_week: u32,
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

fn civil_from_unix(secs: i64) -> CivilTime {
    let days = secs.div_euclid(SECS_PER_DAY);
    let second_of_day = secs.rem_euclid(SECS_PER_DAY);
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u32;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    CivilTime {
        year,
        month,
        day,
        hour: (second_of_day / 3_600) as u32,
        minute: (second_of_day / 60 % 60) as u32,
        second: (second_of_day % 60) as u32,
        day_of_week: ((days + 4).rem_euclid(7) + 1) as u32,
    }
}

fn to_bcd(value: u8) -> u8 {
    ((value / 10) << 4) | (value % 10)
}

/// Decodes BCD, tolerating invalid digits (0xff decodes to 165) so that
/// garbage written by a guest never panics.
fn from_bcd(value: u8) -> u8 {
    (value >> 4) * 10 + (value & 0x0f)
}

/// The register encoding selected by register B.
#[derive(Clone, Copy)]
struct Format {
    binary: bool,
    hours_24: bool,
}

impl Format {
    fn from_register_b(register_b: u8) -> Self {
        Format {
            binary: register_b & B_BINARY != 0,
            hours_24: register_b & B_24H != 0,
        }
    }

    /// `value` must be below 100.
    fn encode(self, value: u32) -> u8 {
        let value = value as u8;
        if self.binary {
            value
        } else {
            to_bcd(value)
        }
    }

    fn decode(self, value: u8) -> u32 {
        u32::from(if self.binary { value } else { from_bcd(value) })
    }

    fn encode_hour(self, hour: u32) -> u8 {
        if self.hours_24 {
            return self.encode(hour);
        }
        let hour_12 = match hour % 12 {
            0 => 12,
            other => other,
        };
        let pm = if hour >= 12 { HOUR_PM } else { 0 };
        self.encode(hour_12) | pm
    }

    fn decode_hour(self, value: u8) -> u32 {
        if self.hours_24 {
            return self.decode(value);
        }
        let hour_12 = self.decode(value & !HOUR_PM) % 12;
        if value & HOUR_PM != 0 {
            hour_12 + 12
        } else {
            hour_12
        }
    }

    /// The value of time register `register` for `unix_secs`.
    fn time_register(self, register: u8, unix_secs: i64) -> u8 {
        let time = civil_from_unix(unix_secs);
        match register {
            REG_SECONDS => self.encode(time.second),
            REG_MINUTES => self.encode(time.minute),
            REG_HOURS => self.encode_hour(time.hour),
            REG_DAY_OF_WEEK => self.encode(time.day_of_week),
            REG_DAY_OF_MONTH => self.encode(time.day),
            REG_MONTH => self.encode(time.month),
            REG_YEAR => self.encode(time.year.rem_euclid(100) as u32),
            REG_CENTURY => self.encode(time.year.div_euclid(100).rem_euclid(100) as u32),
            _ => 0,
        }
    }
}

fn is_time_register(register: u8) -> bool {
    TIME_REGISTERS.contains(&register)
}

/// Length of one periodic-interrupt period in 32.768 kHz time-base ticks,
/// for register A's rate-select bits.
fn periodic_period_ticks(rate_select: u8) -> Option<u128> {
    match rate_select {
        0 => None,
        // Rates 1 and 2 repeat rates 8 and 9 with a 32.768 kHz time base.
        1 | 2 => Some(1 << (rate_select + 6)),
        _ => Some(1 << (rate_select - 1)),
    }
}

fn nanos_to_time_base_ticks(nanos: u64) -> u128 {
    u128::from(nanos) * TIME_BASE_HZ / u128::from(NANOS_PER_SEC)
}

/// The first nanosecond at which `ticks` time-base ticks have elapsed.
fn time_base_ticks_to_nanos(ticks: u128) -> u128 {
    (ticks * u128::from(NANOS_PER_SEC)).div_ceil(TIME_BASE_HZ)
}

impl Rtc {
    pub fn new(epoch_unix_secs: i64) -> Self {
        let mut cmos = [0u8; CMOS_RAM_SIZE];
        cmos[usize::from(REG_A)] = A_DEFAULT;
        cmos[usize::from(REG_B)] = B_DEFAULT;
        cmos[usize::from(REG_D)] = D_VALID_RAM;
        Rtc {
            index: 0,
            cmos,
            base_unix_secs: epoch_unix_secs,
            base_time: VirtNanos::ZERO,
            now: VirtNanos::ZERO,
            pending_irq_edge: false,
        }
    }

    fn register(&self, register: u8) -> u8 {
        self.cmos[usize::from(register)]
    }

    fn format(&self) -> Format {
        Format::from_register_b(self.register(REG_B))
    }

    fn clock_running(&self) -> bool {
        self.register(REG_B) & B_SET == 0
            && self.register(REG_A) & A_DIVIDER_RESET != A_DIVIDER_RESET
    }

    fn whole_secs_since_base(&self) -> u64 {
        self.now.saturating_sub(self.base_time).as_nanos() / NANOS_PER_SEC
    }

    /// The running clock's time, in Unix seconds.
    fn running_unix_secs(&self) -> i64 {
        let elapsed = i64::try_from(self.whole_secs_since_base()).unwrap_or(i64::MAX);
        self.base_unix_secs.saturating_add(elapsed)
    }

    /// The current time, in Unix seconds: from the running clock, or from the
    /// time registers while it is stopped.
    pub fn unix_secs(&self) -> i64 {
        if self.clock_running() {
            self.running_unix_secs()
        } else {
            self.parse_time_registers(self.format())
        }
    }

    fn store_time_registers(&mut self, unix_secs: i64, format: Format) {
        for register in TIME_REGISTERS {
            self.cmos[usize::from(register)] = format.time_register(register, unix_secs);
        }
    }

    /// Converts the stored time registers back to Unix seconds. Out-of-range
    /// fields are clamped or carried over rather than rejected.
    fn parse_time_registers(&self, format: Format) -> i64 {
        let year = i64::from(format.decode(self.register(REG_CENTURY))) * 100
            + i64::from(format.decode(self.register(REG_YEAR)));
        let month = format.decode(self.register(REG_MONTH)).clamp(1, 12);
        let day = format.decode(self.register(REG_DAY_OF_MONTH)).clamp(1, 31);
        let days = days_from_civil(year, month, 1) + i64::from(day) - 1;
        days * SECS_PER_DAY
            + i64::from(format.decode_hour(self.register(REG_HOURS))) * 3_600
            + i64::from(format.decode(self.register(REG_MINUTES))) * 60
            + i64::from(format.decode(self.register(REG_SECONDS)))
    }

    /// Advances the clock to `now` (never backwards), setting the register C
    /// flags of every boundary crossed and an IRQ8 edge if IRQF rises.
    pub fn advance_to(&mut self, now: VirtNanos) {
        if now <= self.now {
            return;
        }
        let previous = self.now;
        self.now = now;
        if !self.clock_running() {
            return;
        }
        let from = previous.saturating_sub(self.base_time).as_nanos();
        let to = now.saturating_sub(self.base_time).as_nanos();
        let mut flags = 0;

        let (from_secs, to_secs) = (from / NANOS_PER_SEC, to / NANOS_PER_SEC);
        if to_secs > from_secs {
            flags |= B_UIE;
            // Skip the search when AF is already latched: it cannot change anything.
            let alarm_latched = self.register(REG_C) & B_AIE != 0;
            if !alarm_latched && self.alarm_matches_in(from_secs + 1, to_secs) {
                flags |= B_AIE;
            }
        }
        if let Some(period) = periodic_period_ticks(self.register(REG_A) & A_RATE) {
            let from_periods = nanos_to_time_base_ticks(from) / period;
            let to_periods = nanos_to_time_base_ticks(to) / period;
            if to_periods > from_periods {
                flags |= B_PIE;
            }
        }
        self.raise_flags(flags);
    }

    /// Whether the alarm matches at any of the clock seconds `first..=last`
    /// (counted from `base_time`); only the last day's worth is examined.
    fn alarm_matches_in(&self, first: u64, last: u64) -> bool {
        let first = first.max(last.saturating_sub(SECS_PER_DAY as u64 - 1));
        let format = self.format();
        let alarm = [
            (REG_SECONDS, self.register(REG_SECONDS_ALARM)),
            (REG_MINUTES, self.register(REG_MINUTES_ALARM)),
            (REG_HOURS, self.register(REG_HOURS_ALARM)),
        ];
        (first..=last).any(|elapsed| {
            let elapsed = i64::try_from(elapsed).unwrap_or(i64::MAX);
            let unix_secs = self.base_unix_secs.saturating_add(elapsed);
            alarm.iter().all(|&(register, wanted)| {
                wanted & ALARM_DONT_CARE == ALARM_DONT_CARE
                    || format.time_register(register, unix_secs) == wanted
            })
        })
    }

    /// Sets register C flags (bit positions shared with register B's enables)
    /// and re-evaluates IRQF.
    fn raise_flags(&mut self, flags: u8) {
        let register_c = usize::from(REG_C);
        self.cmos[register_c] |= flags & B_INTERRUPT_ENABLES;
        let asserted = self.cmos[register_c] & self.register(REG_B) & B_INTERRUPT_ENABLES != 0;
        if asserted && self.cmos[register_c] & C_IRQF == 0 {
            self.cmos[register_c] |= C_IRQF;
            self.pending_irq_edge = true;
        }
    }

    /// The next virtual time at which a flag could raise IRQF.
    pub fn next_deadline(&self) -> Option<VirtNanos> {
        if !self.clock_running() || self.register(REG_C) & C_IRQF != 0 {
            return None;
        }
        let register_b = self.register(REG_B);
        let elapsed = self.now.saturating_sub(self.base_time).as_nanos();
        let mut deadline: Option<u128> = None;
        if register_b & (B_UIE | B_AIE) != 0 {
            let next_second = (elapsed / NANOS_PER_SEC + 1) * NANOS_PER_SEC;
            deadline = Some(u128::from(next_second));
        }
        if register_b & B_PIE != 0 {
            if let Some(period) = periodic_period_ticks(self.register(REG_A) & A_RATE) {
                let next_period = nanos_to_time_base_ticks(elapsed) / period + 1;
                let at = time_base_ticks_to_nanos(next_period * period);
                deadline = Some(deadline.map_or(at, |other| other.min(at)));
            }
        }
        let absolute = u128::from(self.base_time.as_nanos()) + deadline?;
        u64::try_from(absolute).ok().map(VirtNanos)
    }

    /// Whether IRQF rose since the last call (one IRQ8 edge).
    pub fn take_irq_edge(&mut self) -> bool {
        std::mem::take(&mut self.pending_irq_edge)
    }

    fn read_register(&mut self, register: u8) -> u8 {
        match register {
            _ if is_time_register(register) && self.clock_running() => self
                .format()
                .time_register(register, self.running_unix_secs()),
            REG_A => self.register(REG_A) & !A_UIP,
            REG_C => std::mem::take(&mut self.cmos[usize::from(REG_C)]),
            REG_D => D_VALID_RAM,
            _ => self.register(register),
        }
    }

    fn write_register(&mut self, register: u8, value: u8) {
        match register {
            _ if is_time_register(register) => self.write_time_register(register, value),
            REG_A => {
                self.write_control(REG_A, value & !A_UIP);
            }
            REG_B => {
                // Setting SET also clears UIE.
                let value = if value & B_SET != 0 {
                    value & !B_UIE
                } else {
                    value
                };
                self.write_control(REG_B, value);
                self.raise_flags(0);
            }
            REG_C | REG_D => {}
            _ => self.cmos[usize::from(register)] = value,
        }
    }

    fn write_time_register(&mut self, register: u8, value: u8) {
        if !self.clock_running() {
            self.cmos[usize::from(register)] = value;
            return;
        }
        let format = self.format();
        self.store_time_registers(self.running_unix_secs(), format);
        self.cmos[usize::from(register)] = value;
        self.base_unix_secs = self.parse_time_registers(format);
        // Keep the sub-second phase: the new time holds from the last
        // second boundary on.
        let whole_secs_nanos = self.whole_secs_since_base() * NANOS_PER_SEC;
        self.base_time = VirtNanos(self.base_time.as_nanos() + whole_secs_nanos);
    }

    /// Writes register A or B, handling the clock stopping or restarting and
    /// data-format changes while stopped.
    fn write_control(&mut self, register: u8, value: u8) {
        let was_running = self.clock_running();
        let old_format = self.format();
        let time = self.unix_secs();
        self.cmos[usize::from(register)] = value;
        let new_format = self.format();
        match (was_running, self.clock_running()) {
            (true, false) => self.store_time_registers(time, new_format),
            (false, true) => {
                self.base_unix_secs = time;
                self.base_time = self.now;
            }
            (false, false) => {
                // Re-encode the stopped time if the data format changed.
                let time = self.parse_time_registers(old_format);
                self.store_time_registers(time, new_format);
            }
            (true, true) => {}
        }
    }
}

impl Persist for Rtc {
    type State = RtcState;

    fn save(&self) -> RtcState {
        RtcState {
            index: self.index,
            cmos: self.cmos.to_vec(),
            base_unix_secs: self.base_unix_secs,
            base_time: self.base_time,
            now: self.now,
            pending_irq_edge: self.pending_irq_edge,
        }
    }

    /// The CMOS RAM must be whole and the selected register inside it (the
    /// index port keeps 7 bits).
    fn validate(&self, state: &RtcState) -> Result<(), RestoreError> {
        if state.cmos.len() != CMOS_RAM_SIZE {
            return Err(RestoreError::CmosRamLength {
                len: state.cmos.len(),
                expected: CMOS_RAM_SIZE,
            });
        }
        if usize::from(state.index) >= CMOS_RAM_SIZE {
            return Err(RestoreError::CmosIndexOutOfRange {
                index: state.index,
                count: CMOS_RAM_SIZE,
            });
        }
        Ok(())
    }

    fn restore(&mut self, state: &RtcState) -> Result<(), RestoreError> {
        self.validate(state)?;
        self.index = state.index;
        self.cmos.copy_from_slice(&state.cmos);
        self.base_unix_secs = state.base_unix_secs;
        self.base_time = state.base_time;
        self.now = state.now;
        self.pending_irq_edge = state.pending_irq_edge;
        Ok(())
    }
}

/// Offset 0 is the index port (0x70), offset 1 the data port (0x71); each
/// byte of a wider access is its own 8-bit cycle.
impl BusDevice for Rtc {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = match offset.saturating_add(i as u64) {
                // The index port is write-only on real chipsets.
                0 => 0xff,
                1 => self.read_register(self.index),
                _ => 0xff,
            };
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, &byte) in data.iter().enumerate() {
            match offset.saturating_add(i as u64) {
                // Bit 7 is the NMI mask, which is not modelled.
                0 => self.index = byte & 0x7f,
                1 => self.write_register(self.index, byte),
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2024-01-01T00:00:00Z, a Monday.
    const EPOCH_2024: i64 = 1_704_067_200;

    fn read_cmos(rtc: &mut Rtc, register: u8) -> u8 {
        rtc.write(0, &[register | 0x80]);
        let mut data = [0u8];
        rtc.read(1, &mut data);
        data[0]
    }

    fn write_cmos(rtc: &mut Rtc, register: u8, value: u8) {
        rtc.write(0, &[register]);
        rtc.write(1, &[value]);
    }

    fn read_time(rtc: &mut Rtc) -> [u8; 8] {
        TIME_REGISTERS.map(|register| read_cmos(rtc, register))
    }

    #[test]
    fn test_rtc_civil_conversion_round_trips_known_dates() {
        // Arrange
        let cases = [
            (0, (1970, 1, 1, 5)),
            (EPOCH_2024, (2024, 1, 1, 2)),
            (951_782_400, (2000, 2, 29, 3)),
            (-86_400, (1969, 12, 31, 4)),
        ];

        for (secs, (year, month, day, day_of_week)) in cases {
            // Act
            let time = civil_from_unix(secs);

            // Assert
            assert_eq!(
                (time.year, time.month, time.day, time.day_of_week),
                (year, month, day, day_of_week)
            );
            assert_eq!(days_from_civil(year, month, day) * SECS_PER_DAY, secs);
        }
    }

    #[test]
    fn test_rtc_bcd_time_for_known_epoch_plus_90s() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);

        // Act
        rtc.advance_to(VirtNanos::from_secs(90));
        let time = read_time(&mut rtc);

        // Assert: sec, min, hour, weekday, day, month, year, century
        assert_eq!(time, [0x30, 0x01, 0x00, 0x02, 0x01, 0x01, 0x24, 0x20]);
    }

    #[test]
    fn test_rtc_binary_time_for_known_epoch_plus_90s() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);
        write_cmos(&mut rtc, REG_B, B_24H | B_BINARY);

        // Act
        rtc.advance_to(VirtNanos::from_secs(90));
        let time = read_time(&mut rtc);

        // Assert
        assert_eq!(time, [30, 1, 0, 2, 1, 1, 24, 20]);
    }

    #[test]
    fn test_rtc_12_hour_mode_sets_pm_bit() {
        // Arrange: 13:05:00.
        let mut rtc = Rtc::new(EPOCH_2024 + 13 * 3_600 + 5 * 60);

        // Act
        write_cmos(&mut rtc, REG_B, 0);
        let pm_hour = read_cmos(&mut rtc, REG_HOURS);
        write_cmos(&mut rtc, REG_B, B_BINARY);
        let pm_hour_binary = read_cmos(&mut rtc, REG_HOURS);

        // Assert
        assert_eq!(pm_hour, 0x81);
        assert_eq!(pm_hour_binary, 0x81);
    }

    #[test]
    fn test_rtc_12_hour_mode_midnight_is_12_am() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);

        // Act
        write_cmos(&mut rtc, REG_B, 0);
        let hour = read_cmos(&mut rtc, REG_HOURS);

        // Assert
        assert_eq!(hour, 0x12);
    }

    #[test]
    fn test_rtc_status_registers_have_linux_expected_values() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);

        // Act
        let a = read_cmos(&mut rtc, REG_A);
        let b = read_cmos(&mut rtc, REG_B);
        let d = read_cmos(&mut rtc, REG_D);

        // Assert
        assert_eq!(a & A_UIP, 0);
        assert_eq!(a, 0x26);
        assert_eq!(b, 0x02);
        assert_eq!(d, 0x80);
    }

    #[test]
    fn test_rtc_linux_set_time_sequence_moves_clock() {
        // Arrange: mc146818_set_time() writing 2030-06-15 12:34:56.
        let mut rtc = Rtc::new(EPOCH_2024);
        rtc.advance_to(VirtNanos(1_500_000_000));
        let control = read_cmos(&mut rtc, REG_B);
        let freq_select = read_cmos(&mut rtc, REG_A);

        // Act
        write_cmos(&mut rtc, REG_B, control | B_SET);
        write_cmos(&mut rtc, REG_A, freq_select | 0x70);
        for (register, value) in [
            (REG_YEAR, 0x30),
            (REG_MONTH, 0x06),
            (REG_DAY_OF_MONTH, 0x15),
            (REG_HOURS, 0x12),
            (REG_MINUTES, 0x34),
            (REG_SECONDS, 0x56),
            (REG_CENTURY, 0x20),
        ] {
            write_cmos(&mut rtc, register, value);
        }
        rtc.advance_to(VirtNanos(5_000_000_000));
        write_cmos(&mut rtc, REG_B, control);
        write_cmos(&mut rtc, REG_A, freq_select);
        rtc.advance_to(VirtNanos(7_000_000_000));

        // Assert
        assert_eq!(rtc.unix_secs(), 1_907_757_296 + 2);
        assert_eq!(read_cmos(&mut rtc, REG_SECONDS), 0x58);
        assert_eq!(read_cmos(&mut rtc, REG_DAY_OF_WEEK), 0x07, "a Saturday");
    }

    #[test]
    fn test_rtc_clock_stops_while_set_bit_is_set() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);
        write_cmos(&mut rtc, REG_B, B_24H | B_SET);

        // Act
        rtc.advance_to(VirtNanos::from_secs(10));
        let seconds = read_cmos(&mut rtc, REG_SECONDS);

        // Assert
        assert_eq!(seconds, 0x00);
    }

    #[test]
    fn test_rtc_time_register_write_while_running_takes_effect() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);
        rtc.advance_to(VirtNanos(2_500_000_000));

        // Act
        write_cmos(&mut rtc, REG_MINUTES, 0x45);
        rtc.advance_to(VirtNanos(3_000_000_000));

        // Assert
        assert_eq!(rtc.unix_secs(), EPOCH_2024 + 45 * 60 + 3);
    }

    #[test]
    fn test_rtc_cmos_ram_is_plain_storage() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);

        // Act
        write_cmos(&mut rtc, 0x40, 0xa5);
        write_cmos(&mut rtc, 0x7f, 0x5a);

        // Assert
        assert_eq!(read_cmos(&mut rtc, 0x40), 0xa5);
        assert_eq!(read_cmos(&mut rtc, 0x7f), 0x5a);
    }

    #[test]
    fn test_rtc_register_c_and_d_are_read_only() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);

        // Act
        write_cmos(&mut rtc, REG_C, 0xff);
        write_cmos(&mut rtc, REG_D, 0x00);

        // Assert
        assert_eq!(read_cmos(&mut rtc, REG_C), 0);
        assert_eq!(read_cmos(&mut rtc, REG_D), 0x80);
    }

    #[test]
    fn test_rtc_update_interrupt_raises_one_edge_per_register_c_read() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);
        write_cmos(&mut rtc, REG_B, B_24H | B_UIE);

        // Act
        let deadline = rtc.next_deadline();
        rtc.advance_to(VirtNanos::from_secs(1));
        let first_edge = rtc.take_irq_edge();
        rtc.advance_to(VirtNanos::from_secs(2));
        let edge_while_irqf_set = rtc.take_irq_edge();
        let register_c = read_cmos(&mut rtc, REG_C);
        rtc.advance_to(VirtNanos::from_secs(3));
        let edge_after_read = rtc.take_irq_edge();

        // Assert
        assert_eq!(deadline, Some(VirtNanos::from_secs(1)));
        assert!(first_edge);
        assert!(!edge_while_irqf_set);
        assert_eq!(register_c & (C_IRQF | B_UIE), C_IRQF | B_UIE);
        assert!(edge_after_read);
    }

    #[test]
    fn test_rtc_periodic_interrupt_at_1024_hz() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);
        write_cmos(&mut rtc, REG_B, B_24H | B_PIE);

        // Act
        let deadline = rtc.next_deadline();
        rtc.advance_to(VirtNanos(976_562));
        let early = rtc.take_irq_edge();
        rtc.advance_to(VirtNanos(976_563));
        let on_time = rtc.take_irq_edge();

        // Assert
        assert_eq!(deadline, Some(VirtNanos(976_563)));
        assert!(!early);
        assert!(on_time);
    }

    #[test]
    fn test_rtc_alarm_matches_once_per_day() {
        // Arrange: alarm at 00:00:05, hours don't care.
        let mut rtc = Rtc::new(EPOCH_2024);
        write_cmos(&mut rtc, REG_SECONDS_ALARM, 0x05);
        write_cmos(&mut rtc, REG_MINUTES_ALARM, 0x00);
        write_cmos(&mut rtc, REG_HOURS_ALARM, 0xff);
        write_cmos(&mut rtc, REG_B, B_24H | B_AIE);

        // Act
        rtc.advance_to(VirtNanos::from_secs(4));
        let before = read_cmos(&mut rtc, REG_C);
        rtc.advance_to(VirtNanos::from_secs(6));
        let edge = rtc.take_irq_edge();
        let after = read_cmos(&mut rtc, REG_C);

        // Assert
        assert_eq!(before & B_AIE, 0);
        assert!(edge);
        assert_eq!(after & (C_IRQF | B_AIE), C_IRQF | B_AIE);
    }

    #[test]
    fn test_rtc_no_deadline_without_interrupt_enables() {
        // Arrange
        let rtc = Rtc::new(EPOCH_2024);

        // Act
        let deadline = rtc.next_deadline();

        // Assert
        assert_eq!(deadline, None);
    }

    #[test]
    fn test_rtc_garbage_time_registers_do_not_panic() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);
        write_cmos(&mut rtc, REG_B, B_24H | B_SET);

        // Act
        for register in TIME_REGISTERS {
            write_cmos(&mut rtc, register, 0xff);
        }
        write_cmos(&mut rtc, REG_B, B_BINARY | B_SET);
        write_cmos(&mut rtc, REG_B, B_24H);
        let time = read_time(&mut rtc);

        // Assert
        assert!(time.iter().all(|&byte| from_bcd(byte) < 100));
    }

    #[test]
    fn test_rtc_wide_and_out_of_range_accesses_do_not_panic() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);
        let mut wide = [0u8; 8];

        // Act
        rtc.write(0, &[0x0d, 0x00, 0xff, 0xff]);
        rtc.read(0, &mut wide);
        rtc.write(u64::MAX, &[1, 2]);

        // Assert
        assert_eq!(wide, [0xff, 0x80, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn test_rtc_restore_rejects_short_cmos() {
        // Arrange
        let mut rtc = Rtc::new(EPOCH_2024);
        let mut state = rtc.save();
        state.cmos.truncate(64);

        // Act
        let result = rtc.restore(&state);

        // Assert
        assert_eq!(
            result,
            Err(RestoreError::CmosRamLength {
                len: 64,
                expected: 128
            })
        );
    }

    /// CMOS RAM written, 24-hour mode with update interrupts, 3 s in.
    fn used_rtc() -> Rtc {
        let mut rtc = Rtc::new(EPOCH_2024);
        write_cmos(&mut rtc, 0x50, 0x42);
        write_cmos(&mut rtc, REG_B, B_24H | B_UIE);
        rtc.advance_to(VirtNanos::from_secs(3));
        rtc
    }

    crate::persist::persist_round_trip_tests! {
        mod rtc_persist {
            fresh: Rtc::new(EPOCH_2024),
            saved: used_rtc(),
            mutate: |rtc: &mut Rtc| {
                write_cmos(rtc, 0x50, 0x00);
                write_cmos(rtc, REG_B, B_SET);
                rtc.advance_to(VirtNanos::from_secs(30));
            },
        }
    }

    #[test]
    fn test_rtc_restore_rejects_index_beyond_cmos() {
        // Arrange
        let mut rtc = used_rtc();
        let before = rtc.save();
        let mut state = before.clone();
        state.index = 0x80;

        // Act
        let result = rtc.restore(&state);

        // Assert
        assert_eq!(
            result,
            Err(RestoreError::CmosIndexOutOfRange {
                index: 0x80,
                count: 128
            })
        );
        assert_eq!(rtc.save(), before);
    }
}
