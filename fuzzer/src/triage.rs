//! Triage across nights: a baseline file marks findings known or ignored
//! by their failure key ([`FailureKey`]), with a note, and [`classify`]
//! says of tonight's findings which are new, known or ignored, and which
//! baseline entries no finding has tonight (possibly fixed).
//!
//! The baseline is TOML, to be reviewed in a pull request: one table per
//! entry under `finding`, keyed by the key's slug as `detvisor findings`
//! prints it (docs/campaigns.md, "Triage across nights"):
//!
//! ```toml
//! format = 1
//!
//! [finding."checker:linearizability:k2"]
//! status = "known"          # or "ignored"
//! note = "upstream #123"
//! by = "alice"              # optional
//! date = "2026-12-05"       # optional
//! ```
//!
//! [`Baseline::parse`] and [`Baseline::to_toml`] are the typed reading and
//! printing; [`set_entry`] edits a file's text in place (its other entries
//! and its comments kept), as `detvisor triage` does. An entry's key may be
//! an old one (`file:line`, see [`crate::failure`]'s "Old keys"): it marks
//! the findings whose keys it [matches](FailureKey::matches).

use crate::campaign::FindingLine;
use crate::failure::FailureKey;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The baseline format this build reads and writes (`format = 1`; a file
/// without `format` is of this one).
pub const BASELINE_FORMAT: u32 = 1;

/// The largest baseline file read.
const MAX_BASELINE_BYTES: u64 = 16 << 20;

/// What a baseline entry says of its failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mark {
    /// Seen before and understood (e.g. filed upstream); not news.
    Known,
    /// Not a bug worth tracking (e.g. a property too strict); not news.
    Ignored,
}

/// One baseline entry (its key is the map's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub status: Mark,
    /// Why, for the reviewer: an issue, a reason.
    pub note: String,
    /// Who triaged it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When (any text; e.g. `YYYY-MM-DD`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
}

/// A baseline: entries by failure key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Baseline {
    pub entries: BTreeMap<FailureKey, Entry>,
}

/// Why a baseline could not be read or edited.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error(transparent)]
    Read(hostfile::ReadError),
    #[error(transparent)]
    Write(hostfile::WriteError),
    #[error("{}: line {line}: {message}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: format {found}: this detvisor reads baselines of format {BASELINE_FORMAT}", path.display())]
    Format { path: PathBuf, found: u32 },
}

/// A failure key as a baseline's table key: its slug, exactly as
/// [`FailureKey::slug`] prints it (so that two texts of one key cannot be
/// two entries).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct SlugKey(FailureKey);

impl<'de> Deserialize<'de> for SlugKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let text = String::deserialize(deserializer)?;
        let key = FailureKey::from_slug(&text).map_err(D::Error::custom)?;
        if key.slug() != text {
            return Err(D::Error::custom(format!(
                "failure key {text:?}: write it as {:?}",
                key.slug()
            )));
        }
        Ok(SlugKey(key))
    }
}

impl Serialize for SlugKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0.slug())
    }
}

/// The file as serde reads it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBaseline {
    format: Option<u32>,
    #[serde(default)]
    finding: BTreeMap<SlugKey, Entry>,
}

/// The file as serde writes it.
#[derive(Serialize)]
struct RawOut<'a> {
    format: u32,
    finding: BTreeMap<SlugKey, &'a Entry>,
}

/// A parser's message on one line (toml's may span two).
fn one_line(message: &str) -> String {
    message.trim().replace('\n', ": ")
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

impl Baseline {
    /// The baseline in `text`, read from `path` (named in errors, with the
    /// line).
    pub fn parse(text: &str, path: &Path) -> Result<Baseline, BaselineError> {
        let raw: RawBaseline = toml::from_str(text).map_err(|e| BaselineError::Parse {
            path: path.to_owned(),
            line: e.span().map_or(1, |span| line_of(text, span.start)),
            message: one_line(e.message()),
        })?;
        match raw.format {
            None | Some(BASELINE_FORMAT) => {}
            Some(found) => {
                return Err(BaselineError::Format {
                    path: path.to_owned(),
                    found,
                })
            }
        }
        Ok(Baseline {
            entries: raw.finding.into_iter().map(|(k, e)| (k.0, e)).collect(),
        })
    }

    /// The baseline in the file `path`.
    pub fn load(path: &Path) -> Result<Baseline, BaselineError> {
        Baseline::parse(&read(path)?, path)
    }

    /// The baseline as a file (`format` first, entries by key), which
    /// [`Baseline::parse`] reads back equal.
    pub fn to_toml(&self) -> String {
        let raw = RawOut {
            format: BASELINE_FORMAT,
            finding: self
                .entries
                .iter()
                .map(|(k, e)| (SlugKey(k.clone()), e))
                .collect(),
        };
        toml::to_string(&raw).expect("a baseline serializes")
    }

    /// The entry that marks `key`: its own, else one whose key
    /// [matches](FailureKey::matches) it (an old key). With its key.
    pub fn entry_for(&self, key: &FailureKey) -> Option<(&FailureKey, &Entry)> {
        self.entries
            .get_key_value(key)
            .or_else(|| self.entries.iter().find(|(k, _)| k.matches(key)))
    }
}

/// The text of the baseline file `path`.
fn read(path: &Path) -> Result<String, BaselineError> {
    hostfile::read_text_limited(path, MAX_BASELINE_BYTES).map_err(BaselineError::Read)
}

/// [`set_entry`] on the baseline file `path` (created if missing; replaced
/// whole, never half-written).
pub fn set_entry_in_file(
    path: &Path,
    key: &FailureKey,
    entry: &Entry,
) -> Result<(), BaselineError> {
    let text = match read(path) {
        Ok(text) => text,
        Err(BaselineError::Read(e)) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let edited = set_entry(&text, path, key, entry)?;
    let mut out = hostfile::Output::create(path).map_err(BaselineError::Write)?;
    out.write_all(edited.as_bytes())
        .map_err(BaselineError::Write)?;
    out.commit().map_err(BaselineError::Write)?;
    Ok(())
}

/// The text of a new baseline file, before its first entry.
const NEW_FILE: &str = "# Findings triaged across nights (docs/campaigns.md, \"Triage across nights\"):\n# `detvisor findings DIR --baseline FILE` exits 1 only for a finding not here.\nformat = 1\n";

/// `text` (a baseline file's, read from `path`; empty for a new file) with
/// `key`'s entry set to `entry`: an entry of that key, else one whose old
/// key [matches](FailureKey::matches) it, is updated in place; otherwise
/// one is added. The file's other entries, its comments and its layout are
/// kept. An invalid `text` is refused as [`Baseline::parse`] refuses it.
pub fn set_entry(
    text: &str,
    path: &Path,
    key: &FailureKey,
    entry: &Entry,
) -> Result<String, BaselineError> {
    let baseline = Baseline::parse(text, path)?;
    let text = if text.trim().is_empty() {
        NEW_FILE
    } else {
        text
    };
    let mut doc: toml_edit::DocumentMut =
        text.parse()
            .map_err(|e: toml_edit::TomlError| BaselineError::Parse {
                path: path.to_owned(),
                line: e.span().map_or(1, |span| line_of(text, span.start)),
                message: one_line(e.message()),
            })?;
    let slug = baseline
        .entry_for(key)
        .map_or_else(|| key.slug(), |(k, _)| k.slug());
    let findings = doc
        .entry("finding")
        .or_insert_with(|| {
            let mut table = toml_edit::Table::new();
            table.set_implicit(true);
            toml_edit::Item::Table(table)
        })
        .as_table_mut()
        .expect("`finding` is a table: the typed reading checked it");
    let table = findings
        .entry(&slug)
        .or_insert_with(|| toml_edit::Item::Table(toml_edit::Table::new()))
        .as_table_mut()
        .expect("each entry is a table: the typed reading checked it");
    let status = match entry.status {
        Mark::Known => "known",
        Mark::Ignored => "ignored",
    };
    table.insert("status", toml_edit::value(status));
    table.insert("note", toml_edit::value(entry.note.as_str()));
    for (name, value) in [("by", &entry.by), ("date", &entry.date)] {
        match value {
            Some(value) => {
                table.insert(name, toml_edit::value(value.as_str()));
            }
            None => {
                table.remove(name);
            }
        }
    }
    Ok(doc.to_string())
}

/// What a finding (or a baseline entry) is tonight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// No baseline entry marks it: news.
    New,
    /// Marked known.
    Known,
    /// Marked ignored.
    Ignored,
    /// A baseline entry that no finding has tonight: its failure did not
    /// reproduce (fixed, or not reached this time).
    PossiblyFixed,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::New => "new",
            Status::Known => "known",
            Status::Ignored => "ignored",
            Status::PossiblyFixed => "possibly fixed",
        })
    }
}

/// One distinct failure tonight: its findings (one per campaign directory
/// that found it) and what the baseline says of it.
#[derive(Clone, Debug, Serialize)]
pub struct TriagedFailure {
    /// The key (a slug; of a group of matching keys, a new one over an old).
    pub key: String,
    pub status: Status,
    /// The baseline entry that marks it, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<Entry>,
    /// The entry's key, where it is not `key` (an old key that maps to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline_key: Option<String>,
    pub findings: Vec<FindingLine>,
}

/// A baseline entry no finding has tonight.
#[derive(Clone, Debug, Serialize)]
pub struct PossiblyFixed {
    pub key: String,
    pub entry: Entry,
}

/// Tonight's findings against a baseline.
#[derive(Clone, Debug, Serialize)]
pub struct Triage {
    /// By the order of their first finding.
    pub failures: Vec<TriagedFailure>,
    /// By key.
    pub possibly_fixed: Vec<PossiblyFixed>,
}

impl Triage {
    /// Whether something new failed: what a CI job gates on.
    pub fn any_new(&self) -> bool {
        self.failures.iter().any(|f| f.status == Status::New)
    }

    /// The status of the finding with key `key` (a slug), if it is one.
    pub fn status_of(&self, key: &str) -> Option<Status> {
        self.failures
            .iter()
            .find(|f| f.findings.iter().any(|l| l.key == key))
            .map(|f| f.status)
    }
}

/// A group of findings whose keys match.
struct Group {
    keys: Vec<Option<FailureKey>>,
    slug: String,
    findings: Vec<FindingLine>,
}

impl Group {
    fn holds(&self, key: &Option<FailureKey>, slug: &str) -> bool {
        self.findings.iter().any(|l| l.key == slug)
            || self.keys.iter().any(|k| match (k, key) {
                (Some(a), Some(b)) => a.matches(b),
                _ => false,
            })
    }
}

/// Tonight's `findings` (of one campaign directory or several, merged by
/// key: findings whose keys [match](FailureKey::matches) are one failure)
/// classified by `baseline`: each failure new, known or ignored, and each
/// baseline entry that marks none of them possibly fixed. A finding whose
/// key is not a slug (a damaged listing) is matched by its text only.
pub fn classify(findings: &[FindingLine], baseline: &Baseline) -> Triage {
    let mut groups: Vec<Group> = Vec::new();
    for line in findings {
        let key = FailureKey::from_slug(&line.key).ok();
        match groups.iter_mut().find(|g| g.holds(&key, &line.key)) {
            Some(group) => {
                // A new key names the group over an old one.
                if matches!(key, Some(FailureKey::Property { .. }))
                    && !matches!(group.keys[0], Some(FailureKey::Property { .. }))
                {
                    group.slug.clone_from(&line.key);
                    group.keys.insert(0, key);
                } else {
                    group.keys.push(key);
                }
                group.findings.push(line.clone());
            }
            None => groups.push(Group {
                keys: vec![key],
                slug: line.key.clone(),
                findings: vec![line.clone()],
            }),
        }
    }
    let mut used = std::collections::BTreeSet::new();
    let failures = groups
        .into_iter()
        .map(|group| {
            let marked = group
                .keys
                .iter()
                .flatten()
                .find_map(|k| baseline.entry_for(k))
                .or_else(|| {
                    baseline
                        .entries
                        .iter()
                        .find(|(k, _)| k.slug() == group.slug)
                });
            let (status, entry, baseline_key) = match marked {
                Some((k, entry)) => {
                    used.insert(k.clone());
                    let status = match entry.status {
                        Mark::Known => Status::Known,
                        Mark::Ignored => Status::Ignored,
                    };
                    let slug = k.slug();
                    (
                        status,
                        Some(entry.clone()),
                        (slug != group.slug).then_some(slug),
                    )
                }
                None => (Status::New, None, None),
            };
            TriagedFailure {
                key: group.slug,
                status,
                entry,
                baseline_key,
                findings: group.findings,
            }
        })
        .collect();
    // An entry marks tonight's failure if it matches any of their keys,
    // not only the one chosen above (two entries, an old key and a new).
    let tonight: Vec<FailureKey> = findings
        .iter()
        .filter_map(|l| FailureKey::from_slug(&l.key).ok())
        .collect();
    let possibly_fixed = baseline
        .entries
        .iter()
        .filter(|(k, _)| {
            !used.contains(*k)
                && !tonight.iter().any(|t| k.matches(t))
                && !findings.iter().any(|l| l.key == k.slug())
        })
        .map(|(k, entry)| PossiblyFixed {
            key: k.slug(),
            entry: entry.clone(),
        })
        .collect();
    Triage {
        failures,
        possibly_fixed,
    }
}

#[cfg(test)]
#[path = "triage_tests.rs"]
mod tests;
