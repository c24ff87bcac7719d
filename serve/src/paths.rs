//! Every path a call names stays inside the server's root: a relative path
//! is taken from the root, `..` is refused outright, and the path is
//! resolved (symbolic links followed) and must still lie inside the
//! canonical root, so a link pointing out is refused too.

use debugger::moment::MomentId;
use std::path::{Component, Path, PathBuf};

/// Why a path a call named is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("{path}: `..` is not allowed in a path (paths stay inside the server's root {root})")]
    Parent { path: String, root: String },
    #[error("{path}: no such file or directory under the server's root {root}")]
    Missing { path: String, root: String },
    #[error("{path}: outside the server's root {root} (as resolved: {resolved})")]
    Outside {
        path: String,
        root: String,
        resolved: String,
    },
    #[error("{what}: {reason}")]
    Moment { what: String, reason: String },
}

/// The server's root, canonical.
#[derive(Clone, Debug)]
pub struct Root {
    dir: PathBuf,
}

impl Root {
    /// `dir` as the root (it must exist).
    pub fn new(dir: &Path) -> std::io::Result<Root> {
        Ok(Root {
            dir: dir.canonicalize()?,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `path` (relative to the root, or absolute) resolved inside the root.
    pub fn resolve(&self, path: &Path) -> Result<PathBuf, PathError> {
        let text = path.display().to_string();
        let root = self.dir.display().to_string();
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(PathError::Parent { path: text, root });
        }
        let joined = if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.dir.join(path)
        };
        let resolved = joined.canonicalize().map_err(|_| PathError::Missing {
            path: text.clone(),
            root: root.clone(),
        })?;
        if !resolved.starts_with(&self.dir) {
            return Err(PathError::Outside {
                path: text,
                root,
                resolved: resolved.display().to_string(),
            });
        }
        Ok(resolved)
    }

    /// A moment id (`SOURCE[~ACTION]...@WHEN`) whose source is resolved
    /// inside the root.
    pub fn moment(&self, text: &str) -> Result<MomentId, PathError> {
        let mut moment: MomentId =
            text.parse()
                .map_err(|e: debugger::moment::MomentIdError| PathError::Moment {
                    what: text.to_owned(),
                    reason: e.to_string(),
                })?;
        moment.source = self.resolve(&moment.source)?;
        Ok(moment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_paths_stay_inside_the_root() {
        let scratch = tempfile::tempdir().unwrap();
        let root_dir = scratch.path().join("root");
        std::fs::create_dir_all(root_dir.join("campaign/findings/0001")).unwrap();
        std::fs::create_dir_all(scratch.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(scratch.path().join("outside"), root_dir.join("link")).unwrap();
        let root = Root::new(&root_dir).unwrap();
        let inside = root.resolve(Path::new("campaign/findings/0001")).unwrap();
        assert!(inside.starts_with(root.dir()));
        assert_eq!(root.resolve(&inside).unwrap(), inside);
        assert!(matches!(
            root.resolve(Path::new("campaign/../../outside")),
            Err(PathError::Parent { .. })
        ));
        assert!(matches!(
            root.resolve(Path::new("link")),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            root.resolve(&scratch.path().join("outside")),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            root.resolve(Path::new("nothing")),
            Err(PathError::Missing { .. })
        ));
        let moment = root.moment("campaign/findings/0001@-1s").unwrap();
        assert_eq!(moment.source, inside);
        assert!(matches!(
            root.moment("link@1s"),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            root.moment("no at sign"),
            Err(PathError::Moment { .. })
        ));
    }
}
