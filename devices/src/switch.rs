//! The simulated Ethernet switch between the machine's virtio-net NICs: a
//! pure state machine in virtual time. No frame ever leaves for a host
//! interface; the switch is the whole network.
//!
//! Ports are the NICs, each known by a [`PortId`] (in [`crate::Devices`]:
//! the NIC's virtio slot index) and its MAC address. There is no learning:
//! the switch knows every port's address from the start.
//!
//! # Forwarding
//! [`Switch::submit`] resolves a frame's destinations from its Ethernet
//! destination MAC: broadcast and multicast (the group bit set) go to every
//! other port in port order; unicast goes to the other port(s) with that
//! address; a frame never goes back to its ingress port. A frame shorter
//! than an Ethernet header, or addressed to no other port, is dropped
//! (`dropped_no_destination`).
//!
//! # Link behaviour
//! Each directed link (from, to) follows a [`NetworkConfig`]: the switch's
//! default or a per-link override. Every (frame, destination) pair draws,
//! in this order, from the switch's ChaCha20 stream: a loss draw, a
//! duplication draw, then for each of two possible copies its latency, a
//! reorder draw and a reorder delay. The pair consumes these draws whatever
//! its fate (partitioned, lost, not duplicated), so changing a probability
//! or the fault schedule changes which frames arrive, never the latencies
//! drawn for the next frames. Then:
//! * a partitioned link drops the frame (`dropped_partition`);
//! * with probability `loss` the frame is lost (`dropped_loss`);
//! * with probability `duplicate` a second copy is sent (`duplicated`);
//! * each copy arrives `latency` after `now`, but never before the copy
//!   sent before it on the same link: without reordering a link is FIFO,
//!   even when latencies vary;
//! * with probability `reorder` a copy is held back by an extra
//!   `reorder_delay` after that point (`reordered`), and later frames on the
//!   link may overtake it.
//!
//! Frames in flight wait in a priority queue ordered by (delivery time,
//! sequence number): a BTreeMap, so simultaneous deliveries come out in
//! the order they were queued, never in hash order. [`Switch::due`] pops
//! everything due at or before `now`, in that order.
//!
//! # Faults
//! [`Switch::schedule_fault`] schedules a [`Fault`] at an exact virtual
//! time. Connectivity is a set of blocked directed links (from, to) (see
//! the `faults` module: a partition into groups, Jepsen's `bridge` and
//! `majorities-ring` replace the set; a cut, both ways or one way, adds to
//! it and leaves every other link alone; a heal clears it). At the fault's
//! time `at`:
//! * frames submitted from then on on a blocked link are dropped at submit;
//! * frames *in flight* on a newly blocked link with a delivery time at or
//!   after `at` are dropped too (a cut link loses what is on the wire), so
//!   no frame ever crosses a blocked link after the block starts. Frames due
//!   before `at` were delivered before it and are not affected. A fault at
//!   the same instant as a delivery applies first.
//!
//! A heal does not bring dropped frames back. `Slow` and `Loss` override the
//! latency or loss probability of every link to and from one port, for
//! frames submitted from their time on (frames in flight keep their times).
//! They keep the draw order: the loss draw is compared with the override
//! instead of the link's probability, and the link's latency draws are made
//! as always, the slow latency coming from a second ChaCha20 stream of the
//! same key (stream 1), so a slow node changes its own frames' times and no
//! other frame's. Where both ends of a link have an override, the sender's
//! latency wins and the larger loss applies.
//!
//! Faults are applied lazily, when the switch is next asked to submit or
//! deliver at or after their time, which gives the same result as applying
//! them at that exact time. Counters of drops, duplicates and reorders are
//! the sending port's; `delivered` is the receiving port's.
//!
//! # Observing
//! With [`Switch::record_frames`] on, the switch keeps a [`FrameEvent`] per
//! frame and link (delivered, or dropped and why) for
//! [`Switch::take_frame_events`]; recording is not part of the state and
//! makes no draw, so it cannot change the run.
//!
//! # Numbers
//! Probabilities are compared exactly: a draw `x` (64 random bits) hits
//! probability `p` when `(x >> 11) * 2^-53 < p`, so 0 never hits and 1
//! always does. Latencies are integers; [`LatencyDist::Normal`] is the
//! integer mean of several uniform draws. In a saved state, probabilities
//! are written as strings in Rust's shortest round-trip notation and read
//! back exactly (a JSON number is accepted too), so a restored switch
//! behaves bit for bit like the saved one.

mod faults;
mod tap;

pub use faults::{Fault, Links, Probability};
pub use tap::{DropReason, FrameEvent, FrameTap};

use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// The ChaCha20 stream (of the switch's key) slow latencies are drawn from,
/// so that they never shift the main stream's draws.
const SLOW_STREAM: u64 = 1;

/// Bytes of an Ethernet header (destination, source, EtherType).
pub const ETHERNET_HEADER_LEN: usize = 14;
/// The broadcast address.
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];

/// A switch port. In [`crate::Devices`] it is the NIC's virtio slot index.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct PortId(pub usize);

/// How long a frame takes on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LatencyDist {
    /// Always this long.
    Fixed(VirtNanos),
    /// Uniform over `min..=max`.
    Uniform { min: VirtNanos, max: VirtNanos },
    /// Bell-shaped over `min..=max` around the midpoint: the mean of `terms`
    /// uniform draws over `min..=max` (Irwin-Hall). 1 term is uniform; 4 to
    /// 12 look normal.
    Normal {
        min: VirtNanos,
        max: VirtNanos,
        terms: u8,
    },
}

impl LatencyDist {
    /// Checks `min <= max` and `terms >= 1`.
    pub fn validate(&self) -> Result<(), SwitchError> {
        match *self {
            LatencyDist::Fixed(_) => Ok(()),
            LatencyDist::Uniform { min, max } | LatencyDist::Normal { min, max, .. }
                if min > max =>
            {
                Err(SwitchError::InvalidConfig {
                    reason: format!("latency minimum {min} is above its maximum {max}"),
                })
            }
            LatencyDist::Normal { terms: 0, .. } => Err(SwitchError::InvalidConfig {
                reason: "a normal latency needs at least one term".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Draws a latency. Total on any value: bounds given the wrong way
    /// round are swapped, 0 terms count as 1 (only a state written by hand
    /// can hold either). Uses no draw for `Fixed`, one for `Uniform` and
    /// `terms` for `Normal`.
    fn sample(&self, rng: &mut ChaCha20Rng) -> VirtNanos {
        match *self {
            LatencyDist::Fixed(latency) => latency,
            LatencyDist::Uniform { min, max } => VirtNanos(draw_between(rng, min.0, max.0)),
            LatencyDist::Normal { min, max, terms } => {
                let (low, high) = (min.0.min(max.0), min.0.max(max.0));
                let terms = u128::from(terms.max(1));
                let sum: u128 = (0..terms)
                    .map(|_| u128::from(draw_between(rng, 0, high - low)))
                    .sum();
                // The mean of draws in 0..=high-low is in that range too.
                VirtNanos(low + (sum / terms) as u64)
            }
        }
    }
}

/// The behaviour of one directed link. Probabilities are in `0.0..=1.0`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct NetworkConfig {
    pub latency: LatencyDist,
    /// Probability that a frame is lost.
    #[serde(with = "exact_f64")]
    pub loss: f64,
    /// Probability that a frame arrives twice.
    #[serde(with = "exact_f64")]
    pub duplicate: f64,
    /// Probability that a copy is held back by `reorder_delay`.
    #[serde(with = "exact_f64")]
    pub reorder: f64,
    /// The extra delay of a reordered copy.
    pub reorder_delay: LatencyDist,
}

impl NetworkConfig {
    /// A link that delivers every frame once, in order, after `latency`.
    pub fn reliable(latency: LatencyDist) -> Self {
        NetworkConfig {
            latency,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: LatencyDist::Fixed(VirtNanos::ZERO),
        }
    }

    /// Checks that the probabilities are numbers in `0.0..=1.0` and the
    /// distributions well formed.
    pub fn validate(&self) -> Result<(), SwitchError> {
        for (name, p) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(SwitchError::InvalidConfig {
                    reason: format!("{name} probability {p} is not in 0..=1"),
                });
            }
        }
        self.latency.validate()?;
        self.reorder_delay.validate()
    }
}

/// Bit-for-bit equality of the probabilities, so that the relation is
/// total and a saved state compares equal to its restored copy.
impl PartialEq for NetworkConfig {
    fn eq(&self, other: &Self) -> bool {
        self.latency == other.latency
            && self.loss.to_bits() == other.loss.to_bits()
            && self.duplicate.to_bits() == other.duplicate.to_bits()
            && self.reorder.to_bits() == other.reorder.to_bits()
            && self.reorder_delay == other.reorder_delay
    }
}

impl Eq for NetworkConfig {}

/// Per-port counters. Drops, duplicates and reorders count against the
/// sending port, `delivered` for the receiving one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCounters {
    /// Frames this port submitted.
    pub sent: u64,
    /// Frames handed to this port's NIC.
    pub delivered: u64,
    /// Frames of this port lost to the loss probability (per destination).
    pub dropped_loss: u64,
    /// Frames of this port on a blocked link, at submit or in flight.
    pub dropped_partition: u64,
    /// Frames of this port with no other port to go to.
    pub dropped_no_destination: u64,
    /// Extra copies made of this port's frames.
    pub duplicated: u64,
    /// Copies of this port's frames held back by the reorder delay.
    pub reordered: u64,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SwitchError {
    #[error("invalid network configuration: {reason}")]
    InvalidConfig { reason: String },
    #[error("switch port {} does not exist", .port.0)]
    UnknownPort { port: PortId },
    #[error("switch port {} is in two partition groups", .port.0)]
    PortInTwoGroups { port: PortId },
    #[error("a fault at {at} is in the past: the switch is at {now}")]
    FaultInThePast { at: VirtNanos, now: VirtNanos },
    #[error("a network switch is already attached")]
    AlreadyAttached,
    #[error("no network switch is attached")]
    NotAttached,
}

/// A port as saved: its address and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortState {
    pub mac: [u8; 6],
    pub counters: PortCounters,
}

/// A frame on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlightFrame {
    pub deliver_at: VirtNanos,
    pub from: PortId,
    pub to: PortId,
    pub frame: Vec<u8>,
}

/// A fault waiting for its time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduledFault {
    pub at: VirtNanos,
    pub fault: Fault,
}

/// Saved state of the switch. Maps are keyed by sequence number or port,
/// so keys are unique by construction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwitchState {
    /// The ChaCha20 stream: key, stream and position in 32-bit words.
    pub key: [u8; 32],
    pub stream: u64,
    pub word_pos: u128,
    /// The latest time the switch was asked about.
    pub now: VirtNanos,
    pub config: NetworkConfig,
    /// Per-link overrides: from -> to -> configuration.
    pub link_configs: BTreeMap<PortId, BTreeMap<PortId, NetworkConfig>>,
    pub ports: BTreeMap<PortId, PortState>,
    /// The directed links blocked now, as (from, to).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub blocked: BTreeSet<(PortId, PortId)>,
    /// Latency overrides of every link to and from a port (`slow`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub port_latency: BTreeMap<PortId, LatencyDist>,
    /// Loss overrides of every link to and from a port (`loss`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub port_loss: BTreeMap<PortId, Probability>,
    /// Position in 32-bit words of the slow-latency stream.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub slow_word_pos: u128,
    /// Scheduled faults by sequence number (order among equal times).
    pub faults: BTreeMap<u64, ScheduledFault>,
    pub next_fault_seq: u64,
    /// Frames in flight by sequence number (order among equal times).
    pub in_flight: BTreeMap<u64, InFlightFrame>,
    pub next_seq: u64,
    /// Per link, the delivery time of the last in-order copy: later
    /// in-order copies arrive no earlier (from -> to -> time).
    pub link_floors: BTreeMap<PortId, BTreeMap<PortId, VirtNanos>>,
}

#[derive(Clone, Debug)]
struct Port {
    mac: [u8; 6],
    counters: PortCounters,
}

#[derive(Clone, Debug)]
struct Frame {
    from: PortId,
    to: PortId,
    bytes: Vec<u8>,
}

/// One copy's draws.
struct CopyDraws {
    latency: VirtNanos,
    reordered: bool,
    reorder_delay: VirtNanos,
}

fn is_zero(n: &u128) -> bool {
    *n == 0
}

#[derive(Clone, Debug)]
pub struct Switch {
    rng: ChaCha20Rng,
    slow_rng: ChaCha20Rng,
    now: VirtNanos,
    config: NetworkConfig,
    link_configs: BTreeMap<(PortId, PortId), NetworkConfig>,
    ports: BTreeMap<PortId, Port>,
    blocked: BTreeSet<(PortId, PortId)>,
    port_latency: BTreeMap<PortId, LatencyDist>,
    port_loss: BTreeMap<PortId, Probability>,
    faults: BTreeMap<(VirtNanos, u64), Fault>,
    next_fault_seq: u64,
    in_flight: BTreeMap<(VirtNanos, u64), Frame>,
    next_seq: u64,
    link_floors: BTreeMap<(PortId, PortId), VirtNanos>,
    /// Frame events since the last take, when recording (never saved).
    frame_log: Option<Vec<FrameEvent>>,
}

/// The slow-latency stream of `key`.
fn slow_stream(key: [u8; 32]) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::from_seed(key);
    rng.set_stream(SLOW_STREAM);
    rng
}

impl Switch {
    /// A switch with no ports whose draws come from the ChaCha20 stream
    /// keyed by `key`, every link following `config`.
    pub fn new(key: [u8; 32], config: NetworkConfig) -> Result<Self, SwitchError> {
        config.validate()?;
        Ok(Switch {
            rng: ChaCha20Rng::from_seed(key),
            slow_rng: slow_stream(key),
            now: VirtNanos::ZERO,
            config,
            link_configs: BTreeMap::new(),
            ports: BTreeMap::new(),
            blocked: BTreeSet::new(),
            port_latency: BTreeMap::new(),
            port_loss: BTreeMap::new(),
            faults: BTreeMap::new(),
            next_fault_seq: 0,
            in_flight: BTreeMap::new(),
            next_seq: 0,
            link_floors: BTreeMap::new(),
            frame_log: None,
        })
    }

    /// Adds a port, or gives an existing one a new address (its counters stay).
    pub fn add_port(&mut self, port: PortId, mac: [u8; 6]) {
        self.ports
            .entry(port)
            .and_modify(|existing| existing.mac = mac)
            .or_insert(Port {
                mac,
                counters: PortCounters::default(),
            });
    }

    /// The ports and their addresses, in port order.
    pub fn ports(&self) -> Vec<(PortId, [u8; 6])> {
        self.ports
            .iter()
            .map(|(&id, port)| (id, port.mac))
            .collect()
    }

    pub fn counters(&self, port: PortId) -> Option<PortCounters> {
        self.ports.get(&port).map(|port| port.counters)
    }

    /// The latest time the switch was asked about.
    pub fn now(&self) -> VirtNanos {
        self.now
    }

    /// The default configuration of every link without an override.
    pub fn config(&self) -> &NetworkConfig {
        &self.config
    }

    /// Replaces the default configuration, for frames submitted from now on.
    pub fn set_config(&mut self, config: NetworkConfig) -> Result<(), SwitchError> {
        config.validate()?;
        self.config = config;
        Ok(())
    }

    /// Overrides (`Some`) or stops overriding (`None`) the configuration of
    /// the directed link `from` -> `to`, for frames submitted from now on.
    pub fn set_link_config(
        &mut self,
        from: PortId,
        to: PortId,
        config: Option<NetworkConfig>,
    ) -> Result<(), SwitchError> {
        self.require_port(from)?;
        self.require_port(to)?;
        match config {
            Some(config) => {
                config.validate()?;
                self.link_configs.insert((from, to), config);
            }
            None => {
                self.link_configs.remove(&(from, to));
            }
        }
        Ok(())
    }

    /// The configuration the link `from` -> `to` follows.
    pub fn link_config(&self, from: PortId, to: PortId) -> &NetworkConfig {
        self.link_configs.get(&(from, to)).unwrap_or(&self.config)
    }

    /// Schedules `fault` at `at` (see the module documentation). Every port
    /// it names must exist, and a partition's groups (a topology's order)
    /// must not repeat one; `at` must not be before the latest time the
    /// switch was asked about.
    pub fn schedule_fault(&mut self, at: VirtNanos, fault: Fault) -> Result<(), SwitchError> {
        for port in fault.ports() {
            self.require_port(port)?;
        }
        fault.validate()?;
        if at < self.now {
            return Err(SwitchError::FaultInThePast { at, now: self.now });
        }
        self.faults.insert((at, self.next_fault_seq), fault);
        self.next_fault_seq += 1;
        Ok(())
    }

    /// Schedules a partition into `groups` at `at`.
    pub fn partition(
        &mut self,
        at: VirtNanos,
        groups: Vec<Vec<PortId>>,
    ) -> Result<(), SwitchError> {
        self.schedule_fault(at, Fault::Partition(groups))
    }

    /// Schedules the end of every block at `at`.
    pub fn heal(&mut self, at: VirtNanos) -> Result<(), SwitchError> {
        self.schedule_fault(at, Fault::Heal)
    }

    /// The directed links blocked at the latest time the switch was asked
    /// about, in order.
    pub fn blocked_links(&self) -> Vec<(PortId, PortId)> {
        self.blocked.iter().copied().collect()
    }

    /// Starts (or stops, dropping what was kept) recording a
    /// [`FrameEvent`] per frame and link.
    pub fn record_frames(&mut self, on: bool) {
        self.frame_log = on.then(Vec::new);
    }

    /// The frame events recorded since the last call, in the order they
    /// happened (see [`FrameEvent::at`]).
    pub fn take_frame_events(&mut self) -> Vec<FrameEvent> {
        self.frame_log
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn log(&mut self, event: impl FnOnce() -> FrameEvent) {
        if let Some(log) = &mut self.frame_log {
            log.push(event());
        }
    }

    /// Faults not yet applied, in the order they will apply.
    pub fn scheduled_faults(&self) -> Vec<(VirtNanos, Fault)> {
        self.faults
            .iter()
            .map(|(&(at, _), fault)| (at, fault.clone()))
            .collect()
    }

    /// Frames on the wire.
    pub fn in_flight_len(&self) -> usize {
        self.in_flight.len()
    }

    fn require_port(&self, port: PortId) -> Result<(), SwitchError> {
        if self.ports.contains_key(&port) {
            Ok(())
        } else {
            Err(SwitchError::UnknownPort { port })
        }
    }

    /// Moves the switch's clock to `now` (never backwards) and applies the
    /// faults due by then.
    fn advance_to(&mut self, now: VirtNanos) {
        self.now = self.now.max(now);
        while let Some(entry) = self.faults.first_entry() {
            let at = entry.key().0;
            if at > self.now {
                break;
            }
            let fault = entry.remove();
            self.apply_fault(at, fault);
        }
    }

    fn apply_fault(&mut self, at: VirtNanos, fault: Fault) {
        match &fault {
            Fault::Unblock(links) => self.blocked.retain(|(a, b)| !links.contains(a, b)),
            Fault::Slow { port, latency } => match latency {
                Some(latency) => {
                    self.port_latency.insert(*port, *latency);
                }
                None => {
                    self.port_latency.remove(port);
                }
            },
            Fault::Loss { port, loss } => match loss {
                Some(loss) => {
                    self.port_loss.insert(*port, *loss);
                }
                None => {
                    self.port_loss.remove(port);
                }
            },
            Fault::Heal
            | Fault::Partition(_)
            | Fault::Block(_)
            | Fault::Bridge(_)
            | Fault::MajoritiesRing(_) => {
                if fault.replaces_blocked() {
                    self.blocked.clear();
                }
                let ports: Vec<PortId> = self.ports.keys().copied().collect();
                for &from in &ports {
                    for &to in &ports {
                        if fault.blocks(from, to) {
                            self.blocked.insert((from, to));
                        }
                    }
                }
                // Frames due before `at` arrived before the cut.
                let cut: Vec<(VirtNanos, u64)> = self
                    .in_flight
                    .range((at, 0)..)
                    .filter(|(_, frame)| fault.blocks(frame.from, frame.to))
                    .map(|(&key, _)| key)
                    .collect();
                for key in cut {
                    if let Some(frame) = self.in_flight.remove(&key) {
                        self.count(frame.from, |c| &mut c.dropped_partition);
                        self.log(|| FrameEvent {
                            at,
                            from: frame.from,
                            to: frame.to,
                            dropped: Some(DropReason::Blocked),
                            frame: frame.bytes,
                        });
                    }
                }
            }
        }
    }

    fn count(&mut self, port: PortId, counter: impl FnOnce(&mut PortCounters) -> &mut u64) {
        if let Some(port) = self.ports.get_mut(&port) {
            let value = counter(&mut port.counters);
            *value = value.saturating_add(1);
        }
    }

    /// The ports a frame from `from` goes to, in port order.
    fn destinations(&self, from: PortId, frame: &[u8]) -> Vec<PortId> {
        if frame.len() < ETHERNET_HEADER_LEN {
            return Vec::new();
        }
        let destination = &frame[..6];
        let group = destination[0] & 1 != 0;
        self.ports
            .iter()
            .filter(|&(&id, port)| id != from && (group || port.mac == destination))
            .map(|(&id, _)| id)
            .collect()
    }

    /// Puts `frame`, sent by port `from` at `now`, on the wire to its
    /// destinations (see the module documentation).
    pub fn submit(
        &mut self,
        now: VirtNanos,
        from: PortId,
        frame: Vec<u8>,
    ) -> Result<(), SwitchError> {
        self.require_port(from)?;
        self.advance_to(now);
        self.count(from, |c| &mut c.sent);
        let destinations = self.destinations(from, &frame);
        if destinations.is_empty() {
            self.count(from, |c| &mut c.dropped_no_destination);
            return Ok(());
        }
        // Floors at or before now constrain nothing any more.
        let now = self.now;
        self.link_floors.retain(|_, floor| *floor > now);
        let last = destinations.len() - 1;
        let mut frame = Some(frame);
        for (i, to) in destinations.into_iter().enumerate() {
            let bytes = if i == last {
                frame.take().unwrap_or_default()
            } else {
                frame.clone().unwrap_or_default()
            };
            self.send_to(from, to, bytes);
        }
        Ok(())
    }

    fn send_to(&mut self, from: PortId, to: PortId, bytes: Vec<u8>) {
        let config = *self.link_config(from, to);
        let loss = match (self.port_loss.get(&from), self.port_loss.get(&to)) {
            (None, None) => config.loss,
            (a, b) => a.into_iter().chain(b).map(|p| p.get()).fold(0.0, f64::max),
        };
        let slow = self
            .port_latency
            .get(&from)
            .or_else(|| self.port_latency.get(&to))
            .copied();
        // Every draw is made before any decision (see the module documentation).
        let lost = chance(self.rng.next_u64(), loss);
        let duplicated = chance(self.rng.next_u64(), config.duplicate);
        let mut copies = [self.draw_copy(&config), self.draw_copy(&config)];
        if let Some(slow) = slow {
            for copy in &mut copies {
                copy.latency = slow.sample(&mut self.slow_rng);
            }
        }
        let dropped = if self.blocked.contains(&(from, to)) {
            self.count(from, |c| &mut c.dropped_partition);
            Some(DropReason::Blocked)
        } else if lost {
            self.count(from, |c| &mut c.dropped_loss);
            Some(DropReason::Loss)
        } else {
            None
        };
        if let Some(reason) = dropped {
            let at = self.now;
            self.log(|| FrameEvent {
                at,
                from,
                to,
                dropped: Some(reason),
                frame: bytes,
            });
            return;
        }
        let count = if duplicated {
            self.count(from, |c| &mut c.duplicated);
            2
        } else {
            1
        };
        let mut bytes = Some(bytes);
        for (i, copy) in copies.iter().take(count).enumerate() {
            let frame_bytes = if i + 1 == count {
                bytes.take().unwrap_or_default()
            } else {
                bytes.clone().unwrap_or_default()
            };
            let floor = self
                .link_floors
                .get(&(from, to))
                .copied()
                .unwrap_or(VirtNanos::ZERO);
            let in_order_at = self.now.saturating_add(copy.latency).max(floor);
            let deliver_at = if copy.reordered {
                self.count(from, |c| &mut c.reordered);
                in_order_at.saturating_add(copy.reorder_delay)
            } else {
                self.link_floors.insert((from, to), in_order_at);
                in_order_at
            };
            self.in_flight.insert(
                (deliver_at, self.next_seq),
                Frame {
                    from,
                    to,
                    bytes: frame_bytes,
                },
            );
            self.next_seq += 1;
        }
    }

    fn draw_copy(&mut self, config: &NetworkConfig) -> CopyDraws {
        let latency = config.latency.sample(&mut self.rng);
        let reordered = chance(self.rng.next_u64(), config.reorder);
        let reorder_delay = config.reorder_delay.sample(&mut self.rng);
        CopyDraws {
            latency,
            reordered,
            reorder_delay,
        }
    }

    /// The earliest time a frame will be delivered, if any is in flight.
    /// Frames a scheduled partition will cut first are skipped, so the
    /// time is never one at which nothing arrives.
    pub fn next_deadline(&self) -> Option<VirtNanos> {
        self.in_flight
            .iter()
            .find(|(&(deliver_at, _), frame)| !self.will_be_cut(deliver_at, frame))
            .map(|(&(deliver_at, _), _)| deliver_at)
    }

    fn will_be_cut(&self, deliver_at: VirtNanos, frame: &Frame) -> bool {
        self.faults
            .range(..=(deliver_at, u64::MAX))
            .any(|(_, fault)| fault.blocks(frame.from, frame.to))
    }

    /// Applies the faults due by `now` and pops every frame due at or
    /// before `now`, in (delivery time, sequence) order, as (destination
    /// port, frame).
    pub fn due(&mut self, now: VirtNanos) -> Vec<(PortId, Vec<u8>)> {
        self.advance_to(now);
        let mut delivered = Vec::new();
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let deliver_at = entry.key().0;
            let frame = entry.remove();
            self.count(frame.to, |c| &mut c.delivered);
            self.log(|| FrameEvent {
                at: deliver_at,
                from: frame.from,
                to: frame.to,
                dropped: None,
                frame: frame.bytes.clone(),
            });
            delivered.push((frame.to, frame.bytes));
        }
        delivered
    }

    /// The switch `state` describes. Every state describes one: keys are
    /// unique by construction, configurations have total semantics (see
    /// [`LatencyDist`]; a probability outside 0..=1 saturates, NaN never
    /// hits), and sequence counters below a sequence in use are raised past
    /// it. Whether its ports match the machine's NICs is the owner's check.
    pub fn from_state(state: &SwitchState) -> Self {
        let mut rng = ChaCha20Rng::from_seed(state.key);
        rng.set_stream(state.stream);
        rng.set_word_pos(state.word_pos);
        let mut slow_rng = slow_stream(state.key);
        slow_rng.set_word_pos(state.slow_word_pos);
        let next_seq = state
            .in_flight
            .keys()
            .next_back()
            .map_or(state.next_seq, |&last| state.next_seq.max(last + 1));
        let next_fault_seq = state
            .faults
            .keys()
            .next_back()
            .map_or(state.next_fault_seq, |&last| {
                state.next_fault_seq.max(last + 1)
            });
        Switch {
            rng,
            slow_rng,
            now: state.now,
            config: state.config,
            link_configs: pairs(&state.link_configs),
            ports: state
                .ports
                .iter()
                .map(|(&id, port)| {
                    (
                        id,
                        Port {
                            mac: port.mac,
                            counters: port.counters,
                        },
                    )
                })
                .collect(),
            blocked: state.blocked.clone(),
            port_latency: state.port_latency.clone(),
            port_loss: state.port_loss.clone(),
            faults: state
                .faults
                .iter()
                .map(|(&seq, scheduled)| ((scheduled.at, seq), scheduled.fault.clone()))
                .collect(),
            next_fault_seq,
            in_flight: state
                .in_flight
                .iter()
                .map(|(&seq, frame)| {
                    (
                        (frame.deliver_at, seq),
                        Frame {
                            from: frame.from,
                            to: frame.to,
                            bytes: frame.frame.clone(),
                        },
                    )
                })
                .collect(),
            next_seq,
            link_floors: pairs(&state.link_floors),
            frame_log: None,
        }
    }
}

impl Persist for Switch {
    type State = SwitchState;

    fn save(&self) -> SwitchState {
        let mut link_configs: BTreeMap<PortId, BTreeMap<PortId, NetworkConfig>> = BTreeMap::new();
        for (&(from, to), &config) in &self.link_configs {
            link_configs.entry(from).or_default().insert(to, config);
        }
        let mut link_floors: BTreeMap<PortId, BTreeMap<PortId, VirtNanos>> = BTreeMap::new();
        for (&(from, to), &floor) in &self.link_floors {
            link_floors.entry(from).or_default().insert(to, floor);
        }
        SwitchState {
            key: self.rng.get_seed(),
            stream: self.rng.get_stream(),
            word_pos: self.rng.get_word_pos(),
            now: self.now,
            config: self.config,
            link_configs,
            ports: self
                .ports
                .iter()
                .map(|(&id, port)| {
                    (
                        id,
                        PortState {
                            mac: port.mac,
                            counters: port.counters,
                        },
                    )
                })
                .collect(),
            blocked: self.blocked.clone(),
            port_latency: self.port_latency.clone(),
            port_loss: self.port_loss.clone(),
            slow_word_pos: self.slow_rng.get_word_pos(),
            faults: self
                .faults
                .iter()
                .map(|(&(at, seq), fault)| {
                    (
                        seq,
                        ScheduledFault {
                            at,
                            fault: fault.clone(),
                        },
                    )
                })
                .collect(),
            next_fault_seq: self.next_fault_seq,
            in_flight: self
                .in_flight
                .iter()
                .map(|(&(deliver_at, seq), frame)| {
                    (
                        seq,
                        InFlightFrame {
                            deliver_at,
                            from: frame.from,
                            to: frame.to,
                            frame: frame.bytes.clone(),
                        },
                    )
                })
                .collect(),
            next_seq: self.next_seq,
            link_floors,
        }
    }

    /// Replaces this switch with the one `state` describes (every state
    /// describes one, see [`Switch::from_state`]).
    fn restore(&mut self, state: &SwitchState) -> Result<(), RestoreError> {
        let recording = self.frame_log.is_some();
        *self = Switch::from_state(state);
        self.record_frames(recording);
        Ok(())
    }
}

/// A nested per-link map flattened to (from, to) keys.
fn pairs<T: Copy>(map: &BTreeMap<PortId, BTreeMap<PortId, T>>) -> BTreeMap<(PortId, PortId), T> {
    map.iter()
        .flat_map(|(&from, links)| links.iter().map(move |(&to, &value)| ((from, to), value)))
        .collect()
}

/// Whether the 64 random bits `x` hit probability `p`.
fn chance(x: u64, p: f64) -> bool {
    const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
    // Exact: x >> 11 has 53 bits, and scaling by a power of two is exact.
    ((x >> 11) as f64) * SCALE < p
}

/// A draw uniform over `a..=b` (either order), from one 64-bit word by
/// multiply-shift: deterministic, one word per draw, bias below 2^-64 per
/// value.
fn draw_between(rng: &mut ChaCha20Rng, a: u64, b: u64) -> u64 {
    let (low, high) = (a.min(b), a.max(b));
    let x = rng.next_u64();
    let span = high - low;
    if span == u64::MAX {
        return x;
    }
    low + ((u128::from(x) * (u128::from(span) + 1)) >> 64) as u64
}

/// Serializes an f64 as the string of its shortest round-trip notation and
/// reads it back exactly (serde_json's own float parsing may be off by one
/// unit in the last place). Plain JSON numbers are accepted on input.
mod exact_f64 {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};
    use std::fmt;

    pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{value:?}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        deserializer.deserialize_any(ExactF64)
    }

    struct ExactF64;

    impl Visitor<'_> for ExactF64 {
        type Value = f64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number, or a string holding one")
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<f64, E> {
            value.parse().map_err(E::custom)
        }

        fn visit_f64<E: de::Error>(self, value: f64) -> Result<f64, E> {
            Ok(value)
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<f64, E> {
            Ok(value as f64)
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<f64, E> {
            Ok(value as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The link-level faults (cuts, one-way partitions, topologies, slow
    /// and lossy nodes) and frame recording.
    mod faults;

    const KEY: [u8; 32] = *b"detvisor network switch test key";
    const OTHER_KEY: [u8; 32] = *b"detvisor network switch other ke";
    const A: PortId = PortId(2);
    const B: PortId = PortId(3);
    const C: PortId = PortId(4);
    const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xa];
    const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xb];
    const MAC_C: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xc];
    const MICROS_100: VirtNanos = VirtNanos::from_micros(100);

    fn mac_of(port: PortId) -> [u8; 6] {
        match port {
            A => MAC_A,
            B => MAC_B,
            _ => MAC_C,
        }
    }

    fn frame(to: [u8; 6], from: PortId, tag: u32) -> Vec<u8> {
        let mut frame = to.to_vec();
        frame.extend_from_slice(&mac_of(from));
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&tag.to_le_bytes());
        frame
    }

    fn tag(frame: &[u8]) -> u32 {
        u32::from_le_bytes(frame[14..18].try_into().unwrap())
    }

    fn switch_with(key: [u8; 32], config: NetworkConfig) -> Switch {
        let mut switch = Switch::new(key, config).unwrap();
        for port in [A, B, C] {
            switch.add_port(port, mac_of(port));
        }
        switch
    }

    fn fixed(latency: VirtNanos) -> NetworkConfig {
        NetworkConfig::reliable(LatencyDist::Fixed(latency))
    }

    /// Reliable, with a latency uniform over 1 µs..=1 ms.
    fn jittery() -> NetworkConfig {
        NetworkConfig::reliable(LatencyDist::Uniform {
            min: VirtNanos::from_micros(1),
            max: VirtNanos::from_micros(1_000),
        })
    }

    fn lossy() -> NetworkConfig {
        NetworkConfig {
            latency: LatencyDist::Uniform {
                min: VirtNanos::from_micros(50),
                max: VirtNanos::from_micros(500),
            },
            loss: 0.2,
            duplicate: 0.1,
            reorder: 0.2,
            reorder_delay: LatencyDist::Normal {
                min: VirtNanos::ZERO,
                max: VirtNanos::from_micros(300),
                terms: 4,
            },
        }
    }

    /// Every delivery as (time, destination, tag), collecting at each
    /// deadline the switch reports.
    fn drain(switch: &mut Switch) -> Vec<(VirtNanos, PortId, u32)> {
        let mut schedule = Vec::new();
        while let Some(deadline) = switch.next_deadline() {
            let due = switch.due(deadline);
            assert!(!due.is_empty(), "nothing arrived at deadline {deadline}");
            schedule.extend(due.into_iter().map(|(to, f)| (deadline, to, tag(&f))));
        }
        schedule
    }

    /// 200 frames between A, B and C, 10 µs apart, then every delivery.
    fn run_workload(switch: &mut Switch) -> Vec<(VirtNanos, PortId, u32)> {
        let mut schedule = Vec::new();
        for i in 0..200u32 {
            let now = VirtNanos::from_micros(10 * u64::from(i));
            schedule.extend(
                switch
                    .due(now)
                    .into_iter()
                    .map(|(to, f)| (now, to, tag(&f))),
            );
            let (from, to) = [(A, MAC_B), (B, MAC_C), (C, MAC_A)][i as usize % 3];
            switch.submit(now, from, frame(to, from, i)).unwrap();
        }
        schedule.extend(drain(switch));
        schedule
    }

    #[test]
    fn test_switch_same_key_gives_same_delivery_schedule() {
        // Arrange
        let mut first = switch_with(KEY, lossy());
        let mut second = switch_with(KEY, lossy());

        // Act
        let first_schedule = run_workload(&mut first);
        let second_schedule = run_workload(&mut second);

        // Assert
        assert_eq!(first_schedule, second_schedule);
        assert_eq!(first.save(), second.save());
        let counters = first.counters(A).unwrap();
        assert_eq!(counters.sent, 67);
        assert!(counters.dropped_loss > 0);
        assert!(counters.duplicated > 0);
        assert!(counters.reordered > 0);
    }

    #[test]
    fn test_switch_other_key_gives_other_schedule() {
        // Arrange
        let mut first = switch_with(KEY, lossy());
        let mut second = switch_with(OTHER_KEY, lossy());

        // Act
        let first_schedule = run_workload(&mut first);
        let second_schedule = run_workload(&mut second);

        // Assert
        assert_ne!(first_schedule, second_schedule);
    }

    #[test]
    fn test_switch_loss_one_drops_every_frame() {
        // Arrange
        let mut config = fixed(MICROS_100);
        config.loss = 1.0;
        let mut switch = switch_with(KEY, config);

        // Act
        for i in 0..50 {
            switch
                .submit(VirtNanos(i), A, frame(MAC_B, A, i as u32))
                .unwrap();
        }
        switch
            .submit(VirtNanos(60), B, frame(BROADCAST_MAC, B, 99))
            .unwrap();

        // Assert
        assert_eq!(switch.next_deadline(), None);
        assert!(switch.due(VirtNanos::from_secs(1)).is_empty());
        assert_eq!(switch.counters(A).unwrap().dropped_loss, 50);
        assert_eq!(switch.counters(B).unwrap().dropped_loss, 2);
        assert_eq!(switch.counters(B).unwrap().delivered, 0);
    }

    #[test]
    fn test_switch_delivers_after_fixed_latency_and_counts() {
        // Arrange
        let mut switch = switch_with(KEY, fixed(MICROS_100));
        let sent = frame(MAC_B, A, 1);

        // Act
        switch.submit(VirtNanos(1_000), A, sent.clone()).unwrap();
        let deadline = switch.next_deadline();
        let early = switch.due(VirtNanos(100_999));
        let on_time = switch.due(VirtNanos(101_000));

        // Assert
        assert_eq!(deadline, Some(VirtNanos(101_000)));
        assert!(early.is_empty());
        assert_eq!(on_time, [(B, sent)]);
        assert_eq!(switch.counters(A).unwrap().sent, 1);
        assert_eq!(switch.counters(B).unwrap().delivered, 1);
        assert_eq!(switch.next_deadline(), None);
    }

    #[test]
    fn test_switch_broadcast_and_multicast_go_to_every_other_port() {
        // Arrange
        let mut switch = switch_with(KEY, fixed(MICROS_100));
        let multicast = [0x01, 0x00, 0x5e, 0, 0, 1];

        // Act
        switch
            .submit(VirtNanos(0), B, frame(BROADCAST_MAC, B, 1))
            .unwrap();
        switch
            .submit(VirtNanos(0), C, frame(multicast, C, 2))
            .unwrap();
        let delivered = switch.due(MICROS_100);

        // Assert: in port order, never back to the sender.
        let delivered: Vec<(PortId, u32)> = delivered.iter().map(|(p, f)| (*p, tag(f))).collect();
        assert_eq!(delivered, [(A, 1), (C, 1), (A, 2), (B, 2)]);
    }

    #[test]
    fn test_switch_unknown_unicast_and_runts_are_dropped() {
        // Arrange
        let mut switch = switch_with(KEY, fixed(MICROS_100));

        // Act
        switch
            .submit(VirtNanos(0), A, frame([0x52, 0x54, 0, 0, 0, 0xee], A, 1))
            .unwrap();
        switch.submit(VirtNanos(0), A, frame(MAC_A, A, 2)).unwrap();
        switch.submit(VirtNanos(0), A, MAC_B.to_vec()).unwrap();
        let unknown_sender = switch.submit(VirtNanos(0), PortId(9), frame(MAC_B, A, 3));

        // Assert
        assert_eq!(switch.in_flight_len(), 0);
        assert_eq!(switch.counters(A).unwrap().dropped_no_destination, 3);
        assert_eq!(
            unknown_sender,
            Err(SwitchError::UnknownPort { port: PortId(9) })
        );
    }

    #[test]
    fn test_switch_simultaneous_deliveries_come_out_in_sequence_order() {
        // Arrange
        let mut switch = switch_with(KEY, fixed(MICROS_100));

        // Act: all due at 100 µs; submitted from several ports, to several.
        for (i, (from, to)) in [(C, MAC_A), (A, MAC_B), (B, MAC_A), (A, MAC_C), (C, MAC_B)]
            .into_iter()
            .enumerate()
        {
            switch
                .submit(VirtNanos(0), from, frame(to, from, i as u32))
                .unwrap();
        }
        let delivered = switch.due(VirtNanos::from_secs(1));

        // Assert
        let tags: Vec<u32> = delivered.iter().map(|(_, f)| tag(f)).collect();
        assert_eq!(tags, [0, 1, 2, 3, 4]);
        let state = switch.save();
        assert_eq!(state.next_seq, 5);
    }

    #[test]
    fn test_switch_link_is_fifo_without_reordering_even_with_jitter() {
        // Arrange
        let mut switch = switch_with(KEY, jittery());

        // Act
        for i in 0..100u32 {
            switch
                .submit(VirtNanos::from_micros(u64::from(i)), A, frame(MAC_B, A, i))
                .unwrap();
        }
        let schedule = drain(&mut switch);

        // Assert
        let tags: Vec<u32> = schedule.iter().map(|&(_, _, t)| t).collect();
        assert_eq!(tags, (0..100).collect::<Vec<_>>());
        assert!(schedule.windows(2).all(|w| w[0].0 <= w[1].0));
    }

    #[test]
    fn test_switch_reordered_frames_are_overtaken() {
        // Arrange
        let mut config = fixed(MICROS_100);
        config.reorder = 1.0;
        config.reorder_delay = LatencyDist::Fixed(VirtNanos::from_micros(25));
        let mut switch = switch_with(KEY, config);
        switch.submit(VirtNanos(0), A, frame(MAC_B, A, 0)).unwrap();
        switch
            .set_link_config(A, B, Some(fixed(MICROS_100)))
            .unwrap();

        // Act
        switch
            .submit(VirtNanos::from_micros(10), A, frame(MAC_B, A, 1))
            .unwrap();
        let schedule = drain(&mut switch);

        // Assert
        assert_eq!(
            schedule,
            [
                (VirtNanos::from_micros(110), B, 1),
                (VirtNanos::from_micros(125), B, 0)
            ]
        );
        assert_eq!(switch.counters(A).unwrap().reordered, 1);
    }

    #[test]
    fn test_switch_duplicate_one_delivers_twice() {
        // Arrange
        let mut config = fixed(MICROS_100);
        config.duplicate = 1.0;
        let mut switch = switch_with(KEY, config);

        // Act
        switch.submit(VirtNanos(0), A, frame(MAC_B, A, 7)).unwrap();
        let delivered = switch.due(MICROS_100);

        // Assert
        assert_eq!(delivered.len(), 2);
        assert!(delivered.iter().all(|(to, f)| *to == B && tag(f) == 7));
        assert_eq!(switch.counters(A).unwrap().duplicated, 1);
        assert_eq!(switch.counters(B).unwrap().delivered, 2);
    }

    #[test]
    fn test_switch_loss_does_not_shift_the_latencies_of_surviving_frames() {
        // Arrange
        let base = NetworkConfig {
            latency: LatencyDist::Uniform {
                min: VirtNanos::from_micros(1),
                max: VirtNanos::from_micros(1_000),
            },
            ..fixed(VirtNanos::ZERO)
        };
        let mut lossy = base;
        lossy.loss = 0.5;
        let mut reliable = switch_with(KEY, base);
        let mut lossy = switch_with(KEY, lossy);

        // Act: frames far apart, so no FIFO clamping.
        let (mut reliable_delays, mut lossy_delays) = (Vec::new(), Vec::new());
        for (switch, delays) in [
            (&mut reliable, &mut reliable_delays),
            (&mut lossy, &mut lossy_delays),
        ] {
            for i in 0..40u32 {
                let now = VirtNanos::from_secs(u64::from(i));
                switch.submit(now, A, frame(MAC_B, A, i)).unwrap();
                if let Some(deadline) = switch.next_deadline() {
                    switch.due(deadline);
                    delays.push((i, deadline - now));
                }
            }
        }

        // Assert
        assert_eq!(reliable_delays.len(), 40);
        assert!(lossy_delays.len() < 40 && !lossy_delays.is_empty());
        for survivor in &lossy_delays {
            assert!(reliable_delays.contains(survivor));
        }
    }

    #[test]
    fn test_switch_normal_latency_stays_in_bounds_and_centres() {
        // Arrange
        let (min, max) = (VirtNanos::from_micros(100), VirtNanos::from_micros(300));
        let dist = LatencyDist::Normal { min, max, terms: 8 };
        let mut rng = ChaCha20Rng::from_seed(KEY);

        // Act
        let samples: Vec<VirtNanos> = (0..2_000).map(|_| dist.sample(&mut rng)).collect();

        // Assert
        assert!(samples.iter().all(|s| (min..=max).contains(s)));
        let middle = samples
            .iter()
            .filter(|s| (VirtNanos::from_micros(150)..=VirtNanos::from_micros(250)).contains(s))
            .count();
        assert!(middle > 1_800, "only {middle} samples in the middle half");
        assert_eq!(rng.get_word_pos(), 2_000 * 8 * 2);
    }

    #[test]
    fn test_switch_partition_then_heal_at_exact_times() {
        // Arrange: A and B apart from 1 ms to 2 ms; C with A.
        let mut switch = switch_with(KEY, fixed(MICROS_100));
        let start = VirtNanos::from_micros(1_000);
        let end = VirtNanos::from_micros(2_000);
        switch.partition(start, vec![vec![A, C], vec![B]]).unwrap();
        switch.heal(end).unwrap();

        // Act
        // Due just before the cut: arrives.
        switch
            .submit(VirtNanos::from_micros(899), A, frame(MAC_B, A, 1))
            .unwrap();
        // Due exactly at the cut: the fault applies first.
        switch
            .submit(VirtNanos::from_micros(900), A, frame(MAC_B, A, 2))
            .unwrap();
        // In flight across the cut: lost.
        switch
            .submit(VirtNanos::from_micros(950), B, frame(MAC_A, B, 3))
            .unwrap();
        // Same side: unaffected.
        switch
            .submit(VirtNanos::from_micros(950), A, frame(MAC_C, A, 4))
            .unwrap();
        let deadline_before = switch.next_deadline();
        let mut schedule = drain(&mut switch);
        // During the partition: dropped at submit, both directions.
        switch
            .submit(VirtNanos::from_micros(1_500), A, frame(MAC_B, A, 5))
            .unwrap();
        switch
            .submit(VirtNanos::from_micros(1_999), B, frame(MAC_A, B, 6))
            .unwrap();
        switch
            .submit(VirtNanos::from_micros(1_999), C, frame(MAC_A, C, 7))
            .unwrap();
        // At the heal: delivered again.
        switch.submit(end, B, frame(MAC_A, B, 8)).unwrap();
        schedule.extend(drain(&mut switch));

        // Assert
        assert_eq!(deadline_before, Some(VirtNanos::from_micros(999)));
        assert_eq!(
            schedule,
            [
                (VirtNanos::from_micros(999), B, 1),
                (VirtNanos::from_micros(1_050), C, 4),
                (VirtNanos::from_micros(2_099), A, 7),
                (VirtNanos::from_micros(2_100), A, 8),
            ]
        );
        assert_eq!(switch.counters(A).unwrap().dropped_partition, 2);
        assert_eq!(switch.counters(B).unwrap().dropped_partition, 2);
        assert_eq!(switch.blocked_links(), []);
        assert!(switch.scheduled_faults().is_empty());
    }

    #[test]
    fn test_switch_next_deadline_skips_frames_a_scheduled_partition_cuts() {
        // Arrange
        let mut switch = switch_with(KEY, fixed(MICROS_100));
        switch.submit(VirtNanos(0), A, frame(MAC_B, A, 1)).unwrap();
        switch.submit(VirtNanos(10), A, frame(MAC_C, A, 2)).unwrap();
        switch.partition(VirtNanos(50), vec![vec![B]]).unwrap();

        // Act
        let deadline = switch.next_deadline();
        let delivered = switch.due(VirtNanos(200_000));

        // Assert
        assert_eq!(deadline, Some(VirtNanos(100_010)));
        assert_eq!(delivered.len(), 1);
        assert_eq!(delivered[0].0, C);
    }

    #[test]
    fn test_switch_partition_unlisted_ports_form_one_group() {
        // Arrange
        let mut switch = switch_with(KEY, fixed(MICROS_100));
        switch.partition(VirtNanos(0), vec![vec![A]]).unwrap();

        // Act
        switch.submit(VirtNanos(0), B, frame(MAC_C, B, 1)).unwrap();
        switch
            .submit(VirtNanos(0), B, frame(BROADCAST_MAC, B, 2))
            .unwrap();
        let delivered: Vec<(PortId, u32)> = switch
            .due(MICROS_100)
            .iter()
            .map(|(p, f)| (*p, tag(f)))
            .collect();

        // Assert
        assert_eq!(delivered, [(C, 1), (C, 2)]);
        assert_eq!(switch.counters(B).unwrap().dropped_partition, 1);
    }

    #[test]
    fn test_switch_fault_schedule_is_checked() {
        // Arrange
        let mut switch = switch_with(KEY, fixed(MICROS_100));
        switch.due(VirtNanos(500));

        // Act
        let past = switch.heal(VirtNanos(499));
        let twice = switch.partition(VirtNanos(600), vec![vec![A, B], vec![B]]);
        let unknown = switch.partition(VirtNanos(600), vec![vec![PortId(0)]]);
        let now = switch.heal(VirtNanos(500));

        // Assert
        assert_eq!(
            past,
            Err(SwitchError::FaultInThePast {
                at: VirtNanos(499),
                now: VirtNanos(500)
            })
        );
        assert_eq!(twice, Err(SwitchError::PortInTwoGroups { port: B }));
        assert_eq!(unknown, Err(SwitchError::UnknownPort { port: PortId(0) }));
        assert_eq!(now, Ok(()));
        assert_eq!(switch.scheduled_faults(), [(VirtNanos(500), Fault::Heal)]);
    }

    #[test]
    fn test_switch_invalid_configs_are_refused() {
        // Arrange
        let bad = [
            NetworkConfig {
                loss: 1.5,
                ..fixed(MICROS_100)
            },
            NetworkConfig {
                duplicate: f64::NAN,
                ..fixed(MICROS_100)
            },
            NetworkConfig {
                reorder: -0.1,
                ..fixed(MICROS_100)
            },
            NetworkConfig::reliable(LatencyDist::Uniform {
                min: VirtNanos(2),
                max: VirtNanos(1),
            }),
            NetworkConfig::reliable(LatencyDist::Normal {
                min: VirtNanos(1),
                max: VirtNanos(2),
                terms: 0,
            }),
        ];

        // Act / Assert
        for config in bad {
            assert!(matches!(
                Switch::new(KEY, config),
                Err(SwitchError::InvalidConfig { .. })
            ));
        }
        let mut switch = switch_with(KEY, fixed(MICROS_100));
        assert!(switch.set_config(bad[0]).is_err());
        assert_eq!(switch.config(), &fixed(MICROS_100));
    }

    #[test]
    fn test_switch_state_round_trip_mid_flight_delivers_identically() {
        // Arrange: frames in flight, a partition pending, the stream read.
        let mut original = switch_with(KEY, lossy());
        for i in 0..30u32 {
            let now = VirtNanos::from_micros(20 * u64::from(i));
            original.due(now);
            let (from, to) = [(A, MAC_B), (B, BROADCAST_MAC), (C, MAC_A)][i as usize % 3];
            original.submit(now, from, frame(to, from, i)).unwrap();
        }
        original
            .partition(VirtNanos::from_micros(700), vec![vec![A], vec![B, C]])
            .unwrap();
        original.heal(VirtNanos::from_micros(900)).unwrap();
        let saved = original.save();
        let json = serde_json::to_string(&saved).unwrap();
        assert!(saved.in_flight.len() > 3);

        // Act
        let mut restored = Switch::from_state(&serde_json::from_str(&json).unwrap());
        let restored_state = restored.save();
        let continue_run = |switch: &mut Switch| {
            let mut schedule = Vec::new();
            for i in 30..60u32 {
                let now = VirtNanos::from_micros(20 * u64::from(i));
                schedule.extend(switch.due(now).into_iter().map(|(p, f)| (now, p, tag(&f))));
                let (from, to) = [(A, MAC_C), (B, MAC_A), (C, BROADCAST_MAC)][i as usize % 3];
                switch.submit(now, from, frame(to, from, i)).unwrap();
            }
            schedule.extend(drain(switch));
            schedule
        };
        let original_schedule = continue_run(&mut original);
        let restored_schedule = continue_run(&mut restored);

        // Assert
        assert_eq!(restored_state, saved);
        assert_eq!(restored_schedule, original_schedule);
        assert_eq!(restored.save(), original.save());
        let early: Vec<u32> = original_schedule
            .iter()
            .filter(|&&(_, _, t)| t < 30)
            .map(|&(_, _, t)| t)
            .collect();
        assert!(!early.is_empty(), "no frame in flight at the save arrived");
    }

    #[test]
    fn test_switch_probabilities_round_trip_exactly_through_json() {
        // Arrange
        let mut config = fixed(MICROS_100);
        config.loss = 0.1 + 0.2;
        config.duplicate = 1e-300;
        config.reorder = 0.123_456_789_012_345_67;

        // Act
        let json = serde_json::to_string(&config).unwrap();
        let back: NetworkConfig = serde_json::from_str(&json).unwrap();
        let from_numbers: NetworkConfig = serde_json::from_str(
            r#"{"latency":{"Fixed":5},"loss":0.25,"duplicate":0,"reorder":1,
                "reorder_delay":{"Fixed":0}}"#,
        )
        .unwrap();

        // Assert
        assert!(json.contains(r#""loss":"0.30000000000000004""#), "{json}");
        assert_eq!(back.loss.to_bits(), config.loss.to_bits());
        assert_eq!(back, config);
        assert_eq!(
            (
                from_numbers.loss,
                from_numbers.duplicate,
                from_numbers.reorder
            ),
            (0.25, 0.0, 1.0)
        );
    }

    #[test]
    fn test_switch_from_state_is_total_on_hand_written_states() {
        // Arrange: bounds reversed, 0 terms, a probability above 1, and a
        // sequence counter behind the frames in flight.
        let mut switch = switch_with(KEY, fixed(MICROS_100));
        switch.submit(VirtNanos(0), A, frame(MAC_B, A, 1)).unwrap();
        let mut state = switch.save();
        state.config = NetworkConfig {
            latency: LatencyDist::Normal {
                min: VirtNanos(9),
                max: VirtNanos(3),
                terms: 0,
            },
            loss: 0.0,
            duplicate: 2.0,
            reorder: f64::NAN,
            reorder_delay: LatencyDist::Uniform {
                min: VirtNanos(5),
                max: VirtNanos(1),
            },
        };
        state.next_seq = 0;
        state.link_floors.clear();

        // Act
        let mut restored = Switch::from_state(&state);
        restored
            .submit(VirtNanos(10), A, frame(MAC_B, A, 2))
            .unwrap();
        let deadline = restored.next_deadline().unwrap();
        let delivered = restored.due(VirtNanos::from_secs(1));

        // Assert: two copies of the new frame 3..=9 ns after it was sent,
        // then the old frame, which a colliding sequence did not overwrite.
        assert!((13..=19).contains(&deadline.0), "{deadline}");
        let tags: Vec<u32> = delivered.iter().map(|(_, f)| tag(f)).collect();
        assert_eq!(tags, [2, 2, 1]);
        assert_eq!(restored.save().next_seq, 3);
    }

    /// Frames in flight, a partition and a heal scheduled, the stream read.
    fn busy_switch() -> Switch {
        let mut switch = switch_with(KEY, lossy());
        for i in 0..10u32 {
            let now = VirtNanos::from_micros(20 * u64::from(i));
            switch.due(now);
            let (from, to) = [(A, MAC_B), (B, BROADCAST_MAC), (C, MAC_A)][i as usize % 3];
            switch.submit(now, from, frame(to, from, i)).unwrap();
        }
        switch
            .partition(VirtNanos::from_micros(700), vec![vec![A], vec![B, C]])
            .unwrap();
        switch.heal(VirtNanos::from_micros(900)).unwrap();
        switch
    }

    crate::persist::persist_round_trip_tests! {
        mod switch_persist {
            fresh: switch_with([0; 32], fixed(MICROS_100)),
            saved: busy_switch(),
            mutate: |switch: &mut Switch| {
                drain(switch);
            },
        }
    }
}
