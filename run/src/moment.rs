//! A moment of a saved history, as users name it: `DIR@12.5s`,
//! `DIR@exit:N`, `DIR@latest`, `DIR@ID` (`DIR@id:ID` for an id that reads
//! as something else) or `DIR/ID`. Parsed once, where the text comes in
//! (the CLI's argument parser), printed back by one `Display`, carried
//! typed by every request that restores a moment; serialized as the same
//! text. What a moment means in a directory (which snapshot, what to replay
//! forward to) is decided by [`Moment::resolve`].
//!
//! The grammar grows by variants, not by a second parser: a finding's
//! failure moment (`F@failure`) and a time before it (`F@-1s`, recognised
//! by its sign) are [`When`] variants that only a finding's history has
//! (the `debugger` crate resolves them; a directory of snapshots refuses
//! them); an instruction offset after an exit (`DIR@exit:N+insn:K`, the
//! one position grammar, [`InsnPosition`]'s) is part of [`When::Exit`].

use serde::{Deserialize, Serialize};
use snapshot::{validate_id, Resolved, SnapshotError, Target};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use vmm::position::{InsnPosition, PositionError};
use vmm::VirtNanos;

/// A moment of a saved history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Moment {
    /// `DIR@<when>`: a moment in the history whose snapshots are in `dir`.
    At { dir: PathBuf, when: When },
    /// `DIR/ID` (any path to one snapshot's directory): that snapshot, as
    /// saved.
    Snapshot(PathBuf),
}

/// Which moment of a directory's history (after its `@`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum When {
    /// `latest`: the last snapshot, as saved.
    Latest,
    /// `ID` or `id:ID`: that snapshot, as saved.
    Id(String),
    /// `12.5s` (the one duration grammar, [`VirtNanos`]'s): this virtual
    /// time since boot, replayed forward from the last snapshot at or
    /// before it.
    Time(VirtNanos),
    /// `exit:N` or `exit:N+insn:K`: once N exits have been handled (and K
    /// single steps taken after them), replayed forward from the last
    /// snapshot at or before exit N.
    Exit(InsnPosition),
    /// `failure`: a finding's failure moment (the first record that broke
    /// its property); only in a finding's history.
    Failure,
    /// `-1s`: this long before a finding's failure moment.
    BeforeFailure(VirtNanos),
}

/// Why a text names no moment. Each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MomentError {
    #[error("bad snapshot spec {text:?}: empty")]
    Empty { text: String },
    #[error("bad snapshot spec {text:?}: no snapshot directory before '@'")]
    NoDirectory { text: String },
    #[error(
        "bad snapshot spec {text:?}: nothing after '@': expected a time (12.5s), exit:N, latest or an id"
    )]
    NothingAfterAt { text: String },
    #[error("bad snapshot spec {text:?}: exit index {index:?} is not a non-negative integer")]
    ExitIndex { text: String, index: String },
    /// A position's other faults (its reason names the position).
    #[error("bad snapshot spec {text:?}: {reason}")]
    Position { text: String, reason: PositionError },
    /// Neither a time nor an id (the duration's reason is part of the
    /// message: a command line's parser shows the message alone).
    #[error("bad snapshot spec {text:?}: {reason}")]
    Time {
        text: String,
        reason: devices::DurationError,
    },
    #[error("bad snapshot spec {text:?}: {reason}")]
    Id { text: String, reason: String },
}

impl FromStr for Moment {
    type Err = MomentError;

    fn from_str(text: &str) -> Result<Self, MomentError> {
        let owned = || text.to_owned();
        if text.is_empty() {
            return Err(MomentError::Empty { text: owned() });
        }
        // The last '@' that is not part of a directory name.
        let Some((dir, when)) = text
            .rsplit_once('@')
            .filter(|(_, when)| !when.contains('/'))
        else {
            return Ok(Moment::Snapshot(text.into()));
        };
        if dir.is_empty() {
            return Err(MomentError::NoDirectory { text: owned() });
        }
        let when = When::parse_in(text, when)?;
        Ok(Moment::At {
            dir: dir.into(),
            when,
        })
    }
}

impl When {
    /// What follows the `@` of `text` (named in errors): `when`.
    pub fn parse_in(text: &str, when: &str) -> Result<When, MomentError> {
        let owned = || text.to_owned();
        Ok(if when.is_empty() {
            return Err(MomentError::NothingAfterAt { text: owned() });
        } else if when.starts_with("exit:") {
            When::Exit(when.parse().map_err(|reason| match reason {
                PositionError::ExitIndex { index, .. } => MomentError::ExitIndex {
                    text: owned(),
                    index,
                },
                reason => MomentError::Position {
                    text: owned(),
                    reason,
                },
            })?)
        } else if when == "latest" {
            When::Latest
        } else if when == "failure" {
            When::Failure
        } else if let Some(before) = when.strip_prefix('-') {
            When::BeforeFailure(before.parse().map_err(|reason| MomentError::Time {
                text: owned(),
                reason,
            })?)
        } else if let Some(id) = when.strip_prefix("id:") {
            validate_id(id).map_err(|e| MomentError::Id {
                text: owned(),
                reason: e.to_string(),
            })?;
            When::Id(id.to_owned())
        } else {
            match when.parse::<VirtNanos>() {
                Ok(time) => When::Time(time),
                // Not a time: an id, if it can be one.
                Err(reason) => match validate_id(when) {
                    Ok(()) => When::Id(when.to_owned()),
                    Err(_) => {
                        return Err(MomentError::Time {
                            text: owned(),
                            reason,
                        })
                    }
                },
            }
        })
    }
}

impl fmt::Display for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            When::Latest => f.write_str("latest"),
            When::Id(id) if id_reads_as_itself(id) => f.write_str(id),
            When::Id(id) => write!(f, "id:{id}"),
            When::Time(time) => write!(f, "{time}"),
            When::Exit(position) => write!(f, "{position}"),
            When::Failure => f.write_str("failure"),
            When::BeforeFailure(before) => write!(f, "-{before}"),
        }
    }
}

/// Whether `id` after a bare `@` reads back as that id (not as `latest` or
/// a time); `id:` marks those that do not.
fn id_reads_as_itself(id: &str) -> bool {
    id != "latest" && id != "failure" && !id.starts_with('-') && id.parse::<VirtNanos>().is_err()
}

impl fmt::Display for Moment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Moment::At { dir, when } => write!(f, "{}@{when}", dir.display()),
            Moment::Snapshot(dir) => write!(f, "{}", dir.display()),
        }
    }
}

impl TryFrom<String> for Moment {
    type Error = MomentError;

    fn try_from(text: String) -> Result<Self, MomentError> {
        text.parse()
    }
}

impl From<Moment> for String {
    fn from(moment: Moment) -> String {
        moment.to_string()
    }
}

impl Moment {
    /// The directory of snapshots the moment is in (a snapshot's chain may
    /// reach its siblings there).
    pub fn root(&self) -> PathBuf {
        match self {
            Moment::At { dir, .. } => dir.clone(),
            Moment::Snapshot(dir) => dir.parent().map(Path::to_path_buf).unwrap_or_default(),
        }
    }

    /// The same moment with its paths absolute (they must exist).
    pub fn absolute(&self) -> Result<Moment, SnapshotError> {
        let absolute = |p: &Path| {
            let p = if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            };
            p.canonicalize().map_err(|_| SnapshotError::NotFound {
                root: p.to_owned(),
                what: "no such snapshot directory".into(),
            })
        };
        Ok(match self {
            Moment::At { dir, when } => Moment::At {
                dir: absolute(dir)?,
                when: when.clone(),
            },
            Moment::Snapshot(dir) => Moment::Snapshot(absolute(dir)?),
        })
    }

    /// The single steps to take after the replay reached the resolved
    /// target (`DIR@exit:N+insn:K`'s K; 0 for every other moment).
    pub fn insn_steps(&self) -> u64 {
        match self {
            Moment::At {
                when: When::Exit(position),
                ..
            } => position.steps,
            _ => 0,
        }
    }

    /// The snapshot this moment is restored from and what to replay forward
    /// to, from the directory's files.
    ///
    /// "At or before" follows `snapshot::list` order: (virtual_ns,
    /// exit_index, id) for a time, (exit_index, virtual_ns, id) for an exit.
    /// A directory is meant to hold one timeline (one run and its
    /// restores); across diverging branches the numbers alone choose.
    pub fn resolve(&self) -> Result<Resolved, SnapshotError> {
        let (dir, when) = match self {
            Moment::Snapshot(dir) => return snapshot::resolve_dir(dir),
            Moment::At { dir, when } => (dir, when),
        };
        match when {
            When::Latest => snapshot::select(dir, Target::Latest),
            When::Time(time) => snapshot::select(dir, Target::VirtualTime(*time)),
            When::Exit(position) => snapshot::select(dir, Target::ExitIndex(position.exit)),
            When::Id(id) if dir.join(id).is_dir() => snapshot::by_id(dir, id),
            When::Id(id) => Err(self.no_such_id(dir, id)),
            When::Failure | When::BeforeFailure(_) => Err(SnapshotError::BadSpec {
                spec: self.to_string(),
                reason: "a failure's moment is in a finding's history (DIR/findings/NNNN), \
                         not in a directory of snapshots"
                    .into(),
            }),
        }
    }

    /// Why `DIR@ID` names nothing: a text that starts like a number was
    /// most likely meant as a time (its reason is given); a bare word
    /// could have been a time, `exit:N` or `latest` too.
    fn no_such_id(&self, dir: &Path, id: &str) -> SnapshotError {
        if id.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            if let Err(reason) = id.parse::<VirtNanos>() {
                return SnapshotError::BadSpec {
                    spec: self.to_string(),
                    reason: reason.to_string(),
                };
            }
        }
        let what = if id_reads_as_itself(id) {
            format!("no snapshot with id {id:?} (and {id:?} is not a time, exit:N or latest)")
        } else {
            format!("no snapshot with id {id:?}")
        };
        SnapshotError::NotFound {
            root: dir.to_owned(),
            what,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(dir: &str, when: When) -> Moment {
        Moment::At {
            dir: dir.into(),
            when,
        }
    }

    #[test]
    fn test_every_form_parses_once_and_prints_back() {
        let s = 1_000_000_000u64;
        for (text, moment) in [
            (
                "snaps@12.5s",
                at("snaps", When::Time(VirtNanos(12 * s + s / 2))),
            ),
            (
                "snaps@exit:3",
                at("snaps", When::Exit(InsnPosition::at_exit(3))),
            ),
            (
                "snaps@exit:1200+insn:37",
                at(
                    "snaps",
                    When::Exit(InsnPosition {
                        exit: 1200,
                        steps: 37,
                    }),
                ),
            ),
            ("a@b/snaps@latest", at("a@b/snaps", When::Latest)),
            ("snaps@s1", at("snaps", When::Id("s1".into()))),
            ("/x/y@id:5s", at("/x/y", When::Id("5s".into()))),
            ("/x/y@id:latest", at("/x/y", When::Id("latest".into()))),
            ("/x/y@id:failure", at("/x/y", When::Id("failure".into()))),
            ("f/0001@failure", at("f/0001", When::Failure)),
            (
                "f/0001@-1.5s",
                at("f/0001", When::BeforeFailure(VirtNanos(s + s / 2))),
            ),
            (
                "snaps/exit-000000000005",
                Moment::Snapshot("snaps/exit-000000000005".into()),
            ),
            ("snaps/s2/", Moment::Snapshot("snaps/s2/".into())),
        ] {
            assert_eq!(text.parse::<Moment>().unwrap(), moment, "{text}");
            assert_eq!(moment.to_string(), text);
            // Serialized as the same text.
            let json = serde_json::to_string(&moment).unwrap();
            assert_eq!(json, serde_json::to_string(text).unwrap());
            assert_eq!(serde_json::from_str::<Moment>(&json).unwrap(), moment);
        }
    }

    #[test]
    fn test_times_are_the_one_duration_grammar_and_print_canonically() {
        let s = 1_000_000_000u64;
        for (text, ns, shown) in [
            ("d@600", 600 * s, "d@600s"),
            ("d@4.5", 4 * s + s / 2, "d@4.5s"),
            ("d@7500000us", 7 * s + s / 2, "d@7.5s"),
            ("d@5000000µs", 5 * s, "d@5s"),
            ("d@2m", 120 * s, "d@120s"),
            ("d@4999ms", 4_999_000_000, "d@4.999s"),
            ("d@exit:1_000", 0, "d@exit:1000"),
            ("d@exit:7+insn:0", 0, "d@exit:7"),
            ("d@exit:7+insn:1_000", 0, "d@exit:7+insn:1000"),
            ("d@id:s1", 0, "d@s1"),
        ] {
            let moment: Moment = text.parse().unwrap();
            if let Moment::At {
                when: When::Time(t),
                ..
            } = &moment
            {
                assert_eq!(t.as_nanos(), ns, "{text}");
            }
            assert_eq!(moment.to_string(), shown);
            assert_eq!(shown.parse::<Moment>().unwrap(), moment);
        }
    }

    #[test]
    fn test_bad_texts_are_refused_naming_the_text() {
        for (text, message) in [
            ("", "bad snapshot spec \"\": empty"),
            ("@5s", "bad snapshot spec \"@5s\": no snapshot directory before '@'"),
            ("snaps@", "bad snapshot spec \"snaps@\": nothing after '@': expected a time (12.5s), exit:N, latest or an id"),
            ("snaps@exit:x", "bad snapshot spec \"snaps@exit:x\": exit index \"x\" is not a non-negative integer"),
            ("snaps@.s", "bad snapshot spec \"snaps@.s\": unparsable duration \".s\": expected a decimal number and a unit"),
            ("snaps@exit:", "bad snapshot spec \"snaps@exit:\": exit index \"\" is not a non-negative integer"),
            ("snaps@exit:3+4", "bad snapshot spec \"snaps@exit:3+4\": position \"exit:3+4\": after '+' expected insn:K, K single steps after the exit"),
            ("snaps@exit:3+insn:x", "bad snapshot spec \"snaps@exit:3+insn:x\": position \"exit:3+insn:x\": step count \"x\" is not a non-negative integer"),
            ("snaps@a b", "bad snapshot spec \"snaps@a b\": unparsable duration \"a b\""),
            ("snaps@id:a b", "bad snapshot spec \"snaps@id:a b\": invalid snapshot id \"a b\""),
        ] {
            let e = text.parse::<Moment>().unwrap_err();
            assert!(e.to_string().starts_with(message), "{text}: {e}");
            // From JSON too, with the same message.
            let json = serde_json::to_string(text).unwrap();
            let e = serde_json::from_str::<Moment>(&json).unwrap_err();
            assert!(e.to_string().starts_with(message), "{text}: {e}");
        }
    }

    #[test]
    fn test_roots_are_the_directory_of_snapshots() {
        let root = |text: &str| text.parse::<Moment>().unwrap().root();
        assert_eq!(root("a@b/snaps@latest"), PathBuf::from("a@b/snaps"));
        assert_eq!(root("snaps/exit-5"), PathBuf::from("snaps"));
    }

    #[test]
    fn test_an_id_naming_nothing_says_what_else_it_could_have_been() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let error = |text: String| {
            let moment: Moment = text.parse().unwrap();
            moment.resolve().unwrap_err().to_string()
        };
        assert_eq!(
            error(format!("{d}@bad")),
            format!(
                "{d}: no snapshot with id \"bad\" (and \"bad\" is not a time, exit:N or latest)"
            )
        );
        assert_eq!(
            error(format!("{d}@id:5s")),
            format!("{d}: no snapshot with id \"5s\"")
        );
        // Texts that could be ids are tried as ids first: one that starts
        // like a number and names none was meant as a time.
        assert!(error(format!("{d}@1.5ns"))
            .ends_with("unparsable duration \"1.5ns\": finer than a nanosecond"));
        assert!(error(format!("{d}@12.5parsecs")).contains("unparsable duration \"12.5parsecs\""));
        assert_eq!(
            error(format!("{d}@5x")),
            format!("bad snapshot spec \"{d}@5x\": unparsable duration \"5x\": unknown unit \"x\" (use ns, us or µs, ms, s, m or min, h; no unit means seconds)")
        );
    }
}
