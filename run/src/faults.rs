//! The faults of a multi-node run: one type, [`Fault`], parsed from and
//! printed as the text users write (`--fault` strings and the manifest's
//! `faults` list), in this module only.
//!
//! Grammar, one fault per string, words separated by spaces:
//!
//! ```text
//! at=<time> partition <nodes> | <nodes> [| ...] [for=<duration>]
//! at=<time> partition <nodes> -> <nodes> [for=<duration>]   one way
//! at=<time> cut <nodes> <-> <nodes> [for=<duration>]         both ways, those links only
//! at=<time> bridge [for=<duration>]                          Jepsen's, over the run's nodes
//! at=<time> majorities-ring [for=<duration>]                 Jepsen's, over the run's nodes
//! at=<time> heal [<nodes> <-> <nodes> | <nodes> -> <nodes>]
//! at=<time> slow <node> latency=<d>[..<d>] [for=<duration>]  (slow <node> off ends it)
//! at=<time> loss <node> <probability> [for=<duration>]       (loss <node> off ends it)
//! at=<time> pause <node> [for=<duration>]
//! at=<time> resume <node>
//! at=<time> kill <node> [signal=<n>]          (default 9, SIGKILL)
//! at=<time> restart <node>
//! at=<time> crash <node>                      (kill -9; the disk loses unflushed writes)
//! at=<time> disk <node> fsync-delay=<d> | fsync-error | fsync-ok | full | free
//! at=<time> clock <node> <+|-><duration>      step the node's CLOCK_REALTIME
//! at=<time> drift <node> <+|-><n>ppm [for=<duration>]   its rate; for= back to 0ppm
//! ```
//!
//! The disk faults are in `disk` (this module's child).
//!
//! `<nodes>` is a comma-separated list of node names; nodes listed in no
//! group of a partition form one more group together. Times are virtual
//! times since boot (as `--until`); at a branch (`branch --fault`),
//! `at=+<duration>` is that long after the branch point
//! ([`parse_fault_after`]), and is refused anywhere else. The network
//! faults' words, text and switch form are in the `network` submodule.
//!
//! `for=` is shorthand, expanded when the text is parsed ([`parse_fault`],
//! [`schedule`]): it makes two faults, the one written and the one undoing
//! it (heal, resume, `off`) that much later. A [`Fault`] is one action at one time,
//! so it never prints `for=`, and [`Fault::from_str`] refuses it.
//!
//! The kind of a fault decides who carries it out, once, when it is parsed:
//! [`FaultAction::Network`] faults go to the switch
//! ([`NetworkFault::to_switch`]), [`FaultAction::Node`] faults to the agent
//! ([`HostToAgent`] from a [`NodeFault`]). Serialized, an action is its text
//! (`"partition n1 | n2,n3"`), a fault `{"at": <ns>, "action": <text>}`.

mod disk;
mod lanes;
mod network;
mod until;

pub use disk::{DiskActionError, DiskFault};
pub use lanes::check_lanes;
pub use network::{LatencyRange, NetworkActionError};
pub use until::check_until;

use crate::units::parse_duration;
use devices::switch::Links;
use devices::time::DurationError;
use devices::VirtNanos;
use guest_agent::protocol::HostToAgent;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// One action at one virtual time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub at: VirtNanos,
    pub action: FaultAction,
}

/// The former name of [`Fault`].
pub type TimedFault = Fault;

/// What a fault does, by who carries it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// Carried out by the switch, at the fault's exact time.
    Network(NetworkFault),
    /// Carried out by the agent, at the first exit at or after the fault's time.
    Node(NodeFault),
    /// Carried out by the node's disk, at the fault's exact time.
    Disk(DiskFault),
}

/// A change of the simulated network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetworkFault {
    /// Groups of node names that can talk among themselves only.
    Partition(Vec<Vec<String>>),
    Heal,
    /// `cut A <-> B` (both ways) or `partition A -> B` (one way): those
    /// links are blocked, every other link stays as it is.
    Cut(Links<String>),
    /// `heal A <-> B`, `heal A -> B`: those links are unblocked.
    HealLinks(Links<String>),
    /// Jepsen's `bridge` over every node, in the run's order.
    Bridge,
    /// Jepsen's `majorities-ring` over every node, in the run's order.
    MajoritiesRing,
    /// Every link to and from `node` takes this latency (`None`: its own again).
    Slow {
        node: String,
        latency: Option<LatencyRange>,
    },
    /// Every link to and from `node` loses frames with this probability
    /// (`None`: its own again).
    Loss {
        node: String,
        loss: Option<devices::switch::Probability>,
    },
}

/// Something the agent does to one node. `ClockStep` steps the node's
/// CLOCK_REALTIME by `by_ns` (either way; its monotonic clocks do not move,
/// see docs/determinism.md); `Drift` makes it run `ppm` parts per million
/// fast (negative: slow) from then on, 0 stopping the drift and keeping
/// what it gained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeFault {
    Pause {
        node: String,
    },
    Resume {
        node: String,
    },
    Kill {
        node: String,
        signal: i32,
    },
    Restart {
        node: String,
    },
    /// Kill -9, then unmount the node's disk (whose unflushed writes the
    /// VMM drops at the fault's time, discarding more until then).
    Crash {
        node: String,
    },
    /// Fill the node's disk's free space.
    DiskFull {
        node: String,
    },
    /// Undo [`NodeFault::DiskFull`].
    DiskFree {
        node: String,
    },
    ClockStep {
        node: String,
        by_ns: i64,
    },
    Drift {
        node: String,
        ppm: i32,
    },
}

const ACTIONS: &str = "partition, cut, bridge, majorities-ring, heal, slow, loss, pause, resume, \
                       kill, restart, crash, disk, clock, drift";

/// Why the words of an action are not one. They do not repeat the text (the
/// caller's context does).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    #[error("signal={value} is not a signal number (1..64)")]
    Signal { value: String },
    #[error("unknown setting {key:?} (known: at=, for=, signal=, latency=)")]
    UnknownSetting { key: String },
    #[error("{key}= is given twice")]
    Repeated { key: &'static str },
    #[error("no action ({ACTIONS})")]
    NoAction,
    #[error("{verb} takes exactly one node name")]
    NotOneNode { verb: String },
    #[error(
        "{name:?} is not a node name (1-32 characters of a-z, 0-9 and '-', not starting with '-')"
    )]
    NotANodeName { name: String },
    #[error(transparent)]
    Network(#[from] NetworkActionError),
    #[error("unknown action {action:?} ({ACTIONS})")]
    UnknownAction { action: String },
    #[error("signal= only applies to kill")]
    SignalNotKill,
    #[error(transparent)]
    Disk(#[from] DiskActionError),
    #[error("clock takes a node and a signed step, e.g. clock n2 +30s or clock n2 -1.5s")]
    ClockArguments,
    #[error("clock step")]
    ClockStep(#[source] crate::clock::ClockTextError),
    #[error("drift takes a node and a rate, e.g. drift n2 +200ppm")]
    DriftArguments,
    #[error("drift rate")]
    DriftRate(#[source] crate::clock::ClockTextError),
}

/// Why a fault's text is not one (without the text: see [`FaultError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultTextError {
    #[error("at=")]
    At(#[source] DurationError),
    #[error("for=")]
    For(#[source] DurationError),
    #[error("missing at=<time> (e.g. at=10s)")]
    MissingAt,
    #[error("{key}= is given twice")]
    Repeated { key: &'static str },
    #[error("at=+{after}: the branch point {base} plus that is beyond the largest time")]
    AtBeyond { base: VirtNanos, after: VirtNanos },
    #[error("for=0s: a fault undone the moment it happens does nothing (give a duration above 0s, or no for=)")]
    ForZero,
    #[error(
        "{key}={value}: beyond the latest virtual time a fault may name, {} (365 days)",
        crate::units::MAX_VIRTUAL_TIME
    )]
    BeyondMax { key: &'static str, value: VirtNanos },
    #[error("at=+<duration> is relative to a branch point: use it with `branch --fault`")]
    RelativeWithoutBase,
    #[error(transparent)]
    Action(#[from] ActionError),
}

/// Why a fault was refused: its text, or a node it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    #[error("fault {text:?}")]
    Parse {
        text: String,
        #[source]
        source: FaultTextError,
    },
    #[error("fault {text:?}: for= makes two faults (parse it with parse_fault)")]
    TwoFaults { text: String },
    #[error("fault {text:?}: for= applies to faults it can undo (partition, cut, bridge, majorities-ring, slow, loss, pause, drift, disk fsync-delay, fsync-error and full)")]
    NoUndo { text: String },
    #[error("fault {fault}: no node is named {name:?} (nodes: {})", nodes.join(", "))]
    UnknownNode {
        fault: Box<Fault>,
        name: String,
        nodes: Vec<String>,
    },
    #[error(
        "fault {text:?}: the run ends at {until} (--until), before at={at}: it would never happen"
    )]
    NeverFires {
        text: String,
        at: VirtNanos,
        until: VirtNanos,
    },
    #[error("fault {second} overlaps fault {first}: both take {lane}, and one would undo the other early (see docs/manifest.md, faults)")]
    Overlap {
        first: Box<Fault>,
        second: Box<Fault>,
        lane: String,
    },
    #[error("fault {fault}: no node {name:?}")]
    NoPort {
        fault: Box<NetworkFault>,
        name: String,
    },
}

impl FaultAction {
    /// The node names the action refers to.
    pub fn nodes(&self) -> Vec<&str> {
        match self {
            FaultAction::Network(fault) => fault.nodes(),
            FaultAction::Node(fault) => vec![fault.node()],
            FaultAction::Disk(fault) => vec![fault.node()],
        }
    }

    /// The action `for=` schedules after this one, if it has one.
    fn undo(&self) -> Option<FaultAction> {
        match self {
            FaultAction::Network(fault) => fault.undo().map(FaultAction::Network),
            FaultAction::Node(NodeFault::Pause { node }) => {
                Some(FaultAction::Node(NodeFault::Resume { node: node.clone() }))
            }
            FaultAction::Node(NodeFault::DiskFull { node }) => {
                Some(FaultAction::Node(NodeFault::DiskFree {
                    node: node.clone(),
                }))
            }
            FaultAction::Disk(fault) => fault.undo().map(FaultAction::Disk),
            FaultAction::Node(NodeFault::Drift { node, .. }) => {
                Some(FaultAction::Node(NodeFault::Drift {
                    node: node.clone(),
                    ppm: 0,
                }))
            }
            _ => None,
        }
    }
}

impl NodeFault {
    /// The node the agent acts on.
    pub fn node(&self) -> &str {
        match self {
            NodeFault::Pause { node }
            | NodeFault::Resume { node }
            | NodeFault::Kill { node, .. }
            | NodeFault::Restart { node }
            | NodeFault::Crash { node }
            | NodeFault::DiskFull { node }
            | NodeFault::DiskFree { node }
            | NodeFault::ClockStep { node, .. }
            | NodeFault::Drift { node, .. } => node,
        }
    }
}

/// The agent's message that carries the fault out.
impl From<NodeFault> for HostToAgent {
    fn from(fault: NodeFault) -> Self {
        match fault {
            NodeFault::Pause { node } => HostToAgent::Pause { node },
            NodeFault::Resume { node } => HostToAgent::Resume { node },
            NodeFault::Kill { node, signal } => HostToAgent::Kill { node, signal },
            NodeFault::Restart { node } => HostToAgent::Restart { node },
            NodeFault::Crash { node } => HostToAgent::Crash { node },
            NodeFault::DiskFull { node } => HostToAgent::FillDisk { node },
            NodeFault::DiskFree { node } => HostToAgent::FreeDisk { node },
            NodeFault::ClockStep { node, by_ns } => HostToAgent::StepClock { node, by_ns },
            NodeFault::Drift { node, ppm } => HostToAgent::DriftClock { node, ppm },
        }
    }
}

impl Fault {
    /// Refuses a fault naming a node not in `nodes`.
    pub fn check_nodes(&self, nodes: &[String]) -> Result<(), FaultError> {
        for name in self.action.nodes() {
            if !nodes.iter().any(|n| n == name) {
                return Err(FaultError::UnknownNode {
                    fault: Box::new(self.clone()),
                    name: name.to_owned(),
                    nodes: nodes.to_vec(),
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for NodeFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeFault::Pause { node } => write!(f, "pause {node}"),
            NodeFault::Resume { node } => write!(f, "resume {node}"),
            NodeFault::Kill { node, signal } => write!(f, "kill {node} signal={signal}"),
            NodeFault::Restart { node } => write!(f, "restart {node}"),
            NodeFault::Crash { node } => write!(f, "crash {node}"),
            NodeFault::DiskFull { node } => write!(f, "disk {node} full"),
            NodeFault::DiskFree { node } => write!(f, "disk {node} free"),
            NodeFault::ClockStep { node, by_ns } => {
                write!(f, "clock {node} {}", crate::clock::step_text(*by_ns))
            }
            NodeFault::Drift { node, ppm } => {
                write!(f, "drift {node} {}", crate::clock::ppm_text(*ppm))
            }
        }
    }
}

impl FaultAction {
    /// What kind of fault this is, without its nodes and settings (e.g.
    /// `partition`, `cut`, `pause`, `fsync-error`): the alphabet of fault
    /// combinations a campaign scores as rare or common. `None` for an
    /// action that ends a fault (heal, resume, a node's clock or disk back
    /// to normal): the fault it ends was counted when it began.
    pub fn kind(&self) -> Option<&'static str> {
        Some(match self {
            FaultAction::Network(fault) => match fault {
                NetworkFault::Partition(_) => "partition",
                NetworkFault::Cut(_) => "cut",
                NetworkFault::Bridge => "bridge",
                NetworkFault::MajoritiesRing => "majorities-ring",
                NetworkFault::Slow {
                    latency: Some(_), ..
                } => "slow",
                NetworkFault::Loss { loss: Some(_), .. } => "loss",
                NetworkFault::Heal
                | NetworkFault::HealLinks(_)
                | NetworkFault::Slow { latency: None, .. }
                | NetworkFault::Loss { loss: None, .. } => return None,
            },
            FaultAction::Node(fault) => match fault {
                NodeFault::Pause { .. } => "pause",
                NodeFault::Kill { .. } => "kill",
                NodeFault::Restart { .. } => "restart",
                NodeFault::Crash { .. } => "crash",
                NodeFault::DiskFull { .. } => "disk-full",
                NodeFault::ClockStep { .. } => "clock",
                NodeFault::Drift { ppm: 0, .. } => return None,
                NodeFault::Drift { .. } => "drift",
                NodeFault::Resume { .. } | NodeFault::DiskFree { .. } => return None,
            },
            FaultAction::Disk(fault) => match fault {
                DiskFault::FsyncDelay { .. } => "fsync-delay",
                DiskFault::FsyncError { .. } => "fsync-error",
                DiskFault::FsyncOk { .. } => return None,
            },
        })
    }
}

impl fmt::Display for FaultAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultAction::Network(fault) => fault.fmt(f),
            FaultAction::Node(fault) => fault.fmt(f),
            FaultAction::Disk(fault) => fault.fmt(f),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `at=` in the one duration printer's text (`3.0000316s`).
        write!(f, "at={} {}", self.at, self.action)
    }
}

/// An action: the words after `at=` (and `for=`) are taken out, `signal=`
/// included. Errors do not repeat the text (the caller's context does).
impl FromStr for FaultAction {
    type Err = ActionError;

    fn from_str(text: &str) -> Result<Self, ActionError> {
        let mut signal = None;
        let mut latency = None;
        let mut words = Vec::new();
        for word in text.split_whitespace() {
            match word.split_once('=') {
                Some(("signal", _)) if signal.is_some() => {
                    return Err(ActionError::Repeated { key: "signal" })
                }
                Some(("latency", _)) if latency.is_some() => {
                    return Err(ActionError::Repeated { key: "latency" })
                }
                Some(("signal", value)) => {
                    let n: i32 = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| ActionError::Signal {
                            value: value.to_owned(),
                        })?;
                    signal = Some(n);
                }
                Some(("latency", value)) => latency = Some(value),
                // A disk fault's setting, read by `disk::parse_disk`.
                Some(("fsync-delay", _)) => words.push(word),
                Some((key, _)) => {
                    return Err(ActionError::UnknownSetting {
                        key: key.to_owned(),
                    })
                }
                None => words.push(word),
            }
        }
        let Some((&verb, args)) = words.split_first() else {
            return Err(ActionError::NoAction);
        };
        let one_node = || -> Result<String, ActionError> {
            match args {
                [node] => Ok(node.to_string()),
                _ => Err(ActionError::NotOneNode {
                    verb: verb.to_owned(),
                }),
            }
        };
        let action = match verb {
            verb if NetworkFault::is_verb(verb) => {
                FaultAction::Network(NetworkFault::parse(verb, args, latency)?)
            }
            "pause" => FaultAction::Node(NodeFault::Pause { node: one_node()? }),
            "resume" => FaultAction::Node(NodeFault::Resume { node: one_node()? }),
            "kill" => FaultAction::Node(NodeFault::Kill {
                node: one_node()?,
                signal: signal.unwrap_or(libc::SIGKILL),
            }),
            "restart" => FaultAction::Node(NodeFault::Restart { node: one_node()? }),
            "crash" => FaultAction::Node(NodeFault::Crash { node: one_node()? }),
            "disk" => disk::parse_disk(args)?,
            "clock" => {
                let [node, value] = args else {
                    return Err(ActionError::ClockArguments);
                };
                let by_ns = crate::clock::parse_step(value).map_err(ActionError::ClockStep)?;
                FaultAction::Node(NodeFault::ClockStep {
                    node: node.to_string(),
                    by_ns,
                })
            }
            "drift" => {
                let [node, value] = args else {
                    return Err(ActionError::DriftArguments);
                };
                let ppm = crate::clock::parse_ppm(value).map_err(ActionError::DriftRate)?;
                FaultAction::Node(NodeFault::Drift {
                    node: node.to_string(),
                    ppm,
                })
            }
            other => {
                return Err(ActionError::UnknownAction {
                    action: other.to_owned(),
                })
            }
        };
        if signal.is_some() && !matches!(action, FaultAction::Node(NodeFault::Kill { .. })) {
            return Err(ActionError::SignalNotKill);
        }
        if latency.is_some() && !matches!(action, FaultAction::Network(NetworkFault::Slow { .. })) {
            return Err(NetworkActionError::LatencyNotSlow.into());
        }
        // Names a manifest could have: anything else (a stray `x=`, a NUL)
        // would print as a text that reads back as something else.
        if let Some(name) = action
            .nodes()
            .into_iter()
            .find(|name| !crate::manifest::is_node_name(name))
        {
            return Err(ActionError::NotANodeName {
                name: name.to_owned(),
            });
        }
        Ok(action)
    }
}

/// Parses the grammar: the fault written and its `for=` duration, if any.
/// `at=+<duration>` is that long after `base` (a branch point); without a
/// base it is refused.
fn parse_text(
    text: &str,
    base: Option<VirtNanos>,
) -> Result<(Fault, Option<VirtNanos>), FaultTextError> {
    let mut at = None;
    let mut duration = None;
    let mut rest = Vec::new();
    for word in text.split_whitespace() {
        match word.split_once('=') {
            Some(("at", _)) if at.is_some() => return Err(FaultTextError::Repeated { key: "at" }),
            Some(("for", _)) if duration.is_some() => {
                return Err(FaultTextError::Repeated { key: "for" })
            }
            Some(("at", value)) => {
                at = Some(match value.strip_prefix('+') {
                    Some(after) => {
                        let base = base.ok_or(FaultTextError::RelativeWithoutBase)?;
                        let after = parse_duration(after).map_err(FaultTextError::At)?;
                        base.0
                            .checked_add(after.0)
                            .map(VirtNanos)
                            .ok_or(FaultTextError::AtBeyond { base, after })?
                    }
                    None => parse_duration(value).map_err(FaultTextError::At)?,
                })
            }
            Some(("for", value)) => {
                duration = Some(parse_duration(value).map_err(FaultTextError::For)?)
            }
            _ => rest.push(word),
        }
    }
    let at = at.ok_or(FaultTextError::MissingAt)?;
    if at > crate::units::MAX_VIRTUAL_TIME {
        return Err(FaultTextError::BeyondMax {
            key: "at",
            value: at,
        });
    }
    if let Some(duration) = duration {
        if duration == VirtNanos::ZERO {
            return Err(FaultTextError::ForZero);
        }
        if duration > crate::units::MAX_VIRTUAL_TIME {
            return Err(FaultTextError::BeyondMax {
                key: "for",
                value: duration,
            });
        }
    }
    let action = rest.join(" ").parse()?;
    Ok((Fault { at, action }, duration))
}

/// One fault as [`Fault`]'s `Display` prints it. `for=` makes two faults:
/// it is refused here (see [`parse_fault`]).
impl FromStr for Fault {
    type Err = FaultError;

    fn from_str(text: &str) -> Result<Self, FaultError> {
        match parse_text(text, None) {
            Ok((fault, None)) => Ok(fault),
            Ok((_, Some(_))) => Err(FaultError::TwoFaults {
                text: text.to_owned(),
            }),
            Err(source) => Err(FaultError::Parse {
                text: text.to_owned(),
                source,
            }),
        }
    }
}

/// Parses one fault string into its fault and, with `for=`, the undoing one.
pub fn parse_fault(text: &str) -> Result<Vec<Fault>, FaultError> {
    parse_fault_after(text, None)
}

/// [`parse_fault`] where `at=+<duration>` counts from `base` (a branch
/// point; `None`: relative times are refused).
pub fn parse_fault_after(text: &str, base: Option<VirtNanos>) -> Result<Vec<Fault>, FaultError> {
    let (fault, duration) = parse_text(text, base).map_err(|source| FaultError::Parse {
        text: text.to_owned(),
        source,
    })?;
    let mut faults = vec![fault];
    if let Some(d) = duration {
        let fault = &faults[0];
        let Some(undo) = fault.action.undo() else {
            return Err(FaultError::NoUndo {
                text: text.to_owned(),
            });
        };
        faults.push(Fault {
            at: VirtNanos(fault.at.0.saturating_add(d.0)),
            action: undo,
        });
    }
    Ok(faults)
}

/// Parses every fault and orders them by time (faults at the same time keep
/// the order they were given in), checking node names against `nodes`.
pub fn schedule(texts: &[String], nodes: &[String]) -> Result<Vec<Fault>, FaultError> {
    let mut all = Vec::new();
    for text in texts {
        for fault in parse_fault(text)? {
            fault.check_nodes(nodes)?;
            all.push(fault);
        }
    }
    // A stable sort: same-time faults stay in the order given.
    all.sort_by_key(|f| f.at);
    check_lanes(&all)?;
    Ok(all)
}

/// Serialized as its text.
impl Serialize for FaultAction {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FaultAction {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(|e| {
            serde::de::Error::custom(format!("fault action {text:?}: {}", crate::chain(&e)))
        })
    }
}

/// Serialized as its text, as a [`FaultAction`].
impl Serialize for NodeFault {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for NodeFault {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match FaultAction::deserialize(deserializer)? {
            FaultAction::Node(fault) => Ok(fault),
            other => Err(serde::de::Error::custom(format!(
                "fault action {other}: not one for the agent"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn test_fault_kinds_name_beginnings_and_not_endings() {
        let kind = |text: &str| parse_fault(text).unwrap()[0].action.kind();
        assert_eq!(kind("at=1s pause n1"), Some("pause"));
        assert_eq!(kind("at=1s resume n1"), None);
        assert_eq!(kind("at=1s partition n1 | n2"), Some("partition"));
        assert_eq!(kind("at=1s cut n1 <-> n2"), Some("cut"));
        assert_eq!(kind("at=1s heal"), None);
        assert_eq!(kind("at=1s kill n1"), Some("kill"));
        let paused = parse_fault("at=1s pause n1 for=2s").unwrap();
        let kinds: Vec<_> = paused.iter().map(|f| f.action.kind()).collect();
        assert_eq!(kinds, [Some("pause"), None]);
    }

    use super::*;
    use devices::switch::Fault as SwitchFault;
    use devices::PortId;
    use proptest::prelude::*;

    fn s(v: &str) -> String {
        v.to_string()
    }

    fn secs(n: u64) -> VirtNanos {
        VirtNanos(n * 1_000_000_000)
    }

    fn pause(node: &str) -> FaultAction {
        FaultAction::Node(NodeFault::Pause { node: s(node) })
    }

    #[test]
    fn test_partition_with_duration_heals_later() {
        let faults = parse_fault("at=10s partition n1 | n2,n3 for=15s").unwrap();
        assert_eq!(
            faults,
            vec![
                Fault {
                    at: secs(10),
                    action: FaultAction::Network(NetworkFault::Partition(vec![
                        vec![s("n1")],
                        vec![s("n2"), s("n3")]
                    ]))
                },
                Fault {
                    at: secs(25),
                    action: FaultAction::Network(NetworkFault::Heal)
                },
            ]
        );
        // The text as users wrote it, less for= (now the second fault).
        assert_eq!(faults[0].to_string(), "at=10s partition n1 | n2,n3");
        assert_eq!(faults[1].to_string(), "at=25s heal");
    }

    #[test]
    fn test_pause_for_resumes_and_kill_takes_signal() {
        let faults = parse_fault("pause n2 at=30s for=5s").unwrap();
        assert_eq!(faults[0].action, pause("n2"));
        assert_eq!(
            faults[1].action,
            FaultAction::Node(NodeFault::Resume { node: s("n2") })
        );
        assert_eq!(faults[1].at, secs(35));
        let kill = parse_fault("at=1s kill n1 signal=15").unwrap();
        assert_eq!(
            kill[0].action,
            FaultAction::Node(NodeFault::Kill {
                node: s("n1"),
                signal: 15
            })
        );
        assert_eq!(
            parse_fault("at=1s kill n1").unwrap()[0].action,
            FaultAction::Node(NodeFault::Kill {
                node: s("n1"),
                signal: 9
            })
        );
    }

    /// The whole error chain of a fault text that does not parse.
    pub(super) fn parse_error(text: &str) -> String {
        format!("{:#}", anyhow::Error::from(parse_fault(text).unwrap_err()))
    }

    #[test]
    fn test_clock_faults_parse_print_and_drift_for_stops_the_drift() {
        let faults = parse_fault("at=10s drift n2 +200ppm for=60s").unwrap();
        assert_eq!(
            faults,
            vec![
                Fault {
                    at: secs(10),
                    action: FaultAction::Node(NodeFault::Drift {
                        node: s("n2"),
                        ppm: 200
                    })
                },
                Fault {
                    at: secs(70),
                    action: FaultAction::Node(NodeFault::Drift {
                        node: s("n2"),
                        ppm: 0
                    })
                },
            ]
        );
        assert_eq!(faults[0].to_string(), "at=10s drift n2 +200ppm");
        assert_eq!(faults[1].to_string(), "at=70s drift n2 0ppm");
        let step = parse_fault("at=5s clock n3 -1.5s").unwrap();
        assert_eq!(
            step[0].action,
            FaultAction::Node(NodeFault::ClockStep {
                node: s("n3"),
                by_ns: -1_500_000_000
            })
        );
        assert_eq!(step[0].to_string(), "at=5s clock n3 -1.5s");
        let err = |t: &str| format!("{:#}", anyhow::Error::from(parse_fault(t).unwrap_err()));
        assert!(err("at=1s clock n2 30s").contains("clock step: expected a sign"));
        assert!(err("at=1s clock n2").contains("clock takes a node and a signed step"));
        assert!(err("at=1s clock n2 +30s for=5s").contains("for= applies"));
        assert!(err("at=1s drift n2 200").contains("drift rate: expected a whole number of ppm"));
        assert!(err("at=1s drift n2 +2000000ppm").contains("beyond the largest drift"));
        assert!(err("at=1s drift +20ppm").contains("drift takes a node and a rate"));
    }

    #[test]
    fn test_a_setting_given_twice_or_a_time_beyond_the_largest_is_refused() {
        let err = parse_error;
        assert_eq!(
            err("at=1s at=2s pause n1"),
            "fault \"at=1s at=2s pause n1\": at= is given twice"
        );
        assert!(err("at=1s pause n1 for=1s for=2s").ends_with("for= is given twice"));
        assert!(err("at=1s kill n1 signal=9 signal=15").ends_with("signal= is given twice"));
        assert!(err("at=1s slow n1 latency=1ms latency=2ms").ends_with("latency= is given twice"));
        let beyond = parse_fault_after("at=+1s pause n1", Some(VirtNanos(u64::MAX)))
            .map(|_| ())
            .unwrap_err();
        assert!(format!("{:#}", anyhow::Error::from(beyond)).ends_with(
            "at=+1s: the branch point 18446744073.709551615s plus that is beyond the largest time"
        ));
        // Past MAX_VIRTUAL_TIME, or for=0s: accepted before, they never worked.
        let max = crate::units::MAX_VIRTUAL_TIME;
        parse_fault(&format!("at={max} pause n1 for=1s")).unwrap();
        parse_fault(&format!("at=1s pause n1 for={max}")).unwrap();
        let beyond = "at=1s pause n1 for=5000000h";
        assert_eq!(
            err(beyond),
            format!("fault {beyond:?}: for=18000000000s: beyond the latest virtual time a fault may name, 31536000s (365 days)")
        );
        assert!(err("at=5000000h pause n1").contains(": at=18000000000s: beyond the latest"));
        assert!(err(&format!("at={} pause n1", VirtNanos(max.0 + 1)))
            .contains("beyond the latest virtual time"));
        assert!(err("at=1s pause n1 for=0s").ends_with(
            "for=0s: a fault undone the moment it happens does nothing (give a duration above 0s, or no for=)"
        ));
    }

    #[test]
    fn test_bad_faults_name_the_problem() {
        let err = parse_error;
        assert!(err("partition n1 | n2").contains("missing at="));
        assert!(err("at=1s explode n1").contains("unknown action \"explode\""));
        assert!(err("at=1s pause").contains("exactly one node"));
        assert!(err("at=1s partition n1 | | n2").contains("group is empty"));
        assert!(err("at=1s partition n1 | n1").contains("two groups"));
        assert!(err("at=1s restart n1 for=2s").contains("for= applies"));
        assert!(err("at=1s pause n1 signal=9").contains("only applies to kill"));
        assert!(err("at=1s kill n1 signal=99").contains("not a signal number"));
        assert!(err("at=soon heal").contains("at=: unparsable duration"));
        assert!(err("at=1s heal color=red").contains("unknown setting \"color\""));
        assert!(err("at=1s").contains("no action"));
        assert!(err("at=1s pause N1").contains("\"N1\" is not a node name"));
        assert!(err("at=1s clock n\u{0}1 +1s").contains("is not a node name"));
        // Found by the file_fault fuzz target: a stray `x=` and a NUL taken
        // as node names printed as a text that did not read back.
        assert!(err("at=1s cut n\u{0}3,:, fsync-delay= <->s cut n1 for=2s")
            .contains("is not a node name"));
        assert!(err("at=1s cut n1 <-> n2 n3").contains("\"n2 n3\" is not a node name"));
        // Every message names the fault as written.
        assert!(err("at=1s pause").starts_with("fault \"at=1s pause\": "));
        // One fault is one action: for= is the schedule's shorthand.
        let one = "at=1s pause n1 for=2s".parse::<Fault>().unwrap_err();
        assert!(one.to_string().contains("for= makes two faults"));
    }

    #[test]
    fn test_relative_times_count_from_the_branch_point_only() {
        let base = VirtNanos::from_secs(20);
        let faults = parse_fault_after("at=+2s pause n1 for=3s", Some(base)).unwrap();
        assert_eq!(faults[0].at, VirtNanos::from_secs(22));
        assert_eq!(faults[1].at, VirtNanos::from_secs(25));
        // Absolute times stay absolute at a branch.
        let faults = parse_fault_after("at=30s heal", Some(base)).unwrap();
        assert_eq!(faults[0].at, VirtNanos::from_secs(30));
        // A resolved fault prints (and reads back) as an absolute one.
        assert_eq!(faults[0].to_string().parse::<Fault>().unwrap(), faults[0]);
        let err = format!(
            "{:#}",
            anyhow::Error::from(parse_fault("at=+2s heal").unwrap_err())
        );
        assert!(
            err.contains("at=+<duration> is relative to a branch point"),
            "{err}"
        );
    }

    #[test]
    fn test_a_fault_error_chain_names_each_cause_once() {
        let chain = |e: FaultError| format!("{:#}", anyhow::Error::from(e));
        assert_eq!(
            chain(parse_fault("at=soon heal").unwrap_err()),
            "fault \"at=soon heal\": at=: unparsable duration \"soon\": expected a decimal number \
             and a unit (ns, us or µs, ms, s, m or min, h; no unit means seconds), e.g. 12.5s, 250ms or 600"
        );
        assert_eq!(
            chain(parse_fault("at=1s explode n1").unwrap_err()),
            format!("fault \"at=1s explode n1\": unknown action \"explode\" ({ACTIONS})")
        );
        // Serialized, an action's error is one message with its causes.
        let bad = serde_json::from_str::<FaultAction>(r#""pause""#).unwrap_err();
        assert_eq!(
            bad.to_string(),
            "fault action \"pause\": pause takes exactly one node name"
        );
    }

    #[test]
    fn test_schedule_orders_by_time_and_checks_names() {
        let nodes = vec![s("n1"), s("n2")];
        let faults = schedule(&[s("at=5s pause n1 for=10s"), s("at=7s kill n2")], &nodes).unwrap();
        let times: Vec<u64> = faults.iter().map(|f| f.at.0 / 1_000_000_000).collect();
        assert_eq!(times, vec![5, 7, 15]);
        let err = schedule(&[s("at=1s pause n9")], &nodes).unwrap_err();
        assert_eq!(
            err.to_string(),
            "fault at=1s pause n9: no node is named \"n9\" (nodes: n1, n2)"
        );
        let err = schedule(&[s("at=1s partition n1 | n2,n3")], &nodes).unwrap_err();
        assert!(err.to_string().contains("no node is named \"n3\""));
    }

    #[test]
    fn test_every_node_fault_becomes_its_agent_message() {
        let cases = [
            ("pause n1", HostToAgent::Pause { node: s("n1") }),
            ("resume n1", HostToAgent::Resume { node: s("n1") }),
            (
                "kill n1",
                HostToAgent::Kill {
                    node: s("n1"),
                    signal: 9,
                },
            ),
            (
                "kill n1 signal=15",
                HostToAgent::Kill {
                    node: s("n1"),
                    signal: 15,
                },
            ),
            ("restart n1", HostToAgent::Restart { node: s("n1") }),
            (
                "clock n1 +30s",
                HostToAgent::StepClock {
                    node: s("n1"),
                    by_ns: 30_000_000_000,
                },
            ),
            (
                "clock n1 -2s",
                HostToAgent::StepClock {
                    node: s("n1"),
                    by_ns: -2_000_000_000,
                },
            ),
            (
                "drift n1 +200ppm",
                HostToAgent::DriftClock {
                    node: s("n1"),
                    ppm: 200,
                },
            ),
        ];
        for (text, message) in cases {
            match text.parse::<FaultAction>().unwrap() {
                FaultAction::Node(fault) => {
                    assert_eq!(fault.node(), "n1");
                    assert_eq!(HostToAgent::from(fault), message, "{text}");
                }
                other => panic!("{text}: {other:?} is not the agent's"),
            }
        }
    }

    /// Each network fault text of `cases` is its switch fault, with nodes
    /// n1, n2, n3 on ports 2, 3, 4, and the switch fault names it back.
    pub(super) fn assert_to_switch_and_back(cases: &[(&str, SwitchFault)]) {
        let names = vec![s("n1"), s("n2"), s("n3")];
        // NIC i (node i) sits on the switch port of its virtio slot.
        let ports = [PortId(2), PortId(3), PortId(4)];
        for (text, on_switch) in cases {
            let FaultAction::Network(fault) = text.parse::<FaultAction>().unwrap() else {
                panic!("{text} is the switch's");
            };
            assert_eq!(
                fault.to_switch(&names, &ports).unwrap(),
                *on_switch,
                "{text}"
            );
            assert_eq!(
                NetworkFault::from_switch(on_switch, &names, &ports),
                Some(fault),
                "{text}"
            );
        }
    }

    #[test]
    fn test_every_network_fault_goes_to_the_switch_and_back() {
        let names = vec![s("n1"), s("n2"), s("n3")];
        // NIC i (node i) sits on the switch port of its virtio slot.
        let ports = [PortId(2), PortId(3), PortId(4)];
        let cases = [
            (
                "partition n1 | n3,n2",
                SwitchFault::Partition(vec![vec![PortId(2)], vec![PortId(4), PortId(3)]]),
            ),
            (
                "partition n2",
                SwitchFault::Partition(vec![vec![PortId(3)]]),
            ),
            ("heal", SwitchFault::Heal),
        ];
        assert_to_switch_and_back(&cases);
        let FaultAction::Network(unknown) = "partition n1 | n9".parse().unwrap() else {
            unreachable!()
        };
        let err = unknown.to_switch(&names, &ports).unwrap_err();
        assert!(err.to_string().contains("no node \"n9\""), "{err}");
        let stray = SwitchFault::Partition(vec![vec![PortId(9)]]);
        assert_eq!(NetworkFault::from_switch(&stray, &names, &ports), None);
    }

    #[test]
    fn test_faults_serialize_as_their_text() {
        let fault: Fault = "at=1500ms kill n1 signal=15".parse().unwrap();
        let json = serde_json::to_string(&fault).unwrap();
        assert_eq!(json, r#"{"at":1500000000,"action":"kill n1 signal=15"}"#);
        assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), fault);
        let FaultAction::Node(node) = fault.action else {
            unreachable!()
        };
        assert_eq!(
            serde_json::to_string(&node).unwrap(),
            r#""kill n1 signal=15""#
        );
        assert!(serde_json::from_str::<NodeFault>(r#""heal""#).is_err());
        assert!(serde_json::from_str::<FaultAction>(r#""explode n1""#).is_err());
    }

    fn node_name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,6}"
    }

    fn action() -> impl Strategy<Value = FaultAction> {
        let partition = (
            prop::collection::btree_set(node_name(), 1..8),
            prop::collection::vec(1usize..4, 8),
        )
            .prop_map(|(names, sizes)| {
                let names: Vec<String> = names.into_iter().collect();
                let mut groups = Vec::new();
                let mut rest = names.as_slice();
                for size in sizes {
                    if rest.is_empty() {
                        break;
                    }
                    let (group, tail) = rest.split_at(size.min(rest.len()));
                    groups.push(group.to_vec());
                    rest = tail;
                }
                groups
            })
            .prop_shuffle()
            .prop_map(|groups| FaultAction::Network(NetworkFault::Partition(groups)));
        prop_oneof![
            partition,
            Just(FaultAction::Network(NetworkFault::Heal)),
            network::tests::link_fault().prop_map(FaultAction::Network),
            node_name().prop_map(|node| FaultAction::Node(NodeFault::Pause { node })),
            node_name().prop_map(|node| FaultAction::Node(NodeFault::Resume { node })),
            (node_name(), 1..=64i32)
                .prop_map(|(node, signal)| FaultAction::Node(NodeFault::Kill { node, signal })),
            node_name().prop_map(|node| FaultAction::Node(NodeFault::Restart { node })),
            disk_action(),
        ]
    }

    fn disk_action() -> impl Strategy<Value = FaultAction> {
        prop_oneof![
            node_name().prop_map(|node| FaultAction::Node(NodeFault::Crash { node })),
            node_name().prop_map(|node| FaultAction::Node(NodeFault::DiskFull { node })),
            node_name().prop_map(|node| FaultAction::Node(NodeFault::DiskFree { node })),
            (node_name(), time())
                .prop_map(|(node, delay)| FaultAction::Disk(DiskFault::FsyncDelay { node, delay })),
            node_name().prop_map(|node| FaultAction::Disk(DiskFault::FsyncError { node })),
            node_name().prop_map(|node| FaultAction::Disk(DiskFault::FsyncOk { node })),
            (node_name(), -(1i64 << 53)..(1i64 << 53))
                .prop_map(|(node, by_ns)| FaultAction::Node(NodeFault::ClockStep { node, by_ns })),
            (node_name(), -crate::clock::MAX_PPM..=crate::clock::MAX_PPM)
                .prop_map(|(node, ppm)| FaultAction::Node(NodeFault::Drift { node, ppm })),
        ]
    }

    /// Times `parse_duration` reads back exactly: below 2^53 ns, often round.
    fn time() -> impl Strategy<Value = VirtNanos> {
        prop_oneof![
            0u64..(1 << 53),
            (0u64..1_000_000).prop_map(|n| n * 1_000_000_000),
            (0u64..1_000_000).prop_map(|n| n * 1_000_000),
            (0u64..1_000_000).prop_map(|n| n * 1_000),
        ]
        .prop_map(VirtNanos)
    }

    proptest! {
        #[test]
        fn prop_fault_text_round_trips(at in time(), action in action()) {
            let fault = Fault { at, action };
            let text = fault.to_string();
            prop_assert_eq!(text.parse::<Fault>().unwrap(), fault.clone(), "{}", text);
            prop_assert_eq!(parse_fault(&text).unwrap(), vec![fault.clone()]);
            let json = serde_json::to_string(&fault).unwrap();
            prop_assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), fault);
        }

        #[test]
        fn prop_for_adds_the_undoing_fault(at in time(), action in action(), d in time()) {
            let fault = Fault { at, action };
            let text = format!("{fault} for={d}");
            match fault.action.undo() {
                Some(undo) => prop_assert_eq!(
                    parse_fault(&text).unwrap(),
                    vec![fault.clone(), Fault { at: VirtNanos(at.0.saturating_add(d.0)), action: undo }]
                ),
                None => prop_assert!(parse_fault(&text).is_err()),
            }
        }
    }
}
