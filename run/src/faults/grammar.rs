//! The fault grammar (see the module above for it): every fault, time and
//! action parsed from and printed as its text here, and serialized as it.

use super::{
    ActionError, DiskActionError, DiskFault, Fault, FaultAction, FaultError, FaultTextError,
    FaultTime, NetworkActionError, NetworkFault, NodeFault, ScheduledFault,
};
use crate::units::parse_duration;
use devices::time::DurationError;
use devices::VirtNanos;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

impl fmt::Display for NodeFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeFault::Pause { node } => write!(f, "pause {node}"),
            NodeFault::Resume { node } => write!(f, "resume {node}"),
            NodeFault::Kill {
                node,
                signal: Some(signal),
            } => write!(f, "kill {node} signal={signal}"),
            NodeFault::Kill { node, signal: None } => write!(f, "kill {node}"),
            NodeFault::Restart { node } => write!(f, "restart {node}"),
            NodeFault::Crash { node } => write!(f, "crash {node}"),
            NodeFault::DiskFull { node } => write!(f, "disk {node} full"),
            NodeFault::DiskFree { node } => write!(f, "disk {node} free"),
            NodeFault::ClockStep { node, by_ns } => {
                write!(f, "clock {node} {}", crate::units::step_text(*by_ns))
            }
            NodeFault::Drift { node, ppm } => {
                write!(f, "drift {node} {}", crate::units::ppm_text(*ppm))
            }
        }
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

impl fmt::Display for FaultTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // In the one duration printer's text (`3.0000316s`).
        match self {
            FaultTime::SinceBoot(at) => write!(f, "{at}"),
            FaultTime::AfterBranch(after) => write!(f, "+{after}"),
        }
    }
}

/// `10s` since boot, `+2s` after the branch point (the duration grammar).
impl FromStr for FaultTime {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Self, DurationError> {
        Ok(match text.strip_prefix('+') {
            Some(after) => FaultTime::AfterBranch(parse_duration(after)?),
            None => FaultTime::SinceBoot(parse_duration(text)?),
        })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at={} {}", self.at, self.action)?;
        match self.lasting {
            Some(lasting) => write!(f, " for={lasting}"),
            None => Ok(()),
        }
    }
}

/// As the fault it is: `at=<time since boot> <action>`.
impl fmt::Display for ScheduledFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Fault::from(self.clone()).fmt(f)
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
                // A disk fault's setting, read by `parse_disk`.
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
                signal,
            }),
            "restart" => FaultAction::Node(NodeFault::Restart { node: one_node()? }),
            "crash" => FaultAction::Node(NodeFault::Crash { node: one_node()? }),
            "disk" => parse_disk(args)?,
            "clock" => {
                let [node, value] = args else {
                    return Err(ActionError::ClockArguments);
                };
                let by_ns = crate::units::parse_step(value).map_err(ActionError::ClockStep)?;
                FaultAction::Node(NodeFault::ClockStep {
                    node: node.to_string(),
                    by_ns,
                })
            }
            "drift" => {
                let [node, value] = args else {
                    return Err(ActionError::DriftArguments);
                };
                let ppm = crate::units::parse_ppm(value).map_err(ActionError::DriftRate)?;
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
            .find(|name| !crate::units::is_node_name(name))
        {
            return Err(ActionError::NotANodeName {
                name: name.to_owned(),
            });
        }
        Ok(action)
    }
}

/// The words of a fault: `at=`, `for=` and the action's, in any order.
fn parse_text(text: &str) -> Result<Fault, FaultTextError> {
    let mut at = None;
    let mut lasting = None;
    let mut rest = Vec::new();
    for word in text.split_whitespace() {
        match word.split_once('=') {
            Some(("at", _)) if at.is_some() => return Err(FaultTextError::Repeated { key: "at" }),
            Some(("for", _)) if lasting.is_some() => {
                return Err(FaultTextError::Repeated { key: "for" })
            }
            Some(("at", value)) => at = Some(value.parse().map_err(FaultTextError::At)?),
            Some(("for", value)) => {
                lasting = Some(parse_duration(value).map_err(FaultTextError::For)?)
            }
            _ => rest.push(word),
        }
    }
    let max = crate::units::MAX_VIRTUAL_TIME;
    match at.ok_or(FaultTextError::MissingAt)? {
        FaultTime::SinceBoot(value) if value > max => {
            return Err(FaultTextError::BeyondMax { key: "at", value })
        }
        FaultTime::AfterBranch(after) if after > max => {
            return Err(FaultTextError::AfterBeyondMax { after })
        }
        _ => {}
    }
    if let Some(lasting) = lasting {
        if lasting == VirtNanos::ZERO {
            return Err(FaultTextError::ForZero);
        }
        if lasting > max {
            return Err(FaultTextError::BeyondMax {
                key: "for",
                value: lasting,
            });
        }
    }
    Ok(Fault {
        at: at.expect("checked above"),
        action: rest.join(" ").parse()?,
        lasting,
    })
}

/// A fault's text; `for=` only on an action it can undo.
impl FromStr for Fault {
    type Err = FaultError;

    fn from_str(text: &str) -> Result<Self, FaultError> {
        let fault = parse_text(text).map_err(|source| FaultError::Parse {
            text: text.to_owned(),
            source,
        })?;
        if fault.lasting.is_some() && fault.action.undo().is_none() {
            return Err(FaultError::NoUndo {
                text: text.to_owned(),
            });
        }
        Ok(fault)
    }
}

/// Serialized as its text (a campaign path's steps hold faults, the
/// conductor's schedule node faults, events actions so).
macro_rules! serialize_as_text {
    ($($kind:ty),*) => {$(
        impl Serialize for $kind {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }
    )*};
}

serialize_as_text!(Fault, FaultAction, NodeFault);

impl<'de> Deserialize<'de> for Fault {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse()
            .map_err(|e: FaultError| serde::de::Error::custom(crate::chain(&e)))
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

/// As a [`FaultAction`], the agent's.
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

/// The action of `disk <args>`.
fn parse_disk(args: &[&str]) -> Result<FaultAction, ActionError> {
    let [node, kind] = args else {
        return Err(DiskActionError::Shape.into());
    };
    let node = (*node).to_owned();
    Ok(match kind.split_once('=') {
        Some(("fsync-delay", value)) => {
            let delay = crate::units::parse_duration(value).map_err(DiskActionError::Delay)?;
            FaultAction::Disk(DiskFault::FsyncDelay { node, delay })
        }
        Some(_) => {
            return Err(DiskActionError::Kind {
                kind: (*kind).to_owned(),
            }
            .into())
        }
        None => match *kind {
            "fsync-error" => FaultAction::Disk(DiskFault::FsyncError { node }),
            "fsync-ok" => FaultAction::Disk(DiskFault::FsyncOk { node }),
            "full" => FaultAction::Node(NodeFault::DiskFull { node }),
            "free" => FaultAction::Node(NodeFault::DiskFree { node }),
            other => {
                return Err(DiskActionError::Kind {
                    kind: other.to_owned(),
                }
                .into())
            }
        },
    })
}
