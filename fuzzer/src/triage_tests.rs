use super::*;
use vmm::VirtNanos;

fn property(id: &str, file: &str, function: &str) -> FailureKey {
    FailureKey::Property {
        id: id.into(),
        file: file.into(),
        function: function.into(),
    }
}

fn checker(key: &str) -> FailureKey {
    FailureKey::Checker {
        checker: "linearizability".into(),
        key: key.into(),
    }
}

fn entry(status: Mark, note: &str) -> Entry {
    Entry {
        status,
        note: note.into(),
        by: None,
        date: None,
    }
}

fn baseline_of(entries: Vec<(FailureKey, Entry)>) -> Baseline {
    Baseline {
        entries: entries.into_iter().collect(),
    }
}

fn path() -> &'static Path {
    Path::new("ci/triage.toml")
}

/// A finding of campaign `dir` with key `key`.
fn line(dir: &str, number: u32, key: &FailureKey) -> FindingLine {
    FindingLine {
        digest: "ab".into(),
        dir: PathBuf::from(format!("{dir}/findings/{number:04}")),
        failure_moment: None,
        faults: 1,
        found_faults: 2,
        found_steps: 1,
        key: key.slug(),
        number,
        shrinking: None,
        steps: 1,
        summary: "broke".into(),
        virtual_ns: VirtNanos(5),
    }
}

#[test]
fn test_a_baseline_prints_and_reads_back_equal() {
    let mut baseline = baseline_of(vec![
        (
            property("no stale read", "src/kv.rs", "kv::get"),
            Entry {
                status: Mark::Known,
                note: "upstream #123 \"quoted\"\nsecond line".into(),
                by: Some("alice".into()),
                date: Some("2026-12-05".into()),
            },
        ),
        (checker("k2"), entry(Mark::Ignored, "flaky checker")),
        (
            FailureKey::Command {
                name: "parallel driver".into(),
            },
            entry(Mark::Known, ""),
        ),
    ]);
    // An old key stays as it was written.
    baseline.entries.insert(
        FailureKey::from_slug("property:p@main.go%3A10").unwrap(),
        entry(Mark::Known, "old"),
    );
    let text = baseline.to_toml();
    assert!(text.starts_with("format = 1\n"), "{text}");
    assert!(
        text.contains("[finding.\"checker:linearizability:k2\"]\nstatus = \"ignored\""),
        "{text}"
    );
    assert!(
        text.contains("[finding.\"property:p@main.go%3A10\"]"),
        "{text}"
    );
    assert_eq!(Baseline::parse(&text, path()).unwrap(), baseline);
    assert_eq!(
        Baseline::parse("", path()).unwrap(),
        Baseline::default(),
        "an empty file is an empty baseline"
    );
    assert_eq!(
        Baseline::parse(&Baseline::default().to_toml(), path()).unwrap(),
        Baseline::default()
    );
}

#[test]
fn test_a_hand_written_baseline_with_comments_reads() {
    let text = r#"
# Reviewed in PR #7.
[finding."checker:linearizability:k2"]   # the stale read
status = "known"
note = "upstream #123"

[finding."command:driver"]
status = "ignored"
note = "the driver times out on slow CI"
by = "bob"
"#;
    let baseline = Baseline::parse(text, path()).unwrap();
    assert_eq!(baseline.entries.len(), 2);
    assert_eq!(
        baseline.entries[&checker("k2")],
        entry(Mark::Known, "upstream #123")
    );
    let driver = &baseline.entries[&FailureKey::Command {
        name: "driver".into(),
    }];
    assert_eq!(driver.status, Mark::Ignored);
    assert_eq!(driver.by.as_deref(), Some("bob"));
}

#[test]
fn test_bad_baselines_name_the_file_the_line_and_the_problem() {
    let cases = [
        (
            "format = 1\n\n[finding.\"command:a\"]\nstatus = \"knwon\"\nnote = \"\"\n",
            4,
            "knwon",
        ),
        (
            "[finding.\"command:a\"]\nstatus = \"known\"\n",
            1,
            "note",
        ),
        (
            "\n[finding.\"property:x\"]\nstatus = \"known\"\nnote = \"\"\n",
            2,
            "property:x",
        ),
        (
            "[finding.\"command:%61\"]\nstatus = \"known\"\nnote = \"\"\n",
            1,
            "write it as \"command:a\"",
        ),
        (
            "[finding.\"command:a\"]\nstatus = \"known\"\nnote = \"\"\nowner = \"x\"\n",
            4,
            "owner",
        ),
        ("format = 1\nfindings = 3\n", 2, "findings"),
        ("format = 1\n[finding\n", 2, ""),
        (
            "[finding.\"command:a\"]\nstatus = \"known\"\nnote = \"\"\n[finding.\"command:a\"]\nstatus = \"ignored\"\nnote = \"\"\n",
            4,
            "",
        ),
        ("format = \"one\"\n", 1, ""),
    ];
    for (text, line, names) in cases {
        let error = Baseline::parse(text, path()).unwrap_err();
        let message = error.to_string();
        assert!(
            matches!(error, BaselineError::Parse { line: l, .. } if l == line),
            "{text:?}: {message} (line {line}?)"
        );
        assert!(
            message.starts_with(&format!("ci/triage.toml: line {line}: ")),
            "{message}"
        );
        assert!(message.contains(names), "{text:?}: {message}");
        assert!(!message.contains('\n'), "one line: {message:?}");
    }
    let newer = Baseline::parse("format = 2\n", path()).unwrap_err();
    assert!(matches!(newer, BaselineError::Format { found: 2, .. }));
    assert!(newer.to_string().contains("format 2"), "{newer}");
    // A missing file names it.
    let missing = Baseline::load(Path::new("/nonexistent/triage.toml")).unwrap_err();
    assert!(matches!(missing, BaselineError::Read { .. }));
    assert!(missing.to_string().contains("/nonexistent/triage.toml"));
}

#[test]
fn test_set_entry_adds_and_updates_keeping_comments_and_other_entries() {
    let key = checker("k2");
    let mut known = entry(Mark::Known, "upstream #123");
    known.by = Some("alice".into());
    // A new file.
    let first = set_entry("", path(), &key, &known).unwrap();
    assert!(first.starts_with("# Findings triaged"), "{first}");
    let read = Baseline::parse(&first, path()).unwrap();
    assert_eq!(read.entries.len(), 1);
    assert_eq!(read.entries[&key], known);

    // A reviewed file: another entry and comments, kept.
    let reviewed = format!(
        "{first}\n# The driver is slow on CI; see PR #9.\n[finding.\"command:driver\"]\nstatus = \"ignored\" # for now\nnote = \"slow\"\n"
    );
    let command = FailureKey::Command {
        name: "driver".into(),
    };
    let other = property("no stale read", "src/kv.rs", "kv::get");
    let added = set_entry(
        &reviewed,
        path(),
        &other,
        &entry(Mark::Ignored, "too strict"),
    )
    .unwrap();
    assert!(added.starts_with(&reviewed), "appended:\n{added}");
    let read = Baseline::parse(&added, path()).unwrap();
    assert_eq!(read.entries.len(), 3);
    assert_eq!(read.entries[&other], entry(Mark::Ignored, "too strict"));

    // Updated in place: the same key, its comments and the others kept.
    let updated = set_entry(
        &added,
        path(),
        &command,
        &entry(Mark::Known, "fixed upstream"),
    )
    .unwrap();
    assert!(
        updated.contains("# The driver is slow on CI; see PR #9."),
        "{updated}"
    );
    assert!(updated.contains("# Findings triaged"), "{updated}");
    let read = Baseline::parse(&updated, path()).unwrap();
    assert_eq!(read.entries.len(), 3);
    assert_eq!(read.entries[&command], entry(Mark::Known, "fixed upstream"));
    assert_eq!(read.entries[&key], known);
    assert_eq!(updated.matches("[finding.\"command:driver\"]").count(), 1);
    // `by` dropped when the new entry has none.
    let by_less = set_entry(&updated, path(), &key, &entry(Mark::Known, "again")).unwrap();
    assert_eq!(
        Baseline::parse(&by_less, path()).unwrap().entries[&key].by,
        None
    );

    // An old key's entry is the one a new key of its failure updates.
    let old = "[finding.\"property:no%20stale%20read@src%2Fkv.rs%3A42\"]\nstatus = \"known\"\nnote = \"x\"\n";
    let moved = set_entry(old, path(), &other, &entry(Mark::Ignored, "y")).unwrap();
    let read = Baseline::parse(&moved, path()).unwrap();
    assert_eq!(read.entries.len(), 1, "{moved}");
    assert_eq!(
        read.entry_for(&other).unwrap().1,
        &entry(Mark::Ignored, "y")
    );

    // A bad file is refused as reading refuses it, and not rewritten.
    let error = set_entry(
        "[finding.\"command:a\"]\nstatus = 3\n",
        path(),
        &key,
        &known,
    )
    .unwrap_err();
    assert!(
        error.to_string().starts_with("ci/triage.toml: line 2: "),
        "{error}"
    );
}

#[test]
fn test_classify_says_new_known_ignored_and_possibly_fixed() {
    let stale = checker("k2");
    let flaky = FailureKey::Command {
        name: "driver".into(),
    };
    let fresh = property("no stale read", "src/kv.rs", "kv::get");
    let gone = checker("k9");
    let mut baseline = baseline_of(vec![
        (stale.clone(), entry(Mark::Known, "upstream #123")),
        (flaky.clone(), entry(Mark::Ignored, "slow CI")),
        (gone.clone(), entry(Mark::Known, "fixed?")),
    ]);
    let tonight = [
        line("a", 1, &stale),
        line("a", 2, &fresh),
        line("a", 3, &flaky),
    ];
    let triage = classify(&tonight, &baseline);
    let statuses: Vec<(String, Status)> = triage
        .failures
        .iter()
        .map(|f| (f.key.clone(), f.status))
        .collect();
    assert_eq!(
        statuses,
        [
            (stale.slug(), Status::Known),
            (fresh.slug(), Status::New),
            (flaky.slug(), Status::Ignored)
        ]
    );
    assert_eq!(
        triage.failures[0].entry.as_ref().unwrap().note,
        "upstream #123"
    );
    assert!(triage.failures[1].entry.is_none());
    assert!(triage.any_new());
    assert_eq!(triage.status_of(&fresh.slug()), Some(Status::New));
    assert_eq!(triage.possibly_fixed.len(), 1);
    assert_eq!(triage.possibly_fixed[0].key, gone.slug());
    assert_eq!(triage.possibly_fixed[0].entry.note, "fixed?");

    // Marked: nothing new, and an empty night fixes everything.
    baseline
        .entries
        .insert(fresh.clone(), entry(Mark::Known, "ours"));
    assert!(!classify(&tonight, &baseline).any_new());
    let empty = classify(&[], &baseline);
    assert!(empty.failures.is_empty() && !empty.any_new());
    assert_eq!(empty.possibly_fixed.len(), 4);
    // No baseline: everything new.
    let bare = classify(&tonight, &Baseline::default());
    assert!(bare.failures.iter().all(|f| f.status == Status::New));
    assert!(bare.possibly_fixed.is_empty());
}

#[test]
fn test_classify_merges_directories_by_key() {
    let stale = checker("k2");
    let other = checker("k3");
    let tonight = [
        line("shards/0", 1, &stale),
        line("shards/1", 1, &other),
        line("shards/1", 2, &stale),
        line("shards/2", 1, &stale),
    ];
    let baseline = baseline_of(vec![(other.clone(), entry(Mark::Known, "x"))]);
    let triage = classify(&tonight, &baseline);
    assert_eq!(triage.failures.len(), 2);
    let merged = &triage.failures[0];
    assert_eq!(merged.key, stale.slug());
    assert_eq!(merged.status, Status::New);
    let dirs: Vec<_> = merged.findings.iter().map(|l| l.dir.clone()).collect();
    assert_eq!(
        dirs,
        [
            PathBuf::from("shards/0/findings/0001"),
            PathBuf::from("shards/1/findings/0002"),
            PathBuf::from("shards/2/findings/0001")
        ],
        "every finding kept"
    );
    assert_eq!(triage.failures[1].status, Status::Known);
    assert!(triage.possibly_fixed.is_empty());
}

#[test]
fn test_old_keys_mark_and_merge_with_new_ones() {
    let new = property("no stale read", "src/kv.rs", "kv::get");
    let old = FailureKey::from_slug("property:no%20stale%20read@src%2Fkv.rs%3A42").unwrap();
    // An old key in the baseline marks tonight's new key.
    let baseline = baseline_of(vec![(old.clone(), entry(Mark::Known, "filed"))]);
    let triage = classify(&[line("a", 1, &new)], &baseline);
    assert_eq!(triage.failures[0].status, Status::Known);
    assert_eq!(triage.failures[0].baseline_key, Some(old.slug()));
    assert!(triage.possibly_fixed.is_empty());
    // A line shift or another file is still news against a new key.
    let baseline = baseline_of(vec![(new.clone(), entry(Mark::Known, "filed"))]);
    let moved = property("no stale read", "src/other.rs", "kv::get");
    let triage = classify(&[line("a", 1, &moved)], &baseline);
    assert_eq!(triage.failures[0].status, Status::New);
    assert_eq!(triage.possibly_fixed.len(), 1);
    // An old campaign's finding (old key) is marked by a new key's entry,
    // and merges with a new campaign's finding, named by the new key.
    let triage = classify(&[line("old", 1, &old), line("new", 1, &new)], &baseline);
    assert_eq!(triage.failures.len(), 1);
    assert_eq!(triage.failures[0].key, new.slug());
    assert_eq!(triage.failures[0].status, Status::Known);
    assert_eq!(triage.failures[0].findings.len(), 2);
    assert!(triage.possibly_fixed.is_empty());
}

/// Campaign directories as they are on disk: an old campaign's database
/// and `finding.json` with an old `file:line` property key still list, and
/// merge with a new campaign's finding of the same property.
#[test]
fn test_an_old_campaign_directory_lists_and_triages_with_a_new_one() {
    let new = property("no stale read", "src/kv.rs", "kv::get");
    let old_slug = "property:no%20stale%20read@src%2Fkv.rs%3A42";
    let old = crate::listing::tests::campaign_with_keys(&[(1, old_slug), (2, "checker:lin:k")]);
    let tonight = crate::listing::tests::campaign_with_keys(&[(1, &new.slug())]);
    let mut lines = crate::campaign::findings(old.path()).unwrap();
    assert_eq!(lines[0].key, old_slug, "the old key as it was written");
    lines.extend(crate::campaign::findings(tonight.path()).unwrap());
    let baseline = baseline_of(vec![(new.clone(), entry(Mark::Known, "filed"))]);
    let triage = classify(&lines, &baseline);
    assert_eq!(triage.failures.len(), 2);
    assert_eq!(triage.failures[0].key, new.slug());
    assert_eq!(triage.failures[0].status, Status::Known);
    assert_eq!(triage.failures[0].findings.len(), 2);
    assert_eq!(triage.failures[1].status, Status::New);
    assert!(triage.any_new());
}

#[test]
fn test_a_damaged_key_is_matched_by_its_text() {
    let mut damaged = line("a", 1, &checker("k"));
    damaged.key = "bogus".into();
    let triage = classify(&[damaged.clone(), damaged], &Baseline::default());
    assert_eq!(triage.failures.len(), 1);
    assert_eq!(triage.failures[0].findings.len(), 2);
    assert_eq!(triage.failures[0].status, Status::New);
}
