//! A High Precision Event Timer (IA-PC HPET 1.0a) with three timers and a
//! 64-bit main counter at 100 MHz, driven only by virtual time.
//!
//! The main counter is derived from the last `now` the device was advanced
//! to: while enabled it is `counter_base + (now - counter_epoch) / 10 ns`;
//! disabling freezes it and writing it rebases it, so the guest's
//! stop/reset/start sequence (Linux's `hpet_restart_counter`) works.
//!
//! Comparators are equality comparators, as on real hardware: a timer fires
//! when the counter (its low 32 bits, for a timer in 32-bit mode) next equals
//! the comparator. A comparator written "behind" the counter therefore fires
//! only after the counter wraps (2^32 ticks = 42.9 s in 32-bit mode), which
//! is what Linux's `hpet_clkevt_set_next_event` guards against by re-reading
//! the counter; a comparator equal to the counter fires at once.
//!
//! Each armed timer keeps the absolute counter value of its next match, so
//! [`Hpet::next_deadline`] is exact. Missed matches are collapsed: when
//! [`Hpet::advance_to`] finds that several periods of a periodic timer (or
//! several wraps of a 32-bit one-shot timer) have elapsed, the timer fires
//! once and its comparator moves to the first match after `now`, keeping its
//! phase. Several edges within one advance would be indistinguishable to the
//! guest anyway: the PIC latches one request per line, and the guest cannot
//! run between them.
//!
//! Interrupt routing: only LegacyReplacement routing is modelled (timer 0 to
//! IRQ0, timer 1 to IRQ8), since the guest has no IOAPIC. The timers
//! advertise no IOAPIC routes (`Tn_INT_ROUTE_CAP` = 0) and no FSB delivery;
//! outside legacy mode, and for timer 2, a firing timer only sets its status
//! bit (in level mode). Timers whose interrupt is disabled are not armed at
//! all (they set no status bit), so they never cost the VMM a wake-up.
//!
//! Level-triggered timers set their `GINTR_STA` bit and produce one edge when
//! that bit rises; the PIC lines they drive are edge-triggered on a PC.

use crate::bus::BusDevice;
use crate::layout::{IRQ_RTC, IRQ_TIMER};
use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use serde::{Deserialize, Serialize};

pub const HPET_NUM_TIMERS: usize = 3;
/// Main counter tick in femtoseconds (10 ns, 100 MHz).
pub const HPET_PERIOD_FS: u64 = 10_000_000;
const NANOS_PER_TICK: u64 = HPET_PERIOD_FS / 1_000_000;
const VENDOR_ID_INTEL: u64 = 0x8086;
const REVISION_ID: u64 = 0x01;

const REG_CAPABILITIES: u64 = 0x000;
const REG_CONFIG: u64 = 0x010;
const REG_INT_STATUS: u64 = 0x020;
const REG_MAIN_COUNTER: u64 = 0x0f0;
const REG_TIMER_BASE: u64 = 0x100;
const TIMER_STRIDE: u64 = 0x20;
const TIMER_CONFIG: u64 = 0x00;
const TIMER_COMPARATOR: u64 = 0x08;

const CAP_COUNT_SIZE_64: u64 = 1 << 13;
const CAP_LEGACY_ROUTE: u64 = 1 << 15;

const CFG_ENABLE: u64 = 1 << 0;
const CFG_LEGACY: u64 = 1 << 1;

const TN_LEVEL: u64 = 1 << 1;
const TN_INT_ENABLE: u64 = 1 << 2;
const TN_PERIODIC: u64 = 1 << 3;
const TN_PERIODIC_CAP: u64 = 1 << 4;
const TN_SIZE_CAP_64: u64 = 1 << 5;
const TN_VAL_SET: u64 = 1 << 6;
const TN_32BIT: u64 = 1 << 8;
const TN_ROUTE: u64 = 0x1f << 9;
const TN_WRITABLE: u64 = TN_LEVEL | TN_INT_ENABLE | TN_PERIODIC | TN_VAL_SET | TN_32BIT | TN_ROUTE;
/// Config bits whose change moves the timer's next match.
const TN_REARM_ON_CHANGE: u64 = TN_INT_ENABLE | TN_PERIODIC | TN_32BIT;

/// Saved state of one timer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HpetTimerState {
    /// Writable bits of Tn_CONFIG (capability bits are added on read).
    pub config: u64,
    pub comparator: u64,
    /// Periodic increment, set by comparator writes.
    pub period: u64,
    /// Absolute main-counter value of the next match, if armed.
    pub next_match_tick: Option<u64>,
}

impl HpetTimerState {
    fn is_32bit(&self) -> bool {
        self.config & TN_32BIT != 0
    }

    fn width_mask(&self) -> u64 {
        if self.is_32bit() {
            u64::from(u32::MAX)
        } else {
            u64::MAX
        }
    }

    fn is_periodic(&self) -> bool {
        self.config & TN_PERIODIC != 0
    }
}

/// Saved state of the HPET.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HpetState {
    pub now: VirtNanos,
    pub config: u64,
    pub int_status: u64,
    /// Main counter value at `counter_epoch` (the whole value while halted).
    pub counter_base: u64,
    pub counter_epoch: VirtNanos,
    pub timers: Vec<HpetTimerState>,
    /// PIC lines with an edge not yet collected by the owner (bit n = IRQn).
    pub pending_irq_edges: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hpet {
    now: VirtNanos,
    config: u64,
    int_status: u64,
    counter_base: u64,
    counter_epoch: VirtNanos,
    timers: [HpetTimerState; HPET_NUM_TIMERS],
    pending_irq_edges: u16,
}

impl Default for Hpet {
    fn default() -> Self {
        Self::new()
    }
}

fn merge(old: u64, value: u64, mask: u64) -> u64 {
    (old & !mask) | (value & mask)
}

impl Hpet {
    pub fn new() -> Self {
        Hpet {
            now: VirtNanos::ZERO,
            config: 0,
            int_status: 0,
            counter_base: 0,
            counter_epoch: VirtNanos::ZERO,
            timers: std::array::from_fn(|_| HpetTimerState {
                // The specification's reset value: all ones, so that enabling
                // a timer's interrupt before programming it fires nothing soon.
                comparator: u64::MAX,
                ..HpetTimerState::default()
            }),
            pending_irq_edges: 0,
        }
    }

    fn counter_enabled(&self) -> bool {
        self.config & CFG_ENABLE != 0
    }

    /// Whether LegacyReplacement routing is on: timer 0 drives IRQ0, timer 1
    /// IRQ8, and the RTC's own interrupt is disconnected.
    pub fn legacy_replacement(&self) -> bool {
        self.config & CFG_LEGACY != 0
    }

    /// The main counter at the device's current time.
    pub fn counter(&self) -> u64 {
        if self.counter_enabled() {
            let elapsed_ticks =
                self.now.saturating_sub(self.counter_epoch).as_nanos() / NANOS_PER_TICK;
            self.counter_base.wrapping_add(elapsed_ticks)
        } else {
            self.counter_base
        }
    }

    /// The virtual time at which the running counter reaches `tick`.
    fn time_of_tick(&self, tick: u64) -> Option<VirtNanos> {
        if !self.counter_enabled() {
            return None;
        }
        let ticks_ahead = tick.checked_sub(self.counter_base)?;
        let nanos = u128::from(self.counter_epoch.as_nanos())
            + u128::from(ticks_ahead) * u128::from(NANOS_PER_TICK);
        u64::try_from(nanos).ok().map(VirtNanos)
    }

    /// Recomputes timer `index`'s next match from the current counter.
    fn rearm(&mut self, index: usize) {
        let counter = self.counter();
        let enabled = self.counter_enabled();
        let timer = &mut self.timers[index];
        timer.next_match_tick = if enabled && timer.config & TN_INT_ENABLE != 0 {
            let ticks_ahead = timer.comparator.wrapping_sub(counter) & timer.width_mask();
            counter.checked_add(ticks_ahead)
        } else {
            None
        };
    }

    fn rearm_all(&mut self) {
        for index in 0..HPET_NUM_TIMERS {
            self.rearm(index);
        }
    }

    /// Advances the device to `now` (never backwards) and fires every armed
    /// timer whose match time is at or before `now`; see the module
    /// documentation for how missed periods are collapsed.
    pub fn advance_to(&mut self, now: VirtNanos) {
        self.now = self.now.max(now);
        for index in 0..HPET_NUM_TIMERS {
            self.fire_if_due(index);
        }
    }

    fn fire_if_due(&mut self, index: usize) {
        let Some(match_tick) = self.timers[index].next_match_tick else {
            return;
        };
        match self.time_of_tick(match_tick) {
            Some(time) if time <= self.now => {}
            _ => return,
        }
        self.raise_interrupt(index);

        // The next match strictly after the current counter.
        let counter = self.counter();
        let timer = &mut self.timers[index];
        let period = timer.period & timer.width_mask();
        let step = if timer.is_periodic() && period != 0 {
            period
        } else if timer.is_32bit() {
            // The comparator matches again when the low 32 bits wrap around.
            1u64 << 32
        } else {
            timer.next_match_tick = None;
            return;
        };
        let steps = u128::from(counter.saturating_sub(match_tick) / step) + 1;
        let advance = steps * u128::from(step);
        timer.next_match_tick = u64::try_from(u128::from(match_tick) + advance).ok();
        if timer.is_periodic() {
            // Truncation to 64 bits is the comparator's own modular arithmetic.
            timer.comparator = timer.comparator.wrapping_add(advance as u64) & timer.width_mask();
        }
    }

    fn raise_interrupt(&mut self, index: usize) {
        let timer = &self.timers[index];
        let bit = 1u64 << index;
        if timer.config & TN_LEVEL != 0 {
            let already_asserted = self.int_status & bit != 0;
            self.int_status |= bit;
            if already_asserted {
                return;
            }
        }
        if let Some(line) = self.route(index) {
            self.pending_irq_edges |= 1 << line;
        }
    }

    fn route(&self, index: usize) -> Option<u8> {
        match (self.legacy_replacement(), index) {
            (true, 0) => Some(IRQ_TIMER),
            (true, 1) => Some(IRQ_RTC),
            _ => None,
        }
    }

    /// The earliest virtual time at which an armed timer (counter running,
    /// interrupt enabled) matches.
    pub fn next_deadline(&self) -> Option<VirtNanos> {
        self.timers
            .iter()
            .filter_map(|timer| timer.next_match_tick)
            .filter_map(|tick| self.time_of_tick(tick))
            .min()
    }

    /// PIC lines that received an edge since the last call (bit n = IRQn).
    pub fn take_irq_edges(&mut self) -> u16 {
        std::mem::take(&mut self.pending_irq_edges)
    }

    fn read_register(&self, register: u64) -> u64 {
        match register {
            REG_CAPABILITIES => {
                (HPET_PERIOD_FS << 32)
                    | (VENDOR_ID_INTEL << 16)
                    | CAP_LEGACY_ROUTE
                    | CAP_COUNT_SIZE_64
                    | ((HPET_NUM_TIMERS as u64 - 1) << 8)
                    | REVISION_ID
            }
            REG_CONFIG => self.config,
            REG_INT_STATUS => self.int_status,
            REG_MAIN_COUNTER => self.counter(),
            _ => match Self::timer_register(register) {
                Some((index, TIMER_CONFIG)) => {
                    self.timers[index].config | TN_PERIODIC_CAP | TN_SIZE_CAP_64
                }
                Some((index, TIMER_COMPARATOR)) => self.timers[index].comparator,
                _ => 0,
            },
        }
    }

    fn write_register(&mut self, register: u64, value: u64, mask: u64) {
        match register {
            REG_CONFIG => {
                let old = self.config;
                let new = merge(old, value, mask) & (CFG_ENABLE | CFG_LEGACY);
                if old & CFG_ENABLE != 0 && new & CFG_ENABLE == 0 {
                    self.counter_base = self.counter();
                }
                if old & CFG_ENABLE == 0 && new & CFG_ENABLE != 0 {
                    self.counter_epoch = self.now;
                }
                self.config = new;
                if (old ^ new) & CFG_ENABLE != 0 {
                    self.rearm_all();
                }
            }
            REG_INT_STATUS => {
                // Write 1 to clear.
                self.int_status &= !(value & mask);
            }
            REG_MAIN_COUNTER => {
                self.counter_base = merge(self.counter(), value, mask);
                self.counter_epoch = self.now;
                self.rearm_all();
            }
            _ => match Self::timer_register(register) {
                Some((index, TIMER_CONFIG)) => self.write_timer_config(index, value, mask),
                Some((index, TIMER_COMPARATOR)) => self.write_timer_comparator(index, value, mask),
                // FSB route and reserved registers: no FSB delivery is advertised.
                _ => {}
            },
        }
    }

    fn write_timer_config(&mut self, index: usize, value: u64, mask: u64) {
        let timer = &mut self.timers[index];
        let old = timer.config;
        let new = merge(old, value, mask) & TN_WRITABLE;
        if new & TN_32BIT != 0 && old & TN_32BIT == 0 {
            timer.comparator &= u64::from(u32::MAX);
            timer.period &= u64::from(u32::MAX);
        }
        timer.config = new;
        if (old ^ new) & TN_REARM_ON_CHANGE != 0 {
            self.rearm(index);
        }
    }

    /// In periodic mode a comparator write sets only the period, unless
    /// Tn_VAL_SET_CNF is set, in which case it also sets the comparator (and
    /// clears Tn_VAL_SET_CNF). That is what Linux's
    /// `hpet_clkevt_set_state_periodic` relies on: a first write with
    /// VAL_SET for the first match, then a second for the period.
    fn write_timer_comparator(&mut self, index: usize, value: u64, mask: u64) {
        let timer = &mut self.timers[index];
        let mask = if timer.is_32bit() {
            // The upper half does not exist for a 32-bit timer.
            mask & u64::from(u32::MAX)
        } else {
            mask
        };
        if !timer.is_periodic() || timer.config & TN_VAL_SET != 0 {
            timer.comparator = merge(timer.comparator, value, mask);
        }
        timer.period = merge(timer.period, value, mask);
        timer.config &= !TN_VAL_SET;
        self.rearm(index);
    }

    /// `(timer index, register offset within the timer block)`.
    fn timer_register(register: u64) -> Option<(usize, u64)> {
        let relative = register.checked_sub(REG_TIMER_BASE)?;
        let index = usize::try_from(relative / TIMER_STRIDE).ok()?;
        (index < HPET_NUM_TIMERS).then_some((index, relative % TIMER_STRIDE))
    }

    /// `(64-bit register offset, bit shift, mask)` of a 4- or 8-byte
    /// naturally aligned access; `None` for anything else.
    fn decode_access(offset: u64, len: usize) -> Option<(u64, u32)> {
        let aligned = match len {
            4 => offset.is_multiple_of(4),
            8 => offset.is_multiple_of(8),
            _ => false,
        };
        aligned.then_some((offset & !7, ((offset & 4) * 8) as u32))
    }
}

impl Persist for Hpet {
    type State = HpetState;

    fn save(&self) -> HpetState {
        HpetState {
            now: self.now,
            config: self.config,
            int_status: self.int_status,
            counter_base: self.counter_base,
            counter_epoch: self.counter_epoch,
            timers: self.timers.to_vec(),
            pending_irq_edges: self.pending_irq_edges,
        }
    }

    fn validate(&self, state: &HpetState) -> Result<(), RestoreError> {
        if state.timers.len() != HPET_NUM_TIMERS {
            return Err(RestoreError::HpetTimerCount {
                len: state.timers.len(),
                expected: HPET_NUM_TIMERS,
            });
        }
        Ok(())
    }

    fn restore(&mut self, state: &HpetState) -> Result<(), RestoreError> {
        self.validate(state)?;
        self.now = state.now;
        self.config = state.config;
        self.int_status = state.int_status;
        self.counter_base = state.counter_base;
        self.counter_epoch = state.counter_epoch;
        self.timers.clone_from_slice(&state.timers);
        self.pending_irq_edges = state.pending_irq_edges;
        Ok(())
    }
}

/// Register accesses; `offset` is relative to `HPET_BASE`. Only naturally
/// aligned 4- and 8-byte accesses are decoded: other reads return zeros and
/// other writes are ignored.
impl BusDevice for Hpet {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some((register, shift)) = Self::decode_access(offset, data.len()) else {
            return;
        };
        let value = self.read_register(register) >> shift;
        let len = data.len();
        data.copy_from_slice(&value.to_le_bytes()[..len]);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some((register, shift)) = Self::decode_access(offset, data.len()) else {
            return;
        };
        let mut bytes = [0u8; 8];
        bytes[..data.len()].copy_from_slice(data);
        let value = u64::from_le_bytes(bytes) << shift;
        let mask = if data.len() == 8 {
            u64::MAX
        } else {
            u64::from(u32::MAX) << shift
        };
        self.write_register(register, value, mask);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMER0_CONFIG: u64 = 0x100;
    const TIMER0_COMPARATOR: u64 = 0x108;
    const TIMER1_CONFIG: u64 = 0x120;
    const TIMER1_COMPARATOR: u64 = 0x128;

    fn readl(hpet: &mut Hpet, offset: u64) -> u32 {
        let mut data = [0u8; 4];
        hpet.read(offset, &mut data);
        u32::from_le_bytes(data)
    }

    fn readq(hpet: &mut Hpet, offset: u64) -> u64 {
        let mut data = [0u8; 8];
        hpet.read(offset, &mut data);
        u64::from_le_bytes(data)
    }

    fn writel(hpet: &mut Hpet, offset: u64, value: u32) {
        hpet.write(offset, &value.to_le_bytes());
    }

    fn writeq(hpet: &mut Hpet, offset: u64, value: u64) {
        hpet.write(offset, &value.to_le_bytes());
    }

    /// hpet_enable(): sanitize the config, restart the counter at zero, and
    /// turn on legacy routing.
    fn linux_enable(hpet: &mut Hpet) {
        let config = readl(hpet, 0x010) & !0x3;
        writel(hpet, 0x010, config);
        writel(hpet, 0x0f0, 0);
        writel(hpet, 0x0f4, 0);
        writel(hpet, 0x010, config | 0x1);
        let config = readl(hpet, 0x010);
        writel(hpet, 0x010, config | 0x2);
    }

    /// hpet_clkevt_set_state_oneshot() for `timer_config`.
    fn linux_set_oneshot(hpet: &mut Hpet, timer_config: u64) {
        let config = readl(hpet, timer_config) as u64;
        let config = (config & !TN_PERIODIC) | TN_INT_ENABLE | TN_32BIT;
        writel(hpet, timer_config, config as u32);
    }

    /// hpet_clkevt_set_next_event(): returns whether it would report -ETIME.
    fn linux_set_next_event(hpet: &mut Hpet, delta_ticks: u32) -> bool {
        let target = readl(hpet, 0x0f0).wrapping_add(delta_ticks);
        writel(hpet, TIMER0_COMPARATOR, target);
        let remaining = target.wrapping_sub(readl(hpet, 0x0f0)) as i32;
        remaining < 128
    }

    #[test]
    fn test_hpet_capabilities_report_period_timers_and_legacy_support() {
        // Arrange
        let mut hpet = Hpet::new();

        // Act
        let id = readl(&mut hpet, 0x000);
        let period = readl(&mut hpet, 0x004);

        // Assert
        assert_eq!(period, 10_000_000);
        assert_eq!((id >> 8) & 0x1f, 2, "NUM_TIM_CAP is the last timer's index");
        assert_ne!(id & (1 << 15), 0, "LEG_RT_CAP");
        assert_ne!(id & (1 << 13), 0, "COUNT_SIZE_CAP");
        assert_eq!(id & 0xff, 1);
        assert_eq!(id >> 16, 0x8086);
    }

    #[test]
    fn test_hpet_timer_config_reports_capabilities_and_no_routes() {
        // Arrange
        let mut hpet = Hpet::new();

        // Act
        let config = readq(&mut hpet, TIMER0_CONFIG);

        // Assert
        assert_eq!(config, TN_PERIODIC_CAP | TN_SIZE_CAP_64);
    }

    #[test]
    fn test_hpet_counter_advances_with_virtual_time_when_enabled() {
        // Arrange
        let mut hpet = Hpet::new();
        hpet.advance_to(VirtNanos(1_000));
        linux_enable(&mut hpet);

        // Act
        let at_enable = readq(&mut hpet, 0x0f0);
        hpet.advance_to(VirtNanos(1_000 + 12_345));
        let later = readq(&mut hpet, 0x0f0);

        // Assert
        assert_eq!(at_enable, 0);
        assert_eq!(later, 1_234);
    }

    #[test]
    fn test_hpet_counter_is_frozen_while_disabled_and_resumes() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        hpet.advance_to(VirtNanos(1_000));

        // Act
        writel(&mut hpet, 0x010, 0x2);
        hpet.advance_to(VirtNanos(50_000));
        let frozen = readl(&mut hpet, 0x0f0);
        writel(&mut hpet, 0x010, 0x3);
        hpet.advance_to(VirtNanos(50_500));
        let resumed = readl(&mut hpet, 0x0f0);

        // Assert
        assert_eq!(frozen, 100);
        assert_eq!(resumed, 150);
    }

    #[test]
    fn test_hpet_counter_write_rebases_counter() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        hpet.advance_to(VirtNanos(1_000));

        // Act
        writeq(&mut hpet, 0x0f0, 0x1_0000_0000);
        hpet.advance_to(VirtNanos(1_100));

        // Assert
        assert_eq!(readq(&mut hpet, 0x0f0), 0x1_0000_000a);
        assert_eq!(readl(&mut hpet, 0x0f4), 1);
    }

    #[test]
    fn test_hpet_linux_counting_check_sees_counter_change() {
        // Arrange: hpet_counting() reads the counter until it changes.
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);

        // Act
        let first = readl(&mut hpet, 0x0f0);
        hpet.advance_to(VirtNanos(40));
        let second = readl(&mut hpet, 0x0f0);

        // Assert
        assert_ne!(first, second);
    }

    #[test]
    fn test_hpet_oneshot_fires_at_deadline() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        linux_set_oneshot(&mut hpet, TIMER0_CONFIG);
        hpet.advance_to(VirtNanos(1_000));

        // Act
        let late = linux_set_next_event(&mut hpet, 500);
        let deadline = hpet.next_deadline();
        hpet.advance_to(VirtNanos(5_999));
        let edges_before = hpet.take_irq_edges();
        hpet.advance_to(VirtNanos(6_000));
        let edges_at = hpet.take_irq_edges();

        // Assert
        assert!(!late);
        assert_eq!(deadline, Some(VirtNanos(6_000)));
        assert_eq!(edges_before, 0);
        assert_eq!(edges_at, 1 << 0, "legacy routing sends timer 0 to IRQ0");
    }

    #[test]
    fn test_hpet_oneshot_32bit_rearms_only_after_counter_wraps() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        linux_set_oneshot(&mut hpet, TIMER0_CONFIG);
        linux_set_next_event(&mut hpet, 500);

        // Act
        hpet.advance_to(VirtNanos(5_000));
        hpet.take_irq_edges();
        let next = hpet.next_deadline();

        // Assert
        assert_eq!(next, Some(VirtNanos(5_000 + (1u64 << 32) * 10)));
    }

    #[test]
    fn test_hpet_oneshot_64bit_fires_once() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        writeq(&mut hpet, TIMER0_CONFIG, TN_INT_ENABLE);
        writeq(&mut hpet, TIMER0_COMPARATOR, 100);

        // Act
        hpet.advance_to(VirtNanos(2_000));

        // Assert
        assert_eq!(hpet.take_irq_edges(), 1);
        assert_eq!(hpet.next_deadline(), None);
    }

    #[test]
    fn test_hpet_comparator_behind_counter_waits_for_wrap() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        linux_set_oneshot(&mut hpet, TIMER0_CONFIG);
        hpet.advance_to(VirtNanos(10_000));

        // Act
        writel(&mut hpet, TIMER0_COMPARATOR, 500);

        // Assert
        let wrap_nanos = (1u64 << 32) * 10;
        assert_eq!(hpet.next_deadline(), Some(VirtNanos(wrap_nanos + 5_000)));
    }

    #[test]
    fn test_hpet_periodic_linux_programming_fires_every_period() {
        // Arrange: hpet_clkevt_set_state_periodic() with a 1 ms period.
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        hpet.advance_to(VirtNanos(3_000));
        let period_ticks: u32 = 100_000;
        let config = readl(&mut hpet, 0x010);
        writel(&mut hpet, 0x010, config & !1);
        let now = readl(&mut hpet, 0x0f0);
        let timer_config = readl(&mut hpet, TIMER0_CONFIG) as u64
            | TN_INT_ENABLE
            | TN_PERIODIC
            | TN_VAL_SET
            | TN_32BIT;
        writel(&mut hpet, TIMER0_CONFIG, timer_config as u32);
        writel(&mut hpet, TIMER0_COMPARATOR, now + period_ticks);
        writel(&mut hpet, TIMER0_COMPARATOR, period_ticks);
        writel(&mut hpet, 0x010, config | 1);

        // Act
        let first_deadline = hpet.next_deadline();
        hpet.advance_to(VirtNanos(3_000 + 1_000_000));
        let first_edges = hpet.take_irq_edges();
        let second_deadline = hpet.next_deadline();

        // Assert
        assert_eq!(now, 300);
        assert_eq!(first_deadline, Some(VirtNanos(3_000 + 1_000_000)));
        assert_eq!(first_edges, 1);
        assert_eq!(second_deadline, Some(VirtNanos(3_000 + 2_000_000)));
        assert_eq!(readl(&mut hpet, TIMER0_COMPARATOR), 300 + 2 * period_ticks);
        assert_eq!(readl(&mut hpet, TIMER0_CONFIG) as u64 & TN_VAL_SET, 0);
    }

    #[test]
    fn test_hpet_periodic_missed_periods_fire_once_and_keep_phase() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        writeq(
            &mut hpet,
            TIMER0_CONFIG,
            TN_INT_ENABLE | TN_PERIODIC | TN_VAL_SET,
        );
        writeq(&mut hpet, TIMER0_COMPARATOR, 1_000);
        writeq(&mut hpet, TIMER0_COMPARATOR, 1_000);

        // Act: 3.5 periods elapse in one advance.
        hpet.advance_to(VirtNanos(35_000));
        let edges = hpet.take_irq_edges();

        // Assert
        assert_eq!(edges, 1);
        assert_eq!(hpet.next_deadline(), Some(VirtNanos(40_000)));
        assert_eq!(readq(&mut hpet, TIMER0_COMPARATOR), 4_000);
    }

    #[test]
    fn test_hpet_timer1_routes_to_irq8_in_legacy_mode() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        linux_set_oneshot(&mut hpet, TIMER1_CONFIG);
        writel(&mut hpet, TIMER1_COMPARATOR, 10);

        // Act
        hpet.advance_to(VirtNanos(100));

        // Assert
        assert_eq!(hpet.take_irq_edges(), 1 << 8);
    }

    #[test]
    fn test_hpet_without_legacy_routing_raises_no_edge() {
        // Arrange
        let mut hpet = Hpet::new();
        writel(&mut hpet, 0x010, 0x1);
        writeq(&mut hpet, TIMER0_CONFIG, TN_INT_ENABLE);
        writeq(&mut hpet, TIMER0_COMPARATOR, 10);

        // Act
        hpet.advance_to(VirtNanos(100));

        // Assert
        assert_eq!(hpet.take_irq_edges(), 0);
    }

    #[test]
    fn test_hpet_interrupt_disabled_timer_has_no_deadline() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);

        // Act
        writeq(&mut hpet, TIMER0_CONFIG, TN_32BIT);
        writel(&mut hpet, TIMER0_COMPARATOR, 10);

        // Assert
        assert_eq!(hpet.next_deadline(), None);
    }

    #[test]
    fn test_hpet_level_mode_sets_status_and_edges_once_until_cleared() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        writeq(
            &mut hpet,
            TIMER0_CONFIG,
            TN_INT_ENABLE | TN_PERIODIC | TN_LEVEL | TN_VAL_SET,
        );
        writeq(&mut hpet, TIMER0_COMPARATOR, 10);
        writeq(&mut hpet, TIMER0_COMPARATOR, 10);

        // Act
        hpet.advance_to(VirtNanos(100));
        let first = hpet.take_irq_edges();
        hpet.advance_to(VirtNanos(200));
        let while_asserted = hpet.take_irq_edges();
        let status = readl(&mut hpet, 0x020);
        writel(&mut hpet, 0x020, 1);
        hpet.advance_to(VirtNanos(300));
        let after_clear = hpet.take_irq_edges();

        // Assert
        assert_eq!(first, 1);
        assert_eq!(while_asserted, 0);
        assert_eq!(status, 1);
        assert_eq!(after_clear, 1);
    }

    #[test]
    fn test_hpet_32bit_mode_truncates_comparator_and_ignores_high_half() {
        // Arrange
        let mut hpet = Hpet::new();
        writeq(&mut hpet, TIMER0_COMPARATOR, 0x1234_5678_9abc_def0);

        // Act
        writel(&mut hpet, TIMER0_CONFIG, TN_32BIT as u32);
        writel(&mut hpet, TIMER0_COMPARATOR + 4, 0xffff_ffff);

        // Assert
        assert_eq!(readq(&mut hpet, TIMER0_COMPARATOR), 0x9abc_def0);
    }

    #[test]
    fn test_hpet_odd_sizes_and_offsets_are_ignored() {
        // Arrange
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        let before = hpet.save();
        let mut byte = [0xaau8; 1];
        let mut misaligned = [0xaau8; 8];

        // Act
        hpet.read(0x010, &mut byte);
        hpet.read(0x004, &mut misaligned);
        hpet.write(0x010, &[0]);
        hpet.write(0x012, &[0; 4]);
        hpet.write(0x3fc, &[0xff; 4]);
        hpet.write(u64::MAX - 3, &[0xff; 4]);
        hpet.write(0x010, &[]);

        // Assert
        assert_eq!(byte, [0]);
        assert_eq!(misaligned, [0; 8]);
        assert_eq!(hpet.save(), before);
    }

    #[test]
    fn test_hpet_restore_rejects_wrong_timer_count() {
        // Arrange
        let mut hpet = Hpet::new();
        let mut state = hpet.save();
        state.timers.pop();

        // Act
        let result = hpet.restore(&state);

        // Assert
        assert_eq!(
            result,
            Err(RestoreError::HpetTimerCount {
                len: 2,
                expected: 3
            })
        );
    }

    /// Enabled as Linux does, timer 0 one-shot and armed.
    fn armed_hpet() -> Hpet {
        let mut hpet = Hpet::new();
        linux_enable(&mut hpet);
        linux_set_oneshot(&mut hpet, TIMER0_CONFIG);
        hpet.advance_to(VirtNanos(777));
        linux_set_next_event(&mut hpet, 1_000);
        hpet
    }

    crate::persist::persist_round_trip_tests! {
        mod hpet_persist {
            fresh: Hpet::new(),
            saved: armed_hpet(),
            mutate: |hpet: &mut Hpet| {
                hpet.advance_to(VirtNanos(1_000_000));
                writel(hpet, 0x010, 0);
            },
        }
    }

    #[test]
    fn test_hpet_restored_timer_fires_when_saved() {
        // Arrange
        let saved = armed_hpet().save();
        let mut hpet = Hpet::new();

        // Act
        hpet.restore(&saved).unwrap();

        // Assert
        assert_eq!(hpet.next_deadline(), Some(VirtNanos(770 + 10_000)));
    }
}
