//! Seeded entropy: one ChaCha20 stream per consumer, all derived from the run seed.
//!
//! Each consumer gets its own stream (keyed by its name), so adding a consumer
//! or drawing more from one never shifts the bytes another one sees.

use devices::{Persist, RestoreError};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

/// Names of the streams; the name is part of the key, so never rename one.
///
/// The list of every seeded stream (docs/determinism.md holds the same list
/// with what a branch inherits): [`KERNEL_RNG_SEED`](stream::KERNEL_RNG_SEED)
/// is drawn once at boot; the streams in [`REKEYED_AT_BRANCH`] keep feeding
/// the run and are re-keyed by [`crate::vm::Session::rekey`] at a branch.
/// A new consumer adds its name here and to that list.
pub mod stream {
    /// The seed handed to the kernel RNG at boot (setup_data RNG seed).
    pub const KERNEL_RNG_SEED: &str = "kernel-rng-seed";
    /// The virtio-rng device (the guest's hwrng, which keeps feeding its RNG).
    pub const VIRTIO_RNG: &str = "virtio-rng";
    /// The network switch: latency, loss, duplication and reordering draws.
    pub const NETWORK_SWITCH: &str = "network-switch";
    /// The guest kernel CRNG's new key and pool bytes at a branch, written
    /// by the VMM into guest memory at the branch exit
    /// ([`crate::guest_crng`]), so the guest's CRNG diverges at once
    /// instead of at its next reseed from the hwrng. (A kernel without the
    /// CRNG symbols gets them from the agent instead: `RNDADDENTROPY`,
    /// then `RNDRESEEDCRNG`.)
    pub const GUEST_POOL: &str = "guest-pool";
    /// Values the Antithesis SDKs' `get_random()` returns to guest programs
    /// (through the libvoidstar shim or `detvisor-assert random`): the host
    /// answers each request from this stream, held in the `up` conductor's
    /// saved state.
    pub const SDK_RANDOM: &str = "sdk-random";
    /// The host's test-composer scheduler (`run::composer`): which
    /// template commands run, how many at once, when `eventually_` starts.
    /// Host-side state, re-keyed by the conductor at a branch.
    pub const TEST_COMPOSER: &str = "test-composer";
}

/// The streams a branch re-keys, all from (seed, exit index).
pub const REKEYED_AT_BRANCH: [&str; 5] = [
    stream::VIRTIO_RNG,
    stream::NETWORK_SWITCH,
    stream::GUEST_POOL,
    stream::SDK_RANDOM,
    stream::TEST_COMPOSER,
];

/// Bytes of [`stream::GUEST_POOL`] drawn at a branch.
pub const GUEST_POOL_BYTES: usize = crate::guest_crng::REKEY_BYTES;

/// The key of stream `name` in the history re-keyed with `seed` at exit
/// `exit`: branching one moment with one seed twice gives one history.
pub fn branch_key(seed: u64, exit: u64, name: &str) -> [u8; 32] {
    stream_key(seed, &format!("{name}@exit{exit}"))
}

/// The bytes the guest kernel's CRNG is re-keyed with at a branch with
/// `seed` at exit `exit`.
pub fn guest_pool_bytes(seed: u64, exit: u64) -> [u8; GUEST_POOL_BYTES] {
    let mut bytes = [0; GUEST_POOL_BYTES];
    ChaCha20Rng::from_seed(branch_key(seed, exit, stream::GUEST_POOL)).fill_bytes(&mut bytes);
    bytes
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
    /// Stream `name` in the history re-keyed with `seed` at exit `exit`
    /// (keyed by [`branch_key`]).
    pub fn at_branch(seed: u64, exit: u64, name: &str) -> Self {
        EntropyStream::new(seed, &format!("{name}@exit{exit}"))
    }

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
    fn test_a_stream_at_a_branch_is_keyed_by_branch_key_and_round_trips() {
        let mut at = EntropyStream::at_branch(3, 99, stream::SDK_RANDOM);
        let mut direct = ChaCha20Rng::from_seed(branch_key(3, 99, stream::SDK_RANDOM));
        assert_eq!(at.next_u64(), direct.next_u64());
        let mut back = EntropyStream::from_state(&at.save());
        assert_eq!(back.next_u64(), at.next_u64());
    }

    #[test]
    fn test_branch_keys_differ_by_seed_exit_and_stream_and_repeat() {
        let key = |seed, exit, name| branch_key(seed, exit, name);
        assert_eq!(
            key(1, 500, stream::VIRTIO_RNG),
            key(1, 500, stream::VIRTIO_RNG)
        );
        assert_ne!(
            key(1, 500, stream::VIRTIO_RNG),
            key(2, 500, stream::VIRTIO_RNG)
        );
        assert_ne!(
            key(1, 500, stream::VIRTIO_RNG),
            key(1, 501, stream::VIRTIO_RNG)
        );
        assert_ne!(
            key(1, 500, stream::VIRTIO_RNG),
            key(1, 500, stream::NETWORK_SWITCH)
        );
        // The virtio-rng key is the one branches always used (digests kept).
        assert_eq!(
            key(1, 500, stream::VIRTIO_RNG),
            stream_key(1, "virtio-rng@exit500")
        );
        assert_eq!(guest_pool_bytes(3, 9), guest_pool_bytes(3, 9));
        assert_ne!(guest_pool_bytes(3, 9), guest_pool_bytes(4, 9));
    }

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
