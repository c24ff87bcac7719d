//! A campaign's state in SQLite (`campaign.db` in its directory): the tree
//! of moments, each branch's records and outcome, the property tallies, the
//! findings index and the budgets used. One transaction per finished
//! branch, so `kill -9` at any moment loses at most the branch in flight.
//!
//! The database lives on the host, in the process that runs the campaign,
//! even when the runs happen in a helper VM: its 9p shares refuse the
//! shared mappings SQLite's WAL needs and do not enforce locks. The journal
//! is a rollback journal (`DELETE`), fully synced, and a second campaign on
//! the same directory is refused by an exclusive `flock` on `DIR/lock`.

use crate::campaign_dir::{db_path, lock};
pub use crate::campaign_dir::{CampaignDirError, NewCampaignDir, DB_FILE, LOCK_FILE};
use crate::step::{Path as StepPath, PathReadError};
use rusqlite::{params, Connection, OptionalExtension};
use serde::{de::DeserializeOwned, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};
use vmm::VirtNanos;

/// What this build writes and reads. 2: a branch re-keys the guest
/// kernel's CRNG at its first instant, so every stored path below the root
/// replays to another history than version 1's; those are refused.
pub const FORMAT_VERSION: u32 = 2;
/// The `application_id` of a campaign database ("DVCP").
const APPLICATION_ID: i32 = 0x4456_4350;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Dir(#[from] CampaignDirError),
    /// The new database could not be put in place (a partial one left
    /// behind by a killed campaign removed, or the finished one renamed).
    #[error("installing the campaign database {path}")]
    Install {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a detvisor campaign database")]
    Foreign { path: PathBuf },
    #[error("{path}: campaign format version {found}; this build reads version {FORMAT_VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("{path}")]
    Sql {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    /// A stored value is not of the type it is read as (text that is not
    /// UTF-8, a number out of range...): the database was edited or damaged.
    #[error("{path}: {what} cannot be read")]
    BadValue {
        path: PathBuf,
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A stored path holds a fault that does not parse or names no node
    /// of the run: refused before anything replays it.
    #[error("{path}: moment {node}'s path")]
    BadPath {
        path: PathBuf,
        node: u64,
        #[source]
        source: crate::step::PathFaultError,
    },
    #[error("the campaign database holds no {key}")]
    MissingMeta { key: &'static str },
    #[error("{path}: {what} is corrupt")]
    Corrupt {
        path: PathBuf,
        what: String,
        #[source]
        source: serde_json::Error,
    },
}

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A database error on `path`. rusqlite's conversion errors print their
/// cause in their own message and give it as their source too, so they
/// become [`StoreError::BadValue`], whose chain names the cause once.
fn sql_error(path: impl Into<PathBuf>, source: rusqlite::Error) -> StoreError {
    let path = path.into();
    match source {
        rusqlite::Error::FromSqlConversionFailure(column, stored, source) => StoreError::BadValue {
            path,
            what: format!("a stored {stored} value (column {column})"),
            source,
        },
        rusqlite::Error::Utf8Error(e) => StoreError::BadValue {
            path,
            what: "a stored text value".into(),
            source: Box::new(e),
        },
        source => StoreError::Sql { path, source },
    }
}

/// One moment of the tree, as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRow {
    pub id: u64,
    pub parent: Option<u64>,
    pub depth: u32,
    pub path: StepPath,
    pub end_exits: u64,
    pub end_ns: VirtNanos,
    pub digest: String,
    /// How interesting the branch that made it was (see `search`).
    pub score: f64,
    /// Set when the run stopped (it cannot be branched further).
    pub stopped: bool,
}

/// A finding as indexed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FindingRow {
    pub number: u32,
    pub key: String,
    pub node: u64,
    pub summary: String,
}

/// An open campaign database, held exclusively.
/// The campaign's own row of metadata, as the engine keeps it under its
/// keys: what is searched, on which run, how far, and what was tallied.
#[derive(Debug)]
pub struct CampaignMeta {
    pub spec: crate::spec::CampaignSpec,
    /// The run as saved: its files named by digest in the campaign's
    /// directory (see [`crate::findings::resolve`]).
    pub run: run::up::PreparedUp,
    /// Branches chosen together, fixed at the campaign's creation.
    pub batch_width: Option<u32>,
    /// The properties' tallies (the judge's own text), once the root ran.
    pub tally: Option<String>,
    pub branches: u64,
    pub wall_ms: u64,
}

pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Held for the store's life: the `flock` (none when read only).
    _lock: Option<File>,
}

/// The database `path` opened with `flags`, checked to be a campaign
/// database of this format with every table readable.
fn open_checked(path: &Path, flags: rusqlite::OpenFlags) -> Result<Connection> {
    let sql = |source| sql_error(path.to_owned(), source);
    let conn = Connection::open_with_flags(path, flags).map_err(sql)?;
    // A file that is not SQLite fails here; any other failure (a hot
    // journal a read-only connection cannot roll back, an I/O error) is
    // said in SQLite's words, never as "not a campaign database".
    let app: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase) => StoreError::Foreign {
                path: path.to_owned(),
            },
            _ => sql(e),
        })?;
    if app != APPLICATION_ID {
        return Err(StoreError::Foreign {
            path: path.to_owned(),
        });
    }
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(sql)?;
    if version != FORMAT_VERSION {
        return Err(StoreError::Version {
            path: path.to_owned(),
            found: version,
        });
    }
    // Every table must be there and readable.
    for table in ["meta", "nodes", "records", "findings"] {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| {
            r.get::<_, i64>(0)
        })
        .map_err(sql)?;
    }
    Ok(conn)
}

impl Store {
    /// A new campaign in `dir` (created if missing; refused if it holds
    /// one), with its first metadata (see [`Store::create_in`]).
    pub fn create(dir: &Path, meta: &[(&str, String)]) -> Result<Store> {
        Self::create_in(NewCampaignDir::claim(dir)?, meta)
    }

    /// A new campaign in the claimed directory, with its first metadata.
    /// The database is made whole under a temporary name and renamed into
    /// place, so a campaign killed while it starts leaves no half-made
    /// database behind.
    pub fn create_in(claimed: NewCampaignDir, meta: &[(&str, String)]) -> Result<Store> {
        let (dir, lock) = claimed.into_parts();
        let dir = dir.as_path();
        let path = dir.join(DB_FILE);
        let partial = dir.join(format!(".{DB_FILE}.partial"));
        for leftover in [
            partial.clone(),
            dir.join(format!(".{DB_FILE}.partial-journal")),
        ] {
            match std::fs::remove_file(&leftover) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(StoreError::Install {
                        path: leftover,
                        source,
                    })
                }
            }
        }
        let sql = |source| sql_error(partial.clone(), source);
        let mut conn = Connection::open(&partial).map_err(sql)?;
        conn.execute_batch(&format!(
            "PRAGMA journal_mode = DELETE;
             PRAGMA synchronous = FULL;
             PRAGMA application_id = {APPLICATION_ID};
             PRAGMA user_version = {FORMAT_VERSION};
             BEGIN;
             CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE nodes (
                 id INTEGER PRIMARY KEY, parent INTEGER, depth INTEGER NOT NULL,
                 path TEXT NOT NULL, end_exits INTEGER NOT NULL, end_ns INTEGER NOT NULL,
                 digest TEXT NOT NULL, score REAL NOT NULL, stopped INTEGER NOT NULL);
             CREATE TABLE records (node INTEGER PRIMARY KEY, body TEXT NOT NULL);
             CREATE TABLE findings (
                 number INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE,
                 node INTEGER NOT NULL, summary TEXT NOT NULL);
             COMMIT;"
        ))
        .map_err(sql)?;
        let tx = conn.transaction().map_err(sql)?;
        let initial = [("branches", "0".to_string()), ("wall_ms", "0".to_string())];
        for (key, value) in initial
            .iter()
            .map(|(k, v)| (*k, v))
            .chain(meta.iter().map(|(k, v)| (*k, v)))
        {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(sql)?;
        }
        tx.commit().map_err(sql)?;
        drop(conn);
        std::fs::rename(&partial, &path).map_err(|source| StoreError::Install {
            path: path.clone(),
            source,
        })?;
        let conn = Connection::open(&path).map_err(|source| sql_error(path.clone(), source))?;
        Ok(Store {
            conn,
            path,
            _lock: Some(lock),
        })
    }

    /// The campaign in `dir`, to resume: held exclusively.
    pub fn open(dir: &Path) -> Result<Store> {
        let path = db_path(dir)?;
        let lock = lock(dir)?;
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = open_checked(&path, flags)?;
        conn.execute_batch("PRAGMA journal_mode = DELETE; PRAGMA synchronous = FULL;")
            .map_err(|source| sql_error(path.clone(), source))?;
        Ok(Store {
            conn,
            path,
            _lock: Some(lock),
        })
    }

    /// The campaign in `dir`, to read only (`detvisor findings`): not
    /// locked, so it can be read while the campaign runs; its format is
    /// checked as [`Store::open`] checks it.
    pub fn open_read_only(dir: &Path) -> Result<Store> {
        let path = db_path(dir)?;
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = match open_checked(&path, flags) {
            // A campaign killed in the middle of a commit left a hot journal,
            // which only a writer can roll back (to the last commit, as
            // `--resume` does first): opened to write for that alone. A
            // running campaign's journal is never hot (it holds its lock).
            Err(StoreError::Sql {
                source: rusqlite::Error::SqliteFailure(e, _),
                ..
            }) if e.extended_code == rusqlite::ffi::SQLITE_READONLY_ROLLBACK => {
                let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                    | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
                open_checked(&path, flags)?
            }
            opened => opened?,
        };
        Ok(Store {
            conn,
            path,
            _lock: None,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sql(&self, source: rusqlite::Error) -> StoreError {
        sql_error(self.path.clone(), source)
    }

    fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(|e| self.sql(e))?;
        Ok(())
    }

    pub(crate) fn meta(&self, key: &str) -> Result<Option<String>> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| self.sql(e))
    }

    /// A JSON value kept under `key` in the metadata.
    pub(crate) fn meta_json<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        match self.meta(key)? {
            None => Ok(None),
            Some(text) => {
                serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|source| StoreError::Corrupt {
                        path: self.path.clone(),
                        what: format!("meta {key:?}"),
                        source,
                    })
            }
        }
    }

    pub fn set_meta_json<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        let text = serde_json::to_string(value).expect("campaign state serializes");
        self.set_meta(key, &text)
    }

    /// The campaign's metadata as one row; a campaign without its spec or
    /// its run is refused.
    pub fn campaign_meta(&self) -> Result<CampaignMeta> {
        let batch_width = match self.meta("batch_width")? {
            None => None,
            Some(text) => Some(text.parse().map_err(|source| StoreError::BadValue {
                path: self.path.clone(),
                what: "meta \"batch_width\"".into(),
                source: Box::new(source),
            })?),
        };
        Ok(CampaignMeta {
            spec: self
                .meta_json("spec")?
                .ok_or(StoreError::MissingMeta { key: "spec" })?,
            run: self
                .meta_json("run")?
                .ok_or(StoreError::MissingMeta { key: "run" })?,
            batch_width,
            tally: self.meta("tally")?,
            branches: self.branches()?,
            wall_ms: self.wall_ms()?,
        })
    }

    pub fn branches(&self) -> Result<u64> {
        Ok(self
            .meta("branches")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    pub fn wall_ms(&self) -> Result<u64> {
        Ok(self
            .meta("wall_ms")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// Saves a finished branch: its node, its records, the tallies after
    /// it, the findings it made, and the budgets used, in one transaction.
    pub fn commit_branch(&mut self, branch: &FinishedBranch<'_>) -> Result<()> {
        let path = self.path.clone();
        let sql = |source| sql_error(path.clone(), source);
        let tx = self.conn.transaction().map_err(sql)?;
        insert_node(&tx, branch.node).map_err(sql)?;
        tx.execute(
            "INSERT OR REPLACE INTO records (node, body) VALUES (?1, ?2)",
            params![branch.node.id as i64, branch.records_json],
        )
        .map_err(sql)?;
        for finding in branch.findings {
            tx.execute(
                "INSERT INTO findings (number, key, node, summary) VALUES (?1, ?2, ?3, ?4)",
                params![
                    finding.number,
                    finding.key,
                    finding.node as i64,
                    finding.summary
                ],
            )
            .map_err(sql)?;
        }
        for (key, value) in branch.meta {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(sql)?;
        }
        tx.commit().map_err(sql)
    }

    /// Sets metadata in one transaction.
    pub fn commit_meta(&mut self, meta: &[(&str, String)]) -> Result<()> {
        let path = self.path.clone();
        let sql = |source| sql_error(path.clone(), source);
        let tx = self.conn.transaction().map_err(sql)?;
        for (key, value) in meta {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(sql)?;
        }
        tx.commit().map_err(sql)
    }

    pub fn nodes(&self) -> Result<Vec<NodeRow>> {
        let mut statement = self
            .conn
            .prepare(
                "SELECT id, parent, depth, path, end_exits, end_ns, digest, score, stopped
                 FROM nodes ORDER BY id",
            )
            .map_err(|e| self.sql(e))?;
        let rows = statement
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, Option<i64>>(1)?,
                    r.get::<_, u32>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, String>(6)?,
                    r.get::<_, f64>(7)?,
                    r.get::<_, bool>(8)?,
                ))
            })
            .map_err(|e| self.sql(e))?;
        let mut nodes = Vec::new();
        for row in rows {
            let (id, parent, depth, path, end_exits, end_ns, digest, score, stopped) =
                row.map_err(|e| self.sql(e))?;
            let path = StepPath::from_json(&path).map_err(|e| match e {
                PathReadError::Json(source) => StoreError::Corrupt {
                    path: self.path.clone(),
                    what: format!("node {id}'s path"),
                    source,
                },
                PathReadError::Fault(source) => StoreError::BadPath {
                    path: self.path.clone(),
                    node: id as u64,
                    source,
                },
            })?;
            nodes.push(NodeRow {
                id: id as u64,
                parent: parent.map(|p| p as u64),
                depth,
                path,
                end_exits: end_exits as u64,
                end_ns: VirtNanos(end_ns as u64),
                digest,
                score,
                stopped,
            });
        }
        Ok(nodes)
    }

    /// Checks every fault of every stored moment's path (see
    /// [`StepPath::check_faults`]) against the run's nodes.
    pub fn check_paths(&self, nodes: &[String]) -> Result<()> {
        for row in self.nodes()? {
            row.path
                .check_faults(nodes)
                .map_err(|source| StoreError::BadPath {
                    path: self.path.clone(),
                    node: row.id,
                    source,
                })?;
        }
        Ok(())
    }

    /// The records of node `id`'s stretch, as saved.
    pub fn records<T: DeserializeOwned>(&self, id: u64) -> Result<Option<T>> {
        let text: Option<String> = self
            .conn
            .query_row(
                "SELECT body FROM records WHERE node = ?1",
                [id as i64],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.sql(e))?;
        text.map(|text| {
            serde_json::from_str(&text).map_err(|source| StoreError::Corrupt {
                path: self.path.clone(),
                what: format!("node {id}'s records"),
                source,
            })
        })
        .transpose()
    }

    pub fn findings(&self) -> Result<Vec<FindingRow>> {
        let mut statement = self
            .conn
            .prepare("SELECT number, key, node, summary FROM findings ORDER BY number")
            .map_err(|e| self.sql(e))?;
        let rows = statement
            .query_map([], |r| {
                Ok(FindingRow {
                    number: r.get(0)?,
                    key: r.get(1)?,
                    node: r.get::<_, i64>(2)? as u64,
                    summary: r.get(3)?,
                })
            })
            .map_err(|e| self.sql(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.sql(e))
    }
}

fn insert_node(tx: &rusqlite::Transaction<'_>, node: &NodeRow) -> rusqlite::Result<usize> {
    tx.execute(
        "INSERT OR REPLACE INTO nodes (id, parent, depth, path, end_exits, end_ns, digest, score, stopped)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            node.id as i64,
            node.parent.map(|p| p as i64),
            node.depth,
            serde_json::to_string(&node.path).expect("paths serialize"),
            node.end_exits as i64,
            node.end_ns.as_nanos() as i64,
            node.digest,
            node.score,
            node.stopped
        ],
    )
}

/// Everything one finished branch changes.
pub struct FinishedBranch<'a> {
    pub node: &'a NodeRow,
    /// The stretch's records, as JSON.
    pub records_json: &'a str,
    pub findings: &'a [FindingRow],
    /// Metadata after the branch (tallies, budgets used, counters).
    pub meta: &'a [(&'a str, String)],
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two new campaigns on one fresh directory: the second claim is
    /// refused while the first is held (before either writes anything), and
    /// a directory holding a campaign is never claimed again.
    #[test]
    fn test_a_fresh_directory_is_claimed_by_one_new_campaign_only() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let first = NewCampaignDir::claim(&out).unwrap();
        let second = NewCampaignDir::claim(&out).err().expect("refused");
        assert!(matches!(second, CampaignDirError::Busy { .. }), "{second}");
        drop(Store::create_in(first, &[]).unwrap());
        let again = NewCampaignDir::claim(&out).err().expect("refused");
        assert!(matches!(again, CampaignDirError::Exists { .. }), "{again}");
        let checked = NewCampaignDir::check(&out).expect_err("refused");
        assert!(
            matches!(checked, CampaignDirError::Exists { .. }),
            "{checked}"
        );
    }

    fn node(id: u64, parent: Option<u64>) -> NodeRow {
        NodeRow {
            id,
            parent,
            depth: parent.map_or(0, |_| 1),
            path: StepPath::default().child(
                id,
                vec!["at=+1s pause n1".parse().unwrap()],
                VirtNanos(1_000),
            ),
            end_exits: 10 * id,
            end_ns: VirtNanos(1_000 * id),
            digest: format!("{id:032x}"),
            score: 0.5,
            stopped: false,
        }
    }

    /// The engine's keys, read back as one row; a campaign without a spec
    /// is refused by name.
    #[test]
    fn test_the_meta_keys_read_as_one_row() {
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::spec::CampaignSpec::parse(
            "manifest = \"m.toml\"\nseed = 5",
            Path::new("c.toml"),
            Path::new("/"),
        )
        .unwrap();
        let run = serde_json::json!({
            "kernel": "/k", "initrd": {"file": "/i"}, "specs": [], "node_names": ["n1"],
            "workload": null,
            "network": devices::NetworkConfig::reliable(devices::LatencyDist::Fixed(vmm::VirtNanos::ZERO)),
            "rtc_epoch_unix_secs": 0, "ram_bytes": 1, "faults": [], "disks": []
        });
        let mut store = Store::create(
            dir.path(),
            &[
                ("spec", serde_json::to_string(&spec).unwrap()),
                ("run", run.to_string()),
                ("batch_width", "4".into()),
            ],
        )
        .unwrap();
        store
            .commit_meta(&[("branches", "7".into()), ("tally", "{}".into())])
            .unwrap();
        let meta = store.campaign_meta().unwrap();
        assert_eq!(meta.spec.seed, 5);
        assert_eq!(meta.run.node_names, ["n1"]);
        assert_eq!(meta.batch_width, Some(4));
        assert_eq!(meta.tally.as_deref(), Some("{}"));
        assert_eq!((meta.branches, meta.wall_ms), (7, 0));

        let bare = tempfile::tempdir().unwrap();
        let store = Store::create(bare.path(), &[]).unwrap();
        assert_eq!(
            store.campaign_meta().unwrap_err().to_string(),
            "the campaign database holds no spec"
        );
    }

    #[test]
    fn test_a_branch_is_saved_whole_and_read_back_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::create(dir.path(), &[("spec", "{}".into())]).unwrap();
        let root = node(0, None);
        let child = node(1, Some(0));
        store
            .commit_branch(&FinishedBranch {
                node: &root,
                records_json: "[]",
                findings: &[],
                meta: &[("branches", "0".into())],
            })
            .unwrap();
        let finding = FindingRow {
            number: 1,
            key: "property:x".into(),
            node: 1,
            summary: "x failed".into(),
        };
        store
            .commit_branch(&FinishedBranch {
                node: &child,
                records_json: "[1,2]",
                findings: std::slice::from_ref(&finding),
                meta: &[("branches", "1".into()), ("tally", "{\"a\":1}".into())],
            })
            .unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.nodes().unwrap(), vec![root, child]);
        assert_eq!(store.findings().unwrap(), vec![finding]);
        assert_eq!(store.branches().unwrap(), 1);
        assert_eq!(store.records::<Vec<u32>>(1).unwrap(), Some(vec![1, 2]));
        assert_eq!(store.meta("tally").unwrap().as_deref(), Some("{\"a\":1}"));
    }

    #[test]
    fn test_a_second_campaign_on_one_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::create(dir.path(), &[("spec", "{}".into())]).unwrap();
        let second = Store::open(dir.path()).err().unwrap();
        assert!(
            matches!(second, StoreError::Dir(CampaignDirError::Busy { .. })),
            "{second}"
        );
        drop(_first);
        let again = Store::create(dir.path(), &[("spec", "{}".into())])
            .err()
            .unwrap();
        assert!(
            matches!(again, StoreError::Dir(CampaignDirError::Exists { .. })),
            "{again}"
        );
        assert!(again.to_string().contains("--resume"));
    }

    #[test]
    fn test_a_foreign_or_corrupt_directory_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Store::open(dir.path()).err().unwrap();
        assert!(matches!(
            missing,
            StoreError::Dir(CampaignDirError::NotACampaign { .. })
        ));
        std::fs::write(
            dir.path().join(DB_FILE),
            b"this is not sqlite, it is a text file",
        )
        .unwrap();
        let foreign = Store::open(dir.path()).err().unwrap();
        assert!(foreign.to_string().contains(DB_FILE), "{foreign}");
        // Another SQLite database (not ours).
        std::fs::remove_file(dir.path().join(DB_FILE)).unwrap();
        let other = Connection::open(dir.path().join(DB_FILE)).unwrap();
        other.execute_batch("CREATE TABLE t (x INTEGER);").unwrap();
        drop(other);
        let foreign = Store::open(dir.path()).err().unwrap();
        assert!(matches!(foreign, StoreError::Foreign { .. }), "{foreign}");
        // Ours, from another version.
        std::fs::remove_file(dir.path().join(DB_FILE)).unwrap();
        drop(Store::create(dir.path(), &[("spec", "{}".into())]).unwrap());
        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        // Version 1: before a branch re-keyed the guest CRNG at once (its
        // paths replay to other histories now).
        for found in [1, 99] {
            conn.execute_batch(&format!("PRAGMA user_version = {found};"))
                .unwrap();
            let refused = Store::open(dir.path()).err().unwrap();
            let text = refused.to_string();
            assert!(
                text.contains(&format!("campaign format version {found};"))
                    && text.contains(&format!("reads version {FORMAT_VERSION}")),
                "{text}"
            );
        }
        drop(conn);
    }

    /// A metadata value that is not UTF-8 (found by the `file_campaign_dir`
    /// fuzz target): a typed refusal naming the database, whose chain gives
    /// the cause once (rusqlite's own error prints it twice).
    #[test]
    fn test_a_value_that_is_not_utf8_is_refused_naming_its_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::create(dir.path(), &[("spec", "{}".into())]).unwrap());
        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        conn.execute_batch("UPDATE meta SET value = CAST(X'7B22FF' AS TEXT) WHERE key = 'spec';")
            .unwrap();
        drop(conn);
        let store = Store::open(dir.path()).unwrap();
        let err = store.meta("spec").unwrap_err();
        assert!(matches!(err, StoreError::BadValue { .. }), "{err:?}");
        let mut chain = vec![err.to_string()];
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            chain.push(cause.to_string());
            source = cause.source();
        }
        assert!(chain[0].contains(DB_FILE), "{chain:?}");
        let cause = chain.last().unwrap();
        assert!(cause.contains("invalid utf-8"), "{chain:?}");
        let text = chain.join(": ");
        assert_eq!(text.matches(cause.as_str()).count(), 1, "{text}");
        assert!(store.meta_json::<serde_json::Value>("spec").is_err());
    }
}
