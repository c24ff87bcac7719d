//! The two buses (ports and MMIO) and what owns their addresses: an
//! access advances the devices to its time, is served by its owner, and
//! then fires what it made due (see `step`).

use super::device_id::DeviceId;
use super::slots::VirtioDevices;
use super::Devices;
use crate::acpi_pm::AcpiPmBlock;
use crate::bus::{Bus, BusDevice};
use crate::layout;
use crate::pic::PicPorts;
use crate::status::I8042Port;
use crate::time::VirtNanos;

/// Number of 16550 registers at COM1.
const COM1_LEN: u64 = 8;
/// Index and data ports.
const RTC_LEN: u64 = 2;
/// Command and data ports of each PIC; ELCR1 and ELCR2.
const PIC_LEN: u64 = 2;
const ELCR_LEN: u64 = 2;

pub(super) fn build_pio_bus() -> Bus<DeviceId> {
    let ranges = [
        (layout::PIC_MASTER_PORT, PIC_LEN, DeviceId::PicMaster),
        (layout::PIC_SLAVE_PORT, PIC_LEN, DeviceId::PicSlave),
        (layout::ELCR_PORT, ELCR_LEN, DeviceId::Elcr),
        (layout::COM1_PORT, COM1_LEN, DeviceId::Com1),
        (layout::RTC_PORT, RTC_LEN, DeviceId::Rtc),
        (layout::I8042_DATA_PORT, 1, DeviceId::I8042Data),
        (layout::I8042_COMMAND_PORT, 1, DeviceId::I8042Command),
        (layout::POST_PORT, 1, DeviceId::Post),
        (
            layout::ACPI_PM1A_EVT_PORT,
            u64::from(layout::ACPI_PM1A_EVT_LEN),
            DeviceId::AcpiPm1Event,
        ),
        (
            layout::ACPI_PM1A_CNT_PORT,
            u64::from(layout::ACPI_PM1A_CNT_LEN),
            DeviceId::AcpiPm1Control,
        ),
        (
            layout::ACPI_PM_TMR_PORT,
            u64::from(layout::ACPI_PM_TMR_LEN),
            DeviceId::AcpiPmTimer,
        ),
        (layout::STATUS_PORT, 1, DeviceId::Status),
        (layout::CLOCK_PAGE_EXIT_PORT, 1, DeviceId::ClockPageExit),
    ];
    let mut bus = Bus::new();
    for (port, len, id) in ranges {
        bus.insert(u64::from(port), len, id)
            .expect("the fixed port layout has overlapping ranges");
    }
    bus
}

pub(super) fn build_mmio_bus() -> Bus<DeviceId> {
    let mut bus = Bus::new();
    bus.insert(layout::HPET_BASE, layout::HPET_LEN, DeviceId::Hpet)
        .expect("the fixed MMIO layout has overlapping ranges");
    bus
}

impl Devices {
    /// A port read. Each byte of a wide access is decoded on its own (ISA
    /// devices are 8-bit); bytes of ports no device owns read 0xff.
    pub fn pio_read(&mut self, now: VirtNanos, port: u16, data: &mut [u8]) {
        self.advance_to(now);
        let mut any_unowned = false;
        for (i, byte) in data.iter_mut().enumerate() {
            let address = u64::from(port) + i as u64;
            // Port addresses are 16 bits: a wide access at 0xffff does not wrap.
            let owner = (address <= u64::from(u16::MAX))
                .then(|| self.pio_bus.resolve(address))
                .flatten();
            match owner {
                Some((id, offset)) => {
                    let mut one = [0u8];
                    self.dispatch_read(id, offset, &mut one);
                    *byte = one[0];
                }
                None => {
                    *byte = 0xff;
                    any_unowned = true;
                }
            }
        }
        if any_unowned {
            self.unhandled_accesses += 1;
        }
        self.after_access();
    }

    /// A port write; bytes for ports no device owns are dropped.
    pub fn pio_write(&mut self, now: VirtNanos, port: u16, data: &[u8]) {
        self.advance_to(now);
        let mut any_unowned = false;
        for (i, &byte) in data.iter().enumerate() {
            let address = u64::from(port) + i as u64;
            let owner = (address <= u64::from(u16::MAX))
                .then(|| self.pio_bus.resolve(address))
                .flatten();
            match owner {
                Some((id, offset)) => self.dispatch_write(id, offset, &[byte]),
                None => any_unowned = true,
            }
        }
        if any_unowned {
            self.unhandled_accesses += 1;
        }
        self.after_access();
    }

    /// An MMIO read; returns false (and reads all ones) if no device owns `addr`.
    pub fn mmio_read(&mut self, now: VirtNanos, addr: u64, data: &mut [u8]) -> bool {
        self.advance_to(now);
        let owned = match self.mmio_bus.resolve(addr) {
            Some((id, offset)) => {
                self.dispatch_read(id, offset, data);
                true
            }
            None => {
                data.fill(0xff);
                self.unhandled_accesses += 1;
                false
            }
        };
        self.after_access();
        owned
    }

    /// An MMIO write; returns false (and drops it) if no device owns `addr`.
    pub fn mmio_write(&mut self, now: VirtNanos, addr: u64, data: &[u8]) -> bool {
        self.advance_to(now);
        let owned = match self.mmio_bus.resolve(addr) {
            Some((id, offset)) => {
                self.dispatch_write(id, offset, data);
                true
            }
            None => {
                self.unhandled_accesses += 1;
                false
            }
        };
        self.after_access();
        owned
    }

    fn dispatch_read(&mut self, id: DeviceId, offset: u64, data: &mut [u8]) {
        match id {
            DeviceId::PicMaster => self.pic.read(PicPorts::Master, offset, data),
            DeviceId::PicSlave => self.pic.read(PicPorts::Slave, offset, data),
            DeviceId::Elcr => self.pic.read(PicPorts::Elcr, offset, data),
            DeviceId::Com1 => self.serial.read(offset, data),
            DeviceId::Rtc => self.rtc.read(offset, data),
            DeviceId::I8042Data => self.i8042.read(I8042Port::Data, offset, data),
            DeviceId::I8042Command => self.i8042.read(I8042Port::Command, offset, data),
            DeviceId::Post => self.post.read(offset, data),
            DeviceId::AcpiPm1Event => self.acpi_pm.read(AcpiPmBlock::Pm1Event, offset, data),
            DeviceId::AcpiPm1Control => self.acpi_pm.read(AcpiPmBlock::Pm1Control, offset, data),
            DeviceId::AcpiPmTimer => self.acpi_pm.read(AcpiPmBlock::Timer, offset, data),
            DeviceId::Status => self.status_port.read(offset, data),
            // The port only makes an exit (which refreshes the clock page).
            DeviceId::ClockPageExit => data.fill(0),
            DeviceId::Hpet => self.hpet.read(offset, data),
            DeviceId::Virtio(index) => {
                match self
                    .virtio
                    .as_mut()
                    .and_then(|virtio| virtio.slots.get_mut(index))
                {
                    Some(device) => device.device_mut().read(offset, data),
                    None => data.fill(0xff),
                }
            }
        }
    }

    fn dispatch_write(&mut self, id: DeviceId, offset: u64, data: &[u8]) {
        match id {
            DeviceId::PicMaster => self.pic.write(PicPorts::Master, offset, data),
            DeviceId::PicSlave => self.pic.write(PicPorts::Slave, offset, data),
            DeviceId::Elcr => self.pic.write(PicPorts::Elcr, offset, data),
            DeviceId::Com1 => self.serial.write(offset, data),
            DeviceId::Rtc => self.rtc.write(offset, data),
            DeviceId::I8042Data => self.i8042.write(I8042Port::Data, offset, data),
            DeviceId::I8042Command => self.i8042.write(I8042Port::Command, offset, data),
            DeviceId::Post => self.post.write(offset, data),
            DeviceId::AcpiPm1Event => self.acpi_pm.write(AcpiPmBlock::Pm1Event, offset, data),
            DeviceId::AcpiPm1Control => self.acpi_pm.write(AcpiPmBlock::Pm1Control, offset, data),
            DeviceId::AcpiPmTimer => self.acpi_pm.write(AcpiPmBlock::Timer, offset, data),
            DeviceId::Status => self.status_port.write(offset, data),
            DeviceId::ClockPageExit => {}
            DeviceId::Hpet => self.hpet.write(offset, data),
            DeviceId::Virtio(index) => {
                let now = self.now;
                if let Some(VirtioDevices { memory, slots }) = &mut self.virtio {
                    if let Some(device) = slots.get_mut(index) {
                        device.device_mut().write(offset, data, memory, now);
                    }
                }
            }
        }
    }
}
