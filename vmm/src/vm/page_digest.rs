//! The digest of guest RAM, defined so it can be kept up to date from the
//! pages that changed: the sum (mod 2^64) over the non-zero pages of a
//! 64-bit hash of the page's number and bytes. A zero page adds nothing, so
//! the digest depends on contents only, never on which pages the host
//! happened to back; and replacing a page's bytes changes the sum by the
//! difference of its two hashes, so after a branch it costs the pages
//! written, not all of RAM.

use super::memory::PAGE_SIZE;

/// The digest of RAM whose every page is zero (an offset, so that such RAM
/// does not hash to `record::NO_HASH`).
const EMPTY_RAM: u64 = 0x6465_7476_6973_6f72;

/// What page `page` (its number in the RAM's host mapping) adds to the sum.
pub(super) fn page_hash(page: u64, bytes: &[u8]) -> u64 {
    if bytes.iter().all(|b| *b == 0) {
        return 0;
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(bytes, page)
}

/// The digest of RAM whose page hashes sum to `sum`.
pub(super) fn digest_of_sum(sum: u64) -> u64 {
    EMPTY_RAM.wrapping_add(sum)
}

/// Every page's hash and their sum, kept up to date page by page.
pub(super) struct PageHashes {
    per_page: Vec<u64>,
    sum: u64,
}

impl PageHashes {
    /// For RAM of `pages` pages, all zero so far.
    pub(super) fn zero(pages: usize) -> Self {
        PageHashes {
            per_page: vec![0; pages],
            sum: 0,
        }
    }

    /// `page` holds `bytes` now (pages beyond the RAM are ignored).
    pub(super) fn set(&mut self, page: u64, bytes: &[u8]) {
        debug_assert_eq!(bytes.len(), PAGE_SIZE);
        let Some(slot) = self.per_page.get_mut(page as usize) else {
            return;
        };
        let new = page_hash(page, bytes);
        self.sum = self.sum.wrapping_sub(*slot).wrapping_add(new);
        *slot = new;
    }

    pub(super) fn digest(&self) -> u64 {
        digest_of_sum(self.sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_digest(ram: &[u8]) -> u64 {
        digest_of_sum(
            ram.chunks_exact(PAGE_SIZE)
                .enumerate()
                .map(|(p, bytes)| page_hash(p as u64, bytes))
                .fold(0u64, u64::wrapping_add),
        )
    }

    #[test]
    fn kept_up_to_date_page_by_page_it_equals_the_full_digest() {
        let pages = 16;
        let mut ram = vec![0u8; pages * PAGE_SIZE];
        let mut hashes = PageHashes::zero(pages);
        assert_eq!(hashes.digest(), full_digest(&ram));
        let mut state = 0x1234_5678u64;
        for step in 0..200u64 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let page = (state >> 33) as usize % pages;
            let at = page * PAGE_SIZE + (state >> 20) as usize % PAGE_SIZE;
            // Some writes zero a page whole again.
            if step % 7 == 0 {
                ram[page * PAGE_SIZE..][..PAGE_SIZE].fill(0);
            } else {
                ram[at] = (state >> 8) as u8;
            }
            hashes.set(page as u64, &ram[page * PAGE_SIZE..][..PAGE_SIZE]);
            assert_eq!(hashes.digest(), full_digest(&ram), "after step {step}");
        }
    }

    #[test]
    fn the_digest_depends_on_where_the_bytes_are() {
        let mut one = vec![0u8; 2 * PAGE_SIZE];
        let mut other = one.clone();
        one[0] = 1;
        other[PAGE_SIZE] = 1;
        assert_ne!(full_digest(&one), full_digest(&other));
        // Zero pages add nothing: a longer all-zero RAM hashes the same.
        assert_eq!(
            full_digest(&[0; PAGE_SIZE]),
            full_digest(&[0; 3 * PAGE_SIZE])
        );
        assert_ne!(full_digest(&[0; PAGE_SIZE]), crate::record::NO_HASH);
    }

    /// The cost of the two ways on 256 MiB with a quarter of the pages
    /// non-zero: a whole scan, and bringing the digest up to date after a
    /// branch dirtied 500 pages (`cargo test --release -p vmm -- --ignored
    /// --nocapture digest_costs`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn digest_costs() {
        let pages = 65536;
        let mut ram = vec![0u8; pages * PAGE_SIZE];
        for p in (0..pages).step_by(4) {
            ram[p * PAGE_SIZE..][..PAGE_SIZE].fill(p as u8 | 1);
        }
        let t = std::time::Instant::now();
        let full = full_digest(&ram);
        let scan = t.elapsed();
        let mut hashes = PageHashes::zero(pages);
        for p in 0..pages {
            hashes.set(p as u64, &ram[p * PAGE_SIZE..][..PAGE_SIZE]);
        }
        assert_eq!(hashes.digest(), full);
        for p in (0..pages).step_by(131).take(500) {
            ram[p * PAGE_SIZE] ^= 0x5a;
        }
        let t = std::time::Instant::now();
        for p in (0..pages).step_by(131).take(500) {
            hashes.set(p as u64, &ram[p * PAGE_SIZE..][..PAGE_SIZE]);
        }
        let incremental = t.elapsed();
        assert_eq!(hashes.digest(), full_digest(&ram));
        eprintln!("whole scan {scan:?}, 500 dirtied pages {incremental:?}");
    }
}
