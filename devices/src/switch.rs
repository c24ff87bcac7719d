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

mod config;
mod faults;
mod tap;

pub use config::{LatencyDist, NetworkConfig, MAX_LATENCY};
pub use faults::{Fault, Links, Probability};
pub use tap::{DropReason, FrameEvent, FrameTap};

use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use config::chance;
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
    /// Copies of this port's frames dropped because [`MAX_IN_FLIGHT`]
    /// frames were in flight already (not saved while 0, so that states
    /// without such drops are unchanged).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub dropped_full: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// The most frames (copies, per destination) in flight in the switch at
/// once. A copy that would exceed it is dropped and counted
/// (`dropped_full`, [`DropReason::Full`]): a decision made by count, at
/// submit, so it is as deterministic as the rest. With frames of at most
/// `virtio::net::MAX_FRAME_LEN` bytes this bounds the switch's memory to
/// about 256 MiB, however long the latencies (at most
/// [`config::MAX_LATENCY`]) and however fast the guest sends.
pub const MAX_IN_FLIGHT: usize = 4096;

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
    /// The partition in force as states saved before blocked links held it
    /// (read, never written: restored as the links it blocks).
    #[serde(default, skip_serializing)]
    pub partition: Option<Vec<Vec<PortId>>>,
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

    /// Draws from now on come from the start of the ChaCha20 streams keyed
    /// by `key` (a branch's alternate history), the slow-latency stream's
    /// too; everything else stays. The slow stream is derived from the
    /// main stream's key, as a restored switch derives it: a switch
    /// re-keyed and then saved and restored draws what it would have drawn.
    pub fn rekey(&mut self, key: [u8; 32]) {
        self.rng = ChaCha20Rng::from_seed(key);
        self.slow_rng = slow_stream(key);
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
            if self.in_flight.len() >= MAX_IN_FLIGHT {
                self.count(from, |c| &mut c.dropped_full);
                let at = self.now;
                self.log(|| FrameEvent {
                    at,
                    from,
                    to,
                    dropped: Some(DropReason::Full),
                    frame: frame_bytes,
                });
                continue;
            }
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
            blocked: blocked_of(state),
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
            partition: None,
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

/// The links `state` blocks, those of a partition saved the old way included.
fn blocked_of(state: &SwitchState) -> BTreeSet<(PortId, PortId)> {
    let mut blocked = state.blocked.clone();
    if let Some(groups) = &state.partition {
        let partition = Fault::Partition(groups.clone());
        for &from in state.ports.keys() {
            for &to in state.ports.keys() {
                if partition.blocks(from, to) {
                    blocked.insert((from, to));
                }
            }
        }
    }
    blocked
}

/// A nested per-link map flattened to (from, to) keys.
fn pairs<T: Copy>(map: &BTreeMap<PortId, BTreeMap<PortId, T>>) -> BTreeMap<(PortId, PortId), T> {
    map.iter()
        .flat_map(|(&from, links)| links.iter().map(move |(&to, &value)| ((from, to), value)))
        .collect()
}

#[cfg(test)]
mod tests;
