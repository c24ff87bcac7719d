//! Which clock backend moves a history's virtual time: one name per
//! backend, parsed and printed here only (the CLI's `--clock`, `check`, the
//! snapshot's record of the clock that made it).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A clock backend (vmm/src/clock.rs holds the clocks themselves).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ClockKind {
    /// A fixed cost per guest-caused exit, and jumps to the next deadline
    /// when the guest idles: guest computation costs no virtual time.
    #[default]
    Exit,
    /// Every instruction single-stepped and counted: virtual time follows
    /// the guest's instructions exactly, at a fixed rate.
    Step,
    /// A hardware counter of guest-only retired instructions, then single
    /// steps to the exact count.
    Pmu,
}

impl ClockKind {
    pub const ALL: [ClockKind; 3] = [ClockKind::Exit, ClockKind::Step, ClockKind::Pmu];

    pub fn name(self) -> &'static str {
        match self {
            ClockKind::Exit => "exit",
            ClockKind::Step => "step",
            ClockKind::Pmu => "pmu",
        }
    }

    /// For serde's `skip_serializing_if`: the exit clock is what a record
    /// without the field means, so states made with it read as before.
    pub fn is_exit(&self) -> bool {
        *self == ClockKind::Exit
    }
}

impl fmt::Display for ClockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A name that is no clock backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown clock {text:?}: expected exit, step or pmu")]
pub struct UnknownClock {
    pub text: String,
}

impl FromStr for ClockKind {
    type Err = UnknownClock;

    fn from_str(text: &str) -> Result<Self, UnknownClock> {
        ClockKind::ALL
            .into_iter()
            .find(|kind| kind.name() == text.trim())
            .ok_or_else(|| UnknownClock {
                text: text.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_each_clock_round_trips_through_text_and_json() {
        for kind in ClockKind::ALL {
            assert_eq!(kind.to_string().parse::<ClockKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{kind}\""));
            assert_eq!(serde_json::from_str::<ClockKind>(&json).unwrap(), kind);
        }
        assert_eq!(ClockKind::default(), ClockKind::Exit);
    }

    #[test]
    fn test_an_unknown_clock_is_named() {
        let err = "tsc".parse::<ClockKind>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown clock \"tsc\": expected exit, step or pmu"
        );
    }
}
