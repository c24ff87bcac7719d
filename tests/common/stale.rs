//! The Raft stale-read campaign, run ONCE per test run and shared by every
//! test binary that needs its finding (tests/campaign.rs, tests/serve.rs):
//! in a directory under the system's temp directory keyed by the detvisor
//! binary (its size and modification time) and the files of examples/raft,
//! made by whichever test gets there first under a lock file, the others
//! waiting for it. Its campaign file, manifest and image are copied into
//! the same directory, so the finding's files outlive the process that
//! made them.

use super::images::{example_copy, raft_image};
use super::{detvisor, stderr, stdout};
use std::hash::{Hash, Hasher};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Branches of the stale campaign: the stale read is found on the first
/// (seed 1).
pub const BRANCHES: &str = "3";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// What the campaign depends on: the binary, and examples/raft's files.
fn key() -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let binary = std::fs::metadata(env!("CARGO_BIN_EXE_detvisor")).expect("the detvisor binary");
    binary.len().hash(&mut hasher);
    binary
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .hash(&mut hasher);
    let mut files = Vec::new();
    let mut dirs = vec![repo().join("examples/raft")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("examples/raft").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    for file in files {
        file.hash(&mut hasher);
        std::fs::read(&file).unwrap_or_default().hash(&mut hasher);
    }
    format!("{:016x}", hasher.finish())
}

/// The shared directory: `campaign/` (the campaign's output), `files/`
/// (its campaign file, manifest and image), `done` once it is complete.
pub fn stale_root() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("detvisor-stale-{}", key()));
        std::fs::create_dir_all(&dir).unwrap();
        let lock = std::fs::File::create(dir.join("lock")).unwrap();
        // SAFETY: flock on a file this function holds open; released when
        // it is closed at the end of this function.
        let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(locked, 0, "locking {}", dir.display());
        if !dir.join("done").exists() {
            remove_old_fixtures(&dir);
            make(&dir);
            std::fs::write(dir.join("done"), b"").unwrap();
        }
        drop(lock);
        dir.canonicalize().unwrap()
    })
}

/// Other builds' campaigns finished over a day ago (none of this run's:
/// a test binary of another build still running would be using its own
/// within the hour): each is about 50 MiB.
fn remove_old_fixtures(ours: &Path) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    let day = std::time::Duration::from_secs(24 * 60 * 60);
    for entry in entries.flatten() {
        let path = entry.path();
        let is_fixture = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with("detvisor-stale-"));
        let finished_long_ago = std::fs::metadata(path.join("done"))
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|age| age > day);
        if is_fixture && path != ours && finished_long_ago {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn make(dir: &Path) {
    let files = dir.join("files");
    let out = dir.join("campaign");
    let _ = std::fs::remove_dir_all(&files);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&files).unwrap();
    std::fs::copy(raft_image(), files.join("raft.img")).unwrap();
    for name in ["campaign-stale-manifest.toml", "campaign-stale.toml"] {
        let copy = example_copy(&format!("raft/{name}"), |t| t);
        std::fs::copy(copy, files.join(name)).unwrap();
    }
    let run = detvisor(&[
        "campaign",
        files.join("campaign-stale.toml").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--branches",
        BRANCHES,
    ]);
    assert_eq!(
        run.status.code(),
        Some(1),
        "a campaign with findings exits 1: {}",
        stderr(&run)
    );
}

/// The stale campaign's directory.
pub fn stale_campaign() -> PathBuf {
    stale_root().join("campaign")
}

/// A campaign's findings as `detvisor findings --json` lists them.
pub fn findings_json(dir: &Path) -> Vec<serde_json::Value> {
    let out = detvisor(&["findings", dir.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The stale campaign's first linearizability finding's directory.
pub fn stale_finding() -> PathBuf {
    let found = findings_json(&stale_campaign());
    let finding = found
        .iter()
        .find(|f| {
            f["key"]
                .as_str()
                .unwrap()
                .starts_with("checker:linearizability:")
        })
        .expect("a linearizability finding");
    PathBuf::from(finding["dir"].as_str().unwrap())
}

/// The node the finding's path paused or cut off first (the old leader,
/// whose lease reads went stale), else n1.
pub fn old_leader(finding: &Path) -> String {
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(finding.join("finding.json")).unwrap())
            .unwrap();
    file["path"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["faults"].as_array().unwrap().clone())
        .filter_map(|f| {
            let text = f.as_str()?.to_owned();
            ["n1", "n2", "n3"]
                .into_iter()
                .find(|n| text.contains(&format!("pause {n}")))
                .map(str::to_owned)
        })
        .next()
        .unwrap_or_else(|| "n1".into())
}
