//! Guest memory for `bench snapshot`: page counts (zero, resident, copy-on-write), staging a 9p
//! memory file into a memfd, the full-copy baseline, and the memory-only revert.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Sequential writes of the full-copy baseline.
const FULL_COPY_CHUNK: usize = 8 << 20;

/// The page size.
pub const PAGE: usize = 4096;

/// Host-side memory revert, no KVM involved: write one byte into each of `pages` file-backed
/// pages of a MAP_PRIVATE mapping of the snapshot's memory.img (copy-on-write faults), then
/// `madvise(MADV_DONTNEED)` each page (drops the copies: the mapping reads the file again).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct MemRevert {
    pub pages: u64,
    pub iterations: u32,
    pub per_reset_us: f64,
    pub per_sec: f64,
    pub content_restored: bool,
}

/// Copies the data ranges of a 9p-backed memory file into a memfd with large reads: the same
/// staging `snapshots::restore` (used by `branch` and `seek`) does before mapping.
pub fn stage_in_memfd(file: &fs::File, len: u64, ranges: &[(u64, u64)]) -> Result<fs::File> {
    use std::os::unix::fs::FileExt;
    // SAFETY: the name is a valid NUL-terminated string; the fd is checked, then owned below.
    let fd = unsafe { libc::memfd_create(c"detvisor-bench-memory".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error()).context("memfd_create");
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let staged = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    staged.set_len(len)?;
    let mut buf = vec![0u8; 1 << 20];
    for &(start, end) in ranges {
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            file.read_exact_at(&mut buf[..n], at)?;
            staged.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
    }
    Ok(staged)
}

/// The snapshot crate's zero test (OR-folding 256-byte blocks).
fn page_is_zero(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(256);
    for c in &mut chunks {
        if c.iter().fold(0u8, |a, &b| a | b) != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == 0)
}

pub fn nonzero_pages(mem: &[u8]) -> u64 {
    mem.chunks(PAGE).filter(|p| !page_is_zero(p)).count() as u64
}

/// Pages of `mem` the host has backed (mincore).
pub fn resident_pages(mem: &[u8]) -> Option<u64> {
    let mut v = vec![0u8; mem.len().div_ceil(PAGE)];
    // SAFETY: `mem` is a live, page-aligned mapping (guest RAM) of `mem.len()` bytes and `v`
    // has one byte per page, as mincore(2) requires; nothing is written to `mem`.
    let rc = unsafe { libc::mincore(mem.as_ptr() as *mut libc::c_void, mem.len(), v.as_mut_ptr()) };
    (rc == 0).then(|| v.iter().filter(|b| *b & 1 != 0).count() as u64)
}

/// Pages of a private file mapping `mem` that are anonymous copies now (present, neither
/// file-backed nor shared, per /proc/self/pagemap): the pages written since it was mapped.
pub fn cow_pages(mem: &[u8]) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    const PRESENT: u64 = 1 << 63;
    const FILE_OR_SHARED: u64 = 1 << 61;
    let pages = mem.len() / PAGE;
    let mut entries = vec![0u8; pages * 8];
    fs::File::open("/proc/self/pagemap")?
        .read_exact_at(&mut entries, (mem.as_ptr() as u64 / PAGE as u64) * 8)?;
    Ok(entries
        .chunks_exact(8)
        .map(|e| u64::from_le_bytes(e.try_into().expect("8-byte chunk")))
        .filter(|e| e & PRESENT != 0 && e & FILE_OR_SHARED == 0)
        .count() as u64)
}

/// The baseline: all of `mem` into a new file at `path` with large sequential writes, fsync.
/// The file is removed afterwards (not timed).
pub fn full_copy(mem: &[u8], path: &Path) -> io::Result<Duration> {
    let started = Instant::now();
    let mut f = fs::File::create(path)?;
    for chunk in mem.chunks(FULL_COPY_CHUNK) {
        f.write_all(chunk)?;
    }
    f.sync_all()?;
    let took = started.elapsed();
    drop(f);
    fs::remove_file(path)?;
    Ok(took)
}

/// An mmap, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing refers to it any more.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

/// See [`MemRevert`].
pub fn memory_revert(dir: &Path, pages: u64, iterations: u32) -> Result<MemRevert> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let (file, len) = snapshot::memory_file(dir)?;
    let stored: Vec<u64> = snapshot::memory_chain(dir)?
        .iter()
        .flat_map(|l| l.runs.iter().flat_map(|r| r.first..r.first + r.count))
        .collect();
    if stored.is_empty() {
        bail!("the snapshot stores no pages");
    }
    let n = (pages as usize).min(stored.len());
    let picks: Vec<usize> = (0..n)
        .map(|i| stored[i * stored.len() / n] as usize)
        .collect();
    let len = usize::try_from(len)?;
    // SAFETY: a new private mapping of `len` bytes of an open file; checked below and owned by
    // `Mapping`, which unmaps it.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_NORESERVE,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error()).context("mmap of memory.img");
    }
    let map = Mapping {
        ptr: ptr as *mut u8,
        len,
    };
    // Every `p` is a page index from the snapshot's index, so `p * PAGE` lies inside the
    // `len`-byte mapping `map`, which lives until the end of this function. Accesses are
    // volatile because the contents change under us (MADV_DONTNEED).
    // SAFETY: the offset stays inside the mapping (above).
    let at = |p: usize| unsafe { map.ptr.add(p * PAGE) };
    for &p in &picks {
        // SAFETY: see above.
        unsafe { std::ptr::read_volatile(at(p)) };
    }
    let t = Instant::now();
    for _ in 0..iterations {
        for &p in &picks {
            // SAFETY: see above.
            unsafe {
                let v = std::ptr::read_volatile(at(p));
                std::ptr::write_volatile(at(p), !v);
            }
        }
        for &p in &picks {
            // SAFETY: a page-aligned, page-long range of our own private mapping.
            let rc =
                unsafe { libc::madvise(at(p) as *mut libc::c_void, PAGE, libc::MADV_DONTNEED) };
            if rc != 0 {
                return Err(io::Error::last_os_error()).context("madvise(MADV_DONTNEED)");
            }
        }
    }
    let took = t.elapsed();
    let mut want = vec![0u8; PAGE];
    file.read_exact_at(&mut want, (picks[0] * PAGE) as u64)?;
    // SAFETY: one page of the mapping, read while nothing writes it.
    let have = unsafe { std::slice::from_raw_parts(at(picks[0]), PAGE) };
    let content_restored = have == want.as_slice();
    drop(map);
    let per_reset = took.as_secs_f64() / f64::from(iterations.max(1));
    Ok(MemRevert {
        pages: n as u64,
        iterations,
        per_reset_us: per_reset * 1e6,
        per_sec: if per_reset > 0.0 {
            1.0 / per_reset
        } else {
            0.0
        },
        content_restored,
    })
}
