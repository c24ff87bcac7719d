//! virtio-rng (device ID 4, spec 5.4): an entropy source whose bytes come
//! from a seeded ChaCha20 stream, so the guest's "hardware" randomness is
//! the same on every run with the same seed.
//!
//! One queue (requestq). Each request is a chain of device-writable
//! buffers; the device fills it (up to [`MAX_BYTES_PER_REQUEST`], which the
//! spec allows: it may use less than the whole buffer) and returns it. The
//! bytes of one request are drawn from the stream in one piece and then
//! spread over the chain's buffers, so how the driver splits its buffer
//! does not change what it receives.

use super::{QueueFault, VirtioDevice, Virtqueue};
use crate::time::VirtNanos;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use vm_memory::GuestMemoryMmap;

/// The queue size offered; Linux's driver keeps one request in flight.
pub const RNG_QUEUE_SIZE: u16 = 64;
/// The most bytes one request is given, so that a huge buffer cannot make
/// one exit arbitrarily long.
pub const MAX_BYTES_PER_REQUEST: u32 = 64 * 1024;

const QUEUE_MAX_SIZES: [u16; 1] = [RNG_QUEUE_SIZE];

/// Saved state: the stream's key and how far it has been read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioRngState {
    pub key: [u8; 32],
    pub stream: u64,
    /// Position in 32-bit words, as ChaCha20Rng counts it.
    pub word_pos: u128,
}

#[derive(Clone, Debug)]
pub struct VirtioRng {
    rng: ChaCha20Rng,
}

impl VirtioRng {
    /// A source reading the ChaCha20 stream keyed by `key` from its start.
    pub fn new(key: [u8; 32]) -> Self {
        Self::from_rng(ChaCha20Rng::from_seed(key))
    }

    /// A source reading `rng` from where it stands.
    pub fn from_rng(rng: ChaCha20Rng) -> Self {
        VirtioRng { rng }
    }

    pub fn state(&self) -> VirtioRngState {
        VirtioRngState {
            key: self.rng.get_seed(),
            stream: self.rng.get_stream(),
            word_pos: self.rng.get_word_pos(),
        }
    }

    pub fn restore(&mut self, state: &VirtioRngState) {
        let mut rng = ChaCha20Rng::from_seed(state.key);
        rng.set_stream(state.stream);
        rng.set_word_pos(state.word_pos);
        self.rng = rng;
    }
}

impl VirtioDevice for VirtioRng {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn device_features(&self) -> u64 {
        0
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &QUEUE_MAX_SIZES
    }

    /// virtio-rng has no configuration space.
    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn process_queue(
        &mut self,
        _queue_index: usize,
        queue: &mut Virtqueue,
        mem: &GuestMemoryMmap,
        _now: VirtNanos,
    ) -> Result<(), QueueFault> {
        while let Some(chain) = queue.pop(mem)? {
            // Spec 5.4.6.1: the driver places only device-writable buffers.
            chain.require_device_writable()?;
            let len = chain.writable_len().min(MAX_BYTES_PER_REQUEST);
            let mut bytes = vec![0u8; len as usize];
            self.rng.fill_bytes(&mut bytes);
            let written = chain.write_writable(mem, &bytes)?;
            queue.add_used(mem, chain.head_index(), written)?;
        }
        Ok(())
    }

    /// The stream is the machine's, not the driver's: a reset does not rewind it.
    fn reset(&mut self) {}
}
