//! The network switch's frame handling, driven as `Devices` drives it:
//! frames the guests' NICs transmit are submitted at the current virtual
//! time, then everything due is delivered; between steps time advances,
//! faults are scheduled and link configurations change, all chosen by the
//! input.
//!
//! Invariants asserted:
//! 1. No panic (an invalid configuration or fault is a typed error).
//! 2. At most `MAX_IN_FLIGHT` frames are in flight, after every step.
//! 3. Every delivered frame is, byte for byte, a frame that was submitted
//!    (each carries a unique tag), to a port other than its sender: a
//!    unicast one only to the port with its destination address.
//! 4. No duplication unless a duplicate probability above zero was ever in
//!    force: each (frame, destination) is delivered at most once, else at
//!    most twice.
//! 5. The ports' `delivered` counters add up to the frames handed out.
//! 6. Determinism: a second switch fed the same steps, with a save, a JSON
//!    round trip and a restore into a fresh switch wherever the input asks,
//!    delivers exactly the same frames and ends in the same state.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use devices::persist::Persist;
use devices::switch::{Fault, LatencyDist, Links, NetworkConfig, Probability, MAX_IN_FLIGHT};
use devices::{PortId, Switch, VirtNanos};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

/// Ports on the switch (as NICs in slots 0..PORTS).
const PORTS: usize = 4;
/// Frames of one burst at most (minimal ones, 18 bytes, broadcast to
/// three ports): enough to reach `MAX_IN_FLIGHT`.
const MAX_BURST: usize = 1600;
/// Frames per input at most (each costs up to a thousand draws), and
/// their bytes: a save/restore step is in proportion to what is in flight
/// (a JSON number per byte), a second for a few megabytes under the
/// sanitizer, which is the snapshot format's cost, not a hang.
const MAX_FRAMES: usize = 4000;
const MAX_FRAME_BYTES: usize = 48 << 10;
/// Save/restore steps per input at most: each costs time in proportion to
/// the frames in flight (thousands), and more find nothing new.
const MAX_RESTORES: usize = 1;

#[derive(Arbitrary, Debug, Clone)]
enum Latency {
    Fixed(u32),
    Uniform(u32, u32),
    Normal(u32, u32, u8),
}

impl Latency {
    /// Latencies in the millisecond range and beyond (the maximum is a
    /// minute): `value << 8` nanoseconds.
    fn dist(&self) -> LatencyDist {
        let ns = |v: u32| VirtNanos(u64::from(v) << 8);
        match *self {
            Latency::Fixed(v) => LatencyDist::Fixed(ns(v)),
            Latency::Uniform(a, b) => LatencyDist::Uniform {
                min: ns(a),
                max: ns(b),
            },
            Latency::Normal(a, b, terms) => LatencyDist::Normal {
                min: ns(a),
                max: ns(b),
                terms,
            },
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
struct Config {
    latency: Latency,
    loss: u8,
    duplicate: u8,
    reorder: u8,
    reorder_delay: Latency,
}

impl Config {
    fn network(&self) -> NetworkConfig {
        // 0..=255 onto 0.0..=1.0, with 255 above 1 (an invalid config).
        let p = |v: u8| f64::from(v) / 254.0;
        NetworkConfig {
            latency: self.latency.dist(),
            loss: p(self.loss),
            duplicate: p(self.duplicate),
            reorder: p(self.reorder),
            reorder_delay: self.reorder_delay.dist(),
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum FaultKind {
    Partition(Vec<Vec<u8>>),
    Heal,
    Block(Vec<u8>, Vec<u8>, bool),
    Unblock(Vec<u8>, Vec<u8>, bool),
    Bridge(Vec<u8>),
    MajoritiesRing(Vec<u8>),
    Slow(u8, Option<Latency>),
    Loss(u8, Option<u8>),
}

/// Ports from bytes; some beyond the switch's (an error to expect).
fn ports(bytes: &[u8]) -> Vec<PortId> {
    bytes.iter().map(|&b| PortId(usize::from(b % 6))).collect()
}

impl FaultKind {
    fn fault(&self) -> Option<Fault> {
        Some(match self {
            FaultKind::Partition(groups) => {
                Fault::Partition(groups.iter().map(|g| ports(g)).collect())
            }
            FaultKind::Heal => Fault::Heal,
            FaultKind::Block(from, to, both_ways) => Fault::Block(Links {
                from: ports(from),
                to: ports(to),
                both_ways: *both_ways,
            }),
            FaultKind::Unblock(from, to, both_ways) => Fault::Unblock(Links {
                from: ports(from),
                to: ports(to),
                both_ways: *both_ways,
            }),
            FaultKind::Bridge(p) => Fault::Bridge(ports(p)),
            FaultKind::MajoritiesRing(p) => Fault::MajoritiesRing(ports(p)),
            FaultKind::Slow(port, latency) => Fault::Slow {
                port: PortId(usize::from(*port % 6)),
                latency: latency.as_ref().map(Latency::dist),
            },
            FaultKind::Loss(port, loss) => Fault::Loss {
                port: PortId(usize::from(*port % 6)),
                loss: match loss {
                    Some(l) => Some(Probability::new(f64::from(*l) / 254.0).ok()?),
                    None => None,
                },
            },
        })
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum Destination {
    Port(u8),
    Broadcast,
    Multicast,
    Nobody,
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    /// A NIC transmits a frame (of `len` bytes, possibly shorter than a header).
    Send {
        from: u8,
        to: Destination,
        len: u16,
    },
    /// A NIC transmits `count` broadcast frames at once.
    Burst {
        from: u8,
        count: u16,
    },
    /// Time passes by `ns << shift`.
    Advance {
        ns: u16,
        shift: u8,
    },
    Schedule {
        after: u32,
        fault: FaultKind,
    },
    SetConfig(Config),
    SetLinkConfig {
        from: u8,
        to: u8,
        config: Option<Config>,
    },
    /// Save, serialize, deserialize and restore into a fresh switch
    /// (only in the second run).
    SaveRestore,
}

#[derive(Arbitrary, Debug)]
struct Input {
    key: [u8; 32],
    config: Config,
    ops: Vec<Op>,
}

fn mac(port: usize) -> [u8; 6] {
    [0x52, 0x54, 0, 0, 0, port as u8]
}

/// What the run observed, compared between the two runs.
#[derive(Debug, PartialEq, Default)]
struct Trace {
    deliveries: Vec<(u64, usize, Vec<u8>)>,
    errors: Vec<String>,
}

struct Sent {
    from: usize,
    bytes: Vec<u8>,
}

fn new_switch(input: &Input) -> Option<Switch> {
    let mut switch = Switch::new(input.key, input.config.config_or_none()?).ok()?;
    for port in 0..PORTS {
        switch.add_port(PortId(port), mac(port));
    }
    Some(switch)
}

impl Config {
    fn config_or_none(&self) -> Option<NetworkConfig> {
        let config = self.network();
        config.validate().ok().map(|()| config)
    }
}

fn frame(to: &Destination, from: usize, tag: u32, len: u16) -> Vec<u8> {
    let destination = match to {
        Destination::Port(p) => mac(usize::from(*p) % PORTS),
        Destination::Broadcast => [0xff; 6],
        Destination::Multicast => [0x01, 0x00, 0x5e, 0, 0, 1],
        Destination::Nobody => [0x52, 0x54, 0, 0, 0, 0xee],
    };
    let mut bytes = Vec::with_capacity(usize::from(len));
    bytes.extend_from_slice(&destination);
    bytes.extend_from_slice(&mac(from));
    bytes.extend_from_slice(&[0x88, 0xb5]);
    bytes.extend_from_slice(&tag.to_le_bytes());
    // Shorter than a header: dropped. Otherwise long enough for the tag.
    let len = match usize::from(len) {
        len if len < 14 => len,
        len => len.max(bytes.len()),
    };
    bytes.resize(len.max(bytes.len()), 0xa5);
    bytes.truncate(len);
    bytes
}

fn run(input: &Input, restore: bool) -> Option<(Trace, devices::SwitchState)> {
    let mut switch = new_switch(input)?;
    let mut now = VirtNanos::ZERO;
    let mut trace = Trace::default();
    let mut sent: Vec<Sent> = Vec::new();
    let mut copies: BTreeMap<(usize, usize), u32> = BTreeMap::new();
    let mut duplicates_possible = switch.config().duplicate > 0.0;
    let mut delivered_total = 0u64;
    let mut restores = 0;
    let mut sent_bytes = 0;

    for op in &input.ops {
        let mut submitted = Vec::new();
        match op {
            Op::Send { from, to, len } => {
                let from = usize::from(*from) % PORTS;
                submitted.push((from, frame(to, from, sent.len() as u32, *len % 1600)));
            }
            Op::Burst { from, count } => {
                let from = usize::from(*from) % PORTS;
                let count =
                    (usize::from(*count) % MAX_BURST).min(MAX_FRAMES.saturating_sub(sent.len()));
                for _ in 0..count {
                    let tag = (sent.len() + submitted.len()) as u32;
                    submitted.push((from, frame(&Destination::Broadcast, from, tag, 18)));
                }
            }
            Op::Advance { ns, shift } => {
                now = now.saturating_add(VirtNanos(u64::from(*ns) << (shift % 40)));
            }
            Op::Schedule { after, fault } => {
                if let Some(fault) = fault.fault() {
                    let at = now.saturating_add(VirtNanos(u64::from(*after) << 8));
                    if let Err(e) = switch.schedule_fault(at, fault) {
                        trace.errors.push(e.to_string());
                    }
                }
            }
            Op::SetConfig(config) => {
                let config = config.network();
                match switch.set_config(config) {
                    Ok(()) => duplicates_possible |= config.duplicate > 0.0,
                    Err(e) => trace.errors.push(e.to_string()),
                }
            }
            Op::SetLinkConfig { from, to, config } => {
                let config = config.as_ref().map(Config::network);
                let (from, to) = (PortId(usize::from(*from % 6)), PortId(usize::from(*to % 6)));
                match switch.set_link_config(from, to, config) {
                    Ok(()) => {
                        duplicates_possible |= config.is_some_and(|c| c.duplicate > 0.0);
                    }
                    Err(e) => trace.errors.push(e.to_string()),
                }
            }
            Op::SaveRestore => {
                if restore && restores < MAX_RESTORES {
                    restores += 1;
                    let json = serde_json::to_string(&switch.save()).expect("state serializes");
                    let state = serde_json::from_str(&json).expect("state deserializes");
                    let mut fresh = new_switch(input)?;
                    fresh.restore(&state).expect("a saved state restores");
                    assert_eq!(fresh.save(), state, "restore changed the state");
                    switch = fresh;
                }
            }
        }
        // As Devices does: submit what the NICs sent now, then deliver.
        for (from, bytes) in submitted {
            sent_bytes += bytes.len();
            if sent_bytes > MAX_FRAME_BYTES {
                break;
            }
            switch
                .submit(now, PortId(from), bytes.clone())
                .expect("every NIC is a port");
            sent.push(Sent { from, bytes });
        }
        assert!(
            switch.in_flight_len() <= MAX_IN_FLIGHT,
            "in flight over the cap"
        );
        for (port, bytes) in switch.due(now) {
            let to = port.0;
            assert!(to < PORTS, "delivered to a port that does not exist");
            let tag = bytes
                .get(14..18)
                .map(|t| u32::from_le_bytes(t.try_into().expect("4 bytes")))
                .expect("a delivered frame has a header and a tag");
            let original = sent
                .get(tag as usize)
                .expect("delivered a frame never sent");
            assert_eq!(
                original.bytes, bytes,
                "delivered bytes differ from those sent"
            );
            assert_ne!(original.from, to, "frame delivered back to its sender");
            let destination = &bytes[..6];
            if destination[0] & 1 == 0 {
                assert_eq!(destination, mac(to), "unicast frame to the wrong port");
            }
            let count = copies.entry((tag as usize, to)).or_default();
            *count += 1;
            let allowed = if duplicates_possible { 2 } else { 1 };
            assert!(*count <= allowed, "frame delivered {count} times");
            delivered_total += 1;
            trace.deliveries.push((now.0, to, bytes));
        }
        let counted: u64 = (0..PORTS)
            .map(|p| switch.counters(PortId(p)).expect("port").delivered)
            .sum();
        assert_eq!(counted, delivered_total, "delivered counters disagree");
    }
    Some((trace, switch.save()))
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let Some(plain) = run(&input, false) else {
        return;
    };
    let restored = run(&input, true).expect("the same input builds the same switch");
    assert_eq!(plain.0, restored.0, "a save/restore changed the deliveries");
    assert_eq!(
        plain.1, restored.1,
        "a save/restore changed the final state"
    );
});
