//! Choosing the snapshot a moment is restored from, and the target to replay forward to: a
//! snapshot's own directory ([`resolve_dir`]), one by id ([`by_id`]), or the last at or
//! before a time or an exit ([`select`]). The text users write for a moment (`./snaps@12.5s`)
//! is parsed above this crate, by `run::moment`.

use std::fmt;
use std::path::Path;

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
    /// `DIR@<time>`: replay forward from the snapshot until the virtual clock reaches this time
    /// (the snapshot's `virtual_ns` is at or before it).
    VirtualTime(VirtNanos),
    /// `DIR@exit:<n>`: replay forward from the snapshot until exit index n (the snapshot's
    /// `exit_index` is at or before it).
    ExitIndex(u64),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Snapshot => f.write_str("the named snapshot"),
            Target::Latest => f.write_str("the latest snapshot"),
            Target::VirtualTime(time) => write!(f, "virtual time {time} ({} ns)", time.as_nanos()),
            Target::ExitIndex(n) => write!(f, "exit {n}"),
        }
    }
}

/// A moment resolved: the snapshot to restore and what to replay forward to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub snapshot: SnapshotInfo,
    pub target: Target,
}

/// The snapshot in its own directory `dir` (`DIR/<id>`), restored as is. A
/// directory of snapshots is refused, naming the ways to say which.
pub fn resolve_dir(dir: &Path) -> Result<Resolved> {
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
        let spec = dir.display();
        return Err(SnapshotError::BadSpec {
            spec: spec.to_string(),
            reason: format!(
                "{spec} is a directory of snapshots, not a snapshot; say which: {spec}@12.5s, {spec}@exit:N, {spec}@latest, {spec}@<id> or {spec}/<id>"
            ),
        });
    }
    Err(SnapshotError::NotFound {
        root: dir.to_owned(),
        what: "no such snapshot directory".into(),
    })
}

/// The snapshot in `root` to replay forward from to `target`: the last at
/// or before it in `list` order ((virtual_ns, exit_index, id) for a time,
/// (exit_index, virtual_ns, id) for an exit index), or the last of all for
/// [`Target::Latest`].
pub fn select(root: &Path, target: Target) -> Result<Resolved> {
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
                    earliest.meta.id, earliest.meta.virtual_ns, earliest.meta.exit_index
                ),
            })
        }
    }
}

/// The snapshot with id `id` in `root`, restored as is.
pub fn by_id(root: &Path, id: &str) -> Result<Resolved> {
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
            Target::VirtualTime(VirtNanos(500_000_000)).to_string(),
            "virtual time 500ms (500000000 ns)"
        );
        assert_eq!(
            Target::VirtualTime(VirtNanos(12_500_000_000)).to_string(),
            "virtual time 12.5s (12500000000 ns)"
        );
    }
}
