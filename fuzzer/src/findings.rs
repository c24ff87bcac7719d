//! A finding's directory, `findings/NNNN/`: everything needed to reproduce
//! one distinct failure from a fresh process, also after the directory is
//! copied elsewhere. Files:
//!
//! - `finding.json`: number, failure key and summary, the failed property's
//!   or checker's details, the path from the root (shrunk, and as found),
//!   the digest of the shrunk history's end, the campaign's spec, the
//!   failure moment (written since it exists; computed from `records.jsonl`
//!   when a finding written before is loaded, nothing written into it);
//! - `run.json`: the assembled `up` run, its kernel, initrd and disk images
//!   named by content digest (`blobs/<blake3>`; no absolute path anywhere);
//! - `blobs/`: those files (hard links into the campaign's own `blobs/`
//!   where the file system allows, copies elsewhere);
//! - the failure's artifacts: `history.jsonl`, `checker.html`, ...;
//! - `records.jsonl`: everything the guest reported along the path;
//! - `logs/<name>.log`: each node's, the workload's and each test-composer
//!   command's output along the path (`node_logs`).
//!
//! A directory is written under a temporary name and renamed into place,
//! so a finding that exists is whole.

use crate::failure::{FailureKey, FailureSlugError};
use crate::failure_moment::FailureMoment;
use crate::judge::Failure;
use crate::shrink_finding::Shrinking;
use crate::spec::CampaignSpec;
use crate::step::Path as StepPath;
use run::manifest::{NodePlan, RootSource, WorkloadPlan};
use run::records::GuestRecord;
use run::up::{Initrd, PreparedUp};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The findings' directory in a campaign directory.
pub const FINDINGS_DIR: &str = "findings";
/// The content-addressed files of a campaign directory or finding.
pub const BLOBS_DIR: &str = "blobs";
pub const FINDING_FILE: &str = "finding.json";
pub const RUN_FILE: &str = "run.json";
/// Everything the guest reported along the path, a [`GuestRecord`] a line.
pub const RECORDS_FILE: &str = "records.jsonl";
/// The format of `finding.json`. 2: a branch re-keys the guest kernel's
/// CRNG at its first instant, so a version 1 finding's path replays to
/// another history; those are refused. (`failure_moment` came later as an
/// optional field, in the same version: a finding without it is whole, its
/// moment is computed when it is loaded; so did `shrinking`, absent from a
/// finding whose steps and end were not shrunk.)
pub const FINDING_FORMAT: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum FindingError {
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Read(hostfile::ReadError),
    #[error(transparent)]
    Write(hostfile::WriteError),
    #[error("{path}: not a finding ({FINDING_FILE} is missing)")]
    NotAFinding { path: PathBuf },
    #[error("{path}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: finding format version {found}; this build reads version {FINDING_FORMAT}")]
    Version { path: PathBuf, found: u32 },
    /// A fault of the finding's path that does not parse or names no node
    /// of its run: refused before anything replays it.
    #[error("{}: {which}", path.display())]
    BadFault {
        path: PathBuf,
        which: &'static str,
        #[source]
        source: crate::step::PathFaultError,
    },
    #[error("{path}: blob {name:?} is not a content digest")]
    BadBlobName { path: PathBuf, name: String },
    #[error("{path}: its digest is {actual}, not {expected} (the file was changed or damaged)")]
    BlobDigest {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("{path}: line {line} is not a record")]
    Record {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: its failure key")]
    Key {
        path: PathBuf,
        #[source]
        source: FailureSlugError,
    },
    #[error("{path}: the campaign's judge")]
    Judge {
        path: PathBuf,
        /// Boxed: a profile's error is large, and this one is rare.
        #[source]
        source: Box<crate::judges::JudgesError>,
    },
}

type Result<T, E = FindingError> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FindingError + '_ {
    move |source| FindingError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The largest blob of a finding read (a kernel, an initrd): 4 GiB.
pub const MAX_BLOB_BYTES: u64 = 4 << 30;
/// The largest `finding.json` or `run.json` read.
pub const MAX_JSON_BYTES: u64 = 64 << 20;
/// The largest `records.jsonl` read (a long history's output and records).
pub const MAX_RECORDS_BYTES: u64 = 1 << 30;

/// A file of a campaign directory: a regular file only (never a FIFO or a
/// device: directories are copied between machines), of bounded size.
fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>> {
    hostfile::read_limited(path, limit).map_err(FindingError::Read)
}

fn read_text(path: &Path) -> Result<String> {
    hostfile::read_text_limited(path, MAX_JSON_BYTES).map_err(FindingError::Read)
}

/// `finding.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FindingFile {
    pub format: u32,
    pub number: u32,
    pub key: String,
    pub summary: String,
    pub details: serde_json::Value,
    /// The shrunk path: replaying it from the root shows the failure.
    #[serde(deserialize_with = "shrunk_path")]
    pub path: StepPath,
    /// The path as the search found it.
    #[serde(deserialize_with = "found_path")]
    pub found_path: StepPath,
    /// The run's digest at the end of `path`.
    pub digest: String,
    pub exits: u64,
    pub virtual_ns: vmm::VirtNanos,
    pub spec: CampaignSpec,
    /// Where on the shrunk path the failure happened (see
    /// [`crate::failure_moment`]); `None` in a finding written before it
    /// was kept (then [`load`] and [`failure_moment`] compute it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_moment: Option<FailureMoment>,
    /// How `path` was shrunk from `found_path` (its steps and its end as
    /// well as its faults); `None` in a finding written before steps and
    /// ends were shrunk (only its faults were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrinking: Option<Shrinking>,
}

/// `finding.json`'s `path`, an error in it (a fault that does not parse)
/// named with the field, as [`FindingError::BadFault`] names it.
fn shrunk_path<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<StepPath, D::Error> {
    named_path("path", deserializer)
}

/// `finding.json`'s `found_path`, as [`shrunk_path`].
fn found_path<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<StepPath, D::Error> {
    named_path("found_path", deserializer)
}

fn named_path<'de, D: serde::Deserializer<'de>>(
    name: &str,
    deserializer: D,
) -> Result<StepPath, D::Error> {
    StepPath::deserialize(deserializer)
        .map_err(|e| serde::de::Error::custom(format!("{name}: {e}")))
}

/// Where the run's files are, by digest, relative to the finding.
fn blob_name(digest: &str) -> String {
    format!("{BLOBS_DIR}/{digest}")
}

/// Stores `bytes` as a blob of `dir` (a campaign or finding directory).
fn put_blob(dir: &Path, bytes: &[u8]) -> Result<String> {
    let digest = blake3::hash(bytes).to_hex().to_string();
    let blobs = dir.join(BLOBS_DIR);
    std::fs::create_dir_all(&blobs).map_err(io(&blobs))?;
    let path = blobs.join(&digest);
    // Written through a file of a unique name and renamed into place:
    // never through a file or symlink a copied directory brought along
    // (a blob that is there but not a regular file is refused).
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.is_file() => {}
        _ => {
            hostfile::write_atomic(&path, bytes).map_err(FindingError::Write)?;
        }
    }
    Ok(digest)
}

/// `prepared` with its files as blobs of the campaign directory `campaign`;
/// the paths in the copy are `blobs/<digest>`.
pub fn blobify(campaign: &Path, prepared: &PreparedUp) -> Result<PreparedUp> {
    let mut out = prepared.clone();
    let read = |path: &Path| read_limited(path, MAX_BLOB_BYTES);
    let kernel = put_blob(campaign, &read(&prepared.kernel)?)?;
    out.kernel = PathBuf::from(blob_name(&kernel));
    let initrd = match &prepared.initrd {
        Initrd::Bytes(bytes) => put_blob(campaign, bytes)?,
        Initrd::File(path) => put_blob(campaign, &read(path)?)?,
    };
    out.initrd = Initrd::File(PathBuf::from(blob_name(&initrd)));
    for disk in &mut out.disks {
        let digest = put_blob(campaign, &read(&disk.image)?)?;
        disk.image = PathBuf::from(blob_name(&digest));
    }
    if let Some(node) = own_node_mut(&mut out) {
        forget_host_path(&mut node.source);
    }
    Ok(out)
}

fn own_node_mut(prepared: &mut PreparedUp) -> Option<&mut NodePlan> {
    match prepared.workload.as_mut()? {
        WorkloadPlan::OwnNode(node) => Some(node),
        WorkloadPlan::Template(plan) => plan.own_node.as_deref_mut(),
        WorkloadPlan::InNode { .. } => None,
    }
}

/// The workload node's root was packed into the initrd when the run was
/// prepared; the run never reads its source again. Only its file name is
/// kept (for people reading run.json): a finding names no path of the
/// machine that found it.
fn forget_host_path(source: &mut RootSource) {
    let name = |path: &Path| PathBuf::from(path.file_name().unwrap_or_default());
    match source {
        RootSource::Image(path) | RootSource::Rootfs(path) => *path = name(path),
        RootSource::Oci(layout) => *layout = name(Path::new(layout)).display().to_string(),
    }
}

/// The blobs a blobified run names.
fn blob_paths(prepared: &PreparedUp) -> Vec<PathBuf> {
    let mut paths = vec![prepared.kernel.clone()];
    if let Initrd::File(path) = &prepared.initrd {
        paths.push(path.clone());
    }
    paths.extend(prepared.disks.iter().map(|d| d.image.clone()));
    paths
}

/// A blobified run with its paths made absolute under `dir`, each blob's
/// digest checked.
pub fn resolve(dir: &Path, prepared: &PreparedUp) -> Result<PreparedUp> {
    let mut out = prepared.clone();
    let fix = |relative: &Path| -> Result<PathBuf> {
        let name = relative
            .strip_prefix(BLOBS_DIR)
            .ok()
            .and_then(|n| n.to_str())
            .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| FindingError::BadBlobName {
                path: dir.join(RUN_FILE),
                name: relative.display().to_string(),
            })?;
        let path = dir.join(relative);
        let bytes = read_limited(&path, MAX_BLOB_BYTES)?;
        let actual = blake3::hash(&bytes).to_hex().to_string();
        if actual != name {
            return Err(FindingError::BlobDigest {
                path,
                expected: name.to_owned(),
                actual,
            });
        }
        Ok(path)
    };
    out.kernel = fix(&prepared.kernel)?;
    if let Initrd::File(path) = &prepared.initrd {
        out.initrd = Initrd::File(fix(path)?);
    }
    for disk in &mut out.disks {
        disk.image = fix(&disk.image)?;
    }
    Ok(out)
}

/// Everything a finding's directory gets.
pub struct NewFinding<'a> {
    pub file: FindingFile,
    /// The run, blobified against the campaign directory.
    pub run: &'a PreparedUp,
    pub failure: &'a Failure,
    pub records: &'a [GuestRecord],
}

/// `findings/NNNN` of a campaign directory.
pub fn finding_dir(campaign: &Path, number: u32) -> PathBuf {
    campaign.join(FINDINGS_DIR).join(format!("{number:04}"))
}

/// The first finding number whose directory does not exist and is above
/// `at_least` (a resumed campaign removed those its index does not hold,
/// see `listing::remove_unindexed`; one that is there is never written
/// over).
pub fn next_number(campaign: &Path, at_least: u32) -> u32 {
    let mut number = at_least.max(1);
    while finding_dir(campaign, number).exists() {
        number += 1;
    }
    number
}

/// Writes `findings/NNNN/` whole (temporary name, then renamed).
pub fn write(campaign: &Path, finding: &NewFinding<'_>) -> Result<PathBuf> {
    let dir = finding_dir(campaign, finding.file.number);
    let parent = campaign.join(FINDINGS_DIR);
    std::fs::create_dir_all(&parent).map_err(io(&parent))?;
    let partial = parent.join(format!(".{:04}.partial", finding.file.number));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(io(&partial))?;
    }
    std::fs::create_dir_all(partial.join(BLOBS_DIR)).map_err(io(&partial))?;
    for relative in blob_paths(finding.run) {
        let from = campaign.join(&relative);
        let to = partial.join(&relative);
        if std::fs::hard_link(&from, &to).is_err() {
            std::fs::copy(&from, &to).map_err(io(&to))?;
        }
    }
    let json = |path: PathBuf, text: String| std::fs::write(&path, text).map_err(io(&path));
    json(
        partial.join(FINDING_FILE),
        serde_json::to_string_pretty(&finding.file).expect("findings serialize"),
    )?;
    json(
        partial.join(RUN_FILE),
        serde_json::to_string(finding.run).expect("runs serialize"),
    )?;
    for (name, bytes) in &finding.failure.artifacts {
        let path = partial.join(name);
        std::fs::write(&path, bytes).map_err(io(&path))?;
    }
    let mut lines = String::new();
    for record in finding.records {
        lines.push_str(&serde_json::to_string(record).expect("records serialize"));
        lines.push('\n');
    }
    json(partial.join(RECORDS_FILE), lines)?;
    crate::node_logs::write(&partial, finding.records).map_err(io(&partial))?;
    std::fs::rename(&partial, &dir).map_err(io(&dir))?;
    Ok(dir)
}

/// A finding read back: its file and its run, paths resolved under `dir`,
/// and its failure moment (the file's, or computed from its records).
pub struct LoadedFinding {
    pub file: FindingFile,
    pub run: PreparedUp,
    pub failure_moment: FailureMoment,
}

/// `finding.json` of the finding directory `dir`, its format checked.
pub fn read_file(dir: &Path) -> Result<FindingFile> {
    let path = dir.join(FINDING_FILE);
    if !path.is_file() {
        return Err(FindingError::NotAFinding {
            path: dir.to_owned(),
        });
    }
    let text = read_text(&path)?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| FindingError::Json {
            path: path.clone(),
            source,
        })?;
    let format = value.get("format").and_then(|f| f.as_u64()).unwrap_or(0) as u32;
    if format != FINDING_FORMAT {
        return Err(FindingError::Version {
            path,
            found: format,
        });
    }
    // From the text, not the value: fields are read in the file's order,
    // so a bad fault of both paths is named in `path` (written first).
    serde_json::from_str(&text).map_err(|source| FindingError::Json { path, source })
}

pub fn load(dir: &Path) -> Result<LoadedFinding> {
    let file = read_file(dir)?;
    let run_path = dir.join(RUN_FILE);
    let text = read_text(&run_path)?;
    let run: PreparedUp = serde_json::from_str(&text).map_err(|source| FindingError::Json {
        path: run_path.clone(),
        source,
    })?;
    // Every fault of both paths, before a helper VM starts or a run replays.
    for (which, steps) in [("path", &file.path), ("found_path", &file.found_path)] {
        steps
            .check_faults(&run.node_names)
            .map_err(|source| FindingError::BadFault {
                path: dir.join(FINDING_FILE),
                which,
                source,
            })?;
    }
    let run = resolve(dir, &run)?;
    let failure_moment = moment_of(dir, &file)?;
    Ok(LoadedFinding {
        file,
        run,
        failure_moment,
    })
}

/// The failure moment of the finding in `dir`: as its `finding.json` says,
/// or (a finding written before moments were kept) computed from its
/// `records.jsonl` with its campaign's judge. Nothing is written.
pub fn failure_moment(dir: &Path) -> Result<FailureMoment> {
    moment_of(dir, &read_file(dir)?)
}

fn moment_of(dir: &Path, file: &FindingFile) -> Result<FailureMoment> {
    if let Some(moment) = file.failure_moment {
        return Ok(moment);
    }
    let key = FailureKey::from_slug(&file.key).map_err(|source| FindingError::Key {
        path: dir.join(FINDING_FILE),
        source,
    })?;
    let judge =
        crate::judges::campaign_judge(&file.spec).map_err(|source| FindingError::Judge {
            path: dir.join(FINDING_FILE),
            source: Box::new(source),
        })?;
    let records = read_records(dir)?;
    Ok(crate::failure_moment::find_or_end(
        &records,
        judge.as_ref(),
        &key,
        file.exits,
        file.virtual_ns,
    ))
}

/// `records.jsonl` of the finding directory `dir`.
pub fn read_records(dir: &Path) -> Result<Vec<GuestRecord>> {
    let path = dir.join(RECORDS_FILE);
    let text = hostfile::read_text_limited(&path, MAX_RECORDS_BYTES).map_err(FindingError::Read)?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            serde_json::from_str(line).map_err(|source| FindingError::Record {
                path: path.clone(),
                line: index + 1,
                source,
            })
        })
        .collect()
}

/// A finding of a minimal campaign, failed at the root (for tests).
#[cfg(test)]
pub(crate) fn test_finding(number: u32, key: &str) -> FindingFile {
    let spec = crate::spec::CampaignSpec::parse(
        "manifest = \"m.toml\"\n",
        Path::new("c.toml"),
        Path::new("/"),
    )
    .expect("a minimal campaign file");
    FindingFile {
        format: FINDING_FORMAT,
        number,
        key: key.into(),
        summary: "failed".into(),
        details: serde_json::Value::Null,
        path: Default::default(),
        found_path: Default::default(),
        digest: "d".into(),
        exits: 0,
        virtual_ns: vmm::VirtNanos::ZERO,
        spec,
        failure_moment: None,
        shrinking: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A finding's time is the bare number of nanoseconds it was before it
    /// was typed: findings written before read the same, and back.
    #[test]
    fn test_a_finding_time_json_is_unchanged() {
        let file = FindingFile {
            exits: 2,
            virtual_ns: vmm::VirtNanos(1_500_000_000),
            ..test_finding(1, "k")
        };
        let json = serde_json::to_value(&file).unwrap();
        assert_eq!(json["virtual_ns"], serde_json::json!(1_500_000_000u64));
        assert_eq!(json["exits"], serde_json::json!(2));
        let back: FindingFile = serde_json::from_value(json).unwrap();
        assert_eq!(back, file);
    }

    /// A run of one workload node whose kernel is a file of `dir`.
    fn test_run(dir: &Path) -> PreparedUp {
        let kernel = dir.join("vmlinux");
        let image = dir.join("raft.img");
        std::fs::write(&kernel, b"kernel bytes").unwrap();
        let node = serde_json::json!({
            "name": "workload", "source": {"image": image}, "address": "192.0.2.10/24",
            "hostname": null, "command": ["kvclient"], "env": {}, "disk": null
        });
        serde_json::from_value(serde_json::json!({
            "kernel": kernel, "initrd": {"bytes": [1, 2, 3]}, "specs": [], "node_names": [],
            "workload": {"own_node": node},
            "network": serde_json::to_value(devices::NetworkConfig::reliable(
                devices::LatencyDist::Fixed(vmm::VirtNanos::ZERO))).unwrap(),
            "rtc_epoch_unix_secs": 0, "ram_bytes": 1, "faults": [], "disks": []
        }))
        .unwrap()
    }

    /// An SDK `Always` assertion's hit, as the guest reports it.
    fn always_hit(index: u64, condition: bool) -> GuestRecord {
        use run::records::sdk::{AssertType, Assertion, Location};
        let assertion = Assertion {
            assert_type: AssertType::Always,
            display_type: "Always".into(),
            condition,
            message: "counter never negative".into(),
            location: Location {
                class: "app".into(),
                function: "app::f".into(),
                file: "src/app.rs".into(),
                begin_line: 10,
                begin_column: 5,
            },
            hit: true,
            must_hit: true,
            id: "counter never negative".into(),
            details: serde_json::json!({"n": index}),
        };
        GuestRecord {
            exit: 100 + index,
            virtual_ns: vmm::VirtNanos::from_micros(1_000 * index),
            node: Some("n1".into()),
            body: run::records::RecordBody::Sdk {
                json: serde_json::json!({ "antithesis_assert": assertion }),
            },
        }
    }

    /// A finding directory written by [`write`] in a campaign directory
    /// under `root`: `file` over records whose third (index 2) is the first
    /// failing hit of an `Always` assertion; its key is the judge's.
    fn finding_with(root: &Path, file: FindingFile) -> (PathBuf, Vec<GuestRecord>) {
        let campaign = root.join("campaign");
        std::fs::create_dir_all(&campaign).unwrap();
        let run = blobify(&campaign, &test_run(root)).unwrap();
        let records: Vec<GuestRecord> = [true, true, false, true, false]
            .into_iter()
            .enumerate()
            .map(|(i, condition)| always_hit(i as u64, condition))
            .collect();
        let judge = crate::judges::campaign_judge(&file.spec).unwrap();
        let failure = judge.check(&[&records]).remove(0);
        let file = FindingFile {
            key: failure.key.slug(),
            exits: 900,
            virtual_ns: vmm::VirtNanos::from_secs(9),
            ..file
        };
        let new = NewFinding {
            file,
            run: &run,
            failure: &failure,
            records: &records,
        };
        (write(&campaign, &new).unwrap(), records)
    }

    /// Every file of `dir` and its bytes.
    fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    files.push((path.clone(), std::fs::read(&path).unwrap()));
                }
            }
        }
        files.sort();
        files
    }

    /// A finding written before failure moments were kept (no such field
    /// in its file) loads, and gets the moment of its first failing record
    /// computed from records.jsonl; nothing is written into it.
    #[test]
    fn test_a_finding_without_a_failure_moment_gets_it_computed_when_loaded() {
        let root = tempfile::tempdir().unwrap();
        let (dir, records) = finding_with(root.path(), test_finding(1, "k"));
        let text = std::fs::read_to_string(dir.join(FINDING_FILE)).unwrap();
        assert!(!text.contains("failure_moment"), "{text}");
        let before = contents(&dir);

        let expected = FailureMoment {
            exit: records[2].exit,
            virtual_ns: records[2].virtual_ns,
            record: Some(2),
        };
        let loaded = load(&dir).unwrap();
        assert_eq!(loaded.file.failure_moment, None);
        assert_eq!(loaded.failure_moment, expected);
        assert_eq!(failure_moment(&dir).unwrap(), expected);
        assert_eq!(contents(&dir), before, "nothing is written into a finding");

        // A records.jsonl that is not records is named, with its line.
        let path = dir.join(RECORDS_FILE);
        std::fs::write(&path, "{}\n").unwrap();
        let message = failure_moment(&dir).unwrap_err().to_string();
        assert!(
            message.contains(RECORDS_FILE) && message.contains("line 1"),
            "{message}"
        );
    }

    /// A finding that keeps its failure moment reads it back as written
    /// (not recomputed: here it names another record than the first
    /// failing one).
    #[test]
    fn test_a_finding_s_failure_moment_round_trips() {
        let root = tempfile::tempdir().unwrap();
        let kept = FailureMoment {
            exit: 104,
            virtual_ns: vmm::VirtNanos::from_micros(4_000),
            record: Some(4),
        };
        let file = FindingFile {
            failure_moment: Some(kept),
            ..test_finding(1, "k")
        };
        let (dir, _) = finding_with(root.path(), file);
        let text = std::fs::read_to_string(dir.join(FINDING_FILE)).unwrap();
        assert!(text.contains("\"failure_moment\""), "{text}");
        assert_eq!(read_file(&dir).unwrap().failure_moment, Some(kept));
        assert_eq!(load(&dir).unwrap().failure_moment, kept);
        // And a file's failure moment with a field it does not know is
        // refused, naming the field.
        let bad = text.replace("\"record\": 4", "\"record\": 4, \"insn\": 1");
        std::fs::write(dir.join(FINDING_FILE), bad).unwrap();
        let message = format!("{:?}", read_file(&dir).unwrap_err());
        assert!(message.contains("insn"), "{message}");
    }

    #[test]
    fn test_a_blobified_run_names_no_host_path() {
        let dir = tempfile::tempdir().unwrap();
        let prepared = test_run(dir.path());
        let campaign = dir.path().join("campaign");
        std::fs::create_dir(&campaign).unwrap();
        let blobified = blobify(&campaign, &prepared).unwrap();
        let text = serde_json::to_string(&blobified).unwrap();
        assert!(!text.contains(dir.path().to_str().unwrap()), "{text}");
        assert!(text.contains(r#""source":{"image":"raft.img"}"#), "{text}");
        // And it resolves (digests checked) from the campaign directory.
        let resolved = resolve(&campaign, &blobified).unwrap();
        assert!(resolved.kernel.starts_with(&campaign));
    }

    /// A campaign directory copied from elsewhere cannot make a blob's write
    /// land outside it: a planted `.partial` symlink is not written
    /// through, and a blob that is a symlink is refused, naming it.
    #[test]
    fn test_blobs_are_never_written_through_planted_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let campaign = dir.path().join("campaign");
        let blobs = campaign.join(BLOBS_DIR);
        std::fs::create_dir_all(&blobs).unwrap();
        let bytes = b"blob bytes";
        let digest = blake3::hash(bytes).to_hex().to_string();
        let planted = blobs.join(format!(".{digest}.partial"));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert_eq!(put_blob(&campaign, bytes).unwrap(), digest);
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(blobs.join(&digest)).unwrap(), bytes);

        let other = b"other blob";
        let digest = blake3::hash(other).to_hex().to_string();
        std::os::unix::fs::symlink(&victim, blobs.join(&digest)).unwrap();
        let message = put_blob(&campaign, other).unwrap_err().to_string();
        assert!(message.contains(&digest), "{message}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }

    /// A finding written by another format version is refused, naming both
    /// versions and the file; so is one with no version at all.
    #[test]
    fn test_a_finding_of_another_format_version_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        // Version 1: before a branch re-keyed the guest CRNG at once.
        let cases = [
            (r#"{"format": 1}"#, "1"),
            (r#"{"format": 99}"#, "99"),
            ("{}", "0"),
        ];
        for (text, found) in cases {
            std::fs::write(dir.path().join(FINDING_FILE), text).unwrap();
            let error = load(dir.path()).err().expect("refused");
            let message = error.to_string();
            assert!(matches!(error, FindingError::Version { .. }), "{message}");
            assert!(
                message.contains(&format!("version {found}"))
                    && message.contains(&format!("reads version {FINDING_FORMAT}"))
                    && message.contains(FINDING_FILE),
                "{message}"
            );
        }
    }
}
