//! The switch's faults: what a scheduled change of the network is, which
//! directed links it blocks, and the link overrides it sets. Pure
//! functions of the fault and the ports; [`super::Switch`] applies them.
//!
//! Connectivity is a set of *blocked directed links* (from, to): a frame
//! on a blocked link is dropped. Faults change that set in two ways:
//! * [`Fault::Partition`], [`Fault::Bridge`] and [`Fault::MajoritiesRing`]
//!   are whole-network shapes: each *replaces* the set (as a partition
//!   always replaced the one before it);
//! * [`Fault::Block`] adds links (a cut, both ways, or a one-way
//!   partition) and [`Fault::Unblock`] removes them, leaving every other
//!   link alone; [`Fault::Heal`] clears the set.
//!
//! [`Fault::Slow`] and [`Fault::Loss`] do not block anything: they override
//! the latency or the loss probability of every link to and from one port
//! (`None` ends the override).

use super::{LatencyDist, PortId, SwitchError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A scheduled change of the network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// Only ports in the same group can talk; unlisted ports form one more
    /// group together. Replaces the blocked links.
    Partition(Vec<Vec<PortId>>),
    /// Every link is unblocked.
    Heal,
    /// Blocks the links from every port of `from` to every port of `to`
    /// (and back, if `both_ways`), in addition to those blocked already.
    Block(Links<PortId>),
    /// Unblocks those links; every other link stays as it is.
    Unblock(Links<PortId>),
    /// Jepsen's `bridge` over these ports in order: the first `n/2` and the
    /// last `n - n/2 - 1` cannot talk; the port between talks to all.
    /// Replaces the blocked links.
    Bridge(Vec<PortId>),
    /// Jepsen's `majorities-ring` over these ports in ring order: each port
    /// talks to those within `ceil(floor(n/2) / 2)` steps around the ring,
    /// a majority different for every port. Replaces the blocked links.
    MajoritiesRing(Vec<PortId>),
    /// Frames to or from `port` take this latency instead of their link's
    /// (`None`: the link's again).
    Slow {
        port: PortId,
        latency: Option<LatencyDist>,
    },
    /// Frames to or from `port` are lost with this probability instead of
    /// their link's (`None`: the link's again).
    Loss {
        port: PortId,
        loss: Option<Probability>,
    },
}

/// Directed links: from every one of `from` to every one of `to`, and with
/// `both_ways` back too. The same shape names nodes in the fault text
/// (`n1 <-> n2,n3`, `n1 -> n2`) and ports on the switch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Links<T> {
    pub from: Vec<T>,
    pub to: Vec<T>,
    pub both_ways: bool,
}

impl<T: PartialEq> Links<T> {
    /// Whether the directed link `a` -> `b` is one of these.
    pub fn contains(&self, a: &T, b: &T) -> bool {
        let one_way = |x: &T, y: &T| self.from.contains(x) && self.to.contains(y);
        one_way(a, b) || (self.both_ways && one_way(b, a))
    }

    /// The same links over other names (`None` if one has none).
    pub fn try_map<U>(&self, mut f: impl FnMut(&T) -> Option<U>) -> Option<Links<U>> {
        Some(Links {
            from: self.from.iter().map(&mut f).collect::<Option<_>>()?,
            to: self.to.iter().map(&mut f).collect::<Option<_>>()?,
            both_ways: self.both_ways,
        })
    }
}

/// A probability in `0.0..=1.0`, compared bit for bit (so it is `Eq`), and
/// saved as the string of its shortest round-trip notation (see the
/// switch's module documentation).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Probability(#[serde(with = "super::config::exact_f64")] f64);

impl Probability {
    /// `p` if it is a number in `0.0..=1.0`.
    pub fn new(p: f64) -> Result<Self, SwitchError> {
        if (0.0..=1.0).contains(&p) {
            Ok(Probability(p))
        } else {
            Err(SwitchError::InvalidConfig {
                reason: format!("probability {p} is not in 0..=1"),
            })
        }
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

impl PartialEq for Probability {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Probability {}

/// Rust's shortest round-trip notation (`0.3`, `1`, `0.000001`).
impl fmt::Display for Probability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for Probability {
    type Err = SwitchError;

    fn from_str(text: &str) -> Result<Self, SwitchError> {
        let p: f64 = text.parse().map_err(|_| SwitchError::InvalidConfig {
            reason: format!("{text:?} is not a probability (a number in 0..=1)"),
        })?;
        Probability::new(p)
    }
}

impl Fault {
    /// Whether, once applied, this fault blocks the link `from` -> `to`.
    pub fn blocks(&self, from: PortId, to: PortId) -> bool {
        if from == to {
            return false;
        }
        match self {
            Fault::Partition(groups) => separated(groups, from, to),
            Fault::Block(links) => links.contains(&from, &to),
            Fault::Bridge(order) => bridge_blocks(order, from, to),
            Fault::MajoritiesRing(order) => ring_blocks(order, from, to),
            Fault::Heal | Fault::Unblock(_) | Fault::Slow { .. } | Fault::Loss { .. } => false,
        }
    }

    /// Whether the links this fault blocks replace those blocked before it
    /// (whole-network shapes) rather than add to them.
    pub fn replaces_blocked(&self) -> bool {
        matches!(
            self,
            Fault::Partition(_) | Fault::Bridge(_) | Fault::MajoritiesRing(_) | Fault::Heal
        )
    }

    /// Every port the fault names.
    pub fn ports(&self) -> Vec<PortId> {
        match self {
            Fault::Partition(groups) => groups.iter().flatten().copied().collect(),
            Fault::Heal => Vec::new(),
            Fault::Block(links) | Fault::Unblock(links) => {
                links.from.iter().chain(&links.to).copied().collect()
            }
            Fault::Bridge(order) | Fault::MajoritiesRing(order) => order.clone(),
            Fault::Slow { port, .. } | Fault::Loss { port, .. } => vec![*port],
        }
    }

    /// Checks what the switch cannot repair: a port in two partition groups
    /// or twice in a topology's order, a malformed latency.
    pub fn validate(&self) -> Result<(), SwitchError> {
        match self {
            Fault::Partition(groups) => no_repeats(groups.iter().flatten()),
            Fault::Bridge(order) | Fault::MajoritiesRing(order) => no_repeats(order.iter()),
            Fault::Slow {
                latency: Some(latency),
                ..
            } => latency.validate(),
            _ => Ok(()),
        }
    }
}

fn no_repeats<'a>(ports: impl Iterator<Item = &'a PortId>) -> Result<(), SwitchError> {
    let mut seen = Vec::new();
    for &port in ports {
        if seen.contains(&port) {
            return Err(SwitchError::PortInTwoGroups { port });
        }
        seen.push(port);
    }
    Ok(())
}

/// The group `port` is in under `groups`: its index, or `None` for the
/// implicit group of unlisted ports. The first group listing it wins.
fn group_of(groups: &[Vec<PortId>], port: PortId) -> Option<usize> {
    groups.iter().position(|group| group.contains(&port))
}

fn separated(groups: &[Vec<PortId>], a: PortId, b: PortId) -> bool {
    group_of(groups, a) != group_of(groups, b)
}

/// Jepsen's bridge: with `m = n/2 + 1` (a majority), the first `m - 1`
/// ports and the last `n - m` are cut apart; port `m - 1` (the last of the
/// majority) is the bridge. Ports not in `order` are left alone.
fn bridge_blocks(order: &[PortId], a: PortId, b: PortId) -> bool {
    let bridge = order.len() / 2;
    let (Some(i), Some(j)) = (position(order, a), position(order, b)) else {
        return false;
    };
    (i < bridge && j > bridge) || (j < bridge && i > bridge)
}

/// Each port sees those within `ceil(floor(n/2) / 2)` steps around the
/// ring: itself plus at least `floor(n/2)` others, a majority, and no two
/// ports see the same majority (from 4 ports up; below that every port
/// sees every other). Symmetric, so every blocked link is blocked both ways.
fn ring_blocks(order: &[PortId], a: PortId, b: PortId) -> bool {
    let n = order.len();
    let reach = (n / 2).div_ceil(2);
    let (Some(i), Some(j)) = (position(order, a), position(order, b)) else {
        return false;
    };
    let d = i.abs_diff(j);
    d.min(n - d) > reach
}

fn position(order: &[PortId], port: PortId) -> Option<usize> {
    order.iter().position(|&p| p == port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports(n: usize) -> Vec<PortId> {
        (0..n).map(PortId).collect()
    }

    /// Who each port can talk to under `fault`, as port numbers.
    fn reachable(fault: &Fault, n: usize) -> Vec<Vec<usize>> {
        let all = ports(n);
        all.iter()
            .map(|&a| {
                all.iter()
                    .filter(|&&b| b != a && !fault.blocks(a, b))
                    .map(|b| b.0)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn test_bridge_of_five_keeps_the_middle_node_talking_to_both_halves() {
        let bridge = Fault::Bridge(ports(5));
        assert_eq!(
            reachable(&bridge, 5),
            [
                vec![1, 2],
                vec![0, 2],
                vec![0, 1, 3, 4],
                vec![2, 4],
                vec![2, 3]
            ]
        );
        // Four: 0,1 | 3 with 2 the bridge; ...
        assert_eq!(
            reachable(&Fault::Bridge(ports(4)), 4),
            [vec![1, 2], vec![0, 2], vec![0, 1, 3], vec![2]]
        );
        // ... two nodes: nothing to cut.
        assert_eq!(reachable(&Fault::Bridge(ports(2)), 2), [vec![1], vec![0]]);
    }

    #[test]
    fn test_majorities_ring_gives_every_node_a_different_majority() {
        for n in 4..=7 {
            let ring = Fault::MajoritiesRing(ports(n));
            let seen = reachable(&ring, n);
            let mut views: Vec<Vec<usize>> = Vec::new();
            for (i, others) in seen.iter().enumerate() {
                assert!(others.len() + 1 > n / 2, "n={n}: {i} sees {others:?}");
                assert!(others.len() + 1 < n, "n={n}: {i} sees everyone");
                let mut view = others.clone();
                view.push(i);
                view.sort();
                assert!(!views.contains(&view), "n={n}: {view:?} twice");
                views.push(view);
            }
            for a in ports(n) {
                for b in ports(n) {
                    assert_eq!(ring.blocks(a, b), ring.blocks(b, a), "symmetric");
                }
            }
        }
        assert_eq!(
            reachable(&Fault::MajoritiesRing(ports(5)), 5),
            [vec![1, 4], vec![0, 2], vec![1, 3], vec![2, 4], vec![0, 3]]
        );
    }

    #[test]
    fn test_block_is_directed_unless_both_ways() {
        let one_way = Links {
            from: vec![PortId(0)],
            to: vec![PortId(1), PortId(2)],
            both_ways: false,
        };
        let cut = Fault::Block(Links {
            both_ways: true,
            ..one_way.clone()
        });
        let one_way = Fault::Block(one_way);
        assert!(one_way.blocks(PortId(0), PortId(2)));
        assert!(!one_way.blocks(PortId(2), PortId(0)));
        assert!(cut.blocks(PortId(2), PortId(0)));
        // Links within one side stay up.
        assert!(!cut.blocks(PortId(1), PortId(2)));
        assert!(!one_way.replaces_blocked() && Fault::Heal.replaces_blocked());
    }

    #[test]
    fn test_faults_with_a_repeated_port_are_refused() {
        let twice = [
            Fault::Partition(vec![vec![PortId(1)], vec![PortId(1)]]),
            Fault::Bridge(vec![PortId(1), PortId(2), PortId(1)]),
            Fault::MajoritiesRing(vec![PortId(3), PortId(3)]),
        ];
        for fault in twice {
            assert!(
                matches!(fault.validate(), Err(SwitchError::PortInTwoGroups { .. })),
                "{fault:?}"
            );
        }
    }

    #[test]
    fn test_probability_is_checked_and_prints_back() {
        assert!("1.5".parse::<Probability>().is_err());
        assert!("NaN".parse::<Probability>().is_err());
        assert!("lots".parse::<Probability>().is_err());
        for text in ["0", "1", "0.3", "0.30000000000000004", "0.000001"] {
            let p: Probability = text.parse().unwrap();
            assert_eq!(p.to_string().parse::<Probability>().unwrap(), p);
        }
        let json = serde_json::to_string(&Probability::new(0.1 + 0.2).unwrap()).unwrap();
        assert_eq!(json, r#""0.30000000000000004""#);
    }
}
