//! A soak's results directory: what the soak is of (`identity.json`), its
//! reference run (`reference.json` and every exit record of it,
//! `reference.records`), and one JSON line per later run (`results.jsonl`).
//!
//! Nothing half-written counts: the reference's files are written under
//! another name and renamed into place (`reference.json` last, so that it
//! stands for a whole reference), and a results line is appended whole; a
//! last line cut off by an interruption (no newline, or not JSON) is ignored
//! and overwritten by the next append.

use super::{RunResult, SoakIdentity};
use serde::{Deserialize, Serialize};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use vmm::vm::DigestParts;

const IDENTITY: &str = "identity.json";
const REFERENCE: &str = "reference.json";
/// Every exit record of the reference run, [`vmm::record::RECORD_BYTES`] each.
pub(super) const RECORDS: &str = "reference.records";
const RESULTS: &str = "results.jsonl";

/// Why a results directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("soak directory {}: {what}", path.display())]
    Io {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("soak directory {}: {file} is not what a soak writes", dir.display())]
    Corrupt {
        dir: PathBuf,
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("soak directory {} holds another soak ({theirs}), not this one ({ours}); give another --out or remove it", dir.display())]
    OtherSoak {
        dir: PathBuf,
        theirs: String,
        ours: String,
    },
}

/// The reference run: run 1, whose exit records later runs are compared with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reference {
    pub result: RunResult,
    pub digest_parts: DigestParts,
}

/// An open results directory of one soak.
#[derive(Debug)]
pub struct SoakDir {
    dir: PathBuf,
}

fn io(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { path, what, source }
}

/// Writes `bytes` to `path` whole or not at all (a sibling file renamed).
fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, bytes).map_err(io(&partial, "writing"))?;
    std::fs::rename(&partial, path).map_err(io(path, "renaming into place"))
}

impl SoakDir {
    /// Opens (creating it if need be) the results directory `dir` of the
    /// soak `identity`: a directory holding another soak's results is refused.
    pub fn open(dir: &Path, identity: &SoakIdentity) -> Result<SoakDir, StoreError> {
        std::fs::create_dir_all(dir).map_err(io(dir, "creating"))?;
        let store = SoakDir {
            dir: dir.to_path_buf(),
        };
        let path = store.path(IDENTITY);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let theirs: SoakIdentity =
                    serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
                        dir: dir.to_path_buf(),
                        file: IDENTITY,
                        source,
                    })?;
                if &theirs != identity {
                    return Err(StoreError::OtherSoak {
                        dir: dir.to_path_buf(),
                        theirs: theirs.to_string(),
                        ours: identity.to_string(),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut json = serde_json::to_vec_pretty(identity).expect("an identity is JSON");
                json.push(b'\n');
                write_whole(&path, &json)?;
            }
            Err(e) => return Err(io(&path, "reading")(e)),
        }
        Ok(store)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The reference run, once one finished.
    pub fn reference(&self) -> Result<Option<Reference>, StoreError> {
        let path = self.path(REFERENCE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                serde_json::from_slice(&bytes)
                    .map(Some)
                    .map_err(|source| StoreError::Corrupt {
                        dir: self.dir.clone(),
                        file: REFERENCE,
                        source,
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path, "reading")(e)),
        }
    }

    /// Where the reference's records are written before they are whole.
    pub(super) fn partial_records(&self) -> PathBuf {
        self.path(RECORDS).with_extension("partial")
    }

    /// Makes a finished reference run the reference: its records (written
    /// to [`SoakDir::partial_records`]) moved into place, then its summary.
    /// Later runs' results of an earlier reference are dropped.
    pub fn set_reference(&self, reference: &Reference) -> Result<(), StoreError> {
        let records = self.path(RECORDS);
        std::fs::rename(self.partial_records(), &records)
            .map_err(io(&records, "renaming into place"))?;
        let results = self.path(RESULTS);
        match std::fs::remove_file(&results) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(io(&results, "removing")(e))
            }
            _ => {}
        }
        let mut json = serde_json::to_vec(reference).expect("a reference is JSON");
        json.push(b'\n');
        write_whole(&self.path(REFERENCE), &json)
    }

    /// The later runs' results, in the order they finished; a torn last
    /// line is left out. Reads the whole file: one short line a run.
    pub fn results(&self) -> Result<Vec<RunResult>, StoreError> {
        Ok(self.read_results()?.0)
    }

    /// The whole lines' results and the length of the file they fill.
    fn read_results(&self) -> Result<(Vec<RunResult>, u64), StoreError> {
        let path = self.path(RESULTS);
        let text = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
            Err(e) => return Err(io(&path, "reading")(e)),
        };
        let mut results = Vec::new();
        let mut whole = 0usize;
        let mut lines = text.split_inclusive(|b| *b == b'\n').peekable();
        while let Some(line) = lines.next() {
            let last = lines.peek().is_none();
            let parsed = line
                .strip_suffix(b"\n")
                .map(serde_json::from_slice::<RunResult>);
            match parsed {
                Some(Ok(result)) => {
                    results.push(result);
                    whole += line.len();
                }
                // Cut off by an interruption: the run did not finish.
                None | Some(Err(_)) if last => break,
                None => unreachable!("only the last piece lacks a newline"),
                Some(Err(source)) => {
                    return Err(StoreError::Corrupt {
                        dir: self.dir.clone(),
                        file: RESULTS,
                        source,
                    })
                }
            }
        }
        Ok((results, whole as u64))
    }

    /// Appends `result` as one line (after the whole lines: a torn last
    /// line goes) and syncs it.
    pub fn append(&self, result: &RunResult) -> Result<(), StoreError> {
        let (_, whole) = self.read_results()?;
        let path = self.path(RESULTS);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path, "opening"))?;
        file.set_len(whole).map_err(io(&path, "truncating"))?;
        let mut line = serde_json::to_vec(result).expect("a result is JSON");
        line.push(b'\n');
        file.seek(std::io::SeekFrom::Start(whole))
            .map_err(io(&path, "seeking"))?;
        file.write_all(&line).map_err(io(&path, "appending"))?;
        file.sync_data().map_err(io(&path, "syncing"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm::VirtNanos;

    fn identity(seed: u64) -> SoakIdentity {
        SoakIdentity {
            scenario: "boot".into(),
            seed,
            config: "c0ffee".into(),
            build: "b1".into(),
            perturb: None,
        }
    }

    fn result(run: u32) -> RunResult {
        RunResult {
            run,
            exits: 400 + run as u64,
            virtual_ns: VirtNanos(1000),
            digest: format!("d{run}"),
            status: Some(0),
            wall_ms: 1500,
            divergence: None,
        }
    }

    fn reference() -> Reference {
        Reference {
            result: result(1),
            digest_parts: DigestParts {
                records: "r".into(),
                memory: "m".into(),
                devices: "d".into(),
                console: "c".into(),
            },
        }
    }

    /// A soak directory's results read as they did when the time was a
    /// bare number: directories written before resume.
    #[test]
    fn test_a_result_line_is_unchanged() {
        let line = r#"{"run":2,"exits":402,"virtual_ns":1000,"digest":"d2","status":0,"wall_ms":1500,"divergence":null}"#;
        assert_eq!(serde_json::to_string(&result(2)).unwrap(), line);
        assert_eq!(serde_json::from_str::<RunResult>(line).unwrap(), result(2));
    }

    #[test]
    fn test_results_survive_reopening_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SoakDir::open(tmp.path(), &identity(1)).unwrap();
        assert!(dir.results().unwrap().is_empty());
        dir.append(&result(2)).unwrap();
        dir.append(&result(3)).unwrap();
        let again = SoakDir::open(tmp.path(), &identity(1)).unwrap();
        assert_eq!(again.results().unwrap(), vec![result(2), result(3)]);
    }

    #[test]
    fn test_a_torn_last_line_is_ignored_then_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SoakDir::open(tmp.path(), &identity(1)).unwrap();
        dir.append(&result(2)).unwrap();
        let path = dir.path(RESULTS);
        let mut text = std::fs::read(&path).unwrap();
        text.extend_from_slice(br#"{"run":3,"exits":4"#);
        std::fs::write(&path, &text).unwrap();
        assert_eq!(dir.results().unwrap(), vec![result(2)]);
        dir.append(&result(3)).unwrap();
        assert_eq!(dir.results().unwrap(), vec![result(2), result(3)]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
    }

    #[test]
    fn test_a_bad_line_before_the_last_is_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SoakDir::open(tmp.path(), &identity(1)).unwrap();
        dir.append(&result(2)).unwrap();
        let path = dir.path(RESULTS);
        let mut text = b"not json\n".to_vec();
        text.extend(std::fs::read(&path).unwrap());
        std::fs::write(&path, &text).unwrap();
        let err = dir.results().unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { file: RESULTS, .. }),
            "{err}"
        );
    }

    #[test]
    fn test_another_soaks_directory_is_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        SoakDir::open(tmp.path(), &identity(1)).unwrap();
        let err = SoakDir::open(tmp.path(), &identity(2)).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, StoreError::OtherSoak { .. }), "{text}");
        assert!(text.contains("seed 1") && text.contains("seed 2"), "{text}");
        let mut perturbed = identity(1);
        perturbed.perturb = Some((2, 100));
        assert!(SoakDir::open(tmp.path(), &perturbed).is_err());
    }

    #[test]
    fn test_a_reference_counts_only_once_whole_and_resets_results() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SoakDir::open(tmp.path(), &identity(1)).unwrap();
        std::fs::write(dir.partial_records(), [0u8; 68]).unwrap();
        assert_eq!(
            dir.reference().unwrap(),
            None,
            "records alone are no reference"
        );
        dir.append(&result(2)).unwrap();
        dir.set_reference(&reference()).unwrap();
        assert_eq!(dir.reference().unwrap(), Some(reference()));
        assert!(
            dir.results().unwrap().is_empty(),
            "results of an older reference go"
        );
        assert!(dir.path(RECORDS).is_file());
        assert!(!dir.partial_records().exists());
    }
}
