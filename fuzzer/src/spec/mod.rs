//! A campaign file (TOML): which `up` manifest to search, from which
//! moment, how long each branch runs, how deep the tree goes, what judges a
//! history, which faults to draw, and the budgets. Parsed and checked here,
//! once, before any VM starts (against the manifest's nodes too, in
//! `nodes`): every error names the file, the key and the user's line
//! (`keys`), and every bound is a constant here, stated in
//! docs/campaigns.md.

mod keys;
mod nodes;

pub use keys::Place;

use crate::profile::FaultProfile;
use crate::shard::Shard;
use keys::Keys;
use run::units::{parse_duration, ByteSize, MAX_VIRTUAL_TIME};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use vmm::VirtNanos;

/// Why a campaign file was refused. Each names the file, the key and the
/// user's line.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("reading the campaign file")]
    Read(#[source] hostfile::ReadError),
    /// TOML syntax, an unknown key, or a value of the wrong type.
    #[error("campaign file {}{}{}: {message}", path.display(),
        line.map(|l| format!(", line {l}")).unwrap_or_default(),
        key.as_ref().map(|k| format!(": {k}")).unwrap_or_default())]
    Toml {
        path: PathBuf,
        line: Option<usize>,
        key: Option<String>,
        message: String,
    },
    #[error("{place}: {reason}")]
    Value { place: Place, reason: String },
}

/// Where the search's root moment is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum RootRule {
    /// The first exit at or after a poll (every [`ROOT_POLL`]) that
    /// follows the system under test's `setup_complete`, waited for at most
    /// `wait_ns`.
    SetupComplete { wait_ns: VirtNanos },
    /// The first exit at or after this virtual time.
    At { at_ns: VirtNanos },
}

/// The widest batch (and the most workers) a campaign may have.
pub const MAX_BATCH_WIDTH: u32 = 64;

fn one() -> u32 {
    1
}

/// How often, in virtual time, a campaign looks for `setup_complete`.
pub const ROOT_POLL: VirtNanos = VirtNanos(100_000_000);

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
    pub slice_ns: VirtNanos,
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
    /// Wall time the campaign may run, exact (`None`: no limit; `--budget`
    /// overrides). See [`CampaignSpec::wall_budget`].
    #[serde(default)]
    pub wall: Option<VirtNanos>,
    /// The wall budget of a campaign saved before budgets were exact, in
    /// whole ms (0: none): read, never written.
    #[serde(default, rename = "wall_ms", skip_serializing)]
    saved_wall_ms: u64,
    /// The fault profile (`[faults]`, defaults filled in).
    #[serde(default)]
    pub faults: FaultProfile,
    /// Node names no fault may name, from `[search] exclude` (its former
    /// place; `faults.exclude` is the profile's own list).
    pub exclude: Vec<String>,
    /// Bytes the live checkpoints' kept pages may hold (`None`: only
    /// `live_checkpoints` bounds them); least recently used ones are let
    /// go (spilled) past it.
    #[serde(default)]
    pub checkpoint_memory: Option<u64>,
    /// Neither `live_checkpoints` nor `checkpoint_memory` given: each
    /// worker's checkpoints may hold a share of the memory available where
    /// the runs are, sized when the workers start ([`crate::sizing`]), and
    /// `live_checkpoints` is [`SIZED_LIVE_CHECKPOINTS`]. A campaign saved
    /// before this was sized by `live_checkpoints` alone (and one that
    /// bounds them is stored as that build stored it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub size_checkpoints_from_memory: bool,
    /// Whether a checkpoint let go is written to the campaign's `spill/`
    /// first, to be loaded back instead of replayed.
    #[serde(default = "spill_default")]
    pub spill: bool,
    /// Bytes `spill/` may hold, all workers together (`None`: half the
    /// free space of the campaign directory's file system when the
    /// campaign starts); see [`crate::spill`].
    #[serde(default)]
    pub spill_limit: Option<u64>,
    /// The part of the search this campaign runs (`--shard`; never from the
    /// file: every shard reads the same one). Fixed when the campaign is
    /// created; absent (the whole campaign) in a spec saved before shards
    /// and in an unsharded one.
    #[serde(default, skip_serializing_if = "Shard::is_whole")]
    pub shard: Shard,
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
    faults: FaultProfile,
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
/// The shortest slice.
pub const MIN_SLICE: VirtNanos = VirtNanos(1_000_000);
/// Default wait for `setup_complete`.
pub const DEFAULT_SETUP_WAIT: VirtNanos = VirtNanos::from_secs(300);
/// Default `search.max_depth`.
pub const DEFAULT_MAX_DEPTH: u32 = 3;
/// The deepest `search.max_depth`: a moment's path holds a step per level,
/// each replayed when no checkpoint of it is live or spilled, and shrinking
/// a finding replays the whole path per trial.
pub const MAX_DEPTH: u32 = 1000;
/// Default `search.live_checkpoints` where the memory available is not
/// known (a campaign with `checkpoint_memory` and no count).
pub const DEFAULT_LIVE_CHECKPOINTS: u32 = 8;
/// `search.live_checkpoints` when the checkpoints' memory is sized from the
/// memory available (neither key given): memory is the bound, this only a
/// backstop.
pub const SIZED_LIVE_CHECKPOINTS: u32 = 4096;
/// The most `search.live_checkpoints` without `checkpoint_memory`: each
/// checkpoint may keep up to the guest's whole RAM in the worker's memory,
/// so more need `checkpoint_memory` to bound them.
pub const MAX_LIVE_CHECKPOINTS_UNBOUNDED: u32 = 64;
/// The least `search.checkpoint_memory`: below it every checkpoint but the
/// root and the present would be let go as soon as it is taken.
pub const MIN_CHECKPOINT_MEMORY: u64 = 1 << 20;

/// A campaign file as read: the checked spec, where each key is (for the
/// checks against the manifest, [`CampaignFile::check_manifest`]), and
/// what it says that is read but should be said otherwise.
#[derive(Debug)]
pub struct CampaignFile {
    pub spec: CampaignSpec,
    /// Each a whole sentence naming the file, the key and its line.
    pub warnings: Vec<String>,
    keys: Keys,
}

impl CampaignSpec {
    /// [`CampaignFile::load`]'s spec.
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        Ok(CampaignFile::load(path)?.spec)
    }

    /// [`CampaignFile::parse`]'s spec.
    pub fn parse(text: &str, path: &Path, base: &Path) -> Result<Self, SpecError> {
        Ok(CampaignFile::parse(text, path, base)?.spec)
    }

    /// The wall budget as given (`None`: no limit), a campaign saved before
    /// budgets were exact included.
    pub fn wall_budget(&self) -> Option<VirtNanos> {
        self.wall.or((self.saved_wall_ms > 0)
            .then(|| VirtNanos(self.saved_wall_ms.saturating_mul(1_000_000))))
    }
}

/// `text` as a duration of `[min, max]` for `key`.
fn bounded(
    keys: &Keys,
    key: &str,
    text: &str,
    min: VirtNanos,
    max: VirtNanos,
    why_min: &str,
) -> Result<VirtNanos, SpecError> {
    let value = parse_duration(text).map_err(|e| keys.refuse(key, &"", e.to_string()))?;
    if value < min {
        return Err(keys.refuse(key, &"", format!("must be at least {min}: {why_min}")));
    }
    if value > max {
        return Err(keys.refuse(
            key,
            &"",
            format!("beyond the latest virtual time a campaign may name, {max} (365 days)"),
        ));
    }
    Ok(value)
}

impl CampaignFile {
    pub fn load(path: &Path) -> Result<Self, SpecError> {
        let text = hostfile::read_text_limited(path, run::manifest::MAX_MANIFEST_BYTES)
            .map_err(SpecError::Read)?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, path, base)
    }

    /// `text` as the campaign file `path` (named in errors), relative paths
    /// against `base`. Checks every value that needs no manifest.
    pub fn parse(text: &str, path: &Path, base: &Path) -> Result<Self, SpecError> {
        let keys = Keys::new(path, text);
        let file: File = toml::from_str(text).map_err(|e| keys.toml_error(&e))?;
        if file.manifest.trim().is_empty() {
            return Err(keys.refuse("manifest", &"", "empty"));
        }
        let manifest = base.join(&file.manifest);
        let wait = match &file.root.wait {
            Some(text) => bounded(
                &keys,
                "root.wait",
                text,
                ROOT_POLL,
                MAX_VIRTUAL_TIME,
                "setup_complete is looked for every 100ms",
            )?,
            None => DEFAULT_SETUP_WAIT,
        };
        let (root, root_time) = match file.root.at.as_deref() {
            None | Some("setup_complete") | Some("setup-complete") => {
                (RootRule::SetupComplete { wait_ns: wait }, wait)
            }
            Some(text) => {
                if file.root.wait.is_some() {
                    return Err(keys.refuse(
                        "root.wait",
                        &"",
                        "only with root.at = \"setup_complete\"",
                    ));
                }
                let at = bounded(
                    &keys,
                    "root.at",
                    text,
                    VirtNanos(1),
                    MAX_VIRTUAL_TIME,
                    "the root is a moment after the boot began (or \"setup_complete\")",
                )?;
                (RootRule::At { at_ns: at }, at)
            }
        };
        let slice = match &file.search.slice {
            Some(text) => bounded(
                &keys,
                "search.slice",
                text,
                MIN_SLICE,
                MAX_VIRTUAL_TIME,
                "a branch runs at least that long",
            )?,
            None => DEFAULT_SLICE,
        };
        let max_depth = file.search.max_depth.unwrap_or(DEFAULT_MAX_DEPTH);
        if !(1..=MAX_DEPTH).contains(&max_depth) {
            return Err(keys.refuse(
                "search.max_depth",
                &DEFAULT_MAX_DEPTH,
                format!("must be 1..={MAX_DEPTH}"),
            ));
        }
        let deepest = u64::from(max_depth)
            .checked_mul(slice.0)
            .and_then(|d| d.checked_add(root_time.0));
        if deepest.is_none_or(|end| end > MAX_VIRTUAL_TIME.0) {
            return Err(keys.refuse(
                "search.max_depth",
                &DEFAULT_MAX_DEPTH,
                format!(
                    "that many slices of {} after the root ({}) end beyond the latest virtual time a campaign may name, {MAX_VIRTUAL_TIME} (365 days)",
                    keys.mention("search.slice", &DEFAULT_SLICE),
                    root_time
                ),
            ));
        }
        let checkpoint_memory = match &file.search.checkpoint_memory {
            Some(text) => {
                let bytes = run::units::parse_size(text)
                    .map_err(|e| keys.refuse("search.checkpoint_memory", &"", e.to_string()))?;
                if bytes < MIN_CHECKPOINT_MEMORY {
                    return Err(keys.refuse(
                        "search.checkpoint_memory",
                        &"",
                        format!(
                            "must be at least {}: below it every checkpoint but the root and the present is let go as soon as it is taken (for that, set live_checkpoints = 1)",
                            ByteSize(MIN_CHECKPOINT_MEMORY)
                        ),
                    ));
                }
                Some(bytes)
            }
            None => None,
        };
        let spill_limit = match &file.search.spill_limit {
            Some(text) => Some(
                run::units::parse_size(text)
                    .map_err(|e| keys.refuse("search.spill_limit", &"", e.to_string()))?,
            ),
            None => None,
        };
        let size_checkpoints_from_memory =
            file.search.live_checkpoints.is_none() && checkpoint_memory.is_none();
        let live_checkpoints = match file.search.live_checkpoints {
            Some(count) => count,
            None if size_checkpoints_from_memory => SIZED_LIVE_CHECKPOINTS,
            None => DEFAULT_LIVE_CHECKPOINTS,
        };
        if live_checkpoints == 0 {
            return Err(keys.refuse(
                "search.live_checkpoints",
                &DEFAULT_LIVE_CHECKPOINTS,
                "must be at least 1 (the root)",
            ));
        }
        if checkpoint_memory.is_none()
            && !size_checkpoints_from_memory
            && live_checkpoints > MAX_LIVE_CHECKPOINTS_UNBOUNDED
        {
            return Err(keys.refuse(
                "search.live_checkpoints",
                &DEFAULT_LIVE_CHECKPOINTS,
                format!(
                    "more than {MAX_LIVE_CHECKPOINTS_UNBOUNDED} needs search.checkpoint_memory: each checkpoint may keep up to the guest's whole RAM in memory"
                ),
            ));
        }
        let batch_width = file.search.batch_width.unwrap_or(0);
        if batch_width > MAX_BATCH_WIDTH {
            return Err(keys.refuse(
                "search.batch_width",
                &0,
                format!("must be at most {MAX_BATCH_WIDTH} (0: the number of workers)"),
            ));
        }
        let checker = match file.checker.history.as_deref() {
            None | Some("none") => HistoryChecker::None,
            Some("kv") => HistoryChecker::Kv,
            Some(_) => {
                return Err(keys.refuse(
                    "checker.history",
                    &"\"none\"",
                    "expected \"kv\" or \"none\"",
                ))
            }
        };
        let wall = match &file.budget.wall {
            Some(text) => crate::budget::parse_wall(text)
                .map_err(|e| keys.refuse("budget.wall", &"", e.to_string()))?,
            None => None,
        };
        let faults = file.faults;
        faults.validate().map_err(|e| match e {
            crate::profile::ProfileError::Invalid { key, problem } => {
                keys.refuse(&format!("faults.{key}"), &"", problem)
            }
            crate::profile::ProfileError::Toml(e) => keys.toml_error(&e),
        })?;
        let mut warnings = Vec::new();
        for (key, range) in faults.duration_ranges() {
            if range.min <= slice {
                continue;
            }
            let key = format!("faults.{key}");
            let why = format!(
                "its minimum, {}, is longer than a slice, {}: no such fault fits in a branch (each is cut short to end in its slice)",
                range.min,
                keys.mention("search.slice", &DEFAULT_SLICE)
            );
            // A range the file sets is refused; a default one the file
            // never asked for is said, not refused.
            if keys.is_set(&key) {
                return Err(keys.refuse(
                    &key,
                    &range,
                    format!("{why}; give a minimum of at most the slice, or a longer slice"),
                ));
            }
            warnings.push(format!(
                "{}: {why}; set a range that fits, or turn the category off",
                keys.place(&key, &range)
            ));
        }
        if keys.is_set("search.exclude") {
            warnings.push(format!(
                "{}: read, but its place is faults.exclude (as in the examples; docs/campaigns.md): move it there, adding \"workload\" (a faults.exclude replaces the default, [\"workload\"])",
                keys.place("search.exclude", &"[]")
            ));
        }
        let spec = CampaignSpec {
            checkpoint_memory,
            size_checkpoints_from_memory,
            spill: file.search.spill.unwrap_or(true),
            spill_limit,
            shard: Shard::WHOLE,
            manifest,
            seed: file.seed,
            root,
            slice_ns: slice,
            max_depth,
            live_checkpoints,
            batch_width,
            checker,
            max_branches: file.budget.branches.unwrap_or(0),
            wall,
            saved_wall_ms: 0,
            faults,
            exclude: file.search.exclude,
        };
        Ok(CampaignFile {
            spec,
            warnings,
            keys,
        })
    }
}

#[cfg(test)]
mod tests;
