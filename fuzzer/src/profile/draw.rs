//! The draw of one slice's faults from a profile and a seed.
//!
//! Deterministic in the seed alone: each category draws from its own
//! ChaCha20 stream, keyed by [`vmm::entropy::stream_key`] under the name
//! `fault-profile/<category>` (so changing one category's settings never
//! shifts another's draws), with integer arithmetic only (rates become a
//! fixed threshold per [`TICK`]), so one seed gives the same faults on every
//! host. The draw builds [`FaultAction`]s; their text is the fault
//! grammar's printer's.

use super::span::Span;
use super::{FaultProfile, Ppm};
use devices::switch::{Links, Probability};
use devices::VirtNanos;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use run::faults::{
    DiskFault, Fault, FaultAction, FaultTime, LatencyRange, NetworkFault, NodeFault,
};
use std::collections::BTreeMap;

/// The stem of the streams' names (`fault-profile/network`, ...).
pub const FAULT_PROFILE_STREAM: &str = "fault-profile";

/// The step of the arrival process: each tick of a slice starts a fault of
/// a category with probability `rate * TICK` (a Bernoulli approximation of
/// a Poisson process at `rate` per second). A slice's last partial tick
/// starts nothing.
pub const TICK: VirtNanos = VirtNanos(10_000_000);

/// Fault times are whole milliseconds after the branch point.
const GRAIN: u64 = 1_000_000;

struct Stream(ChaCha20Rng);

impl Stream {
    fn new(seed: u64, category: &str) -> Self {
        let name = format!("{FAULT_PROFILE_STREAM}/{category}");
        Stream(ChaCha20Rng::from_seed(vmm::entropy::stream_key(
            seed, &name,
        )))
    }

    /// Uniform in `0..n` (`n > 0`), by rejection: no modulo bias.
    fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.0.next_u64();
            if x < zone {
                return x % n;
            }
        }
    }

    /// Uniform in `min..=max`.
    fn between(&mut self, min: u64, max: u64) -> u64 {
        match (max - min).checked_add(1) {
            Some(n) => min + self.below(n),
            None => self.0.next_u64(),
        }
    }

    fn coin(&mut self) -> bool {
        self.0.next_u64() & 1 == 1
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// A duration in `span`, in whole milliseconds (microseconds,
    /// nanoseconds) when both bounds are.
    fn duration(&mut self, span: Span<VirtNanos>) -> VirtNanos {
        let grain = [GRAIN, 1_000, 1]
            .into_iter()
            .find(|g| span.min.0.is_multiple_of(*g) && span.max.0.is_multiple_of(*g))
            .unwrap_or(1);
        VirtNanos(self.between(span.min.0 / grain, span.max.0 / grain) * grain)
    }

    /// The starts of a category's faults in a slice, in order.
    fn arrivals(&mut self, rate: f64, slice: VirtNanos) -> Vec<u64> {
        let p = rate * (TICK.0 as f64 / 1e9);
        // 2^64 * p, saturating (an exact product of IEEE doubles).
        let threshold = (p * 18_446_744_073_709_551_616.0) as u64;
        let mut starts = Vec::new();
        for tick in 0..slice.0 / TICK.0 {
            if self.0.next_u64() < threshold {
                starts.push(tick * TICK.0 + self.below(TICK.0 / GRAIN) * GRAIN);
            }
        }
        starts
    }
}

/// The windows each lane (a node's pause/kill state, the network's
/// topology, a node's disk...) is taken for: two faults of one lane never
/// overlap, since one would undo the other (a `heal` heals every
/// partition; a `resume` ends every pause).
#[derive(Default)]
struct Lanes(BTreeMap<String, Vec<(u64, u64)>>);

impl Lanes {
    /// Takes `lanes` for `start..=end` if they are all free then.
    fn take(&mut self, lanes: &[String], start: u64, end: u64) -> bool {
        let busy = lanes.iter().any(|lane| {
            self.0
                .get(lane)
                .is_some_and(|windows| windows.iter().any(|&(s, e)| s <= end && start <= e))
        });
        if busy {
            return false;
        }
        for lane in lanes {
            self.0.entry(lane.clone()).or_default().push((start, end));
        }
        true
    }
}

/// Who faults may name.
struct Targets<'a> {
    /// Every node of the run, in its order.
    all: &'a [String],
    /// Those not excluded.
    eligible: Vec<&'a String>,
    /// Those not excluded that have disks.
    with_disks: Vec<&'a String>,
}

impl<'a> Targets<'a> {
    /// `names` in the run's order.
    fn in_run_order(&self, names: &mut [&'a String]) {
        names.sort_by_key(|n| self.all.iter().position(|a| a == *n));
    }

    fn owned(names: &[&String]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }
}

/// What one slice's draw is building.
struct Slice<'a> {
    targets: Targets<'a>,
    /// Faults end (heal) no later than this offset.
    last: u64,
    lanes: Lanes,
    /// (offset, fault), in the order drawn.
    faults: Vec<(u64, Fault)>,
}

/// `action` `start` after the branch point, lasting `lasting`.
fn fault(start: u64, action: FaultAction, lasting: Option<u64>) -> (u64, Fault) {
    let fault = Fault {
        at: FaultTime::AfterBranch(VirtNanos(start)),
        action,
        lasting: lasting.map(VirtNanos),
    };
    (start, fault)
}

fn node_fault(fault: NodeFault) -> FaultAction {
    FaultAction::Node(fault)
}

impl Slice<'_> {
    /// `duration`, cut short so the fault ends by the slice's last
    /// millisecond; `None` if nothing is left of it.
    fn fit(&self, start: u64, duration: VirtNanos) -> Option<u64> {
        let d = duration.0.min(self.last.saturating_sub(start));
        (d > 0).then_some(d)
    }

    /// Adds `action for=d` at `start` if its lanes are free.
    fn lasting(&mut self, lanes: &[String], start: u64, d: u64, action: FaultAction) {
        if self.lanes.take(lanes, start, start + d) {
            self.faults.push(fault(start, action, Some(d)));
        }
    }

    /// Adds `action` at `start`, then `then` `d` later, if the lanes are free.
    fn pair(&mut self, lanes: &[String], start: u64, d: u64, action: NodeFault, then: NodeFault) {
        if self.lanes.take(lanes, start, start + d) {
            self.faults.push(fault(start, node_fault(action), None));
            self.faults.push(fault(start + d, node_fault(then), None));
        }
    }

    fn instant(&mut self, lanes: &[String], start: u64, action: NodeFault) {
        if self.lanes.take(lanes, start, start) {
            self.faults.push(fault(start, node_fault(action), None));
        }
    }
}

/// Picks one of `kinds` (kind, weight, possible now) by weight.
fn choose<K: Copy>(stream: &mut Stream, kinds: &[(K, u32, bool)]) -> Option<K> {
    let total: u64 = kinds.iter().filter(|k| k.2).map(|k| u64::from(k.1)).sum();
    if total == 0 {
        return None;
    }
    let mut r = stream.below(total);
    for &(kind, weight, possible) in kinds {
        if !possible {
            continue;
        }
        if r < u64::from(weight) {
            return Some(kind);
        }
        r -= u64::from(weight);
    }
    None
}

#[derive(Clone, Copy)]
enum Network {
    Partition,
    Cut,
    OneWay,
    Bridge,
    Ring,
    Slow,
    Loss,
}

#[derive(Clone, Copy)]
enum Node {
    Pause,
    Kill,
    Restart,
    Crash,
}

#[derive(Clone, Copy)]
enum Clock {
    Step,
    Drift,
}

#[derive(Clone, Copy)]
enum Disk {
    FsyncDelay,
    FsyncError,
    Full,
}

fn lane(kind: &str, node: &str) -> String {
    format!("{kind}:{node}")
}

impl FaultProfile {
    /// The faults of one slice of `slice` virtual time after a branch
    /// point, drawn from `seed`: each `at=+<offset>` from the branch point
    /// ([`FaultTime::AfterBranch`]), ordered by offset. `nodes` are the run's nodes in its order;
    /// `nodes_with_disks` those with a disk.
    ///
    /// Every fault starts inside the slice and is undone inside it: a
    /// fault with a duration carries `for=` (cut short to end by the
    /// slice's last millisecond), a kill or crash is followed by the
    /// node's `restart`. Clock steps stay (they are steps). A fault that
    /// would overlap another of its lane (the network's topology, a node's
    /// process, its drift, its disk's FLUSH mode or fill, a node's slow or
    /// lossy links) is left out, so one fault never undoes another early.
    pub fn draw(
        &self,
        seed: u64,
        slice: VirtNanos,
        nodes: &[String],
        nodes_with_disks: &[String],
    ) -> Vec<Fault> {
        let eligible: Vec<&String> = nodes.iter().filter(|n| !self.exclude.contains(n)).collect();
        let with_disks = eligible
            .iter()
            .copied()
            .filter(|n| nodes_with_disks.contains(n))
            .collect();
        let mut s = Slice {
            targets: Targets {
                all: nodes,
                eligible,
                with_disks,
            },
            last: slice.0.saturating_sub(GRAIN),
            lanes: Lanes::default(),
            faults: Vec::new(),
        };
        if self.network.enabled {
            self.draw_network(&mut Stream::new(seed, "network"), slice, &mut s);
        }
        if self.node.enabled {
            self.draw_node(&mut Stream::new(seed, "node"), slice, &mut s);
        }
        if self.clock.enabled {
            self.draw_clock(&mut Stream::new(seed, "clock"), slice, &mut s);
        }
        if self.disk.enabled {
            self.draw_disk(&mut Stream::new(seed, "disk"), slice, &mut s);
        }
        // Stable: faults at one offset keep the order drawn.
        s.faults.sort_by_key(|(at, _)| *at);
        s.faults.into_iter().map(|(_, fault)| fault).collect()
    }

    fn draw_network(&self, stream: &mut Stream, slice: VirtNanos, s: &mut Slice) {
        let p = &self.network;
        let w = &p.weights;
        let eligible = s.targets.eligible.len();
        let all = s.targets.all.len();
        let kinds = [
            (Network::Partition, w.partition, eligible >= 2),
            (Network::Cut, w.cut, eligible >= 2),
            (Network::OneWay, w.one_way, eligible >= 2),
            (Network::Bridge, w.bridge, all >= 3),
            // Below four nodes every node sees every other.
            (Network::Ring, w.majorities_ring, all >= 4),
            (Network::Slow, w.slow, eligible >= 1),
            (Network::Loss, w.loss, eligible >= 1),
        ];
        let net = ["net".to_owned()];
        for start in stream.arrivals(p.rate, slice) {
            let Some(kind) = choose(stream, &kinds) else {
                continue;
            };
            let duration = stream.duration(p.duration);
            let Some(d) = s.fit(start, duration) else {
                continue;
            };
            match kind {
                Network::Partition => {
                    let action = partition(stream, &s.targets);
                    s.lasting(&net, start, d, action);
                }
                Network::Cut | Network::OneWay => {
                    let (from, to) = two_sides(stream, &s.targets);
                    let links = Links {
                        from,
                        to,
                        both_ways: matches!(kind, Network::Cut),
                    };
                    s.lasting(&net, start, d, network(NetworkFault::Cut(links)));
                }
                Network::Bridge => s.lasting(&net, start, d, network(NetworkFault::Bridge)),
                Network::Ring => s.lasting(&net, start, d, network(NetworkFault::MajoritiesRing)),
                Network::Slow => {
                    let node = stream.pick(&s.targets.eligible).as_str();
                    let min = stream.duration(p.latency);
                    let max = stream.duration(Span::new(min, p.latency.max));
                    let slow = NetworkFault::Slow {
                        node: node.to_owned(),
                        latency: Some(LatencyRange { min, max }),
                    };
                    s.lasting(&[lane("slow", node)], start, d, network(slow));
                }
                Network::Loss => {
                    let node = stream.pick(&s.targets.eligible).as_str();
                    let loss = NetworkFault::Loss {
                        node: node.to_owned(),
                        loss: Some(loss(stream, p.loss)),
                    };
                    s.lasting(&[lane("loss", node)], start, d, network(loss));
                }
            }
        }
    }

    fn draw_node(&self, stream: &mut Stream, slice: VirtNanos, s: &mut Slice) {
        let p = &self.node;
        let w = &p.weights;
        let any = !s.targets.eligible.is_empty();
        let kinds = [
            (Node::Pause, w.pause, any),
            (Node::Kill, w.kill, any),
            (Node::Restart, w.restart, any),
            (Node::Crash, w.crash, !s.targets.with_disks.is_empty()),
        ];
        for start in stream.arrivals(p.rate, slice) {
            let Some(kind) = choose(stream, &kinds) else {
                continue;
            };
            let targets = match kind {
                Node::Crash => &s.targets.with_disks,
                _ => &s.targets.eligible,
            };
            let node = stream.pick(targets).as_str();
            let lanes = [lane("node", node)];
            match kind {
                Node::Pause => {
                    let duration = stream.duration(p.pause);
                    if let Some(d) = s.fit(start, duration) {
                        let pause = NodeFault::Pause {
                            node: node.to_owned(),
                        };
                        s.lasting(&lanes, start, d, node_fault(pause));
                    }
                }
                Node::Kill | Node::Crash => {
                    let duration = stream.duration(p.down);
                    let Some(d) = s.fit(start, duration) else {
                        continue;
                    };
                    let name = node.to_owned();
                    let (down, lanes) = match kind {
                        // Written without signal= (SIGKILL).
                        Node::Kill => (
                            NodeFault::Kill {
                                node: name,
                                signal: None,
                            },
                            lanes.to_vec(),
                        ),
                        // A crash unmounts the disk: no fill across it.
                        _ => (
                            NodeFault::Crash { node: name },
                            vec![lanes[0].clone(), lane("full", node)],
                        ),
                    };
                    let restart = NodeFault::Restart {
                        node: node.to_owned(),
                    };
                    s.pair(&lanes, start, d, down, restart);
                }
                Node::Restart => {
                    let restart = NodeFault::Restart {
                        node: node.to_owned(),
                    };
                    s.instant(&lanes, start, restart);
                }
            }
        }
    }

    fn draw_clock(&self, stream: &mut Stream, slice: VirtNanos, s: &mut Slice) {
        let p = &self.clock;
        let any = !s.targets.eligible.is_empty();
        let kinds = [
            (Clock::Step, p.weights.step, any),
            (Clock::Drift, p.weights.drift, any),
        ];
        for start in stream.arrivals(p.rate, slice) {
            let Some(kind) = choose(stream, &kinds) else {
                continue;
            };
            let node = stream.pick(&s.targets.eligible).as_str();
            let backwards = stream.coin();
            match kind {
                Clock::Step => {
                    let size = stream.duration(p.step).0.min(i64::MAX as u64) as i64;
                    let by_ns = if backwards { -size } else { size };
                    let step = NodeFault::ClockStep {
                        node: node.to_owned(),
                        by_ns,
                    };
                    s.instant(&[], start, step);
                }
                Clock::Drift => {
                    let Ppm(size) = p.drift.min;
                    let size = stream.between(u64::from(size), u64::from(p.drift.max.0)) as i32;
                    let ppm = if backwards { -size } else { size };
                    let duration = stream.duration(p.duration);
                    if let Some(d) = s.fit(start, duration) {
                        let drift = NodeFault::Drift {
                            node: node.to_owned(),
                            ppm,
                        };
                        s.lasting(&[lane("drift", node)], start, d, node_fault(drift));
                    }
                }
            }
        }
    }

    fn draw_disk(&self, stream: &mut Stream, slice: VirtNanos, s: &mut Slice) {
        let p = &self.disk;
        let w = &p.weights;
        let any = !s.targets.with_disks.is_empty();
        let kinds = [
            (Disk::FsyncDelay, w.fsync_delay, any),
            (Disk::FsyncError, w.fsync_error, any),
            (Disk::Full, w.full, any),
        ];
        for start in stream.arrivals(p.rate, slice) {
            let Some(kind) = choose(stream, &kinds) else {
                continue;
            };
            let node = stream.pick(&s.targets.with_disks).as_str();
            let name = node.to_owned();
            let (lanes, action) = match kind {
                Disk::FsyncDelay => {
                    let delay = stream.duration(p.fsync_delay);
                    let fault = DiskFault::FsyncDelay { node: name, delay };
                    ([lane("fsync", node)], FaultAction::Disk(fault))
                }
                Disk::FsyncError => (
                    [lane("fsync", node)],
                    FaultAction::Disk(DiskFault::FsyncError { node: name }),
                ),
                Disk::Full => (
                    [lane("full", node)],
                    node_fault(NodeFault::DiskFull { node: name }),
                ),
            };
            let duration = stream.duration(p.duration);
            if let Some(d) = s.fit(start, duration) {
                s.lasting(&lanes, start, d, action);
            }
        }
    }
}

/// `partition` into 2 or 3 random groups of the eligible nodes; each
/// excluded node joins one of them (never isolated alone).
fn partition(stream: &mut Stream, targets: &Targets) -> FaultAction {
    let mut shuffled = targets.eligible.clone();
    stream.shuffle(&mut shuffled);
    let count = 2 + stream.below(shuffled.len().min(3) as u64 - 1) as usize;
    let mut groups: Vec<Vec<&String>> = vec![Vec::new(); count];
    for (i, node) in shuffled.into_iter().enumerate() {
        let group = if i < count {
            i
        } else {
            stream.below(count as u64) as usize
        };
        groups[group].push(node);
    }
    for node in targets.all {
        if !targets.eligible.contains(&node) {
            groups[stream.below(count as u64) as usize].push(node);
        }
    }
    let groups = groups
        .iter_mut()
        .map(|group| {
            targets.in_run_order(group);
            Targets::owned(group)
        })
        .collect();
    network(NetworkFault::Partition(groups))
}

fn network(fault: NetworkFault) -> FaultAction {
    FaultAction::Network(fault)
}

/// Two disjoint, non-empty random sets of the eligible nodes.
fn two_sides(stream: &mut Stream, targets: &Targets) -> (Vec<String>, Vec<String>) {
    let mut shuffled = targets.eligible.clone();
    stream.shuffle(&mut shuffled);
    let n = shuffled.len() as u64;
    let a = 1 + stream.below(n - 1) as usize;
    let b = 1 + stream.below(n - a as u64) as usize;
    let (from, rest) = shuffled.split_at_mut(a);
    let to = &mut rest[..b];
    targets.in_run_order(from);
    targets.in_run_order(to);
    (Targets::owned(from), Targets::owned(to))
}

/// A loss probability in `span`, in steps of 0.001 where the span holds one.
fn loss(stream: &mut Stream, span: Span<Probability>) -> Probability {
    let low = (span.min.get() * 1000.0).ceil() as u64;
    let high = (span.max.get() * 1000.0).floor() as u64;
    if low > high {
        return span.min;
    }
    Probability::new(stream.between(low, high) as f64 / 1000.0)
        .expect("a number of thousandths in 0..=1000")
}
