//! `DIR[:TAG]` references to an image in an OCI image layout directory.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::ImageError;

/// An image in an OCI image layout directory: the directory, and optionally the tag
/// (`org.opencontainers.image.ref.name` annotation in `index.json`) that selects the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciRef {
    /// The layout directory (holding `oci-layout`, `index.json` and `blobs/`).
    pub layout_dir: PathBuf,
    /// The tag; `None` when the layout holds a single image.
    pub tag: Option<String>,
}

/// Parses `"./dir:tag"` or `"./dir"`.
///
/// The string splits at its last `:` when what follows is a tag (no `/`); a tag must match the
/// OCI grammar `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`. A directory whose own name contains `:`
/// is still recognised when the whole string names an existing directory and the part before
/// the last `:` does not.
pub fn parse_oci_ref(s: &str) -> Result<OciRef, ImageError> {
    let err = |reason: &str| ImageError::InvalidReference {
        reference: s.to_owned(),
        reason: reason.to_owned(),
    };
    if s.is_empty() {
        return Err(err("empty reference"));
    }
    if let Some((dir, tag)) = s.rsplit_once(':') {
        if !tag.contains('/') {
            let whole_is_dir = Path::new(s).is_dir() && !Path::new(dir).is_dir();
            if !whole_is_dir {
                if dir.is_empty() {
                    return Err(err("missing layout directory before ':'"));
                }
                if !valid_tag(tag) {
                    return Err(err(
                        "the tag must match [A-Za-z0-9_][A-Za-z0-9._-]{0,127} (nothing after ':' is not a tag either)",
                    ));
                }
                return Ok(OciRef {
                    layout_dir: PathBuf::from(dir),
                    tag: Some(tag.to_owned()),
                });
            }
        }
    }
    Ok(OciRef {
        layout_dir: PathBuf::from(s),
        tag: None,
    })
}

fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

impl FromStr for OciRef {
    type Err = ImageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_oci_ref(s)
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tag {
            Some(tag) => write!(f, "{}:{tag}", self.layout_dir.display()),
            None => write!(f, "{}", self.layout_dir.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_and_tag() {
        let r = parse_oci_ref("./etcd-oci:latest").unwrap();
        assert_eq!(r.layout_dir, PathBuf::from("./etcd-oci"));
        assert_eq!(r.tag.as_deref(), Some("latest"));
        assert_eq!(r.to_string(), "./etcd-oci:latest");
        let r = parse_oci_ref("/a/b:v3.5.9-0").unwrap();
        assert_eq!(r.tag.as_deref(), Some("v3.5.9-0"));
    }

    #[test]
    fn dir_only() {
        let r = parse_oci_ref("./etcd-oci").unwrap();
        assert_eq!(r.layout_dir, PathBuf::from("./etcd-oci"));
        assert_eq!(r.tag, None);
        // A ':' in an earlier path component is not a tag separator.
        let r = parse_oci_ref("/mnt/c:d/layout").unwrap();
        assert_eq!(r.layout_dir, PathBuf::from("/mnt/c:d/layout"));
        assert_eq!(r.tag, None);
    }

    #[test]
    fn bad_references() {
        for s in ["", "./dir:", ":latest", "./dir:-x", "./dir:a b"] {
            assert!(
                matches!(parse_oci_ref(s), Err(ImageError::InvalidReference { .. })),
                "{s:?}"
            );
        }
    }
}
