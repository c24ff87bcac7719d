//! COM1: a 16550A UART (vm-superio's `Serial`) whose output goes to a writer
//! the VMM provides.
//!
//! vm-superio signals interrupts through a [`Trigger`]; here the trigger is
//! an [`IrqLatch`] that only records that an interrupt happened and calls
//! nothing. The owner drains it with [`SerialPort::take_interrupt`] after
//! every access and turns it into one IRQ4 edge on the PIC, so the
//! interrupt path stays a plain, single-threaded state machine.
//!
//! Console input is queued in [`SerialPort::enqueue_input`]; whatever does
//! not fit in the UART's 64-byte receive FIFO waits in a pending queue and
//! moves into the FIFO as the guest drains it (after each guest read), so
//! input is never dropped and arrives at guest-determined points.
//!
//! The host writer's errors are ignored: the guest cannot observe them (the
//! UART model reports the transmitter empty either way), and letting them
//! change guest-visible behaviour would make runs depend on the host.

use crate::bus::BusDevice;
use crate::persist::{Persist, RestoreError};
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::Write;
use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};

/// Capacity of vm-superio's receive FIFO.
pub const UART_FIFO_SIZE: usize = 64;
/// Number of UART registers (ports COM1..COM1+7).
const UART_REGISTER_COUNT: u64 = 8;
/// Offset of the receive buffer register.
const RBR_OFFSET: u8 = 0;

/// The serial port's interrupt output as a latch: `trigger` only records.
#[derive(Debug, Default)]
pub struct IrqLatch {
    raised: Cell<bool>,
}

impl IrqLatch {
    /// Returns whether an interrupt was triggered since the last call, and clears the latch.
    pub fn take(&self) -> bool {
        self.raised.replace(false)
    }
}

impl Trigger for IrqLatch {
    type E = Infallible;

    fn trigger(&self) -> Result<(), Infallible> {
        self.raised.set(true);
        Ok(())
    }
}

/// The writer console output goes to.
pub type ConsoleWriter = Box<dyn Write + Send>;
type Uart = Serial<IrqLatch, NoEvents, ConsoleWriter>;

/// Saved state of the serial port: vm-superio's `SerialState`, field by
/// field, plus the input not yet in the FIFO.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialState {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    /// The receive FIFO (at most [`UART_FIFO_SIZE`] bytes).
    pub in_buffer: Vec<u8>,
    /// Console input waiting for room in the FIFO.
    pub pending_input: Vec<u8>,
}

impl SerialState {
    fn to_vm_superio(&self) -> vm_superio::serial::SerialState {
        vm_superio::serial::SerialState {
            baud_divisor_low: self.baud_divisor_low,
            baud_divisor_high: self.baud_divisor_high,
            interrupt_enable: self.interrupt_enable,
            interrupt_identification: self.interrupt_identification,
            line_control: self.line_control,
            line_status: self.line_status,
            modem_control: self.modem_control,
            modem_status: self.modem_status,
            scratch: self.scratch,
            in_buffer: self.in_buffer.clone(),
        }
    }
}

pub struct SerialPort {
    uart: Uart,
    pending_input: VecDeque<u8>,
}

impl SerialPort {
    pub fn new(console_out: ConsoleWriter) -> Self {
        SerialPort {
            uart: Serial::new(IrqLatch::default(), console_out),
            pending_input: VecDeque::new(),
        }
    }

    /// Queues console input for the guest. Bytes enter the receive FIFO as
    /// room allows (raising the received-data interrupt if enabled).
    pub fn enqueue_input(&mut self, bytes: &[u8]) {
        self.pending_input.extend(bytes);
        self.refill_fifo();
    }

    fn refill_fifo(&mut self) {
        let room = self.uart.fifo_capacity();
        if room == 0 || self.pending_input.is_empty() {
            return;
        }
        let chunk: Vec<u8> = self.pending_input.iter().take(room).copied().collect();
        // Err is only `FullFifo`, excluded above; in loopback mode the UART
        // accepts nothing and the input keeps waiting.
        if let Ok(accepted) = self.uart.enqueue_raw_bytes(&chunk) {
            self.pending_input.drain(..accepted);
        }
    }

    /// Whether the UART raised its interrupt since the last call.
    pub fn take_interrupt(&mut self) -> bool {
        self.uart.interrupt_evt().take()
    }
}

impl Persist for SerialPort {
    type State = SerialState;

    fn save(&self) -> SerialState {
        let uart = self.uart.state();
        SerialState {
            baud_divisor_low: uart.baud_divisor_low,
            baud_divisor_high: uart.baud_divisor_high,
            interrupt_enable: uart.interrupt_enable,
            interrupt_identification: uart.interrupt_identification,
            line_control: uart.line_control,
            line_status: uart.line_status,
            modem_control: uart.modem_control,
            modem_status: uart.modem_status,
            scratch: uart.scratch,
            in_buffer: uart.in_buffer,
            pending_input: self.pending_input.iter().copied().collect(),
        }
    }

    fn validate(&self, state: &SerialState) -> Result<(), RestoreError> {
        if state.in_buffer.len() > UART_FIFO_SIZE {
            return Err(RestoreError::SerialFifoOverflow {
                len: state.in_buffer.len(),
                capacity: UART_FIFO_SIZE,
            });
        }
        Ok(())
    }

    /// Restores the registers and queues; the console writer stays. No
    /// interrupt is produced: the PIC's saved state already holds any edge.
    fn restore(&mut self, state: &SerialState) -> Result<(), RestoreError> {
        self.validate(state)?;
        let placeholder: ConsoleWriter = Box::new(std::io::sink());
        let previous = std::mem::replace(
            &mut self.uart,
            Serial::new(IrqLatch::default(), placeholder),
        );
        let console_out = previous.into_writer();
        match Serial::from_state(
            &state.to_vm_superio(),
            IrqLatch::default(),
            NoEvents,
            console_out,
        ) {
            Ok(uart) => self.uart = uart,
            // Unreachable after `validate` (the FIFO fits and the trigger is
            // infallible), but report rather than panic.
            Err(_) => {
                return Err(RestoreError::SerialFifoOverflow {
                    len: state.in_buffer.len(),
                    capacity: UART_FIFO_SIZE,
                })
            }
        }
        self.uart.interrupt_evt().take();
        self.pending_input = state.pending_input.iter().copied().collect();
        Ok(())
    }
}

/// Offsets 0-7 are the UART registers; each byte of a wider access is its
/// own 8-bit cycle. Bytes beyond the registers read as all ones.
impl BusDevice for SerialPort {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            let register = offset.saturating_add(i as u64);
            *byte = if register < UART_REGISTER_COUNT {
                self.uart.read(register as u8)
            } else {
                0xff
            };
            if register == u64::from(RBR_OFFSET) {
                self.refill_fifo();
            }
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, &byte) in data.iter().enumerate() {
            let register = offset.saturating_add(i as u64);
            if register < UART_REGISTER_COUNT {
                // Only host I/O errors are possible here; see the module docs.
                let _ = self.uart.write(register as u8, byte);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    const THR: u64 = 0;
    const IER: u64 = 1;
    const IIR: u64 = 2;
    const LCR: u64 = 3;
    const LSR: u64 = 5;
    const IER_RDA: u8 = 0x01;
    const IER_THRE: u8 = 0x02;

    /// A writer whose bytes the test can inspect after handing it away.
    #[derive(Clone, Default)]
    struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedBuffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    struct FailingWriter;

    impl Write for FailingWriter {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("host console gone"))
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::Error::other("host console gone"))
        }
    }

    fn read_byte(port: &mut SerialPort, offset: u64) -> u8 {
        let mut data = [0u8];
        port.read(offset, &mut data);
        data[0]
    }

    #[test]
    fn test_serial_output_bytes_reach_writer() {
        // Arrange
        let output = SharedBuffer::default();
        let mut port = SerialPort::new(Box::new(output.clone()));

        // Act
        for &byte in b"hello\n" {
            port.write(THR, &[byte]);
        }

        // Assert
        assert_eq!(output.0.lock().unwrap().as_slice(), b"hello\n");
    }

    #[test]
    fn test_serial_thre_interrupt_latches_when_enabled() {
        // Arrange
        let mut port = SerialPort::new(Box::new(std::io::sink()));
        port.write(IER, &[IER_THRE]);
        port.take_interrupt();
        read_byte(&mut port, IIR);

        // Act
        port.write(THR, b"x");
        let raised = port.take_interrupt();
        let raised_again = port.take_interrupt();

        // Assert
        assert!(raised);
        assert!(!raised_again);
    }

    #[test]
    fn test_serial_no_interrupt_when_disabled() {
        // Arrange
        let mut port = SerialPort::new(Box::new(std::io::sink()));

        // Act
        port.write(THR, b"x");
        port.enqueue_input(b"y");

        // Assert
        assert!(!port.take_interrupt());
    }

    #[test]
    fn test_serial_input_beyond_fifo_is_kept_and_delivered_in_order() {
        // Arrange
        let mut port = SerialPort::new(Box::new(std::io::sink()));
        port.write(IER, &[IER_RDA]);
        let input: Vec<u8> = (0..200u8).collect();

        // Act
        port.enqueue_input(&input);
        let interrupt = port.take_interrupt();
        let mut received = Vec::new();
        while read_byte(&mut port, LSR) & 0x01 != 0 {
            received.push(read_byte(&mut port, THR));
        }

        // Assert
        assert!(interrupt);
        assert_eq!(received, input);
        assert!(port.save().pending_input.is_empty());
    }

    #[test]
    fn test_serial_host_write_error_is_ignored() {
        // Arrange
        let mut port = SerialPort::new(Box::new(FailingWriter));
        port.write(IER, &[IER_THRE]);
        port.take_interrupt();
        read_byte(&mut port, IIR);

        // Act
        port.write(THR, b"x");

        // Assert
        assert!(port.take_interrupt(), "THRE is raised regardless");
    }

    #[test]
    fn test_serial_out_of_range_offsets_are_ignored() {
        // Arrange
        let mut port = SerialPort::new(Box::new(std::io::sink()));
        let before = port.save();
        let mut wide = [0u8; 4];

        // Act
        port.write(8, &[1, 2, 3]);
        port.write(u64::MAX, &[1, 2]);
        port.read(6, &mut wide);

        // Assert
        assert_eq!(wide[2..], [0xff, 0xff]);
        assert_eq!(port.save(), before);
    }

    #[test]
    fn test_serial_fifo_size_matches_vm_superio() {
        // Arrange
        let port = SerialPort::new(Box::new(std::io::sink()));

        // Act
        let capacity = port.uart.fifo_capacity();

        // Assert
        assert_eq!(capacity, UART_FIFO_SIZE);
    }

    #[test]
    fn test_serial_restore_keeps_writer_and_raises_nothing() {
        // Arrange
        let output = SharedBuffer::default();
        let mut port = SerialPort::new(Box::new(output.clone()));
        use_port(&mut port);
        let saved = port.save();
        change_port(&mut port);

        // Act
        port.restore(&saved).unwrap();
        let interrupt_after_restore = port.take_interrupt();
        port.write(THR, b"z");

        // Assert
        assert!(!interrupt_after_restore);
        assert_eq!(output.0.lock().unwrap().as_slice(), b"z");
    }

    #[test]
    fn test_serial_restore_rejects_oversized_fifo() {
        // Arrange
        let mut port = SerialPort::new(Box::new(std::io::sink()));
        let mut state = port.save();
        state.in_buffer = vec![0; UART_FIFO_SIZE + 1];

        // Act
        let result = port.restore(&state);

        // Assert
        assert_eq!(
            result,
            Err(RestoreError::SerialFifoOverflow {
                len: 65,
                capacity: 64
            })
        );
    }

    /// 115200 baud, interrupts enabled, the FIFO full and more input waiting.
    fn use_port(port: &mut SerialPort) {
        port.write(LCR, &[0x83]);
        port.write(THR, &[0x01]);
        port.write(LCR, &[0x03]);
        port.write(IER, &[IER_RDA | IER_THRE]);
        port.enqueue_input(&[7u8; 100]);
        port.take_interrupt();
    }

    fn used_port() -> SerialPort {
        let mut port = SerialPort::new(Box::new(std::io::sink()));
        use_port(&mut port);
        port
    }

    fn change_port(port: &mut SerialPort) {
        read_byte(port, THR);
        port.write(IER, &[0]);
    }

    crate::persist::persist_round_trip_tests! {
        mod serial_persist {
            fresh: SerialPort::new(Box::new(std::io::sink())),
            saved: used_port(),
            mutate: change_port,
        }
    }
}
