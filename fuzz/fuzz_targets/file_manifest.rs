//! `file_manifest`: the TOML files users write and copy: `up` manifests
//! (`run::manifest`) and campaign files (`fuzzer::spec::CampaignSpec`).
//!
//! Input: the first byte chooses (even: a manifest, odd: a campaign file),
//! the rest is the file's text (UTF-8 only). It is parsed from memory and
//! also written to a scratch file and loaded, the way the CLI reads it.
//!
//! Invariants asserted:
//! - no panic, no hang; a refusal is a typed error whose message is not
//!   empty and does not repeat its cause's message; loading the file gives
//!   the same outcome as parsing its text (a refusal is wrapped once, in
//!   an error naming the file);
//! - parsing is a function: the same text parses to the same value twice;
//! - an accepted manifest has at least one node, at most `MAX_NODES`
//!   (counting the workload's own), no two with one name, and its fault
//!   schedule parses against its node names (every fault string in it is a
//!   valid fault whose nodes exist);
//! - an accepted campaign file serialises to JSON (as the campaign
//!   database keeps it) and back to the same value, and its manifest path
//!   is absolute, under the campaign file's directory when it was relative;
//!   it is within every documented bound (slice, root, depth, live
//!   checkpoints and their memory, a valid fault profile), a fault range
//!   whose minimum passes the slice is warned about (never silent), and
//!   checked against nodes `n1..n3` (n1
//!   with a disk) it is accepted only if each excluded name is one of them
//!   or the workload, and refused naming the campaign file;
//! - a refused campaign file's message starts with `campaign file <path>`.
//!
//! Neither file type has a printer (TOML is written by users only), so
//! there is no print-then-parse check here; the campaign's JSON form is its
//! only printed form and is checked.
#![no_main]

#[path = "../common/files.rs"]
mod files;

use devices::VirtNanos;
use files::{check_error, Scratch};
use fuzzer::spec::{
    CampaignFile, CampaignSpec, RootRule, SpecError, MAX_DEPTH, MAX_LIVE_CHECKPOINTS_UNBOUNDED,
    MIN_CHECKPOINT_MEMORY, MIN_SLICE, ROOT_POLL, SIZED_LIVE_CHECKPOINTS,
};
use libfuzzer_sys::fuzz_target;
use run::manifest::WORKLOAD_NODE;
use run::units::MAX_VIRTUAL_TIME;
use std::path::Path;
use std::sync::OnceLock;

fn scratch() -> &'static Scratch {
    static SCRATCH: OnceLock<Scratch> = OnceLock::new();
    SCRATCH.get_or_init(|| Scratch::new("file_manifest"))
}

fn check_manifest(text: &str, root: &Path) {
    let parsed = run::manifest::parse(text, root);
    let path = root.join("up.toml");
    std::fs::write(&path, text).expect("scratch file");
    let loaded = run::manifest::load(&path);
    match (&parsed, &loaded) {
        (Ok(m), Ok(l)) => {
            assert_eq!(m, l, "loading differs from parsing");
            assert_eq!(&run::manifest::parse(text, root).expect("parses again"), m);
            let names = m.node_names();
            assert!(!m.nodes.is_empty(), "a manifest without nodes");
            assert!(
                names.len() <= run::manifest::MAX_NODES,
                "{} nodes",
                names.len()
            );
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), names.len(), "duplicate names in {names:?}");
            if let Err(e) = run::faults::schedule(&m.faults, &names) {
                panic!("an accepted manifest's faults do not schedule: {e}");
            }
        }
        (Err(p), Err(l)) => {
            let p_line = check_error(p);
            let l_line = check_error(l);
            assert!(
                l_line.ends_with(&p_line) || matches!(l, run::manifest::ManifestError::Read(_)),
                "load says {l_line:?}, parse says {p_line:?}"
            );
        }
        (p, l) => panic!(
            "parse and load disagree: parse {:?}, load {:?}",
            p.as_ref().map(|_| "ok"),
            l.as_ref().map(|_| "ok")
        ),
    }
}

fn check_campaign(text: &str, root: &Path) {
    let path = root.join("campaign.toml");
    let parsed = CampaignSpec::parse(text, &path, root);
    std::fs::write(&path, text).expect("scratch file");
    let loaded = CampaignSpec::load(&path);
    match (&parsed, &loaded) {
        (Ok(spec), Ok(l)) => {
            assert_eq!(spec, l, "loading differs from parsing");
            assert_eq!(
                &CampaignSpec::parse(text, &path, root).expect("again"),
                spec
            );
            let json = serde_json::to_string(spec).expect("serialises");
            let back: CampaignSpec = serde_json::from_str(&json)
                .unwrap_or_else(|e| panic!("{json} does not deserialise: {e}"));
            assert_eq!(&back, spec, "{json}");
            assert!(spec.manifest.is_absolute(), "{:?}", spec.manifest);
            check_bounds(spec);
            let file = CampaignFile::parse(text, &path, root).expect("a spec is a file");
            for (key, range) in spec.faults.duration_ranges() {
                if range.min > spec.slice_ns {
                    let key = format!("faults.{key} ");
                    assert!(
                        file.warnings.iter().any(|w| w.contains(&key)),
                        "{key}{range} passes the slice silently"
                    );
                }
            }
            let nodes = ["n1", "n2", "n3"].map(String::from);
            match file.check_nodes(&nodes, &nodes[..1]) {
                Ok(()) => {
                    for name in spec.faults.exclude.iter().chain(&spec.exclude) {
                        assert!(
                            nodes.contains(name) || name == WORKLOAD_NODE,
                            "{name:?} accepted"
                        );
                    }
                }
                Err(e) => assert_names_file(&e, &path),
            }
        }
        (Err(p), Err(l)) => {
            assert_eq!(
                check_error(p),
                check_error(l),
                "load and parse refuse differently"
            );
            assert_names_file(p, &path);
        }
        (p, l) => panic!(
            "parse and load disagree: parse {:?}, load {:?}",
            p.as_ref().map(|_| "ok"),
            l.as_ref().map(|_| "ok")
        ),
    }
}

/// A campaign file's refusal (not a failed read) names the file first.
fn assert_names_file(e: &SpecError, path: &Path) {
    if !matches!(e, SpecError::Read(_)) {
        let message = e.to_string();
        let want = format!("campaign file {}", path.display());
        assert!(
            message.starts_with(&want),
            "{message:?} does not name {want}"
        );
    }
}

/// An accepted spec is within every documented bound.
fn check_bounds(spec: &CampaignSpec) {
    let slice = spec.slice_ns;
    assert!(
        (MIN_SLICE..=MAX_VIRTUAL_TIME).contains(&slice),
        "slice {slice}"
    );
    assert!((1..=MAX_DEPTH).contains(&spec.max_depth));
    assert!(spec.live_checkpoints >= 1);
    match spec.checkpoint_memory {
        Some(bytes) => assert!(bytes >= MIN_CHECKPOINT_MEMORY),
        // Sized from the machine's memory when the run starts: the count
        // is only a backstop then.
        None if spec.size_checkpoints_from_memory => {
            assert_eq!(spec.live_checkpoints, SIZED_LIVE_CHECKPOINTS)
        }
        None => assert!(spec.live_checkpoints <= MAX_LIVE_CHECKPOINTS_UNBOUNDED),
    }
    let root = match spec.root {
        RootRule::SetupComplete { wait_ns } => {
            assert!(wait_ns >= ROOT_POLL);
            wait_ns
        }
        RootRule::At { at_ns } => {
            assert!(at_ns > VirtNanos::ZERO);
            at_ns
        }
    };
    let deepest = u128::from(root.0) + u128::from(spec.max_depth) * u128::from(spec.slice_ns.0);
    assert!(
        deepest <= u128::from(MAX_VIRTUAL_TIME.0),
        "the deepest end {deepest}ns"
    );
    assert_ne!(spec.wall_budget(), Some(VirtNanos::ZERO), "0 is no limit");
    spec.faults
        .validate()
        .expect("an accepted profile is valid");
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let root = scratch().reset();
    if which % 2 == 0 {
        check_manifest(text, &root);
    } else {
        check_campaign(text, &root);
    }
    scratch().assert_outside_untouched();
});
