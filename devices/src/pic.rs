//! A pair of cascaded Intel 8259A programmable interrupt controllers, wired as
//! on a PC/AT: the slave's INTR output drives the master's IR2, plus the
//! PIIX-style edge/level control registers (ELCR) at 0x4d0/0x4d1.
//!
//! This is the guest's only interrupt controller (no LAPIC, no IOAPIC): every
//! device interrupt enters through [`Pic::set_irq_level`] or [`Pic::pulse_irq`],
//! and the VMM injects what [`Pic::acknowledge`] returns.
//!
//! Modelled: the ICW1-ICW4 initialization sequence, OCW1 (mask), OCW2
//! (non-specific and specific EOI), OCW3 (IRR/ISR read select, poll command,
//! special mask mode), edge detection per line and level mode per ELCR,
//! fixed priority (IR0 highest), auto-EOI, special fully nested mode on the
//! master, and spurious IRQ7/IRQ15 vectors.
//!
//! Not modelled (Linux's i8259 driver never uses them): priority rotation and
//! the set-priority command (the EOI half of the rotate-on-EOI commands is
//! still performed), ICW1's LTIM bit (the PIIX ignores it too: trigger mode
//! comes from the ELCR only), buffered mode and 8080 mode.

use crate::persist::{Persist, RestoreError};
use serde::{Deserialize, Serialize};

/// The master input the slave's INTR output is wired to.
const CASCADE_LINE: u8 = 2;
/// The lowest priority input, whose vector is also the spurious vector.
const SPURIOUS_LINE: u8 = 7;
/// Lines whose trigger mode the ELCR may switch to level (PIIX): IRQ0-2 and
/// IRQ8/IRQ13 are hard-wired edge, as on real chipsets.
const MASTER_ELCR_WRITABLE: u8 = 0xf8;
const SLAVE_ELCR_WRITABLE: u8 = 0xde;

const ICW1_SELECT: u8 = 0x10;
const ICW1_SINGLE: u8 = 0x02;
const ICW1_NEEDS_ICW4: u8 = 0x01;
const OCW3_SELECT: u8 = 0x08;
const OCW3_POLL: u8 = 0x04;
const OCW3_READ_REGISTER: u8 = 0x02;
const OCW3_READ_ISR: u8 = 0x01;
const OCW3_SPECIAL_MASK_CHANGE: u8 = 0x40;
const OCW3_SPECIAL_MASK_SET: u8 = 0x20;
const ICW4_AUTO_EOI: u8 = 0x02;
const ICW4_SPECIAL_FULLY_NESTED: u8 = 0x10;

/// Which initialization command word the chip expects on its data port next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum InitStep {
    /// Not initializing: data-port writes are OCW1 (the interrupt mask).
    Ready,
    ExpectIcw2,
    ExpectIcw3,
    ExpectIcw4,
}

/// The register file of one 8259A. It is its own saved state: every field is
/// plain data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chip8259 {
    /// Whether this is the master (special fully nested mode only applies there).
    pub is_master: bool,
    /// Current level of each input pin, used to detect rising edges.
    pub line_levels: u8,
    /// Interrupt request register.
    pub irr: u8,
    /// In-service register.
    pub isr: u8,
    /// Interrupt mask register (OCW1).
    pub imr: u8,
    /// Vector of IR0 (ICW2, low three bits cleared).
    pub vector_base: u8,
    pub init_step: InitStep,
    /// Set once a complete ICW sequence has been received: before that the
    /// vector base is meaningless.
    pub initialized: bool,
    pub single_mode: bool,
    pub needs_icw4: bool,
    /// ICW3: slave inputs (master) or slave identity (slave).
    pub cascade_config: u8,
    pub auto_eoi: bool,
    pub special_fully_nested: bool,
    /// OCW3 read-register select: command-port reads return ISR if set, IRR otherwise.
    pub read_isr: bool,
    /// OCW3 poll command: the next read is a poll (an acknowledge by software).
    pub poll_pending: bool,
    pub special_mask: bool,
    /// Edge/level control: a set bit makes that input level-triggered.
    pub elcr: u8,
}

fn highest_priority(bits: u8) -> Option<u8> {
    // Fixed priority: IR0 is the highest, IR7 the lowest.
    (bits != 0).then(|| bits.trailing_zeros() as u8)
}

impl Chip8259 {
    /// Power-on state. The mask starts all-ones, as firmware would leave it,
    /// so that nothing is delivered with a garbage vector base before the guest
    /// programs the chip.
    fn power_on(is_master: bool) -> Self {
        Chip8259 {
            is_master,
            line_levels: 0,
            irr: 0,
            isr: 0,
            imr: 0xff,
            vector_base: 0,
            init_step: InitStep::Ready,
            initialized: false,
            single_mode: false,
            needs_icw4: false,
            cascade_config: 0,
            auto_eoi: false,
            special_fully_nested: false,
            read_isr: false,
            poll_pending: false,
            special_mask: false,
            elcr: 0,
        }
    }

    fn elcr_writable(&self) -> u8 {
        if self.is_master {
            MASTER_ELCR_WRITABLE
        } else {
            SLAVE_ELCR_WRITABLE
        }
    }

    fn set_line(&mut self, line: u8, high: bool) {
        let bit = 1u8 << line;
        if self.elcr & bit != 0 {
            // Level mode: the request follows the pin.
            if high {
                self.irr |= bit;
            } else {
                self.irr &= !bit;
            }
        } else if high && self.line_levels & bit == 0 {
            // Edge mode: latch on a rising edge only; lowering the pin does
            // not withdraw a latched request.
            self.irr |= bit;
        }
        if high {
            self.line_levels |= bit;
        } else {
            self.line_levels &= !bit;
        }
    }

    /// The input that would be delivered now: the highest-priority unmasked
    /// request that has a higher priority than everything in service.
    fn pending_line(&self) -> Option<u8> {
        let request = highest_priority(self.irr & !self.imr)?;
        let mut in_service = self.isr;
        if self.special_mask {
            // Special mask mode: a masked in-service level does not block others.
            in_service &= !self.imr;
        }
        if self.special_fully_nested && self.is_master {
            // The slave may interrupt its own in-service request.
            in_service &= !(1 << CASCADE_LINE);
        }
        match highest_priority(in_service) {
            Some(serving) if serving <= request => None,
            _ => Some(request),
        }
    }

    /// The INTA cycle for `line`: the request moves from IRR to ISR.
    fn acknowledge_line(&mut self, line: u8) {
        let bit = 1u8 << line;
        if !self.auto_eoi {
            self.isr |= bit;
        }
        // A level-triggered request stays in IRR while its pin is high.
        if self.elcr & bit == 0 {
            self.irr &= !bit;
        }
    }

    fn poll(&mut self) -> u8 {
        self.poll_pending = false;
        match self.pending_line() {
            Some(line) => {
                self.acknowledge_line(line);
                0x80 | line
            }
            None => 0,
        }
    }

    fn write_command(&mut self, value: u8) {
        if value & ICW1_SELECT != 0 {
            // ICW1 starts initialization: clears the mask and in-service
            // register, resets edge detection and the read select. Requests
            // of level-triggered lines whose pin is still high survive.
            self.irr = self.line_levels & self.elcr;
            self.isr = 0;
            self.imr = 0;
            self.read_isr = false;
            self.poll_pending = false;
            self.special_mask = false;
            self.auto_eoi = false;
            self.special_fully_nested = false;
            self.single_mode = value & ICW1_SINGLE != 0;
            self.needs_icw4 = value & ICW1_NEEDS_ICW4 != 0;
            self.init_step = InitStep::ExpectIcw2;
        } else if value & OCW3_SELECT != 0 {
            if value & OCW3_POLL != 0 {
                self.poll_pending = true;
            }
            if value & OCW3_READ_REGISTER != 0 {
                self.read_isr = value & OCW3_READ_ISR != 0;
            }
            if value & OCW3_SPECIAL_MASK_CHANGE != 0 {
                self.special_mask = value & OCW3_SPECIAL_MASK_SET != 0;
            }
        } else {
            // OCW2: bits 7-5 are R, SL, EOI.
            match value >> 5 {
                // Non-specific EOI, and rotate on non-specific EOI (rotation not modelled).
                0b001 | 0b101 => {
                    if let Some(line) = highest_priority(self.isr) {
                        self.isr &= !(1 << line);
                    }
                }
                // Specific EOI, and rotate on specific EOI (rotation not modelled).
                0b011 | 0b111 => self.isr &= !(1 << (value & 7)),
                // Rotate-in-AEOI set/clear, set priority, no-op: fixed priority only.
                _ => {}
            }
        }
    }

    fn write_data(&mut self, value: u8) {
        match self.init_step {
            InitStep::Ready => self.imr = value,
            InitStep::ExpectIcw2 => {
                self.vector_base = value & 0xf8;
                if !self.single_mode {
                    self.init_step = InitStep::ExpectIcw3;
                } else {
                    self.finish_icw3();
                }
            }
            InitStep::ExpectIcw3 => {
                self.cascade_config = value;
                self.finish_icw3();
            }
            InitStep::ExpectIcw4 => {
                self.auto_eoi = value & ICW4_AUTO_EOI != 0;
                self.special_fully_nested = value & ICW4_SPECIAL_FULLY_NESTED != 0;
                self.finish_init();
            }
        }
    }

    fn finish_icw3(&mut self) {
        if self.needs_icw4 {
            self.init_step = InitStep::ExpectIcw4;
        } else {
            self.finish_init();
        }
    }

    fn finish_init(&mut self) {
        self.init_step = InitStep::Ready;
        self.initialized = true;
    }

    fn read_command(&mut self) -> u8 {
        if self.poll_pending {
            self.poll()
        } else if self.read_isr {
            self.isr
        } else {
            self.irr
        }
    }

    fn read_data(&mut self) -> u8 {
        if self.poll_pending {
            self.poll()
        } else {
            self.imr
        }
    }

    fn write_elcr(&mut self, value: u8) {
        let old = self.elcr;
        self.elcr = value & self.elcr_writable();
        // Lines that just became level-triggered request exactly while high.
        let now_level = self.elcr & !old;
        self.irr = (self.irr & !now_level) | (self.line_levels & now_level);
    }
}

/// Which of the PIC pair's port blocks an access is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PicPorts {
    /// 0x20/0x21.
    Master,
    /// 0xa0/0xa1.
    Slave,
    /// 0x4d0 (master lines) / 0x4d1 (slave lines).
    Elcr,
}

/// Saved state of the PIC pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PicState {
    pub master: Chip8259,
    pub slave: Chip8259,
}

/// The cascaded PIC pair. Lines 0-7 are the master's, 8-15 the slave's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pic {
    master: Chip8259,
    slave: Chip8259,
}

impl Default for Pic {
    fn default() -> Self {
        Self::new()
    }
}

impl Pic {
    pub fn new() -> Self {
        Pic {
            master: Chip8259::power_on(true),
            slave: Chip8259::power_on(false),
        }
    }

    /// Drives ISA interrupt line `line` (0-15). Line 2 is the cascade input
    /// on the master, so, as on a PC/AT bus, a device on IRQ2 is routed to
    /// IRQ9. Lines above 15 do not exist and are ignored.
    pub fn set_irq_level(&mut self, line: u8, high: bool) {
        match line {
            CASCADE_LINE => self.slave.set_line(1, high),
            0..=7 => self.master.set_line(line, high),
            8..=15 => self.slave.set_line(line - 8, high),
            _ => {}
        }
        self.update_cascade();
    }

    /// One edge on `line`: raise then lower. An edge-triggered input latches
    /// it; a level-triggered one (ELCR) sees it come and go.
    pub fn pulse_irq(&mut self, line: u8) {
        self.set_irq_level(line, true);
        self.set_irq_level(line, false);
    }

    /// The master's INTR output: an interrupt is waiting for an INTA cycle.
    /// Always false until the guest has programmed the master's vector base.
    pub fn has_pending_interrupt(&self) -> bool {
        self.vectors_programmed() && self.master.pending_line().is_some()
    }

    /// Performs the INTA cycle and returns the vector to inject. With nothing
    /// deliverable it returns the spurious vector (IRQ7 of the master, or
    /// IRQ15 if the master chose the cascade line but the slave has nothing),
    /// as the hardware does. Returns `None` only while the master's vector
    /// base is not programmed (before or in the middle of its ICW sequence).
    pub fn acknowledge(&mut self) -> Option<u8> {
        if !self.vectors_programmed() {
            return None;
        }
        let vector = match self.master.pending_line() {
            None => self.master.vector_base | SPURIOUS_LINE,
            Some(line) => {
                self.master.acknowledge_line(line);
                if line == CASCADE_LINE {
                    // The INTA cycle drops the slave's INT output; if the
                    // slave still has a request (always possible in auto-EOI
                    // mode, which sets no in-service bit), `update_cascade`
                    // raises it again: a new edge on the master's IR2.
                    // Without the drop the pin would stay high and the
                    // master would never latch the next request.
                    self.master.set_line(CASCADE_LINE, false);
                    match self.slave.pending_line() {
                        Some(slave_line) => {
                            self.slave.acknowledge_line(slave_line);
                            self.slave.vector_base | slave_line
                        }
                        None => self.slave.vector_base | SPURIOUS_LINE,
                    }
                } else {
                    self.master.vector_base | line
                }
            }
        };
        self.update_cascade();
        Some(vector)
    }

    fn vectors_programmed(&self) -> bool {
        self.master.initialized && self.master.init_step == InitStep::Ready
    }

    /// Propagates the slave's INTR output to the master's IR2 pin.
    fn update_cascade(&mut self) {
        let slave_output = self.slave.pending_line().is_some();
        self.master.set_line(CASCADE_LINE, slave_output);
    }

    /// Reads one block's registers; each byte of a wide access is a separate
    /// 8-bit bus cycle, as on ISA.
    pub fn read(&mut self, ports: PicPorts, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = self.read_byte(ports, offset.saturating_add(i as u64));
        }
        self.update_cascade();
    }

    pub fn write(&mut self, ports: PicPorts, offset: u64, data: &[u8]) {
        for (i, &byte) in data.iter().enumerate() {
            self.write_byte(ports, offset.saturating_add(i as u64), byte);
        }
        self.update_cascade();
    }

    fn read_byte(&mut self, ports: PicPorts, offset: u64) -> u8 {
        match (ports, offset) {
            (PicPorts::Master, 0) => self.master.read_command(),
            (PicPorts::Master, 1) => self.master.read_data(),
            (PicPorts::Slave, 0) => self.slave.read_command(),
            (PicPorts::Slave, 1) => self.slave.read_data(),
            (PicPorts::Elcr, 0) => self.master.elcr,
            (PicPorts::Elcr, 1) => self.slave.elcr,
            _ => 0xff,
        }
    }

    fn write_byte(&mut self, ports: PicPorts, offset: u64, value: u8) {
        match (ports, offset) {
            (PicPorts::Master, 0) => self.master.write_command(value),
            (PicPorts::Master, 1) => self.master.write_data(value),
            (PicPorts::Slave, 0) => self.slave.write_command(value),
            (PicPorts::Slave, 1) => self.slave.write_data(value),
            (PicPorts::Elcr, 0) => self.master.write_elcr(value),
            (PicPorts::Elcr, 1) => self.slave.write_elcr(value),
            _ => {}
        }
    }
}

fn role(is_master: bool) -> &'static str {
    if is_master {
        "master"
    } else {
        "slave"
    }
}

impl Persist for Pic {
    type State = PicState;

    fn save(&self) -> PicState {
        PicState {
            master: self.master.clone(),
            slave: self.slave.clone(),
        }
    }

    /// Each chip's state must be for its own role (master or slave).
    fn validate(&self, state: &PicState) -> Result<(), RestoreError> {
        for (chip, expected) in [(&state.master, true), (&state.slave, false)] {
            if chip.is_master != expected {
                return Err(RestoreError::PicRole {
                    found: role(chip.is_master),
                    expected: role(expected),
                });
            }
        }
        Ok(())
    }

    fn restore(&mut self, state: &PicState) -> Result<(), RestoreError> {
        self.validate(state)?;
        self.master = state.master.clone();
        self.slave = state.slave.clone();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASTER_VECTOR_BASE: u8 = 0x30;
    const SLAVE_VECTOR_BASE: u8 = 0x38;

    fn out(pic: &mut Pic, port: u16, value: u8) {
        let (ports, offset) = match port {
            0x20 | 0x21 => (PicPorts::Master, port - 0x20),
            0xa0 | 0xa1 => (PicPorts::Slave, port - 0xa0),
            0x4d0 | 0x4d1 => (PicPorts::Elcr, port - 0x4d0),
            _ => panic!("not a PIC port: {port:#x}"),
        };
        pic.write(ports, offset as u64, &[value]);
    }

    fn inb(pic: &mut Pic, port: u16) -> u8 {
        let (ports, offset) = match port {
            0x20 | 0x21 => (PicPorts::Master, port - 0x20),
            0xa0 | 0xa1 => (PicPorts::Slave, port - 0xa0),
            0x4d0 | 0x4d1 => (PicPorts::Elcr, port - 0x4d0),
            _ => panic!("not a PIC port: {port:#x}"),
        };
        let mut data = [0u8];
        pic.read(ports, offset as u64, &mut data);
        data[0]
    }

    /// The sequence of arch/x86/kernel/i8259.c: init_8259A(auto_eoi = 0),
    /// then the cached masks (everything masked except the cascade).
    fn linux_init(pic: &mut Pic) {
        out(pic, 0x21, 0xff);
        out(pic, 0xa1, 0xff);
        out(pic, 0x20, 0x11); // ICW1: edge, cascade, ICW4 needed
        out(pic, 0x21, MASTER_VECTOR_BASE); // ICW2
        out(pic, 0x21, 1 << 2); // ICW3: slave on IR2
        out(pic, 0x21, 0x01); // ICW4: 8086 mode, normal EOI
        out(pic, 0xa0, 0x11);
        out(pic, 0xa1, SLAVE_VECTOR_BASE);
        out(pic, 0xa1, 2); // ICW3: slave identity 2
        out(pic, 0xa1, 0x01);
        out(pic, 0xa1, 0xff);
        out(pic, 0x21, 0xfb);
    }

    fn unmask(pic: &mut Pic, master_mask: u8, slave_mask: u8) {
        out(pic, 0x21, master_mask);
        out(pic, 0xa1, slave_mask);
    }

    #[test]
    fn test_pic_linux_probe_reads_back_mask_before_init() {
        // Arrange
        let mut pic = Pic::new();

        // Act: probe_8259A()
        out(&mut pic, 0xa1, 0xff);
        out(&mut pic, 0x21, 0xfb);
        let readback = inb(&mut pic, 0x21);

        // Assert
        assert_eq!(readback, 0xfb);
    }

    #[test]
    fn test_pic_linux_init_sequence_programs_vectors_and_masks() {
        // Arrange
        let mut pic = Pic::new();

        // Act
        linux_init(&mut pic);

        // Assert
        let state = pic.save();
        assert_eq!(state.master.vector_base, MASTER_VECTOR_BASE);
        assert_eq!(state.slave.vector_base, SLAVE_VECTOR_BASE);
        assert_eq!(state.master.cascade_config, 0x04);
        assert_eq!(state.slave.cascade_config, 0x02);
        assert_eq!(state.master.init_step, InitStep::Ready);
        assert!(state.master.initialized && state.slave.initialized);
        assert!(!state.master.auto_eoi);
        assert_eq!(inb(&mut pic, 0x21), 0xfb);
        assert_eq!(inb(&mut pic, 0xa1), 0xff);
        assert!(!pic.has_pending_interrupt());
    }

    #[test]
    fn test_pic_before_init_acknowledge_returns_none() {
        // Arrange
        let mut pic = Pic::new();
        out(&mut pic, 0x21, 0x00);

        // Act
        pic.pulse_irq(0);

        // Assert
        assert!(!pic.has_pending_interrupt());
        assert_eq!(pic.acknowledge(), None);
    }

    #[test]
    fn test_pic_edge_irq0_delivers_vector_and_sets_isr() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xfa, 0xff);

        // Act
        pic.pulse_irq(0);
        let pending = pic.has_pending_interrupt();
        let vector = pic.acknowledge();

        // Assert
        assert!(pending);
        assert_eq!(vector, Some(MASTER_VECTOR_BASE));
        assert_eq!(pic.save().master.isr, 0x01);
        assert_eq!(pic.save().master.irr & 0x01, 0);
        assert!(!pic.has_pending_interrupt());
    }

    #[test]
    fn test_pic_masked_line_is_latched_but_not_delivered_until_unmasked() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);

        // Act
        pic.pulse_irq(4);
        let pending_while_masked = pic.has_pending_interrupt();
        unmask(&mut pic, 0xeb, 0xff);

        // Assert
        assert!(!pending_while_masked);
        assert!(pic.has_pending_interrupt());
        assert_eq!(pic.acknowledge(), Some(MASTER_VECTOR_BASE + 4));
    }

    #[test]
    fn test_pic_irq0_has_priority_over_irq4() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xea, 0xff);
        pic.pulse_irq(4);
        pic.pulse_irq(0);

        // Act
        let first = pic.acknowledge();
        let blocked_while_irq0_in_service = pic.has_pending_interrupt();
        out(&mut pic, 0x20, 0x60); // specific EOI for IR0
        let second = pic.acknowledge();

        // Assert
        assert_eq!(first, Some(MASTER_VECTOR_BASE));
        assert!(!blocked_while_irq0_in_service);
        assert_eq!(second, Some(MASTER_VECTOR_BASE + 4));
    }

    #[test]
    fn test_pic_higher_priority_irq0_preempts_in_service_irq4() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xea, 0xff);
        pic.pulse_irq(4);
        assert_eq!(pic.acknowledge(), Some(MASTER_VECTOR_BASE + 4));

        // Act
        pic.pulse_irq(0);

        // Assert
        assert!(pic.has_pending_interrupt());
        assert_eq!(pic.acknowledge(), Some(MASTER_VECTOR_BASE));
        assert_eq!(pic.save().master.isr, 0x11);
    }

    #[test]
    fn test_pic_non_specific_eoi_clears_highest_in_service() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xea, 0xff);
        pic.pulse_irq(4);
        pic.acknowledge();
        pic.pulse_irq(0);
        pic.acknowledge();

        // Act
        out(&mut pic, 0x20, 0x20);

        // Assert
        assert_eq!(pic.save().master.isr, 0x10);
    }

    #[test]
    fn test_pic_irq8_cascades_through_irq2() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xfb, 0xfe);

        // Act
        pic.pulse_irq(8);
        let pending = pic.has_pending_interrupt();
        let vector = pic.acknowledge();

        // Assert
        assert!(pending);
        assert_eq!(vector, Some(SLAVE_VECTOR_BASE));
        assert_eq!(pic.save().master.isr, 1 << 2);
        assert_eq!(pic.save().slave.isr, 0x01);
        assert!(!pic.has_pending_interrupt());
    }

    #[test]
    fn test_pic_slave_eoi_then_master_eoi_allows_next_slave_irq() {
        // Arrange: mask_and_ack_8259A for an IRQ >= 8 sends a specific EOI to
        // the slave, then one for IR2 to the master.
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xfb, 0xfe);
        pic.pulse_irq(8);
        pic.acknowledge();
        pic.pulse_irq(8);

        // Act
        out(&mut pic, 0xa0, 0x60);
        let pending_before_master_eoi = pic.has_pending_interrupt();
        out(&mut pic, 0x20, 0x62);

        // Assert
        assert!(!pending_before_master_eoi);
        assert!(pic.has_pending_interrupt());
        assert_eq!(pic.acknowledge(), Some(SLAVE_VECTOR_BASE));
    }

    /// What the detvisor guest kernel does with the clock page
    /// (init_8259A(auto_eoi = 1) with the slave in auto-EOI mode too).
    fn linux_init_auto_eoi(pic: &mut Pic) {
        out(pic, 0x21, 0xff);
        out(pic, 0xa1, 0xff);
        out(pic, 0x20, 0x11);
        out(pic, 0x21, MASTER_VECTOR_BASE);
        out(pic, 0x21, 1 << 2);
        out(pic, 0x21, 0x03); // ICW4: 8086 mode, auto EOI
        out(pic, 0xa0, 0x11);
        out(pic, 0xa1, SLAVE_VECTOR_BASE);
        out(pic, 0xa1, 2);
        out(pic, 0xa1, 0x03);
    }

    #[test]
    fn test_pic_auto_eoi_slave_delivers_every_request_without_eoi() {
        // Two slave lines held high at once (virtio lines are levels that
        // stay up until the guest acknowledges its device): in auto-EOI mode
        // nothing is in service, so the slave's output stays high across the
        // first INTA; the master must still see a new edge on IR2 for the
        // second request, or it is never delivered.
        let mut pic = Pic::new();
        linux_init_auto_eoi(&mut pic);
        unmask(&mut pic, 0xfa, 0x00);
        pic.set_irq_level(10, true);
        pic.set_irq_level(11, true);

        assert_eq!(pic.acknowledge(), Some(SLAVE_VECTOR_BASE + 2));
        assert!(pic.has_pending_interrupt(), "IRQ 11 must stay deliverable");
        assert_eq!(pic.acknowledge(), Some(SLAVE_VECTOR_BASE + 3));
        assert!(!pic.has_pending_interrupt());

        // A line that goes low and high again (the next device event) is
        // delivered again, with no EOI ever written.
        pic.set_irq_level(10, false);
        pic.set_irq_level(10, true);
        assert_eq!(pic.acknowledge(), Some(SLAVE_VECTOR_BASE + 2));
        // And the master's own lines, with the timer's edges.
        pic.pulse_irq(0);
        pic.pulse_irq(0);
        assert_eq!(pic.acknowledge(), Some(MASTER_VECTOR_BASE));
        pic.pulse_irq(0);
        assert_eq!(pic.acknowledge(), Some(MASTER_VECTOR_BASE));
        assert!(!pic.has_pending_interrupt());
    }

    #[test]
    fn test_pic_acknowledge_with_nothing_pending_returns_spurious_irq7() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);

        // Act
        let vector = pic.acknowledge();

        // Assert
        assert_eq!(vector, Some(MASTER_VECTOR_BASE + 7));
        assert_eq!(pic.save().master.isr, 0);
    }

    #[test]
    fn test_pic_cascade_without_slave_request_returns_spurious_irq15() {
        // Arrange: a request on master IR2 that the slave withdrew (its line
        // went low in level mode) before the INTA cycle.
        let mut pic = Pic::new();
        linux_init(&mut pic);
        out(&mut pic, 0x4d1, 0x02); // IRQ9 level-triggered
        unmask(&mut pic, 0xfb, 0xfd);
        pic.set_irq_level(9, true);
        pic.set_irq_level(9, false);

        // Act
        let vector = pic.acknowledge();

        // Assert
        assert_eq!(vector, Some(SLAVE_VECTOR_BASE + 7));
    }

    #[test]
    fn test_pic_level_triggered_line_redelivers_after_eoi_while_high() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        out(&mut pic, 0x4d1, 0x02);
        unmask(&mut pic, 0xfb, 0xfd);
        pic.set_irq_level(9, true);
        assert_eq!(pic.acknowledge(), Some(SLAVE_VECTOR_BASE + 1));

        // Act
        out(&mut pic, 0xa0, 0x61);
        out(&mut pic, 0x20, 0x62);

        // Assert
        assert!(pic.has_pending_interrupt());
        assert_eq!(pic.acknowledge(), Some(SLAVE_VECTOR_BASE + 1));
    }

    #[test]
    fn test_pic_elcr_ignores_hardwired_edge_lines() {
        // Arrange
        let mut pic = Pic::new();

        // Act
        out(&mut pic, 0x4d0, 0xff);
        out(&mut pic, 0x4d1, 0xff);

        // Assert
        assert_eq!(inb(&mut pic, 0x4d0), 0xf8);
        assert_eq!(inb(&mut pic, 0x4d1), 0xde);
    }

    #[test]
    fn test_pic_edge_line_held_high_latches_only_once() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xfa, 0xff);
        pic.set_irq_level(0, true);
        pic.acknowledge();
        out(&mut pic, 0x20, 0x20);

        // Act
        pic.set_irq_level(0, true);

        // Assert
        assert!(!pic.has_pending_interrupt());
    }

    #[test]
    fn test_pic_ocw3_selects_irr_or_isr_for_reads() {
        // Arrange: i8259A_irq_real() reads ISR with OCW3 0x0b, then selects IRR with 0x0a.
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xea, 0xff);
        pic.pulse_irq(0);
        pic.acknowledge();
        pic.pulse_irq(4);

        // Act
        out(&mut pic, 0x20, 0x0b);
        let isr = inb(&mut pic, 0x20);
        out(&mut pic, 0x20, 0x0a);
        let irr = inb(&mut pic, 0x20);

        // Assert
        assert_eq!(isr, 0x01);
        assert_eq!(irr, 0x10);
    }

    #[test]
    fn test_pic_auto_eoi_leaves_isr_clear() {
        // Arrange
        let mut pic = Pic::new();
        out(&mut pic, 0x20, 0x11);
        out(&mut pic, 0x21, MASTER_VECTOR_BASE);
        out(&mut pic, 0x21, 0x04);
        out(&mut pic, 0x21, 0x03); // ICW4: AEOI
        out(&mut pic, 0x21, 0xfe);

        // Act
        pic.pulse_irq(0);
        let vector = pic.acknowledge();

        // Assert
        assert_eq!(vector, Some(MASTER_VECTOR_BASE));
        assert_eq!(pic.save().master.isr, 0);
    }

    #[test]
    fn test_pic_poll_command_acknowledges_highest_request() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xea, 0xff);
        pic.pulse_irq(4);

        // Act
        out(&mut pic, 0x20, 0x0c);
        let polled = inb(&mut pic, 0x20);
        out(&mut pic, 0x20, 0x0c);
        let polled_again = inb(&mut pic, 0x20);

        // Assert
        assert_eq!(polled, 0x84);
        assert_eq!(polled_again, 0x00);
        assert_eq!(pic.save().master.isr, 0x10);
        assert_eq!(inb(&mut pic, 0x21), 0xea);
    }

    #[test]
    fn test_pic_icw1_clears_latched_edge_requests() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        pic.pulse_irq(4);

        // Act
        linux_init(&mut pic);

        // Assert
        assert_eq!(pic.save().master.irr, 0);
    }

    #[test]
    fn test_pic_irq2_is_routed_to_irq9() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xfb, 0xfd);

        // Act
        pic.pulse_irq(2);

        // Assert
        assert_eq!(pic.acknowledge(), Some(SLAVE_VECTOR_BASE + 1));
    }

    #[test]
    fn test_pic_out_of_range_lines_and_offsets_are_ignored() {
        // Arrange
        let mut pic = Pic::new();
        linux_init(&mut pic);
        let before = pic.save();
        let mut wide = [0u8; 8];

        // Act
        pic.set_irq_level(16, true);
        pic.pulse_irq(255);
        pic.read(PicPorts::Elcr, 7, &mut wide);
        pic.write(PicPorts::Master, 5, &[0xff; 8]);

        // Assert
        assert_eq!(pic.save(), before);
        assert_eq!(wide, [0xff; 8]);
    }

    /// Initialized as Linux does, with lines unmasked, one interrupt in
    /// service and one requested.
    fn used_pic() -> Pic {
        let mut pic = Pic::new();
        linux_init(&mut pic);
        unmask(&mut pic, 0xea, 0xfe);
        pic.pulse_irq(4);
        pic.pulse_irq(8);
        pic.acknowledge();
        pic
    }

    crate::persist::persist_round_trip_tests! {
        mod pic_persist {
            fresh: Pic::new(),
            saved: used_pic(),
            mutate: |pic: &mut Pic| {
                pic.pulse_irq(0);
                out(pic, 0x21, 0x00);
            },
        }
    }

    #[test]
    fn test_pic_restore_rejects_chips_in_each_others_place() {
        // Arrange
        let mut pic = used_pic();
        let before = pic.save();
        let mut swapped = before.clone();
        std::mem::swap(&mut swapped.master, &mut swapped.slave);

        // Act
        let result = pic.restore(&swapped);

        // Assert
        assert_eq!(
            result,
            Err(RestoreError::PicRole {
                found: "slave",
                expected: "master"
            })
        );
        assert_eq!(pic.save(), before);
    }
}
