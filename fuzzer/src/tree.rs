//! The tree of moments a campaign keeps, and which moment each branch
//! starts from. Branches are chosen in batches of a fixed width: branch
//! *k*'s parent is drawn from the tree as it was when its batch began
//! (branches numbered below `k - k % width`) and the earlier choices of the
//! same batch, so that the branches of a batch can run at once, finish in
//! any order, or be cut short by a kill, and the search stays a function of
//! the campaign's seed alone.

use crate::shard::Shard;
use crate::store::NodeRow;
use run::records::GuestRecord;
use vmm::entropy::EntropyStream;

/// A moment of the tree: node `id` is the moment branch `id - 1` ended at;
/// node 0 is the root.
pub(crate) struct TreeNode {
    pub row: NodeRow,
    pub records: Vec<GuestRecord>,
}

/// The records of every stretch from the boot to `node`.
pub(crate) fn path_records(nodes: &[TreeNode], node: u64) -> Vec<&[GuestRecord]> {
    let mut chain = Vec::new();
    let mut at = Some(node);
    while let Some(id) = at {
        chain.push(nodes[id as usize].records.as_slice());
        at = nodes[id as usize].row.parent;
    }
    chain.reverse();
    chain
}

/// The first branch of branch `k`'s batch.
pub(crate) fn batch_start(k: u64, width: u32) -> u64 {
    k - k % u64::from(width.max(1))
}

/// Moments of the tree as it was before branch `start` that may be
/// branched: their run has not stopped and they are above the depth limit.
pub(crate) fn candidates(nodes: &[TreeNode], start: u64, max_depth: u32) -> Vec<u64> {
    nodes
        .iter()
        .take(start as usize + 1)
        .filter(|n| !n.row.stopped && n.row.depth < max_depth)
        .map(|n| n.row.id)
        .collect()
}

/// The parents of branches `start..end` of one batch (`start` its first):
/// each weighted by `(1 + 4 x score) / (1 + branches taken from it)`,
/// counting the branches of the tree before `start` and the earlier
/// choices of this batch, and drawn from `seed` and the branch's number in
/// the campaign (`shard`'s branch `k` is the campaign's
/// [`Shard::campaign_branch`]). `None` when no moment may be branched.
pub(crate) fn choose_batch(
    nodes: &[TreeNode],
    seed: u64,
    shard: Shard,
    max_depth: u32,
    start: u64,
    end: u64,
) -> Option<Vec<u64>> {
    let candidates = candidates(nodes, start, max_depth);
    if candidates.is_empty() {
        return None;
    }
    let mut children = vec![0u32; start as usize + 1];
    for node in nodes.iter().take(start as usize + 1) {
        if let Some(parent) = node.row.parent {
            children[parent as usize] += 1;
        }
    }
    let mut parents = Vec::new();
    for k in start..end {
        let weights: Vec<f64> = candidates
            .iter()
            .map(|&id| {
                let node = &nodes[id as usize];
                (1.0 + 4.0 * node.row.score) / (1.0 + children[id as usize] as f64)
            })
            .collect();
        let parent = draw(&candidates, &weights, seed, shard.campaign_branch(k));
        children[parent as usize] += 1;
        parents.push(parent);
    }
    Some(parents)
}

/// One weighted draw among `candidates` from the stream of branch `k`.
fn draw(candidates: &[u64], weights: &[f64], seed: u64, k: u64) -> u64 {
    let total: f64 = weights.iter().sum();
    let mut stream = EntropyStream::new(seed, &format!("campaign-choice-{k}"));
    let draw = (stream.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
    let mut acc = 0.0;
    for (id, w) in candidates.iter().zip(weights) {
        acc += w;
        if draw < acc {
            return *id;
        }
    }
    *candidates.last().expect("candidates are not empty")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::Path as StepPath;

    fn node(id: u64, parent: Option<u64>, depth: u32, score: f64) -> TreeNode {
        TreeNode {
            row: NodeRow {
                id,
                parent,
                depth,
                path: StepPath {
                    steps: Vec::new(),
                    end_ns: vmm::VirtNanos::ZERO,
                },
                end_exits: 0,
                end_ns: vmm::VirtNanos::ZERO,
                digest: String::new(),
                score,
                stopped: false,
            },
            records: Vec::new(),
        }
    }

    #[test]
    fn test_a_batch_ignores_its_own_branches_but_counts_its_choices() {
        let mut nodes = vec![
            node(0, None, 0, 1.0),
            node(1, Some(0), 1, 3.0),
            node(2, Some(0), 1, 0.0),
        ];
        // Branches 2 and 3 form a batch of width 2 (start 2; their moments
        // will be nodes 3 and 4).
        let whole = choose_batch(&nodes, 9, Shard::WHOLE, 3, 2, 4).unwrap();
        // Branch 2 committed (a high-scoring child of node 1): branch 3's
        // choice is the same, as the tree before the batch is.
        nodes.push(node(3, Some(1), 2, 100.0));
        let rest = choose_batch(&nodes, 9, Shard::WHOLE, 3, 2, 4).unwrap();
        assert_eq!(whole, rest);
        assert_eq!(batch_start(3, 2), 2);
        assert_eq!(batch_start(3, 1), 3);
    }

    #[test]
    fn test_no_candidates_no_batch() {
        let nodes = vec![node(0, None, 0, 1.0)];
        assert!(choose_batch(&nodes, 1, Shard::WHOLE, 0, 0, 2).is_none());
    }
}
