use super::error::ACTIONS;
use super::test_support::{assert_to_switch_and_back, parse_error, parse_fault, parse_fault_after};
use super::*;
use devices::switch::Fault as SwitchFault;
use devices::PortId;
use guest_agent::protocol::HostToAgent;
use proptest::prelude::*;

#[test]
fn test_fault_kinds_name_beginnings_and_not_endings() {
    let kind = |text: &str| parse_fault(text).unwrap()[0].action.kind();
    assert_eq!(kind("at=1s pause n1"), Some("pause"));
    assert_eq!(kind("at=1s resume n1"), None);
    assert_eq!(kind("at=1s partition n1 | n2"), Some("partition"));
    assert_eq!(kind("at=1s cut n1 <-> n2"), Some("cut"));
    assert_eq!(kind("at=1s heal"), None);
    assert_eq!(kind("at=1s kill n1"), Some("kill"));
    let paused = parse_fault("at=1s pause n1 for=2s").unwrap();
    let kinds: Vec<_> = paused.iter().map(|f| f.action.kind()).collect();
    assert_eq!(kinds, [Some("pause"), None]);
}

fn s(v: &str) -> String {
    v.to_string()
}

fn secs(n: u64) -> VirtNanos {
    VirtNanos(n * 1_000_000_000)
}

fn pause(node: &str) -> FaultAction {
    FaultAction::Node(NodeFault::Pause { node: s(node) })
}

#[test]
fn test_partition_with_duration_heals_later() {
    let faults = parse_fault("at=10s partition n1 | n2,n3 for=15s").unwrap();
    assert_eq!(
        faults,
        vec![
            ScheduledFault {
                at: secs(10),
                action: FaultAction::Network(NetworkFault::Partition(vec![
                    vec![s("n1")],
                    vec![s("n2"), s("n3")]
                ]))
            },
            ScheduledFault {
                at: secs(25),
                action: FaultAction::Network(NetworkFault::Heal)
            },
        ]
    );
    // The text as users wrote it, less for= (now the second fault).
    assert_eq!(faults[0].to_string(), "at=10s partition n1 | n2,n3");
    assert_eq!(faults[1].to_string(), "at=25s heal");
}

#[test]
fn test_pause_for_resumes_and_kill_takes_signal() {
    let faults = parse_fault("pause n2 at=30s for=5s").unwrap();
    assert_eq!(faults[0].action, pause("n2"));
    assert_eq!(
        faults[1].action,
        FaultAction::Node(NodeFault::Resume { node: s("n2") })
    );
    assert_eq!(faults[1].at, secs(35));
    let kill = parse_fault("at=1s kill n1 signal=15").unwrap();
    assert_eq!(
        kill[0].action,
        FaultAction::Node(NodeFault::Kill {
            node: s("n1"),
            signal: Some(15)
        })
    );
    assert_eq!(
        parse_fault("at=1s kill n1").unwrap()[0].action,
        FaultAction::Node(NodeFault::Kill {
            node: s("n1"),
            signal: Some(9)
        })
    );
}

#[test]
fn test_clock_faults_parse_print_and_drift_for_stops_the_drift() {
    let faults = parse_fault("at=10s drift n2 +200ppm for=60s").unwrap();
    assert_eq!(
        faults,
        vec![
            ScheduledFault {
                at: secs(10),
                action: FaultAction::Node(NodeFault::Drift {
                    node: s("n2"),
                    ppm: 200
                })
            },
            ScheduledFault {
                at: secs(70),
                action: FaultAction::Node(NodeFault::Drift {
                    node: s("n2"),
                    ppm: 0
                })
            },
        ]
    );
    assert_eq!(faults[0].to_string(), "at=10s drift n2 +200ppm");
    assert_eq!(faults[1].to_string(), "at=70s drift n2 0ppm");
    let step = parse_fault("at=5s clock n3 -1.5s").unwrap();
    assert_eq!(
        step[0].action,
        FaultAction::Node(NodeFault::ClockStep {
            node: s("n3"),
            by_ns: -1_500_000_000
        })
    );
    assert_eq!(step[0].to_string(), "at=5s clock n3 -1.5s");
    let err = |t: &str| format!("{:#}", anyhow::Error::from(parse_fault(t).unwrap_err()));
    assert!(err("at=1s clock n2 30s").contains("clock step: expected a sign"));
    assert!(err("at=1s clock n2").contains("clock takes a node and a signed step"));
    assert!(err("at=1s clock n2 +30s for=5s").contains("for= applies"));
    assert!(err("at=1s drift n2 200").contains("drift rate: expected a whole number of ppm"));
    assert!(err("at=1s drift n2 +2000000ppm").contains("beyond the largest drift"));
    assert!(err("at=1s drift +20ppm").contains("drift takes a node and a rate"));
}

#[test]
fn test_a_setting_given_twice_or_a_time_beyond_the_largest_is_refused() {
    let err = parse_error;
    assert_eq!(
        err("at=1s at=2s pause n1"),
        "fault \"at=1s at=2s pause n1\": at= is given twice"
    );
    assert!(err("at=1s pause n1 for=1s for=2s").ends_with("for= is given twice"));
    assert!(err("at=1s kill n1 signal=9 signal=15").ends_with("signal= is given twice"));
    assert!(err("at=1s slow n1 latency=1ms latency=2ms").ends_with("latency= is given twice"));
    let beyond = parse_fault_after("at=+1s pause n1", Some(VirtNanos(u64::MAX)))
        .map(|_| ())
        .unwrap_err();
    assert!(format!("{:#}", anyhow::Error::from(beyond)).ends_with(
        "at=+1s: the branch point 18446744073.709551615s plus that is beyond the largest time"
    ));
    // Past MAX_VIRTUAL_TIME, or for=0s: accepted before, they never worked.
    let max = crate::units::MAX_VIRTUAL_TIME;
    parse_fault(&format!("at={max} pause n1 for=1s")).unwrap();
    parse_fault(&format!("at=1s pause n1 for={max}")).unwrap();
    let beyond = "at=1s pause n1 for=5000000h";
    assert_eq!(
        err(beyond),
        format!("fault {beyond:?}: for=18000000000s: beyond the latest virtual time a fault may name, 31536000s (365 days)")
    );
    assert!(err("at=5000000h pause n1").contains(": at=18000000000s: beyond the latest"));
    assert!(err(&format!("at={} pause n1", VirtNanos(max.0 + 1)))
        .contains("beyond the latest virtual time"));
    assert!(err("at=1s pause n1 for=0s").ends_with(
        "for=0s: a fault undone the moment it happens does nothing (give a duration above 0s, or no for=)"
    ));
}

#[test]
fn test_bad_faults_name_the_problem() {
    let err = parse_error;
    assert!(err("partition n1 | n2").contains("missing at="));
    assert!(err("at=1s explode n1").contains("unknown action \"explode\""));
    assert!(err("at=1s pause").contains("exactly one node"));
    assert!(err("at=1s partition n1 | | n2").contains("group is empty"));
    assert!(err("at=1s partition n1 | n1").contains("two groups"));
    assert!(err("at=1s restart n1 for=2s").contains("for= applies"));
    assert!(err("at=1s pause n1 signal=9").contains("only applies to kill"));
    assert!(err("at=1s kill n1 signal=99").contains("not a signal number"));
    assert!(err("at=soon heal").contains("at=: unparsable duration"));
    assert!(err("at=1s heal color=red").contains("unknown setting \"color\""));
    assert!(err("at=1s").contains("no action"));
    assert!(err("at=1s pause N1").contains("\"N1\" is not a node name"));
    assert!(err("at=1s clock n\u{0}1 +1s").contains("is not a node name"));
    // Found by the file_fault fuzz target: a stray `x=` and a NUL taken
    // as node names printed as a text that did not read back.
    assert!(
        err("at=1s cut n\u{0}3,:, fsync-delay= <->s cut n1 for=2s").contains("is not a node name")
    );
    assert!(err("at=1s cut n1 <-> n2 n3").contains("\"n2 n3\" is not a node name"));
    // Every message names the fault as written.
    assert!(err("at=1s pause").starts_with("fault \"at=1s pause\": "));
    // A fault lasts as written: for= is scheduled as its undoing action.
    let lasting: Fault = "at=1s pause n1 for=2s".parse().unwrap();
    assert_eq!(lasting.lasting, Some(secs(2)));
    assert_eq!(lasting.to_string(), "at=1s pause n1 for=2s");
}

#[test]
fn test_relative_times_count_from_the_branch_point_only() {
    let base = VirtNanos::from_secs(20);
    let faults = parse_fault_after("at=+2s pause n1 for=3s", Some(base)).unwrap();
    assert_eq!(faults[0].at, VirtNanos::from_secs(22));
    assert_eq!(faults[1].at, VirtNanos::from_secs(25));
    // Absolute times stay absolute at a branch.
    let faults = parse_fault_after("at=30s heal", Some(base)).unwrap();
    assert_eq!(faults[0].at, VirtNanos::from_secs(30));
    // A resolved fault prints (and reads back) as an absolute one.
    assert_eq!(
        parse_fault(&faults[0].to_string()).unwrap(),
        [faults[0].clone()]
    );
    // Written, a relative time stays relative.
    let written: Fault = "at=+2s pause n1 for=3s".parse().unwrap();
    assert_eq!(written.at, FaultTime::AfterBranch(secs(2)));
    assert_eq!(written.to_string(), "at=+2s pause n1 for=3s");
    let err = format!(
        "{:#}",
        anyhow::Error::from(parse_fault("at=+2s heal").unwrap_err())
    );
    assert!(
        err.contains("at=+<duration> is relative to a branch point"),
        "{err}"
    );
}

#[test]
fn test_a_fault_error_chain_names_each_cause_once() {
    let chain = |e: FaultError| format!("{:#}", anyhow::Error::from(e));
    assert_eq!(
        chain(parse_fault("at=soon heal").unwrap_err()),
        "fault \"at=soon heal\": at=: unparsable duration \"soon\": expected a decimal number \
         and a unit (ns, us or µs, ms, s, m or min, h; no unit means seconds), e.g. 12.5s, 250ms or 600"
    );
    assert_eq!(
        chain(parse_fault("at=1s explode n1").unwrap_err()),
        format!("fault \"at=1s explode n1\": unknown action \"explode\" ({ACTIONS})")
    );
    // Serialized, an action's error is one message with its causes.
    let bad = serde_json::from_str::<FaultAction>(r#""pause""#).unwrap_err();
    assert_eq!(
        bad.to_string(),
        "fault action \"pause\": pause takes exactly one node name"
    );
}

#[test]
fn test_schedule_orders_by_time_and_checks_names() {
    let nodes = vec![s("n1"), s("n2")];
    let faults = parse_faults(&["at=5s pause n1 for=10s", "at=7s kill n2"]).unwrap();
    let faults = schedule(&faults, &nodes).unwrap();
    let times: Vec<u64> = faults.iter().map(|f| f.at.0 / 1_000_000_000).collect();
    assert_eq!(times, vec![5, 7, 15]);
    let err = schedule(&parse_faults(&["at=1s pause n9"]).unwrap(), &nodes).unwrap_err();
    assert_eq!(
        err.to_string(),
        "fault at=1s pause n9: no node is named \"n9\" (nodes: n1, n2)"
    );
    let err = schedule(
        &parse_faults(&["at=1s partition n1 | n2,n3"]).unwrap(),
        &nodes,
    )
    .unwrap_err();
    assert!(err.to_string().contains("no node is named \"n3\""));
}

#[test]
fn test_every_node_fault_becomes_its_agent_message() {
    let cases = [
        ("pause n1", HostToAgent::Pause { node: s("n1") }),
        ("resume n1", HostToAgent::Resume { node: s("n1") }),
        (
            "kill n1",
            HostToAgent::Kill {
                node: s("n1"),
                signal: 9,
            },
        ),
        (
            "kill n1 signal=15",
            HostToAgent::Kill {
                node: s("n1"),
                signal: 15,
            },
        ),
        ("restart n1", HostToAgent::Restart { node: s("n1") }),
        (
            "clock n1 +30s",
            HostToAgent::StepClock {
                node: s("n1"),
                by_ns: 30_000_000_000,
            },
        ),
        (
            "clock n1 -2s",
            HostToAgent::StepClock {
                node: s("n1"),
                by_ns: -2_000_000_000,
            },
        ),
        (
            "drift n1 +200ppm",
            HostToAgent::DriftClock {
                node: s("n1"),
                ppm: 200,
            },
        ),
    ];
    for (text, message) in cases {
        match text.parse::<FaultAction>().unwrap() {
            FaultAction::Node(fault) => {
                assert_eq!(fault.node(), "n1");
                assert_eq!(HostToAgent::from(fault), message, "{text}");
            }
            other => panic!("{text}: {other:?} is not the agent's"),
        }
    }
}

#[test]
fn test_every_network_fault_goes_to_the_switch_and_back() {
    let names = vec![s("n1"), s("n2"), s("n3")];
    // NIC i (node i) sits on the switch port of its virtio slot.
    let ports = [PortId(2), PortId(3), PortId(4)];
    let cases = [
        (
            "partition n1 | n3,n2",
            SwitchFault::Partition(vec![vec![PortId(2)], vec![PortId(4), PortId(3)]]),
        ),
        (
            "partition n2",
            SwitchFault::Partition(vec![vec![PortId(3)]]),
        ),
        ("heal", SwitchFault::Heal),
    ];
    assert_to_switch_and_back(&cases);
    let FaultAction::Network(unknown) = "partition n1 | n9".parse().unwrap() else {
        unreachable!()
    };
    let err = unknown.to_switch(&names, &ports).unwrap_err();
    assert!(err.to_string().contains("no node \"n9\""), "{err}");
    let stray = SwitchFault::Partition(vec![vec![PortId(9)]]);
    assert_eq!(NetworkFault::from_switch(&stray, &names, &ports), None);
}

#[test]
fn test_faults_serialize_as_their_text() {
    let fault = parse_fault("at=1500ms kill n1 signal=15")
        .unwrap()
        .remove(0);
    let json = serde_json::to_string(&fault).unwrap();
    assert_eq!(json, r#"{"at":1500000000,"action":"kill n1 signal=15"}"#);
    assert_eq!(
        serde_json::from_str::<ScheduledFault>(&json).unwrap(),
        fault
    );
    let written: Fault = "at=+1.5s  pause n1 for=250ms".parse().unwrap();
    let json = serde_json::to_string(&written).unwrap();
    assert_eq!(json, r#""at=+1.5s pause n1 for=250ms""#);
    assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), written);
    let bad = serde_json::from_str::<Fault>(r#""at=+1s paws n1""#).unwrap_err();
    assert!(
        bad.to_string()
            .starts_with("fault \"at=+1s paws n1\": unknown action \"paws\""),
        "{bad}"
    );
    let FaultAction::Node(node) = fault.action else {
        unreachable!()
    };
    assert_eq!(
        serde_json::to_string(&node).unwrap(),
        r#""kill n1 signal=15""#
    );
    assert!(serde_json::from_str::<NodeFault>(r#""heal""#).is_err());
    assert!(serde_json::from_str::<FaultAction>(r#""explode n1""#).is_err());
}

fn node_name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,6}"
}

fn action() -> impl Strategy<Value = FaultAction> {
    let partition = (
        prop::collection::btree_set(node_name(), 1..8),
        prop::collection::vec(1usize..4, 8),
    )
        .prop_map(|(names, sizes)| {
            let names: Vec<String> = names.into_iter().collect();
            let mut groups = Vec::new();
            let mut rest = names.as_slice();
            for size in sizes {
                if rest.is_empty() {
                    break;
                }
                let (group, tail) = rest.split_at(size.min(rest.len()));
                groups.push(group.to_vec());
                rest = tail;
            }
            groups
        })
        .prop_shuffle()
        .prop_map(|groups| FaultAction::Network(NetworkFault::Partition(groups)));
    prop_oneof![
        partition,
        Just(FaultAction::Network(NetworkFault::Heal)),
        super::network_tests::link_fault().prop_map(FaultAction::Network),
        node_name().prop_map(|node| FaultAction::Node(NodeFault::Pause { node })),
        node_name().prop_map(|node| FaultAction::Node(NodeFault::Resume { node })),
        (node_name(), prop::option::of(1..=64i32))
            .prop_map(|(node, signal)| FaultAction::Node(NodeFault::Kill { node, signal })),
        node_name().prop_map(|node| FaultAction::Node(NodeFault::Restart { node })),
        disk_action(),
    ]
}

fn disk_action() -> impl Strategy<Value = FaultAction> {
    prop_oneof![
        node_name().prop_map(|node| FaultAction::Node(NodeFault::Crash { node })),
        node_name().prop_map(|node| FaultAction::Node(NodeFault::DiskFull { node })),
        node_name().prop_map(|node| FaultAction::Node(NodeFault::DiskFree { node })),
        (node_name(), time())
            .prop_map(|(node, delay)| FaultAction::Disk(DiskFault::FsyncDelay { node, delay })),
        node_name().prop_map(|node| FaultAction::Disk(DiskFault::FsyncError { node })),
        node_name().prop_map(|node| FaultAction::Disk(DiskFault::FsyncOk { node })),
        (node_name(), -(1i64 << 53)..(1i64 << 53))
            .prop_map(|(node, by_ns)| FaultAction::Node(NodeFault::ClockStep { node, by_ns })),
        (node_name(), -crate::units::MAX_PPM..=crate::units::MAX_PPM)
            .prop_map(|(node, ppm)| FaultAction::Node(NodeFault::Drift { node, ppm })),
    ]
}

/// Times `parse_duration` reads back exactly: below 2^53 ns, often round.
fn time() -> impl Strategy<Value = VirtNanos> {
    prop_oneof![
        0u64..(1 << 53),
        (0u64..1_000_000).prop_map(|n| n * 1_000_000_000),
        (0u64..1_000_000).prop_map(|n| n * 1_000_000),
        (0u64..1_000_000).prop_map(|n| n * 1_000),
    ]
    .prop_map(VirtNanos)
}

/// Since boot or after a branch point.
fn fault_time() -> impl Strategy<Value = FaultTime> {
    prop_oneof![
        time().prop_map(FaultTime::SinceBoot),
        time().prop_map(FaultTime::AfterBranch),
    ]
}

proptest! {
    #[test]
    fn prop_fault_text_round_trips(at in fault_time(), action in action(), base in time()) {
        let fault = Fault { at, action, lasting: None };
        let text = fault.to_string();
        prop_assert_eq!(text.parse::<Fault>().unwrap(), fault.clone(), "{}", text);
        let json = serde_json::to_string(&fault).unwrap();
        prop_assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), fault.clone());
        let at = match at {
            FaultTime::SinceBoot(at) => at,
            FaultTime::AfterBranch(after) => VirtNanos(base.0 + after.0),
        };
        let scheduled = ScheduledFault { at, action: fault.action.explicit() };
        prop_assert_eq!(parse_fault_after(&text, Some(base)).unwrap(), vec![scheduled.clone()]);
        prop_assert_eq!(parse_fault(&scheduled.to_string()).unwrap(), vec![scheduled.clone()]);
        let json = serde_json::to_string(&scheduled).unwrap();
        prop_assert_eq!(serde_json::from_str::<ScheduledFault>(&json).unwrap(), scheduled);
    }

    #[test]
    fn prop_for_adds_the_undoing_fault(
        at in time(),
        action in action(),
        d in time().prop_filter("for=0s is refused", |d| *d > VirtNanos::ZERO),
    ) {
        let fault = ScheduledFault { at, action: action.explicit() };
        let text = format!("{fault} for={d}");
        match fault.action.undo() {
            Some(undo) => {
                prop_assert_eq!(
                    parse_fault(&text).unwrap(),
                    vec![fault.clone(), ScheduledFault { at: VirtNanos(at.0.saturating_add(d.0)), action: undo }]
                );
                let written: Fault = text.parse().unwrap();
                prop_assert_eq!(written.lasting, Some(d));
                prop_assert_eq!(written.to_string(), text);
            }
            None => prop_assert!(parse_fault(&text).is_err()),
        }
    }
}

/// The faults whose schedule `testdata/` holds, as the build before typed
/// faults wrote it (one of each action, a kill with and one without its
/// signal).
const WRITTEN: [&str; 16] = [
    "at=1s kill n1",
    "at=1.5s restart n1",
    "at=2s kill n2 signal=15",
    "at=2.5s restart n2",
    "at=3s pause n1 for=1s",
    "at=5s crash n1",
    "at=6s restart n1",
    "at=7s clock n2 -1.5s",
    "at=8s drift n2 +20ppm for=1s",
    "at=10s disk n1 full for=1s",
    "at=12s partition n1 | n2 for=1s",
    "at=14s slow n2 latency=1ms..2ms for=1s",
    "at=16s loss n1 0.25 for=1s",
    "at=18s disk n1 fsync-delay=5ms for=1s",
    "at=20s cut n1 <-> n2 for=1s",
    "at=22s partition n1 -> n2 for=1s",
];

/// A run's schedule (`run.json`'s `faults`), the conductor's faults (a
/// snapshot's `up` state) and the fault events (records) serialize byte
/// for byte as before faults were typed: a kill written without its signal
/// is recorded with it.
#[test]
fn test_a_schedule_serializes_as_the_build_before_typed_faults() {
    let nodes = vec![s("n1"), s("n2")];
    let scheduled = schedule(&parse_faults(&WRITTEN).unwrap(), &nodes).unwrap();
    assert_eq!(
        serde_json::to_string(&scheduled).unwrap(),
        include_str!("testdata/scheduled.json").trim_end()
    );
    let conductor: Vec<(VirtNanos, NodeFault)> = scheduled
        .iter()
        .filter_map(|f| match &f.action {
            FaultAction::Node(node) => Some((f.at, node.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        serde_json::to_string(&conductor).unwrap(),
        include_str!("testdata/conductor_faults.json").trim_end()
    );
    let events: Vec<crate::up::UpEvent> = scheduled
        .iter()
        .map(|f| crate::up::UpEvent::Fault {
            action: f.action.clone(),
        })
        .collect();
    assert_eq!(
        serde_json::to_string(&events).unwrap(),
        include_str!("testdata/fault_events.json").trim_end()
    );
    // And they read back.
    let back: Vec<ScheduledFault> =
        serde_json::from_str(include_str!("testdata/scheduled.json")).unwrap();
    assert_eq!(back, scheduled);
}

#[test]
fn test_a_kill_prints_as_written_and_is_scheduled_with_its_signal() {
    let kill: Fault = "at=+1s kill n1".parse().unwrap();
    assert_eq!(kill.to_string(), "at=+1s kill n1");
    let scheduled = kill.scheduled(Some(secs(1))).unwrap();
    assert_eq!(scheduled[0].to_string(), "at=2s kill n1 signal=9");
    let FaultAction::Node(node) = kill.action else {
        unreachable!()
    };
    assert_eq!(
        HostToAgent::from(node),
        HostToAgent::Kill {
            node: s("n1"),
            signal: 9
        }
    );
}

#[test]
fn test_disk_faults_parse_print_and_expand_for() {
    // Arrange / Act
    let delay = parse_fault("at=1s disk n1 fsync-delay=500ms for=10s").unwrap();
    let error = parse_fault("at=2s disk n1 fsync-error for=5s").unwrap();
    let full = parse_fault("at=3s disk n2 full for=1s").unwrap();
    let crash = parse_fault("at=4s crash n1").unwrap();

    // Assert
    let texts =
        |faults: &[ScheduledFault]| faults.iter().map(|f| f.to_string()).collect::<Vec<_>>();
    assert_eq!(
        texts(&delay),
        ["at=1s disk n1 fsync-delay=500ms", "at=11s disk n1 fsync-ok"]
    );
    assert_eq!(
        texts(&error),
        ["at=2s disk n1 fsync-error", "at=7s disk n1 fsync-ok"]
    );
    assert_eq!(texts(&full), ["at=3s disk n2 full", "at=4s disk n2 free"]);
    assert_eq!(texts(&crash), ["at=4s crash n1"]);
    assert_eq!(
        delay[0].action,
        FaultAction::Disk(DiskFault::FsyncDelay {
            node: "n1".into(),
            delay: VirtNanos(500_000_000)
        })
    );
}

#[test]
fn test_bad_disk_faults_say_what_is_wrong() {
    let err = |text: &str| format!("{:#}", anyhow::Error::from(parse_fault(text).unwrap_err()));
    assert!(err("at=1s disk n1").contains("write disk <node> followed by"));
    assert!(err("at=1s disk n1 sideways").contains("unknown disk fault \"sideways\""));
    assert!(err("at=1s disk n1 fsync-delay=soon").contains("fsync-delay="));
    assert!(err("at=1s disk n1 fsync-ok for=1s").contains("for= applies to"));
    assert!(err("at=1s crash n1 n2").contains("crash takes exactly one node name"));
}
