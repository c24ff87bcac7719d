//! virtio-console (device ID 3, spec 5.3) with a single port and no
//! features (no MULTIPORT, SIZE or EMERG_WRITE): the VMM's control channel
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
//!   DRIVER_OK, or when the VMM calls `deliver` on the transport.
//!
//! A device reset drops neither pending input nor undrained output: both
//! belong to the VMM, not to the driver.

use super::mmio::VirtioMmioTransport;
use super::{QueueFault, VirtioDevice, Virtqueue};
use crate::time::VirtNanos;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use virtio_bindings::virtio_ids::VIRTIO_ID_CONSOLE;
use vm_memory::GuestMemoryMmap;

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

    pub fn state(&self) -> VirtioConsoleState {
        VirtioConsoleState {
            pending_input: self.pending_input.iter().copied().collect(),
            output: self.output.clone(),
            dropped_output_bytes: self.dropped_output_bytes,
        }
    }

    pub fn restore(&mut self, state: &VirtioConsoleState) {
        self.pending_input = state.pending_input.iter().copied().collect();
        self.output = state.output.clone();
        self.dropped_output_bytes = state.dropped_output_bytes;
    }

    fn deliver_input(
        &mut self,
        queue: &mut Virtqueue,
        mem: &GuestMemoryMmap,
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
        mem: &GuestMemoryMmap,
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

impl VirtioDevice for VirtioConsole {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_CONSOLE
    }

    fn device_features(&self) -> u64 {
        0
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &QUEUE_MAX_SIZES
    }

    /// struct virtio_console_config (cols, rows, max_nr_ports, emerg_wr):
    /// none of its fields is in use without features, so it reads as zeros.
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    /// emerg_wr is only writable with VIRTIO_CONSOLE_F_EMERG_WRITE, never offered.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn process_queue(
        &mut self,
        queue_index: usize,
        queue: &mut Virtqueue,
        mem: &GuestMemoryMmap,
        _now: VirtNanos,
    ) -> Result<(), QueueFault> {
        match queue_index {
            RECEIVEQ => self.deliver_input(queue, mem),
            TRANSMITQ => self.collect_output(queue, mem),
            _ => Ok(()),
        }
    }

    fn reset(&mut self) {}
}

impl VirtioMmioTransport<VirtioConsole> {
    /// Delivers pending input into the receive buffers the guest has posted,
    /// raising the used-buffer interrupt if any were filled. Call only at
    /// deterministic points.
    pub fn deliver(&mut self, mem: &GuestMemoryMmap, now: VirtNanos) {
        self.process_queue(RECEIVEQ, mem, now);
    }
}
