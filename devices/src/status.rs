//! The small ports through which the guest ends a run or asks for a reset:
//! detvisor's status port, the i8042's CPU-reset command, and the POST port.

use crate::bus::BusDevice;
use crate::persist::{Persist, RestoreError};
use serde::{Deserialize, Serialize};

/// Something the guest asked of the machine, reported to the VMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GuestEvent {
    /// The guest wrote its exit status to the status port.
    Exit(u8),
    /// The guest pulsed the CPU reset line (i8042 command 0xFE).
    Reset,
}

/// i8042 command: pulse the CPU reset output.
const I8042_CMD_RESET_CPU: u8 = 0xfe;

/// detvisor's status port: one byte written is the guest's exit status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusPort {
    pending_event: Option<GuestEvent>,
}

/// Saved state of the status port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusPortState {
    pub pending_event: Option<GuestEvent>,
}

impl StatusPort {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn take_event(&mut self) -> Option<GuestEvent> {
        self.pending_event.take()
    }
}

impl Persist for StatusPort {
    type State = StatusPortState;

    fn save(&self) -> StatusPortState {
        StatusPortState {
            pending_event: self.pending_event,
        }
    }

    fn restore(&mut self, state: &StatusPortState) -> Result<(), RestoreError> {
        self.pending_event = state.pending_event;
        Ok(())
    }
}

impl BusDevice for StatusPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    /// The first byte at offset 0 is the status; the rest of a wider write is
    /// ignored. The first status written wins until the owner collects it.
    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (0, Some(&status)) = (offset, data.first()) {
            self.pending_event.get_or_insert(GuestEvent::Exit(status));
        }
    }
}

/// Which i8042 port an access is for (they are not adjacent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum I8042Port {
    /// 0x60.
    Data,
    /// 0x64: status on read, command on write.
    Command,
}

/// The i8042 keyboard controller, reduced to what the guest needs: it is
/// always idle (status 0: output buffer empty, input buffer empty, so
/// Linux's `kb_wait` ends at once), data reads 0, and command 0xFE resets
/// the machine. There is no keyboard or mouse behind it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct I8042 {
    pending_event: Option<GuestEvent>,
}

/// Saved state of the i8042.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct I8042State {
    pub pending_event: Option<GuestEvent>,
}

impl I8042 {
    pub fn new() -> Self {
        Self::default()
    }

    /// Each port is one byte: byte 0 of an access is the port, the rest of a
    /// wider access reads as all ones.
    pub fn read(&mut self, _port: I8042Port, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = if offset.saturating_add(i as u64) == 0 {
                0
            } else {
                0xff
            };
        }
    }

    pub fn write(&mut self, port: I8042Port, offset: u64, data: &[u8]) {
        if let (I8042Port::Command, 0, Some(&I8042_CMD_RESET_CPU)) = (port, offset, data.first()) {
            self.pending_event.get_or_insert(GuestEvent::Reset);
        }
    }

    pub fn take_event(&mut self) -> Option<GuestEvent> {
        self.pending_event.take()
    }
}

impl Persist for I8042 {
    type State = I8042State;

    fn save(&self) -> I8042State {
        I8042State {
            pending_event: self.pending_event,
        }
    }

    fn restore(&mut self, state: &I8042State) -> Result<(), RestoreError> {
        self.pending_event = state.pending_event;
        Ok(())
    }
}

/// Port 0x80, the POST-code/IO-delay port: writes are accepted and ignored,
/// reads see an undriven bus.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostPort;

impl BusDevice for PostPort {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&mut self, _offset: u64, _data: &[u8]) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_status_port_write_records_exit_status() {
        // Arrange
        let mut port = StatusPort::new();

        // Act
        port.write(0, &[42]);

        // Assert
        assert_eq!(port.take_event(), Some(GuestEvent::Exit(42)));
        assert_eq!(port.take_event(), None);
    }

    #[test]
    fn test_status_port_first_status_wins_until_collected() {
        // Arrange
        let mut port = StatusPort::new();

        // Act
        port.write(0, &[1, 2, 3, 4]);
        port.write(0, &[9]);

        // Assert
        assert_eq!(port.take_event(), Some(GuestEvent::Exit(1)));
    }

    #[test]
    fn test_status_port_ignores_empty_and_offset_writes() {
        // Arrange
        let mut port = StatusPort::new();

        // Act
        port.write(0, &[]);
        port.write(1, &[5]);

        // Assert
        assert_eq!(port.take_event(), None);
    }

    #[test]
    fn test_i8042_reset_command_records_reset() {
        // Arrange
        let mut i8042 = I8042::new();

        // Act
        i8042.write(I8042Port::Command, 0, &[0xfe]);

        // Assert
        assert_eq!(i8042.take_event(), Some(GuestEvent::Reset));
    }

    #[test]
    fn test_i8042_other_writes_do_nothing() {
        // Arrange
        let mut i8042 = I8042::new();

        // Act
        i8042.write(I8042Port::Data, 0, &[0xfe]);
        i8042.write(I8042Port::Command, 0, &[0x20]);

        // Assert
        assert_eq!(i8042.take_event(), None);
    }

    #[test]
    fn test_i8042_reads_are_idle() {
        // Arrange
        let mut i8042 = I8042::new();
        let mut status = [0xaau8];
        let mut data = [0xaau8; 2];

        // Act
        i8042.read(I8042Port::Command, 0, &mut status);
        i8042.read(I8042Port::Data, 0, &mut data);

        // Assert
        assert_eq!(status, [0]);
        assert_eq!(data, [0, 0xff]);
    }

    #[test]
    fn test_post_port_accepts_writes() {
        // Arrange
        let mut post = PostPort;
        let mut data = [0u8];

        // Act
        post.write(0, &[0x55]);
        post.read(0, &mut data);

        // Assert
        assert_eq!(data, [0xff]);
    }

    fn exited_port() -> StatusPort {
        let mut port = StatusPort::new();
        port.write(0, &[3]);
        port
    }

    fn resetting_i8042() -> I8042 {
        let mut i8042 = I8042::new();
        i8042.write(I8042Port::Command, 0, &[0xfe]);
        i8042
    }

    crate::persist::persist_round_trip_tests! {
        mod status_port_persist {
            fresh: StatusPort::new(),
            saved: exited_port(),
            mutate: |port: &mut StatusPort| {
                port.take_event();
            },
        }
    }

    crate::persist::persist_round_trip_tests! {
        mod i8042_persist {
            fresh: I8042::new(),
            saved: resetting_i8042(),
            mutate: |i8042: &mut I8042| {
                i8042.take_event();
            },
        }
    }
}
