//! Shards: one campaign's search split over several processes (machines,
//! pods of a Kubernetes Indexed Job), each booting its own root and owning
//! a disjoint part of the tree.
//!
//! Shard `i` of `n` (0-based, as `JOB_COMPLETION_INDEX`) draws every
//! branch's seed from the residue class `i` modulo `n`, so no two shards
//! ever make the same step, and a moment (a path from the root: steps of
//! time, seed and faults) belongs to the one shard its first step's seed
//! names: shards explore disjoint subtrees of the same root. Its local
//! branch `k` is the campaign's branch `k x n + i` for the streams it draws
//! from (the branch's seed, its parent's choice), so shards draw
//! independent streams, and shard `0/1` is the unsharded campaign exactly.
//! What this does and does not guarantee against one unsharded campaign is
//! in docs/campaigns.md ("Shards").

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The variable a Kubernetes Indexed Job sets to each pod's index.
pub const COMPLETION_INDEX_VAR: &str = "JOB_COMPLETION_INDEX";

/// The most shards (Kubernetes' own bound on an Indexed Job's completions):
/// a larger count is a typo, not a cluster.
pub const MAX_SHARDS: u32 = 100_000;

/// Shard `index` of `count` (0-based). [`Shard::WHOLE`] is the unsharded
/// campaign.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

/// Why a shard was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShardError {
    #[error("expected INDEX/COUNT (0-based, e.g. 0/4), not {0:?}")]
    Syntax(String),
    #[error("the count of shards must be 1 to {MAX_SHARDS}, not {0}")]
    Count(u64),
    #[error("shard index {index} is out of range for {count} shard{}: they are numbered 0 to {} (0-based, as {COMPLETION_INDEX_VAR})", if *count == 1 { "" } else { "s" }, count - 1)]
    Index { index: u64, count: u32 },
    #[error("{COMPLETION_INDEX_VAR} is not set (a Kubernetes Indexed Job sets it in each pod; elsewhere give the index with the count, INDEX/COUNT)")]
    Unset,
    #[error("{COMPLETION_INDEX_VAR}={0:?} is not a shard index (a whole number from 0)")]
    NotIndex(String),
}

impl Default for Shard {
    fn default() -> Self {
        Shard::WHOLE
    }
}

impl Shard {
    /// The whole campaign: one shard of one.
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Shard `index` of `count`, checked.
    pub fn new(index: u64, count: u64) -> Result<Shard, ShardError> {
        let count = u32::try_from(count)
            .ok()
            .filter(|c| (1..=MAX_SHARDS).contains(c))
            .ok_or(ShardError::Count(count))?;
        if index >= u64::from(count) {
            return Err(ShardError::Index { index, count });
        }
        Ok(Shard {
            index: index as u32,
            count,
        })
    }

    /// Shard `index` of `count` where `index` is the text of
    /// [`COMPLETION_INDEX_VAR`] (`None`: not set).
    pub fn from_completion_index(index: Option<&str>, count: u32) -> Result<Shard, ShardError> {
        let text = index.ok_or(ShardError::Unset)?;
        let index = text
            .trim()
            .parse::<u64>()
            .map_err(|_| ShardError::NotIndex(text.to_string()))?;
        Shard::new(index, u64::from(count))
    }

    pub fn is_whole(&self) -> bool {
        self.count == 1
    }

    /// The campaign-wide number of this shard's branch `k` (its own
    /// count, from 0): `k x count + index`. The whole campaign's is `k`.
    pub fn campaign_branch(&self, k: u64) -> u64 {
        k.wrapping_mul(u64::from(self.count))
            .wrapping_add(u64::from(self.index))
    }

    /// Whether a branch seed is this shard's: `seed mod count == index`.
    pub fn owns(&self, seed: u64) -> bool {
        seed % u64::from(self.count) == u64::from(self.index)
    }

    /// `seed` moved into this shard's residue class: the nearest value at
    /// or below it congruent to `index` modulo `count` (or the one below
    /// that, at the very top of the range). The whole campaign's is `seed`.
    pub fn own(&self, seed: u64) -> u64 {
        let (count, index) = (u64::from(self.count), u64::from(self.index));
        let base = seed - seed % count;
        base.checked_add(index).unwrap_or(base - count + index)
    }

    /// Seed of this shard's branch `k` in the campaign seeded `seed`.
    pub fn branch_seed(&self, seed: u64, k: u64) -> u64 {
        self.own(crate::engine::branch_seed(seed, self.campaign_branch(k)))
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = ShardError;

    fn from_str(text: &str) -> Result<Self, ShardError> {
        let syntax = || ShardError::Syntax(text.to_string());
        let (index, count) = text.split_once('/').ok_or_else(syntax)?;
        let number = |part: &str| {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            // Digits only: too many of them is a count or index out of range.
            Ok(part.parse::<u64>().unwrap_or(u64::MAX))
        };
        Shard::new(number(index)?, number(count)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_shard_round_trips_through_its_text_and_json() {
        for (text, index, count) in [
            ("0/1", 0, 1),
            ("3/20", 3, 20),
            ("99999/100000", 99_999, 100_000),
        ] {
            let shard: Shard = text.parse().unwrap();
            assert_eq!(shard, Shard { index, count });
            assert_eq!(shard.to_string(), text);
            let json = serde_json::to_string(&shard).unwrap();
            assert_eq!(json, format!("{{\"index\":{index},\"count\":{count}}}"));
            assert_eq!(serde_json::from_str::<Shard>(&json).unwrap(), shard);
        }
        assert_eq!(Shard::default(), Shard::WHOLE);
        assert!(Shard::WHOLE.is_whole());
    }

    #[test]
    fn test_bad_shards_are_refused_naming_the_problem() {
        let refused = |text: &str| text.parse::<Shard>().unwrap_err().to_string();
        assert_eq!(
            refused("3/3"),
            "shard index 3 is out of range for 3 shards: they are numbered 0 to 2 (0-based, as JOB_COMPLETION_INDEX)"
        );
        assert_eq!(
            refused("1/1"),
            "shard index 1 is out of range for 1 shard: they are numbered 0 to 0 (0-based, as JOB_COMPLETION_INDEX)"
        );
        assert_eq!(
            refused("0/0"),
            "the count of shards must be 1 to 100000, not 0"
        );
        assert_eq!(
            refused("0/100001"),
            "the count of shards must be 1 to 100000, not 100001"
        );
        assert_eq!(
            refused("0/99999999999999999999999"),
            "the count of shards must be 1 to 100000, not 18446744073709551615"
        );
        for text in [
            "1", "/3", "1/", "-1/3", "1/3/4", "a/3", " 1/3", "1 / 3", "+1/3", "",
        ] {
            assert_eq!(
                refused(text),
                format!("expected INDEX/COUNT (0-based, e.g. 0/4), not {text:?}"),
                "{text}"
            );
        }
    }

    #[test]
    fn test_the_completion_index_is_read_and_checked() {
        assert_eq!(
            Shard::from_completion_index(Some("2"), 3),
            Ok(Shard { index: 2, count: 3 })
        );
        assert_eq!(
            Shard::from_completion_index(Some("3"), 3),
            Err(ShardError::Index { index: 3, count: 3 })
        );
        let unset = Shard::from_completion_index(None, 3).unwrap_err();
        assert!(
            unset
                .to_string()
                .starts_with("JOB_COMPLETION_INDEX is not set"),
            "{unset}"
        );
        assert_eq!(
            Shard::from_completion_index(Some("two"), 3)
                .unwrap_err()
                .to_string(),
            "JOB_COMPLETION_INDEX=\"two\" is not a shard index (a whole number from 0)"
        );
    }

    /// Shard 0/1 draws exactly the unsharded campaign's seeds and streams.
    #[test]
    fn test_the_whole_campaign_is_shard_0_of_1() {
        for k in 0..1000 {
            assert_eq!(Shard::WHOLE.campaign_branch(k), k);
            assert_eq!(
                Shard::WHOLE.branch_seed(7, k),
                crate::engine::branch_seed(7, k)
            );
        }
    }

    /// Every shard's seeds are its own, and the campaign's branch numbers
    /// of its branches are too: no two shards share either.
    #[test]
    fn test_shards_draw_from_disjoint_seeds_and_branch_numbers() {
        let count = 7;
        let mut seeds = std::collections::BTreeSet::new();
        let mut numbers = std::collections::BTreeSet::new();
        for index in 0..count {
            let shard = Shard::new(index, count).unwrap();
            for k in 0..200 {
                let seed = shard.branch_seed(11, k);
                assert!(shard.owns(seed));
                assert_eq!(seed % count, index);
                assert!(seeds.insert(seed));
                assert!(numbers.insert(shard.campaign_branch(k)));
            }
        }
        // The campaign's branches 0..1400, each drawn by exactly one shard.
        assert_eq!(numbers, (0..1400).collect());
        // At the top of the range, a seed still moves into the class.
        let shard = Shard::new(5, 7).unwrap();
        assert!(shard.owns(shard.own(u64::MAX)));
        assert_eq!(shard.own(u64::MAX), u64::MAX - u64::MAX % 7 - 7 + 5);
        assert_eq!(
            Shard::new(0, 7).unwrap().own(u64::MAX),
            u64::MAX - u64::MAX % 7
        );
    }
}
