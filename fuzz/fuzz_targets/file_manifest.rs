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
//!   is absolute, under the campaign file's directory when it was relative.
//!
//! Neither file type has a printer (TOML is written by users only), so
//! there is no print-then-parse check here; the campaign's JSON form is its
//! only printed form and is checked.
#![no_main]

#[path = "../common/files.rs"]
mod files;

use files::{check_error, Scratch};
use fuzzer::spec::CampaignSpec;
use libfuzzer_sys::fuzz_target;
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
                panic!("an accepted manifest's faults do not parse: {e}");
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
        }
        (Err(p), Err(l)) => {
            assert_eq!(
                check_error(p),
                check_error(l),
                "load and parse refuse differently"
            );
        }
        (p, l) => panic!(
            "parse and load disagree: parse {:?}, load {:?}",
            p.as_ref().map(|_| "ok"),
            l.as_ref().map(|_| "ok")
        ),
    }
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
