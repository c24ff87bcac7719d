//! Host directories shared with the payload (virtio-9p), and its working directory: checked
//! before QEMU starts, each mounted in L1 at the same absolute path.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Host directories L1's init needs for itself: a shared directory may not be, contain or lie
/// inside one of them (mounting over them would hide busybox, the payload or the kernel's
/// filesystems).
const RESERVED_L1_PATHS: [&str; 9] = [
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/dev",
    "/proc",
    "/sys",
    "/payload",
    "/etc/helper-vm",
];

/// A shared directory or working directory that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("shared directory {} is not an absolute path", .0.display())]
    NotAbsolute(PathBuf),
    #[error("shared directory {0:?} contains a NUL byte")]
    Nul(PathBuf),
    #[error("shared directory {} not found", path.display())]
    NotFound {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "shared directory {} is not canonical (it is {}): it is mounted in the helper VM at \
         the path given, which must be the real one",
        path.display(),
        canonical.display()
    )]
    NotCanonical { path: PathBuf, canonical: PathBuf },
    #[error("shared directory {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("the root directory cannot be shared with the helper VM")]
    Root,
    #[error("shared directory {} would hide or lie inside the helper VM's own {reserved}", path.display())]
    Reserved {
        path: PathBuf,
        reserved: &'static str,
    },
    #[error("shared directory {} given twice", .0.display())]
    Duplicate(PathBuf),
    #[error("helper VM working directory {} is not an absolute path", .0.display())]
    WorkdirNotAbsolute(PathBuf),
    #[error("helper VM working directory {0:?} contains a NUL byte")]
    WorkdirNul(PathBuf),
}

/// The 9p mount tag of the `index`th entry of [`checked_shares`].
pub(crate) fn share_tag(index: usize) -> String {
    format!("share{index}")
}

/// Validates shared directories; returns them in mount order (sorted by path, so a parent comes
/// before the shares nested in it). The mount tag of the `i`th is [`share_tag`]`(i)`.
pub(crate) fn checked_shares(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, ShareError> {
    let mut out = Vec::with_capacity(dirs.len());
    for d in dirs {
        if !d.is_absolute() {
            return Err(ShareError::NotAbsolute(d.clone()));
        }
        if d.as_os_str().as_bytes().contains(&0) {
            return Err(ShareError::Nul(d.clone()));
        }
        let canonical = fs::canonicalize(d).map_err(|source| ShareError::NotFound {
            path: d.clone(),
            source,
        })?;
        if canonical != *d {
            return Err(ShareError::NotCanonical {
                path: d.clone(),
                canonical,
            });
        }
        if !canonical.is_dir() {
            return Err(ShareError::NotADirectory(d.clone()));
        }
        if d.parent().is_none() {
            return Err(ShareError::Root);
        }
        if let Some(r) = RESERVED_L1_PATHS
            .iter()
            .find(|r| d.starts_with(r) || Path::new(r).starts_with(d))
        {
            return Err(ShareError::Reserved {
                path: d.clone(),
                reserved: r,
            });
        }
        out.push(canonical);
    }
    out.sort();
    if let Some(w) = out.windows(2).find(|w| w[0] == w[1]) {
        return Err(ShareError::Duplicate(w[0].clone()));
    }
    Ok(out)
}

/// Validates the payload's working directory.
pub(crate) fn checked_workdir(dir: Option<&Path>) -> Result<Option<&Path>, ShareError> {
    if let Some(d) = dir {
        if !d.is_absolute() {
            return Err(ShareError::WorkdirNotAbsolute(d.to_path_buf()));
        }
        if d.as_os_str().as_bytes().contains(&0) {
            return Err(ShareError::WorkdirNul(d.to_path_buf()));
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tempdir::new_temp_dir;

    #[test]
    fn shared_dir_checks() {
        let tmp = new_temp_dir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        let (a, b, nested) = (base.join("a"), base.join("b"), base.join("a/n"));
        for d in [&a, &b, &nested] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(base.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(&a, base.join("link")).unwrap();
        assert_eq!(
            checked_shares(&[b.clone(), nested.clone(), a.clone()]).unwrap(),
            [a.clone(), nested.clone(), b.clone()],
            "parents first"
        );
        assert!(checked_shares(&[]).unwrap().is_empty());
        let bad = |d: PathBuf, why: &str| {
            let err = checked_shares(std::slice::from_ref(&d))
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{d:?}: {err}");
        };
        bad("rel/dir".into(), "not an absolute path");
        bad(base.join("missing"), "not found");
        bad(base.join("a/../b"), "not canonical");
        bad(base.join("link"), "not canonical");
        bad(base.join("file"), "not a directory");
        bad("/".into(), "root directory");
        bad("/usr".into(), "/usr/bin");
        bad("/dev".into(), "/dev");
        bad("/sys/kernel".into(), "/sys");
        let err = checked_shares(&[a.clone(), b, a]).unwrap_err();
        assert!(err.to_string().contains("given twice"), "{err}");

        assert_eq!(checked_workdir(None).unwrap(), None);
        assert_eq!(
            checked_workdir(Some(&nested)).unwrap(),
            Some(nested.as_path())
        );
        assert!(checked_workdir(Some(Path::new("rel"))).is_err());
    }
}
