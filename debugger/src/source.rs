//! What a directory a user names is to the debugger: a finding (its
//! directory, or a campaign directory that holds exactly one), or a
//! directory of `run`/`up` snapshots. A finding's history is replayed from
//! boot (its run, by the campaign's rule and path); a snapshot directory's
//! is restored by the run library.

use fuzzer::findings::{self, FindingError, LoadedFinding, FINDING_FILE};
use fuzzer::listing::{self, ListError};
use fuzzer::store::DB_FILE;
use run::records::GuestRecord;
use std::path::{Path, PathBuf};
use vmm::VirtNanos;

/// Why a directory is no source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{}: no such directory", path.display())]
    Missing { path: PathBuf },
    #[error(transparent)]
    Finding(#[from] FindingError),
    #[error(transparent)]
    List(#[from] ListError),
    #[error("{}: the campaign holds no finding", path.display())]
    NoFinding { path: PathBuf },
    #[error("{}: the campaign holds {count} findings; name one: {}", path.display(), dirs.join(", "))]
    SeveralFindings {
        path: PathBuf,
        count: usize,
        dirs: Vec<String>,
    },
    #[error("{}: neither a finding ({FINDING_FILE}), a campaign ({DB_FILE}) nor a directory of snapshots", path.display())]
    Unknown { path: PathBuf },
}

/// A finding opened for debugging.
pub struct FindingSource {
    /// Its directory, absolute.
    pub dir: PathBuf,
    pub finding: LoadedFinding,
    /// What the guest reported along the finding's path (`records.jsonl`).
    pub records: Vec<GuestRecord>,
    /// The exit and virtual time of the first record that broke the
    /// finding's property.
    pub failure: FailurePoint,
}

/// Where a finding failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FailurePoint {
    pub exit: u64,
    pub virtual_ns: VirtNanos,
}

/// A directory the debugger works on.
pub enum Source {
    Finding(Box<FindingSource>),
    /// A directory of snapshots (absolute).
    Snapshots(PathBuf),
}

impl Source {
    /// Opens `path`: a finding's directory, a campaign's holding one
    /// finding, or a directory of snapshots.
    pub fn open(path: &Path) -> Result<Source, SourceError> {
        let dir = path.canonicalize().map_err(|_| SourceError::Missing {
            path: path.to_owned(),
        })?;
        if dir.join(FINDING_FILE).exists() {
            return Ok(Source::Finding(Box::new(open_finding(&dir)?)));
        }
        if dir.join(DB_FILE).exists() {
            let listed = listing::list(&dir)?;
            return match listed.as_slice() {
                [] => Err(SourceError::NoFinding { path: dir }),
                [one] => Ok(Source::Finding(Box::new(open_finding(&one.dir)?))),
                many => Err(SourceError::SeveralFindings {
                    path: dir,
                    count: many.len(),
                    dirs: many.iter().map(|l| l.dir.display().to_string()).collect(),
                }),
            };
        }
        if snapshot::list(&dir).is_ok_and(|list| !list.is_empty()) {
            return Ok(Source::Snapshots(dir));
        }
        Err(SourceError::Unknown { path: dir })
    }

    /// The directory, absolute.
    pub fn dir(&self) -> &Path {
        match self {
            Source::Finding(finding) => &finding.dir,
            Source::Snapshots(dir) => dir,
        }
    }

    pub fn finding(&self) -> Option<&FindingSource> {
        match self {
            Source::Finding(finding) => Some(finding),
            Source::Snapshots(_) => None,
        }
    }
}

fn open_finding(dir: &Path) -> Result<FindingSource, SourceError> {
    let finding = findings::load(dir)?;
    let records = findings::read_records(dir)?;
    let failure = failure_point(&finding);
    Ok(FindingSource {
        dir: dir.to_owned(),
        finding,
        records,
        failure,
    })
}

/// The finding's failure moment, as the campaign wrote it or as computed
/// when it was loaded.
fn failure_point(finding: &LoadedFinding) -> FailurePoint {
    FailurePoint {
        exit: finding.failure_moment.exit,
        virtual_ns: finding.failure_moment.virtual_ns,
    }
}
