//! The network faults' tests: their text, their undoing, and their trip
//! to the switch and back.

use super::network::*;
use super::test_support::{assert_to_switch_and_back, parse_error, parse_fault};
use super::{FaultAction, ScheduledFault};
use devices::switch::{Fault as SwitchFault, Links, Probability};
use devices::{LatencyDist, PortId, VirtNanos};
use proptest::prelude::*;

fn s(v: &str) -> String {
    v.to_string()
}

fn network(text: &str) -> NetworkFault {
    match text.parse::<FaultAction>() {
        Ok(FaultAction::Network(fault)) => fault,
        other => panic!("{text}: {other:?}"),
    }
}

fn ms(n: u64) -> VirtNanos {
    VirtNanos(n * 1_000_000)
}

#[test]
fn test_link_faults_parse_with_their_undo() {
    let cut = parse_fault("at=1s cut n1 <-> n2,n3 for=2s").unwrap();
    let links = Links {
        from: vec![s("n1")],
        to: vec![s("n2"), s("n3")],
        both_ways: true,
    };
    assert_eq!(
        cut[0].action,
        FaultAction::Network(NetworkFault::Cut(links.clone()))
    );
    assert_eq!(cut[1].to_string(), "at=3s heal n1 <-> n2,n3");
    let one_way = parse_fault("at=1s partition n1->n2 for=1s").unwrap();
    assert_eq!(one_way[0].to_string(), "at=1s partition n1 -> n2");
    assert_eq!(one_way[1].to_string(), "at=2s heal n1 -> n2");
    let bridge = parse_fault("at=1s bridge for=1s").unwrap();
    assert_eq!(bridge[1].to_string(), "at=2s heal");
    let ring = parse_fault("at=1s majorities-ring for=1s").unwrap();
    assert_eq!(
        ring[0].action,
        FaultAction::Network(NetworkFault::MajoritiesRing)
    );
}

#[test]
fn test_slow_and_loss_parse_and_end_with_off() {
    let slow = parse_fault("at=2s slow n1 latency=200ms..800ms for=10s").unwrap();
    assert_eq!(
        slow[0].action,
        FaultAction::Network(NetworkFault::Slow {
            node: s("n1"),
            latency: Some(LatencyRange {
                min: ms(200),
                max: ms(800)
            })
        })
    );
    assert_eq!(slow[1].to_string(), "at=12s slow n1 off");
    let loss = parse_fault("at=1s loss n2 0.3 for=5s").unwrap();
    assert_eq!(loss[0].to_string(), "at=1s loss n2 0.3");
    assert_eq!(loss[1].to_string(), "at=6s loss n2 off");
    assert_eq!(
        network("slow n1 latency=5ms").to_string(),
        "slow n1 latency=5ms"
    );
}

#[test]
fn test_bad_network_faults_name_the_problem() {
    let err = parse_error;
    assert!(err("at=1s cut n1 | n2").contains("cut is both ways"));
    assert!(err("at=1s cut n1 <->").contains("both sides of <->"));
    assert!(err("at=1s cut n1 <-> n1,n2").contains("n1 is on both sides"));
    assert!(err("at=1s partition n1 <-> n2").contains("both ways is cut"));
    assert!(err("at=1s partition n1 | n2 -> n3").contains("groups (|) and -> do not mix"));
    assert!(err("at=1s bridge n1").contains("bridge takes no arguments"));
    assert!(err("at=1s slow n1").contains("slow takes one node and latency="));
    assert!(err("at=1s slow n1 latency=9ms..1ms").contains("minimum is above"));
    assert!(err("at=1s slow n1 latency=fast").contains("latency=: unparsable duration"));
    assert!(err("at=1s loss n1 1.5").contains("not a probability"));
    assert!(err("at=1s loss n1").contains("loss takes one node and a probability"));
    assert!(err("at=1s pause n1 latency=1s").contains("latency= only applies to slow"));
    assert!(err("at=1s slow n1 latency=1ms..100000h")
        .ends_with("latency=1ms..100000h: above the largest latency, 60s"));
    parse_fault("at=1s slow n1 latency=60s").unwrap();
    assert!(err("at=1s heal n1 off").contains("heal needs nodes on both sides"));
    assert!(err("at=1s slow n1 off for=1s").contains("for= applies"));
}

#[test]
fn test_every_new_network_fault_goes_to_the_switch_and_back() {
    let names = vec![s("n1"), s("n2"), s("n3")];
    let ports = [PortId(2), PortId(3), PortId(4)];
    let links = |from: Vec<PortId>, to: Vec<PortId>, both_ways| Links {
        from,
        to,
        both_ways,
    };
    let cases = [
        (
            "cut n1 <-> n3,n2",
            SwitchFault::Block(links(vec![PortId(2)], vec![PortId(4), PortId(3)], true)),
        ),
        (
            "partition n2 -> n1",
            SwitchFault::Block(links(vec![PortId(3)], vec![PortId(2)], false)),
        ),
        (
            "heal n2 -> n1",
            SwitchFault::Unblock(links(vec![PortId(3)], vec![PortId(2)], false)),
        ),
        ("bridge", SwitchFault::Bridge(ports.to_vec())),
        (
            "majorities-ring",
            SwitchFault::MajoritiesRing(ports.to_vec()),
        ),
        (
            "slow n3 latency=1ms..2ms",
            SwitchFault::Slow {
                port: PortId(4),
                latency: Some(LatencyDist::Uniform {
                    min: ms(1),
                    max: ms(2),
                }),
            },
        ),
        (
            "slow n3 latency=1ms",
            SwitchFault::Slow {
                port: PortId(4),
                latency: Some(LatencyDist::Fixed(ms(1))),
            },
        ),
        (
            "loss n1 0.25",
            SwitchFault::Loss {
                port: PortId(2),
                loss: Some(Probability::new(0.25).unwrap()),
            },
        ),
        (
            "loss n1 off",
            SwitchFault::Loss {
                port: PortId(2),
                loss: None,
            },
        ),
    ];
    assert_to_switch_and_back(&cases);
    let err = network("slow n9 off")
        .to_switch(&names, &ports)
        .unwrap_err();
    assert!(err.to_string().contains("no node \"n9\""), "{err}");
}

fn node_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,6}"
}

/// Two disjoint, non-empty lists of names.
fn sides() -> impl Strategy<Value = (Vec<String>, Vec<String>)> {
    (prop::collection::btree_set(node_name(), 2..8), 1usize..7).prop_map(|(names, split)| {
        let names: Vec<String> = names.into_iter().collect();
        let split = split.min(names.len() - 1);
        (names[..split].to_vec(), names[split..].to_vec())
    })
}

fn latency() -> impl Strategy<Value = LatencyRange> {
    (0..=devices::MAX_LATENCY.0, 0..=devices::MAX_LATENCY.0).prop_map(|(a, b)| LatencyRange {
        min: VirtNanos(a.min(b)),
        max: VirtNanos(a.max(b)),
    })
}

/// The network faults this module adds (the existing ones are in the
/// parent's strategy).
pub(in crate::faults) fn link_fault() -> impl Strategy<Value = NetworkFault> {
    let links = || {
        (sides(), any::<bool>()).prop_map(|((from, to), both_ways)| Links {
            from,
            to,
            both_ways,
        })
    };
    let probability = prop_oneof![
        Just(0.0),
        Just(1.0),
        0.0..=1.0f64,
        (0u32..=1000).prop_map(|n| f64::from(n) / 1000.0)
    ]
    .prop_map(|p| Probability::new(p).unwrap());
    prop_oneof![
        links().prop_map(NetworkFault::Cut),
        links().prop_map(NetworkFault::HealLinks),
        Just(NetworkFault::Bridge),
        Just(NetworkFault::MajoritiesRing),
        (node_name(), prop::option::of(latency()))
            .prop_map(|(node, latency)| NetworkFault::Slow { node, latency }),
        (node_name(), prop::option::of(probability))
            .prop_map(|(node, loss)| NetworkFault::Loss { node, loss }),
    ]
}

proptest! {
    #[test]
    fn prop_network_fault_goes_to_the_switch_and_back(fault in link_fault()) {
        let mut names: Vec<String> = fault.nodes().iter().map(|n| n.to_string()).collect();
        names.sort();
        names.dedup();
        let ports: Vec<PortId> = (0..names.len()).map(|i| PortId(i + 2)).collect();
        let on_switch = fault.to_switch(&names, &ports).unwrap();
        prop_assert_eq!(NetworkFault::from_switch(&on_switch, &names, &ports), Some(fault));
    }

    #[test]
    fn prop_undo_of_a_timed_fault_prints_back(at in 0u64..(1 << 40), fault in link_fault()) {
        let fault = ScheduledFault { at: VirtNanos(at), action: FaultAction::Network(fault) };
        let text = format!("{fault} for=1s");
        let parsed = parse_fault(&text);
        match &fault.action {
            FaultAction::Network(n) if n.undo().is_some() => {
                let parsed = parsed.unwrap();
                prop_assert_eq!(&parsed[0], &fault);
                prop_assert_eq!(parse_fault(&parsed[1].to_string()).unwrap(), vec![parsed[1].clone()]);
            }
            _ => prop_assert!(parsed.is_err()),
        }
    }
}
