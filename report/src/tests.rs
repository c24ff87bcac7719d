//! Reports of synthetic campaign directories: a database written as the
//! engine writes it (spec, run, tree, tally, stats, findings index) and
//! finding directories as the engine writes them (`finding.json`,
//! `run.json` with its blobs, `records.jsonl`, logs, `checker.html`).

use crate::model::*;
use crate::{html, junit, merge, read, text};
use fuzzer::failure::FailureKey;
use fuzzer::failure_moment::FailureMoment;
use fuzzer::findings::{FindingFile, FINDING_FORMAT};
use fuzzer::properties::{sdk_observations, PropertyTally, StretchId};
use fuzzer::spec::CampaignSpec;
use fuzzer::stats::CampaignStats;
use fuzzer::step::{Path as StepPath, Step};
use fuzzer::store::{FindingRow, FinishedBranch, NodeRow, Store};
use run::records::{GuestRecord, RecordBody};
use serde_json::json;
use std::path::{Path, PathBuf};
use vmm::VirtNanos;

fn assertion(kind: &str, id: &str, condition: bool) -> serde_json::Value {
    let (assert_type, must_hit) = match kind {
        "Always" => ("always", true),
        "Sometimes" => ("sometimes", true),
        other => panic!("no kind {other}"),
    };
    json!({"antithesis_assert": {
        "assert_type": assert_type, "display_type": kind, "condition": condition,
        "message": id, "id": id, "hit": true, "must_hit": must_hit,
        "location": {"class": "app", "function": "app::f", "file": "src/app.rs",
                     "begin_line": 10, "begin_column": 5},
        "details": {"seen": condition}
    }})
}

fn sdk(exit: u64, ms: u64, json: serde_json::Value) -> GuestRecord {
    GuestRecord {
        exit,
        virtual_ns: VirtNanos(ms * 1_000_000),
        node: Some("n1".into()),
        body: RecordBody::Sdk { json },
    }
}

fn property_key(id: &str) -> String {
    FailureKey::Property {
        id: id.into(),
        file: "src/app.rs".into(),
        function: "app::f".into(),
    }
    .slug()
}

/// What one synthetic shard holds.
struct Shard {
    /// Hits of `stays-true` (Always): true ones and false ones.
    always: (u64, u64),
    /// Whether `eventually` (Sometimes) was ever true.
    sometimes_true: bool,
    /// Findings: (number, key): `property:...` of `stays-true`, or
    /// `checker:linearizability:KEY`.
    findings: Vec<(u32, String)>,
    branches: u64,
    wall_ms: u64,
    stats: bool,
}

fn spec() -> CampaignSpec {
    CampaignSpec::parse(
        "manifest = \"m.toml\"\nseed = 7\n[checker]\nhistory = \"kv\"\n[budget]\nbranches = 50\n",
        Path::new("c.toml"),
        Path::new("/"),
    )
    .expect("a campaign file")
}

/// A blob named by its digest in `dir/blobs`.
fn blob(dir: &Path, bytes: &[u8]) -> String {
    let name = format!("blobs/{}", blake3::hash(bytes).to_hex());
    std::fs::create_dir_all(dir.join("blobs")).unwrap();
    std::fs::write(dir.join(&name), bytes).unwrap();
    name
}

fn run_json(dir: &Path) -> serde_json::Value {
    let kernel = blob(dir, b"kernel");
    let initrd = blob(dir, b"initrd");
    json!({"kernel": kernel, "initrd": {"file": initrd}, "specs": [], "node_names": ["n1", "n2"],
           "workload": null, "network": {"latency": {"Fixed": 1000000}, "loss": "0.0",
           "duplicate": "0.0", "reorder": "0.0", "reorder_delay": {"Fixed": 5000000}},
           "rtc_epoch_unix_secs": 1704067200u64, "ram_bytes": 134217728u64, "faults": [], "disks": []})
}

/// Writes the shard's campaign directory under `root/name`.
fn campaign(root: &Path, name: &str, shard: &Shard) -> PathBuf {
    let dir = root.join(name);
    let spec = spec();
    let run = run_json(&dir);
    let mut store = Store::create(
        &dir,
        &[
            ("spec", serde_json::to_string(&spec).unwrap()),
            ("run", run.to_string()),
        ],
    )
    .unwrap();
    // The stretches: the root (catalog-free), then one per branch.
    let mut tally = PropertyTally::new();
    let mut stretch_records: Vec<Vec<GuestRecord>> = vec![Vec::new()];
    let (trues, falses) = shard.always;
    for b in 0..shard.branches {
        let mut records = Vec::new();
        if b < trues {
            records.push(sdk(10, 100, assertion("Always", "stays-true", true)));
        }
        if b < falses {
            records.push(sdk(11, 110, assertion("Always", "stays-true", false)));
        }
        records.push(sdk(
            12,
            120,
            assertion("Sometimes", "eventually", shard.sometimes_true && b == 0),
        ));
        stretch_records.push(records);
    }
    for (i, records) in stretch_records.iter().enumerate() {
        let (observations, _) = sdk_observations(records);
        tally
            .add_stretch(StretchId(i as u64), &observations)
            .unwrap();
    }
    let saved = json!({"tally": tally, "fault_combinations": {"": 1, "pause": shard.branches}});
    let stats = CampaignStats {
        workers: 2,
        root_ms: 1000,
        branch_ms: 4000,
        shrink_ms: 500,
        branches_by_minute: vec![shard.branches],
        branches_by_worker: vec![shard.branches],
        findings_at_ms: shard.findings.iter().map(|(n, _)| (*n, 30_000)).collect(),
        spilled: 1,
        loaded: 2,
        replayed_steps: 3,
        live_checkpoints: 4,
        ..Default::default()
    };
    for id in 0..=shard.branches {
        let node = NodeRow {
            id,
            parent: (id > 0).then_some(0),
            depth: u32::from(id > 0),
            path: StepPath::default(),
            end_exits: 0,
            end_ns: VirtNanos::ZERO,
            digest: "d".into(),
            score: 1.0,
            stopped: false,
        };
        let last = id == shard.branches;
        let rows: Vec<FindingRow> = if last {
            shard
                .findings
                .iter()
                .map(|(number, key)| FindingRow {
                    number: *number,
                    key: key.clone(),
                    node: id,
                    summary: format!("{key} failed"),
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut meta = vec![
            ("branches", id.to_string()),
            ("wall_ms", shard.wall_ms.to_string()),
            ("tally", saved.to_string()),
        ];
        if shard.stats {
            meta.push(("stats", stats.to_json()));
        }
        store
            .commit_branch(&FinishedBranch {
                node: &node,
                records_json: "[]",
                findings: &rows,
                meta: &meta,
            })
            .unwrap();
    }
    for (number, key) in &shard.findings {
        write_finding(&dir, *number, key, &spec, &run);
    }
    dir
}

fn write_finding(
    campaign: &Path,
    number: u32,
    key: &str,
    spec: &CampaignSpec,
    run: &serde_json::Value,
) {
    let dir = fuzzer::findings::finding_dir(campaign, number);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let checker = key.starts_with("checker:");
    let records = [
        sdk(10, 100, assertion("Always", "stays-true", true)),
        sdk(11, 110, assertion("Always", "stays-true", checker)),
    ];
    let path = StepPath {
        steps: vec![Step {
            at_ns: VirtNanos(50_000_000),
            seed: 3,
            faults: vec!["at=+10ms pause n2 for=20ms".parse().unwrap()],
        }],
        end_ns: VirtNanos(200_000_000),
    };
    let file = FindingFile {
        format: FINDING_FORMAT,
        number,
        key: key.into(),
        summary: format!("{key} failed"),
        details: json!({"why": "test"}),
        found_path: path.clone(),
        path,
        digest: "abc".into(),
        exits: 20,
        virtual_ns: VirtNanos(200_000_000),
        spec: spec.clone(),
        failure_moment: Some(FailureMoment {
            exit: 11,
            virtual_ns: VirtNanos(110_000_000),
            record: Some(1),
        }),
        shrinking: None,
    };
    std::fs::write(
        dir.join("finding.json"),
        serde_json::to_string(&file).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join("run.json"), run.to_string()).unwrap();
    blob(&dir, b"kernel");
    blob(&dir, b"initrd");
    let lines: Vec<String> = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    std::fs::write(dir.join("records.jsonl"), lines.join("\n") + "\n").unwrap();
    let log: String = (1..=20).map(|i| format!("n1 line {i}\n")).collect();
    std::fs::write(dir.join("logs/n1.log"), log).unwrap();
    if checker {
        std::fs::write(
            dir.join("checker.html"),
            "<!DOCTYPE html><html><body><h1>Not linearizable: \"k\" & co</h1></body></html>",
        )
        .unwrap();
    }
}

fn one_shard() -> Shard {
    Shard {
        always: (3, 1),
        sometimes_true: false,
        findings: vec![(1, property_key("stays-true"))],
        branches: 4,
        wall_ms: 60_000,
        stats: true,
    }
}

fn property<'a>(report: &'a Report, name: &str) -> &'a PropertyReport {
    report
        .properties
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no property {name}: {:?}", report.properties))
}

#[test]
fn test_one_campaign_reads_into_the_model() {
    let root = tempfile::tempdir().unwrap();
    let dir = campaign(root.path(), "a", &one_shard());
    let report = read::read_one(&dir).unwrap();
    assert_eq!(report.version, VERSION);
    assert_eq!(report.campaigns.len(), 1);
    assert_eq!(report.campaigns[0].spec.seed, 7);
    assert_eq!(report.campaigns[0].budget.branches, 4);
    assert_eq!(report.campaigns[0].budget.max_branches, Some(50));

    let always = property(&report, "stays-true");
    assert_eq!((always.hits, always.passes, always.failures), (4, 3, 1));
    assert_eq!(always.verdict, Verdict::Failed);
    assert_eq!(always.findings, vec![property_key("stays-true")]);
    // The finding's history, read by the debugger: its moments named as
    // the debugger names them.
    let finding_dir = dir.join("findings/0001").canonicalize().unwrap();
    assert_eq!(always.counterexamples.len(), 1);
    assert_eq!(
        always.counterexamples[0].moment,
        format!("{}@110ms", finding_dir.display())
    );
    assert_eq!(
        always.examples[0].moment,
        format!("{}@100ms", finding_dir.display())
    );
    let sometimes = property(&report, "eventually");
    assert_eq!(sometimes.verdict, Verdict::Failed);
    assert_eq!(sometimes.why.as_deref(), Some("never true"));
    let checker = property(&report, "linearizability");
    assert_eq!(checker.verdict, Verdict::Passed);
    assert_eq!(checker.hits, 5, "the root's stretch and four branches");

    let finding = &report.findings[0];
    assert_eq!(finding.key, property_key("stays-true"));
    assert_eq!(finding.moment, format!("{}@failure", finding_dir.display()));
    assert_eq!(finding.failure.exit, 11);
    assert_eq!(finding.faults.len(), 1);
    assert_eq!(finding.faults[0].fault, "at=+10ms pause n2 for=20ms");
    assert_eq!(
        finding.replay,
        format!("detvisor replay {}", finding_dir.display())
    );
    assert_eq!(finding.logs["n1"].len(), read::LOG_LINES);
    assert_eq!(finding.logs["n1"].last().unwrap(), "n1 line 20");
    assert_eq!(finding.found_at_ms, Some(30_000));
    assert!(finding.timeline.iter().any(|t| t.kind == "failure"));
    assert!(finding.timeline.iter().any(|t| t.kind == "branch"));
    assert_eq!(finding.triage, None);

    let e = &report.exploration;
    assert_eq!((e.branches, e.moments, e.depth), (4, 5, 1));
    assert_eq!(e.moments_by_depth, vec![1, 4]);
    assert_eq!(e.branches_per_hour, Some(240.0));
    assert_eq!(e.branches_per_hour_per_worker, Some(120.0));
    assert_eq!(
        e.phases,
        Some(Phases {
            root_ms: 1000,
            branch_ms: 4000,
            shrink_ms: 500
        })
    );
    assert_eq!(report.fault_kinds["pause"], 4);
}

/// Three shards: the merged report's tallies are the sums of each shard's,
/// its findings the union by key (a finding two shards found is one, the
/// other listed in `also_in`), its verdicts judged from the sums.
#[test]
fn test_a_merge_of_shards_is_the_union_of_findings_and_the_sum_of_tallies() {
    let root = tempfile::tempdir().unwrap();
    let shards = [
        one_shard(),
        Shard {
            always: (2, 0),
            sometimes_true: true,
            findings: vec![(1, "checker:linearizability:k1".into())],
            branches: 2,
            wall_ms: 30_000,
            stats: true,
        },
        Shard {
            always: (1, 1),
            sometimes_true: false,
            findings: vec![
                (1, property_key("stays-true")),
                (2, "checker:linearizability:k2".into()),
            ],
            branches: 3,
            wall_ms: 30_000,
            stats: false,
        },
    ];
    let dirs: Vec<PathBuf> = shards
        .iter()
        .enumerate()
        .map(|(i, s)| campaign(root.path(), &format!("shard{i}"), s))
        .collect();
    let parts: Vec<Report> = dirs.iter().map(|d| read::read_one(d).unwrap()).collect();
    let merged = read(&dirs).unwrap();
    assert_eq!(
        merged,
        merge::merge(parts.clone()),
        "read together = merged"
    );

    for name in ["stays-true", "eventually", "linearizability"] {
        let sum = |f: fn(&PropertyReport) -> u64| -> u64 {
            parts.iter().map(|r| f(property(r, name))).sum()
        };
        let p = property(&merged, name);
        assert_eq!(p.hits, sum(|p| p.hits), "{name}");
        if name != "linearizability" {
            assert_eq!(p.passes, sum(|p| p.passes), "{name}");
            assert_eq!(p.failures, sum(|p| p.failures), "{name}");
        }
        let examples: usize = parts
            .iter()
            .map(|r| property(r, name).counterexamples.len())
            .sum();
        assert_eq!(
            p.counterexamples.len(),
            examples,
            "{name}: every example kept"
        );
    }
    // Never true in two shards, true in one: passed over the whole.
    assert_eq!(property(&merged, "eventually").verdict, Verdict::Passed);
    assert_eq!(property(&parts[0], "eventually").verdict, Verdict::Failed);
    // The checker's failures: its distinct findings.
    let checker = property(&merged, "linearizability");
    assert_eq!(checker.failures, 2);
    assert_eq!(checker.verdict, Verdict::Failed);

    // Findings: the union by key, none doubled, the copy kept.
    let keys: Vec<&str> = merged.findings.iter().map(|f| f.key.as_str()).collect();
    assert_eq!(
        keys,
        vec![
            property_key("stays-true").as_str(),
            "checker:linearizability:k1",
            "checker:linearizability:k2"
        ]
    );
    let first = &merged.findings[0];
    assert_eq!(first.campaign, 0);
    assert_eq!(first.also_in.len(), 1);
    assert!(first.also_in[0]
        .dir
        .starts_with(dirs[2].canonicalize().unwrap()));
    assert_eq!(merged.findings[2].campaign, 2);
    assert_eq!(merged.campaigns.len(), 3);

    // Exploration: sums; counters one shard did not keep are not recorded.
    let e = &merged.exploration;
    assert_eq!(e.branches, 4 + 2 + 3);
    assert_eq!(e.moments, 5 + 3 + 4);
    assert_eq!(e.wall_ms, 120_000);
    assert_eq!(e.moments_by_depth, vec![3, 9]);
    assert_eq!(e.phases, None);
    assert_eq!(e.spilled, None);
    assert_eq!(e.branches_per_hour, Some(9.0 * 30.0));
    assert_eq!(merged.fault_kinds["pause"], 9);
    assert_eq!(merged.fault_combinations[""], 3);
    // The first two alone kept everything.
    let two = merge::merge(parts[..2].to_vec());
    assert_eq!(two.exploration.spilled, Some(2));
    assert_eq!(two.exploration.branches_by_minute, vec![6]);
    assert_eq!(
        two.exploration.phases.map(|p| p.root_ms),
        Some(2000),
        "phases add"
    );
}

#[test]
fn test_the_json_round_trips_and_says_its_version() {
    let root = tempfile::tempdir().unwrap();
    let dir = campaign(root.path(), "a", &one_shard());
    let report = read(&[dir]).unwrap();
    let text = serde_json::to_string_pretty(&report).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["version"], json!(VERSION));
    for field in [
        "campaigns",
        "properties",
        "findings",
        "exploration",
        "fault_kinds",
    ] {
        assert!(value.get(field).is_some(), "{field}");
    }
    assert_eq!(value["findings"][0]["triage"], json!(null));
    assert_eq!(value["properties"][0]["verdict"], json!("failed"));
    let back: Report = serde_json::from_str(&text).unwrap();
    assert_eq!(back, report);
}

#[test]
fn test_the_junit_xml_is_well_formed_with_a_case_per_property() {
    let root = tempfile::tempdir().unwrap();
    let dir = campaign(root.path(), "a", &one_shard());
    let report = read(&[dir]).unwrap();
    let xml = junit::junit(&report).unwrap();
    let doc = roxmltree::Document::parse(&xml).expect("well-formed XML");
    let cases: Vec<roxmltree::Node> = doc
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    assert_eq!(cases.len(), report.properties.len());
    let failed: Vec<&roxmltree::Node> = cases
        .iter()
        .filter(|c| c.children().any(|n| n.has_tag_name("failure")))
        .collect();
    assert_eq!(failed.len(), 2, "stays-true and eventually: {xml}");
    let always = cases
        .iter()
        .find(|c| c.attribute("name") == Some("stays-true"))
        .unwrap();
    let failure = always
        .children()
        .find(|n| n.has_tag_name("failure"))
        .unwrap();
    let text = failure.text().unwrap_or_default();
    assert!(
        text.contains(&report.findings[0].replay),
        "the replay command: {text}"
    );
    let suite = doc
        .descendants()
        .find(|n| n.has_tag_name("testsuite"))
        .unwrap();
    assert_eq!(suite.attribute("failures"), Some("2"));
}

#[test]
fn test_the_html_is_self_contained_and_the_summary_says_the_same() {
    let root = tempfile::tempdir().unwrap();
    let shard = Shard {
        findings: vec![(1, "checker:linearizability:k<1>".into())],
        ..one_shard()
    };
    let dir = campaign(root.path(), "a", &shard);
    let report = read(&[dir]).unwrap();
    let page = html::html(&report).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    for external in [
        "<script",
        "<link",
        "src=\"http",
        "href=\"http",
        "@import",
        "url(",
    ] {
        assert!(!page.contains(external), "{external} in the page");
    }
    assert_eq!(page.matches("<svg").count(), 5, "four plots and a timeline");
    // The checker's view, embedded and escaped, in a frame without scripts.
    assert!(page.contains("sandbox=\"\""));
    assert!(page.contains("&lt;h1&gt;Not linearizable: &quot;k&quot; &amp; co"));
    assert!(page.contains(&crate::html::escape(&report.findings[0].replay)));
    // Each plot is XML on its own.
    for svg in page.split("<svg").skip(1) {
        let end = svg.find("</svg>").unwrap();
        let element = format!("<svg{}</svg>", &svg[..end]);
        roxmltree::Document::parse(&element).expect("an SVG element");
    }
    let summary = text::summary(&report);
    assert!(
        summary.contains("properties: 0 passed, 3 failed, 0 never reached"),
        "{summary}"
    );
    assert!(summary.contains(&report.findings[0].replay), "{summary}");
    assert!(
        summary.contains("wall time by phase: boot to root 1.0s"),
        "{summary}"
    );
}

/// A directory that is not a campaign, and none at all: errors naming it.
#[test]
fn test_a_directory_that_is_no_campaign_is_an_error_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let error = read(&[root.path().join("missing")]).unwrap_err();
    assert!(
        error.to_string().contains("missing: no such directory"),
        "{error}"
    );
    let error = read(&[root.path().to_owned()]).unwrap_err();
    assert!(error.to_string().contains("campaign.db"), "{error}");
    assert!(matches!(read(&[]), Err(read::ReadError::Nothing)));
}

#[test]
fn test_a_baseline_marks_findings_and_lists_what_did_not_fail_again() {
    let root = tempfile::tempdir().unwrap();
    let dirs = vec![
        campaign(root.path(), "shard0", &one_shard()),
        campaign(
            root.path(),
            "shard1",
            &Shard {
                always: (1, 0),
                sometimes_true: true,
                findings: vec![(1, "checker:linearizability:k1".into())],
                branches: 2,
                wall_ms: 30_000,
                stats: true,
            },
        ),
    ];
    let baseline = fuzzer::triage::Baseline::parse(
        "[finding.\"checker:linearizability:k1\"]\nstatus = \"known\"\nnote = \"upstream #123\"\n\n\
             [finding.\"checker:linearizability:gone\"]\nstatus = \"ignored\"\nnote = \"flaky disk\"\n",
        Path::new("triage.toml"),
    )
    .unwrap();
    let mut report = read::read(&dirs).unwrap();
    crate::triage::apply(&mut report, &baseline).unwrap();
    let status = |key: &str| {
        let f = report.findings.iter().find(|f| f.key == key).unwrap();
        f.triage.clone().unwrap()
    };
    assert_eq!(
        status(&property_key("stays-true")),
        Triage {
            status: Status::New,
            note: None
        }
    );
    assert_eq!(
        status("checker:linearizability:k1"),
        Triage {
            status: Status::Known,
            note: Some("upstream #123".into())
        }
    );
    assert_eq!(
        report.possibly_fixed,
        vec![PossiblyFixedEntry {
            key: "checker:linearizability:gone".into(),
            note: "flaky disk".into()
        }]
    );
    let summary = text::summary(&report);
    assert!(
        summary.contains("checker:linearizability:k1 [known]"),
        "{summary}"
    );
    assert!(
        summary.contains("possibly fixed checker:linearizability:gone  # flaky disk"),
        "{summary}"
    );
    let html = html::html(&report).unwrap();
    assert!(html.contains("[known: upstream #123]"), "html");
    assert!(html.contains("Possibly fixed"), "html");
}
