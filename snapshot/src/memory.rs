//! Guest RAM on disk: the sparse `memory.img`, its page index `memory.idx`, hole discovery with
//! SEEK_DATA/SEEK_HOLE, and copy-on-write mappings of a (chain of) image(s).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::ptr::NonNull;

use crate::error::{io, Result, SnapshotError};
use crate::frame::CRC64;
use crate::PAGE_SIZE;

const PAGE: usize = PAGE_SIZE as usize;

/// A run of consecutive guest pages: pages `first .. first + count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageRun {
    /// The first page number (guest-physical offset / 4096).
    pub first: u64,
    /// How many pages; never 0.
    pub count: u64,
}

impl PageRun {
    /// Byte range `[start, end)` in the memory image.
    pub fn byte_range(&self) -> (u64, u64) {
        (
            self.first * PAGE_SIZE,
            (self.first + self.count) * PAGE_SIZE,
        )
    }
}

/// The decoded `memory.idx` payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PageIndex {
    pub ram_bytes: u64,
    /// CRC-64/XZ over the bytes of every page in `runs`, in order.
    pub data_crc: u64,
    /// Full snapshot: the non-zero pages. Incremental: the dirty pages (zero or not).
    pub runs: Vec<PageRun>,
}

impl PageIndex {
    pub fn pages(&self) -> u64 {
        self.runs.iter().map(|r| r.count).sum()
    }

    /// `memory.idx` payload: page size, ram_bytes, data CRC, run count, then (first, count)
    /// pairs; all u64 LE.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + 16 * self.runs.len());
        for v in [
            PAGE_SIZE,
            self.ram_bytes,
            self.data_crc,
            self.runs.len() as u64,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for r in &self.runs {
            out.extend_from_slice(&r.first.to_le_bytes());
            out.extend_from_slice(&r.count.to_le_bytes());
        }
        out
    }

    pub fn decode(path: &Path, payload: &[u8]) -> Result<PageIndex> {
        let bad = |reason: String| SnapshotError::CorruptIndex {
            path: path.to_owned(),
            reason,
        };
        if payload.len() < 32 || !(payload.len() - 32).is_multiple_of(16) {
            return Err(bad(format!(
                "payload of {} bytes is not 32 + 16*n",
                payload.len()
            )));
        }
        let words: Vec<u64> = payload
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let (page_size, ram_bytes, data_crc, n) = (words[0], words[1], words[2], words[3]);
        if page_size != PAGE_SIZE {
            return Err(bad(format!("page size {page_size}, expected {PAGE_SIZE}")));
        }
        if n != (words.len() as u64 - 4) / 2 {
            return Err(bad(format!(
                "says {n} runs but holds {}",
                (words.len() - 4) / 2
            )));
        }
        let npages = ram_bytes / PAGE_SIZE;
        let mut runs = Vec::with_capacity(n as usize);
        let mut next_free = 0u64;
        for pair in words[4..].chunks_exact(2) {
            let (first, count) = (pair[0], pair[1]);
            let end = first.checked_add(count).filter(|&e| e <= npages);
            match end {
                Some(end) if count > 0 && first >= next_free => {
                    runs.push(PageRun { first, count });
                    next_free = end;
                }
                _ => {
                    return Err(bad(format!(
                        "run of {count} pages at page {first} is empty, overlapping, unsorted or beyond {npages} pages"
                    )))
                }
            }
        }
        Ok(PageIndex {
            ram_bytes,
            data_crc,
            runs,
        })
    }
}

/// Whether a page (or any slice) is all zero bytes. Vectorises well: OR-reduces 256-byte blocks.
pub(crate) fn is_zero(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(256);
    for c in &mut chunks {
        if c.iter().fold(0u8, |a, &b| a | b) != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == 0)
}

/// Coalesces ascending page numbers into runs.
fn coalesce(pages: impl IntoIterator<Item = u64>) -> Vec<PageRun> {
    let mut runs: Vec<PageRun> = Vec::new();
    for p in pages {
        match runs.last_mut() {
            Some(r) if r.first + r.count == p => r.count += 1,
            _ => runs.push(PageRun { first: p, count: 1 }),
        }
    }
    runs
}

/// The runs of non-zero pages of `memory`.
pub(crate) fn nonzero_runs(memory: &[u8]) -> Vec<PageRun> {
    coalesce(
        memory
            .chunks(PAGE)
            .enumerate()
            .filter(|(_, p)| !is_zero(p))
            .map(|(i, _)| i as u64),
    )
}

/// Sorts, dedups and range-checks caller-supplied dirty page numbers.
pub(crate) fn dirty_runs(dirty_pages: &[u64], npages: u64) -> Result<Vec<PageRun>> {
    let mut pages = dirty_pages.to_vec();
    pages.sort_unstable();
    pages.dedup();
    if let Some(&p) = pages.last().filter(|&&p| p >= npages) {
        return Err(SnapshotError::InvalidArgument(format!(
            "dirty page {p} is beyond the {npages} pages of guest RAM"
        )));
    }
    Ok(coalesce(pages))
}

/// Creates the sparse `memory.img` of `memory.len()` bytes holding the non-zero pages within
/// `runs` (everything else is a hole), fsyncs it, and returns the CRC-64/XZ of all pages in
/// `runs`.
pub(crate) fn write_image(path: &Path, memory: &[u8], runs: &[PageRun]) -> Result<u64> {
    let f = File::create(path).map_err(io(path, "create"))?;
    f.set_len(memory.len() as u64)
        .map_err(io(path, "set_len"))?;
    let mut digest = CRC64.digest();
    for run in runs {
        let (start, end) = run.byte_range();
        let bytes = &memory[start as usize..end as usize];
        digest.update(bytes);
        // Write maximal non-zero sub-runs; zero pages stay holes.
        let mut pages = bytes.chunks(PAGE).enumerate().peekable();
        while let Some((i, p)) = pages.next() {
            if is_zero(p) {
                continue;
            }
            let mut j = i + 1;
            while pages.peek().is_some_and(|(_, q)| !is_zero(q)) {
                pages.next();
                j += 1;
            }
            f.write_all_at(&bytes[i * PAGE..j * PAGE], start + (i * PAGE) as u64)
                .map_err(io(path, "write"))?;
        }
    }
    f.sync_all().map_err(io(path, "fsync"))?;
    Ok(digest.finalize())
}

/// The byte ranges `[start, end)` of `file` that hold data, found with `lseek(SEEK_DATA)` /
/// `lseek(SEEK_HOLE)`; everything outside them reads as zeros. Granularity is the file
/// system's (4 KiB on ext4/xfs/btrfs). If the file system cannot answer, the whole file is
/// returned as one range: the answer is always a superset of the non-zero bytes.
pub fn data_ranges(file: &File) -> Vec<(u64, u64)> {
    let len = match file.metadata() {
        Ok(m) => m.len(),
        Err(_) => return Vec::new(),
    };
    let whole = if len > 0 { vec![(0, len)] } else { Vec::new() };
    let fd = file.as_raw_fd();
    let seek = |off: u64, whence: libc::c_int| -> std::io::Result<Option<u64>> {
        // SAFETY: lseek on a file descriptor that `file` keeps open; it touches no memory.
        // Only the file offset changes, which no code here relies on (we use pread/pwrite).
        let r = unsafe { libc::lseek(fd, off as libc::off_t, whence) };
        if r >= 0 {
            Ok(Some(r as u64))
        } else {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                Ok(None)
            } else {
                Err(e)
            }
        }
    };
    let mut out = Vec::new();
    let mut off = 0u64;
    while off < len {
        let start = match seek(off, libc::SEEK_DATA) {
            Ok(Some(s)) => s,
            Ok(None) => break,
            Err(_) => return whole,
        };
        let end = match seek(start, libc::SEEK_HOLE) {
            Ok(Some(e)) => e.min(len),
            Ok(None) => len,
            Err(_) => return whole,
        };
        if end <= start {
            break;
        }
        out.push((start, end));
        off = end;
    }
    out
}

/// Rounds ranges out to whole pages, clamps them to `limit`, and merges.
pub(crate) fn page_align(ranges: &[(u64, u64)], limit: u64) -> Vec<(u64, u64)> {
    let v: Vec<(u64, u64)> = ranges
        .iter()
        .map(|&(s, e)| {
            (
                s / PAGE_SIZE * PAGE_SIZE,
                e.div_ceil(PAGE_SIZE).saturating_mul(PAGE_SIZE).min(limit),
            )
        })
        .filter(|&(s, e)| s < e)
        .collect();
    union(&v, &[])
}

/// Union of two sorted lists of disjoint half-open ranges.
pub(crate) fn union(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = a.iter().chain(b).copied().filter(|(s, e)| s < e).collect();
    all.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (s, e) in all {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Intersection of two sorted lists of disjoint half-open ranges.
pub(crate) fn intersect(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let s = a[i].0.max(b[j].0);
        let e = a[i].1.min(b[j].1);
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// `a` minus `b`, both sorted lists of disjoint half-open ranges.
pub(crate) fn subtract(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(mut s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < e {
            if b[k].0 > s {
                out.push((s, b[k].0));
            }
            s = s.max(b[k].1);
            k += 1;
        }
        if s < e {
            out.push((s, e));
        }
    }
    out
}

/// An owned, private (copy-on-write) mapping of a snapshot's guest RAM, readable and writable.
///
/// Pages are read from the snapshot's files lazily, on first touch; a write copies the page
/// into anonymous memory and never reaches the file. Unmapped on drop.
///
/// The snapshot's files must not be truncated or rewritten while mapped (snapshots are
/// immutable; removing the directory is fine, the kernel keeps the inodes).
#[derive(Debug)]
pub struct MappedMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: MappedMemory exclusively owns its mapping (no other handle to it exists unless
// `into_raw` gave it away, which consumes self), and the mapping is plain memory usable from any
// thread; `&self` access only reads through it.
unsafe impl Send for MappedMemory {}
// SAFETY: see Send: shared references only allow reads (`as_slice`, `as_ptr`).
unsafe impl Sync for MappedMemory {}

impl MappedMemory {
    /// The host address of guest RAM byte 0 (for KVM_SET_USER_MEMORY_REGION, use
    /// `as_mut_ptr` or `into_raw`).
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The host address of guest RAM byte 0, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes (= ram_bytes).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: snapshots have at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The whole of guest RAM. Touching every byte faults every page in: use `memory_data_ranges`
    /// to visit only the pages that may be non-zero.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a live readable mapping owned by self for self's lifetime; its
        // bytes are initialised (file contents or zeros); `&self` prevents writes through
        // `as_mut_slice` meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole of guest RAM, writable (copy-on-write: the files are never changed).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the mapping is PROT_WRITE; `&mut self` makes this the only
        // reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Gives up ownership: returns (address, length); the caller must `munmap` it.
    pub fn into_raw(self) -> (*mut u8, usize) {
        let me = std::mem::ManuallyDrop::new(self);
        (me.ptr.as_ptr(), me.len)
    }
}

impl Drop for MappedMemory {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly the mapping created in `map_layers`, owned by self and
        // unmapped only here; no references into it outlive self (slices borrow self).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// One layer to map: a memory image and, for an overlay, the runs to take from it.
pub(crate) struct MapLayer<'a> {
    pub path: &'a Path,
    pub file: &'a File,
    pub runs: &'a [PageRun],
}

/// Maps `base` whole (MAP_PRIVATE) and then each overlay's runs on top of it, in order: with
/// MAP_FIXED mappings of the overlay file while the total number of overlay mappings stays
/// within `max_overlay_maps`, and by copying the runs in (pread) beyond that, so that a long
/// chain of fragmented deltas cannot exhaust `vm.max_map_count`.
pub(crate) fn map_layers(
    base: &MapLayer<'_>,
    overlays: &[MapLayer<'_>],
    len: u64,
    max_overlay_maps: usize,
) -> Result<MappedMemory> {
    let ulen = usize::try_from(len).map_err(|_| {
        SnapshotError::InvalidArgument(format!("{len} bytes do not fit the address space"))
    })?;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_NORESERVE;
    // SAFETY: a fresh mapping chosen by the kernel (addr NULL, no MAP_FIXED), so it overlaps no
    // existing Rust object; the fd is open for the duration of the call; len > 0 and the file
    // is exactly len bytes long (checked by the caller), so no access can run past EOF (SIGBUS).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            ulen,
            prot,
            flags,
            base.file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io(base.path, "mmap")(std::io::Error::last_os_error()));
    }
    let mut mem = MappedMemory {
        ptr: NonNull::new(p.cast()).expect("mmap never returns NULL without MAP_FIXED"),
        len: ulen,
    };
    let mut budget = max_overlay_maps;
    for layer in overlays {
        if layer.runs.len() <= budget {
            budget -= layer.runs.len();
            for run in layer.runs {
                let (start, end) = run.byte_range();
                let (off, n) = (start as usize, (end - start) as usize);
                // SAFETY: [off, off+n) lies inside `mem`'s mapping (runs are checked against
                // ram_bytes when the index is decoded), which `mem` owns exclusively and no
                // reference currently points into; MAP_FIXED atomically replaces those pages
                // with a private mapping of the same range of the overlay file, which is also
                // exactly `len` bytes long.
                let q = unsafe {
                    libc::mmap(
                        mem.as_mut_ptr().add(off).cast(),
                        n,
                        prot,
                        flags | libc::MAP_FIXED,
                        layer.file.as_raw_fd(),
                        start as libc::off_t,
                    )
                };
                if q == libc::MAP_FAILED {
                    return Err(io(layer.path, "mmap (overlay)")(
                        std::io::Error::last_os_error(),
                    ));
                }
            }
        } else {
            budget = 0;
            let dst = mem.as_mut_slice();
            for run in layer.runs {
                let (start, end) = run.byte_range();
                layer
                    .file
                    .read_exact_at(&mut dst[start as usize..end as usize], start)
                    .map_err(io(layer.path, "read (overlay)"))?;
            }
        }
    }
    Ok(mem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_ops() {
        let a = [(0, 10), (20, 30), (40, 50)];
        let b = [(5, 25), (45, 60)];
        assert_eq!(union(&a, &b), vec![(0, 30), (40, 60)]);
        assert_eq!(intersect(&a, &b), vec![(5, 10), (20, 25), (45, 50)]);
        assert_eq!(subtract(&a, &b), vec![(0, 5), (25, 30), (40, 45)]);
        assert_eq!(
            subtract(&[(0, 100)], &[(10, 20), (30, 40)]),
            vec![(0, 10), (20, 30), (40, 100)]
        );
        assert_eq!(subtract(&[(10, 20)], &[(0, 100)]), vec![]);
        assert_eq!(page_align(&[(1, 2), (4095, 4097)], 8192), vec![(0, 8192)]);
    }

    #[test]
    fn runs_and_zero_detection() {
        let mut m = vec![0u8; 10 * PAGE];
        m[PAGE + 7] = 1;
        m[2 * PAGE] = 1;
        m[9 * PAGE + PAGE - 1] = 1;
        assert!(is_zero(&m[..PAGE]));
        assert!(!is_zero(&m[PAGE..2 * PAGE]));
        assert_eq!(
            nonzero_runs(&m),
            vec![
                PageRun { first: 1, count: 2 },
                PageRun { first: 9, count: 1 }
            ]
        );
        assert_eq!(
            dirty_runs(&[3, 1, 2, 2, 7], 10).unwrap(),
            vec![
                PageRun { first: 1, count: 3 },
                PageRun { first: 7, count: 1 }
            ]
        );
        assert!(matches!(
            dirty_runs(&[10], 10),
            Err(SnapshotError::InvalidArgument(_))
        ));
    }

    #[test]
    fn index_round_trip_and_rejects_overlap() {
        let idx = PageIndex {
            ram_bytes: 16 * PAGE_SIZE,
            data_crc: 42,
            runs: vec![
                PageRun { first: 0, count: 2 },
                PageRun {
                    first: 5,
                    count: 11,
                },
            ],
        };
        let p = Path::new("memory.idx");
        assert_eq!(PageIndex::decode(p, &idx.encode()).unwrap(), idx);
        let mut bad = idx.clone();
        bad.runs[1].first = 1;
        assert!(matches!(
            PageIndex::decode(p, &bad.encode()),
            Err(SnapshotError::CorruptIndex { .. })
        ));
        bad.runs[1] = PageRun {
            first: 5,
            count: 12,
        };
        assert!(matches!(
            PageIndex::decode(p, &bad.encode()),
            Err(SnapshotError::CorruptIndex { .. })
        ));
    }

    #[test]
    fn crc_is_xz() {
        assert_eq!(CRC64.checksum(b"123456789"), 0x995d_c9bb_df19_39fa);
    }
}
