//! Why a fault's text, time or nodes were refused. Each error names its
//! fault once (the outermost), its causes do not repeat it.

use super::{DiskActionError, Fault, NetworkActionError, NoPortError, ScheduledFault};
use devices::time::DurationError;
use devices::VirtNanos;

/// Every action's verb, for the errors that list them.
pub(super) const ACTIONS: &str = "partition, cut, bridge, majorities-ring, heal, slow, loss, \
    pause, resume, kill, restart, crash, disk, clock, drift";

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
    ClockStep(#[source] crate::units::ClockTextError),
    #[error("drift takes a node and a rate, e.g. drift n2 +200ppm")]
    DriftArguments,
    #[error("drift rate")]
    DriftRate(#[source] crate::units::ClockTextError),
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
    #[error("for=0s: a fault undone the moment it happens does nothing (give a duration above 0s, or no for=)")]
    ForZero,
    #[error(
        "{key}={value}: beyond the latest virtual time a fault may name, {} (365 days)",
        crate::units::MAX_VIRTUAL_TIME
    )]
    BeyondMax { key: &'static str, value: VirtNanos },
    #[error(
        "at=+{after}: beyond the latest virtual time a fault may name, {} (365 days)",
        crate::units::MAX_VIRTUAL_TIME
    )]
    AfterBeyondMax { after: VirtNanos },
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
    /// A time the fault cannot have where it is added.
    #[error("fault \"{fault}\"")]
    Time {
        fault: Box<Fault>,
        #[source]
        source: FaultTimeError,
    },
    #[error("fault {text:?}: for= applies to faults it can undo (partition, cut, bridge, majorities-ring, slow, loss, pause, drift, disk fsync-delay, fsync-error and full)")]
    NoUndo { text: String },
    #[error("fault {fault}: no node is named {name:?} (nodes: {})", nodes.join(", "))]
    UnknownNode {
        fault: Box<Fault>,
        name: String,
        nodes: Vec<String>,
    },
    #[error(
        "fault \"{fault}\": the run ends at {until} (--until), before at={at}: it would never happen"
    )]
    NeverFires {
        fault: Box<Fault>,
        at: VirtNanos,
        until: VirtNanos,
    },
    #[error("fault {second} overlaps fault {first}: both take {lane}, and one would undo the other early (see docs/manifest.md, faults)")]
    Overlap {
        first: Box<ScheduledFault>,
        second: Box<ScheduledFault>,
        lane: String,
    },
    #[error(transparent)]
    NoPort(#[from] NoPortError),
}

/// Why a fault's time is not one where the fault is added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultTimeError {
    #[error("at=+<duration> is relative to a branch point: use it with `branch --fault`")]
    RelativeWithoutBase,
    #[error("at=+{after}: the branch point {base} plus that is beyond the largest time")]
    Beyond { base: VirtNanos, after: VirtNanos },
    #[error(
        "at=+{after}: the branch point {base} plus that, {at}, is beyond the latest virtual time a fault may name, {} (365 days)",
        crate::units::MAX_VIRTUAL_TIME
    )]
    BeyondMax {
        base: VirtNanos,
        after: VirtNanos,
        at: VirtNanos,
    },
}
