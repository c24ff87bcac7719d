//! What the guest-facing fuzz targets share.
//!
//! [`GuardedMemory`]: guest RAM the fuzzer owns, one mmap'ed region with an
//! inaccessible (`PROT_NONE`) guard page before and after it, so a device
//! that reads or writes outside guest memory faults at once instead of
//! corrupting the fuzzer's heap.
//!
//! [`virtio_driver`]: the register writes of a virtio driver's
//! initialization and the split virtqueue's ring layout.

pub mod virtio_driver;

use devices::GuestMemory;
use std::sync::OnceLock;
use vm_memory::bitmap::{AtomicBitmap, NewBitmap};
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{Bytes, GuestAddress, GuestRegionMmap};

/// Bytes of each guard region (one page).
const GUARD: usize = 4096;

/// Guest RAM at guest-physical address 0 with guard pages around it.
///
/// The mapping lives as long as the process: a [`GuestMemory`] handle
/// given to a device may outlive any one fuzz iteration, so the region is
/// never unmapped. Make one per instance a target needs, once, and
/// [`GuardedMemory::clear`] it at the start of each iteration.
pub struct GuardedMemory {
    memory: GuestMemory,
    size: usize,
}

impl GuardedMemory {
    /// `size` bytes of guest RAM (a multiple of the page size).
    ///
    /// # Panics
    /// If the mapping cannot be made: the target cannot run without it.
    pub fn new(size: usize) -> Self {
        assert!(
            size > 0 && size.is_multiple_of(GUARD),
            "size must be whole pages"
        );
        let total = size + 2 * GUARD;
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "mmap of guest memory failed");
        // SAFETY: `base + GUARD` is inside the `total`-byte mapping just made.
        let ram = unsafe { base.cast::<u8>().add(GUARD) };
        // SAFETY: `[ram, ram + size)` lies inside that mapping, which this
        // function owns; only its protection changes.
        let rc = unsafe { libc::mprotect(ram.cast(), size, libc::PROT_READ | libc::PROT_WRITE) };
        assert_eq!(rc, 0, "mprotect of guest memory failed");
        let builder = MmapRegionBuilder::new_with_bitmap(size, AtomicBitmap::with_len(size))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        // SAFETY: `ram` and `size` are inside the mapping above, readable and
        // writable, and it is never unmapped (see the type's documentation).
        let region = unsafe { builder.with_raw_mmap_pointer(ram) }
            .build()
            .expect("guest memory region");
        let region = GuestRegionMmap::new(region, GuestAddress(0)).expect("guest region");
        let memory = GuestMemory::from_regions(vec![region]).expect("guest memory");
        GuardedMemory { memory, size }
    }

    /// The handle devices take.
    pub fn memory(&self) -> &GuestMemory {
        &self.memory
    }

    /// Bytes of guest RAM.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Zeroes the RAM: a fresh machine. (The dirty bitmap is left as it
    /// is: no device reads it.)
    pub fn clear(&self) {
        let zeros = vec![0u8; self.size];
        self.memory
            .write_slice(&zeros, GuestAddress(0))
            .expect("zeroing guest memory");
    }

    /// Writes `bytes` at `address`, clipped to guest memory (the guest's
    /// own stores: only inside its RAM).
    pub fn write_clipped(&self, address: u64, bytes: &[u8]) {
        let size = self.size as u64;
        let start = address % size;
        let len = bytes.len().min((size - start) as usize);
        self.memory
            .write_slice(&bytes[..len], GuestAddress(start))
            .expect("write inside guest memory");
    }

    /// The whole RAM, to compare two machines' (a plain copy: a digest
    /// computed byte by byte is slow under coverage instrumentation).
    pub fn contents(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; self.size];
        self.memory
            .read_slice(&mut bytes, GuestAddress(0))
            .expect("reading guest memory");
        bytes
    }
}

/// Two machines' RAM of `size` bytes each (for a target that runs every
/// input twice and compares), made on the first call.
///
/// # Panics
/// If called again with another size: a process has one pair.
pub fn two_memories(size: usize) -> &'static [GuardedMemory; 2] {
    static MEMORIES: OnceLock<[GuardedMemory; 2]> = OnceLock::new();
    let memories = MEMORIES.get_or_init(|| [GuardedMemory::new(size), GuardedMemory::new(size)]);
    assert_eq!(
        memories[0].size(),
        size,
        "one size of guest memory per process"
    );
    memories
}

/// FNV-1a over `bytes`: a cheap digest to compare outputs.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}
