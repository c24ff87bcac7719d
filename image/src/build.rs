//! `detvisor image build` as a library call: an OCI image layout or a host
//! directory -> a node image file, written atomically.

use crate::{
    flatten_each, parse_oci_ref, read_image, sha256_digest, write_node_image, FlattenOptions,
    ImageConfig, ImageError, RootFs,
};
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

/// How far [`write_node_image_file`] has come, told as it goes (the caller
/// shows it; the library prints nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildProgress<'a> {
    /// The OCI image's manifest, config and layers were read and verified:
    /// `layers` layers of `bytes` bytes as stored (compressed) in all.
    Read { layers: usize, bytes: u64 },
    /// Layer `done` (1-based) of `total` was unpacked and applied: the
    /// layer's digest, and the stored bytes of the layers applied so far
    /// (`bytes_done`) of all (`bytes_total`).
    Layer {
        done: usize,
        total: usize,
        digest: &'a str,
        bytes_done: u64,
        bytes_total: u64,
    },
    /// The root filesystem is complete (`entries` entries): the image is
    /// encoded and written next.
    Tree { entries: usize },
}

/// Builds the node image of `source` into `out` (through a temporary file
/// of a unique name beside it and a rename: `out` is either the old file
/// or the complete new one), telling `progress` how far it has come. An
/// `out` that exists and is not a regular file is refused, and so is an
/// `out` another process is building now.
pub fn write_node_image_file(
    source: &NodeImageSource,
    out: &Path,
    progress: &mut dyn FnMut(BuildProgress<'_>),
) -> Result<NodeImageReport, ImageError> {
    // An output that is not a regular file (a device node, a symlink) is refused before
    // any work.
    hostfile::check_output(out)?;
    // One build of `out` at a time: a second is refused, naming the first,
    // rather than both saying they wrote it.
    let _lock = hostfile::OutputLock::take(out)?;
    let (config, root) = match source {
        NodeImageSource::Oci(reference) => {
            let (config, layers) = read_image(&parse_oci_ref(reference)?)?;
            let sizes: Vec<u64> = layers.iter().map(|l| l.data.len() as u64).collect();
            let bytes_total = sizes.iter().sum();
            progress(BuildProgress::Read {
                layers: layers.len(),
                bytes: bytes_total,
            });
            let mut bytes_done = 0;
            let root = flatten_each(&layers, &FlattenOptions::default(), &mut |index| {
                bytes_done += sizes[index];
                progress(BuildProgress::Layer {
                    done: index + 1,
                    total: layers.len(),
                    digest: &layers[index].digest,
                    bytes_done,
                    bytes_total,
                });
            })?;
            (config, root)
        }
        NodeImageSource::Dir(dir) => (ImageConfig::default(), RootFs::from_dir(dir)?),
    };
    progress(BuildProgress::Tree {
        entries: root.len(),
    });
    let mut bytes = Vec::new();
    write_node_image(&config, &root, &mut bytes)?;
    // A temporary file of its own (two builds to one `out` never mix), renamed over `out`.
    hostfile::write_atomic(out, &bytes)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn test_a_directory_becomes_a_node_image_written_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::write(root.join("bin/hello"), b"hi").unwrap();
        let out = dir.path().join("node.img");
        let report = write_node_image_file(&NodeImageSource::Dir(root), &out, &mut |_| {}).unwrap();
        assert_eq!(report.bytes as u64, fs::metadata(&out).unwrap().len());
        assert_eq!(report.regular_files, 1);
        assert!(report.digest.starts_with("sha256:"));
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            2,
            "no temporary file is left"
        );
    }

    #[test]
    fn test_a_missing_source_names_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nothing-here");
        let error = write_node_image_file(
            &NodeImageSource::Dir(missing.clone()),
            &dir.path().join("x.img"),
            &mut |_| {},
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

    #[test]
    fn test_an_output_that_is_not_a_regular_file_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(&root).unwrap();
        fs::write(root.join("f"), b"x").unwrap();
        let source = NodeImageSource::Dir(root);
        let error =
            write_node_image_file(&source, Path::new("/dev/null"), &mut |_| {}).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("/dev/null: exists and is not a regular file (a character device)"),
            "{error}"
        );
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        // An old fixed temporary name that is a symlink is never written through.
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("node.img.partial")).unwrap();
        let out = dir.path().join("node.img");
        let report = write_node_image_file(&source, &out, &mut |_| {}).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
        assert_eq!(report.bytes as u64, fs::metadata(&out).unwrap().len());
        // Nor is an output that is a symlink.
        let link = dir.path().join("link.img");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let error = write_node_image_file(&source, &link, &mut |_| {}).unwrap_err();
        assert!(error.to_string().contains("(a symbolic link)"), "{error}");
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
    }

    /// Two builds to one output at once: one that finds the other building
    /// fails (naming it) and writes nothing; the file is the image of a
    /// build that says it wrote it, whole.
    #[test]
    fn test_two_builds_to_one_output_never_both_claim_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("node.img");
        let sources: Vec<NodeImageSource> = (0..2)
            .map(|i| {
                let root = dir.path().join(format!("root{i}"));
                fs::create_dir_all(&root).unwrap();
                fs::write(root.join("f"), vec![i as u8; 1000 * (i + 1)]).unwrap();
                NodeImageSource::Dir(root)
            })
            .collect();
        let results: Vec<Result<NodeImageReport, ImageError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = sources
                .iter()
                .map(|source| scope.spawn(|| write_node_image_file(source, &out, &mut |_| {})))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for refused in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(matches!(refused, ImageError::OutputBusy(_)), "{refused}");
            assert!(
                refused.to_string().contains("is writing it now"),
                "{refused}"
            );
        }
        // The file is one of the two images whole, as its build reported it.
        let digest = crate::sha256_digest(&fs::read(&out).unwrap());
        let wrote: Vec<_> = results.iter().flatten().collect();
        assert!(wrote.iter().any(|r| r.digest == digest), "{digest}");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            3,
            "no temporary or lock file is left"
        );
    }
}
