use super::*;
use proptest::prelude::*;
use run::faults::{Fault, FaultAction, NetworkFault, NodeFault, ScheduledFault};

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn secs(s: u64) -> VirtNanos {
    VirtNanos::from_secs(s)
}

/// Every action of a draw's faults, scheduled at branch point 0.
fn schedule_all(faults: &[Fault]) -> Vec<ScheduledFault> {
    faults
        .iter()
        .flat_map(|f| {
            f.scheduled(Some(VirtNanos(0)))
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

/// A draw's faults as their texts.
fn texts(faults: &[Fault]) -> Vec<String> {
    faults.iter().map(Fault::to_string).collect()
}

/// The error chain of a refused profile.
fn refusal(text: &str) -> String {
    let err = FaultProfile::from_toml(text).unwrap_err();
    let mut chain = err.to_string();
    let mut source = std::error::Error::source(&err);
    while let Some(s) = source {
        chain.push_str(&format!(": {s}"));
        source = s.source();
    }
    chain
}

#[test]
fn test_the_default_profile_is_valid_and_round_trips_through_toml() {
    let profile = FaultProfile::default();
    profile.validate().unwrap();
    assert_eq!(profile.exclude, ["workload"]);
    let text = profile.to_toml();
    assert_eq!(FaultProfile::from_toml(&text).unwrap(), profile);
    // The annotated default, a campaign file's [faults], reads back as the default.
    let mut file: toml::Table = toml::from_str(DEFAULT_PROFILE_TOML).unwrap();
    let faults: FaultProfile = file.remove("faults").unwrap().try_into().unwrap();
    assert_eq!(faults, profile);
    // An empty file is the default profile.
    assert_eq!(FaultProfile::from_toml("").unwrap(), profile);
}

#[test]
fn test_a_written_profile_round_trips_text_to_profile_to_text() {
    let text = r#"exclude = ["client", "n9"]

[network]
enabled = true
rate = 0.25
duration = "500ms..3s"
latency = "1ms..2ms"
loss = "0.1..0.3"

[network.weights]
partition = 1
cut = 0
one-way = 0
bridge = 2
majorities-ring = 0
slow = 0
loss = 5

[node]
enabled = false
rate = 0.0
pause = "1s"
down = "2s..4s"

[node.weights]
pause = 1
kill = 1
restart = 0
crash = 0

[clock]
enabled = true
rate = 1.5
step = "1us..1ms"
drift = "0ppm..999999ppm"
duration = "10s"

[clock.weights]
step = 0
drift = 3

[disk]
enabled = true
rate = 0.05
fsync-delay = "10ms..1s"
duration = "1s..2s"

[disk.weights]
fsync-delay = 1
fsync-error = 0
full = 0
"#;
    let profile = FaultProfile::from_toml(text).unwrap();
    assert_eq!(profile.network.weights.loss, 5);
    assert_eq!(profile.clock.drift.max, Ppm(999_999));
    assert_eq!(profile.to_toml(), text);
    // A partial profile keeps the defaults it does not mention.
    let partial = FaultProfile::from_toml("[network]\nrate = 0.5\n").unwrap();
    assert_eq!(partial.network.rate, 0.5);
    assert_eq!(partial.network.weights, NetworkWeights::default());
    assert_eq!(partial.node, NodeProfile::default());
}

#[test]
fn test_bad_profiles_name_the_key() {
    let cases = [
        ("[network]\nrate = -1.0", "network.rate: -1 is not a rate"),
        ("[clock]\nrate = 1000.0", "clock.rate: 1000 is not a rate"),
        (
            "[node]\npause = \"0s..1s\"",
            "node.pause: 0s..1s: a duration must be above 0s",
        ),
        (
            "[disk.weights]\nfsync-delay = 0\nfsync-error = 0\nfull = 0",
            "disk.weights: every weight is 0",
        ),
        (
            "[network]\nduration = \"5s..1s\"",
            "\"5s..1s\": the minimum is above the maximum",
        ),
        (
            "[network]\nloss = \"0.5..2\"",
            "\"0.5..2\": not a probability (a number in 0..=1)",
        ),
        ("[network.weights]\nexplode = 1", "unknown field `explode`"),
        ("[nodes]\nrate = 1.0", "unknown field `nodes`"),
        (
            "[clock]\ndrift = \"5ppm..2000000ppm\"",
            "beyond the largest drift",
        ),
        // Accepted before, then every step drawn above 292 years failed.
        (
            "[clock]\nstep = \"1s..5000000h\"",
            "clock.step: 1s..18000000000s: beyond the largest step, 9223372036.854775807s",
        ),
    ];
    for (text, expected) in cases {
        let chain = refusal(text);
        assert!(chain.contains(expected), "{text}: {chain}");
        assert!(chain.starts_with("fault profile"), "{chain}");
    }
    // The TOML errors point at the key's line.
    assert!(refusal("[network]\nloss = \"0.5..2\"").contains("loss = "));
    // A disabled category may have every weight 0.
    FaultProfile::from_toml(
        "[disk]\nenabled = false\n[disk.weights]\nfsync-delay = 0\nfsync-error = 0\nfull = 0",
    )
    .unwrap();
    // A profile built in code is checked the same way.
    let mut profile = FaultProfile::default();
    profile.network.latency = Span {
        min: secs(2),
        max: secs(1),
    };
    assert_eq!(
        profile.validate().unwrap_err().to_string(),
        "fault profile: network.latency: 2s..1s: the minimum is above the maximum"
    );
    profile.network.latency = Span {
        min: secs(1),
        max: secs(61),
    };
    assert_eq!(
        profile.validate().unwrap_err().to_string(),
        "fault profile: network.latency: 1s..61s: above the largest latency, 60s"
    );
}

#[test]
fn test_one_seed_draws_the_same_faults_and_two_seeds_differ() {
    let profile = FaultProfile::default();
    let nodes = names(&["n1", "n2", "n3", "workload"]);
    let disks = names(&["n1", "n2", "n3"]);
    let draw = |seed| profile.draw(seed, secs(120), &nodes, &disks);
    let first = draw(1);
    assert!(first.len() >= 5, "{first:?}");
    assert_eq!(draw(1), first);
    assert_ne!(draw(2), first);
    // Changing one category never moves another's draws.
    let mut quieter = profile.clone();
    quieter.clock.rate = 0.0;
    let network = |faults: Vec<Fault>| -> Vec<Fault> {
        faults
            .into_iter()
            .filter(|f| matches!(f.action, FaultAction::Network(_)))
            .collect()
    };
    assert_eq!(
        network(quieter.draw(1, secs(120), &nodes, &disks)),
        network(first)
    );
}

/// Clock steps take no lane, so their count is the arrival process's.
#[test]
fn test_the_rate_is_faults_per_virtual_second() {
    let mut profile = FaultProfile::default();
    profile.network.enabled = false;
    profile.node.enabled = false;
    profile.disk.enabled = false;
    profile.clock.rate = 2.0;
    profile.clock.weights = ClockWeights { step: 1, drift: 0 };
    let nodes = names(&["n1", "n2"]);
    let texts = texts(&profile.draw(5, secs(1000), &nodes, &[]));
    // Expected 2000, standard deviation about 45.
    assert!((1800..2200).contains(&texts.len()), "{}", texts.len());
    assert!(texts.iter().all(|t| t.contains(" clock n")));
    // Backwards and forwards both occur.
    assert!(texts.iter().any(|t| t.contains(" -")) && texts.iter().any(|t| t.contains(" +")));
    // Shorter than a tick: nothing.
    assert!(profile
        .draw(5, VirtNanos(9_000_000), &nodes, &[])
        .is_empty());
}

#[test]
fn test_weights_excludes_and_disks_decide_what_is_drawn() {
    let mut profile = FaultProfile {
        exclude: names(&["workload"]),
        ..FaultProfile::default()
    };
    profile.network.rate = 5.0;
    profile.node.rate = 5.0;
    profile.clock.rate = 5.0;
    profile.disk.rate = 5.0;
    profile.network.weights = NetworkWeights {
        partition: 1,
        cut: 0,
        one_way: 0,
        bridge: 0,
        majorities_ring: 0,
        slow: 1,
        loss: 0,
    };
    let nodes = names(&["n1", "n2", "n3", "workload"]);
    let disks = names(&["n2"]);
    let faults = schedule_all(&profile.draw(11, secs(300), &nodes, &disks));
    let mut kinds = std::collections::BTreeSet::new();
    for fault in &faults {
        match &fault.action {
            FaultAction::Network(NetworkFault::Partition(groups)) => {
                kinds.insert("partition");
                // Every node is in a group: the workload is never alone
                // in a group of the nodes left out.
                assert_eq!(groups.iter().flatten().count(), 4, "{fault}");
                assert!(groups.iter().all(|g| g != &["workload".to_string()]));
            }
            FaultAction::Network(NetworkFault::Slow { node, .. }) => {
                kinds.insert("slow");
                assert_ne!(node, "workload");
            }
            FaultAction::Network(NetworkFault::Heal) => {}
            FaultAction::Network(other) => panic!("weight 0: {other}"),
            FaultAction::Node(NodeFault::Crash { node }) => {
                kinds.insert("crash");
                assert_eq!(node, "n2", "only n2 has a disk");
            }
            FaultAction::Disk(disk) => {
                kinds.insert("disk");
                assert_eq!(disk.node(), "n2");
            }
            FaultAction::Node(node) => {
                kinds.insert(match node {
                    NodeFault::DiskFull { .. } | NodeFault::DiskFree { .. } => "disk",
                    _ => "node",
                });
                assert_ne!(node.node(), "workload", "{fault}");
            }
        }
    }
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["crash", "disk", "node", "partition", "slow"]
    );
    // No disks: no disk faults and no crashes.
    let texts = texts(&profile.draw(11, secs(300), &nodes, &[]));
    assert!(texts
        .iter()
        .all(|t| !t.contains(" disk ") && !t.contains(" crash ")));
    // Every node excluded: only faults naming no node.
    profile.exclude = nodes.clone();
    profile.network.weights.bridge = 1;
    let faults = schedule_all(&profile.draw(11, secs(300), &nodes, &disks));
    assert!(!faults.is_empty());
    assert!(
        faults.iter().all(|f| f.action.nodes().is_empty()),
        "{faults:?}"
    );
}

#[test]
fn test_faults_of_one_lane_never_overlap_and_kills_restart() {
    let mut profile = FaultProfile::default();
    profile.network.rate = 3.0;
    profile.node.rate = 3.0;
    let nodes = names(&["a", "b", "c"]);
    let faults = schedule_all(&profile.draw(3, secs(200), &nodes, &names(&["a"])));
    // The network's topology: each partition-like fault is healed before
    // the next starts.
    let mut blocked = false;
    let mut paused = std::collections::BTreeSet::new();
    let mut down = std::collections::BTreeSet::new();
    let mut sorted = faults.clone();
    sorted.sort_by_key(|f| f.at);
    for fault in &sorted {
        match &fault.action {
            FaultAction::Network(
                NetworkFault::Partition(_)
                | NetworkFault::Cut(_)
                | NetworkFault::Bridge
                | NetworkFault::MajoritiesRing,
            ) => {
                assert!(!blocked, "{fault} while another is on");
                blocked = true;
            }
            FaultAction::Network(NetworkFault::Heal | NetworkFault::HealLinks(_)) => {
                assert!(blocked);
                blocked = false;
            }
            FaultAction::Node(NodeFault::Pause { node }) => {
                assert!(
                    !down.contains(node) && paused.insert(node.clone()),
                    "{fault}"
                );
            }
            FaultAction::Node(NodeFault::Resume { node }) => assert!(paused.remove(node)),
            FaultAction::Node(
                NodeFault::Kill {
                    node,
                    signal: Some(9),
                }
                | NodeFault::Crash { node },
            ) => {
                assert!(
                    !paused.contains(node) && down.insert(node.clone()),
                    "{fault}"
                );
            }
            FaultAction::Node(NodeFault::Restart { node }) => {
                assert!(!paused.contains(node), "{fault}");
                down.remove(node);
            }
            _ => {}
        }
    }
    assert!(!blocked && paused.is_empty() && down.is_empty());
}

fn node_sets() -> impl Strategy<Value = (Vec<String>, Vec<String>, Vec<String>)> {
    prop::collection::btree_set("[a-z][a-z0-9-]{0,5}", 1..7).prop_flat_map(|set| {
        let nodes: Vec<String> = set.into_iter().collect();
        let n = nodes.len();
        (
            Just(nodes),
            prop::collection::vec(any::<bool>(), n),
            prop::collection::vec(prop::bool::weighted(0.2), n),
        )
            .prop_map(|(nodes, disk, excluded)| {
                let pick = |flags: &[bool]| -> Vec<String> {
                    nodes
                        .iter()
                        .zip(flags)
                        .filter(|(_, f)| **f)
                        .map(|(n, _)| n.clone())
                        .collect()
                };
                (pick(&disk), pick(&excluded), nodes.clone())
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Every drawn text parses at a branch point, names only the run's
    /// nodes (never an excluded one, but in a partition's groups), and
    /// starts and ends inside the slice.
    #[test]
    fn prop_every_drawn_fault_parses_and_stays_in_the_slice(
        seed in any::<u64>(),
        (disks, exclude, nodes) in node_sets(),
        slice_ms in 0u64..120_000,
        rate in 0.0f64..3.0,
    ) {
        let mut profile = FaultProfile { exclude: exclude.clone(), ..FaultProfile::default() };
        for rate_of in [
            &mut profile.network.rate, &mut profile.node.rate,
            &mut profile.clock.rate, &mut profile.disk.rate,
        ] {
            *rate_of = rate;
        }
        let slice = VirtNanos(slice_ms * 1_000_000);
        let drawn = profile.draw(seed, slice, &nodes, &disks);
        prop_assert_eq!(&profile.draw(seed, slice, &nodes, &disks), &drawn);
        for written in &drawn {
            // Its text (what a campaign's database holds) reads back as it.
            let text = written.to_string();
            prop_assert_eq!(&text.parse::<Fault>().unwrap(), written, "{}", text);
            let faults = written.scheduled(Some(VirtNanos(0)));
            prop_assert!(faults.is_ok(), "{}: {:?}", text, faults);
            for fault in faults.unwrap() {
                prop_assert!(fault.at < slice, "{} ends after the slice", text);
                fault.check_nodes(&nodes).unwrap();
                let partition = matches!(fault.action, FaultAction::Network(NetworkFault::Partition(_)));
                for node in fault.action.nodes() {
                    prop_assert!(partition || !exclude.iter().any(|e| e == node), "{}", text);
                }
                if let FaultAction::Disk(disk) = &fault.action {
                    prop_assert!(disks.iter().any(|d| d == disk.node()));
                }
            }
        }
    }
}

/// Drawn faults print as the draw before faults were typed wrote them
/// (every category, seeds 1 to 4, a path as a campaign's database and
/// findings hold it): the same seed draws the same faults, byte for byte.
#[test]
fn test_draws_serialize_as_the_build_before_typed_faults() {
    let mut profile = FaultProfile::default();
    profile.exclude.clear();
    profile.network.rate = 3.0;
    profile.node.rate = 3.0;
    profile.clock.enabled = true;
    profile.clock.rate = 3.0;
    profile.disk.enabled = true;
    profile.disk.rate = 3.0;
    profile.network.enabled = true;
    profile.node.enabled = true;
    let nodes = names(&["n1", "n2", "n3", "n4"]);
    let disks = names(&["n1", "n2"]);
    let mut path = crate::step::Path::default();
    for seed in 1..=4 {
        let faults = profile.draw(seed, secs(4), &nodes, &disks);
        path = path.child(seed, faults, secs(4));
    }
    let json = serde_json::to_string(&path).unwrap();
    assert_eq!(json, include_str!("testdata/drawn_path.json").trim_end());
    assert_eq!(crate::step::Path::from_json(&json).unwrap(), path);
}
