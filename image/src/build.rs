//! `detvisor image build` as a library call: an OCI image layout or a host
//! directory -> a node image file, written atomically.

use crate::{
    flatten, parse_oci_ref, read_image, sha256_digest, write_node_image, ImageConfig, ImageError,
    RootFs,
};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Where a node image's tree comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeImageSource {
    /// An OCI image layout with an optional tag: `./etcd-oci:latest`.
    Oci(String),
    /// A host directory (owners become root, sockets are skipped, the
    /// config is empty).
    Dir(PathBuf),
}

/// What [`write_node_image_file`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeImageReport {
    pub entries: usize,
    pub regular_files: usize,
    pub bytes: usize,
    /// `sha256:<hex>` of the file.
    pub digest: String,
}

/// Builds the node image of `source` into `out` (through `out.partial` and
/// a rename: `out` is either the old file or the complete new one).
pub fn write_node_image_file(
    source: &NodeImageSource,
    out: &Path,
) -> Result<NodeImageReport, ImageError> {
    let (config, root) = match source {
        NodeImageSource::Oci(reference) => {
            let (config, layers) = read_image(&parse_oci_ref(reference)?)?;
            (config, flatten(&layers)?)
        }
        NodeImageSource::Dir(dir) => (ImageConfig::default(), RootFs::from_dir(dir)?),
    };
    let mut bytes = Vec::new();
    write_node_image(&config, &root, &mut bytes)?;
    write_atomically(out, &bytes)?;
    Ok(NodeImageReport {
        entries: root.len(),
        regular_files: root
            .entries()
            .filter(|(_, node)| node.data().is_some())
            .count(),
        bytes: bytes.len(),
        digest: sha256_digest(&bytes),
    })
}

fn write_atomically(out: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ImageError::Io { path, source }
    };
    let mut name = out
        .file_name()
        .ok_or_else(|| {
            io_error(out)(io::Error::new(
                io::ErrorKind::InvalidInput,
                "that path does not name a file",
            ))
        })?
        .to_owned();
    name.push(".partial");
    let partial = out.with_file_name(name);
    let result = (|| -> io::Result<()> {
        let mut f = fs::File::create(&partial)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&partial, out)
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&partial);
        io_error(out)(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_directory_becomes_a_node_image_written_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::write(root.join("bin/hello"), b"hi").unwrap();
        let out = dir.path().join("node.img");
        let report = write_node_image_file(&NodeImageSource::Dir(root), &out).unwrap();
        assert_eq!(report.bytes as u64, fs::metadata(&out).unwrap().len());
        assert_eq!(report.regular_files, 1);
        assert!(report.digest.starts_with("sha256:"));
        assert!(!dir.path().join("node.img.partial").exists());
    }

    #[test]
    fn test_a_missing_source_names_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nothing-here");
        let error = write_node_image_file(
            &NodeImageSource::Dir(missing.clone()),
            &dir.path().join("x.img"),
        )
        .unwrap_err();
        let mut chain = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            chain.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        assert!(chain.contains("nothing-here"), "{chain}");
        assert_eq!(chain.matches("No such file").count(), 1, "{chain}");
    }
}
