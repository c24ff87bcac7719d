//! The names of the devices that own bus addresses, for people reading a
//! run's exits (`--trace`): `"hpet"`, `"pic-master"`, `"serial"`,
//! `"virtio-net@0xd0002000"`, ... Naming never touches a device's state.

use super::{DeviceId, Devices, VirtioSlot};
use std::borrow::Cow;

impl DeviceId {
    /// The name of a device with a fixed place (virtio slots are named by
    /// [`Devices`], which knows what sits in them).
    fn fixed_name(self) -> Option<&'static str> {
        Some(match self {
            DeviceId::PicMaster => "pic-master",
            DeviceId::PicSlave => "pic-slave",
            DeviceId::Elcr => "elcr",
            DeviceId::Com1 => "serial",
            DeviceId::Rtc => "rtc",
            DeviceId::I8042Data | DeviceId::I8042Command => "i8042",
            DeviceId::Post => "post",
            DeviceId::AcpiPm1Event => "acpi-pm1-event",
            DeviceId::AcpiPm1Control => "acpi-pm1-control",
            DeviceId::AcpiPmTimer => "acpi-pm-timer",
            DeviceId::Status => "status-port",
            DeviceId::ClockPageExit => "clock-page",
            DeviceId::Hpet => "hpet",
            DeviceId::Virtio(_) => return None,
        })
    }
}

impl Devices {
    /// The name of the device owning I/O port `port` (`None`: no device).
    /// A wide access belongs to the owner of its first port.
    pub fn port_owner(&self, port: u16) -> Option<Cow<'static, str>> {
        let (id, _) = self.pio_bus.resolve(u64::from(port))?;
        Some(self.name_of(id))
    }

    /// The name of the device owning guest-physical address `addr` (`None`:
    /// no device).
    pub fn mmio_owner(&self, addr: u64) -> Option<Cow<'static, str>> {
        let (id, _) = self.mmio_bus.resolve(addr)?;
        Some(self.name_of(id))
    }

    fn name_of(&self, id: DeviceId) -> Cow<'static, str> {
        if let Some(name) = id.fixed_name() {
            return Cow::Borrowed(name);
        }
        let DeviceId::Virtio(index) = id else {
            unreachable!("every device but the virtio slots has a fixed name")
        };
        let kind = self
            .virtio
            .as_ref()
            .and_then(|virtio| virtio.slots.get(index))
            .map_or("unknown", |device| device.device().kind());
        let base = VirtioSlot::new(index).map_or(0, |slot| slot.mmio_base);
        Cow::Owned(format!("virtio-{kind}@{base:#x}"))
    }
}

#[cfg(test)]
mod tests {
    use crate::layout;
    use crate::{Devices, DevicesConfig};

    fn devices() -> Devices {
        Devices::new(
            DevicesConfig {
                rtc_epoch_unix_secs: 0,
            },
            Box::new(std::io::sink()),
        )
    }

    #[test]
    fn test_fixed_devices_are_named_by_any_of_their_addresses() {
        let devices = devices();
        let port = |p: u16| devices.port_owner(p).map(|n| n.into_owned());
        assert_eq!(port(layout::COM1_PORT).as_deref(), Some("serial"));
        assert_eq!(port(layout::COM1_PORT + 5).as_deref(), Some("serial"));
        assert_eq!(port(layout::PIC_MASTER_PORT).as_deref(), Some("pic-master"));
        assert_eq!(
            port(layout::PIC_SLAVE_PORT + 1).as_deref(),
            Some("pic-slave")
        );
        assert_eq!(port(layout::RTC_PORT).as_deref(), Some("rtc"));
        assert_eq!(
            port(layout::ACPI_PM_TMR_PORT).as_deref(),
            Some("acpi-pm-timer")
        );
        assert_eq!(port(layout::STATUS_PORT).as_deref(), Some("status-port"));
        assert_eq!(
            port(layout::CLOCK_PAGE_EXIT_PORT).as_deref(),
            Some("clock-page")
        );
        assert_eq!(port(0x3e8), None, "COM3 is nobody's");
        assert_eq!(
            devices.mmio_owner(layout::HPET_BASE + 0xf0).as_deref(),
            Some("hpet")
        );
        assert_eq!(
            devices.mmio_owner(layout::HPET_BASE + layout::HPET_LEN),
            None
        );
    }

    #[test]
    fn test_virtio_devices_are_named_by_kind_and_slot_base() {
        let mut devices = devices();
        let memory = crate::virtio::testing::test_memory();
        devices.attach_guest_memory(memory);
        let rng = devices.attach_virtio_rng([7; 32]).unwrap();
        let nic = devices.attach_virtio_net([2, 0, 0, 0, 0, 1]).unwrap();
        assert_eq!(
            devices.mmio_owner(rng.mmio_base + 0x70).as_deref(),
            Some(format!("virtio-rng@{:#x}", rng.mmio_base).as_str())
        );
        assert_eq!(
            devices.mmio_owner(nic.mmio_base).as_deref(),
            Some(format!("virtio-net@{:#x}", nic.mmio_base).as_str())
        );
        assert_eq!(
            devices.mmio_owner(nic.mmio_base + layout::VIRTIO_MMIO_STRIDE),
            None,
            "the next slot is empty"
        );
    }
}
