use super::*;
use proptest::prelude::*;

/// Guest RAM over a buffer, with the backing (what a page reads as after
/// its private copy is dropped) as a second buffer, and a dirty log of the
/// pages written through `set`.
struct FakeRam {
    ram: Vec<u8>,
    backing: Vec<u8>,
    discarded: Vec<u64>,
    written: BTreeSet<u64>,
    fail_discard: bool,
}

impl FakeRam {
    /// RAM and its backing, one page per byte given, each page filled with
    /// its byte.
    fn new(ram: &[u8], backing: &[u8]) -> Self {
        let fill = |bytes: &[u8]| bytes.iter().flat_map(|b| [*b; PAGE_SIZE]).collect();
        FakeRam {
            ram: fill(ram),
            backing: fill(backing),
            discarded: Vec::new(),
            written: BTreeSet::new(),
            fail_discard: false,
        }
    }

    /// The guest writes `page` (logged).
    fn set(&mut self, page: u64, byte: u8) {
        let at = page as usize * PAGE_SIZE;
        self.ram[at..at + PAGE_SIZE].fill(byte);
        self.written.insert(page);
    }

    /// Reads and resets the dirty log.
    fn dirty(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.written).into_iter().collect()
    }

    /// The byte every page holds (pages are filled uniformly).
    fn bytes(&self) -> Vec<u8> {
        self.ram.chunks_exact(PAGE_SIZE).map(|p| p[0]).collect()
    }
}

impl GuestPages for FakeRam {
    fn len(&self) -> usize {
        self.ram.len()
    }
    fn page(&self, page: u64) -> &[u8] {
        &self.ram[page as usize * PAGE_SIZE..][..PAGE_SIZE]
    }
    fn write_page(&mut self, page: u64, bytes: &[u8]) {
        self.ram[page as usize * PAGE_SIZE..][..PAGE_SIZE].copy_from_slice(bytes);
    }
    fn discard(&mut self, page: u64) -> std::io::Result<()> {
        if self.fail_discard {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        self.discarded.push(page);
        let at = page as usize * PAGE_SIZE;
        self.ram[at..at + PAGE_SIZE].copy_from_slice(&self.backing[at..at + PAGE_SIZE]);
        Ok(())
    }
}

fn fresh(flags: &[bool]) -> impl FnOnce(&dyn GuestPages) -> BTreeMap<u64, Box<[u8]>> + '_ {
    |ram| root_pages(ram, InitialPages::FlaggedNonZero(flags))
}

fn restored(flags: &[bool]) -> impl FnOnce(&dyn GuestPages) -> BTreeMap<u64, Box<[u8]>> + '_ {
    |ram| root_pages(ram, InitialPages::Flagged(flags))
}

fn kept(tree: &CheckpointTree, node: NodeId) -> Vec<(u64, u8)> {
    tree.node(node)
        .pages
        .iter()
        .map(|(&p, bytes)| (p, bytes[0]))
        .collect()
}

#[test]
fn fresh_memory_keeps_the_non_zero_candidates() {
    let ram = FakeRam::new(&[1, 0, 3, 4], &[0; 4]);
    let mut tree = CheckpointTree::new(ram.len());
    // Page 3 is not a candidate (never backed): not even looked at.
    let root = tree
        .take(&ram, &[], fresh(&[true, true, true, false]))
        .unwrap();
    assert_eq!(kept(&tree, root), [(0, 1), (2, 3)]);
    assert_eq!(tree.pages_of(root), 2);
}

#[test]
fn a_restored_session_keeps_its_private_copies_even_zero_ones() {
    // Page 1 was zeroed by the guest: it differs from the file's page, so it
    // must be kept although it is zero.
    let ram = FakeRam::new(&[5, 0, 7], &[5, 6, 7]);
    let mut tree = CheckpointTree::new(ram.len());
    let root = tree
        .take(&ram, &[], restored(&[false, true, true]))
        .unwrap();
    assert_eq!(kept(&tree, root), [(1, 0), (2, 7)]);
}

#[test]
fn a_reset_copies_kept_pages_back_and_fetches_the_others() {
    let mut ram = FakeRam::new(&[1, 0, 3, 0], &[0; 4]);
    let mut tree = CheckpointTree::new(ram.len());
    let root = tree.take(&ram, &[], fresh(&[true; 4])).unwrap();
    // The guest writes a kept page and a page that was zero.
    ram.set(0, 9);
    ram.set(3, 8);
    let dirty = ram.dirty();
    let (stats, rewritten) = tree.reset(root, &dirty, &mut ram).unwrap();
    assert_eq!((stats.pages_copied, stats.pages_fetched), (1, 1));
    assert_eq!(rewritten, [0, 3]);
    assert_eq!(ram.bytes(), [1, 0, 3, 0]);
    // Only the page the checkpoint did not keep went back to the backing ...
    assert_eq!(ram.discarded, [3]);
    // ... and is kept from now on: the next reset copies it.
    assert_eq!(kept(&tree, root), [(0, 1), (2, 3), (3, 0)]);
    ram.set(3, 7);
    let dirty = ram.dirty();
    let (stats, _) = tree.reset(root, &dirty, &mut ram).unwrap();
    assert_eq!((stats.pages_copied, stats.pages_fetched), (1, 0));
    assert_eq!(ram.bytes(), [1, 0, 3, 0]);
    assert_eq!(ram.discarded, [3]);
}

#[test]
fn a_fetched_page_is_the_backing_s_page() {
    // A restored session: page 1 is the file's (6) and not kept.
    let mut ram = FakeRam::new(&[5, 6], &[5, 6]);
    let mut tree = CheckpointTree::new(ram.len());
    let root = tree.take(&ram, &[], restored(&[false, false])).unwrap();
    ram.set(1, 0);
    let dirty = ram.dirty();
    tree.reset(root, &dirty, &mut ram).unwrap();
    assert_eq!(ram.bytes(), [5, 6]);
    assert_eq!(kept(&tree, root), [(1, 6)]);
}

#[test]
fn a_reset_leaves_clean_pages_and_ignores_pages_beyond_ram() {
    let mut ram = FakeRam::new(&[1, 2], &[0; 2]);
    let mut tree = CheckpointTree::new(ram.len());
    let root = tree.take(&ram, &[], fresh(&[true; 2])).unwrap();
    // Page 1 changed but is not reported dirty: left as it is.
    ram.ram[PAGE_SIZE..].fill(4);
    let (stats, rewritten) = tree.reset(root, &[2, 1000], &mut ram).unwrap();
    assert_eq!(stats, ResetStats::default());
    assert!(rewritten.is_empty());
    assert_eq!(ram.bytes(), [1, 4]);
    assert!(ram.discarded.is_empty());
}

#[test]
fn a_failed_discard_names_the_page() {
    let mut ram = FakeRam::new(&[0, 0], &[0; 2]);
    let mut tree = CheckpointTree::new(ram.len());
    let root = tree.take(&ram, &[], fresh(&[true; 2])).unwrap();
    ram.fail_discard = true;
    let err = tree.reset(root, &[1], &mut ram).expect_err("discard fails");
    assert!(
        matches!(err, CheckpointError::ResetPage { page: 1, .. }),
        "{err:?}"
    );
    assert_eq!(tree.pages_of(root), 0, "nothing kept for the failed page");
}

#[test]
fn moving_between_siblings_rewrites_only_the_path_through_their_ancestor() {
    // Root R; A after writing pages 1 and 2; back to R; B after writing 3.
    let mut ram = FakeRam::new(&[1, 1, 1, 1, 1, 1], &[0; 6]);
    let mut tree = CheckpointTree::new(ram.len());
    let r = tree.take(&ram, &[], fresh(&[true; 6])).unwrap();
    ram.set(1, 2);
    ram.set(2, 2);
    let dirty = ram.dirty();
    let a = tree.take(&ram, &dirty, fresh(&[])).unwrap();
    let dirty = ram.dirty();
    tree.reset(r, &dirty, &mut ram).unwrap();
    assert_eq!(ram.bytes(), [1; 6]);
    ram.set(3, 3);
    let dirty = ram.dirty();
    let b = tree.take(&ram, &dirty, fresh(&[])).unwrap();
    assert_eq!((tree.pages_of(a), tree.pages_of(b)), (2, 1));
    // B plus a write of page 5, to A: page 5 (written since B), page 3 (B's
    // own) and pages 1, 2 (A's own); page 0 and 4 untouched.
    ram.set(5, 9);
    let dirty = ram.dirty();
    let (stats, rewritten) = tree.reset(a, &dirty, &mut ram).unwrap();
    assert_eq!(rewritten, [1, 2, 3, 5]);
    assert_eq!(stats.pages_copied, 4);
    assert_eq!(ram.bytes(), [1, 2, 2, 1, 1, 1]);
    // A straight back to B: the two paths' pages only.
    let (_, rewritten) = tree.reset(b, &[], &mut ram).unwrap();
    assert_eq!(rewritten, [1, 2, 3]);
    assert_eq!(ram.bytes(), [1, 1, 1, 3, 1, 1]);
}

#[test]
fn a_released_checkpoint_is_refused_and_its_pages_go_when_unneeded() {
    let mut ram = FakeRam::new(&[1, 1, 1], &[0; 3]);
    let mut tree = CheckpointTree::new(ram.len());
    let r = tree.take(&ram, &[], fresh(&[true; 3])).unwrap();
    ram.set(0, 2);
    let dirty = ram.dirty();
    let a = tree.take(&ram, &dirty, fresh(&[])).unwrap();
    ram.set(1, 3);
    let dirty = ram.dirty();
    let b = tree.take(&ram, &dirty, fresh(&[])).unwrap();
    assert_eq!(tree.memory().pages, 5);
    // A lies between R and B: released, its page merges into B.
    tree.release(a).unwrap();
    assert!(matches!(
        tree.reset(a, &[], &mut ram),
        Err(CheckpointError::StaleCheckpoint)
    ));
    assert!(matches!(
        tree.release(a),
        Err(CheckpointError::StaleCheckpoint)
    ));
    assert_eq!(kept(&tree, b), [(0, 2), (1, 3)]);
    let memory = tree.memory();
    assert_eq!((memory.checkpoints, memory.nodes, memory.pages), (2, 2, 5));
    tree.reset(r, &[], &mut ram).unwrap();
    assert_eq!(ram.bytes(), [1, 1, 1]);
    tree.reset(b, &[], &mut ram).unwrap();
    assert_eq!(ram.bytes(), [2, 3, 1]);
    // B, the present's checkpoint, released: kept while the present
    // descends from it, gone once the run moves away.
    tree.release(b).unwrap();
    assert_eq!(tree.memory().nodes, 2);
    tree.reset(r, &[], &mut ram).unwrap();
    assert_eq!(tree.memory().nodes, 1);
    assert_eq!(tree.memory().pages, 3);
    assert_eq!(ram.bytes(), [1, 1, 1]);
}

#[test]
fn a_checkpoint_over_the_budget_is_refused_with_the_figures() {
    let mut ram = FakeRam::new(&[1, 1, 1], &[0; 3]);
    let mut tree = CheckpointTree::new(ram.len());
    tree.set_budget(Some(4 * PAGE_SIZE as u64));
    let root = tree.take(&ram, &[], fresh(&[true; 3])).unwrap();
    ram.set(0, 2);
    ram.set(1, 2);
    let dirty = ram.dirty();
    let err = tree.take(&ram, &dirty, fresh(&[])).unwrap_err();
    assert!(
        matches!(
            err,
            CheckpointError::OverBudget { held, needed, budget }
                if held == 3 * PAGE_SIZE as u64 && needed == 2 * PAGE_SIZE as u64
                    && budget == 4 * PAGE_SIZE as u64
        ),
        "{err:?}"
    );
    // Refused, nothing lost: the pages written still count as written.
    tree.set_budget(None);
    tree.reset(root, &[], &mut ram).unwrap();
    assert_eq!(ram.bytes(), [1, 1, 1]);
}

#[test]
fn a_node_of_another_tree_or_ram_size_is_refused() {
    let mut ram = FakeRam::new(&[1, 1], &[0; 2]);
    let mut one = CheckpointTree::new(ram.len());
    let mut other = CheckpointTree::new(ram.len());
    one.take(&ram, &[], fresh(&[true; 2])).unwrap();
    let foreign = other.take(&ram, &[], fresh(&[true; 2])).unwrap();
    assert!(matches!(
        one.reset(foreign, &[], &mut ram),
        Err(CheckpointError::StaleCheckpoint)
    ));
    let mut bigger = FakeRam::new(&[1, 1, 1], &[0; 3]);
    assert!(matches!(
        other.reset(foreign, &[], &mut bigger),
        Err(CheckpointError::StaleCheckpoint)
    ));
}

#[test]
fn dirty_pages_merge_both_logs_in_order() {
    let mut pages = vec![];
    // Guest wrote pages 0 and 65, the VMM pages 0, 3 and 130 (a third word
    // only the VMM's bitmap has).
    collect_dirty(100, &[1, 1 << 1], &[1 | 1 << 3, 0, 1 << 2], &mut pages);
    assert_eq!(pages, [100, 103, 165, 230]);
    collect_dirty(0, &[], &[], &mut pages);
    assert_eq!(pages.len(), 4, "empty logs add nothing");
}

/// One step of a random session.
#[derive(Clone, Debug)]
enum Step {
    Write {
        page: u64,
        byte: u8,
    },
    Checkpoint,
    /// To the n-th live checkpoint (modulo how many there are).
    Reset(usize),
    Release(usize),
    /// Someone else (an incremental snapshot) reads the dirty log, and
    /// tells the tree.
    LogRead,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u64..12, any::<u8>()).prop_map(|(page, byte)| Step::Write { page, byte }),
        2 => Just(Step::Checkpoint),
        3 => any::<usize>().prop_map(Step::Reset),
        1 => any::<usize>().prop_map(Step::Release),
        1 => Just(Step::LogRead),
    ]
}

/// Carries out a write, a checkpoint or a reset (checking RAM after it);
/// false for the other steps, which are the caller's.
fn common_step(
    step: &Step,
    ram: &mut FakeRam,
    tree: &mut CheckpointTree,
    live: &mut Vec<(NodeId, Vec<u8>)>,
) -> Result<bool, TestCaseError> {
    match *step {
        Step::Write { page, byte } => ram.set(page, byte),
        Step::Checkpoint => {
            let dirty = ram.dirty();
            let id = tree.take(ram, &dirty, fresh(&[true; 12])).unwrap();
            live.push((id, ram.bytes()));
        }
        Step::Reset(n) if !live.is_empty() => {
            let (id, expected) = live[n % live.len()].clone();
            let dirty = ram.dirty();
            tree.reset(id, &dirty, ram).unwrap();
            prop_assert_eq!(ram.bytes(), expected);
        }
        _ => return Ok(false),
    }
    Ok(true)
}

proptest! {
    /// Random trees, random writes, random visit orders: after every move
    /// the RAM is exactly the checkpoint's, and the memory held is what the
    /// nodes keep.
    #[test]
    fn every_reset_gives_back_exactly_the_checkpoint_s_ram(
        start in proptest::collection::vec(0u8..3, 12),
        backing_is_zero in any::<bool>(),
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let backing: Vec<u8> = if backing_is_zero { vec![0; 12] } else { start.clone() };
        let mut ram = FakeRam::new(&start, &backing);
        let mut tree = CheckpointTree::new(ram.len());
        let flags = vec![true; 12];
        let root = if backing_is_zero { tree.take(&ram, &[], fresh(&flags)) }
            else { tree.take(&ram, &[], restored(&[false; 12])) }.unwrap();
        let mut live: Vec<(NodeId, Vec<u8>)> = vec![(root, ram.bytes())];
        for step in steps {
            if common_step(&step, &mut ram, &mut tree, &mut live)? {
                continue;
            }
            match step {
                Step::Release(n) if !live.is_empty() => {
                    let (id, _) = live.remove(n % live.len());
                    tree.release(id).unwrap();
                    prop_assert!(tree.reset(id, &[], &mut ram).is_err());
                }
                Step::LogRead => {
                    let dirty = ram.dirty();
                    tree.note_written(&dirty);
                }
                _ => {}
            }
            let memory = tree.memory();
            prop_assert_eq!(memory.checkpoints, live.len() as u64);
            let kept: u64 = tree.nodes.values().map(|n| n.pages.len() as u64).sum();
            prop_assert_eq!(memory.pages, kept);
        }
        // A last tour through every checkpoint still left.
        for (id, expected) in live.iter().rev() {
            let dirty = ram.dirty();
            tree.reset(*id, &dirty, &mut ram).unwrap();
            prop_assert_eq!(&ram.bytes(), expected);
        }
    }

    /// A saved image loaded in place in the middle of random moves
    /// (`load_in_place`): RAM is the image, the pages it wrote are noted as
    /// written, and every checkpoint, older or taken after, still comes
    /// back exactly.
    #[test]
    fn a_load_in_place_gives_the_image_and_keeps_every_checkpoint(
        start in proptest::collection::vec(0u8..3, 12),
        image in proptest::collection::vec(0u8..3, 12),
        before in proptest::collection::vec(step(), 1..40),
        after in proptest::collection::vec(step(), 0..40),
    ) {
        let mut ram = FakeRam::new(&start, &[0; 12]);
        let mut tree = CheckpointTree::new(ram.len());
        let flags = vec![true; 12];
        let root = tree.take(&ram, &[], fresh(&flags)).unwrap();
        let mut live: Vec<(NodeId, Vec<u8>)> = vec![(root, ram.bytes())];
        let image_ram = FakeRam::new(&image, &[0; 12]).ram;
        // `Release` steps are loads here (one at least), half of them
        // checkpointed at once.
        let load = vec![Step::Release(0)];
        for step in before.into_iter().chain(load).chain(after) {
            if common_step(&step, &mut ram, &mut tree, &mut live)? {
                continue;
            }
            match step {
                Step::Release(n) => {
                    // As `Session::load_in_place`: the log read first, then
                    // the pages written behind it noted.
                    let dirty = ram.dirty();
                    tree.note_written(&dirty);
                    let written = super::load_pages(
                        &mut ram, &image_ram, (0..12).map(|p| (p, image[p as usize] != 0)));
                    tree.note_written(&written);
                    prop_assert_eq!(&ram.bytes(), &image);
                    if n % 2 == 0 {
                        let dirty = ram.dirty();
                        let id = tree.take(&ram, &dirty, fresh(&flags)).unwrap();
                        live.push((id, image.clone()));
                    }
                }
                _ => {
                    let dirty = ram.dirty();
                    tree.note_written(&dirty);
                }
            }
        }
        for (id, expected) in live.iter().rev().chain(live.iter()) {
            let dirty = ram.dirty();
            tree.reset(*id, &dirty, &mut ram).unwrap();
            prop_assert_eq!(&ram.bytes(), expected);
        }
    }
}
