//! Merging reports of several directories (shards) without loss:
//!
//! - campaigns: every directory, in the order given;
//! - properties: one per key (the same in every shard), in the order first
//!   seen; counts (hits, passes, failures, failed stretches) add, the
//!   findings that fail it are the union of the keys, examples and
//!   counterexamples are all kept, and the verdict is judged again from the
//!   sums ([`PropertyReport::judged`]): a `Sometimes` never true in one
//!   shard and true in another passed. A checker's failures are its
//!   distinct findings;
//! - findings: one per key (`finding.json`'s key, the campaign's own
//!   de-duplication): the first directory's copy (in the order given) is
//!   the finding, every other directory's copy of the same key is listed in
//!   its `also_in` (directory, number, faults, replay command); nothing is
//!   dropped and nothing counted twice;
//! - exploration: counts, wall time and phases add, the depth is the
//!   deepest, moments by depth and branches by minute add index by index; a
//!   counter some directory did not keep is `None` in the sum; the rates
//!   are computed from the sums (branches per hour of summed wall time, and
//!   per worker of summed wall time x workers);
//! - fault kinds and combinations: counts add.

use crate::model::*;
use std::collections::BTreeMap;

/// `reports` as one (see the module's rules); merging one report computes
/// its verdicts and rates.
pub fn merge(reports: Vec<Report>) -> Report {
    let mut out = Report::empty();
    let mut by_key: BTreeMap<String, usize> = BTreeMap::new();
    let mut finding_by_key: BTreeMap<String, usize> = BTreeMap::new();
    for report in reports {
        let offset = out.campaigns.len();
        out.campaigns.extend(report.campaigns);
        for p in report.properties {
            match by_key.get(&p.key) {
                Some(&i) => add_property(&mut out.properties[i], p),
                None => {
                    by_key.insert(p.key.clone(), out.properties.len());
                    out.properties.push(p);
                }
            }
        }
        for mut f in report.findings {
            f.campaign += offset;
            match finding_by_key.get(&f.key) {
                Some(&i) => {
                    let also = std::mem::take(&mut f.also_in);
                    let first = &mut out.findings[i];
                    first.also_in.push(FindingCopy {
                        dir: f.dir,
                        number: f.number,
                        faults: f.faults.len(),
                        replay: f.replay,
                    });
                    first.also_in.extend(also);
                }
                None => {
                    finding_by_key.insert(f.key.clone(), out.findings.len());
                    out.findings.push(f);
                }
            }
        }
        add_exploration(&mut out.exploration, &report.exploration);
        for (kind, n) in report.fault_kinds {
            *out.fault_kinds.entry(kind).or_default() += n;
        }
        for (combination, n) in report.fault_combinations {
            *out.fault_combinations.entry(combination).or_default() += n;
        }
    }
    for p in &mut out.properties {
        if p.kind == PropertyKind::Checker {
            p.failures = p.findings.len() as u64;
            p.passes = p.hits.saturating_sub(p.failures);
        }
        (p.verdict, p.why) = p.judged();
    }
    rates(&mut out.exploration);
    out
}

fn add_property(into: &mut PropertyReport, p: PropertyReport) {
    into.must_hit |= p.must_hit;
    into.hits += p.hits;
    into.passes += p.passes;
    into.failures += p.failures;
    into.failed_stretches += p.failed_stretches;
    for key in p.findings {
        if !into.findings.contains(&key) {
            into.findings.push(key);
        }
    }
    into.examples.extend(p.examples);
    into.counterexamples.extend(p.counterexamples);
}

fn add_option(into: &mut Option<u64>, other: Option<u64>) {
    *into = match (*into, other) {
        (Some(a), Some(b)) => Some(a + b),
        _ => None,
    };
}

fn add_by_index(into: &mut Vec<u64>, other: &[u64]) {
    if into.len() < other.len() {
        into.resize(other.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(other) {
        *a += b;
    }
}

fn add_exploration(into: &mut Exploration, e: &Exploration) {
    into.branches += e.branches;
    into.moments += e.moments;
    into.stopped += e.stopped;
    into.depth = into.depth.max(e.depth);
    add_by_index(&mut into.moments_by_depth, &e.moments_by_depth);
    into.wall_ms += e.wall_ms;
    add_option(&mut into.worker_ms, e.worker_ms);
    into.phases = match (into.phases, e.phases) {
        (Some(a), Some(b)) => Some(Phases {
            root_ms: a.root_ms + b.root_ms,
            branch_ms: a.branch_ms + b.branch_ms,
            shrink_ms: a.shrink_ms + b.shrink_ms,
        }),
        _ => None,
    };
    add_option(&mut into.spilled, e.spilled);
    add_option(&mut into.loaded, e.loaded);
    add_option(&mut into.replayed_steps, e.replayed_steps);
    add_option(&mut into.live_checkpoints, e.live_checkpoints);
    add_by_index(&mut into.branches_by_minute, &e.branches_by_minute);
}

fn rates(e: &mut Exploration) {
    let per_hour = |branches: u64, ms: u64| (ms > 0).then(|| branches as f64 * 3.6e6 / ms as f64);
    e.branches_per_hour = per_hour(e.branches, e.wall_ms);
    e.branches_per_hour_per_worker = e.worker_ms.and_then(|ms| per_hour(e.branches, ms));
}
