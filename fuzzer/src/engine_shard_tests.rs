//! Shards of one campaign ([`crate::shard`]) on the simulated run: every
//! shard reaches the same root, branches only moments of its own, and a
//! shard's search is a function of the campaign's seed and its shard alone
//! (workers, timing and resumes change nothing), as docs/campaigns.md
//! ("Shards") says.

use super::*;
use crate::shard::Shard;
use std::collections::BTreeSet;

/// Shard `shard` of the test campaign, batches of `width`, run by `sims`
/// to `branches`: its summary, tree and findings.
fn sharded(
    dir: &Path,
    shard: Shard,
    width: u32,
    branches: u64,
    sims: Vec<Sim>,
) -> (CampaignSummary, Vec<NodeRow>, Vec<FindingRow>) {
    let mut spec = spec(3);
    spec.shard = shard;
    spec.batch_width = width;
    let summary = try_campaign(dir, spec, branches, sims).unwrap();
    let store = Store::open(dir).unwrap();
    (summary, store.nodes().unwrap(), store.findings().unwrap())
}

/// Every step's seed of every moment of `nodes`.
fn seeds(nodes: &[NodeRow]) -> Vec<u64> {
    nodes
        .iter()
        .flat_map(|n| n.path.steps.iter().map(|s| s.seed))
        .collect()
}

/// The moments of `nodes` below the root, each its path's JSON.
fn paths(nodes: &[NodeRow]) -> BTreeSet<String> {
    nodes[1..]
        .iter()
        .map(|n| serde_json::to_string(&n.path).unwrap())
        .collect()
}

#[test]
fn test_shards_branch_one_root_into_disjoint_subtrees() {
    let count = 3;
    let mut trees = Vec::new();
    let mut found = Vec::new();
    let mut dirs = Vec::new();
    for index in 0..count {
        let shard = Shard::new(index, count).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sims = vec![jittery(index + 1), jittery(index + 40)];
        let (summary, nodes, findings) = sharded(dir.path(), shard, 2, 10, sims);
        assert_eq!(summary.branches, 10, "the budget is the shard's own");
        assert_eq!(nodes.len(), 11);
        let spec: CampaignSpec = Store::open(dir.path())
            .unwrap()
            .meta_json("spec")
            .unwrap()
            .unwrap();
        assert_eq!(spec.shard, shard, "recorded in the campaign's directory");
        // Branch k's seed is the shard's, from the campaign's branch k x 3 + i.
        for node in &nodes[1..] {
            let last = node.path.steps.last().unwrap();
            assert_eq!(last.seed, shard.branch_seed(5, node.id - 1));
        }
        // Every step of every moment is the shard's, and so is every
        // finding's path, shrunk and as found.
        for seed in seeds(&nodes) {
            assert!(shard.owns(seed), "{shard}: seed {seed}");
        }
        for row in &findings {
            let file = findings::load(&findings::finding_dir(dir.path(), row.number))
                .unwrap()
                .file;
            assert_eq!(file.spec.shard, shard);
            for step in file.path.steps.iter().chain(&file.found_path.steps) {
                assert!(shard.owns(step.seed), "{shard}: {}", file.path);
            }
        }
        trees.push(nodes);
        found.push(findings);
        dirs.push(dir);
    }
    // One root: the same moment, digest and records' judge in every shard.
    for nodes in &trees[1..] {
        assert_eq!(nodes[0], trees[0][0]);
    }
    // Disjoint: no moment below the root is in two shards, nor any seed;
    // the root's children of all shards are as many as their sum.
    let mut all_paths = BTreeSet::new();
    let mut all_seeds = BTreeSet::new();
    let mut root_children = BTreeSet::new();
    let mut children = 0;
    for nodes in &trees {
        let mine = paths(nodes);
        assert_eq!(mine.len(), 10);
        assert!(all_paths.is_disjoint(&mine));
        all_paths.extend(mine);
        let mine: BTreeSet<u64> = seeds(nodes).into_iter().collect();
        assert!(all_seeds.is_disjoint(&mine));
        all_seeds.extend(mine);
        for node in nodes.iter().filter(|n| n.parent == Some(0)) {
            children += 1;
            assert!(root_children.insert(node.path.steps[0].seed));
        }
    }
    assert_eq!(all_paths.len(), 30);
    assert_eq!(root_children.len(), children);
    assert!(children >= 3, "every shard branched the root");
    // The shards found the failure (each a finding of its own, a path of
    // its own): all findings together are each shard's, none lost.
    let total: usize = found.iter().map(Vec::len).sum();
    assert!(total >= 1, "{found:?}");
    // A shard's search is its own: again with one worker, other timings.
    for (index, nodes) in trees.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::new(index as u64, count).unwrap();
        let (_, again, findings) = sharded(dir.path(), shard, 2, 10, vec![jittery(99)]);
        assert_eq!(&again, nodes, "{shard}");
        assert_eq!(findings, found[index]);
    }
}

/// Shard 0/1 is the unsharded campaign: its seeds are `branch_seed`'s.
#[test]
fn test_the_whole_campaign_draws_the_unsharded_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let (_, nodes) = campaign(dir.path(), 3, 8);
    for node in &nodes[1..] {
        let last = node.path.steps.last().unwrap();
        assert_eq!(last.seed, branch_seed(5, node.id - 1));
    }
    let spec: CampaignSpec = Store::open(dir.path())
        .unwrap()
        .meta_json("spec")
        .unwrap()
        .unwrap();
    assert!(spec.shard.is_whole());
}

/// A resumed shard continues its own search: the shard is the campaign's,
/// read from its directory.
#[test]
fn test_a_resumed_shard_continues_its_own_search() {
    let shard = Shard::new(2, 3).unwrap();
    let straight = tempfile::tempdir().unwrap();
    let (_, all, all_findings) = sharded(straight.path(), shard, 2, 9, vec![Sim::default()]);
    let split = tempfile::tempdir().unwrap();
    let (first, _, _) = sharded(split.path(), shard, 2, 3, vec![Sim::default()]);
    assert_eq!(first.branches, 3);
    let summary = resume_with(split.path(), boxed(vec![jittery(4), jittery(5)]), 9);
    assert_eq!(summary.branches, 9);
    let store = Store::open(split.path()).unwrap();
    assert_eq!(store.nodes().unwrap(), all);
    assert_eq!(store.findings().unwrap(), all_findings);
}
