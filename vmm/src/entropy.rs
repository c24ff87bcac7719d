//! Seeded entropy: one ChaCha20 stream per consumer, all derived from the run seed.
//!
//! Each consumer gets its own stream (keyed by its name), so adding a consumer
//! or drawing more from one never shifts the bytes another one sees.

use devices::{Persist, RestoreError};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

/// Names of the streams; the name is part of the key, so never rename one.
pub mod stream {
    /// The seed handed to the kernel RNG at boot (setup_data RNG seed).
    pub const KERNEL_RNG_SEED: &str = "kernel-rng-seed";
    /// The virtio-rng device (the guest's hwrng, which keeps feeding its RNG).
    pub const VIRTIO_RNG: &str = "virtio-rng";
    /// The network switch: latency, loss, duplication and reordering draws.
    pub const NETWORK_SWITCH: &str = "network-switch";
}

/// The 32-byte ChaCha20 key of stream `name` under `seed`.
pub fn stream_key(seed: u64, name: &str) -> [u8; 32] {
    blake3::derive_key(
        &format!("detvisor entropy stream {name}"),
        &seed.to_le_bytes(),
    )
}

#[derive(Clone, Debug)]
pub struct EntropyStream {
    name: String,
    seed: u64,
    rng: ChaCha20Rng,
}

/// Serializable position of a stream: the key inputs and how far it has been read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntropyStreamState {
    pub name: String,
    pub seed: u64,
    /// Position in 32-bit words, as ChaCha20Rng counts it.
    pub word_pos: u128,
}

impl EntropyStream {
    pub fn new(seed: u64, name: &str) -> Self {
        let key = stream_key(seed, name);
        EntropyStream {
            name: name.to_string(),
            seed,
            rng: ChaCha20Rng::from_seed(key),
        }
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        self.rng.fill_bytes(buf);
    }

    pub fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// The stream a saved state describes.
    pub fn from_state(state: &EntropyStreamState) -> Self {
        let mut stream = EntropyStream::new(state.seed, &state.name);
        stream.rng.set_word_pos(state.word_pos);
        stream
    }
}

impl Persist for EntropyStream {
    type State = EntropyStreamState;

    fn save(&self) -> EntropyStreamState {
        EntropyStreamState {
            name: self.name.clone(),
            seed: self.seed,
            word_pos: self.rng.get_word_pos(),
        }
    }

    fn restore(&mut self, state: &EntropyStreamState) -> Result<(), RestoreError> {
        *self = EntropyStream::from_state(state);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_same_seed_and_name_give_same_bytes() {
        let (mut a, mut b) = (EntropyStream::new(7, "x"), EntropyStream::new(7, "x"));
        let (mut ba, mut bb) = ([0u8; 32], [0u8; 32]);
        a.fill(&mut ba);
        b.fill(&mut bb);
        assert_eq!(ba, bb);
    }

    #[test]
    fn test_other_seed_or_name_gives_other_bytes() {
        let base = EntropyStream::new(7, "x").next_u64();
        assert_ne!(base, EntropyStream::new(8, "x").next_u64());
        assert_ne!(base, EntropyStream::new(7, "y").next_u64());
    }

    #[test]
    fn test_state_round_trip_resumes_at_same_position() {
        let mut stream = EntropyStream::new(3, "k");
        stream.next_u64();
        let saved = stream.save();
        let expected = stream.next_u64();
        let mut restored = EntropyStream::from_state(&saved);
        assert_eq!(restored.save(), saved);
        assert_eq!(restored.next_u64(), expected);
    }

    fn used(seed: u64) -> EntropyStream {
        let mut stream = EntropyStream::new(seed, "k");
        stream.next_u64();
        stream
    }

    devices::persist_round_trip_tests! {
        mod entropy_persist {
            fresh: EntropyStream::new(9, "other"),
            saved: used(3),
            mutate: |stream: &mut EntropyStream| {
                stream.next_u64();
            },
        }
    }
}
