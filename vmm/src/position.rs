//! A position in a history at instruction granularity: the exits handled
//! so far and the single steps taken since the last of them
//! (`exit:N+insn:K`; `exit:N` when K is 0). Parsed and printed here only.
//!
//! The step count is the canonical unit: one single step is one
//! instruction, except that a `REP` instruction takes one step per
//! iteration (as hardware single-stepping does). A position is reached by
//! replaying to exit N and single-stepping K times as an observer (see
//! `vm::insn_steps`), so it is the same on every run and every host.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// `exit:N+insn:K`: N exits handled, then K single steps.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct InsnPosition {
    /// Exits handled (the exit index the next exit will have).
    pub exit: u64,
    /// Single steps since the last exit.
    pub steps: u64,
}

impl InsnPosition {
    /// The position right after exit `exit` was handled.
    pub fn at_exit(exit: u64) -> InsnPosition {
        InsnPosition { exit, steps: 0 }
    }
}

/// Why a text is not a position; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PositionError {
    #[error("position {text:?} does not start with exit:")]
    NoExit { text: String },
    #[error("position {text:?}: exit index {index:?} is not a non-negative integer")]
    ExitIndex { text: String, index: String },
    #[error("position {text:?}: after '+' expected insn:K, K single steps after the exit")]
    NoInsn { text: String },
    #[error("position {text:?}: step count {steps:?} is not a non-negative integer")]
    Steps { text: String, steps: String },
}

/// A count as people write it: digits, `_` between them allowed.
fn count(text: &str) -> Option<u64> {
    if !text.starts_with(|c: char| c.is_ascii_digit())
        || !text.chars().all(|c| c.is_ascii_digit() || c == '_')
    {
        return None;
    }
    text.replace('_', "").parse().ok()
}

impl FromStr for InsnPosition {
    type Err = PositionError;

    fn from_str(text: &str) -> Result<Self, PositionError> {
        let owned = || text.to_owned();
        let rest = text
            .strip_prefix("exit:")
            .ok_or_else(|| PositionError::NoExit { text: owned() })?;
        let (index, steps) = match rest.split_once('+') {
            Some((index, insn)) => {
                let steps = insn
                    .strip_prefix("insn:")
                    .ok_or_else(|| PositionError::NoInsn { text: owned() })?;
                (index, Some(steps))
            }
            None => (rest, None),
        };
        let exit = count(index).ok_or_else(|| PositionError::ExitIndex {
            text: owned(),
            index: index.to_owned(),
        })?;
        let steps = match steps {
            Some(steps) => count(steps).ok_or_else(|| PositionError::Steps {
                text: owned(),
                steps: steps.to_owned(),
            })?,
            None => 0,
        };
        Ok(InsnPosition { exit, steps })
    }
}

impl fmt::Display for InsnPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "exit:{}", self.exit)?;
        if self.steps > 0 {
            write!(f, "+insn:{}", self.steps)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses_and_prints_canonically() {
        for (text, exit, steps, shown) in [
            ("exit:0", 0, 0, "exit:0"),
            ("exit:1200+insn:37", 1200, 37, "exit:1200+insn:37"),
            ("exit:1_200+insn:1_000", 1200, 1000, "exit:1200+insn:1000"),
            ("exit:5+insn:0", 5, 0, "exit:5"),
        ] {
            let p: InsnPosition = text.parse().unwrap();
            assert_eq!(p, InsnPosition { exit, steps }, "{text}");
            assert_eq!(p.to_string(), shown);
            assert_eq!(shown.parse::<InsnPosition>().unwrap(), p);
        }
    }

    #[test]
    fn bad_texts_are_refused_naming_them() {
        for (text, message) in [
            ("5", "position \"5\" does not start with exit:"),
            (
                "exit:x",
                "position \"exit:x\": exit index \"x\" is not a non-negative integer",
            ),
            (
                "exit:",
                "position \"exit:\": exit index \"\" is not a non-negative integer",
            ),
            (
                "exit:-1",
                "position \"exit:-1\": exit index \"-1\" is not a non-negative integer",
            ),
            (
                "exit:3+5",
                "position \"exit:3+5\": after '+' expected insn:K, K single steps after the exit",
            ),
            (
                "exit:3+insn:",
                "position \"exit:3+insn:\": step count \"\" is not a non-negative integer",
            ),
            (
                "exit:3+insn:+1",
                "position \"exit:3+insn:+1\": step count \"+1\" is not a non-negative integer",
            ),
            (
                "exit:3+insn:_1",
                "position \"exit:3+insn:_1\": step count \"_1\" is not a non-negative integer",
            ),
        ] {
            assert_eq!(
                text.parse::<InsnPosition>().unwrap_err().to_string(),
                message
            );
        }
    }

    #[test]
    fn positions_order_by_exit_then_steps() {
        let p = |exit, steps| InsnPosition { exit, steps };
        assert!(p(3, 100) < p(4, 0));
        assert!(p(4, 0) < p(4, 1));
    }
}
