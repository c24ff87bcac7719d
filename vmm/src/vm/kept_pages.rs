//! The memory bookkeeping of in-place checkpoints, over plain data: the tree
//! of kept moments, the pages each one keeps, and what moving the live RAM
//! from one moment to another copies back or returns to the backing.
//!
//! Every checkpoint is a node whose parent is the checkpoint the live RAM
//! descended from when it was taken (the one last taken or reset to). A node
//! keeps its own bytes of the pages written between its parent and it (the
//! root: the pages that differ from the backing); the bytes of any page at
//! any node are those of the nearest node on its way to the root that keeps
//! the page, else the backing's. Moving the live RAM from its present (a
//! node X plus the pages written since X) to a node Y rewrites only the
//! pages written since X and those kept on the path X → common ancestor → Y.
//!
//! Nothing here touches KVM or the guest's mapping directly: guest RAM is
//! reached through [`GuestPages`], so the rules can be tested over byte
//! buffers.

use super::memory::PAGE_SIZE;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use thiserror::Error;

/// A checkpoint cannot be taken, returned to or released.
#[derive(Debug, Error)]
pub enum CheckpointError {
    #[error("dirty pages were asked for, but dirty logging was never started")]
    DirtyLogOff,
    #[error(
        "this checkpoint is not one of the session's (it was released, or is of another session)"
    )]
    StaleCheckpoint,
    #[error("keeping this checkpoint needs {needed} more bytes of kept pages, but {held} of the budget of {budget} bytes are held: release a checkpoint or raise the budget")]
    OverBudget { held: u64, needed: u64, budget: u64 },
    #[error("returning guest page {page} to its checkpoint")]
    ResetPage {
        page: u64,
        #[source]
        source: std::io::Error,
    },
}

/// What one in-place reset did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ResetStats {
    /// Pages written since the present's checkpoint, or kept on the way to
    /// the target, copied back from the checkpoints that keep them ...
    pub pages_copied: u64,
    /// ... and returned to the backing's page instead (the snapshot file's,
    /// or zeros: what they were at the checkpoint), which the tree's root
    /// keeps from now on.
    pub pages_fetched: u64,
}

/// How much host memory a session's checkpoints hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMemory {
    /// Checkpoints that can be reset to (taken and not released).
    pub checkpoints: u64,
    /// Nodes of the tree, including released ones still needed by others
    /// (a shared ancestor, the present's own).
    pub nodes: u64,
    /// Pages kept over all nodes ...
    pub pages: u64,
    /// ... and their bytes.
    pub bytes: u64,
    /// The most `bytes` may grow to (`None`: no limit).
    pub budget: Option<u64>,
}

/// Guest RAM as a reset sees it: pages to read, overwrite, or hand back to
/// the backing.
pub(super) trait GuestPages {
    /// Bytes of RAM (a whole number of pages).
    fn len(&self) -> usize;
    /// The current bytes of `page`.
    fn page(&self, page: u64) -> &[u8];
    /// Overwrites `page` with `bytes` (one page).
    fn write_page(&mut self, page: u64, bytes: &[u8]);
    /// Drops the private copy of `page`, so it reads as the backing's page
    /// again (the snapshot file's, or zeros).
    fn discard(&mut self, page: u64) -> std::io::Result<()>;
}

/// Which pages a new root keeps a copy of, per page of RAM.
pub(super) enum InitialPages<'a> {
    /// Every flagged page, zero or not: a restored session's private copies
    /// (a page the guest zeroed differs from the file's).
    Flagged(&'a [bool]),
    /// The flagged pages that are non-zero: fresh memory, where the backing
    /// gives back zeros for every other page.
    FlaggedNonZero(&'a [bool]),
}

/// A node of the tree: unique in the process, so a checkpoint of another
/// session is never taken for one of this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct NodeId(u64);

/// Source of `NodeId`s.
static NEXT_NODE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

struct Node {
    parent: Option<NodeId>,
    children: Vec<NodeId>,
    /// Released by its owner: kept only while others need its pages.
    released: bool,
    /// Its bytes of the pages written between its parent and it (the root:
    /// of the pages that differ from the backing's).
    pages: BTreeMap<u64, Box<[u8]>>,
}

/// A session's kept moments and where its live RAM is among them.
pub(super) struct CheckpointTree {
    /// Length of the guest RAM the checkpoints are of.
    ram_len: usize,
    nodes: HashMap<NodeId, Node>,
    /// The node the live RAM descends from (last taken or reset to); `None`
    /// while the tree is empty.
    base: Option<NodeId>,
    /// Pages written since `base` (as far as the dirty log told so far).
    since_base: BTreeSet<u64>,
    budget: Option<u64>,
    pages_held: u64,
}

impl Default for CheckpointTree {
    fn default() -> Self {
        CheckpointTree::new(0)
    }
}

impl CheckpointTree {
    /// An empty tree (its root fixes the RAM's length).
    pub(super) fn new(ram_len: usize) -> Self {
        CheckpointTree {
            ram_len,
            nodes: HashMap::new(),
            base: None,
            since_base: BTreeSet::new(),
            budget: None,
            pages_held: 0,
        }
    }

    /// Whether no checkpoint is kept (the next one is a root).
    pub(super) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The pages the dirty log reported as written: the present moved
    /// further from its checkpoint.
    pub(super) fn note_written(&mut self, pages: &[u64]) {
        if self.base.is_some() {
            self.since_base.extend(pages);
        }
    }

    /// The most bytes of kept pages from now on (`None`: no limit); a
    /// checkpoint that would pass it is refused.
    pub(super) fn set_budget(&mut self, budget: Option<u64>) {
        self.budget = budget;
    }

    pub(super) fn memory(&self) -> CheckpointMemory {
        CheckpointMemory {
            checkpoints: self.nodes.values().filter(|n| !n.released).count() as u64,
            nodes: self.nodes.len() as u64,
            pages: self.pages_held,
            bytes: self.pages_held * PAGE_SIZE as u64,
            budget: self.budget,
        }
    }

    /// Pages `node` keeps itself (those written between its parent and it).
    pub(super) fn pages_of(&self, node: NodeId) -> u64 {
        self.nodes.get(&node).map_or(0, |n| n.pages.len() as u64)
    }

    fn in_ram(&self, page: u64) -> bool {
        (page as usize + 1) * PAGE_SIZE <= self.ram_len
    }

    fn check_budget(&self, new_pages: u64) -> Result<(), CheckpointError> {
        if let Some(budget) = self.budget {
            let held = self.pages_held * PAGE_SIZE as u64;
            let needed = new_pages * PAGE_SIZE as u64;
            if held + needed > budget {
                return Err(CheckpointError::OverBudget {
                    held,
                    needed,
                    budget,
                });
            }
        }
        Ok(())
    }

    /// Keeps the present of `ram` as a new node: the root (with the pages
    /// `root` picks, see [`root_pages`]) when the tree is empty, else a child
    /// of the base keeping the pages written since it (`dirty`, plus those
    /// noted).
    pub(super) fn take(
        &mut self,
        ram: &impl GuestPages,
        dirty: &[u64],
        root: impl FnOnce(&dyn GuestPages) -> BTreeMap<u64, Box<[u8]>>,
    ) -> Result<NodeId, CheckpointError> {
        let (parent, pages) = match self.base {
            None => {
                self.ram_len = ram.len();
                (None, root(ram as &dyn GuestPages))
            }
            Some(base) => {
                self.since_base.extend(dirty);
                let pages = self
                    .since_base
                    .iter()
                    .filter(|&&p| self.in_ram(p))
                    .map(|&p| (p, Box::<[u8]>::from(ram.page(p))))
                    .collect();
                (Some(base), pages)
            }
        };
        self.check_budget(pages.len() as u64)?;
        let id = NodeId(NEXT_NODE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        self.pages_held += pages.len() as u64;
        self.nodes.insert(
            id,
            Node {
                parent,
                children: Vec::new(),
                released: false,
                pages,
            },
        );
        if let Some(parent) = parent {
            self.node_mut(parent).children.push(id);
        }
        self.move_base(id);
        Ok(id)
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes.get(&id).expect("a node of the tree")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes.get_mut(&id).expect("a node of the tree")
    }

    /// The base is `id` now, with nothing written since; the old base may
    /// go if it was released.
    fn move_base(&mut self, id: NodeId) {
        let old = self.base.replace(id);
        self.since_base.clear();
        if let Some(old) = old.filter(|&old| old != id) {
            self.compact(old);
        }
    }

    /// `id` and its ancestors, nearest first.
    fn lineage(&self, id: NodeId) -> Vec<NodeId> {
        let mut chain = vec![id];
        while let Some(parent) = self.node(*chain.last().expect("non-empty")).parent {
            chain.push(parent);
        }
        chain
    }

    /// The bytes of `page` at `id`, if a node keeps them (else they are
    /// the backing's).
    fn bytes_at(&self, id: NodeId, page: u64) -> Option<&[u8]> {
        let mut at = Some(id);
        while let Some(node) = at.map(|id| self.node(id)) {
            if let Some(bytes) = node.pages.get(&page) {
                return Some(bytes);
            }
            at = node.parent;
        }
        None
    }

    /// Moves the live RAM to checkpoint `to`. `dirty` are the pages written
    /// since the dirty log was last read; with those noted before, the pages
    /// written since the base are rewritten, and the pages kept on the path
    /// from the base up to the common ancestor and down to `to`. A page no
    /// node keeps is the backing's at `to`: its private copy is dropped and
    /// the root keeps the backing's bytes from now on. Returns what was
    /// done and the pages rewritten (ascending).
    pub(super) fn reset(
        &mut self,
        to: NodeId,
        dirty: &[u64],
        ram: &mut impl GuestPages,
    ) -> Result<(ResetStats, Vec<u64>), CheckpointError> {
        match self.nodes.get(&to) {
            Some(node) if !node.released && ram.len() == self.ram_len => {}
            _ => return Err(CheckpointError::StaleCheckpoint),
        }
        let base = self.base.expect("a non-empty tree has a base");
        let mut rewrite = std::mem::take(&mut self.since_base);
        rewrite.extend(dirty);
        let from_base = self.lineage(base);
        let to_target = self.lineage(to);
        let on_target_path: BTreeSet<NodeId> = to_target.iter().copied().collect();
        let common = *from_base
            .iter()
            .find(|n| on_target_path.contains(n))
            .expect("one tree has one root");
        let below_common = |chain: &[NodeId]| -> Vec<NodeId> {
            chain.iter().copied().take_while(|&n| n != common).collect()
        };
        for node in below_common(&from_base)
            .into_iter()
            .chain(below_common(&to_target))
        {
            rewrite.extend(self.node(node).pages.keys());
        }
        let rewrite: Vec<u64> = rewrite.into_iter().filter(|&p| self.in_ram(p)).collect();
        let mut stats = ResetStats::default();
        for &page in &rewrite {
            if let Some(bytes) = self.bytes_at(to, page) {
                ram.write_page(page, bytes);
                stats.pages_copied += 1;
                continue;
            }
            if let Err(source) = ram.discard(page) {
                // The present is now somewhere between the base and `to`:
                // every page of the move may differ from the base.
                self.since_base = rewrite.iter().copied().collect();
                return Err(CheckpointError::ResetPage { page, source });
            }
            let root = *to_target.last().expect("non-empty");
            let bytes = Box::<[u8]>::from(ram.page(page));
            // Written back at once: the guest, which wrote this page on the
            // path just left and likely will again, then finds a private
            // copy instead of faulting on it.
            ram.write_page(page, &bytes);
            self.node_mut(root).pages.insert(page, bytes);
            self.pages_held += 1;
            stats.pages_fetched += 1;
        }
        self.move_base(to);
        Ok((stats, rewrite))
    }

    /// Lets checkpoint `id` go: it can no longer be reset to, and its pages
    /// go as soon as no other node needs them (a node with one child is
    /// merged into it; one shared by several stays).
    pub(super) fn release(&mut self, id: NodeId) -> Result<(), CheckpointError> {
        match self.nodes.get_mut(&id) {
            Some(node) if !node.released => node.released = true,
            _ => return Err(CheckpointError::StaleCheckpoint),
        }
        self.compact(id);
        Ok(())
    }

    /// Drops or merges released `id` if nothing needs it as it is.
    fn compact(&mut self, id: NodeId) {
        let node = self.node(id);
        if !node.released || self.base == Some(id) {
            return;
        }
        let parent = node.parent;
        match node.children.len() {
            0 => {
                let node = self.nodes.remove(&id).expect("present");
                self.pages_held -= node.pages.len() as u64;
                if let Some(parent) = parent {
                    self.node_mut(parent).children.retain(|&c| c != id);
                    self.compact(parent);
                }
            }
            1 => {
                let node = self.nodes.remove(&id).expect("present");
                let child = node.children[0];
                let child_node = self.node_mut(child);
                child_node.parent = parent;
                let mut merged_away = 0;
                for (page, bytes) in node.pages {
                    match child_node.pages.entry(page) {
                        std::collections::btree_map::Entry::Vacant(e) => {
                            e.insert(bytes);
                        }
                        std::collections::btree_map::Entry::Occupied(_) => merged_away += 1,
                    }
                }
                self.pages_held -= merged_away;
                if let Some(parent) = parent {
                    for c in &mut self.node_mut(parent).children {
                        if *c == id {
                            *c = child;
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// The pages of `ram` that `initial` selects, as a root keeps them.
pub(super) fn root_pages(
    ram: &dyn GuestPages,
    initial: InitialPages<'_>,
) -> BTreeMap<u64, Box<[u8]>> {
    let (flags, non_zero_only) = match initial {
        InitialPages::Flagged(flags) => (flags, false),
        InitialPages::FlaggedNonZero(flags) => (flags, true),
    };
    let mut pages = BTreeMap::new();
    for (page, flagged) in flags.iter().enumerate() {
        let page = page as u64;
        if !*flagged || (page as usize + 1) * PAGE_SIZE > ram.len() {
            continue;
        }
        let bytes = ram.page(page);
        if non_zero_only && bytes.iter().all(|b| *b == 0) {
            continue;
        }
        pages.insert(page, Box::<[u8]>::from(bytes));
    }
    pages
}

/// Appends to `pages` the numbers of the pages set in either bitmap (KVM's
/// log of the guest's writes, vm-memory's of the VMM's), counting from
/// `first_page`; the bitmaps may differ in length.
pub(super) fn collect_dirty(first_page: u64, guest: &[u64], vmm: &[u64], pages: &mut Vec<u64>) {
    for w in 0..guest.len().max(vmm.len()) {
        let mut bits = guest.get(w).copied().unwrap_or(0) | vmm.get(w).copied().unwrap_or(0);
        while bits != 0 {
            let bit = u64::from(bits.trailing_zeros());
            pages.push(first_page + w as u64 * 64 + bit);
            bits &= bits - 1;
        }
    }
}

/// Makes `ram` equal to `image` (the whole RAM image) on `pages`, in
/// ascending order, each with whether the image stores it (one it does not
/// store is zero: it is not read, so a lazily mapped image is not faulted
/// in there); every page outside them must already be equal (zero in
/// both). Returns the pages it wrote.
pub(super) fn load_pages(
    ram: &mut dyn GuestPages,
    image: &[u8],
    pages: impl Iterator<Item = (u64, bool)>,
) -> Vec<u64> {
    assert_eq!(ram.len(), image.len(), "the image is not this RAM's size");
    let zero = [0u8; PAGE_SIZE];
    let mut written = Vec::new();
    for (page, stored) in pages {
        let saved = if stored {
            &image[page as usize * PAGE_SIZE..][..PAGE_SIZE]
        } else {
            &zero[..]
        };
        if ram.page(page) != saved {
            ram.write_page(page, saved);
            written.push(page);
        }
    }
    written
}

#[cfg(test)]
#[path = "kept_pages_tests.rs"]
mod tests;
