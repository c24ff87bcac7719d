//! virtio-console (device ID 3, spec 5.3) with a single port and no
//! device-specific features (no MULTIPORT, SIZE or EMERG_WRITE; the
//! transport offers VERSION_1 and EVENT_IDX): the VMM's control channel
//! to the guest agent, which sees it as /dev/hvc0.
//!
//! It moves whole buffers per exit, not bytes: a transmit buffer of any
//! size is taken in the one QueueNotify write that announces it, and input
//! fills as much of each receive buffer as is pending.
//!
//! * transmitq (queue 1): the guest's bytes are appended to an outbound
//!   buffer the VMM drains with [`VirtioConsole::take_output`]. Buffers are
//!   always consumed at once, never held back: Linux's console driver spins,
//!   interrupts off, until its buffer is used, so holding one back would
//!   hang the guest with no exit to resume it. Output beyond
//!   [`OUTPUT_LIMIT`] undrained bytes is dropped and counted instead.
//! * receiveq (queue 0): [`VirtioConsole::enqueue_input`] queues bytes; they
//!   enter the guest's receive buffers at deterministic points only: when
//!   the guest notifies receiveq (it has posted buffers), when it sets
//!   DRIVER_OK, or when the VMM calls `deliver` on the transport. With
//!   EVENT_IDX the guest notifies receiveq only after the device used every
//!   buffer posted (input was waiting for more), so the VMM must call
//!   `deliver` whenever it enqueues input, as `Devices` does.
//!
//! A device reset drops neither pending input nor undrained output: both
//! belong to the VMM, not to the driver.

use super::mmio::VirtioMmioTransport;
use super::{QueueFault, VirtioDevice, Virtqueue};
use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use crate::GuestMemory;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use virtio_bindings::virtio_ids::VIRTIO_ID_CONSOLE;

/// Queue indexes of port 0.
pub const RECEIVEQ: usize = 0;
pub const TRANSMITQ: usize = 1;
pub const CONSOLE_QUEUE_SIZE: u16 = 128;
/// Undrained output the device keeps; more is dropped (and counted).
pub const OUTPUT_LIMIT: usize = 16 << 20;
const QUEUE_MAX_SIZES: [u16; 2] = [CONSOLE_QUEUE_SIZE, CONSOLE_QUEUE_SIZE];

/// Saved state of the console's buffers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioConsoleState {
    /// Input not yet delivered into the guest's receive buffers.
    pub pending_input: Vec<u8>,
    /// Output the VMM has not taken yet.
    pub output: Vec<u8>,
    /// Output bytes dropped because [`OUTPUT_LIMIT`] was reached.
    pub dropped_output_bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct VirtioConsole {
    pending_input: VecDeque<u8>,
    output: Vec<u8>,
    dropped_output_bytes: u64,
}

impl VirtioConsole {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues bytes for the guest; they are delivered at the next
    /// deterministic point (see the module documentation).
    pub fn enqueue_input(&mut self, bytes: &[u8]) {
        self.pending_input.extend(bytes);
    }

    /// Bytes queued but not yet in a guest buffer.
    pub fn pending_input_len(&self) -> usize {
        self.pending_input.len()
    }

    /// Everything the guest transmitted since the last call.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    pub fn dropped_output_bytes(&self) -> u64 {
        self.dropped_output_bytes
    }

    fn deliver_input(
        &mut self,
        queue: &mut Virtqueue,
        mem: &GuestMemory,
    ) -> Result<(), QueueFault> {
        while !self.pending_input.is_empty() {
            let Some(chain) = queue.pop(mem)? else {
                break;
            };
            chain.require_device_writable()?;
            let take = (chain.writable_len() as usize).min(self.pending_input.len());
            let bytes: Vec<u8> = self.pending_input.iter().take(take).copied().collect();
            let written = chain.write_writable(mem, &bytes)?;
            self.pending_input.drain(..written as usize);
            queue.add_used(mem, chain.head_index(), written)?;
        }
        Ok(())
    }

    fn collect_output(
        &mut self,
        queue: &mut Virtqueue,
        mem: &GuestMemory,
    ) -> Result<(), QueueFault> {
        while let Some(chain) = queue.pop(mem)? {
            chain.require_device_readable()?;
            let room = OUTPUT_LIMIT.saturating_sub(self.output.len());
            let bytes = chain.read_readable(mem, room)?;
            let dropped = u64::from(chain.readable_len()) - bytes.len() as u64;
            self.dropped_output_bytes = self.dropped_output_bytes.saturating_add(dropped);
            self.output.extend_from_slice(&bytes);
            // The device wrote nothing into a transmit buffer.
            queue.add_used(mem, chain.head_index(), 0)?;
        }
        Ok(())
    }
}

impl Persist for VirtioConsole {
    type State = VirtioConsoleState;

    fn save(&self) -> VirtioConsoleState {
        VirtioConsoleState {
            pending_input: self.pending_input.iter().copied().collect(),
            output: self.output.clone(),
            dropped_output_bytes: self.dropped_output_bytes,
        }
    }

    fn restore(&mut self, state: &VirtioConsoleState) -> Result<(), RestoreError> {
        self.pending_input = state.pending_input.iter().copied().collect();
        self.output = state.output.clone();
        self.dropped_output_bytes = state.dropped_output_bytes;
        Ok(())
    }
}

impl VirtioDevice for VirtioConsole {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_CONSOLE
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &QUEUE_MAX_SIZES
    }

    /// struct virtio_console_config (cols, rows, max_nr_ports, emerg_wr):
    /// none of its fields is in use without features, so it reads as zeros.
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn process_queue(
        &mut self,
        queue_index: usize,
        queue: &mut Virtqueue,
        mem: &GuestMemory,
        _now: VirtNanos,
    ) -> Result<(), QueueFault> {
        match queue_index {
            RECEIVEQ => self.deliver_input(queue, mem),
            TRANSMITQ => self.collect_output(queue, mem),
            _ => Ok(()),
        }
    }
}

impl VirtioMmioTransport<VirtioConsole> {
    /// Delivers pending input into the receive buffers the guest has posted,
    /// raising the used-buffer interrupt if any were filled. Call only at
    /// deterministic points.
    pub fn deliver(&mut self, mem: &GuestMemory, now: VirtNanos) {
        self.process_queue(RECEIVEQ, mem, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::mmio::{INTERRUPT_USED_BUFFER, STATUS_NEEDS_RESET};
    use crate::virtio::testing::*;
    use crate::virtio::VirtioViolation;

    struct LiveConsole {
        device: DirectTransport<VirtioConsole>,
        receiveq: DriverQueue,
        transmitq: DriverQueue,
    }

    fn live_console() -> LiveConsole {
        let mut device = DirectTransport::new(VirtioConsole::new());
        let receiveq = DriverQueue::new(QUEUE0_BASE, CONSOLE_QUEUE_SIZE);
        let transmitq = DriverQueue::new(QUEUE1_BASE, CONSOLE_QUEUE_SIZE);
        initialize(&mut device, &[&receiveq, &transmitq]);
        LiveConsole {
            device,
            receiveq,
            transmitq,
        }
    }

    impl LiveConsole {
        fn transmit(&mut self, buffers: &[(u64, &[u8])]) -> u16 {
            let chain: Vec<Buffer> = buffers
                .iter()
                .map(|&(address, bytes)| {
                    write_bytes(&self.device.mem, address, bytes);
                    readable(address, bytes.len() as u32)
                })
                .collect();
            let head = self.transmitq.add_chain(&self.device.mem, &chain);
            self.device.write32(REG_QUEUE_NOTIFY, TRANSMITQ as u32);
            head
        }

        fn post_receive_buffer(&mut self, address: u64, len: u32) -> u16 {
            self.receiveq
                .add_chain(&self.device.mem, &[writable(address, len)])
        }
    }

    #[test]
    fn test_console_identifies_as_console_with_two_queues() {
        // Arrange
        let mut device = DirectTransport::new(VirtioConsole::new());

        // Act
        let device_id = device.read32(REG_DEVICE_ID);
        let sizes: Vec<u32> = (0..3)
            .map(|queue| {
                device.write32(REG_QUEUE_SEL, queue);
                device.read32(REG_QUEUE_NUM_MAX)
            })
            .collect();

        // Assert
        assert_eq!(device_id, 3);
        assert_eq!(sizes, [128, 128, 0]);
    }

    #[test]
    fn test_console_transmit_takes_whole_message_in_one_notify() {
        // Arrange
        let mut console = live_console();

        // Act
        let head = console.transmit(&[
            (DATA_BASE, b"{\"op\":"),
            (DATA_BASE + 0x100, b"\"ping\"}\n"),
        ]);

        // Assert
        assert_eq!(
            console.device.transport.device_mut().take_output(),
            b"{\"op\":\"ping\"}\n"
        );
        assert_eq!(
            console.transmitq.take_used(&console.device.mem),
            [(u32::from(head), 0)]
        );
        assert_eq!(
            console.device.read32(REG_INTERRUPT_STATUS),
            INTERRUPT_USED_BUFFER
        );
        assert!(console
            .device
            .transport
            .device_mut()
            .take_output()
            .is_empty());
    }

    #[test]
    fn test_console_deliver_fills_posted_receive_buffers_in_order() {
        // Arrange
        let mut console = live_console();
        let first = console.post_receive_buffer(DATA_BASE, 8);
        let second = console.post_receive_buffer(DATA_BASE + 0x100, 8);
        console.device.write32(REG_QUEUE_NOTIFY, RECEIVEQ as u32);
        console
            .device
            .transport
            .device_mut()
            .enqueue_input(b"hello, guest");

        // Act
        let mem = console.device.mem.clone();
        console.device.transport.deliver(&mem, VirtNanos(5));

        // Assert
        assert_eq!(
            console.receiveq.take_used(&mem),
            [(u32::from(first), 8), (u32::from(second), 4)]
        );
        assert_eq!(read_bytes(&mem, DATA_BASE, 8), b"hello, g");
        assert_eq!(read_bytes(&mem, DATA_BASE + 0x100, 4), b"uest");
        assert_eq!(console.device.transport.device().pending_input_len(), 0);
        assert_eq!(
            console.device.read32(REG_INTERRUPT_STATUS),
            INTERRUPT_USED_BUFFER
        );
    }

    #[test]
    fn test_console_input_waits_for_buffers_then_arrives_on_notify() {
        // Arrange
        let mut console = live_console();
        console
            .device
            .transport
            .device_mut()
            .enqueue_input(b"0123456789");
        let mem = console.device.mem.clone();
        console.device.transport.deliver(&mem, VirtNanos(5));
        let used_without_buffers = console.receiveq.used_idx(&mem);

        // Act
        console.post_receive_buffer(DATA_BASE, 6);
        console.device.write32(REG_QUEUE_NOTIFY, RECEIVEQ as u32);
        let pending_after_one_buffer = console.device.transport.device().pending_input_len();
        console.post_receive_buffer(DATA_BASE + 0x100, 64);
        console.device.write32(REG_QUEUE_NOTIFY, RECEIVEQ as u32);

        // Assert
        assert_eq!(used_without_buffers, 0);
        assert_eq!(pending_after_one_buffer, 4);
        assert_eq!(console.receiveq.take_used(&mem), [(0, 6), (1, 4)]);
        assert_eq!(read_bytes(&mem, DATA_BASE + 0x100, 4), b"6789");
    }

    #[test]
    fn test_console_input_posted_before_driver_ok_arrives_at_driver_ok() {
        // Arrange
        let mut device = DirectTransport::new(VirtioConsole::new());
        let mut receiveq = DriverQueue::new(QUEUE0_BASE, CONSOLE_QUEUE_SIZE);
        let transmitq = DriverQueue::new(QUEUE1_BASE, CONSOLE_QUEUE_SIZE);
        negotiate(&mut device);
        setup_queue(&mut device, 0, &receiveq);
        setup_queue(&mut device, 1, &transmitq);
        receiveq.add_chain(&device.mem, &[writable(DATA_BASE, 16)]);
        device.write32(REG_QUEUE_NOTIFY, RECEIVEQ as u32);
        device.transport.device_mut().enqueue_input(b"early");
        let used_before = receiveq.used_idx(&device.mem);

        // Act
        device.write32(REG_STATUS, STATUS_LIVE);

        // Assert
        assert_eq!(used_before, 0);
        assert_eq!(receiveq.take_used(&device.mem), [(0, 5)]);
        assert_eq!(read_bytes(&device.mem, DATA_BASE, 5), b"early");
    }

    #[test]
    fn test_console_output_beyond_limit_is_dropped_and_counted() {
        // Arrange: 17 descriptors all reading the same 1 MiB of memory.
        let mut console = live_console();
        let aliased: Vec<Buffer> = (0..17).map(|_| readable(0, MEMORY_SIZE as u32)).collect();
        console.transmitq.add_chain(&console.device.mem, &aliased);

        // Act
        console.device.write32(REG_QUEUE_NOTIFY, TRANSMITQ as u32);
        let output = console.device.transport.device_mut().take_output();

        // Assert
        assert_eq!(output.len(), OUTPUT_LIMIT);
        assert_eq!(
            console.device.transport.device().dropped_output_bytes(),
            17 * MEMORY_SIZE - OUTPUT_LIMIT as u64
        );
        assert_eq!(console.transmitq.used_idx(&console.device.mem), 1);
        assert_eq!(console.device.transport.violation(), None);
    }

    #[test]
    fn test_console_device_writable_transmit_buffer_breaks_device() {
        // Arrange
        let mut console = live_console();

        // Act
        console
            .transmitq
            .add_chain(&console.device.mem, &[writable(DATA_BASE, 8)]);
        console.device.write32(REG_QUEUE_NOTIFY, TRANSMITQ as u32);

        // Assert
        assert_eq!(
            console.device.transport.violation(),
            Some(VirtioViolation::Queue {
                queue: TRANSMITQ as u16,
                fault: QueueFault::WritableDescriptor { index: 0 },
            })
        );
        assert_ne!(console.device.read32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
    }

    #[test]
    fn test_console_read_only_receive_buffer_breaks_device_and_is_not_written() {
        // Arrange
        let mut console = live_console();
        write_bytes(&console.device.mem, DATA_BASE, b"guest's");
        console
            .receiveq
            .add_chain(&console.device.mem, &[readable(DATA_BASE, 7)]);
        console
            .device
            .transport
            .device_mut()
            .enqueue_input(b"overwrite");

        // Act
        console.device.write32(REG_QUEUE_NOTIFY, RECEIVEQ as u32);

        // Assert
        assert_eq!(
            console.device.transport.violation(),
            Some(VirtioViolation::Queue {
                queue: RECEIVEQ as u16,
                fault: QueueFault::ReadOnlyDescriptor { index: 0 },
            })
        );
        assert_eq!(read_bytes(&console.device.mem, DATA_BASE, 7), b"guest's");
        assert_eq!(console.device.transport.device().pending_input_len(), 9);
    }

    #[test]
    fn test_console_reset_keeps_pending_input_and_output() {
        // Arrange
        let mut console = live_console();
        console.transmit(&[(DATA_BASE, b"sent")]);
        console
            .device
            .transport
            .device_mut()
            .enqueue_input(b"queued");

        // Act
        console.device.write32(REG_STATUS, 0);

        // Assert
        let backend = console.device.transport.device_mut();
        assert_eq!(backend.pending_input_len(), 6);
        assert_eq!(backend.take_output(), b"sent");
    }

    #[test]
    fn test_console_config_space_reads_zero() {
        // Arrange
        let mut device = DirectTransport::new(VirtioConsole::new());
        let mut config = [0xffu8; 12];

        // Act
        device.transport.read(REG_CONFIG, &mut config);
        device
            .transport
            .write(REG_CONFIG + 8, &[1, 2, 3, 4], &device.mem, device.now);

        // Assert
        assert_eq!(config, [0; 12]);
        assert_eq!(device.read32(REG_CONFIG + 8), 0);
    }

    /// Output not yet taken and input not yet delivered.
    fn used_console() -> VirtioConsole {
        let mut console = live_console();
        console.transmit(&[(DATA_BASE, b"out")]);
        let mut backend = console.device.transport.device().clone();
        backend.enqueue_input(b"in");
        backend
    }

    crate::persist::persist_round_trip_tests! {
        mod console_persist {
            fresh: VirtioConsole::new(),
            saved: used_console(),
            mutate: |console: &mut VirtioConsole| {
                console.take_output();
                console.enqueue_input(b"more");
            },
        }
    }
}
