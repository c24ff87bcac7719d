//! What owns each range of the two buses: the fixed devices by name, the
//! virtio slots by index. The buses map addresses to it (`access`) and a
//! slot registers its own (`slots`).

/// What owns a bus range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DeviceId {
    PicMaster,
    PicSlave,
    Elcr,
    Com1,
    Rtc,
    I8042Data,
    I8042Command,
    Post,
    AcpiPm1Event,
    AcpiPm1Control,
    AcpiPmTimer,
    Status,
    ClockPageExit,
    Hpet,
    /// A virtio-mmio slot, by index.
    Virtio(usize),
}
