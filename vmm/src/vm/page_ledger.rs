//! The page ledger a session keeps beside its RAM: the tree of in-place
//! checkpoints, the page hashes of the memory digest, and the pages an
//! outside reader of the dirty log has not heard of. The session holds it;
//! `checkpoint` feeds it from KVM's dirty log.

use super::kept_pages::CheckpointTree;
use super::page_digest::PageHashes;
use std::collections::BTreeSet;

/// What a session knows about its pages beyond the RAM itself: the tree of
/// checkpoints, the digest kept up to date, and who still has to hear of
/// pages changed. All are fed from the one dirty log.
#[derive(Default)]
pub(super) struct PageLedger {
    pub(super) tree: CheckpointTree,
    /// Every page's hash, once a digest was asked for with the log on.
    pub(super) hashes: Option<PageHashes>,
    /// Pages changed since `hashes` was last brought up to date.
    pub(super) unhashed: BTreeSet<u64>,
    /// Whether someone outside reads the log (`take_dirty_pages`: a
    /// snapshot chain) ...
    pub(super) outside_reader: bool,
    /// ... and then the pages changed that it has not heard of: read from
    /// the log by a checkpoint, reset or digest, or rewritten by a reset
    /// (which the log does not show).
    pub(super) unreported: BTreeSet<u64>,
}

impl PageLedger {
    /// The dirty log said these pages were written.
    pub(super) fn note_written(&mut self, pages: &[u64]) {
        self.tree.note_written(pages);
        if self.hashes.is_some() {
            self.unhashed.extend(pages);
        }
        if self.outside_reader {
            self.unreported.extend(pages);
        }
    }

    /// A reset rewrote these pages.
    pub(super) fn note_rewritten(&mut self, pages: &[u64]) {
        if self.hashes.is_some() {
            self.unhashed.extend(pages);
        }
        if self.outside_reader {
            self.unreported.extend(pages);
        }
    }
}
