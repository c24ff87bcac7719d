//! Re-keying the guest kernel's CRNG from the VMM, at a branch exit, before
//! the guest runs another instruction.
//!
//! Linux 6.x keeps its CRNG in two statics of `drivers/char/random.c`:
//! `base_crng` (the ChaCha key every draw derives from, and a generation
//! counter) and `input_pool` (the BLAKE2s state the key is extracted from at
//! each reseed). A reseed (`crng_reseed`) writes a new key into `base_crng`
//! and bumps its generation; every path that hands out randomness
//! (`get_random_bytes`, `/dev/urandom`, `getrandom()`, the batched
//! `get_random_u32`/`u64`) compares its per-CPU key's or batch's generation
//! with the base's before it draws, and re-derives on a mismatch. So the
//! VMM does what `crng_reseed` does, in guest memory, at the branch exit:
//! a new key and generation + 1. The next draw of any process, whatever the
//! guest was doing at the branch, comes from the branch's key. The same bytes
//! are also mixed into `input_pool`'s hash state, so the kernel's own later
//! reseeds (every 1 to 60 s) extract from a pool the parent never had.
//!
//! Why it is exact: the write happens between two exits, with the vCPU
//! stopped. The kernel's own updates of these fields run with interrupts
//! off and without port or MMIO access (the only places an exit can fall on
//! this one-vCPU, `CONFIG_SMP=n` kernel, whose spinlocks hold no state), so
//! a branch exit is never inside one. A read already under way at the
//! branch exit (its ChaCha state copied out of the key) finishes with the
//! parent's key, as it would across the kernel's own reseed.
//!
//! The addresses come from the vmlinux's symbol table at boot (the default
//! guest kernel keeps it); a kernel without these symbols, or with another
//! layout, gets [`GuestCrng::find`] `None`, and the caller falls back on
//! the agent's reseed (late: see docs/determinism.md).

use devices::GuestMemory;
use object::read::elf::{ElfFile64, ProgramHeader};
use object::{Object, ObjectSymbol, ReadCache};
use serde::{Deserialize, Serialize};
use std::fs::File;
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress};

/// `base_crng`'s size and field offsets in Linux 6.1 (x86-64, `CONFIG_SMP=n`:
/// the spinlock takes no space): `u8 key[32]; unsigned long birth;
/// unsigned long generation; spinlock_t lock;`.
const BASE_CRNG_SIZE: u64 = 48;
const KEY_OFFSET: u64 = 0;
const KEY_LEN: usize = 32;
const GENERATION_OFFSET: u64 = 40;
/// `input_pool` starts with its `struct blake2s_state`, whose first field is
/// the chaining value `u32 h[8]`; the struct is larger.
const POOL_HASH_LEN: usize = 32;
const INPUT_POOL_MIN_SIZE: u64 = 120;

/// Bytes a branch gives the guest CRNG: the new key, then what is mixed
/// into the pool's hash state.
pub const REKEY_BYTES: usize = KEY_LEN + POOL_HASH_LEN;

/// Where the guest kernel keeps its CRNG (guest-physical addresses), found
/// at boot and kept in the session's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestCrng {
    pub base_crng: u64,
    pub input_pool: u64,
}

/// Why the guest memory could not be written (a corrupt state's addresses).
#[derive(Debug, Error)]
#[error("re-keying the guest kernel's CRNG at guest address {addr:#x}: {reason}")]
pub struct GuestCrngError {
    pub addr: u64,
    pub reason: String,
}

impl GuestCrng {
    /// The CRNG of the kernel in vmlinux `file`, if its symbol table names
    /// `base_crng` and `input_pool` with the layout this module writes.
    /// `None` for a stripped kernel or another layout (never an error: the
    /// kernel itself was already loaded from the file).
    pub fn find(file: File) -> Option<GuestCrng> {
        let cache = ReadCache::new(file);
        let elf = ElfFile64::<object::Endianness, _>::parse(&cache).ok()?;
        let (mut base, mut pool) = (None, None);
        for symbol in elf.symbols() {
            match symbol.name() {
                Ok("base_crng") => base = Some((symbol.address(), symbol.size())),
                Ok("input_pool") => pool = Some((symbol.address(), symbol.size())),
                _ => {}
            }
        }
        let (base, pool) = (base?, pool?);
        if base.1 != BASE_CRNG_SIZE || pool.1 < INPUT_POOL_MIN_SIZE {
            return None;
        }
        let endian = elf.endian();
        let physical = |virt: u64, len: u64| {
            elf.elf_program_headers().iter().find_map(|segment| {
                let start = segment.p_vaddr(endian);
                let end = start.checked_add(segment.p_memsz(endian))?;
                (segment.p_type(endian) == object::elf::PT_LOAD
                    && virt >= start
                    && virt.checked_add(len)? <= end)
                    .then(|| segment.p_paddr(endian) + (virt - start))
            })
        };
        Some(GuestCrng {
            base_crng: physical(base.0, base.1)?,
            input_pool: physical(pool.0, pool.1)?,
        })
    }

    /// Does what the kernel's `crng_reseed` does, with `bytes`: the first
    /// 32 are `base_crng`'s new key (and its generation moves on, so every
    /// per-CPU key and batch is re-derived at its next draw); the other 32
    /// are mixed (XOR) into the input pool's hash state.
    pub fn rekey(
        &self,
        memory: &GuestMemory,
        bytes: &[u8; REKEY_BYTES],
    ) -> Result<(), GuestCrngError> {
        let (key, pool_bytes) = bytes.split_at(KEY_LEN);
        write(memory, self.base_crng + KEY_OFFSET, key)?;
        let generation_at = self.base_crng + GENERATION_OFFSET;
        let mut generation = [0u8; 8];
        read(memory, generation_at, &mut generation)?;
        // As the kernel does: never ULONG_MAX, the per-CPU "never keyed" mark.
        let mut next = u64::from_le_bytes(generation).wrapping_add(1);
        if next == u64::MAX {
            next = 0;
        }
        write(memory, generation_at, &next.to_le_bytes())?;
        let mut hash = [0u8; POOL_HASH_LEN];
        read(memory, self.input_pool, &mut hash)?;
        for (h, b) in hash.iter_mut().zip(pool_bytes) {
            *h ^= b;
        }
        write(memory, self.input_pool, &hash)
    }
}

fn read(memory: &GuestMemory, addr: u64, buf: &mut [u8]) -> Result<(), GuestCrngError> {
    memory
        .read_slice(buf, GuestAddress(addr))
        .map_err(|e| GuestCrngError {
            addr,
            reason: e.to_string(),
        })
}

fn write(memory: &GuestMemory, addr: u64, bytes: &[u8]) -> Result<(), GuestCrngError> {
    memory
        .write_slice(bytes, GuestAddress(addr))
        .map_err(|e| GuestCrngError {
            addr,
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> GuestMemory {
        GuestMemory::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    #[test]
    fn test_rekey_writes_the_key_moves_the_generation_on_and_mixes_the_pool() {
        let memory = memory();
        let crng = GuestCrng {
            base_crng: 0x1000,
            input_pool: 0x2000,
        };
        memory
            .write_slice(&[0xaa; 32], GuestAddress(0x1000))
            .unwrap();
        memory
            .write_slice(&7u64.to_le_bytes(), GuestAddress(0x1020))
            .unwrap();
        memory
            .write_slice(&41u64.to_le_bytes(), GuestAddress(0x1028))
            .unwrap();
        memory
            .write_slice(&[0x0f; 40], GuestAddress(0x2000))
            .unwrap();
        let mut bytes = [0u8; REKEY_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = i as u8;
        }
        crng.rekey(&memory, &bytes).unwrap();

        let mut key = [0u8; 32];
        memory.read_slice(&mut key, GuestAddress(0x1000)).unwrap();
        assert_eq!(key[..], bytes[..32]);
        let birth: u64 = memory.read_obj(GuestAddress(0x1020)).unwrap();
        assert_eq!(birth, 7, "the reseed schedule is the parent's");
        let generation: u64 = memory.read_obj(GuestAddress(0x1028)).unwrap();
        assert_eq!(generation, 42);
        let mut pool = [0u8; 40];
        memory.read_slice(&mut pool, GuestAddress(0x2000)).unwrap();
        for i in 0..32 {
            assert_eq!(pool[i], 0x0f ^ bytes[32 + i], "byte {i}");
        }
        assert_eq!(pool[32..], [0x0f; 8], "only the chaining value is mixed");
    }

    #[test]
    fn test_the_generation_skips_the_never_keyed_mark() {
        let memory = memory();
        let crng = GuestCrng {
            base_crng: 0,
            input_pool: 0x100,
        };
        memory
            .write_slice(
                &(u64::MAX - 1).to_le_bytes(),
                GuestAddress(GENERATION_OFFSET),
            )
            .unwrap();
        crng.rekey(&memory, &[1; REKEY_BYTES]).unwrap();
        let generation: u64 = memory.read_obj(GuestAddress(GENERATION_OFFSET)).unwrap();
        assert_eq!(generation, 0);
    }

    #[test]
    fn test_addresses_outside_guest_memory_are_an_error_naming_them() {
        let crng = GuestCrng {
            base_crng: 0x20_0000,
            input_pool: 0,
        };
        let error = crng.rekey(&memory(), &[0; REKEY_BYTES]).unwrap_err();
        assert!(error.to_string().contains("0x200000"), "{error}");
    }

    #[test]
    fn test_a_file_that_is_not_an_elf_kernel_has_no_crng() {
        let file = File::open(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
        assert_eq!(GuestCrng::find(file), None);
    }
}
