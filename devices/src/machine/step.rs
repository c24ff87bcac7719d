//! Virtual time and interrupts: every device step advances the devices to
//! the machine's time, fires what is due (timers, frame deliveries, disk
//! faults and FLUSHes, the clock page's deadline) and forwards the
//! interrupts raised into the PIC; the next deadline is the earliest of
//! them all.

use super::Devices;
use crate::clock_page::ClockPage;
use crate::layout;
use crate::switch::Switch;
use crate::time::VirtNanos;
use crate::GuestMemory;

/// Number of ISA interrupt lines.
const ISA_IRQ_LINES: u8 = 16;

impl Devices {
    /// Gives the guest the clock page (`clock_page`) in `memory`: its
    /// clockevent deadline then counts among the device deadlines and
    /// raises IRQ 0. Call it before the first exit.
    pub fn attach_clock_page(&mut self, memory: GuestMemory) {
        self.clock_page = Some(ClockPage::new(memory));
    }

    /// The kernel command-line entry for the clock page, if attached.
    pub fn clock_page_cmdline(&self) -> Option<String> {
        self.clock_page
            .as_ref()
            .map(|_| ClockPage::cmdline_fragment())
    }

    /// Publishes the exit count and the time in the clock page, if any.
    /// Only at guest-caused exits (see `clock_page`).
    pub fn publish_clock_page(&self, exits: u64, now: VirtNanos) {
        if let Some(page) = &self.clock_page {
            page.publish(exits, now);
        }
    }

    /// How many clock-page deadlines have fired (a diagnostic).
    pub fn clock_page_deadlines_fired(&self) -> u64 {
        self.clock_page.as_ref().map_or(0, ClockPage::fired)
    }

    /// Fires what the access made due at the same instant, collects guest
    /// events and forwards interrupt edges.
    pub(super) fn after_access(&mut self) {
        self.advance_devices();
        self.pending_events.extend(
            self.status_port
                .take_event()
                .into_iter()
                .chain(self.i8042.take_event()),
        );
        self.forward_interrupts();
    }

    fn advance_devices(&mut self) {
        self.hpet.advance_to(self.now);
        self.rtc.advance_to(self.now);
        self.acpi_pm.advance_to(self.now);
        self.advance_network();
        self.advance_disks();
        // The page is read only here, inside a device step, i.e. at a
        // guest-caused exit.
        if let Some(page) = &mut self.clock_page {
            if page.take_due(self.now) {
                self.pic.pulse_irq(layout::IRQ_TIMER);
            }
        }
    }

    /// Turns every interrupt a device raised into an edge on its PIC line.
    /// The order is fixed, though it cannot matter: an edge only sets an IRR bit.
    pub(super) fn forward_interrupts(&mut self) {
        let hpet_edges = self.hpet.take_irq_edges();
        for line in 0..ISA_IRQ_LINES {
            if hpet_edges & (1 << line) != 0 {
                self.pic.pulse_irq(line);
            }
        }
        if self.rtc.take_irq_edge() && !self.hpet.legacy_replacement() {
            self.pic.pulse_irq(layout::IRQ_RTC);
        }
        if self.serial.take_interrupt() {
            self.pic.pulse_irq(layout::IRQ_COM1);
        }
        if let Some(virtio) = &self.virtio {
            for (index, device) in virtio.slots.iter().enumerate() {
                if let Some(irq) = layout::virtio_mmio_irq(index) {
                    let level = device.device().interrupt_pending();
                    self.pic.set_irq_level(irq, level);
                }
            }
        }
    }

    /// Advances every device to `now`, firing the timers due at or before it.
    pub fn advance_to(&mut self, now: VirtNanos) {
        self.now = self.now.max(now);
        self.advance_devices();
        self.forward_interrupts();
    }

    /// The earliest virtual time at which a device will raise an interrupt
    /// by itself (HPET timers; the RTC unless the HPET has disconnected it;
    /// the switch's next frame delivery; a disk's delayed FLUSH or scheduled
    /// fault).
    pub fn next_deadline(&self) -> Option<VirtNanos> {
        let rtc = if self.hpet.legacy_replacement() {
            None
        } else {
            self.rtc.next_deadline()
        };
        let network = self.switch.as_ref().and_then(Switch::next_deadline);
        let disks = self
            .disks()
            .filter_map(|transport| transport.device().next_deadline())
            .min();
        let clock_page = self.clock_page.as_ref().and_then(ClockPage::deadline);
        [self.hpet.next_deadline(), rtc, network, disks, clock_page]
            .into_iter()
            .flatten()
            .min()
    }
}
