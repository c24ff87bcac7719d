//! The network faults' half of the fault grammar: their words, their text
//! and what each is on the switch ([`NetworkFault::to_switch`], and back
//! for announcements, [`NetworkFault::from_switch`]).
//!
//! ```text
//! partition <nodes> | <nodes> [| ...]   groups; nodes in no group form one more
//! partition <nodes> -> <nodes>          one way: frames from the left to the right are dropped
//! cut <nodes> <-> <nodes>               both ways, between the two sides only
//! bridge                                Jepsen's bridge over the run's nodes, in order
//! majorities-ring                       Jepsen's majorities-ring over them, in order
//! heal                                  every link up again
//! heal <nodes> <-> <nodes>              those links up again (also `->`), the rest as they are
//! slow <node> latency=<d>[..<d>]        every link to and from the node: that latency
//! slow <node> off
//! loss <node> <probability>             every link to and from the node: that loss
//! loss <node> off
//! ```
//!
//! `for=` undoes: `partition` (either form), `bridge` and `majorities-ring`
//! with `heal`, `cut A <-> B` with `heal A <-> B`, `slow`/`loss` with their
//! `off`.

use devices::switch::{Fault as SwitchFault, Links, Probability};
use devices::{LatencyDist, PortId, VirtNanos};
use std::fmt;

/// A network fault naming a node the run has no switch port for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fault {fault}: no node {name:?}")]
pub struct NoPortError {
    pub fault: Box<NetworkFault>,
    pub name: String,
}

/// A slow node's latency: fixed (`min == max`) or uniform over `min..=max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyRange {
    pub min: VirtNanos,
    pub max: VirtNanos,
}

/// Why the words of a network action are not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkActionError {
    #[error("a partition group is empty (write groups as n1 | n2,n3)")]
    EmptyGroup,
    #[error("node {name} is in two groups")]
    TwoGroups { name: String },
    #[error("{verb} takes no arguments")]
    NoArguments { verb: String },
    #[error("{verb} needs nodes on both sides of {arrow} (e.g. n1 {arrow} n2,n3)")]
    EmptySide { verb: String, arrow: &'static str },
    #[error("groups (|) and {arrow} do not mix")]
    GroupsAndArrow { arrow: &'static str },
    #[error("node {name} is on both sides of {arrow}")]
    BothSides { name: String, arrow: &'static str },
    #[error("cut is both ways: cut n1 <-> n2 (one way: partition n1 -> n2)")]
    CutArrow,
    #[error(
        "partition takes groups (n1 | n2) or one direction (n1 -> n2); both ways is cut n1 <-> n2"
    )]
    PartitionArrow,
    #[error("{verb} takes one node and {what}, or off")]
    NodeAndValue { verb: String, what: &'static str },
    #[error("latency=")]
    Latency(#[source] devices::DurationError),
    #[error("latency={text}: the minimum is above the maximum")]
    LatencyOrder { text: String },
    #[error("latency={text}: above the largest latency, {}", devices::MAX_LATENCY)]
    LatencyTooLong { text: String },
    #[error("latency= only applies to slow")]
    LatencyNotSlow,
    #[error("loss {text}: not a probability (a number in 0..=1)")]
    Probability { text: String },
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

type Result<T, E = NetworkActionError> = std::result::Result<T, E>;

/// The verbs this module parses.
pub(super) const NETWORK_VERBS: [&str; 6] = [
    "partition",
    "heal",
    "cut",
    "bridge",
    "majorities-ring",
    "slow",
];

impl NetworkFault {
    /// Whether `verb` is a network fault's.
    pub(super) fn is_verb(verb: &str) -> bool {
        NETWORK_VERBS.contains(&verb) || verb == "loss"
    }

    /// The action `verb args [latency=..]` (`latency` is the value of a
    /// `latency=` setting, if there was one).
    pub(super) fn parse(verb: &str, args: &[&str], latency: Option<&str>) -> Result<Self> {
        if latency.is_some() && verb != "slow" {
            return Err(NetworkActionError::LatencyNotSlow);
        }
        let joined = args.join(" ");
        let no_arguments = |fault: NetworkFault| {
            if args.is_empty() {
                Ok(fault)
            } else {
                Err(NetworkActionError::NoArguments {
                    verb: verb.to_owned(),
                })
            }
        };
        Ok(match verb {
            "partition" if joined.contains("<->") => {
                return Err(NetworkActionError::PartitionArrow)
            }
            "partition" if joined.contains("->") => NetworkFault::Cut(links(verb, &joined, false)?),
            "partition" => NetworkFault::Partition(groups(&joined)?),
            "cut" if joined.contains("<->") => NetworkFault::Cut(links(verb, &joined, true)?),
            "cut" => return Err(NetworkActionError::CutArrow),
            "heal" if args.is_empty() => NetworkFault::Heal,
            "heal" => NetworkFault::HealLinks(links(verb, &joined, joined.contains("<->"))?),
            "bridge" => no_arguments(NetworkFault::Bridge)?,
            "majorities-ring" => no_arguments(NetworkFault::MajoritiesRing)?,
            "slow" => {
                let (node, off) = node_and_value(verb, args, "latency=<duration>[..<duration>]")?;
                let latency = match (off, latency) {
                    (true, None) => None,
                    (false, Some(text)) if args.len() == 1 => Some(LatencyRange::parse(text)?),
                    _ => {
                        return Err(NetworkActionError::NodeAndValue {
                            verb: verb.to_owned(),
                            what: "latency=<duration>[..<duration>]",
                        })
                    }
                };
                NetworkFault::Slow { node, latency }
            }
            _ => {
                let (node, off) = node_and_value(verb, args, "a probability")?;
                let loss = match args {
                    _ if off => None,
                    [_, text] => Some(text.parse::<Probability>().map_err(|_| {
                        NetworkActionError::Probability {
                            text: (*text).to_owned(),
                        }
                    })?),
                    _ => {
                        return Err(NetworkActionError::NodeAndValue {
                            verb: verb.to_owned(),
                            what: "a probability",
                        })
                    }
                };
                NetworkFault::Loss { node, loss }
            }
        })
    }

    /// The node names the fault refers to.
    pub fn nodes(&self) -> Vec<&str> {
        match self {
            NetworkFault::Partition(groups) => {
                groups.iter().flatten().map(String::as_str).collect()
            }
            NetworkFault::Cut(links) | NetworkFault::HealLinks(links) => links
                .from
                .iter()
                .chain(&links.to)
                .map(String::as_str)
                .collect(),
            NetworkFault::Slow { node, .. } | NetworkFault::Loss { node, .. } => vec![node],
            NetworkFault::Heal | NetworkFault::Bridge | NetworkFault::MajoritiesRing => Vec::new(),
        }
    }

    /// The fault `for=` schedules after this one, if it has one.
    pub(super) fn undo(&self) -> Option<NetworkFault> {
        match self {
            NetworkFault::Partition(_) | NetworkFault::Bridge | NetworkFault::MajoritiesRing => {
                Some(NetworkFault::Heal)
            }
            // A one-way partition is a cut one way: healed the same way.
            NetworkFault::Cut(links) => Some(NetworkFault::HealLinks(links.clone())),
            NetworkFault::Slow {
                node,
                latency: Some(_),
            } => Some(NetworkFault::Slow {
                node: node.clone(),
                latency: None,
            }),
            NetworkFault::Loss {
                node,
                loss: Some(_),
            } => Some(NetworkFault::Loss {
                node: node.clone(),
                loss: None,
            }),
            _ => None,
        }
    }

    /// The fault as the switch schedules it: node `i` of `node_names` is on
    /// switch port `ports[i]` (its NIC). `bridge` and `majorities-ring` are
    /// over every node, in the run's order.
    pub fn to_switch(
        &self,
        node_names: &[String],
        ports: &[PortId],
    ) -> Result<SwitchFault, NoPortError> {
        let port = |name: &String| {
            node_names
                .iter()
                .position(|n| n == name)
                .and_then(|index| ports.get(index).copied())
                .ok_or_else(|| NoPortError {
                    fault: Box::new(self.clone()),
                    name: name.clone(),
                })
        };
        let ports_of = |links: &Links<String>| -> Result<Links<PortId>, NoPortError> {
            Ok(Links {
                from: links.from.iter().map(port).collect::<Result<_, _>>()?,
                to: links.to.iter().map(port).collect::<Result<_, _>>()?,
                both_ways: links.both_ways,
            })
        };
        let all: Vec<PortId> = ports.iter().take(node_names.len()).copied().collect();
        Ok(match self {
            NetworkFault::Partition(groups) => SwitchFault::Partition(
                groups
                    .iter()
                    .map(|group| group.iter().map(port).collect::<Result<Vec<_>, _>>())
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            NetworkFault::Heal => SwitchFault::Heal,
            NetworkFault::Cut(links) => SwitchFault::Block(ports_of(links)?),
            NetworkFault::HealLinks(links) => SwitchFault::Unblock(ports_of(links)?),
            NetworkFault::Bridge => SwitchFault::Bridge(all),
            NetworkFault::MajoritiesRing => SwitchFault::MajoritiesRing(all),
            NetworkFault::Slow { node, latency } => SwitchFault::Slow {
                port: port(node)?,
                latency: latency.map(LatencyRange::to_dist),
            },
            NetworkFault::Loss { node, loss } => SwitchFault::Loss {
                port: port(node)?,
                loss: *loss,
            },
        })
    }

    /// The inverse of [`NetworkFault::to_switch`] (`None`: a port of no
    /// node, or a switch fault no text names).
    pub fn from_switch(
        fault: &SwitchFault,
        node_names: &[String],
        ports: &[PortId],
    ) -> Option<NetworkFault> {
        let name = |port: &PortId| {
            let index = ports.iter().position(|p| p == port)?;
            node_names.get(index).cloned()
        };
        Some(match fault {
            SwitchFault::Partition(groups) => NetworkFault::Partition(
                groups
                    .iter()
                    .map(|group| group.iter().map(name).collect::<Option<Vec<_>>>())
                    .collect::<Option<Vec<_>>>()?,
            ),
            SwitchFault::Heal => NetworkFault::Heal,
            SwitchFault::Block(links) => NetworkFault::Cut(links.try_map(name)?),
            SwitchFault::Unblock(links) => NetworkFault::HealLinks(links.try_map(name)?),
            SwitchFault::Bridge(_) => NetworkFault::Bridge,
            SwitchFault::MajoritiesRing(_) => NetworkFault::MajoritiesRing,
            SwitchFault::Slow { port, latency } => NetworkFault::Slow {
                node: name(port)?,
                latency: match latency {
                    Some(dist) => Some(LatencyRange::from_dist(dist)?),
                    None => None,
                },
            },
            SwitchFault::Loss { port, loss } => NetworkFault::Loss {
                node: name(port)?,
                loss: *loss,
            },
        })
    }
}

/// `n1,n2 | n3`: groups, none empty, no node twice.
fn groups(text: &str) -> Result<Vec<Vec<String>>> {
    let groups: Vec<Vec<String>> = text.split('|').map(names).collect();
    if groups.iter().any(Vec::is_empty) {
        return Err(NetworkActionError::EmptyGroup);
    }
    let mut seen = std::collections::BTreeSet::new();
    for name in groups.iter().flatten() {
        if !seen.insert(name) {
            return Err(NetworkActionError::TwoGroups { name: name.clone() });
        }
    }
    Ok(groups)
}

fn names(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect()
}

/// `n1 <-> n2,n3` (`both_ways`) or `n1 -> n2,n3`.
fn links(verb: &str, text: &str, both_ways: bool) -> Result<Links<String>> {
    let arrow = if both_ways { "<->" } else { "->" };
    if text.contains('|') {
        return Err(NetworkActionError::GroupsAndArrow { arrow });
    }
    let (from, to) = text.split_once(arrow).unwrap_or((text, ""));
    let (from, to) = (names(from), names(to));
    if from.is_empty() || to.is_empty() || to.join(",").contains('>') {
        return Err(NetworkActionError::EmptySide {
            verb: verb.to_owned(),
            arrow,
        });
    }
    if let Some(name) = from.iter().find(|name| to.contains(name)) {
        return Err(NetworkActionError::BothSides {
            name: name.clone(),
            arrow,
        });
    }
    Ok(Links {
        from,
        to,
        both_ways,
    })
}

/// `<node> <value>` or `<node> off`: the node, and whether it is `off`.
fn node_and_value(verb: &str, args: &[&str], what: &'static str) -> Result<(String, bool)> {
    match args {
        [node, "off"] => Ok(((*node).to_owned(), true)),
        [node] | [node, _] => Ok(((*node).to_owned(), false)),
        _ => Err(NetworkActionError::NodeAndValue {
            verb: verb.to_owned(),
            what,
        }),
    }
}

impl LatencyRange {
    /// `200ms` or `200ms..800ms`, in the one duration grammar.
    fn parse(text: &str) -> Result<Self> {
        let parse = |t: &str| t.parse::<VirtNanos>().map_err(NetworkActionError::Latency);
        let (min, max) = match text.split_once("..") {
            Some((min, max)) => (parse(min)?, parse(max)?),
            None => {
                let d = parse(text)?;
                (d, d)
            }
        };
        if min > max {
            return Err(NetworkActionError::LatencyOrder {
                text: text.to_owned(),
            });
        }
        if max > devices::MAX_LATENCY {
            return Err(NetworkActionError::LatencyTooLong {
                text: text.to_owned(),
            });
        }
        Ok(LatencyRange { min, max })
    }

    fn to_dist(self) -> LatencyDist {
        if self.min == self.max {
            LatencyDist::Fixed(self.min)
        } else {
            LatencyDist::Uniform {
                min: self.min,
                max: self.max,
            }
        }
    }

    fn from_dist(dist: &LatencyDist) -> Option<Self> {
        match *dist {
            LatencyDist::Fixed(d) => Some(LatencyRange { min: d, max: d }),
            // Bounds the wrong way round sample as if swapped (see LatencyDist).
            LatencyDist::Uniform { min, max } => Some(LatencyRange {
                min: min.min(max),
                max: min.max(max),
            }),
            LatencyDist::Normal { .. } => None,
        }
    }
}

impl fmt::Display for LatencyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}..{}", self.min, self.max)
        }
    }
}

fn links_text(links: &Links<String>) -> String {
    let arrow = if links.both_ways { "<->" } else { "->" };
    format!("{} {arrow} {}", links.from.join(","), links.to.join(","))
}

impl fmt::Display for NetworkFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetworkFault::Partition(groups) => {
                let groups: Vec<String> = groups.iter().map(|g| g.join(",")).collect();
                write!(f, "partition {}", groups.join(" | "))
            }
            NetworkFault::Heal => write!(f, "heal"),
            NetworkFault::Cut(links) if links.both_ways => write!(f, "cut {}", links_text(links)),
            NetworkFault::Cut(links) => write!(f, "partition {}", links_text(links)),
            NetworkFault::HealLinks(links) => write!(f, "heal {}", links_text(links)),
            NetworkFault::Bridge => write!(f, "bridge"),
            NetworkFault::MajoritiesRing => write!(f, "majorities-ring"),
            NetworkFault::Slow {
                node,
                latency: Some(latency),
            } => write!(f, "slow {node} latency={latency}"),
            NetworkFault::Slow {
                node,
                latency: None,
            } => write!(f, "slow {node} off"),
            NetworkFault::Loss {
                node,
                loss: Some(loss),
            } => write!(f, "loss {node} {loss}"),
            NetworkFault::Loss { node, loss: None } => write!(f, "loss {node} off"),
        }
    }
}
