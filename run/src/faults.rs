//! The fault schedule of a multi-node run: `--fault` strings (and the
//! manifest's `faults` list) parsed into timed actions.
//!
//! Grammar, one fault per string, words separated by spaces:
//!
//! ```text
//! at=<time> partition <nodes> | <nodes> [| ...] [for=<duration>]
//! at=<time> heal
//! at=<time> pause <node> [for=<duration>]
//! at=<time> resume <node>
//! at=<time> kill <node> [signal=<n>]          (default 9, SIGKILL)
//! at=<time> restart <node>
//! ```
//!
//! `<nodes>` is a comma-separated list of node names; nodes listed in no
//! group of a partition form one more group together. Times are virtual
//! times since boot (as `--until`). `for=` schedules the undoing action
//! (heal, resume) that much later.

use crate::units::parse_duration;
use anyhow::{bail, Context, Result};
use devices::VirtNanos;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultAction {
    /// Groups of node names that can talk among themselves only.
    Partition(Vec<Vec<String>>),
    Heal,
    Pause(String),
    Resume(String),
    Kill {
        node: String,
        signal: i32,
    },
    Restart(String),
}

impl FaultAction {
    /// True for faults the switch carries out (the rest go to the agent).
    pub fn is_network(&self) -> bool {
        matches!(self, FaultAction::Partition(_) | FaultAction::Heal)
    }

    /// The node names the action refers to.
    pub fn nodes(&self) -> Vec<&str> {
        match self {
            FaultAction::Partition(groups) => groups.iter().flatten().map(String::as_str).collect(),
            FaultAction::Heal => Vec::new(),
            FaultAction::Pause(node)
            | FaultAction::Resume(node)
            | FaultAction::Restart(node)
            | FaultAction::Kill { node, .. } => vec![node.as_str()],
        }
    }
}

impl std::fmt::Display for FaultAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FaultAction::Partition(groups) => {
                let groups: Vec<String> = groups.iter().map(|g| g.join(",")).collect();
                write!(f, "partition {}", groups.join(" | "))
            }
            FaultAction::Heal => write!(f, "heal"),
            FaultAction::Pause(node) => write!(f, "pause {node}"),
            FaultAction::Resume(node) => write!(f, "resume {node}"),
            FaultAction::Kill { node, signal } => write!(f, "kill {node} signal={signal}"),
            FaultAction::Restart(node) => write!(f, "restart {node}"),
        }
    }
}

/// One action at one virtual time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimedFault {
    pub at: VirtNanos,
    pub action: FaultAction,
}

/// Parses one fault string into its action and, with `for=`, the undoing action.
pub fn parse_fault(text: &str) -> Result<Vec<TimedFault>> {
    let context = || format!("fault {text:?}");
    let mut at = None;
    let mut duration = None;
    let mut signal = None;
    let mut words = Vec::new();
    for word in text.split_whitespace() {
        match word.split_once('=') {
            Some(("at", value)) => {
                at = Some(parse_duration(value).with_context(|| format!("{}: at=", context()))?)
            }
            Some(("for", value)) => {
                duration =
                    Some(parse_duration(value).with_context(|| format!("{}: for=", context()))?)
            }
            Some(("signal", value)) => {
                let n: i32 = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .with_context(|| {
                        format!(
                            "{}: signal={value} is not a signal number (1..64)",
                            context()
                        )
                    })?;
                signal = Some(n);
            }
            Some((key, _)) => bail!(
                "{}: unknown setting {key:?} (known: at=, for=, signal=)",
                context()
            ),
            None => words.push(word),
        }
    }
    let Some(at) = at else {
        bail!("{}: missing at=<time> (e.g. at=10s)", context());
    };
    let Some((&verb, args)) = words.split_first() else {
        bail!(
            "{}: no action (partition, heal, pause, resume, kill, restart)",
            context()
        );
    };
    let one_node = || -> Result<String> {
        match args {
            [node] => Ok(node.to_string()),
            _ => bail!("{}: {verb} takes exactly one node name", context()),
        }
    };
    let (action, undo) = match verb {
        "partition" => {
            let joined = args.join(" ");
            let groups: Vec<Vec<String>> = joined
                .split('|')
                .map(|group| {
                    group
                        .split(',')
                        .map(str::trim)
                        .filter(|n| !n.is_empty())
                        .map(String::from)
                        .collect::<Vec<_>>()
                })
                .collect();
            if groups.iter().any(Vec::is_empty) {
                bail!(
                    "{}: a partition group is empty (write groups as n1 | n2,n3)",
                    context()
                );
            }
            let mut seen = std::collections::BTreeSet::new();
            for name in groups.iter().flatten() {
                if !seen.insert(name) {
                    bail!("{}: node {name} is in two groups", context());
                }
            }
            (FaultAction::Partition(groups), Some(FaultAction::Heal))
        }
        "heal" => {
            if !args.is_empty() {
                bail!("{}: heal takes no arguments", context());
            }
            (FaultAction::Heal, None)
        }
        "pause" => {
            let node = one_node()?;
            (
                FaultAction::Pause(node.clone()),
                Some(FaultAction::Resume(node)),
            )
        }
        "resume" => (FaultAction::Resume(one_node()?), None),
        "kill" => (
            FaultAction::Kill {
                node: one_node()?,
                signal: signal.unwrap_or(libc::SIGKILL),
            },
            None,
        ),
        "restart" => (FaultAction::Restart(one_node()?), None),
        other => bail!(
            "{}: unknown action {other:?} (partition, heal, pause, resume, kill, restart)",
            context()
        ),
    };
    if signal.is_some() && !matches!(action, FaultAction::Kill { .. }) {
        bail!("{}: signal= only applies to kill", context());
    }
    let mut faults = vec![TimedFault { at, action }];
    match (duration, undo) {
        (Some(d), Some(undo)) => faults.push(TimedFault {
            at: VirtNanos(at.0.saturating_add(d.0)),
            action: undo,
        }),
        (Some(_), None) => bail!("{}: for= applies to partition and pause only", context()),
        (None, _) => {}
    }
    Ok(faults)
}

/// Parses every fault and orders them by time (faults at the same time keep
/// the order they were given in), checking node names against `nodes`.
pub fn schedule(texts: &[String], nodes: &[String]) -> Result<Vec<TimedFault>> {
    let mut all = Vec::new();
    for text in texts {
        for fault in parse_fault(text)? {
            for name in fault.action.nodes() {
                if !nodes.iter().any(|n| n == name) {
                    bail!(
                        "fault {text:?}: no node is named {name:?} (nodes: {})",
                        nodes.join(", ")
                    );
                }
            }
            all.push(fault);
        }
    }
    // A stable sort: same-time faults stay in the order given.
    all.sort_by_key(|f| f.at);
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> String {
        v.to_string()
    }

    #[test]
    fn test_partition_with_duration_heals_later() {
        let faults = parse_fault("at=10s partition n1 | n2,n3 for=15s").unwrap();
        assert_eq!(
            faults,
            vec![
                TimedFault {
                    at: VirtNanos(10_000_000_000),
                    action: FaultAction::Partition(vec![vec![s("n1")], vec![s("n2"), s("n3")]])
                },
                TimedFault {
                    at: VirtNanos(25_000_000_000),
                    action: FaultAction::Heal
                },
            ]
        );
    }

    #[test]
    fn test_pause_for_resumes_and_kill_takes_signal() {
        let faults = parse_fault("pause n2 at=30s for=5s").unwrap();
        assert_eq!(faults[0].action, FaultAction::Pause(s("n2")));
        assert_eq!(faults[1].action, FaultAction::Resume(s("n2")));
        assert_eq!(faults[1].at, VirtNanos(35_000_000_000));
        let kill = parse_fault("at=1s kill n1 signal=15").unwrap();
        assert_eq!(
            kill[0].action,
            FaultAction::Kill {
                node: s("n1"),
                signal: 15
            }
        );
        assert_eq!(
            parse_fault("at=1s kill n1").unwrap()[0].action,
            FaultAction::Kill {
                node: s("n1"),
                signal: 9
            }
        );
    }

    #[test]
    fn test_bad_faults_name_the_problem() {
        let err = |t: &str| format!("{:#}", parse_fault(t).unwrap_err());
        assert!(err("partition n1 | n2").contains("missing at="));
        assert!(err("at=1s explode n1").contains("unknown action \"explode\""));
        assert!(err("at=1s pause").contains("exactly one node"));
        assert!(err("at=1s partition n1 | | n2").contains("group is empty"));
        assert!(err("at=1s partition n1 | n1").contains("two groups"));
        assert!(err("at=1s restart n1 for=2s").contains("for= applies"));
        assert!(err("at=1s pause n1 signal=9").contains("only applies to kill"));
        assert!(err("at=1s kill n1 signal=99").contains("not a signal number"));
        assert!(err("at=soon heal").contains("at="));
        assert!(err("at=1s heal color=red").contains("unknown setting \"color\""));
    }

    #[test]
    fn test_schedule_orders_by_time_and_checks_names() {
        let nodes = vec![s("n1"), s("n2")];
        let faults = schedule(&[s("at=5s pause n1 for=10s"), s("at=7s kill n2")], &nodes).unwrap();
        let times: Vec<u64> = faults.iter().map(|f| f.at.0 / 1_000_000_000).collect();
        assert_eq!(times, vec![5, 7, 15]);
        let err = schedule(&[s("at=1s pause n9")], &nodes).unwrap_err();
        assert!(err.to_string().contains("no node is named \"n9\""));
    }
}
