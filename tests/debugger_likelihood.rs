//! `detvisor likelihood` on a target whose answer is known by construction
//! (tests/common/coin.rs): a campaign finds the history where both coins
//! were heads, and 4 points x 4 branches along it must show P(failure)
//! stepping at the flips: an interval holding 1/4 before coin A, one
//! holding 1/2 between the flips, and every branch failing after coin B.
//!
//! With 4 branches a point the intervals are wide and the counts are the
//! coins': the seeds are derived from the campaign's seed, so for a given
//! build the outcome is fixed (no flake), and the assertions are what holds
//! for every count that a 95% interval allows. After B every branch fails
//! whatever its seed: that one is certain.

mod common;

use common::coin::Coin;
use common::*;
use serde_json::Value;
use std::path::Path;

/// Branches the campaign may take to find both heads (1/4 a branch): the
/// campaign's seed finds them well within.
const CAMPAIGN_BRANCHES: &str = "12";

/// The virtual time of the first output record of the finding whose text
/// starts with `prefix` (a flip, as the workload printed it).
fn printed_at(finding: &Path, prefix: &str) -> u64 {
    let text = std::fs::read_to_string(finding.join("records.jsonl")).unwrap();
    text.lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .find(|r| {
            r["body"]["kind"] == "output"
                && r["body"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(prefix))
        })
        .and_then(|r| r["virtual_ns"].as_u64())
        .unwrap_or_else(|| panic!("no {prefix:?} in the finding's records: {text}"))
}

#[test]
fn test_likelihood_steps_at_the_coin_flips_within_its_intervals() {
    let started = std::time::Instant::now();
    let coin = Coin::new("likelihood");
    let out = coin.cluster.dir.join("campaign");
    let file = coin.campaign_file();
    let campaign = detvisor(&[
        "campaign",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--branches",
        CAMPAIGN_BRANCHES,
    ]);
    assert_eq!(
        campaign.status.code(),
        Some(1),
        "the campaign holds a finding: {}",
        stderr(&campaign)
    );
    let finding = out.join("findings/0001");
    let (flip_a, flip_b) = (
        printed_at(&finding, "coin A: 1"),
        printed_at(&finding, "coin B: 1"),
    );
    eprintln!("campaign: {:?}", started.elapsed());

    let svg = coin.cluster.dir.join("likely.svg");
    let run = detvisor(&[
        "likelihood",
        finding.to_str().unwrap(),
        "--points",
        "4",
        "--branches",
        "4",
        "--jobs",
        "1",
        "--json",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let report: Value = serde_json::from_str(stdout(&run).trim()).unwrap();
    eprintln!("campaign and likelihood: {:?}", started.elapsed());
    let key = report["key"].as_str().unwrap();
    assert!(key.starts_with("property:not%20both%20heads@"), "{report}");
    let points = report["points"].as_array().unwrap();
    assert_eq!(points.len(), 4, "{report}");
    let end = report["end_ns"].as_u64().unwrap();
    let mut regions = [0; 3];
    let mut seeds = std::collections::BTreeSet::new();
    for point in points {
        let at = point["virtual_ns"].as_u64().unwrap();
        let (failures, branches) = (point["failures"].as_u64(), point["branches"].as_u64());
        assert_eq!(branches, Some(4), "{point}");
        let (low, high) = (
            point["low"].as_f64().unwrap(),
            point["high"].as_f64().unwrap(),
        );
        let outcomes = point["outcomes"].as_array().unwrap();
        for outcome in outcomes {
            assert!(seeds.insert(outcome["seed"].as_u64().unwrap()), "{outcome}");
            // Each branch ran from the point's kept checkpoint, not from
            // the boot: it simulated no more than from the point on.
            let simulated = outcome["simulated_ns"].as_u64().unwrap();
            let ended = outcome["end_ns"].as_u64().unwrap();
            assert!(ended <= end, "{outcome}");
            assert_eq!(simulated, ended - at, "{outcome}");
            assert_eq!(outcome["faults"], 0, "no faults in this campaign");
        }
        let region = if at < flip_a {
            assert!(low <= 0.25 && 0.25 <= high, "before coin A: {point}");
            0
        } else if at < flip_b {
            assert!(low <= 0.5 && 0.5 <= high, "between the coins: {point}");
            1
        } else {
            assert_eq!(failures, Some(4), "after both heads, always: {point}");
            assert_eq!(point["p"], 1.0);
            2
        };
        regions[region] += 1;
    }
    assert!(
        regions.iter().all(|&n| n > 0),
        "a point in each region (flips at {flip_a} and {flip_b}): {regions:?} {report}"
    );

    let text = std::fs::read_to_string(&svg).unwrap();
    let document = roxmltree::Document::parse(&text).unwrap();
    assert_eq!(document.root_element().tag_name().name(), "svg");
    let circles = document
        .descendants()
        .filter(|n| n.tag_name().name() == "circle")
        .count();
    assert_eq!(circles, 4, "one marker a point");
    eprintln!("wall time: {:?}", started.elapsed());
}
