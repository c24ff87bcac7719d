//! `resolve`: turning a user's snapshot spec (`./snaps@12.5s`, `./snaps@exit:123456`,
//! `./snaps/<id>`, ...) into a snapshot and the target to replay forward to.

use std::fmt;
use std::path::{Path, PathBuf};

use devices::VirtNanos;

use crate::error::{Result, SnapshotError};
use crate::{info, list, validate_id, SnapshotInfo, INDEX_FILE, MEMORY_FILE, STATE_FILE};

/// Where the caller should be after restoring the chosen snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The snapshot was named (`DIR/<id>`, `DIR@<id>`, `DIR@id:<id>`): restore it as is.
    Snapshot,
    /// `DIR@latest`: the last snapshot in (virtual_ns, exit_index, id) order, as is.
    Latest,
    /// `DIR@<time>`: replay forward from the snapshot until the virtual clock reaches this many
    /// nanoseconds (the snapshot's `virtual_ns` is at or before it).
    VirtualTime(u64),
    /// `DIR@exit:<n>`: replay forward from the snapshot until exit index n (the snapshot's
    /// `exit_index` is at or before it).
    ExitIndex(u64),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Snapshot => f.write_str("the named snapshot"),
            Target::Latest => f.write_str("the latest snapshot"),
            Target::VirtualTime(ns) => write!(f, "virtual time {} ({ns} ns)", VirtNanos(*ns)),
            Target::ExitIndex(n) => write!(f, "exit {n}"),
        }
    }
}

/// The outcome of [`resolve`]: the snapshot to restore and what to replay forward to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub snapshot: SnapshotInfo,
    pub target: Target,
}

/// Resolves a snapshot spec:
///
/// * `DIR@<time>` (`./snaps@12.5s`, `./snaps@600` = 600 s; the one duration grammar,
///   `VirtNanos`'s `FromStr`): the latest snapshot at or before that virtual time; target
///   [`Target::VirtualTime`].
/// * `DIR@exit:<n>`: the latest snapshot at or before exit index n; target
///   [`Target::ExitIndex`].
/// * `DIR@latest`: the last snapshot; target [`Target::Latest`].
/// * `DIR@<id>` or `DIR@id:<id>` or `DIR/<id>` (any path to a snapshot directory): that one;
///   target [`Target::Snapshot`]. `id:` forces an id that would parse as a time (e.g. `5s`).
///
/// "Latest at or before" follows `list` order, (virtual_ns, exit_index, id) for a time and
/// (exit_index, virtual_ns, id) for an exit index. A root is meant to hold one timeline (one
/// run and its restores); across diverging branches "latest" picks by these numbers alone.
pub fn resolve(spec: &str) -> Result<Resolved> {
    spec.parse::<SnapshotSpec>()?.resolve()
}

/// A saved moment as users name it, `DIR@<selector>` or a path to one
/// snapshot (`DIR/<id>`): split once here, printed back the same way; what
/// the selector means (a time, `exit:N`, `latest`, an id) is decided when it
/// is resolved against the directory ([`SnapshotSpec::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotSpec {
    /// `DIR@<selector>`.
    At { root: PathBuf, selector: String },
    /// A snapshot's own directory (`DIR/<id>`).
    Dir(PathBuf),
}

impl std::str::FromStr for SnapshotSpec {
    type Err = SnapshotError;

    fn from_str(spec: &str) -> Result<Self> {
        let bad = |reason: &str| SnapshotError::BadSpec {
            spec: spec.to_owned(),
            reason: reason.into(),
        };
        if spec.is_empty() {
            return Err(bad("empty"));
        }
        match spec.rsplit_once('@').filter(|(_, sel)| !sel.contains('/')) {
            Some(("", _)) => Err(bad("no snapshot directory before '@'")),
            Some((_, "")) => Err(bad(
                "nothing after '@': expected a time (12.5s), exit:N, latest or an id",
            )),
            Some((root, selector)) => Ok(SnapshotSpec::At {
                root: root.into(),
                selector: selector.into(),
            }),
            None => Ok(SnapshotSpec::Dir(spec.into())),
        }
    }
}

impl fmt::Display for SnapshotSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotSpec::At { root, selector } => write!(f, "{}@{selector}", root.display()),
            SnapshotSpec::Dir(dir) => write!(f, "{}", dir.display()),
        }
    }
}

impl SnapshotSpec {
    /// The directory of snapshots the moment is in (a snapshot's chain may
    /// reach its siblings there).
    pub fn root(&self) -> PathBuf {
        match self {
            SnapshotSpec::At { root, .. } => root.clone(),
            SnapshotSpec::Dir(dir) => dir.parent().map(Path::to_path_buf).unwrap_or_default(),
        }
    }

    /// The same moment with its paths absolute (they must exist).
    pub fn absolute(&self) -> Result<SnapshotSpec> {
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
            SnapshotSpec::At { root, selector } => SnapshotSpec::At {
                root: absolute(root)?,
                selector: selector.clone(),
            },
            SnapshotSpec::Dir(dir) => SnapshotSpec::Dir(absolute(dir)?),
        })
    }

    /// The snapshot this names and what to replay forward to.
    pub fn resolve(&self) -> Result<Resolved> {
        let spec = self.to_string();
        let dir = match self {
            SnapshotSpec::At { root, selector } => return select(&spec, root, selector),
            SnapshotSpec::Dir(dir) => dir,
        };
        let looks_like_snapshot = [STATE_FILE, MEMORY_FILE, INDEX_FILE]
            .iter()
            .any(|f| dir.join(f).exists());
        if looks_like_snapshot {
            return Ok(Resolved {
                snapshot: info(dir)?,
                target: Target::Snapshot,
            });
        }
        if dir.is_dir() {
            return Err(SnapshotError::BadSpec {
                spec: spec.clone(),
                reason: format!(
                    "{} is a directory of snapshots, not a snapshot; say which: {spec}@12.5s, {spec}@exit:N, {spec}@latest, {spec}@<id> or {spec}/<id>",
                    dir.display()
                ),
            });
        }
        Err(SnapshotError::NotFound {
            root: dir.to_owned(),
            what: "no such snapshot directory".into(),
        })
    }
}

fn select(spec: &str, root: &Path, sel: &str) -> Result<Resolved> {
    let bad = |reason: String| SnapshotError::BadSpec {
        spec: spec.to_owned(),
        reason,
    };
    let target = if let Some(n) = sel.strip_prefix("exit:") {
        let n: u64 = n
            .replace('_', "")
            .parse()
            .map_err(|_| bad(format!("exit index {n:?} is not a non-negative integer")))?;
        Target::ExitIndex(n)
    } else if sel == "latest" {
        Target::Latest
    } else if let Some(id) = sel.strip_prefix("id:") {
        return by_id(root, id);
    } else {
        match sel.parse::<VirtNanos>() {
            Ok(t) => Target::VirtualTime(t.as_nanos()),
            Err(err) => {
                let is_id = validate_id(sel).is_ok();
                if is_id && root.join(sel).is_dir() {
                    return by_id(root, sel);
                }
                if sel.starts_with(|c: char| c.is_ascii_digit() || c == '.') || !is_id {
                    return Err(bad(err.to_string()));
                }
                return Err(SnapshotError::NotFound {
                    root: root.to_owned(),
                    what: format!(
                        "no snapshot with id {sel:?} (and {sel:?} is not a time, exit:N or latest)"
                    ),
                });
            }
        }
    };
    let all = list(root)?;
    let Some(first) = all.first() else {
        return Err(SnapshotError::NotFound {
            root: root.to_owned(),
            what: "no snapshots".into(),
        });
    };
    let chosen = match target {
        Target::Latest | Target::Snapshot => all.last(),
        Target::VirtualTime(ns) => all.iter().rev().find(|i| i.meta.virtual_ns <= ns),
        Target::ExitIndex(n) => all
            .iter()
            .filter(|i| i.meta.exit_index <= n)
            .max_by(|a, b| {
                (a.meta.exit_index, a.meta.virtual_ns, &a.meta.id).cmp(&(
                    b.meta.exit_index,
                    b.meta.virtual_ns,
                    &b.meta.id,
                ))
            }),
    };
    match chosen {
        Some(s) => Ok(Resolved {
            snapshot: s.clone(),
            target,
        }),
        None => {
            let earliest = match target {
                Target::ExitIndex(_) => all
                    .iter()
                    .min_by_key(|i| (i.meta.exit_index, i.meta.virtual_ns, &i.meta.id))
                    .unwrap_or(first),
                _ => first,
            };
            Err(SnapshotError::TooEarly {
                root: root.to_owned(),
                target: target.to_string(),
                earliest: format!(
                    "{:?} at virtual time {} (exit {})",
                    earliest.meta.id,
                    VirtNanos(earliest.meta.virtual_ns),
                    earliest.meta.exit_index
                ),
            })
        }
    }
}

fn by_id(root: &Path, id: &str) -> Result<Resolved> {
    validate_id(id)?;
    let dir = root.join(id);
    if !dir.is_dir() {
        return Err(SnapshotError::NotFound {
            root: root.to_owned(),
            what: format!("no snapshot with id {id:?}"),
        });
    }
    Ok(Resolved {
        snapshot: info(&dir)?,
        target: Target::Snapshot,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_target_prints_the_one_duration_format() {
        assert_eq!(
            Target::VirtualTime(500_000_000).to_string(),
            "virtual time 500ms (500000000 ns)"
        );
        assert_eq!(
            Target::VirtualTime(12_500_000_000).to_string(),
            "virtual time 12.5s (12500000000 ns)"
        );
    }

    #[test]
    fn test_bad_times_are_bad_specs_naming_the_text() {
        for (spec, why) in [
            ("/nonexistent/snaps@5x", "unknown unit \"x\""),
            ("/nonexistent/snaps@1.5ns", "finer than a nanosecond"),
            (
                "/nonexistent/snaps@99999999999999999999",
                "beyond the largest",
            ),
            ("/nonexistent/snaps@.s", "expected a decimal number"),
        ] {
            let err = resolve(spec).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(err, SnapshotError::BadSpec { .. }),
                "{spec}: {msg}"
            );
            assert!(msg.contains(why), "{spec}: {msg}");
        }
    }

    #[test]
    fn test_specs_split_once_and_print_back() {
        for text in [
            "snaps@12.5s",
            "snaps@exit:3",
            "a@b/snaps@latest",
            "snaps/exit-000000000005",
            "/x/y@id:5s",
        ] {
            let spec: SnapshotSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
            assert_eq!(spec.to_string().parse::<SnapshotSpec>().unwrap(), spec);
        }
        assert_eq!(
            "a@b/snaps@latest".parse::<SnapshotSpec>().unwrap().root(),
            PathBuf::from("a@b/snaps")
        );
        assert_eq!(
            "snaps/exit-5".parse::<SnapshotSpec>().unwrap().root(),
            PathBuf::from("snaps")
        );
        for bad in ["", "@5s", "snaps@"] {
            assert!(bad.parse::<SnapshotSpec>().is_err(), "{bad:?}");
        }
    }
}
