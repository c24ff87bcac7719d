//! Finding the guest pages that may hold data without touching the others,
//! and hashing guest RAM by its contents.
//!
//! Touching a page the host never backed would fault it in (and for a
//! snapshot's file mapping, read it from disk), so every walk over RAM asks
//! /proc/self/pagemap and the snapshot file's data ranges first which pages
//! can be non-zero.

use super::memory::PAGE_SIZE;
use super::page_digest::{digest_of_sum, page_hash, PageHashes};
use devices::GuestMemory;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

/// How guest RAM is backed, which decides how pages are found for hashing.
pub(super) enum MemoryBacking {
    /// Fresh anonymous memory: a page the host never backed is zero.
    Anonymous,
    /// A private mapping of a snapshot's memory file: pages inside the file's
    /// data ranges may be non-zero even when not resident.
    File { data_ranges: Vec<(u64, u64)> },
}

/// The digest of guest RAM (see `page_digest`), and how many bytes of it
/// the host has backed.
///
/// Pages the host never backed (per /proc/self/pagemap) are zero by
/// construction and are skipped without being touched, and zero pages that
/// are backed add nothing, so the digest depends only on contents, never on
/// which pages the host happened to populate (transparent huge pages, read
/// faults). Cost is proportional to the memory the guest and VMM actually
/// touched.
pub(super) fn memory_hash_and_residency(mem: &GuestMemory, backing: &MemoryBacking) -> (u64, u64) {
    let mut sum = 0u64;
    let resident = scan_pages(mem, backing, |page, bytes| {
        sum = sum.wrapping_add(page_hash(page, bytes));
    });
    (digest_of_sum(sum), resident)
}

/// Every page's hash, to keep the digest up to date from changed pages
/// from now on, and the bytes of RAM the host has backed.
pub(super) fn page_hashes_and_residency(
    mem: &GuestMemory,
    backing: &MemoryBacking,
    ram_len: usize,
) -> (PageHashes, u64) {
    let mut hashes = PageHashes::zero(ram_len / PAGE_SIZE);
    let resident = scan_pages(mem, backing, |page, bytes| hashes.set(page, bytes));
    (hashes, resident)
}

/// How many bytes of guest RAM may be non-zero (as `scan_pages` counts
/// them), from the page tables alone: no page is touched.
pub(super) fn resident_bytes(mem: &GuestMemory, backing: &MemoryBacking) -> u64 {
    let base = mem
        .iter()
        .next()
        .map_or(std::ptr::null_mut(), |r| r.as_ptr());
    let pages: usize = mem
        .iter()
        .map(|region| {
            let (ptr, len) = (region.as_ptr(), region.len() as usize);
            let host_offset = (ptr as usize).wrapping_sub(base as usize) as u64;
            candidate_pages(ptr, len, host_offset, backing)
                .iter()
                .filter(|c| **c)
                .count()
        })
        .sum();
    (pages * PAGE_SIZE) as u64
}

/// Calls `visit` with the number (in the RAM's host mapping) and bytes of
/// every page that may be non-zero; returns how many bytes those are.
fn scan_pages(
    mem: &GuestMemory,
    backing: &MemoryBacking,
    mut visit: impl FnMut(u64, &[u8]),
) -> u64 {
    let mut resident_pages = 0u64;
    let base = mem
        .iter()
        .next()
        .map_or(std::ptr::null_mut(), |r| r.as_ptr());
    for region in mem.iter() {
        let (ptr, len) = (region.as_ptr(), region.len() as usize);
        let host_offset = (ptr as usize).wrapping_sub(base as usize) as u64;
        let first_page = host_offset / PAGE_SIZE as u64;
        let candidates = candidate_pages(ptr, len, host_offset, backing);
        // SAFETY: the region is part of the live guest RAM mapping, owned by
        // the session, which outlives this borrow; the vCPU is stopped
        // (callers hold the session), so nothing writes to it meanwhile.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        for (page, chunk) in flagged_pages(bytes, &candidates) {
            resident_pages += 1;
            visit(first_page + page as u64, chunk);
        }
    }
    resident_pages * PAGE_SIZE as u64
}

/// The pages of `bytes` whose flag is set, with their index, in order;
/// the other pages are not touched.
pub(super) fn flagged_pages<'a>(
    bytes: &'a [u8],
    flags: &'a [bool],
) -> impl Iterator<Item = (usize, &'a [u8])> + 'a {
    bytes
        .chunks_exact(PAGE_SIZE)
        .enumerate()
        .filter(|(page, _)| flags[*page])
}

/// Per page of `ptr..ptr+len` (guest RAM at `host_offset` of its host
/// mapping): whether it may be non-zero (the others are zero and are best
/// not touched).
pub(super) fn candidate_pages(
    ptr: *mut u8,
    len: usize,
    host_offset: u64,
    backing: &MemoryBacking,
) -> Vec<bool> {
    match backing {
        MemoryBacking::Anonymous => resident_pages_of(ptr, len),
        MemoryBacking::File { data_ranges } => {
            file_backed_candidates(ptr, len, host_offset, data_ranges)
        }
    }
}

/// Pages of an anonymous mapping the host has backed: present or swapped out
/// in /proc/self/pagemap (mincore would miss swapped pages); the others are
/// zero. If pagemap cannot be read, every page is a candidate.
fn resident_pages_of(ptr: *mut u8, len: usize) -> Vec<bool> {
    match pagemap_entries(ptr, len) {
        Some(entries) => entries
            .iter()
            .map(|e| e & (PAGEMAP_PRESENT | PAGEMAP_SWAPPED) != 0)
            .collect(),
        None => vec![true; len / PAGE_SIZE],
    }
}

const PAGEMAP_PRESENT: u64 = 1 << 63;
const PAGEMAP_SWAPPED: u64 = 1 << 62;
const PAGEMAP_FILE_OR_SHARED: u64 = 1 << 61;

/// This process's /proc/self/pagemap entries for the pages of `ptr..ptr+len`.
fn pagemap_entries(ptr: *mut u8, len: usize) -> Option<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let pages = len / PAGE_SIZE;
    let mut raw = vec![0u8; pages * 8];
    std::fs::File::open("/proc/self/pagemap")
        .and_then(|f| f.read_exact_at(&mut raw, (ptr as u64 / PAGE_SIZE as u64) * 8))
        .ok()?;
    Some(
        raw.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
            .collect(),
    )
}

/// Pages of a private file mapping that may be non-zero: those inside the
/// file's data ranges, and those the guest has written since the mapping was
/// made (present and anonymous in /proc/self/pagemap: copy-on-write copies).
/// Holes the guest never wrote are zero and are not touched (touching them
/// would fault each one in). If pagemap cannot be read, every page is a candidate.
fn file_backed_candidates(
    ptr: *mut u8,
    len: usize,
    host_offset: u64,
    data_ranges: &[(u64, u64)],
) -> Vec<bool> {
    let mut candidates = data_range_pages(len / PAGE_SIZE, host_offset, data_ranges);
    let Some(copies) = private_copies(ptr, len) else {
        return vec![true; len / PAGE_SIZE];
    };
    for (flag, copied) in candidates.iter_mut().zip(copies) {
        *flag |= copied;
    }
    candidates
}

/// Per page of a stretch of `pages` pages at byte `host_offset` of a file:
/// whether any of the file's data ranges (byte ranges, end exclusive)
/// touches it.
fn data_range_pages(pages: usize, host_offset: u64, data_ranges: &[(u64, u64)]) -> Vec<bool> {
    let mut flags = vec![false; pages];
    for &(start, end) in data_ranges {
        if end <= host_offset {
            continue;
        }
        let first = start.saturating_sub(host_offset) as usize / PAGE_SIZE;
        let last = (end.saturating_sub(host_offset) as usize).div_ceil(PAGE_SIZE);
        for flag in flags.iter_mut().take(last).skip(first) {
            *flag = true;
        }
    }
    flags
}

/// Per page of a private file mapping: whether it is a copy-on-write copy
/// (written since the mapping was made: present or swapped, anonymous in
/// /proc/self/pagemap). `None` if pagemap cannot be read.
pub(super) fn private_copies(ptr: *mut u8, len: usize) -> Option<Vec<bool>> {
    Some(
        pagemap_entries(ptr, len)?
            .iter()
            .map(|e| {
                e & (PAGEMAP_PRESENT | PAGEMAP_SWAPPED) != 0 && e & PAGEMAP_FILE_OR_SHARED == 0
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE as u64;

    #[test]
    fn data_ranges_flag_every_page_they_touch() {
        // One byte of page 1, and pages 3..=4 up to the middle of page 4.
        let flags = data_range_pages(6, 0, &[(P + 10, P + 11), (3 * P, 4 * P + 1)]);
        assert_eq!(flags, [false, true, false, true, true, false]);
    }

    #[test]
    fn data_ranges_are_taken_relative_to_the_host_offset() {
        // The stretch starts at page 4 of the file: a range before it is
        // ignored, one straddling its start flags its first page, and one
        // past its end flags nothing.
        let flags = data_range_pages(
            3,
            4 * P,
            &[(0, 4 * P), (3 * P + 5, 4 * P + 1), (10 * P, 11 * P)],
        );
        assert_eq!(flags, [true, false, false]);
    }

    #[test]
    fn flagged_pages_yields_only_flagged_pages_with_their_bytes() {
        let mut bytes = vec![0u8; 3 * PAGE_SIZE];
        bytes[PAGE_SIZE] = 7;
        bytes[2 * PAGE_SIZE] = 9;
        let seen: Vec<(usize, u8)> = flagged_pages(&bytes, &[false, true, true])
            .map(|(page, chunk)| (page, chunk[0]))
            .collect();
        assert_eq!(seen, [(1, 7), (2, 9)]);
    }

    #[test]
    fn anonymous_memory_is_hashed_by_content_not_residency() {
        // Two fresh memories, one with a page touched (read, so backed but
        // zero): the same hash, and the touched one counts a resident page.
        let fresh = |touch: bool| {
            let mem = GuestMemory::from_ranges(&[(vm_memory::GuestAddress(0), 4 * PAGE_SIZE)])
                .expect("guest memory");
            if touch {
                use vm_memory::Bytes;
                mem.write_obj(0u8, vm_memory::GuestAddress(P))
                    .expect("write");
            }
            memory_hash_and_residency(&mem, &MemoryBacking::Anonymous)
        };
        let (untouched, _) = fresh(false);
        let (touched, resident) = fresh(true);
        assert_eq!(untouched, touched);
        assert!(resident >= P, "the written page is resident");
    }
}
