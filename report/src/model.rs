//! The report's model: what one or more campaign directories say, as one
//! serde value with a [`VERSION`]. Its JSON is documented in
//! docs/campaigns.md ("Reports"); a field is added with a default (older
//! reports still read) and the version is bumped when a field changes
//! meaning or goes.

use fuzzer::spec::CampaignSpec;
use fuzzer::stats::CampaignStats;
pub use fuzzer::triage::Status;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use vmm::VirtNanos;

/// The version of the report's JSON.
pub const VERSION: u32 = 1;

/// What one or more campaign directories (shards of one campaign, or
/// campaigns to read together) say, merged (see [`crate::merge`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`VERSION`] of the program that wrote it.
    pub version: u32,
    /// Each directory read, in the order given.
    pub campaigns: Vec<CampaignPart>,
    /// Every property, in the order first seen.
    pub properties: Vec<PropertyReport>,
    /// Every distinct finding (by its key), in the order first seen.
    pub findings: Vec<FindingReport>,
    pub exploration: Exploration,
    /// Each fault kind (`partition`, `pause`, ...) and the stretches
    /// (branches) in which a fault of that kind began.
    pub fault_kinds: BTreeMap<String, u64>,
    /// Each combination of kinds that began together in a stretch (`+`
    /// joined, `""` none) and how many stretches had it.
    pub fault_combinations: BTreeMap<String, u64>,
    /// With a baseline: its entries that no finding has (their failures
    /// did not reproduce); empty without one.
    #[serde(default)]
    pub possibly_fixed: Vec<PossiblyFixedEntry>,
}

/// A baseline entry no finding of the report has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PossiblyFixedEntry {
    pub key: String,
    pub note: String,
}

/// One campaign directory read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CampaignPart {
    /// The directory, absolute.
    pub dir: PathBuf,
    /// The campaign's spec, as it saved it.
    pub spec: CampaignSpec,
    pub budget: BudgetUsed,
    /// The engine's counters (`None`: a campaign written before they were
    /// kept).
    pub stats: Option<CampaignStats>,
}

/// A campaign's budget and what it used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetUsed {
    pub branches: u64,
    /// Wall time over all its runs.
    pub wall_ms: u64,
    /// The campaign file's limits (`None`: none). `--budget` and
    /// `--branches` on the command line are not kept.
    pub max_branches: Option<u64>,
    pub max_wall: Option<VirtNanos>,
}

/// What a property is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PropertyKind {
    Always,
    AlwaysOrUnreachable,
    Sometimes,
    Reachable,
    Unreachable,
    /// A test-composer command: never exits nonzero, exits 0 at least once.
    Command,
    /// A checker of recorded histories (linearizability).
    Checker,
}

/// A property's verdict over every history read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Passed,
    Failed,
    /// Never evaluated, where that is no failure (an `AlwaysOrUnreachable`
    /// or a `Sometimes` without must-hit never reached, a checker that saw
    /// no history).
    NeverReached,
}

/// One property over every history read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PropertyReport {
    /// Its identity, the same in every shard: a finding's key for an
    /// assertion (`property:<id>@<file>@<function>`) or a command
    /// (`command:<name>`); `checker:<name>` for a checker (its findings'
    /// keys are `checker:<name>:<key>`).
    pub key: String,
    /// The assertion's id, the command's or the checker's name.
    pub name: String,
    pub kind: PropertyKind,
    /// A `Sometimes` that must be hit (the SDK's catalog says so).
    #[serde(default)]
    pub must_hit: bool,
    pub message: String,
    /// Where it is in the source (an assertion's), as the SDK said.
    pub location: Option<String>,
    pub verdict: Verdict,
    /// Why it failed without a stretch breaking it (`never reached`,
    /// `never true`, `never exited 0`), when it did.
    pub why: Option<String>,
    /// Evaluations: an assertion's hits; a command's runs; a checker's
    /// histories judged (stretches).
    pub hits: u64,
    /// Hits with a true condition; a command's zero exits; a checker's
    /// histories that were not a finding's failure.
    pub passes: u64,
    /// Hits with a false condition; a command's nonzero exits; a
    /// checker's distinct failures (findings).
    pub failures: u64,
    /// Stretches in which it broke.
    pub failed_stretches: u64,
    /// The keys of the findings that fail it.
    pub findings: Vec<String>,
    /// Evaluations that held, from the findings' histories (each naming its
    /// moment as the debugger does).
    pub examples: Vec<Example>,
    /// Evaluations that did not hold, from the findings' histories.
    pub counterexamples: Vec<Example>,
}

/// One evaluation of a property in a finding's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Example {
    /// The moment, as the debugger names it (`DIR/findings/0001@4.2s`).
    pub moment: String,
    pub exit: u64,
    pub node: Option<String>,
    pub details: serde_json::Value,
}

/// One fault of a finding's minimized schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledFault {
    /// The branch point it was added at (its `at=+` counts from here).
    pub branch_at: VirtNanos,
    /// The fault, in the grammar users write.
    pub fault: String,
}

/// A moment of a finding's history worth going to (the debugger's
/// `moments`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineEntry {
    pub moment: String,
    pub virtual_ns: VirtNanos,
    pub exit: Option<u64>,
    /// `failure`, `branch`, `fault`, `node`, `property_failed`.
    pub kind: String,
    pub what: String,
}

/// A finding's triage: its status and the baseline's note.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Triage {
    /// New, known or ignored: the baseline's own classification
    /// ([`crate::triage`]).
    pub status: Status,
    pub note: Option<String>,
}

/// Where the failure broke the property.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureAt {
    pub exit: u64,
    pub virtual_ns: VirtNanos,
}

/// Another shard's copy of a finding (the same key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindingCopy {
    pub dir: PathBuf,
    pub number: u32,
    pub faults: usize,
    pub replay: String,
}

/// One distinct failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FindingReport {
    /// Its key (`finding.json`'s): what makes two findings one.
    pub key: String,
    pub number: u32,
    /// Its directory, absolute.
    pub dir: PathBuf,
    /// The index in [`Report::campaigns`] of the campaign that holds it.
    pub campaign: usize,
    pub summary: String,
    /// The moment it failed, as the debugger names it (`DIR@failure`).
    pub moment: String,
    pub failure: FailureAt,
    /// The minimized fault schedule.
    pub faults: Vec<ScheduledFault>,
    /// Faults on the path as found, before shrinking.
    pub faults_found: usize,
    /// Branch points on its path from the root.
    pub steps: usize,
    /// Where its path ends.
    pub exits: u64,
    pub virtual_ns: VirtNanos,
    pub digest: String,
    /// Its notable moments in time order: branch points, faults carried
    /// out, nodes that paused or stopped, properties that failed, the
    /// failure.
    pub timeline: Vec<TimelineEntry>,
    /// Its `checker.html`, when it has one (embedded in the HTML report).
    pub checker_html: Option<String>,
    /// The last lines of each log (`logs/<name>.log`), by name.
    pub logs: BTreeMap<String, Vec<String>>,
    /// One line that replays it.
    pub replay: String,
    /// The campaign's wall time (ms) when it was found (`None`: not kept).
    pub found_at_ms: Option<u64>,
    /// The same failure found by other directories read.
    pub also_in: Vec<FindingCopy>,
    /// New, known, ignored or possibly fixed (`None`: no baseline read).
    pub triage: Option<Triage>,
}

/// How the tree was explored, over every directory read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Exploration {
    pub branches: u64,
    /// Moments of the trees (each campaign's root included).
    pub moments: u64,
    /// Moments whose run stopped (not branched further).
    pub stopped: u64,
    /// The deepest moment's depth (steps from its root).
    pub depth: u32,
    /// Moments at each depth (index: the depth).
    pub moments_by_depth: Vec<u64>,
    /// Wall time, summed over the campaigns.
    pub wall_ms: u64,
    /// Wall time times workers, summed (`None`: a campaign did not keep
    /// its workers).
    pub worker_ms: Option<u64>,
    pub branches_per_hour: Option<f64>,
    pub branches_per_hour_per_worker: Option<f64>,
    /// Wall time by phase (`None`: a campaign did not keep it).
    pub phases: Option<Phases>,
    /// Checkpoints written to `spill/` and loaded back, steps replayed to
    /// reach moments neither live nor spilled, checkpoints live at the
    /// last commit (`None`: a campaign did not keep them).
    pub spilled: Option<u64>,
    pub loaded: Option<u64>,
    pub replayed_steps: Option<u64>,
    pub live_checkpoints: Option<u64>,
    /// Branches committed in each minute of a campaign's wall time, summed
    /// over the campaigns (shards run at once); empty when not kept.
    pub branches_by_minute: Vec<u64>,
}

/// Where the wall time went, summed over the campaigns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Phases {
    /// Booting and running to the root.
    pub root_ms: u64,
    /// Branches, summed over workers (worker-milliseconds).
    pub branch_ms: u64,
    /// Shrinking new findings and writing them.
    pub shrink_ms: u64,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed => "FAILED",
            Verdict::NeverReached => "never reached",
        }
    }
}

impl PropertyKind {
    pub fn word(self) -> &'static str {
        match self {
            PropertyKind::Always => "Always",
            PropertyKind::AlwaysOrUnreachable => "AlwaysOrUnreachable",
            PropertyKind::Sometimes => "Sometimes",
            PropertyKind::Reachable => "Reachable",
            PropertyKind::Unreachable => "Unreachable",
            PropertyKind::Command => "command",
            PropertyKind::Checker => "checker",
        }
    }
}

impl PropertyReport {
    /// The verdict its counts give (the table of `fuzzer::properties`):
    /// failed in a stretch, failed over the whole campaign (never reached,
    /// never true, never exited 0), never reached where that is allowed, or
    /// passed. Recomputed after a merge: a `Sometimes` never true in one
    /// shard and true in another passed.
    pub fn judged(&self) -> (Verdict, Option<String>) {
        let failed = |why: &str| (Verdict::Failed, Some(why.to_owned()));
        let broke = self.failed_stretches > 0 || !self.findings.is_empty();
        match self.kind {
            PropertyKind::Always | PropertyKind::AlwaysOrUnreachable
                if broke || self.failures > 0 =>
            {
                (Verdict::Failed, None)
            }
            PropertyKind::Always if self.hits == 0 => failed("never reached"),
            PropertyKind::AlwaysOrUnreachable if self.hits == 0 => (Verdict::NeverReached, None),
            PropertyKind::Sometimes if self.passes > 0 => (Verdict::Passed, None),
            PropertyKind::Sometimes if self.hits > 0 => failed("never true"),
            PropertyKind::Sometimes if self.must_hit => failed("never reached"),
            PropertyKind::Sometimes => (Verdict::NeverReached, None),
            PropertyKind::Reachable if self.hits == 0 => failed("never reached"),
            PropertyKind::Unreachable if self.hits > 0 || broke => (Verdict::Failed, None),
            PropertyKind::Command if self.failures > 0 || broke => (Verdict::Failed, None),
            PropertyKind::Command if self.hits == 0 => failed("never finished"),
            PropertyKind::Command if self.passes == 0 => failed("never exited 0"),
            PropertyKind::Checker if self.failures > 0 || broke => (Verdict::Failed, None),
            PropertyKind::Checker if self.hits == 0 => (Verdict::NeverReached, None),
            _ => (Verdict::Passed, None),
        }
    }
}

impl Report {
    /// A report of no directory.
    pub fn empty() -> Report {
        Report {
            version: VERSION,
            campaigns: Vec::new(),
            properties: Vec::new(),
            findings: Vec::new(),
            exploration: Exploration::default(),
            fault_kinds: BTreeMap::new(),
            fault_combinations: BTreeMap::new(),
            possibly_fixed: Vec::new(),
        }
    }

    /// Counts of properties by verdict: passed, failed, never reached.
    pub fn verdicts(&self) -> (usize, usize, usize) {
        let count = |v| self.properties.iter().filter(|p| p.verdict == v).count();
        (
            count(Verdict::Passed),
            count(Verdict::Failed),
            count(Verdict::NeverReached),
        )
    }
}

impl Default for Exploration {
    fn default() -> Self {
        Exploration {
            branches: 0,
            moments: 0,
            stopped: 0,
            depth: 0,
            moments_by_depth: Vec::new(),
            wall_ms: 0,
            worker_ms: Some(0),
            branches_per_hour: None,
            branches_per_hour_per_worker: None,
            phases: Some(Phases {
                root_ms: 0,
                branch_ms: 0,
                shrink_ms: 0,
            }),
            spilled: Some(0),
            loaded: Some(0),
            replayed_steps: Some(0),
            live_checkpoints: Some(0),
            branches_by_minute: Vec::new(),
        }
    }
}
