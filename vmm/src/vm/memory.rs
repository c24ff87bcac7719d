//! Guest RAM: allocating it fresh, mapping it from a snapshot's memory file
//! or over a mapping the caller made, and splitting it around the MMIO hole.
//!
//! Every `GuestMemory` built here is host-contiguous in region order (one
//! region, or two split from one mapping), so page `n` of RAM is byte
//! `n * 4096` of one host mapping, of KVM's dirty log numbering and of a
//! snapshot's memory file, whatever the split.

use crate::boot;
use devices::GuestMemory;
use thiserror::Error;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

/// The guest's page size, which is also the unit of dirty logging,
/// checkpoints and memory hashing.
pub(super) const PAGE_SIZE: usize = 4096;

/// Guest RAM could not be allocated, mapped or laid out.
#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("cannot allocate {bytes} bytes of guest memory: mmap")]
    Mmap {
        bytes: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot allocate {bytes} bytes of guest memory: {what}")]
    Region {
        bytes: u64,
        what: &'static str,
        #[source]
        source: vm_memory::mmap::MmapRegionError,
    },
    #[error("cannot allocate {bytes} bytes of guest memory: the regions")]
    Layout {
        bytes: u64,
        #[source]
        source: vm_memory::GuestRegionCollectionError,
    },
    /// vm-memory's own error prints its source in its message as well, so
    /// only its text is kept (as the message), not the error as a source.
    #[error("cannot allocate {bytes} bytes of guest memory: {reason}")]
    Allocate { bytes: u64, reason: String },
    #[error("cannot allocate {bytes} bytes of guest memory: {what} does not fit the guest address space")]
    DoesNotFit { bytes: u64, what: &'static str },
}

/// Guest RAM: the regions KVM and the devices see, host-contiguous in
/// region order (so page `n` of RAM is at byte `n * 4096` of one mapping and
/// of a snapshot's memory file), and the mapping behind them when the VMM
/// made it itself.
pub struct GuestRam {
    pub(super) memory: GuestMemory,
    pub(super) mapping: Option<HostMapping>,
}

impl GuestRam {
    fn unowned(memory: GuestMemory) -> Self {
        GuestRam {
            memory,
            mapping: None,
        }
    }

    /// RAM of `len` bytes split around the MMIO hole over a new mapping
    /// (anonymous, or of `file`) that it owns.
    fn split_over_new_mapping(len: u64, file: Option<&std::fs::File>) -> Result<Self, MemoryError> {
        let mapping = HostMapping::map(len, file)?;
        // SAFETY: the mapping is read-write and lives in the returned value,
        // beside the memory over it (and the `Vm` drops it last).
        let memory = unsafe { split_guest_memory(mapping.ptr, len)? };
        Ok(GuestRam {
            memory,
            mapping: Some(mapping),
        })
    }
}

/// A mapping the VMM made for guest RAM larger than the space below the
/// MMIO hole; its regions point into it without owning it. Unmapped on drop.
pub(super) struct HostMapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value alone; the raw
// pointer is only used to unmap it on drop.
unsafe impl Send for HostMapping {}
// SAFETY: as above; `&HostMapping` gives no access to the memory.
unsafe impl Sync for HostMapping {}

impl Drop for HostMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` was mapped by `HostMapping::map` and is
        // unmapped once, here; the regions over it are gone (the `Vm` drops
        // its memory before this field).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl HostMapping {
    /// A private read-write mapping of `len` bytes: anonymous (zeros), or of
    /// `file` from its start (copy-on-write, read lazily).
    fn map(len: u64, file: Option<&std::fs::File>) -> Result<Self, MemoryError> {
        use std::os::fd::AsRawFd;
        let (flags, fd) = match file {
            Some(file) => (libc::MAP_PRIVATE | libc::MAP_NORESERVE, file.as_raw_fd()),
            None => (
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
            ),
        };
        // SAFETY: a new mapping at an address of the kernel's choosing; it
        // aliases nothing. `fd` is open for the duration of the call.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(MemoryError::Mmap {
                bytes: len,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(HostMapping {
            ptr: ptr.cast(),
            len: len as usize,
        })
    }
}

/// The host mapping of all guest RAM: its start and length. Every
/// `GuestMemory` this module builds is host-contiguous in region order (one
/// region, or two split from one mapping by `split_guest_memory`).
pub(super) fn host_ram(memory: &GuestMemory) -> (*mut u8, usize) {
    let mut regions = memory.iter();
    let Some(first) = regions.next() else {
        return (std::ptr::null_mut(), 0);
    };
    let mut len = first.len() as usize;
    for region in regions {
        debug_assert_eq!(region.as_ptr() as usize, first.as_ptr() as usize + len);
        len += region.len() as usize;
    }
    (first.as_ptr(), len)
}

/// Guest RAM over `len` bytes at `ptr`, split as `boot::ram_layout` says,
/// each region with a dirty bitmap.
///
/// # Safety
/// `ptr..ptr+len` must be a readable and writable mapping that stays valid
/// as long as the returned memory (and every clone of it) is in use.
unsafe fn split_guest_memory(ptr: *mut u8, len: u64) -> Result<GuestMemory, MemoryError> {
    let mut regions = Vec::new();
    for (guest_addr, host_offset, size) in boot::ram_layout(len) {
        // SAFETY: `host_offset + size <= len` by `ram_layout`, so the region
        // lies inside the caller's mapping, which outlives it.
        let region = unsafe {
            private_region_builder(size)
                .with_raw_mmap_pointer(ptr.add(host_offset as usize))
                .build()
        }
        .map_err(region_err(len, "a guest RAM region"))?;
        let region = vm_memory::GuestRegionMmap::new(region, GuestAddress(guest_addr)).ok_or(
            MemoryError::DoesNotFit {
                bytes: len,
                what: "a guest RAM region",
            },
        )?;
        regions.push(region);
    }
    GuestMemory::from_regions(regions).map_err(|source| MemoryError::Layout { bytes: len, source })
}

/// Guest RAM mapped private (copy-on-write) from a snapshot's memory file:
/// nothing is read up front; pages fault in from the file as the guest
/// touches them, and guest writes never reach the file.
pub fn memory_from_file(file: std::fs::File, len: u64) -> Result<GuestRam, MemoryError> {
    if len > boot::LOW_RAM_LIMIT {
        return GuestRam::split_over_new_mapping(len, Some(&file));
    }
    let region = private_region_builder(len)
        .with_file_offset(vm_memory::FileOffset::new(file, 0))
        .build()
        .map_err(region_err(len, "mapping the snapshot memory"))?;
    single_region_memory(region, len).map(GuestRam::unowned)
}

/// Fresh, zeroed guest RAM of `len` bytes.
pub(super) fn fresh_ram(len: u64) -> Result<GuestRam, MemoryError> {
    if len > boot::LOW_RAM_LIMIT {
        return GuestRam::split_over_new_mapping(len, None);
    }
    GuestMemory::from_ranges(&[(GuestAddress(0), len as usize)])
        .map(GuestRam::unowned)
        .map_err(|e| MemoryError::Allocate {
            bytes: len,
            reason: e.to_string(),
        })
}

/// Guest RAM over an existing mapping of `len` bytes at `ptr` (e.g. a
/// snapshot chain mapped private, base image plus overlays), with a dirty
/// bitmap like all guest RAM. The mapping is never unmapped: it must stay
/// valid for the rest of the process (a resumed session is its process's
/// guest for the process's lifetime).
///
/// # Safety
/// `ptr..ptr+len` must be a readable and writable mapping that nothing else
/// unmaps or reuses for the rest of the process.
pub unsafe fn memory_from_mapping(ptr: *mut u8, len: u64) -> Result<GuestRam, MemoryError> {
    if len > boot::LOW_RAM_LIMIT {
        // SAFETY: the caller guarantees the mapping is valid, read-write and
        // never unmapped.
        return unsafe { split_guest_memory(ptr, len) }.map(GuestRam::unowned);
    }
    // SAFETY: the caller guarantees the mapping is valid, PROT_READ|PROT_WRITE
    // and outlives the region (it is never unmapped).
    let region = unsafe {
        private_region_builder(len)
            .with_raw_mmap_pointer(ptr)
            .build()
    }
    .map_err(region_err(len, "adopting the snapshot memory"))?;
    single_region_memory(region, len).map(GuestRam::unowned)
}

/// Maps a failure to build a region (for `what`) of guest RAM of `bytes`
/// bytes to a [`MemoryError`].
fn region_err(
    bytes: u64,
    what: &'static str,
) -> impl FnOnce(vm_memory::mmap::MmapRegionError) -> MemoryError {
    move |source| MemoryError::Region {
        bytes,
        what,
        source,
    }
}

/// A private, read-write mapping of `len` bytes of snapshot memory, with a
/// dirty bitmap of its size: what the VMM writes is tracked.
fn private_region_builder(len: u64) -> vm_memory::mmap::MmapRegionBuilder<AtomicBitmap> {
    let bitmap = <AtomicBitmap as vm_memory::bitmap::NewBitmap>::with_len(len as usize);
    vm_memory::mmap::MmapRegionBuilder::new_with_bitmap(len as usize, bitmap)
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
}

/// Guest RAM made of `region` alone, at guest address 0.
fn single_region_memory(
    region: vm_memory::mmap::MmapRegion<AtomicBitmap>,
    len: u64,
) -> Result<GuestMemory, MemoryError> {
    let region = vm_memory::GuestRegionMmap::new(region, GuestAddress(0)).ok_or(
        MemoryError::DoesNotFit {
            bytes: len,
            what: "the snapshot memory",
        },
    )?;
    GuestMemory::from_regions(vec![region])
        .map_err(|source| MemoryError::Layout { bytes: len, source })
}
