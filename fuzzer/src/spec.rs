//! A campaign file (TOML): which `up` manifest to search, from which
//! moment, how long each branch runs, how deep the tree goes, what judges a
//! history, which faults to draw, and the budgets. Parsed and checked here,
//! once, before any VM starts; every error names its key.

use run::units::parse_duration;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use vmm::VirtNanos;

/// Why a campaign file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("reading the campaign file")]
    Read(#[source] hostfile::ReadError),
    #[error("campaign file {path}")]
    Toml {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("campaign file {path}: `{key}` = {value:?}: {reason}")]
    Value {
        path: PathBuf,
        key: &'static str,
        value: String,
        reason: String,
    },
}

/// Where the search's root moment is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RootRule {
    /// The first exit at or after a poll (every [`ROOT_POLL_NS`]) that
    /// follows the system under test's `setup_complete`, waited for at most
    /// `wait_ns`.
    SetupComplete { wait_ns: u64 },
    /// The first exit at or after this virtual time.
    At { at_ns: u64 },
}

/// The widest batch (and the most workers) a campaign may have.
pub const MAX_BATCH_WIDTH: u32 = 64;

fn one() -> u32 {
    1
}

/// How often, in virtual time, a campaign looks for `setup_complete`.
pub const ROOT_POLL_NS: u64 = 100_000_000;

/// What judges a branch's recorded history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryChecker {
    /// No history is checked (properties only).
    None,
    /// Linearizability against the key-value model.
    Kv,
}

/// A checked campaign file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CampaignSpec {
    /// The `up` manifest, absolute (resolved against the campaign file).
    pub manifest: PathBuf,
    /// The boot's seed and the root of every seed the search draws.
    pub seed: u64,
    pub root: RootRule,
    /// Virtual time each branch runs.
    pub slice_ns: u64,
    /// Steps from the root a moment may be at and still be branched.
    pub max_depth: u32,
    /// Checkpoints kept in memory at once (the root included), per worker.
    pub live_checkpoints: u32,
    /// Branches chosen together, from the tree as it was before any of
    /// them (see [`crate::tree`]): the search depends on it, never on how
    /// many workers run them. Fixed when the campaign is created; 0 in a
    /// file means the number of workers then. A campaign saved before
    /// batches had one branch a batch.
    #[serde(default = "one")]
    pub batch_width: u32,
    pub checker: HistoryChecker,
    /// Branches the campaign may run (0: no limit).
    pub max_branches: u64,
    /// Wall time the campaign may run, in ms (0: no limit; `--budget`).
    pub wall_ms: u64,
    /// The fault profile's table, as written (see [`crate::profile`]).
    pub faults: toml::Table,
    /// Node names no fault may name (the workload's own node is added).
    pub exclude: Vec<String>,
    /// Bytes the live checkpoints' kept pages may hold (`None`: only
    /// `live_checkpoints` bounds them); least recently used ones are let
    /// go (spilled) past it.
    #[serde(default)]
    pub checkpoint_memory: Option<u64>,
    /// Whether a checkpoint let go is written to the campaign's `spill/`
    /// first, to be loaded back instead of replayed.
    #[serde(default = "spill_default")]
    pub spill: bool,
    /// Bytes `spill/` may hold, all workers together (`None`: half the
    /// free space of the campaign directory's file system when the
    /// campaign starts); see [`crate::spill`].
    #[serde(default)]
    pub spill_limit: Option<u64>,
}

fn spill_default() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    manifest: String,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    root: RootSection,
    #[serde(default)]
    search: SearchSection,
    #[serde(default)]
    budget: BudgetSection,
    #[serde(default)]
    checker: CheckerSection,
    #[serde(default)]
    faults: toml::Table,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RootSection {
    /// "setup_complete" or a virtual time ("20s").
    at: Option<String>,
    /// How long to wait for setup_complete.
    wait: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SearchSection {
    slice: Option<String>,
    max_depth: Option<u32>,
    live_checkpoints: Option<u32>,
    batch_width: Option<u32>,
    #[serde(default)]
    exclude: Vec<String>,
    checkpoint_memory: Option<String>,
    spill: Option<bool>,
    spill_limit: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BudgetSection {
    wall: Option<String>,
    branches: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CheckerSection {
    history: Option<String>,
}

/// Default virtual time per branch.
pub const DEFAULT_SLICE: VirtNanos = VirtNanos::from_secs(5);
/// Default wait for `setup_complete`.
pub const DEFAULT_SETUP_WAIT: VirtNanos = VirtNanos::from_secs(300);

impl CampaignSpec {
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        let text = hostfile::read_text_limited(path, run::manifest::MAX_MANIFEST_BYTES)
            .map_err(SpecError::Read)?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, path, base)
    }

    /// `text` as the campaign file `path` (named in errors), relative paths
    /// against `base`.
    pub fn parse(text: &str, path: &Path, base: &Path) -> Result<Self, SpecError> {
        let file: File = toml::from_str(text).map_err(|source| SpecError::Toml {
            path: path.to_owned(),
            source,
        })?;
        let bad = |key: &'static str, value: &str, reason: String| SpecError::Value {
            path: path.to_owned(),
            key,
            value: value.to_owned(),
            reason,
        };
        let duration = |key: &'static str, text: &str| {
            parse_duration(text).map_err(|e| bad(key, text, e.to_string()))
        };
        if file.manifest.trim().is_empty() {
            return Err(bad("manifest", &file.manifest, "empty".into()));
        }
        let manifest = base.join(&file.manifest);
        let wait_ns = match &file.root.wait {
            Some(text) => duration("root.wait", text)?.0,
            None => DEFAULT_SETUP_WAIT.0,
        };
        let root = match file.root.at.as_deref() {
            None | Some("setup_complete") | Some("setup-complete") => {
                RootRule::SetupComplete { wait_ns }
            }
            Some(text) => {
                if file.root.wait.is_some() {
                    return Err(bad(
                        "root.wait",
                        file.root.wait.as_deref().unwrap_or_default(),
                        "only with root.at = \"setup_complete\"".into(),
                    ));
                }
                RootRule::At {
                    at_ns: duration("root.at", text)?.0,
                }
            }
        };
        let slice_ns = match &file.search.slice {
            Some(text) => duration("search.slice", text)?.0,
            None => DEFAULT_SLICE.0,
        };
        if slice_ns < 1_000_000 {
            return Err(bad(
                "search.slice",
                file.search.slice.as_deref().unwrap_or_default(),
                "must be at least 1ms".into(),
            ));
        }
        let max_depth = file.search.max_depth.unwrap_or(3);
        if max_depth == 0 {
            return Err(bad("search.max_depth", "0", "must be at least 1".into()));
        }
        let live_checkpoints = file.search.live_checkpoints.unwrap_or(8);
        if live_checkpoints == 0 {
            return Err(bad(
                "search.live_checkpoints",
                "0",
                "must be at least 1 (the root)".into(),
            ));
        }
        let batch_width = file.search.batch_width.unwrap_or(0);
        if batch_width > MAX_BATCH_WIDTH {
            return Err(bad(
                "search.batch_width",
                &batch_width.to_string(),
                format!("must be at most {MAX_BATCH_WIDTH} (0: the number of workers)"),
            ));
        }
        let checker = match file.checker.history.as_deref() {
            None | Some("none") => HistoryChecker::None,
            Some("kv") => HistoryChecker::Kv,
            Some(other) => {
                return Err(bad(
                    "checker.history",
                    other,
                    "expected \"kv\" or \"none\"".into(),
                ))
            }
        };
        let wall_ms = match &file.budget.wall {
            Some(text) => duration("budget.wall", text)?.0 / 1_000_000,
            None => 0,
        };
        let checkpoint_memory = match &file.search.checkpoint_memory {
            Some(text) => Some(
                run::units::parse_size(text)
                    .map_err(|e| bad("search.checkpoint_memory", text, e.to_string()))?,
            ),
            None => None,
        };
        let spill_limit = match &file.search.spill_limit {
            Some(text) => Some(
                run::units::parse_size(text)
                    .map_err(|e| bad("search.spill_limit", text, e.to_string()))?,
            ),
            None => None,
        };
        Ok(CampaignSpec {
            checkpoint_memory,
            spill: file.search.spill.unwrap_or(true),
            spill_limit,
            manifest,
            seed: file.seed,
            root,
            slice_ns,
            max_depth,
            live_checkpoints,
            batch_width,
            checker,
            max_branches: file.budget.branches.unwrap_or(0),
            wall_ms,
            faults: file.faults,
            exclude: file.search.exclude,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<CampaignSpec, SpecError> {
        CampaignSpec::parse(text, Path::new("c.toml"), Path::new("/base"))
    }

    #[test]
    fn test_defaults_and_a_full_file() {
        let spec = parse("manifest = \"m.toml\"").unwrap();
        assert_eq!(spec.manifest, PathBuf::from("/base/m.toml"));
        assert_eq!(
            spec.root,
            RootRule::SetupComplete {
                wait_ns: DEFAULT_SETUP_WAIT.0
            }
        );
        assert_eq!(spec.slice_ns, DEFAULT_SLICE.0);
        assert_eq!(spec.checker, HistoryChecker::None);
        assert_eq!(spec.checkpoint_memory, None);
        assert!(spec.spill);
        let spec = parse(
            r#"
manifest = "m.toml"
seed = 4
[root]
at = "12s"
[search]
slice = "2s"
max_depth = 5
live_checkpoints = 3
exclude = ["workload"]
checkpoint_memory = "4G"
spill = false
[budget]
wall = "30m"
branches = 100
[checker]
history = "kv"
[faults.network]
rate = 0.5
"#,
        )
        .unwrap();
        assert_eq!(spec.seed, 4);
        assert_eq!(
            spec.root,
            RootRule::At {
                at_ns: 12_000_000_000
            }
        );
        assert_eq!(spec.slice_ns, 2_000_000_000);
        assert_eq!(spec.max_depth, 5);
        assert_eq!(spec.checkpoint_memory, Some(4 << 30));
        assert!(!spec.spill);
        assert_eq!(spec.wall_ms, 1_800_000);
        assert_eq!(spec.max_branches, 100);
        assert_eq!(spec.checker, HistoryChecker::Kv);
        assert!(spec.faults.contains_key("network"));
    }

    #[test]
    fn test_bad_values_name_their_key() {
        for (text, key) in [
            (
                "manifest = \"m\"\n[search]\nslice = \"fast\"",
                "search.slice",
            ),
            (
                "manifest = \"m\"\n[search]\nslice = \"10us\"",
                "search.slice",
            ),
            (
                "manifest = \"m\"\n[search]\nmax_depth = 0",
                "search.max_depth",
            ),
            (
                "manifest = \"m\"\n[checker]\nhistory = \"sql\"",
                "checker.history",
            ),
            ("manifest = \"m\"\n[root]\nat = \"soon\"", "root.at"),
            (
                "manifest = \"m\"\n[root]\nat = \"1s\"\nwait = \"2s\"",
                "root.wait",
            ),
            ("manifest = \"\"", "manifest"),
        ] {
            let message = parse(text).unwrap_err().to_string();
            assert!(message.contains(key), "{text:?}: {message}");
        }
        let unknown = parse("manifest = \"m\"\nsedd = 3").unwrap_err();
        assert!(matches!(unknown, SpecError::Toml { .. }));
    }
}
