use super::*;

fn parse(text: &str) -> Result<CampaignSpec, SpecError> {
    CampaignSpec::parse(text, Path::new("c.toml"), Path::new("/base"))
}

/// The refusal of `text`, as printed.
fn refusal(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn test_checkpoints_are_sized_from_memory_unless_the_file_bounds_them() {
    let spec = parse("manifest = \"m.toml\"").unwrap();
    assert!(spec.size_checkpoints_from_memory);
    assert_eq!(spec.live_checkpoints, SIZED_LIVE_CHECKPOINTS);
    assert_eq!(spec.checkpoint_memory, None);
    let spec = parse("manifest = \"m.toml\"\n[search]\nlive_checkpoints = 6").unwrap();
    assert!(!spec.size_checkpoints_from_memory);
    assert_eq!(spec.live_checkpoints, 6);
    let spec = parse("manifest = \"m.toml\"\n[search]\ncheckpoint_memory = \"2G\"").unwrap();
    assert!(!spec.size_checkpoints_from_memory);
    assert_eq!(spec.live_checkpoints, DEFAULT_LIVE_CHECKPOINTS);
    assert_eq!(spec.checkpoint_memory, Some(2 << 30));
    // A spec saved before sizing reads as bounded by its count.
    let mut json = serde_json::to_value(parse("manifest = \"m.toml\"").unwrap()).unwrap();
    json.as_object_mut()
        .unwrap()
        .remove("size_checkpoints_from_memory");
    let saved: CampaignSpec = serde_json::from_value(json).unwrap();
    assert!(!saved.size_checkpoints_from_memory);
}

#[test]
fn test_defaults_and_a_full_file() {
    let spec = parse("manifest = \"m.toml\"").unwrap();
    assert_eq!(spec.manifest, PathBuf::from("/base/m.toml"));
    assert_eq!(
        spec.root,
        RootRule::SetupComplete {
            wait_ns: DEFAULT_SETUP_WAIT
        }
    );
    assert_eq!(spec.slice_ns, DEFAULT_SLICE);
    assert_eq!(spec.checker, HistoryChecker::None);
    assert_eq!(spec.checkpoint_memory, None);
    assert_eq!(spec.wall_budget(), None);
    assert_eq!(spec.faults, FaultProfile::default());
    assert!(spec.spill);
    let spec = parse(
        r#"
manifest = "m.toml"
seed = 4
[root]
at = "12s"
[search]
slice = "2s"
max_depth = 5
live_checkpoints = 3
checkpoint_memory = "4G"
spill = false
[budget]
wall = "30m"
branches = 100
[checker]
history = "kv"
[faults]
exclude = ["workload", "n1"]
[faults.network]
rate = 0.5
"#,
    )
    .unwrap();
    assert_eq!(spec.seed, 4);
    assert_eq!(
        spec.root,
        RootRule::At {
            at_ns: VirtNanos::from_secs(12)
        }
    );
    assert_eq!(spec.slice_ns, VirtNanos::from_secs(2));
    assert_eq!(spec.max_depth, 5);
    assert_eq!(spec.checkpoint_memory, Some(4 << 30));
    assert!(!spec.spill);
    assert_eq!(spec.wall_budget(), Some(VirtNanos::from_secs(1800)));
    assert_eq!(spec.max_branches, 100);
    assert_eq!(spec.checker, HistoryChecker::Kv);
    assert_eq!(spec.faults.network.rate, 0.5);
    assert_eq!(spec.faults.exclude, ["workload", "n1"]);
}

#[test]
fn test_a_wall_budget_is_kept_exact_and_0_is_no_limit() {
    let wall = |w: &str| {
        parse(&format!("manifest = \"m\"\n[budget]\nwall = \"{w}\""))
            .unwrap()
            .wall_budget()
    };
    // Truncated to whole ms these were 0, which meant no limit.
    assert_eq!(wall("500us"), Some(VirtNanos(500_000)));
    assert_eq!(wall("1ns"), Some(VirtNanos(1)));
    assert_eq!(wall("2.0000005s"), Some(VirtNanos(2_000_000_500)));
    assert_eq!(wall("0s"), None);
    // Saved, it reads back exact; a campaign saved with whole ms still has its budget.
    let spec = parse("manifest = \"m\"\n[budget]\nwall = \"999us\"").unwrap();
    let json = serde_json::to_value(&spec).unwrap();
    let back: CampaignSpec = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, spec);
    let mut old = json;
    old.as_object_mut().unwrap().remove("wall");
    old["wall_ms"] = 1_800_000.into();
    let old: CampaignSpec = serde_json::from_value(old).unwrap();
    assert_eq!(old.wall_budget(), Some(VirtNanos::from_secs(1800)));
}

#[test]
fn test_a_spec_saved_with_its_faults_as_written_reads_back() {
    // Before, `faults` was the TOML table as written; as JSON it is a profile.
    let spec = parse("manifest = \"m\"\n[faults.network]\nrate = 0.5\n").unwrap();
    let mut json = serde_json::to_value(&spec).unwrap();
    json["faults"] = serde_json::json!({"network": {"rate": 0.5}, "exclude": ["n2"]});
    let old: CampaignSpec = serde_json::from_value(json).unwrap();
    assert_eq!(old.faults.network.rate, 0.5);
    assert_eq!(old.faults.exclude, ["n2"]);
    assert_eq!(old.faults.node, FaultProfile::default().node);
}

#[test]
fn test_bad_values_name_their_key() {
    for (text, key) in [
        (
            "manifest = \"m\"\n[search]\nslice = \"fast\"",
            "search.slice",
        ),
        (
            "manifest = \"m\"\n[search]\nslice = \"10us\"",
            "search.slice",
        ),
        (
            "manifest = \"m\"\n[search]\nmax_depth = 0",
            "search.max_depth",
        ),
        (
            "manifest = \"m\"\n[checker]\nhistory = \"sql\"",
            "checker.history",
        ),
        ("manifest = \"m\"\n[root]\nat = \"soon\"", "root.at"),
        (
            "manifest = \"m\"\n[root]\nat = \"1s\"\nwait = \"2s\"",
            "root.wait",
        ),
        ("manifest = \"\"", "manifest"),
    ] {
        let message = refusal(text);
        assert!(message.contains(key), "{text:?}: {message}");
        assert!(
            message.starts_with("campaign file c.toml, line "),
            "{message}"
        );
    }
    let unknown = parse("manifest = \"m\"\nsedd = 3").unwrap_err();
    assert!(matches!(unknown, SpecError::Toml { .. }));
    assert!(
        unknown
            .to_string()
            .starts_with("campaign file c.toml, line 2: sedd: unknown field `sedd`"),
        "{unknown}"
    );
}

/// A campaign file with `[faults]` far down, as the examples have it.
fn with_faults(faults: &str) -> String {
    format!(
        "manifest = \"m\"\nseed = 1\n\n[root]\nat = \"setup_complete\"\n\n[search]\nslice = \"4s\"\nmax_depth = 3\n\n[faults]\nexclude = [\"workload\"]\n\n{faults}"
    )
}

#[test]
fn test_faults_errors_name_the_file_the_key_and_the_users_line() {
    // Line 15 of the user's file; a copy printed back would say line 2.
    for (faults, want) in [
        (
            "[faults.network]\nrate = 0.2\nduration = \"1s..oops\"\n",
            "campaign file c.toml, line 16: faults.network.duration: ",
        ),
        (
            "[faults.network]\nrate = 0.2\nspeed = 3\n",
            "campaign file c.toml, line 16: faults.network.speed: unknown field `speed`",
        ),
        (
            "[faults.node]\nweights = { pause = \"many\" }\n",
            "campaign file c.toml, line 15: faults.node.weights.pause: invalid type",
        ),
        (
            "[faults.node]\nrate = 500.0\n",
            "campaign file c.toml, line 15: faults.node.rate = 500.0: 500 is not a rate",
        ),
        (
            "[faults.disk.weights]\nfsync-delay = 0\nfsync-error = 0\nfull = 0\n",
            "campaign file c.toml, line 14: faults.disk.weights: every weight is 0",
        ),
        (
            "[faults.clock]\nrate = 0.1\nweights = { step = 0, drift = 0 }\n",
            "campaign file c.toml, line 16: faults.clock.weights = { step = 0, drift = 0 }: every weight is 0",
        ),
    ] {
        let message = refusal(&with_faults(faults));
        assert!(!message.contains("its default"), "{message}");
        assert!(message.starts_with(want), "{faults:?}: {message}");
        assert!(!message.contains("fault profile"), "{message}");
    }
}

#[test]
fn test_a_fault_range_whose_minimum_cannot_fit_the_slice_is_refused() {
    let message = refusal(&with_faults("[faults.network]\nduration = \"10s..20s\"\n"));
    assert_eq!(
        message,
        "campaign file c.toml, line 15: faults.network.duration = \"10s..20s\": its minimum, 10s, is longer than a slice, search.slice = \"4s\" (line 8): no such fault fits in a branch (each is cut short to end in its slice); give a minimum of at most the slice, or a longer slice"
    );
    // The default slice (5s) against a default range, and a range that
    // only its maximum passes the slice (cut short, as documented).
    let message = refusal("manifest = \"m\"\n[faults.node]\ndown = \"6s..7s\"");
    assert!(
        message.contains("line 3: faults.node.down = \"6s..7s\""),
        "{message}"
    );
    assert!(message.contains("search.slice (not set: 5s)"), "{message}");
    parse(&with_faults("[faults.network]\nduration = \"4s..20s\"\n")).unwrap();
    // A default range the file never set is said, not refused.
    let f = file("manifest = \"m\"\n[search]\nslice = \"2s\"");
    assert_eq!(
        f.warnings,
        ["campaign file c.toml: faults.clock.duration (not set: its default, 5s..30s): its minimum, 5s, is longer than a slice, search.slice = \"2s\" (line 3): no such fault fits in a branch (each is cut short to end in its slice); set a range that fits, or turn the category off"]
    );
    // A category that draws nothing is not held to it.
    parse(&with_faults(
        "[faults.disk]\nenabled = false\nduration = \"10s\"\n",
    ))
    .unwrap();
    parse(&with_faults(
        "[faults.disk]\nrate = 0.0\nduration = \"10s\"\n",
    ))
    .unwrap();
}

#[test]
fn test_values_that_could_never_work_are_refused_with_the_reason() {
    for (text, want) in [
        ("[search]\nslice = \"5000000h\"", "line 3: search.slice = \"5000000h\": beyond the latest virtual time a campaign may name, 31536000s (365 days)"),
        ("[search]\nslice = \"0s\"", "line 3: search.slice = \"0s\": must be at least 1ms"),
        ("[root]\nat = \"5000000h\"", "line 3: root.at = \"5000000h\": beyond the latest"),
        ("[root]\nat = \"0s\"", "line 3: root.at = \"0s\": must be at least 1ns: the root is a moment after the boot began"),
        ("[root]\nwait = \"0s\"", "line 3: root.wait = \"0s\": must be at least 100ms: setup_complete is looked for every 100ms"),
        ("[search]\nmax_depth = 4294967295", "line 3: search.max_depth = 4294967295: must be 1..=1000"),
        ("[search]\nslice = \"100h\"\nmax_depth = 1000", "line 4: search.max_depth = 1000: that many slices of search.slice = \"100h\" (line 3) after the root (300s) end beyond"),
        ("[search]\nlive_checkpoints = 100000000", "line 3: search.live_checkpoints = 100000000: more than 64 needs search.checkpoint_memory"),
        ("[search]\ncheckpoint_memory = \"0\"", "line 3: search.checkpoint_memory = \"0\": must be at least 1M"),
        ("[budget]\nwall = \"forever\"", "line 3: budget.wall = \"forever\": unparsable duration"),
    ] {
        let message = refusal(&format!("manifest = \"m\"\n{text}"));
        assert!(message.starts_with("campaign file c.toml, "), "{message}");
        assert!(message.contains(want), "{text:?}: {message}");
    }
    // With checkpoint_memory, memory bounds the checkpoints instead.
    let spec = parse(
        "manifest = \"m\"\n[search]\nlive_checkpoints = 100000000\ncheckpoint_memory = \"2G\"",
    )
    .unwrap();
    assert_eq!(spec.live_checkpoints, 100_000_000);
    // The bounds themselves are fine.
    parse(
        "manifest = \"m\"\n[search]\nslice = \"1ms\"\nmax_depth = 1000\n[root]\nwait = \"100ms\"",
    )
    .unwrap();
    parse("manifest = \"m\"\n[search]\nslice = \"365d\"").unwrap_err();
    parse("manifest = \"m\"\n[search]\nslice = \"8760h\"\nmax_depth = 1\n[root]\nat = \"1ns\"")
        .unwrap_err();
    parse("manifest = \"m\"\n[search]\nslice = \"8000h\"\nmax_depth = 1\n[root]\nat = \"1ns\"")
        .unwrap();
}

fn file(text: &str) -> CampaignFile {
    CampaignFile::parse(text, Path::new("c.toml"), Path::new("/base")).unwrap()
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn test_every_node_name_is_one_of_the_manifests() {
    let nodes = names(&["n1", "n2", "n3"]);
    let check = |text: &str| {
        file(&with_faults(text))
            .check_nodes(&nodes, &[])
            .map_err(|e| e.to_string())
    };
    check("").unwrap();
    for (exclude, line, name) in [
        ("[\"workoad\"]", 12, "workoad"),
        ("[\"n1\",\n  \"n9\"]", 13, "n9"),
        ("[\"\"]", 12, ""),
    ] {
        let text =
            with_faults("").replace("exclude = [\"workload\"]", &format!("exclude = {exclude}"));
        let message = file(&text)
            .check_nodes(&nodes, &[])
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with(&format!(
                "campaign file c.toml, line {line}: faults.exclude["
            )),
            "{message}"
        );
        assert!(
            message.ends_with(&format!(
                ": no node is named {name:?} (the manifest's nodes: n1, n2, n3; or \"workload\")"
            )),
            "{message}"
        );
    }
    let text = "manifest = \"m\"\n[search]\nexclude = [\"n4\"]";
    let message = file(text).check_nodes(&nodes, &[]).unwrap_err().to_string();
    assert!(
        message.starts_with("campaign file c.toml, line 3: search.exclude[0] = \"n4\": no node"),
        "{message}"
    );
}

#[test]
fn test_no_node_left_for_faults_or_no_disk_for_disk_faults_is_refused() {
    let nodes = names(&["n1", "workload"]);
    let all = with_faults("").replace("[\"workload\"]", "[\"workload\", \"n1\"]");
    let message = file(&all).check_nodes(&nodes, &[]).unwrap_err().to_string();
    assert!(message.starts_with("campaign file c.toml, line 12: faults.exclude = [\"workload\", \"n1\"]: every node of the manifest (n1, workload) is excluded"), "{message}");
    // Nothing drawn: nothing to refuse.
    let off = "[faults.network]\nenabled = false\n[faults.node]\nenabled = false\n[faults.clock]\nenabled = false\n[faults.disk]\nenabled = false\n";
    file(&format!("{all}\n{off}"))
        .check_nodes(&nodes, &[])
        .unwrap();
    // Disks: only when the file turns them on, with no node left to fault.
    let disk_on = with_faults("[faults.disk]\nenabled = true\n");
    let message = file(&disk_on)
        .check_nodes(&nodes, &[])
        .unwrap_err()
        .to_string();
    assert!(message.starts_with("campaign file c.toml, line 15: faults.disk.enabled = true: no node of the manifest has a disk"), "{message}");
    let message = file(&disk_on.replace(
        "[\"workload\"]",
        "[\"workload\", \"n1\"]\n[faults.network]\nrate = 0.1",
    ))
    .check_nodes(&names(&["n1", "n2", "workload"]), &names(&["n1"]))
    .unwrap_err()
    .to_string();
    assert!(
        message.contains("every node with a disk (n1) is excluded"),
        "{message}"
    );
    file(&disk_on).check_nodes(&nodes, &names(&["n1"])).unwrap();
    // The default (disk faults on where there are disks) is not refused.
    file(&with_faults("")).check_nodes(&nodes, &[]).unwrap();
}

#[test]
fn test_exclude_under_search_is_read_and_warned_about() {
    let f = file("manifest = \"m\"\n[search]\nexclude = [\"n1\"]");
    assert_eq!(f.spec.exclude, ["n1"]);
    assert_eq!(
        f.warnings,
        ["campaign file c.toml, line 3: search.exclude = [\"n1\"]: read, but its place is faults.exclude (as in the examples; docs/campaigns.md): move it there, adding \"workload\" (a faults.exclude replaces the default, [\"workload\"])"]
    );
    assert!(file("manifest = \"m\"\n[faults]\nexclude = [\"n1\"]")
        .warnings
        .is_empty());
}

#[test]
fn test_the_printed_defaults_are_the_default_profile_as_a_campaign_file_says_it() {
    let spec = parse(&format!(
        "manifest = \"m\"\n{}",
        crate::profile::DEFAULT_PROFILE_TOML
    ))
    .unwrap();
    assert_eq!(spec.faults, FaultProfile::default());
}

#[test]
fn test_a_toml_syntax_error_is_one_line_at_the_users_line() {
    let message = refusal("manifest = \"m\"\nx = [\n");
    assert_eq!(
        message,
        "campaign file c.toml, line 3: invalid array: expected `]`"
    );
    let message = refusal("manifest = \"m\"\n[search]\nslice = 5\n");
    assert_eq!(
        message,
        "campaign file c.toml, line 3: search.slice: invalid type: integer `5`, expected a string"
    );
}

#[test]
fn test_a_spec_is_stored_as_the_build_before_typed_times_stored_it() {
    // The campaign database's `spec` key, as written while the root's,
    // the slice's and the wait's times were `u64`s: the same bytes now.
    for (file, text) in [
        (
            "manifest = \"m.toml\"\nseed = 4\n[root]\nat = \"12.5s\"\n[search]\nslice = \"2500ms\"\nmax_depth = 5\ncheckpoint_memory = \"4G\"\n[budget]\nwall = \"30m\"\nbranches = 100\n[checker]\nhistory = \"kv\"\n[faults.network]\nrate = 0.5\n",
            include_str!("testdata/stored_spec_root_at.json"),
        ),
        (
            // (Its live checkpoints then defaulted to 8; now, unbounded by
            // the file, they are sized from memory.)
            "manifest = \"m.toml\"\n[root]\nwait = \"90s\"\n[search]\nlive_checkpoints = 8\n",
            include_str!("testdata/stored_spec_setup_complete.json"),
        ),
    ] {
        let spec = parse(file).unwrap();
        assert_eq!(serde_json::to_string(&spec).unwrap(), text.trim_end());
        assert_eq!(serde_json::from_str::<CampaignSpec>(text).unwrap(), spec);
    }
    let at = parse(
        "manifest = \"m\"\n[root]\nat = \"12.5s\"\n[search]\nslice = \"2500ms\"\nmax_depth = 5\n",
    )
    .unwrap();
    assert_eq!(
        at.root,
        RootRule::At {
            at_ns: VirtNanos(12_500_000_000)
        }
    );
    assert_eq!(at.slice_ns, VirtNanos(2_500_000_000));
}

#[test]
fn test_a_sharded_spec_keeps_its_shard_and_an_unsharded_one_says_nothing() {
    let mut spec = parse("manifest = \"m.toml\"\n").unwrap();
    assert_eq!(spec.shard, crate::shard::Shard::WHOLE);
    let whole = serde_json::to_string(&spec).unwrap();
    assert!(!whole.contains("shard"), "{whole}");
    spec.shard = "1/3".parse().unwrap();
    let json = serde_json::to_string(&spec).unwrap();
    assert!(
        json.ends_with(",\"shard\":{\"index\":1,\"count\":3}}"),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<CampaignSpec>(&json).unwrap(), spec);
    // Not a key of the campaign file: every shard reads the same file.
    let error = parse("manifest = \"m.toml\"\nshard = \"1/3\"\n").unwrap_err();
    assert!(
        error.to_string().contains("unknown field `shard`"),
        "{error}"
    );
}
