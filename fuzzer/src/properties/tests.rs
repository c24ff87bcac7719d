use super::*;
use serde_json::json;

/// An `antithesis_assert` record of kind `kind` (the SDK's display type),
/// as an SDK writes it.
fn assert_record(kind: &str, id: &str, hit: bool, condition: bool) -> Value {
    let (assert_type, must_hit) = match kind {
        "Always" => (AssertType::Always, true),
        "AlwaysOrUnreachable" => (AssertType::Always, false),
        "Sometimes" => (AssertType::Sometimes, true),
        "Reachable" => (AssertType::Reachability, true),
        "Unreachable" => (AssertType::Reachability, false),
        other => panic!("no kind {other}"),
    };
    let assertion = Assertion {
        assert_type,
        display_type: kind.into(),
        condition,
        message: id.into(),
        location: Location {
            class: "app".into(),
            function: "app::f".into(),
            file: "src/app.rs".into(),
            begin_line: 10,
            begin_column: 5,
        },
        hit,
        must_hit,
        id: id.into(),
        details: json!({"n": 1}),
    };
    json!({ "antithesis_assert": assertion })
}

/// An assertion observation of kind `kind` (the SDK's display type).
fn assertion(kind: &str, id: &str, hit: bool, condition: bool) -> Observation {
    Observation::Sdk(SdkRecord::parse(&assert_record(kind, id, hit, condition)).unwrap())
}

fn catalog(kind: &str, id: &str) -> Observation {
    assertion(kind, id, false, false)
}

fn hit(kind: &str, id: &str, condition: bool) -> Observation {
    assertion(kind, id, true, condition)
}

fn key(id: &str) -> FailureKey {
    FailureKey::Property {
        id: id.into(),
        file: "src/app.rs".into(),
        function: "app::f".into(),
    }
}

fn exited(command: &str, status: i32) -> Observation {
    Observation::CommandExited {
        command: command.into(),
        status,
    }
}

fn end_keys(tally: &PropertyTally) -> Vec<FailureKey> {
    tally
        .end_of_campaign_failures()
        .into_iter()
        .map(|f| {
            assert_eq!(f.when, FailureWhen::AtEnd);
            f.key
        })
        .collect()
}

fn failure_keys(news: &StretchNews) -> Vec<(FailureKey, bool)> {
    news.failures
        .iter()
        .map(|f| (f.failure.key.clone(), f.new))
        .collect()
}

#[test]
fn test_always_fails_on_a_false_hit_in_that_stretch_and_when_never_hit() {
    let mut tally = PropertyTally::new();
    let news = tally
        .add_stretch(
            StretchId(1),
            &[catalog("Always", "a"), catalog("Always", "never")],
        )
        .unwrap();
    assert!(news.is_empty());
    let news = tally
        .add_stretch(StretchId(2), &[hit("Always", "a", true)])
        .unwrap();
    assert_eq!(news.first_hits, vec![key("a")]);
    assert!(news.failures.is_empty());
    // Two false hits in one stretch: one failure of that stretch.
    let news = tally
        .add_stretch(
            StretchId(3),
            &[hit("Always", "a", false), hit("Always", "a", false)],
        )
        .unwrap();
    assert_eq!(failure_keys(&news), vec![(key("a"), true)]);
    let failure = &news.failures[0].failure;
    assert_eq!(
        failure.when,
        FailureWhen::InStretch {
            stretch: StretchId(3)
        }
    );
    assert_eq!(failure.property, "Always");
    assert_eq!(failure.details, json!({"n": 1}));
    // Broken again elsewhere: a failure of that stretch, not a new one.
    let news = tally
        .add_stretch(StretchId(4), &[hit("Always", "a", false)])
        .unwrap();
    assert_eq!(failure_keys(&news), vec![(key("a"), false)]);
    let a = &tally.assertions()[0];
    assert_eq!((a.hits, a.true_hits, a.false_hits), (4, 1, 3));
    assert_eq!(a.failed_stretches, 2);
    assert_eq!(a.first_failure.as_ref().unwrap().stretch, StretchId(3));
    // At the end: the never-hit must-hit Always (known from its catalog
    // entry only) fails; "a" failed in a stretch, which is not repeated.
    assert_eq!(end_keys(&tally), vec![key("never")]);
    let in_stretches = tally.failures_in_stretches();
    assert_eq!(in_stretches.len(), 1);
    assert_eq!(in_stretches[0].key, key("a"));
    assert_eq!(
        in_stretches[0].when,
        FailureWhen::InStretch {
            stretch: StretchId(3)
        }
    );
}

#[test]
fn test_always_or_unreachable_fails_only_on_a_false_hit() {
    let mut tally = PropertyTally::new();
    let news = tally
        .add_stretch(
            StretchId(1),
            &[
                catalog("AlwaysOrUnreachable", "quiet"),
                catalog("AlwaysOrUnreachable", "b"),
                hit("AlwaysOrUnreachable", "b", true),
            ],
        )
        .unwrap();
    assert!(news.failures.is_empty());
    assert!(end_keys(&tally).is_empty());
    let news = tally
        .add_stretch(StretchId(2), &[hit("AlwaysOrUnreachable", "b", false)])
        .unwrap();
    assert_eq!(failure_keys(&news), vec![(key("b"), true)]);
    assert!(end_keys(&tally).is_empty());
}

#[test]
fn test_sometimes_passes_once_true_and_fails_at_the_end_if_never() {
    let mut tally = PropertyTally::new();
    tally
        .add_stretch(
            StretchId(1),
            &[
                catalog("Sometimes", "never-hit"),
                hit("Sometimes", "false-only", false),
                hit("Sometimes", "s", false),
            ],
        )
        .unwrap();
    assert_eq!(
        end_keys(&tally),
        vec![key("never-hit"), key("false-only"), key("s")]
    );
    let messages: Vec<String> = tally
        .end_of_campaign_failures()
        .into_iter()
        .map(|f| f.message)
        .collect();
    assert_eq!(
        messages,
        [
            "never-hit: never reached",
            "false-only: never true",
            "s: never true"
        ]
    );
    let news = tally
        .add_stretch(StretchId(2), &[hit("Sometimes", "s", true)])
        .unwrap();
    // Not a first hit (stretch 1 hit it), but its first pass.
    assert!(news.first_hits.is_empty());
    assert_eq!(news.first_passes, vec![key("s")]);
    assert!(news.failures.is_empty());
    assert_eq!(end_keys(&tally), vec![key("never-hit"), key("false-only")]);
    let s = &tally.assertions()[2];
    assert_eq!(s.first_pass.as_ref().unwrap().stretch, StretchId(2));
}

#[test]
fn test_reachable_fails_at_the_end_if_never_hit_unreachable_when_hit() {
    let mut tally = PropertyTally::new();
    tally
        .add_stretch(
            StretchId(1),
            &[
                catalog("Reachable", "r"),
                catalog("Reachable", "r-never"),
                catalog("Unreachable", "u"),
                catalog("Unreachable", "u-never"),
            ],
        )
        .unwrap();
    assert_eq!(end_keys(&tally), vec![key("r"), key("r-never")]);
    // The SDK writes Reachable with condition true, Unreachable with false;
    // only the hit matters.
    let news = tally
        .add_stretch(
            StretchId(2),
            &[hit("Reachable", "r", true), hit("Unreachable", "u", false)],
        )
        .unwrap();
    assert_eq!(news.first_passes, vec![key("r")]);
    assert_eq!(failure_keys(&news), vec![(key("u"), true)]);
    assert_eq!(news.failures[0].failure.property, "Unreachable");
    assert_eq!(end_keys(&tally), vec![key("r-never")]);
    let news = tally
        .add_stretch(StretchId(3), &[hit("Unreachable", "u", true)])
        .unwrap();
    assert_eq!(failure_keys(&news), vec![(key("u"), false)]);
}

#[test]
fn test_each_stretch_counts_once_and_repeated_records_count_per_stretch() {
    let mut tally = PropertyTally::new();
    let records = [hit("Always", "a", true), exited("driver", 0)];
    tally.add_stretch(StretchId(7), &records).unwrap();
    // The same records under a second id are a second stretch of the tree.
    tally.add_stretch(StretchId(8), &records).unwrap();
    assert_eq!(tally.assertions()[0].hits, 2);
    assert_eq!(tally.commands()["driver"].runs, 2);
    // The same id again is refused, and changes nothing.
    let before = tally.clone();
    let err = tally.add_stretch(StretchId(7), &records).unwrap_err();
    assert_eq!(
        err.to_string(),
        "stretch 7 was already counted (each stretch of the tree is fed once)"
    );
    assert_eq!(tally, before);
    assert_eq!(tally.stretch_count(), 2);
}

/// A tree: root stretch 1, its children 2 and 3, and 4 below 3. A record
/// of the parent belongs to every history below it: the children's
/// histories have the parent's Sometimes true without repeating it.
#[test]
fn test_records_in_a_parent_stretch_count_for_its_children() {
    let mut tally = PropertyTally::new();
    let root = tally
        .add_stretch(
            StretchId(1),
            &[
                catalog("Sometimes", "s"),
                catalog("Reachable", "r"),
                hit("Sometimes", "s", true),
            ],
        )
        .unwrap();
    assert_eq!(root.first_passes, vec![key("s")]);
    for (child, records) in [
        (2, vec![hit("Sometimes", "s", false)]),
        (3, vec![]),
        (4, vec![hit("Reachable", "r", true)]),
    ] {
        let news = tally.add_stretch(StretchId(child), &records).unwrap();
        // Nothing about "s" is news below the root.
        assert!(!news.first_passes.contains(&key("s")));
        assert!(!news.first_hits.contains(&key("s")));
    }
    let s = &tally.assertions()[0];
    // The root's hit counted once, though it is in three histories.
    assert_eq!((s.hits, s.true_hits), (2, 1));
    assert!(end_keys(&tally).is_empty());
}

#[test]
fn test_command_properties() {
    let mut tally = PropertyTally::new();
    tally.expect_command("never_run");
    tally.expect_command("flaky");
    let news = tally
        .add_stretch(
            StretchId(1),
            &[exited("flaky", 2), exited("flaky", 3), exited("ok", 0)],
        )
        .unwrap();
    let flaky = FailureKey::Command {
        name: "flaky".into(),
    };
    let ok = FailureKey::Command { name: "ok".into() };
    assert_eq!(failure_keys(&news), vec![(flaky.clone(), true)]);
    assert_eq!(
        news.failures[0].failure.message,
        "flaky exited with status 2"
    );
    assert_eq!(news.first_hits, vec![flaky.clone(), ok.clone()]);
    assert_eq!(news.first_passes, vec![ok]);
    let end = tally.end_of_campaign_failures();
    let summary: Vec<(String, String)> = end
        .iter()
        .map(|f| (f.key.to_string(), f.message.clone()))
        .collect();
    assert_eq!(
        summary,
        [
            (
                "command \"flaky\"".to_string(),
                "flaky never exited 0 (2 nonzero exits)".to_string()
            ),
            (
                "command \"never_run\"".to_string(),
                "never_run never finished".to_string()
            ),
        ]
    );
    let news = tally
        .add_stretch(StretchId(2), &[exited("flaky", 0), exited("never_run", 0)])
        .unwrap();
    assert!(news.failures.is_empty());
    assert!(tally.end_of_campaign_failures().is_empty());
    // The nonzero exit stays a failure found in stretch 1.
    let found = tally.failures_in_stretches();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].key, flaky);
    assert_eq!(
        found[0].when,
        FailureWhen::InStretch {
            stretch: StretchId(1)
        }
    );
}

fn guidance(id: &str, maximize: bool, left: i64, right: i64) -> Observation {
    let json = json!({"antithesis_guidance": {
        "guidance_type": "numeric", "message": id, "id": id, "maximize": maximize,
        "guidance_data": {"left": left, "right": right}, "hit": true,
        "location": {"file": "src/g.rs", "begin_line": 3}
    }});
    Observation::Sdk(SdkRecord::parse(&json).unwrap())
}

#[test]
fn test_guidance_reports_new_bests_in_its_direction() {
    let mut tally = PropertyTally::new();
    let values = |news: &StretchNews| -> Vec<(String, f64, Option<f64>)> {
        news.guidance
            .iter()
            .map(|g| (g.id.clone(), g.value, g.previous))
            .collect()
    };
    let news = tally
        .add_stretch(
            StretchId(1),
            &[guidance("up", true, 5, 0), guidance("down", false, 5, 0)],
        )
        .unwrap();
    assert_eq!(
        values(&news),
        [("up".into(), 5.0, None), ("down".into(), 5.0, None)]
    );
    let news = tally
        .add_stretch(
            StretchId(2),
            &[
                guidance("up", true, 3, 0),
                guidance("up", true, 9, 1),
                guidance("down", false, 7, 0),
            ],
        )
        .unwrap();
    assert_eq!(values(&news), [("up".into(), 8.0, Some(5.0))]);
    let news = tally
        .add_stretch(StretchId(3), &[guidance("down", false, 0, 2)])
        .unwrap();
    assert_eq!(values(&news), [("down".into(), -2.0, Some(5.0))]);
    let up = &tally.guidance_tallies()[0];
    assert_eq!(
        (up.hits, up.max, up.min, up.best_stretch),
        (3, Some(8.0), Some(3.0), Some(StretchId(2)))
    );
    let down = &tally.guidance_tallies()[1];
    assert_eq!((down.best(), down.max), (Some(-2.0), Some(7.0)));
}

#[test]
fn test_other_sdk_records_change_nothing() {
    let mut tally = PropertyTally::new();
    let others = [
        json!({"antithesis_setup": {"status": "complete", "details": null}}),
        json!({"antithesis_sdk": {"language": {"name": "Go"}}}),
        json!({"my_event": {"x": 1}}),
    ]
    .map(|j| Observation::Sdk(SdkRecord::parse(&j).unwrap()));
    let news = tally.add_stretch(StretchId(1), &others).unwrap();
    assert!(news.is_empty());
    assert!(tally.assertions().is_empty() && tally.commands().is_empty());
}

/// Saved and reloaded mid-campaign (`--resume`), the tally goes on as if
/// it had never stopped.
#[test]
fn test_the_tally_round_trips_and_resumes() {
    let first = [
        catalog("Always", "a"),
        catalog("Reachable", "r"),
        hit("Always", "a", false),
        hit("Sometimes", "s", false),
        guidance("g", true, 4, 1),
        exited("driver", 1),
    ];
    let second = [
        hit("Always", "a", false),
        hit("Sometimes", "s", true),
        guidance("g", true, 6, 1),
        exited("driver", 0),
    ];
    let mut straight = PropertyTally::new();
    straight.expect_command("other");
    straight.add_stretch(StretchId(1), &first).unwrap();
    let json = serde_json::to_string(&straight).unwrap();
    let mut resumed: PropertyTally = serde_json::from_str(&json).unwrap();
    assert_eq!(resumed, straight);
    let a = straight.add_stretch(StretchId(2), &second).unwrap();
    let b = resumed.add_stretch(StretchId(2), &second).unwrap();
    assert_eq!(a, b);
    assert_eq!(resumed, straight);
    assert_eq!(
        resumed.end_of_campaign_failures(),
        straight.end_of_campaign_failures()
    );
    // A reloaded tally still refuses a stretch it counted before the save.
    assert!(resumed.add_stretch(StretchId(1), &first).is_err());
    // Observations and news are serde too (the store may keep them).
    let text = serde_json::to_string(&second.to_vec()).unwrap();
    assert_eq!(
        serde_json::from_str::<Vec<Observation>>(&text).unwrap(),
        second.to_vec()
    );
    let text = serde_json::to_string(&a).unwrap();
    assert_eq!(serde_json::from_str::<StretchNews>(&text).unwrap(), a);
}

#[test]
fn test_sdk_observations_of_guest_records() {
    use run::records::{GuestRecord, RecordBody};
    let record = |body| GuestRecord {
        exit: 1,
        virtual_ns: vmm::VirtNanos(2),
        node: Some("n1".into()),
        body,
    };
    let records = [
        record(RecordBody::Sdk {
            json: assert_record("Always", "a", true, false),
        }),
        record(RecordBody::History {
            json: json!({"process": 1}),
        }),
        record(RecordBody::Sdk { json: json!([1]) }),
        record(RecordBody::Sdk {
            json: json!({"my_event": {}}),
        }),
    ];
    let (observations, malformed) = sdk_observations(&records);
    assert_eq!(observations.len(), 2);
    assert_eq!(malformed.len(), 1);
    assert_eq!(malformed[0].0, 2);
    let mut tally = PropertyTally::new();
    let news = tally.add_stretch(StretchId(1), &observations).unwrap();
    assert_eq!(failure_keys(&news), vec![(key("a"), true)]);
}
