//! A campaign's findings as `detvisor findings` lists them: from the
//! campaign's index (its database, opened read only and its format
//! checked), each finding's directory read and matched against its row. A
//! directory the index names that is missing, one the index does not know,
//! or one that says it is another finding is an error: the listing never
//! says less or more than the campaign found.

use crate::findings::{self, FindingError, FindingFile, FINDINGS_DIR};
use crate::store::{Store, StoreError, DB_FILE};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A finding as listed: its directory and its `finding.json`.
pub struct Listed {
    pub dir: PathBuf,
    pub file: FindingFile,
}

#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Finding(#[from] FindingError),
    #[error("{}: missing, though the campaign's index ({DB_FILE}) holds finding {number:04} ({key})", dir.display())]
    Missing {
        dir: PathBuf,
        number: u32,
        key: String,
    },
    #[error("{}: not in the campaign's index ({DB_FILE}); a campaign killed as it wrote a finding leaves one, which `detvisor campaign --resume` removes", dir.display())]
    Unindexed { dir: PathBuf },
    #[error("{}: finding {found_number:04} ({found_key}), but the campaign's index holds {number:04} as {key}", path.display())]
    Mismatch {
        path: PathBuf,
        number: u32,
        key: String,
        found_number: u32,
        found_key: String,
    },
    #[error("reading {}", dir.display())]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The finding number a directory's name is (`NNNN`, four digits or more,
/// as [`findings::finding_dir`] names them); `None` for anything else.
fn number_of(name: &str) -> Option<u32> {
    let number: u32 = name.parse().ok()?;
    (name.bytes().all(|b| b.is_ascii_digit()) && format!("{number:04}") == name).then_some(number)
}

/// The finding directories under `campaign`'s `findings/`, by number
/// (temporary `.NNNN.partial` ones and other names left out).
fn finding_dirs(campaign: &Path) -> Result<Vec<(u32, PathBuf)>, ListError> {
    let dir = campaign.join(FINDINGS_DIR);
    let read = |source| ListError::ReadDir {
        dir: dir.clone(),
        source,
    };
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read)?;
        if let Some(number) = entry.file_name().to_str().and_then(number_of) {
            found.push((number, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Every finding of the campaign in `campaign`, in number order, checked
/// against its index.
pub fn list(campaign: &Path) -> Result<Vec<Listed>, ListError> {
    let store = Store::open_read_only(campaign)?;
    let rows = store.findings()?;
    let indexed: BTreeSet<u32> = rows.iter().map(|r| r.number).collect();
    if let Some((_, dir)) = finding_dirs(campaign)?
        .into_iter()
        .find(|(n, _)| !indexed.contains(n))
    {
        return Err(ListError::Unindexed { dir });
    }
    let mut listed = Vec::new();
    for row in rows {
        let dir = findings::finding_dir(campaign, row.number);
        if std::fs::symlink_metadata(&dir).is_err() {
            return Err(ListError::Missing {
                dir,
                number: row.number,
                key: row.key,
            });
        }
        let file = findings::read_file(&dir)?;
        if file.number != row.number || file.key != row.key {
            return Err(ListError::Mismatch {
                path: dir.join(findings::FINDING_FILE),
                number: row.number,
                key: row.key,
                found_number: file.number,
                found_key: file.key,
            });
        }
        listed.push(Listed { dir, file });
    }
    Ok(listed)
}

/// Removes the finding directories of `campaign` its index (`indexed`)
/// does not hold: each was written by a branch a killed campaign had not
/// saved yet, which a resumed campaign runs again (and writes again, under
/// the same number). What was removed.
pub fn remove_unindexed(campaign: &Path, indexed: &[u32]) -> Result<Vec<PathBuf>, ListError> {
    let mut removed = Vec::new();
    for (number, dir) in finding_dirs(campaign)? {
        if !indexed.contains(&number) {
            std::fs::remove_dir_all(&dir).map_err(|source| ListError::ReadDir {
                dir: dir.clone(),
                source,
            })?;
            removed.push(dir);
        }
    }
    Ok(removed)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::{FindingRow, FinishedBranch, NodeRow};

    /// A campaign directory whose index holds findings `numbers` (their
    /// directories written with `finding.json` only).
    fn campaign(numbers: &[u32]) -> tempfile::TempDir {
        let keys: Vec<String> = numbers.iter().map(|n| format!("property:p{n}")).collect();
        let keyed: Vec<(u32, &str)> = numbers
            .iter()
            .zip(&keys)
            .map(|(&n, k)| (n, k.as_str()))
            .collect();
        campaign_with_keys(&keyed)
    }

    /// A campaign directory whose index holds findings `(number, key)`
    /// (their directories written with `finding.json` only).
    pub(crate) fn campaign_with_keys(keyed: &[(u32, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::create(dir.path(), &[("spec", "{}".into())]).unwrap();
        let rows: Vec<FindingRow> = keyed
            .iter()
            .map(|&(number, key)| FindingRow {
                number,
                key: key.into(),
                node: 0,
                summary: "failed".into(),
            })
            .collect();
        let node = NodeRow {
            id: 0,
            parent: None,
            depth: 0,
            path: Default::default(),
            end_exits: 0,
            end_ns: vmm::VirtNanos::ZERO,
            digest: "d".into(),
            score: 1.0,
            stopped: false,
        };
        store
            .commit_branch(&FinishedBranch {
                node: &node,
                records_json: "[]",
                findings: &rows,
                meta: &[],
            })
            .unwrap();
        for row in &rows {
            write_file(dir.path(), row.number, &row.key);
        }
        dir
    }

    fn write_file(campaign: &Path, number: u32, key: &str) {
        let dir = findings::finding_dir(campaign, number);
        std::fs::create_dir_all(&dir).unwrap();
        let file = findings::test_finding(number, key);
        let text = serde_json::to_string(&file).unwrap();
        std::fs::write(dir.join(findings::FINDING_FILE), text).unwrap();
    }

    #[test]
    fn test_findings_are_listed_from_the_index_in_number_order() {
        let dir = campaign(&[2, 1]);
        let listed = list(dir.path()).unwrap();
        let got: Vec<(u32, String)> = listed
            .iter()
            .map(|l| (l.file.number, l.file.key.clone()))
            .collect();
        let want = vec![(1, "property:p1".into()), (2, "property:p2".into())];
        assert_eq!(got, want);
    }

    /// An indexed finding whose directory is gone, a directory the index
    /// does not know, and one that says it is another finding: each an
    /// error naming the directory.
    #[test]
    fn test_a_listing_that_disagrees_with_the_index_is_an_error_naming_the_directory() {
        let dir = campaign(&[1]);
        std::fs::remove_dir_all(dir.path().join(FINDINGS_DIR)).unwrap();
        let error = list(dir.path()).err().expect("refused");
        assert!(
            matches!(error, ListError::Missing { number: 1, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("findings/0001"), "{error}");

        let dir = campaign(&[1]);
        write_file(dir.path(), 2, "property:other");
        let error = list(dir.path()).err().expect("refused");
        assert!(matches!(error, ListError::Unindexed { .. }), "{error}");
        assert!(error.to_string().contains("findings/0002"), "{error}");
        // What a resumed campaign does with it.
        let removed = remove_unindexed(dir.path(), &[1]).unwrap();
        assert_eq!(removed, vec![findings::finding_dir(dir.path(), 2)]);
        assert_eq!(list(dir.path()).unwrap().len(), 1);

        let dir = campaign(&[1]);
        write_file(dir.path(), 1, "property:swapped");
        let error = list(dir.path()).err().expect("refused");
        assert!(matches!(error, ListError::Mismatch { .. }), "{error}");
        assert!(error.to_string().contains("property:swapped"), "{error}");
    }

    /// A campaign killed in the middle of a commit (its database and hot
    /// journal copied while a transaction had written both): listed as of
    /// its last commit, not refused as "not a campaign database".
    #[test]
    fn test_a_campaign_killed_mid_commit_is_listed_as_of_its_last_commit() {
        let dir = campaign(&[1]);
        let db = dir.path().join(DB_FILE);
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "PRAGMA cache_size = 1; BEGIN; DELETE FROM findings;
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400)
             INSERT INTO records (node, body) SELECT i, printf('%.3000c', 'x') FROM n;",
        )
        .unwrap();
        let journal = dir.path().join(format!("{DB_FILE}-journal"));
        assert!(
            journal.metadata().unwrap().len() > 0,
            "a journal was written"
        );
        let killed = tempfile::tempdir().unwrap();
        std::fs::copy(&db, killed.path().join(DB_FILE)).unwrap();
        std::fs::copy(&journal, killed.path().join(format!("{DB_FILE}-journal"))).unwrap();
        drop(conn);
        write_file(killed.path(), 1, "property:p1");
        let listed = list(killed.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(listed.len(), 1);
    }

    /// A database that is not one of ours, empty, truncated or random bytes
    /// is refused (as `--resume` refuses it), never listed as "no
    /// findings".
    #[test]
    fn test_a_database_that_is_not_a_campaigns_is_refused() {
        let whole = campaign(&[1]);
        let bytes = std::fs::read(whole.path().join(DB_FILE)).unwrap();
        let cases: [(&str, Vec<u8>); 3] = [
            ("empty", Vec::new()),
            ("truncated", bytes[..bytes.len() / 2].to_vec()),
            (
                "random",
                (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(),
            ),
        ];
        for (what, content) in cases {
            let dir = campaign(&[1]);
            std::fs::write(dir.path().join(DB_FILE), content).unwrap();
            let error = list(dir.path())
                .err()
                .unwrap_or_else(|| panic!("{what}: listed"));
            assert!(matches!(error, ListError::Store(_)), "{what}: {error}");
            assert!(error.to_string().contains(DB_FILE), "{what}: {error}");
        }
    }
}
