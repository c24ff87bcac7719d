use super::*;
use fuzzer::findings::{FindingFile, FINDING_FORMAT};
use fuzzer::spec::CampaignSpec;
use std::path::Path;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-4
}

/// Published Wilson score intervals (95%), e.g. 0 of 10 is 0-0.2775 and 5
/// of 10 is 0.2366-0.7634.
#[test]
fn test_the_wilson_interval_has_its_known_values() {
    let cases = [
        (0, 10, 0.0, 0.0, 0.2775),
        (5, 10, 0.5, 0.2366, 0.7634),
        (1, 2, 0.5, 0.0945, 0.9055),
        (0, 32, 0.0, 0.0, 0.1072),
        (32, 32, 1.0, 0.8928, 1.0),
        (3, 32, 0.09375, 0.0324, 0.2422),
        (1, 1, 1.0, 0.2065, 1.0),
    ];
    for (failed, runs, rate, low, high) in cases {
        let r = Rate::wilson(failed, runs);
        assert!(
            close(r.rate, rate) && close(r.low, low) && close(r.high, high),
            "{failed}/{runs}: {r:?}"
        );
    }
    assert_eq!(
        Rate::wilson(3, 32).to_string(),
        "3/32 = 9.4% (95% CI 3.2%-24.2%)"
    );
}

fn reproduced() -> ControlCheck {
    ControlCheck {
        expected_digest: "d0".into(),
        digest: "d0".into(),
        reproduced: true,
    }
}

#[test]
fn test_verified_only_when_the_control_fails_and_the_patched_system_never_does() {
    let (ok, text) = verdict(&reproduced(), &Rate::wilson(2, 2), &Rate::wilson(0, 2));
    assert!(ok, "{text}");
    assert_eq!(
        text,
        "verified: patched failed 0/2 = 0.0% (95% CI 0.0%-65.8%), unpatched control failed 2/2 = 100.0% (95% CI 34.2%-100.0%)"
    );

    let (ok, text) = verdict(&reproduced(), &Rate::wilson(2, 2), &Rate::wilson(1, 2));
    assert!(!ok);
    assert!(
        text.starts_with("not verified: the patched system failed; patched failed 1/2"),
        "{text}"
    );

    // A control that never fails proves nothing about the patch.
    let (ok, text) = verdict(&reproduced(), &Rate::wilson(0, 4), &Rate::wilson(0, 4));
    assert!(!ok);
    assert!(
        text.contains("the unpatched control never failed") && text.contains("control failed 0/4"),
        "{text}"
    );

    let check = ControlCheck {
        digest: "other".into(),
        reproduced: false,
        ..reproduced()
    };
    let (ok, text) = verdict(&check, &Rate::wilson(1, 2), &Rate::wilson(0, 2));
    assert!(!ok);
    assert!(
        text.contains(
            "did not reproduce the finding at seed offset 0 (digest other, finding.json's d0)"
        ),
        "{text}"
    );
}

fn steps() -> Vec<Step> {
    [(5, 11), (9, u64::MAX)]
        .into_iter()
        .map(|(at, seed)| Step {
            at_ns: VirtNanos(at * 1_000_000_000),
            seed,
            faults: Vec::new(),
        })
        .collect()
}

#[test]
fn test_seed_offset_zero_is_the_finding_s_history_and_offsets_round_trip() {
    let steps = steps();
    let own = SeedChoice::at(7, &steps, 0);
    assert_eq!(own.boot, 7);
    assert_eq!(own.steps, vec![11, u64::MAX]);
    assert_eq!(own.apply(&steps), steps);

    let third = SeedChoice::at(7, &steps, 3);
    assert_eq!((third.boot, third.steps.clone()), (10, vec![14, 2]));
    let applied = third.apply(&steps);
    assert_eq!(applied[1].at_ns, steps[1].at_ns);
    assert_eq!(applied[1].seed, 2);

    for offset in [0, 1, 31, MAX_SEEDS - 1] {
        let choice = SeedChoice::at(u64::MAX - 1, &steps, offset);
        assert_eq!(choice.offset_from(u64::MAX - 1, &steps), Some(offset));
        let json = serde_json::to_string(&choice).unwrap();
        assert_eq!(serde_json::from_str::<SeedChoice>(&json).unwrap(), choice);
    }
    // Seeds the scheme did not make are at no offset.
    let mut odd = SeedChoice::at(7, &steps, 2);
    odd.steps[0] += 1;
    assert_eq!(odd.offset_from(7, &steps), None);
}

#[test]
fn test_a_failure_of_the_same_checker_on_another_key_is_the_finding_s_kind() {
    let checker = |checker: &str, key: &str| FailureKey::Checker {
        checker: checker.into(),
        key: key.into(),
    };
    let finding = checker("linearizability", "k1");
    assert!(same_failure(&finding, &checker("linearizability", "k2")));
    assert!(!same_failure(&finding, &checker("other", "k1")));
    let property = FailureKey::Property {
        id: "no stale read".into(),
        file: "main.go".into(),
        function: "main.get".into(),
    };
    assert!(same_failure(&property, &property.clone()));
    let elsewhere = FailureKey::Property {
        id: "no stale read".into(),
        file: "main.go".into(),
        function: "main.put".into(),
    };
    assert!(!same_failure(&property, &elsewhere));
    // An old finding's key (`file:line`) is the kind of tonight's failure
    // with the same id and file.
    let old = FailureKey::from_slug("property:no%20stale%20read@main.go%3A10").unwrap();
    assert!(same_failure(&old, &property));
    assert!(!same_failure(
        &old,
        &FailureKey::Property {
            id: "no stale read".into(),
            file: "other.go".into(),
            function: "main.get".into(),
        }
    ));
    assert!(!same_failure(
        &FailureKey::Command { name: "a".into() },
        &FailureKey::Command { name: "b".into() }
    ));
}

const MANIFEST: &str = r#"
[[node]]
name = "n1"
image = "raft.img"
address = "192.0.2.1/24"
command = ["raftkv"]

[[node]]
name = "n2"
image = "other.img"
address = "192.0.2.2/24"
command = ["raftkv"]

[[node]]
name = "n3"
rootfs = "root"
address = "192.0.2.3/24"

[workload]
image = "raft.img"
address = "192.0.2.10/24"
command = ["kvclient"]
"#;

#[test]
fn test_an_image_patch_replaces_every_node_image_and_the_workload_s_of_the_same_file() {
    let base = Path::new("/m");
    let patched = Path::new("/p/patched.img");
    let mut manifest = run::manifest::parse(MANIFEST, base).unwrap();
    assert_eq!(replace_images(&mut manifest, patched), 3);
    let sources: Vec<RootSource> = manifest
        .all_nodes()
        .iter()
        .map(|n| n.source.clone())
        .collect();
    assert_eq!(
        sources,
        vec![
            RootSource::Image(patched.into()),
            RootSource::Image(patched.into()),
            RootSource::Rootfs("/m/root".into()),
            RootSource::Image(patched.into()),
        ]
    );

    // A workload of another image keeps it.
    let text = MANIFEST.replace(
        "image = \"raft.img\"\naddress = \"192.0.2.10",
        "image = \"client.img\"\naddress = \"192.0.2.10",
    );
    let mut manifest = run::manifest::parse(&text, base).unwrap();
    assert_eq!(replace_images(&mut manifest, patched), 2);
    assert_eq!(
        manifest
            .workload
            .as_ref()
            .unwrap()
            .own_node()
            .unwrap()
            .source,
        RootSource::Image("/m/client.img".into())
    );
}

/// A finding whose campaign read `manifest` (its run is never booted here).
fn finding(manifest: &Path) -> LoadedFinding {
    let text = format!("manifest = {:?}\n", manifest.display().to_string());
    let spec = CampaignSpec::parse(&text, Path::new("/c/c.toml"), Path::new("/c")).unwrap();
    let file = FindingFile {
        format: FINDING_FORMAT,
        number: 1,
        key: "checker:linearizability:k1".into(),
        summary: "stale read".into(),
        details: serde_json::Value::Null,
        path: Default::default(),
        found_path: Default::default(),
        digest: "d".into(),
        exits: 0,
        virtual_ns: VirtNanos::ZERO,
        spec,
        failure_moment: None,
        shrinking: None,
    };
    let network = run::manifest::parse(MANIFEST, Path::new("/m"))
        .unwrap()
        .network;
    let run: PreparedUp = serde_json::from_value(serde_json::json!({
        "kernel": "/nonexistent/vmlinux", "initrd": {"bytes": []}, "specs": [],
        "node_names": ["n1"], "workload": null,
        "network": serde_json::to_value(network).unwrap(),
        "rtc_epoch_unix_secs": 0, "ram_bytes": 1, "faults": [], "disks": []
    }))
    .unwrap();
    LoadedFinding {
        file,
        run,
        failure_moment: fuzzer::failure_moment::FailureMoment::at_end(0, VirtNanos::ZERO),
    }
}

fn message(error: &VerifyError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[test]
fn test_a_missing_or_bad_manifest_or_image_is_refused_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone.toml");
    let image = dir.path().join("patched.img");

    let error = patched_run(&finding(&gone), &Patch::Image(image.clone())).unwrap_err();
    let text = message(&error);
    assert!(
        matches!(error, VerifyError::ManifestMissing { .. }),
        "{text}"
    );
    assert!(
        text.contains(&gone.display().to_string()) && text.contains("--manifest"),
        "{text}"
    );

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[node]]\nname = 3\n").unwrap();
    let error = patched_run(&finding(&bad), &Patch::Manifest(bad.clone())).unwrap_err();
    let text = message(&error);
    assert!(matches!(error, VerifyError::Manifest(_)), "{text}");
    assert!(text.contains(&bad.display().to_string()), "{text}");

    let good = dir.path().join("good.toml");
    std::fs::write(&good, MANIFEST).unwrap();
    let error = patched_run(&finding(&good), &Patch::Image(image.clone())).unwrap_err();
    let text = message(&error);
    assert!(matches!(error, VerifyError::ImageMissing { .. }), "{text}");
    assert!(text.contains(&image.display().to_string()), "{text}");

    std::fs::write(&image, b"not read before the run is prepared").unwrap();
    let rootfs_only = dir.path().join("rootfs.toml");
    std::fs::write(
        &rootfs_only,
        "[[node]]\nname = \"n1\"\nrootfs = \"root\"\naddress = \"192.0.2.1/24\"\n",
    )
    .unwrap();
    let error = patched_run(&finding(&rootfs_only), &Patch::Image(image)).unwrap_err();
    let text = message(&error);
    assert!(matches!(error, VerifyError::NoImage { .. }), "{text}");
    assert!(text.contains(&rootfs_only.display().to_string()), "{text}");
}

#[test]
fn test_no_seeds_or_no_finding_is_refused_before_anything_runs() {
    let mut budget = Budget::new(Default::default(), None);
    let request = |finding: &str, seeds| VerifyRequest {
        finding: finding.into(),
        patch: Patch::Image("p.img".into()),
        seeds,
        jobs: 1,
        place: Place {
            host_vm: helper_vm::HostVmMode::Auto,
            seccomp: true,
        },
    };
    let error = verify(&request("/", 0), &mut budget, &|_| {}).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("--seeds 0: give 1..={MAX_SEEDS}")
    );
    let error = verify(
        &request("/nonexistent/findings/0001", 2),
        &mut budget,
        &|_| {},
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "/nonexistent/findings/0001: no such directory"
    );
    let dir = tempfile::tempdir().unwrap();
    let error = verify(
        &request(dir.path().to_str().unwrap(), 2),
        &mut budget,
        &|_| {},
    )
    .unwrap_err();
    assert!(matches!(error, VerifyError::Source(_)), "{error}");
    std::fs::write(dir.path().join(findings::FINDING_FILE), "{}").unwrap();
    let error = verify(
        &request(dir.path().to_str().unwrap(), 2),
        &mut budget,
        &|_| {},
    )
    .unwrap_err();
    assert!(
        error.to_string().contains("finding format version 0"),
        "{error}"
    );
}
