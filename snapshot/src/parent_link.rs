//! A parent in another root: an incremental snapshot over a snapshot that lives in another
//! directory of snapshots (a branch's first snapshot, over the moment the branch was restored
//! from). The child records where its parent is, relative to its own root, and the checksums
//! of the parent's two framed files as they were when the child was written, so that a parent
//! moved away, removed, or replaced by another snapshot of the same id is refused by name
//! rather than read as some other memory.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{io, Result, SnapshotError};
use crate::SnapshotMeta;

/// Where an incremental snapshot's parent lives when it is not in the child's root, and what
/// it was when the child was written over it ([`crate::SnapshotMeta::parent_link`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParentLink {
    /// The parent snapshot's directory, relative to the directory that holds the child (its
    /// root), e.g. `../snaps/exit-000000001234`: names and `..` only, the last name the
    /// parent's id. Relative, so that the two directories can move together.
    pub path: String,
    /// The CRC-64/XZ of the parent's `state.bin` payload (the checksum in its header) when
    /// the child was written.
    pub state_crc: u64,
    /// The same for the parent's `memory.idx`, which holds the checksum of its stored pages.
    pub index_crc: u64,
}

impl ParentLink {
    /// Checks the link's form against the parent id it must end in; the reason if it is bad.
    pub(crate) fn check_form(&self, parent: &str) -> std::result::Result<(), String> {
        let path = Path::new(&self.path);
        let ok_parts = path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::ParentDir));
        if self.path.is_empty() || !ok_parts {
            return Err(format!(
                "parent_link.path {:?} is not a relative path of names and '..'",
                self.path
            ));
        }
        if path.file_name().and_then(|n| n.to_str()) != Some(parent) {
            return Err(format!(
                "parent_link.path {:?} does not end in the parent's id {parent:?}",
                self.path
            ));
        }
        Ok(())
    }
}

/// The directory of `meta`'s parent, for a snapshot held in `root`: the link's path from
/// `root` if it has one, else the parent's id in `root`. `None` without a parent.
pub(crate) fn parent_dir(root: &Path, meta: &SnapshotMeta) -> Option<PathBuf> {
    match (&meta.parent_link, &meta.parent) {
        (Some(link), _) => Some(root.join(&link.path)),
        (None, Some(id)) => Some(root.join(id)),
        (None, None) => None,
    }
}

/// How a child written into `root` names the snapshot in `parent_dir` (whose framed files
/// have the checksums `state_crc` and `index_crc`): by id alone when `parent_dir` is in
/// `root` (`None`), else by a link. Both directories must exist.
pub(crate) fn link_from(
    root: &Path,
    parent_dir: &Path,
    state_crc: u64,
    index_crc: u64,
) -> Result<Option<ParentLink>> {
    let root = root.canonicalize().map_err(io(root, "canonicalize"))?;
    let parent = parent_dir
        .canonicalize()
        .map_err(io(parent_dir, "canonicalize"))?;
    if parent.parent() == Some(root.as_path()) {
        return Ok(None);
    }
    let relative = pathdiff::diff_paths(&parent, &root).ok_or_else(|| {
        SnapshotError::InvalidArgument(format!(
            "no relative path from {} to {}",
            root.display(),
            parent.display()
        ))
    })?;
    let path = relative.to_str().ok_or_else(|| {
        SnapshotError::InvalidArgument(format!(
            "the path from {} to the parent {} is not UTF-8",
            root.display(),
            parent.display()
        ))
    })?;
    Ok(Some(ParentLink {
        path: path.to_owned(),
        state_crc,
        index_crc,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(path: &str) -> ParentLink {
        ParentLink {
            path: path.into(),
            state_crc: 1,
            index_crc: 2,
        }
    }

    #[test]
    fn test_a_link_is_relative_names_and_dotdot_ending_in_the_parent() {
        for ok in [
            "../snaps/exit-1",
            "exit-1",
            "../../a/b/exit-1",
            "sub/exit-1",
        ] {
            link(ok).check_form("exit-1").unwrap();
        }
        for (bad, why) in [
            ("", "not a relative path"),
            ("/abs/exit-1", "not a relative path"),
            ("./exit-1", "not a relative path"),
            ("../snaps/exit-2", "does not end in the parent's id"),
            ("../snaps/exit-1/..", "does not end in the parent's id"),
        ] {
            let e = link(bad).check_form("exit-1").unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn test_a_parent_in_the_same_root_is_named_by_id_and_another_by_a_relative_path() {
        let top = tempfile::tempdir().unwrap();
        let snaps = top.path().join("snaps");
        let branch = top.path().join("runs/branch");
        std::fs::create_dir_all(snaps.join("exit-1")).unwrap();
        std::fs::create_dir_all(&branch).unwrap();
        assert_eq!(
            link_from(&snaps, &snaps.join("exit-1"), 1, 2).unwrap(),
            None
        );
        let found = link_from(&branch, &snaps.join("exit-1"), 1, 2)
            .unwrap()
            .unwrap();
        assert_eq!(found, link("../../snaps/exit-1"));
        assert_eq!(
            branch.join(&found.path).canonicalize().unwrap(),
            snaps.join("exit-1").canonicalize().unwrap()
        );
        let e = link_from(&branch, &snaps.join("exit-9"), 1, 2).unwrap_err();
        assert!(e.to_string().contains("exit-9"), "{e}");
    }
}
