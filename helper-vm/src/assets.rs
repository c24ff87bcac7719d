//! The helper VM's assets: where they are cached, which features they have, and building
//! them with `build.sh` when they are missing or too old.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// Kernel image (bzImage) in an assets directory.
pub const KERNEL_FILE: &str = "vmlinuz";
/// Optional decompressed kernel (ELF with a PVH entry) in an assets directory: preferred when
/// present, as it saves the ~7 s that decompressing the bzImage takes under TCG.
pub const PVH_KERNEL_FILE: &str = "vmlinux";
/// Base initramfs in an assets directory.
pub const INITRAMFS_FILE: &str = "initramfs.cpio.gz";
/// Description of an assets directory written by build.sh; its `features` line says what the
/// assets support.
pub const BUILD_INFO_FILE: &str = "build-info";

/// Asset feature: the initramfs has the 9p modules and an init that mounts shared directories.
pub(crate) const FEATURE_SHARES: &str = "9p";
/// Asset feature: the init honours `/payload/workdir.sh`.
pub(crate) const FEATURE_WORKDIR: &str = "workdir";
/// Asset feature: the initramfs has `virtio_console` and an init that names the channel's
/// port (`/payload/channel`).
pub(crate) const FEATURE_CHANNEL: &str = "channel";
/// Features this launcher can use; [`ensure_assets`] rebuilds assets that lack one.
const FEATURES: [&str; 3] = [FEATURE_SHARES, FEATURE_WORKDIR, FEATURE_CHANNEL];

/// Why [`ensure_assets`] could not provide the assets.
#[derive(Debug, thiserror::Error)]
pub enum AssetsError {
    #[error(
        "helper VM assets missing in {} and the build script {} does not exist",
        dir.display(),
        script.display()
    )]
    NoBuildScript { dir: PathBuf, script: PathBuf },
    #[error("cannot run bash {}", script.display())]
    RunScript {
        script: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "building the helper VM assets failed ({status}): see the messages of {} above",
        script.display()
    )]
    BuildFailed { script: PathBuf, status: ExitStatus },
    #[error(
        "{} finished but {} lacks {KERNEL_FILE} or {INITRAMFS_FILE}",
        script.display(),
        dir.display()
    )]
    Incomplete { script: PathBuf, dir: PathBuf },
}

/// `${DETVISOR_CACHE:-$HOME/.cache/detvisor}/helper-vm/default`: the symlink build.sh points at
/// the newest assets.
pub fn default_assets_dir() -> PathBuf {
    image_builder::cache_root().join("helper-vm/default")
}

/// `helper-vm/build.sh` of the source tree this crate was built from.
pub fn default_build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("build.sh")
}

/// Whether `dir` holds a kernel and the base initramfs.
pub(crate) fn assets_complete(dir: &Path) -> bool {
    dir.join(KERNEL_FILE).is_file() && dir.join(INITRAMFS_FILE).is_file()
}

/// The kernel to boot from `dir`: the PVH `vmlinux` when present, else the bzImage.
pub(crate) fn kernel_path(dir: &Path) -> PathBuf {
    let pvh = dir.join(PVH_KERNEL_FILE);
    if pvh.is_file() {
        pvh
    } else {
        dir.join(KERNEL_FILE)
    }
}

/// The words of the `features` line of `dir`'s build-info (empty for assets built before
/// build.sh wrote one).
fn asset_features(dir: &Path) -> BTreeSet<String> {
    let info = fs::read_to_string(dir.join(BUILD_INFO_FILE)).unwrap_or_default();
    info.lines()
        .filter_map(|l| l.strip_prefix("features "))
        .flat_map(str::split_whitespace)
        .map(String::from)
        .collect()
}

/// Whether the assets in `dir` have every feature in `wanted`.
pub(crate) fn has_features(dir: &Path, wanted: &[&str]) -> bool {
    let have = asset_features(dir);
    wanted.iter().all(|f| have.contains(*f))
}

/// Returns the helper VM assets directory, building the assets first (with `build_script`, by
/// default [`default_build_script`]) when [`default_assets_dir`] lacks them or they predate a
/// feature this launcher uses (shared directories, working directory, channel: the `features`
/// line of `build-info`). A first build downloads the kernel package (~70 MB) and takes ~15 s;
/// its progress goes to stderr. Otherwise assets that exist are used as they are: to refresh
/// them run the build script, which is a fast no-op when nothing changed.
pub fn ensure_assets(build_script: Option<&Path>) -> Result<PathBuf, AssetsError> {
    let dir = default_assets_dir();
    let complete = assets_complete(&dir);
    if complete && has_features(&dir, &FEATURES) {
        return Ok(dir);
    }
    let script = build_script.map_or_else(default_build_script, Path::to_path_buf);
    if complete && !script.is_file() {
        // Older assets and no source tree to rebuild them: fine unless a run needs the
        // missing feature, which the launcher then reports.
        return Ok(dir);
    }
    if !script.is_file() {
        return Err(AssetsError::NoBuildScript { dir, script });
    }
    // Its stdout (the assets directory) is ours to read: our stdout carries only payload output.
    let out = match Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
    {
        Ok(out) => out,
        Err(source) => return Err(AssetsError::RunScript { script, source }),
    };
    if !out.status.success() {
        return Err(AssetsError::BuildFailed {
            script,
            status: out.status,
        });
    }
    let printed = String::from_utf8_lossy(&out.stdout);
    let built = printed
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(PathBuf::from)
        .unwrap_or(dir);
    if !assets_complete(&built) {
        return Err(AssetsError::Incomplete { script, dir: built });
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tempdir::new_temp_dir;

    #[test]
    fn features_come_from_build_info() {
        let dir = new_temp_dir().unwrap();
        assert!(!assets_complete(dir.path()));
        fs::write(dir.path().join(KERNEL_FILE), b"k").unwrap();
        fs::write(dir.path().join(INITRAMFS_FILE), b"i").unwrap();
        assert!(assets_complete(dir.path()));
        assert_eq!(kernel_path(dir.path()), dir.path().join(KERNEL_FILE));
        fs::write(dir.path().join(PVH_KERNEL_FILE), b"e").unwrap();
        assert_eq!(kernel_path(dir.path()), dir.path().join(PVH_KERNEL_FILE));
        assert!(asset_features(dir.path()).is_empty());
        fs::write(
            dir.path().join(BUILD_INFO_FILE),
            b"key 1\nmodules kvm\nfeatures kvm\n",
        )
        .unwrap();
        assert_eq!(
            asset_features(dir.path()),
            BTreeSet::from(["kvm".to_string()])
        );
        assert!(has_features(dir.path(), &[]));
        assert!(!has_features(dir.path(), &FEATURES));
        fs::write(
            dir.path().join(BUILD_INFO_FILE),
            b"features kvm 9p workdir channel\n",
        )
        .unwrap();
        assert!(has_features(dir.path(), &FEATURES));
    }

    #[test]
    fn build_script_is_beside_this_crate() {
        assert!(default_build_script().is_file());
        assert!(default_assets_dir().ends_with("helper-vm/default"));
    }
}
