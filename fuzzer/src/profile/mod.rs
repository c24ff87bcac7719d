//! Fault profiles: how often a campaign injects which faults, per category
//! (network, nodes, clocks, disks), and the draw of one slice's faults from
//! a seed ([`FaultProfile::draw`]).
//!
//! A profile is TOML; every key is optional, and what is left out keeps
//! the default ([`FaultProfile::default`], annotated in
//! [`DEFAULT_PROFILE_TOML`]):
//!
//! ```toml
//! exclude = ["workload"]        # nodes no fault targets by name
//! [network]
//! rate = 0.1                    # expected faults per virtual second
//! duration = "1s..15s"          # for= of each fault (it heals after)
//! weights = { partition = 4, cut = 2, one-way = 1, bridge = 1, majorities-ring = 1, slow = 3, loss = 2 }
//! [node]
//! weights = { pause = 4, kill = 2, restart = 1, crash = 1 }
//! ```
//!
//! The rate is per virtual second of a slice: a slice of `s` seconds draws
//! on average `rate * s` faults of the category (fewer when one would
//! overlap another of its kind on its target, see [`FaultProfile::draw`]).
//! The defaults follow Antithesis' default fault injector: network faults
//! and node pauses or kills common, clock jitter modest, disk faults only
//! on nodes that have disks. The profile is parsed and printed here only
//! ([`FaultProfile::from_toml`], [`FaultProfile::to_toml`]).

mod draw;
mod span;

pub use draw::{FAULT_PROFILE_STREAM, TICK};
pub use span::{Bound, Ppm, Span, SpanError};

use devices::switch::Probability;
use devices::VirtNanos;
use serde::{Deserialize, Serialize};

/// The default profile as annotated TOML, the `[faults]` table of a
/// campaign file (`detvisor campaign --print-defaults` prints it); it reads
/// back as [`FaultProfile::default`].
pub const DEFAULT_PROFILE_TOML: &str = include_str!("default-profile.toml");

/// The most faults per virtual second a category may ask for (one per
/// [`TICK`]).
pub const MAX_RATE: f64 = 100.0;

/// How often, and which, faults a campaign injects.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct FaultProfile {
    /// Nodes no fault names: they are never paused, killed, restarted,
    /// crashed, slowed, made lossy, cut off, clock-stepped or disk-faulted.
    /// In a partition they join one of the groups (never isolated alone);
    /// `bridge` and `majorities-ring` are over every node of the run and
    /// leave each node a majority or a bridge. Default: the workload's own
    /// node, `workload`.
    pub exclude: Vec<String>,
    pub network: NetworkProfile,
    pub node: NodeProfile,
    pub clock: ClockProfile,
    pub disk: DiskProfile,
}

/// Network faults: the switch's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct NetworkProfile {
    pub enabled: bool,
    /// Expected faults per virtual second.
    pub rate: f64,
    /// How long each fault lasts (`for=`).
    pub duration: Span<VirtNanos>,
    /// `slow`: the latency's bounds are drawn within this.
    pub latency: Span<VirtNanos>,
    /// `loss`: the probability is drawn within this (in steps of 0.001).
    pub loss: Span<Probability>,
    pub weights: NetworkWeights,
}

/// How likely each network fault is, relative to the others.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct NetworkWeights {
    /// Random groups of the nodes, 2 or 3 of them.
    pub partition: u32,
    /// `cut A <-> B`: two random sets of nodes, both ways.
    pub cut: u32,
    /// `partition A -> B`: one way.
    pub one_way: u32,
    pub bridge: u32,
    pub majorities_ring: u32,
    /// Every link of one node slow.
    pub slow: u32,
    /// Every link of one node lossy.
    pub loss: u32,
}

/// Node faults: the agent's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct NodeProfile {
    pub enabled: bool,
    pub rate: f64,
    /// How long a pause lasts.
    pub pause: Span<VirtNanos>,
    /// How long a killed or crashed node stays down before its restart.
    pub down: Span<VirtNanos>,
    pub weights: NodeWeights,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct NodeWeights {
    pub pause: u32,
    /// SIGKILL, then `restart` after `down`.
    pub kill: u32,
    /// Killed and started again at once.
    pub restart: u32,
    /// Kill -9 with the disk losing unflushed writes, then `restart` after
    /// `down`; only nodes with disks.
    pub crash: u32,
}

/// Clock faults: each node's CLOCK_REALTIME.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct ClockProfile {
    pub enabled: bool,
    pub rate: f64,
    /// A step's size; forwards or backwards at random.
    pub step: Span<VirtNanos>,
    /// A drift's size; fast or slow at random.
    pub drift: Span<Ppm>,
    /// How long a drift lasts (then 0ppm, keeping what it gained).
    pub duration: Span<VirtNanos>,
    pub weights: ClockWeights,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct ClockWeights {
    pub step: u32,
    pub drift: u32,
}

/// Disk faults: only nodes with disks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct DiskProfile {
    pub enabled: bool,
    pub rate: f64,
    /// How much later a FLUSH completes under `fsync-delay`.
    pub fsync_delay: Span<VirtNanos>,
    /// How long each disk fault lasts.
    pub duration: Span<VirtNanos>,
    pub weights: DiskWeights,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default, rename_all = "kebab-case")]
pub struct DiskWeights {
    pub fsync_delay: u32,
    pub fsync_error: u32,
    /// The file system full (the agent fills it), then free again.
    pub full: u32,
}

fn secs(s: u64) -> VirtNanos {
    VirtNanos::from_secs(s)
}

fn millis(ms: u64) -> VirtNanos {
    VirtNanos(ms * 1_000_000)
}

fn probability(p: f64) -> Probability {
    Probability::new(p).expect("a constant probability in 0..=1")
}

impl Default for FaultProfile {
    fn default() -> Self {
        FaultProfile {
            exclude: vec![run::manifest::WORKLOAD_NODE.to_owned()],
            network: NetworkProfile::default(),
            node: NodeProfile::default(),
            clock: ClockProfile::default(),
            disk: DiskProfile::default(),
        }
    }
}

impl Default for NetworkProfile {
    fn default() -> Self {
        NetworkProfile {
            enabled: true,
            rate: 0.1,
            duration: Span::new(secs(1), secs(15)),
            latency: Span::new(millis(5), millis(200)),
            loss: Span::new(probability(0.05), probability(0.5)),
            weights: NetworkWeights::default(),
        }
    }
}

impl Default for NetworkWeights {
    fn default() -> Self {
        NetworkWeights {
            partition: 4,
            cut: 2,
            one_way: 1,
            bridge: 1,
            majorities_ring: 1,
            slow: 3,
            loss: 2,
        }
    }
}

impl Default for NodeProfile {
    fn default() -> Self {
        NodeProfile {
            enabled: true,
            rate: 0.05,
            pause: Span::new(secs(1), secs(10)),
            down: Span::new(secs(1), secs(10)),
            weights: NodeWeights::default(),
        }
    }
}

impl Default for NodeWeights {
    fn default() -> Self {
        NodeWeights {
            pause: 4,
            kill: 2,
            restart: 1,
            crash: 1,
        }
    }
}

impl Default for ClockProfile {
    fn default() -> Self {
        ClockProfile {
            enabled: true,
            rate: 0.02,
            step: Span::new(millis(10), secs(2)),
            drift: Span::new(Ppm(10), Ppm(500)),
            duration: Span::new(secs(5), secs(30)),
            weights: ClockWeights::default(),
        }
    }
}

impl Default for ClockWeights {
    fn default() -> Self {
        ClockWeights { step: 1, drift: 1 }
    }
}

impl Default for DiskProfile {
    fn default() -> Self {
        DiskProfile {
            enabled: true,
            rate: 0.05,
            fsync_delay: Span::new(millis(1), millis(200)),
            duration: Span::new(secs(1), secs(10)),
            weights: DiskWeights::default(),
        }
    }
}

impl Default for DiskWeights {
    fn default() -> Self {
        DiskWeights {
            fsync_delay: 3,
            fsync_error: 1,
            full: 1,
        }
    }
}

/// Why a profile was refused. `key` is the TOML key (`network.rate`).
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("fault profile")]
    Toml(#[source] toml::de::Error),
    #[error("fault profile: {key}: {problem}")]
    Invalid { key: String, problem: String },
}

fn invalid(key: &str, problem: impl Into<String>) -> ProfileError {
    ProfileError::Invalid {
        key: key.to_owned(),
        problem: problem.into(),
    }
}

fn check_rate(key: &str, rate: f64) -> Result<(), ProfileError> {
    if !(rate.is_finite() && (0.0..=MAX_RATE).contains(&rate)) {
        return Err(invalid(
            key,
            format!("{rate} is not a rate of faults per virtual second in 0..={MAX_RATE}"),
        ));
    }
    Ok(())
}

fn check_span<T: Bound>(key: &str, span: &Span<T>) -> Result<(), ProfileError> {
    if !span.is_ordered() {
        return Err(invalid(
            key,
            format!("{span}: the minimum is above the maximum"),
        ));
    }
    Ok(())
}

/// A duration that must be positive (a `for=`, a pause, a downtime).
fn check_positive(key: &str, span: &Span<VirtNanos>) -> Result<(), ProfileError> {
    check_span(key, span)?;
    if span.min.0 == 0 {
        return Err(invalid(key, format!("{span}: a duration must be above 0s")));
    }
    Ok(())
}

fn check_weights(key: &str, enabled: bool, weights: &[u32]) -> Result<(), ProfileError> {
    if enabled && weights.iter().all(|w| *w == 0) {
        return Err(invalid(
            key,
            "every weight is 0 (give a kind a weight, or set enabled = false)",
        ));
    }
    if weights.iter().map(|w| u64::from(*w)).sum::<u64>() > u64::from(u32::MAX) {
        return Err(invalid(key, "the weights add up to more than 4294967295"));
    }
    Ok(())
}

impl FaultProfile {
    /// The profile a TOML text describes, checked.
    pub fn from_toml(text: &str) -> Result<Self, ProfileError> {
        let profile: FaultProfile = toml::from_str(text).map_err(ProfileError::Toml)?;
        profile.validate()?;
        Ok(profile)
    }

    /// The profile as TOML, which [`FaultProfile::from_toml`] reads back.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a fault profile is always TOML")
    }

    /// The ranges of how long a fault lasts (`for=`, a pause, a downtime)
    /// of each category that draws (enabled, rate above 0), by key: each
    /// fault of them must fit in a slice, which the draw cuts it short to.
    pub fn duration_ranges(&self) -> Vec<(&'static str, Span<VirtNanos>)> {
        let on = |enabled: bool, rate: f64| enabled && rate > 0.0;
        let mut ranges = Vec::new();
        if on(self.network.enabled, self.network.rate) {
            ranges.push(("network.duration", self.network.duration));
        }
        if on(self.node.enabled, self.node.rate) {
            ranges.push(("node.pause", self.node.pause));
            ranges.push(("node.down", self.node.down));
        }
        if on(self.clock.enabled, self.clock.rate) {
            ranges.push(("clock.duration", self.clock.duration));
        }
        if on(self.disk.enabled, self.disk.rate) {
            ranges.push(("disk.duration", self.disk.duration));
        }
        ranges
    }

    /// Whether any category draws faults (enabled, rate above 0).
    pub fn draws_any(&self) -> bool {
        [
            (self.network.enabled, self.network.rate),
            (self.node.enabled, self.node.rate),
            (self.clock.enabled, self.clock.rate),
            (self.disk.enabled, self.disk.rate),
        ]
        .iter()
        .any(|&(enabled, rate)| enabled && rate > 0.0)
    }

    /// Refuses rates outside 0..=[`MAX_RATE`], reversed or empty ranges,
    /// drift rates beyond [`run::units::MAX_PPM`], and an enabled category
    /// whose weights are all 0. (Unknown keys and kinds, and probabilities
    /// outside 0..=1, are refused when the TOML is read.)
    pub fn validate(&self) -> Result<(), ProfileError> {
        let n = &self.network;
        check_rate("network.rate", n.rate)?;
        check_positive("network.duration", &n.duration)?;
        check_span("network.latency", &n.latency)?;
        if n.latency.max > devices::MAX_LATENCY {
            return Err(invalid(
                "network.latency",
                format!(
                    "{}: above the largest latency, {}",
                    n.latency,
                    devices::MAX_LATENCY
                ),
            ));
        }
        check_span("network.loss", &n.loss)?;
        let w = &n.weights;
        check_weights(
            "network.weights",
            n.enabled,
            &[
                w.partition,
                w.cut,
                w.one_way,
                w.bridge,
                w.majorities_ring,
                w.slow,
                w.loss,
            ],
        )?;
        let node = &self.node;
        check_rate("node.rate", node.rate)?;
        check_positive("node.pause", &node.pause)?;
        check_positive("node.down", &node.down)?;
        let w = &node.weights;
        check_weights(
            "node.weights",
            node.enabled,
            &[w.pause, w.kill, w.restart, w.crash],
        )?;
        let c = &self.clock;
        check_rate("clock.rate", c.rate)?;
        check_positive("clock.step", &c.step)?;
        // A step is signed (`clock n1 -5s`): its size must fit an i64.
        let largest_step = VirtNanos(i64::MAX.unsigned_abs());
        if c.step.max > largest_step {
            return Err(invalid(
                "clock.step",
                format!("{}: beyond the largest step, {largest_step}", c.step),
            ));
        }
        check_span("clock.drift", &c.drift)?;
        if c.drift.max.0 > run::units::MAX_PPM.unsigned_abs() {
            return Err(invalid(
                "clock.drift",
                format!(
                    "{}: beyond the largest drift, {}ppm",
                    c.drift,
                    run::units::MAX_PPM
                ),
            ));
        }
        check_positive("clock.duration", &c.duration)?;
        check_weights(
            "clock.weights",
            c.enabled,
            &[c.weights.step, c.weights.drift],
        )?;
        let d = &self.disk;
        check_rate("disk.rate", d.rate)?;
        check_span("disk.fsync-delay", &d.fsync_delay)?;
        check_positive("disk.duration", &d.duration)?;
        let w = &d.weights;
        check_weights(
            "disk.weights",
            d.enabled,
            &[w.fsync_delay, w.fsync_error, w.full],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
