//! A node's data disk: the empty ext4 file system its virtio-blk disk
//! starts from, made on the host by e2fsprogs' `mkfs.ext4` so that the same
//! manifest gives the same bytes (a UUID and directory-hash seed derived
//! from the node's name, a fixed creation time, e2fsprogs' built-in
//! defaults rather than the host's `/etc/mke2fs.conf`, no lazy
//! initialization, no blocks reserved for root). Images are cached under
//! `<cache>/disks/`, named by what made them.

use crate::manifest::DiskPlan;
use std::path::{Path, PathBuf};
use std::process::Command;
use vmm::vm::DiskSpec;

/// The file-system creation time of every disk: 2024-01-01T00:00:00Z (the
/// default RTC epoch).
const FAKE_TIME: &str = "1704067200";

/// Why a node's disk image could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("creating the disk cache directory {}", dir.display())]
    CacheDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("running mkfs.ext4 (install e2fsprogs)")]
    Spawn(#[source] std::io::Error),
    #[error("mkfs.ext4 failed ({status}): {stderr}")]
    Mkfs { status: String, stderr: String },
    #[error("installing the disk image {}", path.display())]
    Install {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Load(#[from] vmm::vm::SetupError),
}

/// A UUID (as mkfs.ext4 reads it) derived from `purpose` and the node's name.
fn derived_uuid(purpose: &str, node: &str) -> String {
    let hash = blake3::derive_key(&format!("detvisor disk {purpose}"), node.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&hash[..16]);
    // Version 4, RFC 4122 variant: what a random UUID would look like.
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The serial node `node`'s disk shows the guest (at most 20 bytes): the
/// agent finds the disk by it.
pub fn disk_serial(node: &str) -> String {
    let mut serial = format!("detvisor-{node}");
    serial.truncate(20);
    serial
}

/// The mkfs.ext4 arguments for `plan` on node `node`, before the file name
/// and size.
fn mkfs_args(node: &str, plan: &DiskPlan) -> Vec<String> {
    let mut label = node.to_owned();
    label.truncate(16);
    vec![
        "-q".into(),
        "-F".into(),
        "-t".into(),
        "ext4".into(),
        "-b".into(),
        "4096".into(),
        "-m".into(),
        "0".into(),
        "-U".into(),
        derived_uuid("uuid", node),
        "-L".into(),
        label,
        "-E".into(),
        format!(
            "lazy_itable_init=0,lazy_journal_init=0,nodiscard,root_owner=0:0,hash_seed={}",
            derived_uuid("hash seed", node)
        ),
        // Not the host's /etc/mke2fs.conf: e2fsprogs' built-in defaults.
        format!("{}k", plan.size_bytes / 1024),
    ]
}

/// The empty ext4 image of node `node`'s disk (made once, then cached),
/// as the VMM attaches it.
pub fn disk_image(cache: &Path, node: &str, plan: &DiskPlan) -> Result<DiskSpec, DiskError> {
    let dir = cache.join("disks");
    std::fs::create_dir_all(&dir).map_err(|source| DiskError::CacheDir {
        dir: dir.clone(),
        source,
    })?;
    let args = mkfs_args(node, plan);
    let version = Command::new("mkfs.ext4")
        .arg("-V")
        .output()
        .map_err(DiskError::Spawn)?;
    let key = blake3::hash(format!("{args:?} {:?}", version.stderr).as_bytes()).to_hex();
    let path = dir.join(format!("{node}-{}.img", &key[..16]));
    if !path.is_file() {
        let partial = dir.join(format!(".{node}-{}.{}", &key[..16], std::process::id()));
        let (size, options) = args.split_last().expect("mkfs_args ends with the size");
        let output = Command::new("mkfs.ext4")
            .args(options)
            .arg(&partial)
            .arg(size)
            .env("E2FSPROGS_FAKE_TIME", FAKE_TIME)
            .env("SOURCE_DATE_EPOCH", FAKE_TIME)
            .env("MKE2FS_CONFIG", "/nonexistent/detvisor-mke2fs.conf")
            .env("MKE2FS_DEVICE_SECTSIZE", "512")
            .env("MKE2FS_DEVICE_PHYS_SECTSIZE", "512")
            .output()
            .map_err(DiskError::Spawn)?;
        if !output.status.success() {
            let _ = std::fs::remove_file(&partial);
            return Err(DiskError::Mkfs {
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        std::fs::rename(&partial, &path).map_err(|source| DiskError::Install {
            path: path.clone(),
            source,
        })?;
    }
    Ok(DiskSpec::of_file(&path, &disk_serial(node))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> DiskPlan {
        DiskPlan {
            size_bytes: 16 << 20,
            mount: "/data".into(),
        }
    }

    #[test]
    fn test_the_same_node_and_size_give_the_same_bytes() {
        // Arrange
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();

        // Act
        let a = disk_image(first.path(), "n1", &plan()).unwrap();
        let b = disk_image(second.path(), "n1", &plan()).unwrap();
        let other = disk_image(first.path(), "n2", &plan()).unwrap();

        // Assert
        assert_eq!(a.digest, b.digest, "made twice, same bytes");
        assert_ne!(a.digest, other.digest, "another node, another UUID");
        assert_eq!(std::fs::metadata(&a.image).unwrap().len(), 16 << 20);
        assert_eq!(a.serial, "detvisor-n1");
        let bytes = std::fs::read(&a.image).unwrap();
        // The ext4 superblock's magic at 1024 + 0x38.
        assert_eq!(&bytes[1024 + 0x38..1024 + 0x3a], &[0x53, 0xef]);
    }

    #[test]
    fn test_a_cached_image_is_reused() {
        // Arrange
        let cache = tempfile::tempdir().unwrap();
        let first = disk_image(cache.path(), "n1", &plan()).unwrap();

        // Act
        let again = disk_image(cache.path(), "n1", &plan()).unwrap();

        // Assert
        assert_eq!(first, again);
        assert_eq!(
            std::fs::read_dir(cache.path().join("disks"))
                .unwrap()
                .count(),
            1
        );
    }

    #[test]
    fn test_serials_fit_virtio_blk_ids() {
        assert_eq!(disk_serial("n1"), "detvisor-n1");
        assert_eq!(disk_serial(&"a".repeat(32)).len(), 20);
    }
}
