//! A moment as the debugger names it: a source (a finding's directory, a
//! campaign directory holding one finding, or a directory of snapshots),
//! the actions a branch took after the source's own history, and where on
//! that history (the run library's [`When`]: a virtual time, `failure`, a
//! duration before the failure, `exit:N`, `latest`, a snapshot id).
//!
//! Text: `SOURCE[~ACTION]...@WHEN`, one `~ACTION` per action a branch took,
//! in order:
//!
//! - `AT:seed=N`: at virtual time AT every seeded stream was re-keyed from N;
//! - `AT:fault=TEXT`: at AT this fault was added (its own grammar, with
//!   `%`, `~` and `@` percent-encoded);
//! - `AT:exec=NODE:WORD WORD...`: at AT this command ran in NODE (`-`:
//!   beside the nodes) while the nodes ran on, each word percent-encoded.
//!
//! `nightly/findings/0001@-1s` is one second before the finding's failure;
//! `nightly/findings/0001~14s:seed=7@20s` is 20 s into the history that
//! branched from the finding's at 14 s with seed 7. The id is the whole
//! history, so it resolves the same in any process and on any host that has
//! the source.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, CONTROLS};
use run::faults::Fault;
use run::moment::{MomentError, When};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use vmm::VirtNanos;

/// What a branch did at one instant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum Action {
    /// Re-key every seeded stream (an alternate history from here).
    Seed { at: VirtNanos, seed: u64 },
    /// Add a fault (`at=+` counts from `at`).
    Fault { at: VirtNanos, fault: Fault },
    /// Run a command while the nodes run on; the branch goes on from where
    /// it ended.
    Exec {
        at: VirtNanos,
        node: Option<String>,
        command: Vec<String>,
    },
}

impl Action {
    pub fn at(&self) -> VirtNanos {
        match self {
            Action::Seed { at, .. } | Action::Fault { at, .. } | Action::Exec { at, .. } => *at,
        }
    }
}

/// A moment of a history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MomentId {
    /// The directory the history starts from.
    pub source: PathBuf,
    /// What branches did after the source's own history (empty: the
    /// source's history itself).
    pub actions: Vec<Action>,
    pub when: When,
}

/// Why a text names no moment; each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MomentIdError {
    #[error(transparent)]
    When(#[from] MomentError),
    #[error("bad moment {text:?}: no '@' (expected SOURCE@WHEN, e.g. findings/0001@-1s)")]
    NoAt { text: String },
    #[error("bad moment {text:?}: action {action:?}: {reason}")]
    Action {
        text: String,
        action: String,
        reason: String,
    },
    #[error("bad moment {text:?}: actions go forward in time ({later} comes before {earlier})")]
    Order {
        text: String,
        earlier: VirtNanos,
        later: VirtNanos,
    },
}

/// What is percent-encoded in an action's text: what would end it or the
/// id, and spaces inside a command's words.
const ENCODED: &AsciiSet = &CONTROLS.add(b'%').add(b'~').add(b'@').add(b' ');
/// A fault's text keeps its spaces (it reads as typed).
const FAULT_ENCODED: &AsciiSet = &CONTROLS.add(b'%').add(b'~').add(b'@');

fn encode(text: &str, set: &'static AsciiSet) -> String {
    utf8_percent_encode(text, set).to_string()
}

fn decode(text: &str) -> Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|t| t.into_owned())
        .map_err(|e| format!("not UTF-8 once decoded: {e}"))
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Seed { at, seed } => write!(f, "{at}:seed={seed}"),
            Action::Fault { at, fault } => {
                write!(
                    f,
                    "{at}:fault={}",
                    encode(&fault.to_string(), FAULT_ENCODED)
                )
            }
            Action::Exec { at, node, command } => {
                let words: Vec<String> = command.iter().map(|w| encode(w, ENCODED)).collect();
                let node = node
                    .as_deref()
                    .map_or("-".to_owned(), |n| encode(n, ENCODED));
                write!(f, "{at}:exec={node}:{}", words.join(" "))
            }
        }
    }
}

impl FromStr for Action {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (at, rest) = text
            .split_once(':')
            .ok_or("expected AT:seed=N, AT:fault=F or AT:exec=NODE:COMMAND")?;
        let at: VirtNanos = at.parse().map_err(|e| format!("{e}"))?;
        let (kind, value) = rest
            .split_once('=')
            .ok_or("expected seed=N, fault=F or exec=NODE:COMMAND after the time")?;
        match kind {
            "seed" => Ok(Action::Seed {
                at,
                seed: value
                    .parse()
                    .map_err(|_| format!("seed {value:?} is not a non-negative integer"))?,
            }),
            "fault" => Ok(Action::Fault {
                at,
                fault: decode(value)?.parse().map_err(|e| format!("{e}"))?,
            }),
            "exec" => {
                let (node, command) = value
                    .split_once(':')
                    .ok_or("expected exec=NODE:COMMAND (NODE `-`: beside the nodes)")?;
                let node = match node {
                    "-" => None,
                    node => Some(decode(node)?),
                };
                let command = command
                    .split(' ')
                    .filter(|w| !w.is_empty())
                    .map(decode)
                    .collect::<Result<Vec<_>, _>>()?;
                if command.is_empty() {
                    return Err("an exec needs a command".into());
                }
                Ok(Action::Exec { at, node, command })
            }
            other => Err(format!(
                "unknown action {other:?} (expected seed, fault or exec)"
            )),
        }
    }
}

impl fmt::Display for MomentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.source.display())?;
        for action in &self.actions {
            write!(f, "~{action}")?;
        }
        write!(f, "@{}", self.when)
    }
}

impl FromStr for MomentId {
    type Err = MomentIdError;

    fn from_str(text: &str) -> Result<Self, MomentIdError> {
        // The last '@' that is not part of a directory name.
        let Some((history, when)) = text.rsplit_once('@').filter(|(_, w)| !w.contains('/')) else {
            return Err(MomentIdError::NoAt { text: text.into() });
        };
        if history.is_empty() {
            return Err(MomentError::NoDirectory { text: text.into() }.into());
        }
        let when = When::parse_in(text, when)?;
        let mut parts = history.split('~');
        let source = PathBuf::from(parts.next().unwrap_or_default());
        let actions = parts
            .map(|action| {
                action.parse().map_err(|reason| MomentIdError::Action {
                    text: text.into(),
                    action: action.into(),
                    reason,
                })
            })
            .collect::<Result<Vec<Action>, _>>()?;
        for pair in actions.windows(2) {
            if pair[1].at() < pair[0].at() {
                return Err(MomentIdError::Order {
                    text: text.into(),
                    earlier: pair[0].at(),
                    later: pair[1].at(),
                });
            }
        }
        Ok(MomentId {
            source,
            actions,
            when,
        })
    }
}

impl TryFrom<String> for MomentId {
    type Error = MomentIdError;

    fn try_from(text: String) -> Result<Self, MomentIdError> {
        text.parse()
    }
}

impl From<MomentId> for String {
    fn from(moment: MomentId) -> String {
        moment.to_string()
    }
}

impl MomentId {
    /// The source's own history at `when`.
    pub fn of_source(source: impl Into<PathBuf>, when: When) -> MomentId {
        MomentId {
            source: source.into(),
            actions: Vec::new(),
            when,
        }
    }

    /// The same history at another instant.
    pub fn at(&self, when: When) -> MomentId {
        MomentId {
            when,
            ..self.clone()
        }
    }

    /// The history of this moment with `action` taken after its own.
    pub fn then(&self, action: Action, when: When) -> MomentId {
        let mut actions = self.actions.clone();
        actions.push(action);
        MomentId {
            source: self.source.clone(),
            actions,
            when,
        }
    }

    /// How many branches deep this history is (the actions' distinct
    /// instants).
    pub fn depth(&self) -> usize {
        let mut instants: Vec<VirtNanos> = self.actions.iter().map(Action::at).collect();
        instants.dedup();
        instants.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn test_every_form_parses_once_and_prints_back() {
        let fault: Fault = "at=+1s pause n1 for=0.5s".parse().unwrap();
        let cases = [
            (
                "nightly/findings/0001@-1s",
                MomentId::of_source("nightly/findings/0001", When::BeforeFailure(VirtNanos(S))),
            ),
            (
                "f/0001@failure",
                MomentId::of_source("f/0001", When::Failure),
            ),
            (
                "f/0001~14s:seed=7@20s",
                MomentId {
                    source: "f/0001".into(),
                    actions: vec![Action::Seed {
                        at: VirtNanos(14 * S),
                        seed: 7,
                    }],
                    when: When::Time(VirtNanos(20 * S)),
                },
            ),
            (
                "snaps~2s:seed=1~2s:fault=at=+1s pause n1 for=500ms~3s:exec=n1:sh -c echo%20a%7Eb%40c@5s",
                MomentId {
                    source: "snaps".into(),
                    actions: vec![
                        Action::Seed {
                            at: VirtNanos(2 * S),
                            seed: 1,
                        },
                        Action::Fault {
                            at: VirtNanos(2 * S),
                            fault,
                        },
                        Action::Exec {
                            at: VirtNanos(3 * S),
                            node: Some("n1".into()),
                            command: vec!["sh".into(), "-c".into(), "echo a~b@c".into()],
                        },
                    ],
                    when: When::Time(VirtNanos(5 * S)),
                },
            ),
            (
                "a@b/snaps~1s:exec=-:ps@exit:40",
                MomentId {
                    source: "a@b/snaps".into(),
                    actions: vec![Action::Exec {
                        at: VirtNanos(S),
                        node: None,
                        command: vec!["ps".into()],
                    }],
                    when: When::Exit(vmm::position::InsnPosition::at_exit(40)),
                },
            ),
        ];
        for (text, moment) in cases {
            let parsed: MomentId = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(parsed, moment, "{text}");
            assert_eq!(moment.to_string(), text);
            let json = serde_json::to_string(&moment).unwrap();
            assert_eq!(serde_json::from_str::<MomentId>(&json).unwrap(), moment);
        }
    }

    #[test]
    fn test_bad_texts_are_refused_naming_the_text_and_the_part() {
        for (text, message) in [
            ("f/0001", "bad moment \"f/0001\": no '@'"),
            (
                "f~x@1s",
                "bad moment \"f~x@1s\": action \"x\": expected AT:seed=N",
            ),
            ("f~1s:seed=a@1s", "seed \"a\" is not a non-negative integer"),
            ("f~1s:spin=1@1s", "unknown action \"spin\""),
            ("f~1s:exec=n1:@1s", "an exec needs a command"),
            ("f~1s:fault=nonsense@2s", "action \"1s:fault=nonsense\""),
            (
                "f~3s:seed=1~2s:seed=2@4s",
                "actions go forward in time (2s comes before 3s)",
            ),
            ("f@-x", "bad snapshot spec \"f@-x\""),
        ] {
            let error = text.parse::<MomentId>().unwrap_err().to_string();
            assert!(error.contains(message), "{text}: {error}");
        }
    }

    #[test]
    fn test_depth_counts_the_instants_branched_at() {
        let moment: MomentId = "f~1s:seed=1~1s:fault=at=+0s kill n1~4s:seed=2@5s"
            .parse()
            .unwrap();
        assert_eq!(moment.depth(), 2);
        assert_eq!(
            moment.at(When::Failure).to_string(),
            "f~1s:seed=1~1s:fault=at=+0s kill n1~4s:seed=2@failure"
        );
    }
}
