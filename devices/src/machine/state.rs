//! The saved state of the whole machine: every device, the machine's own
//! time and pending events, the virtio slots and the switch.

use super::slots::VirtioDevices;
use super::{Devices, VirtioDeviceState};
use crate::acpi_pm::AcpiPmState;
use crate::hpet::HpetState;
use crate::persist::{Persist, RestoreError};
use crate::pic::PicState;
use crate::rtc::RtcState;
use crate::serial::SerialState;
use crate::status::{GuestEvent, I8042State, StatusPortState};
use crate::switch::{Switch, SwitchState};
use crate::time::VirtNanos;
use serde::{Deserialize, Serialize};

/// Saved state of every device and of the aggregate itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicesState {
    pub now: VirtNanos,
    pub pic: PicState,
    pub hpet: HpetState,
    pub rtc: RtcState,
    pub acpi_pm: AcpiPmState,
    pub serial: SerialState,
    pub status_port: StatusPortState,
    pub i8042: I8042State,
    /// Guest events not yet taken by the VMM, oldest first.
    pub pending_events: Vec<GuestEvent>,
    pub unhandled_accesses: u64,
    /// Virtio devices in slot order; absent in states saved without them.
    #[serde(default)]
    pub virtio: Vec<VirtioDeviceState>,
    /// The network switch, with the frames in flight; absent in states
    /// saved without one.
    #[serde(default)]
    pub switch: Option<SwitchState>,
    /// Whether the machine has the clock page (its contents are guest memory).
    #[serde(default)]
    pub clock_page: bool,
}

/// Every device, the machine's own state (time, events not yet taken, the
/// count of unhandled accesses) and the switch. The console writer is kept.
impl Persist for Devices {
    type State = DevicesState;

    fn save(&self) -> DevicesState {
        DevicesState {
            now: self.now,
            pic: self.pic.save(),
            hpet: self.hpet.save(),
            rtc: self.rtc.save(),
            acpi_pm: self.acpi_pm.save(),
            serial: self.serial.save(),
            status_port: self.status_port.save(),
            i8042: self.i8042.save(),
            pending_events: self.pending_events.iter().copied().collect(),
            unhandled_accesses: self.unhandled_accesses,
            virtio: self
                .virtio
                .as_ref()
                .map_or_else(Vec::new, VirtioDevices::save),
            switch: self.switch.as_ref().map(Switch::save),
            clock_page: self.clock_page.is_some(),
        }
    }

    fn validate(&self, state: &DevicesState) -> Result<(), RestoreError> {
        self.pic.validate(&state.pic)?;
        self.hpet.validate(&state.hpet)?;
        self.rtc.validate(&state.rtc)?;
        self.acpi_pm.validate(&state.acpi_pm)?;
        self.serial.validate(&state.serial)?;
        self.status_port.validate(&state.status_port)?;
        self.i8042.validate(&state.i8042)?;
        if state.clock_page != self.clock_page.is_some() {
            return Err(RestoreError::ClockPage {
                saved: state.clock_page,
                machine: self.clock_page.is_some(),
            });
        }
        match &self.virtio {
            Some(virtio) => virtio.validate(&state.virtio)?,
            None if state.virtio.is_empty() => {}
            None => {
                return Err(RestoreError::VirtioDeviceCount {
                    len: state.virtio.len(),
                    expected: 0,
                })
            }
        }
        Self::validate_switch(state)
    }

    /// Restores every device. The state is checked first, so on error
    /// nothing has changed.
    fn restore(&mut self, state: &DevicesState) -> Result<(), RestoreError> {
        self.validate(state)?;
        self.now = state.now;
        self.pic.restore(&state.pic)?;
        self.hpet.restore(&state.hpet)?;
        self.rtc.restore(&state.rtc)?;
        self.acpi_pm.restore(&state.acpi_pm)?;
        self.serial.restore(&state.serial)?;
        self.status_port.restore(&state.status_port)?;
        self.i8042.restore(&state.i8042)?;
        self.pending_events = state.pending_events.iter().copied().collect();
        self.unhandled_accesses = state.unhandled_accesses;
        if let Some(virtio) = &mut self.virtio {
            virtio.restore(&state.virtio)?;
        }
        // The switch holds no host resource: the state describes all of it,
        // so a state without one leaves the machine without one.
        self.switch = state.switch.as_ref().map(Switch::from_state);
        if let (Some(switch), Some(_)) = (&mut self.switch, &self.frame_tap) {
            switch.record_frames(true);
        }
        Ok(())
    }
}
