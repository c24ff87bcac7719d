//! `file_snapshot_spec`: the moment specs users type and scripts pass on
//! (`DIR@12.5s`, `DIR@exit:N`, `DIR@latest`, `DIR@<id>`, `DIR@id:<id>`,
//! `DIR/<id>`), resolved against a fixed, valid root of snapshots written
//! once per process by the snapshot crate's writer (`a` at 1 s / exit 10,
//! `b` at 2 s / exit 20, `c` incremental over `b` at 3 s / exit 30).
//!
//! Input: UTF-8 text. The text itself is parsed and printed (never
//! resolved: it may name any host path); `<root><text>` is parsed, printed
//! and resolved (unless it has a `..` component, which could climb out).
//!
//! Invariants asserted:
//! - no panic, no hang; a refusal is a typed error whose message is not
//!   empty and does not repeat its cause's message;
//! - a spec prints as a text that parses to the same spec and prints the
//!   same again (times and exit indexes in their one printed form), and its
//!   root is a prefix of the text it was parsed from;
//! - resolving is a function (twice, the same outcome) and changes no file;
//! - a resolved snapshot is one of the root's; for a time it is the latest
//!   at or before that time (no later snapshot also is), for `exit:N` the
//!   latest at or before that exit, for `latest` the last one, and for an
//!   id the snapshot of that id.
#![no_main]

#[path = "../common/files.rs"]
mod files;

use files::{check_error, picture, Scratch};
use libfuzzer_sys::fuzz_target;
use run::moment::{Moment, When};
use snapshot::{SnapshotInfo, SnapshotMeta, Target, PAGE_SIZE};
use std::path::PathBuf;
use std::sync::OnceLock;

struct Fixture {
    root: PathBuf,
    all: Vec<SnapshotInfo>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let scratch = Scratch::new("file_snapshot_spec");
        let root = scratch.reset();
        let ram = 4 * PAGE_SIZE as usize;
        let mut mem = vec![0u8; ram];
        mem[5] = 1;
        let a = SnapshotMeta::new("a", devices::VirtNanos(1_000_000_000), 10, ram as u64, 1);
        snapshot::write_snapshot(&root, &a, &(), &mem).expect("a");
        mem[4096] = 2;
        let b = SnapshotMeta::new("b", devices::VirtNanos(2_000_000_000), 20, ram as u64, 1);
        snapshot::write_snapshot(&root, &b, &(), &mem).expect("b");
        mem[8192] = 3;
        let mut c = SnapshotMeta::new("c", devices::VirtNanos(3_000_000_000), 30, ram as u64, 1);
        c.parent = Some("b".into());
        snapshot::write_incremental_snapshot(&root, &c, &(), &mem, &[2]).expect("c");
        let all = snapshot::list(&root).expect("the fixture lists");
        Fixture { root, all }
    })
}

fn check_print(text: &str) -> Option<Moment> {
    match text.parse::<Moment>() {
        Ok(spec) => {
            let printed = spec.to_string();
            let again = printed.parse::<Moment>();
            assert_eq!(
                again.as_ref().ok(),
                Some(&spec),
                "{text:?} prints as {printed:?}"
            );
            assert_eq!(again.map(|s| s.to_string()).ok(), Some(printed));
            let root = spec.root();
            assert!(
                text.starts_with(root.to_str().expect("from UTF-8")),
                "{text:?}: root {root:?}"
            );
            Some(spec)
        }
        Err(e) => {
            check_error(&e);
            None
        }
    }
}

fn outcome(spec: &Moment) -> Result<snapshot::Resolved, String> {
    spec.resolve().map_err(|e| check_error(&e))
}

/// `chosen` is at or before `limit` by `key`'s first number, and no
/// snapshot of the root that also is comes after it in `key` order.
fn no_later(
    text: &str,
    fx: &Fixture,
    chosen: &SnapshotMeta,
    limit: u64,
    key: fn(&SnapshotMeta) -> (u64, u64),
) {
    assert!(key(chosen).0 <= limit, "{text:?}: chosen after {limit}");
    let order = |m: &SnapshotMeta| (key(m), m.id.clone());
    let later = fx
        .all
        .iter()
        .find(|i| key(&i.meta).0 <= limit && order(&i.meta) > order(chosen));
    assert!(
        later.is_none(),
        "{text:?}: {later:?} is later and also at or before {limit}"
    );
}

fn check_resolved(text: &str, spec: &Moment, fx: &Fixture) {
    let first = outcome(spec);
    assert_eq!(first, outcome(spec), "{text:?} resolves two ways");
    let Ok(res) = first else { return };
    let chosen = &res.snapshot.meta;
    assert!(
        fx.all.iter().any(|i| &i.meta == chosen),
        "{text:?} resolved to {:?}, not one of the root's",
        res.snapshot.dir
    );
    match res.target {
        Target::VirtualTime(ns) => {
            no_later(text, fx, chosen, ns.0, |m| (m.virtual_ns.0, m.exit_index))
        }
        Target::ExitIndex(n) => no_later(text, fx, chosen, n, |m| (m.exit_index, m.virtual_ns.0)),
        Target::Latest => assert_eq!(Some(chosen), fx.all.last().map(|i| &i.meta), "{text:?}"),
        Target::Snapshot => {
            let named = match spec {
                Moment::At {
                    when: When::Id(id), ..
                } => id.clone(),
                Moment::At { when, .. } => panic!("{text:?}: {when} named a snapshot"),
                Moment::Snapshot(dir) => dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_owned(),
            };
            assert_eq!(chosen.id, named, "{text:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let fx = fixture();
    check_print(text);
    let rooted = format!("{}{text}", fx.root.display());
    let before = picture(&fx.root);
    // Never resolved outside the fixture (`..` could climb anywhere).
    let climbs = text.split('/').any(|part| part == "..");
    if let Some(spec) = check_print(&rooted).filter(|_| !climbs) {
        check_resolved(&rooted, &spec, fx);
    }
    assert!(picture(&fx.root) == before, "resolving changed the root");
});
