//! One campaign in three shards, run as local processes that take their
//! index from `JOB_COMPLETION_INDEX`, as the pods of a Kubernetes Indexed
//! Job do (docs/campaigns.md, "Shards"): each boots its own root, all with
//! the same digest; each branches only moments of its own (every step's
//! seed in its residue class modulo 3), so no moment is explored twice; and
//! the three directories' findings together are each shard's, none in two.
//! The target is the coin (tests/common/coin.rs): a busybox node whose
//! branches from the root fail a quarter of the time.

mod common;

use common::coin::Coin;
use common::*;
use fuzzer::shard::Shard;
use fuzzer::store::Store;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const SHARDS: u64 = 3;

/// `campaign FILE --shard-count 3 --out DIR --branches 2`, started with
/// `JOB_COMPLETION_INDEX=index`.
fn start_shard(file: &Path, out: &Path, index: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .arg("campaign")
        .arg(file)
        .args(["--shard-count", &SHARDS.to_string(), "--branches", "2"])
        .arg("--out")
        .arg(out)
        .env("JOB_COMPLETION_INDEX", index.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("detvisor starts")
}

/// Waits for shard `index` and echoes what it did.
fn finish(index: u64, child: Child) -> Output {
    let out = child.wait_with_output().expect("the shard ends");
    eprintln!(
        "$ JOB_COMPLETION_INDEX={index} detvisor campaign ... --shard-count {SHARDS}\n--- status: {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
        out.status.code(),
        stdout(&out),
        stderr(&out)
    );
    out
}

#[test]
fn test_three_shards_from_the_completion_index_split_one_root_s_tree() {
    let started = std::time::Instant::now();
    let coin = Coin::new("shards");
    let file = coin.campaign_file();
    let dirs: Vec<PathBuf> = (0..SHARDS)
        .map(|i| coin.cluster.dir.join(format!("shard-{i}")))
        .collect();

    // Without the variable, --shard-count is refused before anything starts.
    let unset = Command::new(env!("CARGO_BIN_EXE_detvisor"))
        .arg("campaign")
        .arg(&file)
        .args(["--shard-count", "3", "--out"])
        .arg(&dirs[0])
        .env_remove("JOB_COMPLETION_INDEX")
        .output()
        .unwrap();
    assert_eq!(unset.status.code(), Some(2));
    assert!(
        stderr(&unset).contains("--shard-count 3: JOB_COMPLETION_INDEX is not set"),
        "{}",
        stderr(&unset)
    );
    assert!(!dirs[0].exists());

    // Two at a time, as CI's hosts have two cores: shards 0 and 1, then 2
    // as soon as 0 is done.
    let zero = start_shard(&file, &dirs[0], 0);
    let one = start_shard(&file, &dirs[1], 1);
    let mut outputs = vec![finish(0, zero)];
    let two = start_shard(&file, &dirs[2], 2);
    outputs.push(finish(1, one));
    outputs.push(finish(2, two));
    eprintln!("three shards in {:.1} s", started.elapsed().as_secs_f64());

    let mut root = None;
    let mut all_paths = BTreeSet::new();
    let mut all_findings = BTreeSet::new();
    let mut found = 0;
    for (index, (out, dir)) in outputs.iter().zip(&dirs).enumerate() {
        let shard = Shard::new(index as u64, SHARDS).unwrap();
        let err = stderr(out);
        // 0 without a finding, 1 with one.
        assert!(matches!(out.status.code(), Some(0 | 1)), "{err}");
        assert!(
            err.contains(&format!("shard {shard} of the campaign's search")),
            "{err}"
        );
        let store = Store::open(dir).unwrap();
        assert_eq!(store.campaign_meta().unwrap().spec.shard, shard);
        let nodes = store.nodes().unwrap();
        assert_eq!(nodes.len(), 3, "the root and two branches: {nodes:?}");
        // One root: the same moment and digest in every shard.
        let this_root = (nodes[0].end_exits, nodes[0].end_ns, nodes[0].digest.clone());
        assert_eq!(root.get_or_insert_with(|| this_root.clone()), &this_root);
        for node in &nodes[1..] {
            for step in &node.path.steps {
                assert!(shard.owns(step.seed), "{shard}: {}", node.path);
            }
            assert!(
                all_paths.insert(serde_json::to_string(&node.path).unwrap()),
                "{shard}: {} was explored by another shard",
                node.path
            );
        }
        // The shard's findings as `findings` reads its directory: its own
        // paths, none another shard's.
        let listed = detvisor(&["findings", dir.to_str().unwrap(), "--json"]);
        assert_eq!(listed.status.code(), Some(0));
        let lines: Vec<serde_json::Value> = stdout(&listed)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), store.findings().unwrap().len());
        assert_eq!(out.status.code(), Some(i32::from(!lines.is_empty())));
        for line in &lines {
            let finding = fuzzer::findings::load(Path::new(line["dir"].as_str().unwrap())).unwrap();
            assert_eq!(finding.file.spec.shard, shard);
            for step in &finding.file.path.steps {
                assert!(shard.owns(step.seed), "{shard}: {}", finding.file.path);
            }
            assert!(all_findings.insert(line["digest"].as_str().unwrap().to_string()));
        }
        found += lines.len();
    }
    assert_eq!(all_paths.len(), 6);
    assert_eq!(
        all_findings.len(),
        found,
        "the union of the shards' findings"
    );
    assert!(found >= 1, "this campaign's seed finds the coin's failure");

    // The merged report of the three is the union of their findings (a
    // failure several shards found is one finding, the others its copies)
    // and the sum of their tallies.
    let report_of = |dirs: &[PathBuf], name: &str| -> serde_json::Value {
        let json = dirs[0].parent().unwrap().join(name);
        let mut args = vec!["report".to_owned()];
        args.extend(dirs.iter().map(|d| d.to_str().unwrap().to_owned()));
        args.extend(["--json".to_owned(), json.to_str().unwrap().to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = detvisor(&args);
        assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
        if dirs.len() > 1 {
            // Away from a terminal, a progress line per directory read.
            let said = format!("read {} of {} campaign directories", dirs.len(), dirs.len());
            assert!(stderr(&run).contains(&said), "{}", stderr(&run));
        }
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
    };
    let merged = report_of(&dirs, "merged.json");
    let parts: Vec<serde_json::Value> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| report_of(std::slice::from_ref(d), &format!("shard{i}.json")))
        .collect();
    let copies: usize = merged["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| 1 + f["also_in"].as_array().unwrap().len())
        .sum();
    assert_eq!(copies, found, "every shard's finding, once or as a copy");
    let keys: BTreeSet<&str> = parts
        .iter()
        .flat_map(|p| p["findings"].as_array().unwrap())
        .map(|f| f["key"].as_str().unwrap())
        .collect();
    let merged_keys: BTreeSet<&str> = merged["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["key"].as_str().unwrap())
        .collect();
    assert_eq!(merged_keys, keys);
    let sum = |what: &dyn Fn(&serde_json::Value) -> u64| parts.iter().map(what).sum::<u64>();
    let branches = |r: &serde_json::Value| r["exploration"]["branches"].as_u64().unwrap();
    assert_eq!(branches(&merged), sum(&branches));
    assert_eq!(branches(&merged), 6);
    let hits = |r: &serde_json::Value| {
        r["properties"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["hits"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(hits(&merged), sum(&hits));
    // `findings` over the three lists each shard's finding.
    let mut args = vec!["findings"];
    args.extend(dirs.iter().map(|d| d.to_str().unwrap()));
    args.push("--json");
    let listed = detvisor(&args);
    assert_eq!(listed.status.code(), Some(0));
    assert_eq!(stdout(&listed).lines().count(), found);

    // A shard resumes as itself only: another shard is refused before any
    // VM starts, naming both.
    let other = detvisor(&[
        "campaign",
        "--resume",
        dirs[0].to_str().unwrap(),
        "--shard",
        "1/3",
    ]);
    assert_eq!(other.status.code(), Some(2));
    assert!(
        stderr(&other).contains("the campaign is shard 0/3, not 1/3"),
        "{}",
        stderr(&other)
    );
    eprintln!("test done in {:.1} s", started.elapsed().as_secs_f64());
}
