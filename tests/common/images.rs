//! Images of the example systems under test, built once per test binary by
//! the examples' own scripts (which install what they need from Debian) into
//! a scratch directory. A build that fails fails the test: CI has everything
//! these scripts need.

use super::{detvisor, stderr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// This test process's scratch directory (images and copies of examples).
pub fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("detvisor-examples-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs an OCI build script and `detvisor image build` of what it printed.
fn build_image(script: &str, name: &str) -> Result<PathBuf, String> {
    let oci = Command::new("bash")
        .arg(root().join(script))
        .output()
        .map_err(|e| format!("{script}: {e}"))?;
    if !oci.status.success() {
        return Err(format!(
            "{script} failed: {}",
            String::from_utf8_lossy(&oci.stderr)
        ));
    }
    let layout = String::from_utf8_lossy(&oci.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let image = scratch().join(name);
    let out = detvisor(&[
        "image",
        "build",
        "--oci",
        &format!("{layout}:latest"),
        "--out",
        image.to_str().unwrap(),
    ]);
    if out.status.code() != Some(0) {
        return Err(format!("detvisor image build {name}: {}", stderr(&out)));
    }
    Ok(image)
}

/// examples/raft's image (raftkv and kvclient), as `scratch()/raft.img`.
pub fn raft_image() -> PathBuf {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| build_image("examples/raft/build.sh", "raft.img"))
        .clone()
        .unwrap_or_else(|why| panic!("the raft image cannot be built: {why}"))
}

/// examples/etcd's image (etcd 3.4 from Debian), as `scratch()/etcd.img`.
pub fn etcd_image() -> PathBuf {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    IMAGE
        .get_or_init(|| build_image("examples/etcd/build-oci.sh", "etcd.img"))
        .clone()
        .unwrap_or_else(|why| panic!("the etcd image cannot be built: {why}"))
}

/// A copy of `examples/<example>` in `scratch()`, under the same file name,
/// with `edit` applied to its text.
pub fn example_copy(example: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(root().join("examples").join(example))
        .unwrap_or_else(|e| panic!("examples/{example}: {e}"));
    let name = Path::new(example).file_name().unwrap();
    let path = scratch().join(name);
    std::fs::write(&path, edit(text)).unwrap();
    path
}

/// examples/raft's image with examples/raft/verify-leader.patch applied, as
/// an agent's fix would be built: a copy of `examples/` patched with
/// `patch -p1`, then the copy's own `raft/build.sh --image` (into an OCI
/// directory of its own, so the unpatched build's stamp is not reused), as
/// `scratch()/raft-patched.img`.
pub fn patched_raft_image() -> PathBuf {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    IMAGE
        .get_or_init(build_patched_raft_image)
        .clone()
        .unwrap_or_else(|why| panic!("the patched raft image cannot be built: {why}"))
}

fn build_patched_raft_image() -> Result<PathBuf, String> {
    let copy = scratch().join("examples-patched");
    let _ = std::fs::remove_dir_all(&copy);
    let run = |command: &mut Command, what: &str| -> Result<(), String> {
        let out = command.output().map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    run(
        Command::new("cp")
            .arg("-r")
            .arg(root().join("examples"))
            .arg(&copy),
        "copying examples/",
    )?;
    run(
        Command::new("patch")
            .args(["-p1", "--forward", "-i"])
            .arg(root().join("examples/raft/verify-leader.patch"))
            .current_dir(&copy),
        "patch -p1 < examples/raft/verify-leader.patch",
    )?;
    let image = scratch().join("raft-patched.img");
    run(
        Command::new("bash")
            .arg(copy.join("raft/build.sh"))
            .arg("--image")
            .arg(&image)
            .arg(scratch().join("raft-oci-patched"))
            .env("DETVISOR", env!("CARGO_BIN_EXE_detvisor")),
        "the patched copy's raft/build.sh --image",
    )?;
    Ok(image)
}
