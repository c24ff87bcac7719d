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
use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use crate::GuestMemory;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;

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
}

impl Persist for VirtioRng {
    type State = VirtioRngState;

    fn save(&self) -> VirtioRngState {
        VirtioRngState {
            key: self.rng.get_seed(),
            stream: self.rng.get_stream(),
            word_pos: self.rng.get_word_pos(),
        }
    }

    /// Every key, stream and position is a valid place in a stream.
    fn restore(&mut self, state: &VirtioRngState) -> Result<(), RestoreError> {
        let mut rng = ChaCha20Rng::from_seed(state.key);
        rng.set_stream(state.stream);
        rng.set_word_pos(state.word_pos);
        self.rng = rng;
        Ok(())
    }
}

impl VirtioDevice for VirtioRng {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &QUEUE_MAX_SIZES
    }

    fn process_queue(
        &mut self,
        _queue_index: usize,
        queue: &mut Virtqueue,
        mem: &GuestMemory,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::mmio::INTERRUPT_USED_BUFFER;
    use crate::virtio::testing::*;
    use crate::virtio::RingPart;

    const KEY: [u8; 32] = *b"detvisor virtio-rng test key 32b";

    fn expected_stream(len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        ChaCha20Rng::from_seed(KEY).fill_bytes(&mut bytes);
        bytes
    }

    fn live_rng() -> (DirectTransport<VirtioRng>, DriverQueue) {
        let mut device = DirectTransport::new(VirtioRng::new(KEY));
        let queue = DriverQueue::new(QUEUE0_BASE, RNG_QUEUE_SIZE);
        initialize(&mut device, &[&queue]);
        (device, queue)
    }

    #[test]
    fn test_rng_fills_requests_from_the_seeded_stream_end_to_end() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        let first = queue.add_chain(&device.mem, &[writable(DATA_BASE, 32)]);
        let second = queue.add_chain(&device.mem, &[writable(DATA_BASE + 0x100, 16)]);

        // Act
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        let stream = expected_stream(48);
        assert_eq!(
            queue.take_used(&device.mem),
            [(u32::from(first), 32), (u32::from(second), 16)]
        );
        assert_eq!(read_bytes(&device.mem, DATA_BASE, 32), stream[..32]);
        assert_eq!(read_bytes(&device.mem, DATA_BASE + 0x100, 16), stream[32..]);
        assert_eq!(device.read32(REG_INTERRUPT_STATUS), INTERRUPT_USED_BUFFER);
    }

    #[test]
    fn test_rng_bytes_do_not_depend_on_how_the_buffer_is_split() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        queue.add_chain(
            &device.mem,
            &[
                writable(DATA_BASE, 5),
                writable(DATA_BASE + 0x100, 0),
                writable(DATA_BASE + 0x200, 27),
            ],
        );

        // Act
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        let stream = expected_stream(32);
        assert_eq!(queue.take_used(&device.mem), [(0, 32)]);
        assert_eq!(read_bytes(&device.mem, DATA_BASE, 5), stream[..5]);
        assert_eq!(read_bytes(&device.mem, DATA_BASE + 0x200, 27), stream[5..]);
    }

    #[test]
    fn test_rng_request_is_capped() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        let len = MAX_BYTES_PER_REQUEST + 0x1000;
        write_bytes(&device.mem, DATA_BASE, &vec![0xcc; len as usize]);
        queue.add_chain(&device.mem, &[writable(DATA_BASE, len)]);

        // Act
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_eq!(queue.take_used(&device.mem), [(0, MAX_BYTES_PER_REQUEST)]);
        let tail = read_bytes(
            &device.mem,
            DATA_BASE + u64::from(MAX_BYTES_PER_REQUEST),
            0x1000,
        );
        assert!(tail.iter().all(|&b| b == 0xcc));
    }

    #[test]
    fn test_rng_state_round_trip_continues_the_stream() {
        // Arrange
        let mut rng = VirtioRng::new(KEY);
        let mut queue = Virtqueue::new(RNG_QUEUE_SIZE).unwrap();
        let mem = test_memory();
        let mut driver = DriverQueue::new(QUEUE0_BASE, RNG_QUEUE_SIZE);
        for (part, address) in [
            (RingPart::DescriptorTable, driver.desc),
            (RingPart::AvailRing, driver.avail),
            (RingPart::UsedRing, driver.used),
        ] {
            queue.set_address_half(part, false, address as u32).unwrap();
        }
        queue.set_ready(true, &mem).unwrap();
        driver.add_chain(&mem, &[writable(DATA_BASE, 12)]);
        rng.process_queue(0, &mut queue, &mem, VirtNanos::ZERO)
            .unwrap();
        let saved = rng.save();
        let json = serde_json::to_string(&saved).unwrap();

        // Act
        let mut restored = VirtioRng::new([0; 32]);
        restored
            .restore(&serde_json::from_str(&json).unwrap())
            .unwrap();
        driver.add_chain(&mem, &[writable(DATA_BASE + 0x100, 20)]);
        restored
            .process_queue(0, &mut queue, &mem, VirtNanos::ZERO)
            .unwrap();

        // Assert: 12 bytes took 3 words; the next request starts at word 3.
        assert_eq!(saved.word_pos, 3);
        assert_eq!(saved.key, KEY);
        assert_eq!(restored.save().word_pos, 8);
        assert_eq!(
            read_bytes(&mem, DATA_BASE + 0x100, 20),
            expected_stream(32)[12..]
        );
    }

    #[test]
    fn test_rng_from_rng_reads_from_where_the_stream_stands() {
        // Arrange
        let mut stream = ChaCha20Rng::from_seed(KEY);
        stream.set_word_pos(100);

        // Act
        let rng = VirtioRng::from_rng(stream);

        // Assert
        assert_eq!(rng.save().word_pos, 100);
    }

    #[test]
    fn test_rng_device_reset_does_not_rewind_the_stream() {
        // Arrange
        let (mut device, mut queue) = live_rng();
        queue.add_chain(&device.mem, &[writable(DATA_BASE, 16)]);
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Act
        device.write32(REG_STATUS, 0);
        let mut queue = DriverQueue::new(QUEUE1_BASE, RNG_QUEUE_SIZE);
        initialize(&mut device, &[&queue]);
        queue.add_chain(&device.mem, &[writable(DATA_BASE + 0x100, 16)]);
        device.write32(REG_QUEUE_NOTIFY, 0);

        // Assert
        assert_eq!(
            read_bytes(&device.mem, DATA_BASE + 0x100, 16),
            expected_stream(32)[16..]
        );
    }

    /// 100 bytes into the stream.
    fn read_rng() -> VirtioRng {
        let mut rng = VirtioRng::new(KEY);
        rng.rng.fill_bytes(&mut [0u8; 100]);
        rng
    }

    crate::persist::persist_round_trip_tests! {
        mod rng_persist {
            fresh: VirtioRng::new([0; 32]),
            saved: read_rng(),
            mutate: |rng: &mut VirtioRng| rng.rng.fill_bytes(&mut [0u8; 8]),
        }
    }
}
