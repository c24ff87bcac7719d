//! A campaign's budgets: wall time and branches, honoured exactly as
//! written (`budget.wall`, `--budget`; `budget.branches`, `--branches`).
//! 0 means no limit, for both.

use devices::time::DurationError;
use std::str::FromStr;
use std::time::Duration;
use vmm::VirtNanos;

/// Limits on a campaign's run (this process's share; the database keeps
/// what earlier runs used).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// Wall time this run may take (`None`: no limit).
    pub wall: Option<Duration>,
    /// Branches in all, earlier runs' included (0: no limit).
    pub branches: u64,
}

/// A wall budget as written: the one duration grammar, exact (`500us` is
/// 500 µs, not 0 ms); `0` (in any unit) means no limit.
pub fn parse_wall(text: &str) -> Result<Option<VirtNanos>, DurationError> {
    let wall: VirtNanos = text.parse()?;
    Ok((wall != VirtNanos::ZERO).then_some(wall))
}

/// A wall budget as a flag gives it (`--budget`): [`parse_wall`]'s value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WallBudget(pub Option<VirtNanos>);

impl FromStr for WallBudget {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Self, DurationError> {
        parse_wall(text).map(WallBudget)
    }
}

/// A wall budget as [`Budget::wall`] holds it.
pub fn wall_duration(wall: Option<VirtNanos>) -> Option<Duration> {
    wall.map(|w| Duration::from_nanos(w.0))
}

impl Budget {
    /// Why the campaign stops before its next batch, `elapsed` into this
    /// run with `branches` taken in all; `None`: it goes on.
    pub fn spent(&self, elapsed: Duration, branches: u64) -> Option<&'static str> {
        if self.wall.is_some_and(|wall| elapsed >= wall) {
            return Some("wall-time budget");
        }
        if self.branches > 0 && branches >= self.branches {
            return Some("branch budget");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_wall_budget_below_a_millisecond_is_a_limit_and_0_none() {
        // Truncated to whole ms, these were 0, "no limit".
        for (text, ns) in [
            ("1us", 1_000),
            ("999us", 999_000),
            ("1ns", 1),
            ("500us", 500_000),
        ] {
            let wall = parse_wall(text).unwrap();
            assert_eq!(wall, Some(VirtNanos(ns)), "{text}");
            let budget = Budget {
                wall: wall_duration(wall),
                branches: 2,
            };
            assert_eq!(
                budget.spent(Duration::from_nanos(ns), 0),
                Some("wall-time budget"),
                "{text}"
            );
            assert_eq!(budget.spent(Duration::from_nanos(ns - 1), 0), None);
        }
        for text in ["0", "0s", "0ns", "0.000ms"] {
            assert_eq!(parse_wall(text).unwrap(), None, "{text}");
        }
        let unlimited = Budget::default();
        assert_eq!(unlimited.spent(Duration::from_secs(1 << 40), 1 << 40), None);
        let branches = Budget {
            wall: None,
            branches: 2,
        };
        assert_eq!(branches.spent(Duration::ZERO, 2), Some("branch budget"));
        assert!(parse_wall("soon").is_err());
    }

    #[test]
    fn test_a_wall_budget_flag_reads_as_the_file_s_key() {
        for text in ["500us", "30m", "0", "0s"] {
            assert_eq!(
                text.parse::<WallBudget>().unwrap(),
                WallBudget(parse_wall(text).unwrap()),
                "{text}"
            );
        }
        assert_eq!(
            "soon".parse::<WallBudget>().unwrap_err(),
            parse_wall("soon").unwrap_err()
        );
    }
}
