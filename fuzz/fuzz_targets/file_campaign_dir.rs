//! `file_campaign_dir`: a campaign directory as users copy it between
//! machines to resume a campaign or replay its findings: `campaign.db`
//! (SQLite), `blobs/<digest>`, `findings/NNNN/{finding.json, run.json,
//! blobs/}`.
//!
//! Input: a tree in the encoding of `fuzz/common/files.rs`. The seeds are
//! directories written by the fuzzer crate's own code (`Store::create`,
//! `commit_branch`, `findings::blobify`), a finding laid out as
//! `findings::write` lays it out, and a database whose spec a build before
//! saved (its faults the TOML table written, its wall budget in whole ms).
//!
//! Entry points, in the order `campaign --resume` and `replay` use them:
//! `Store::open`, `campaign_meta()` (the spec and the run),
//! `findings::resolve`, `nodes`, `findings`, `records`, `branches`,
//! `wall_ms`, `check_paths` (every stored path's faults); then
//! `findings::load` on every finding directory, and `listing::list` (what
//! `detvisor findings` prints, from the index opened read only).
//!
//! Invariants asserted:
//! - no panic, no hang; a refusal is a typed error whose message is not
//!   empty, does not repeat its cause's message, and names the file or
//!   directory at fault (a path inside the campaign directory);
//! - a refused open changes no byte of any file that was there before (it
//!   may leave the `lock` file); an accepted one changes no file but the
//!   database, and reading the campaign changes nothing more;
//! - paths a blobified run resolves to are blobs inside the directory it
//!   was resolved against (`<dir>/blobs/<64 hex>`), never elsewhere;
//! - loading a finding twice gives the same result; a finding that loads
//!   holds only faults that parse and name its run's nodes;
//! - the listing changes nothing (but a hot journal it rolls back); one
//!   that succeeds lists exactly the
//!   findings the index holds, each from its own `findings/NNNN`, and
//!   a finding directory the index does not know, or an indexed one that
//!   is missing, is refused;
//! - nothing beside the campaign directory changes (the canary).
#![no_main]

#[path = "../common/files.rs"]
mod files;

use files::{check_error, encode_tree, picture, Scratch};
use fuzzer::findings::{self, FindingFile, BLOBS_DIR, FINDINGS_DIR};
use fuzzer::spec::CampaignSpec;
use fuzzer::store::{FindingRow, FinishedBranch, NodeRow, Store, DB_FILE, LOCK_FILE};
use libfuzzer_sys::fuzz_target;
use run::up::{Initrd, PreparedUp};
use std::path::Path;
use std::sync::OnceLock;

/// Most findings loaded per input.
const MAX_FINDINGS: usize = 4;
/// Most nodes whose records are read per input.
const MAX_RECORDS: usize = 16;

fn scratch() -> &'static Scratch {
    static SCRATCH: OnceLock<Scratch> = OnceLock::new();
    SCRATCH.get_or_init(|| Scratch::new("file_campaign_dir"))
}

/// Checks an error and that it names a path inside `dir`.
fn refusal(e: &(dyn std::error::Error + 'static), dir: &Path) {
    let line = check_error(e);
    assert!(
        line.contains(dir.to_str().expect("scratch paths are UTF-8")),
        "the refusal names no path in {}: {line}",
        dir.display()
    );
}

/// Every path of a resolved run is a blob of `dir`.
fn check_resolved(run: &PreparedUp, dir: &Path) {
    let mut paths = vec![run.kernel.clone()];
    if let Initrd::File(path) = &run.initrd {
        paths.push(path.clone());
    }
    paths.extend(run.disks.iter().map(|d| d.image.clone()));
    let blobs = dir.join(BLOBS_DIR);
    for path in paths {
        let name = path
            .strip_prefix(&blobs)
            .unwrap_or_else(|_| panic!("{} resolved outside {}", path.display(), blobs.display()));
        let name = name.to_str().expect("a digest");
        assert!(
            name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()),
            "{} is not a blob's name",
            path.display()
        );
    }
}

fn read_store(store: &Store, dir: &Path) {
    let ok_or_refused = |r: Result<(), fuzzer::store::StoreError>| {
        if let Err(e) = r {
            refusal(&e, dir);
        }
    };
    match store.campaign_meta() {
        // A spec as saved, by this build or one before (its faults as the
        // TOML table written, its wall budget in whole ms): its profile is
        // checked again before use; a refusal is a plain typed error. The
        // run as saved: its files resolved in the directory.
        Ok(meta) => {
            if let Err(e) = meta.spec.faults.validate() {
                check_error(&e);
            }
            assert_ne!(meta.spec.wall_budget(), Some(devices::VirtNanos::ZERO));
            match findings::resolve(dir, &meta.run) {
                Ok(resolved) => check_resolved(&resolved, dir),
                Err(e) => refusal(&e, dir),
            }
            ok_or_refused(store.check_paths(&meta.run.node_names));
        }
        Err(e) => refusal(&e, dir),
    }
    match store.nodes() {
        Ok(nodes) => {
            for node in nodes.iter().take(MAX_RECORDS) {
                ok_or_refused(store.records::<serde_json::Value>(node.id).map(drop));
            }
        }
        Err(e) => refusal(&e, dir),
    }
    ok_or_refused(store.findings().map(drop));
    ok_or_refused(store.branches().map(drop));
    ok_or_refused(store.wall_ms().map(drop));
}

fn load_finding(campaign: &Path, dir: &Path) -> Result<(FindingFile, PreparedUp), String> {
    match findings::load(dir) {
        Ok(loaded) => {
            assert_eq!(loaded.file.format, findings::FINDING_FORMAT);
            for path in [&loaded.file.path, &loaded.file.found_path] {
                assert!(path.check_faults(&loaded.run.node_names).is_ok());
            }
            check_resolved(&loaded.run, dir);
            Ok((loaded.file, loaded.run))
        }
        Err(e) => {
            // The finding's own name may not be UTF-8; the campaign's is.
            refusal(&e, campaign);
            Err(check_error(&e))
        }
    }
}

fn check_findings(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir.join(FINDINGS_DIR)) else {
        return;
    };
    let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
    names.sort();
    for name in names.into_iter().take(MAX_FINDINGS) {
        let finding = dir.join(FINDINGS_DIR).join(name);
        let first = load_finding(dir, &finding);
        let second = load_finding(dir, &finding);
        let same = match (&first, &second) {
            (Ok((f1, r1)), Ok((f2, r2))) => {
                f1 == f2
                    && serde_json::to_string(r1).expect("runs serialise")
                        == serde_json::to_string(r2).expect("runs serialise")
            }
            (Err(a), Err(b)) => a == b,
            _ => false,
        };
        assert!(same, "{}: two loads differ", finding.display());
    }
}

/// `detvisor findings`: the index's findings, each from its directory.
fn check_listing(dir: &Path) {
    match fuzzer::listing::list(dir) {
        Ok(listed) => {
            let store = Store::open_read_only(dir).expect("the listing opened it");
            let rows = store.findings().expect("the listing read it");
            assert_eq!(listed.len(), rows.len());
            for (item, row) in listed.iter().zip(&rows) {
                assert_eq!((item.file.number, &item.file.key), (row.number, &row.key));
                assert_eq!(item.dir, findings::finding_dir(dir, row.number));
            }
        }
        Err(e) => refusal(&e, dir),
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let scratch = Scratch::new("file_campaign_dir-seeds");
    let base = scratch.reset();
    let dir = base.join("campaign");
    std::fs::create_dir(&dir).expect("campaign dir");
    let kernel = base.join("vmlinux");
    std::fs::write(&kernel, b"kernel bytes").expect("kernel");
    let prepared: PreparedUp = serde_json::from_value(serde_json::json!({
        "kernel": kernel, "initrd": {"bytes": [1, 2, 3]}, "specs": [], "node_names": ["n1"],
        "workload": null,
        "network": serde_json::to_value(devices::NetworkConfig::reliable(
            devices::LatencyDist::Fixed(devices::VirtNanos::ZERO))).expect("network"),
        "rtc_epoch_unix_secs": 0, "ram_bytes": 67108864, "faults": [], "disks": []
    }))
    .expect("a run");
    let run = findings::blobify(&dir, &prepared).expect("blobify");
    let spec = CampaignSpec::parse(
        "manifest = \"up.toml\"\nseed = 7\n",
        Path::new("campaign.toml"),
        Path::new("/campaigns"),
    )
    .expect("a campaign file");
    let spec_json = serde_json::to_string(&spec).expect("spec");
    let run_json = serde_json::to_string(&run).expect("run");
    let mut store =
        Store::create(&dir, &[("spec", spec_json), ("run", run_json.clone())]).expect("create");
    let node = |id: u64, path: fuzzer::step::Path| NodeRow {
        id,
        parent: id.checked_sub(1),
        depth: id as u32,
        path,
        end_exits: 10 * (id + 1),
        end_ns: devices::VirtNanos(1_000 * (id + 1)),
        digest: format!("{:032x}", id + 1),
        score: 0.5 + id as f64,
        stopped: id == 1,
    };
    let root = node(0, fuzzer::step::Path::default());
    let child = node(
        1,
        root.path.child(
            1,
            vec!["at=+1s pause n1".parse().unwrap()],
            devices::VirtNanos(1_000),
        ),
    );
    store
        .commit_branch(&FinishedBranch {
            node: &root,
            records_json: "[]",
            findings: &[],
            meta: &[("branches", "0".into())],
        })
        .expect("root");
    let row = FindingRow {
        number: 1,
        key: "property:x".into(),
        node: 1,
        summary: "x failed".into(),
    };
    store
        .commit_branch(&FinishedBranch {
            node: &child,
            records_json: "[1,2]",
            findings: std::slice::from_ref(&row),
            meta: &[("branches", "1".into()), ("wall_ms", "1234".into())],
        })
        .expect("child");
    drop(store);
    let _ = std::fs::remove_file(dir.join(LOCK_FILE));
    let db_only = encode_tree(&dir, 0);
    // A finding laid out as `findings::write` does it.
    let finding = findings::finding_dir(&dir, 1);
    std::fs::create_dir_all(finding.join(BLOBS_DIR)).expect("finding dir");
    for entry in std::fs::read_dir(dir.join(BLOBS_DIR)).expect("blobs") {
        let entry = entry.expect("blob");
        std::fs::copy(
            entry.path(),
            finding.join(BLOBS_DIR).join(entry.file_name()),
        )
        .expect("copy blob");
    }
    let file = FindingFile {
        format: findings::FINDING_FORMAT,
        number: 1,
        key: row.key.clone(),
        summary: row.summary.clone(),
        details: serde_json::json!({"property": "x"}),
        path: child.path.clone(),
        found_path: child.path.clone(),
        digest: child.digest.clone(),
        exits: 20,
        virtual_ns: devices::VirtNanos(2_000),
        spec,
        // Kept, as a finding made now keeps it (one written before has
        // none, and loading it reads its records.jsonl).
        failure_moment: Some(fuzzer::failure_moment::FailureMoment::at_end(
            20,
            devices::VirtNanos(2_000),
        )),
        // Not shrunk (as a finding written before steps were).
        shrinking: None,
    };
    std::fs::write(
        finding.join(findings::FINDING_FILE),
        serde_json::to_string_pretty(&file).expect("finding"),
    )
    .expect("finding.json");
    std::fs::write(finding.join(findings::RUN_FILE), &run_json).expect("run.json");
    let whole = encode_tree(&dir, 0);
    // A database saved by a build before: its faults the TOML table as
    // written, its wall budget in whole ms.
    let mut old_spec = serde_json::to_value(&file.spec).expect("spec");
    old_spec["faults"] = serde_json::json!({"network": {"rate": 0.5, "duration": "1s..2s"}});
    old_spec.as_object_mut().expect("an object").remove("wall");
    old_spec["wall_ms"] = 1_800_000.into();
    let old = base.join("old");
    std::fs::create_dir(&old).expect("old campaign dir");
    let store = Store::create(&old, &[("spec", old_spec.to_string()), ("run", run_json)])
        .expect("create an old one");
    drop(store);
    let _ = std::fs::remove_file(old.join(LOCK_FILE));
    let saved_before = encode_tree(&old, 0);
    let _ = std::fs::remove_dir_all(&scratch.base);
    vec![db_only, whole, saved_before]
}

fuzz_target!(
    init: {
        files::maybe_write_seeds(seeds);
    },
    |data: &[u8]| {
    let s = scratch();
    let (dir, _) = s.decode(data);
    let before = picture(&dir);
    let db = dir.join(DB_FILE);
    match Store::open(&dir) {
        Ok(store) => {
            let opened = picture(&dir);
            read_store(&store, &dir);
            drop(store);
            assert!(picture(&dir) == opened, "reading the campaign changed it");
            for (path, was) in &before {
                if path != &db {
                    assert_eq!(opened.get(path), Some(was), "{} changed", path.display());
                }
            }
        }
        Err(e) => {
            refusal(&e, &dir);
            let after = picture(&dir);
            for (path, was) in &before {
                assert_eq!(
                    after.get(path),
                    Some(was),
                    "{} changed by an open that refused it: {e}",
                    path.display()
                );
            }
        }
    }
    s.check_read_only(&dir, "loading the findings", || check_findings(&dir));
    // The listing changes nothing but a hot journal's rollback (which the
    // open above has done already when it reached SQLite).
    let listed = picture(&dir);
    check_listing(&dir);
    let journal = dir.join(format!("{DB_FILE}-journal"));
    let after = picture(&dir);
    for path in after.keys().chain(listed.keys()) {
        if path != &db && path != &journal {
            let (then, now) = (listed.get(path), after.get(path));
            assert!(then == now, "listing changed {}", path.display());
        }
    }
    s.assert_outside_untouched();
});
