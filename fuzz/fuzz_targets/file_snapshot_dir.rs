//! `file_snapshot_dir`: a directory of snapshots as a user copies it
//! between machines (`state.bin`, `memory.img`, `memory.idx` per snapshot,
//! incremental chains through `meta.parent`).
//!
//! Input: a tree in the encoding of `fuzz/common/files.rs`, decoded into a
//! scratch root. Flag bit 0 of the first byte re-frames every `state.bin`
//! and `memory.idx` (header length and CRC-64 made to match the payload) so
//! the fuzzer gets past the checksums to the JSON, the page index and the
//! chain logic. The seeds are real snapshot roots written by
//! `snapshot::write_snapshot` / `write_incremental_snapshot` (a full
//! snapshot and two incremental children), which the fuzzer then mutates.
//!
//! Every subdirectory is read through the public entry points: `list`,
//! `info`, `read_snapshot`, `memory_chain`, `map_memory_private`,
//! `memory_data_ranges`, `verify_memory`, and the specs `ROOT@latest`,
//! `ROOT@<time>`, `ROOT@exit:<n>`, `ROOT@<id>`.
//!
//! Invariants asserted:
//! - no panic, no hang; a refusal is a typed error whose message is not
//!   empty and does not repeat its cause's message;
//! - reading changes nothing: the tree's bytes are the same after, and the
//!   canary beside it is untouched;
//! - a snapshot either loads the same twice (same meta, state, and the
//!   same digest of its mapped memory) or is refused both times with the
//!   same message;
//! - `list`, when it succeeds, names each snapshot by its directory, holds
//!   every incremental snapshot's parent, and no chain of parents goes
//!   round (a cycle or a missing parent is refused);
//! - `memory_chain`, when it succeeds, starts at a full snapshot, continues
//!   with incremental ones each the child of the one before, all of one
//!   `ram_bytes`; the mapped memory is `ram_bytes` long;
//! - `memory_data_ranges` are page-aligned, sorted, disjoint, within RAM,
//!   and every byte of the mapped memory outside them is zero;
//! - a resolved spec names a snapshot inside the root, at or before the
//!   time or exit asked for, and `@latest` is the last one `list` gives.
#![no_main]

#[path = "../common/files.rs"]
mod files;

use files::{check_error, encode_tree, fnv, picture, Scratch, FNV_START};
use libfuzzer_sys::fuzz_target;
use snapshot::{SnapshotError, SnapshotMeta, Target, PAGE_SIZE};
use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

/// Most snapshot directories read per input.
const MAX_DIRS: usize = 8;

fn scratch() -> &'static Scratch {
    static SCRATCH: OnceLock<Scratch> = OnceLock::new();
    SCRATCH.get_or_init(|| Scratch::new("file_snapshot_dir"))
}

/// Rewrites the header of a framed file so its length and CRC match the
/// payload after it (the magic, version and flags are left as they are).
fn reframe(path: &Path) {
    let Ok(mut bytes) = std::fs::read(path) else {
        return;
    };
    if bytes.len() < 32 {
        return;
    }
    let len = (bytes.len() - 32) as u64;
    let crc = snapshot::checksum(&bytes[32..]);
    bytes[16..24].copy_from_slice(&len.to_le_bytes());
    bytes[24..32].copy_from_slice(&crc.to_le_bytes());
    let _ = std::fs::write(path, bytes);
}

fn reframe_all(root: &Path) {
    for path in picture(root).into_keys() {
        let name = path.file_name().and_then(|n| n.to_str());
        if matches!(name, Some(snapshot::STATE_FILE | snapshot::INDEX_FILE))
            && std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file())
        {
            reframe(&path);
        }
    }
}

/// What one load of a snapshot gives, to compare two loads.
#[derive(Debug, PartialEq)]
enum Load {
    Loaded {
        meta: SnapshotMeta,
        state: serde_json::Value,
        memory: Option<u64>,
    },
    Refused(String),
}

fn refused(e: &SnapshotError) -> Load {
    Load::Refused(check_error(e))
}

fn load(dir: &Path) -> Load {
    let (meta, state) = match snapshot::read_snapshot::<serde_json::Value>(dir) {
        Ok(v) => v,
        Err(e) => return refused(&e),
    };
    let memory = match snapshot::map_memory_private(dir) {
        Ok(m) => {
            assert_eq!(m.len() as u64, meta.ram_bytes, "mapped memory length");
            let bytes = m.as_slice();
            if let Ok(ranges) = snapshot::memory_data_ranges(dir) {
                let mut end = 0;
                for &(s, e) in &ranges {
                    assert!(s >= end && s < e && e <= meta.ram_bytes, "{ranges:?}");
                    assert!(s % PAGE_SIZE == 0 && e % PAGE_SIZE == 0, "{ranges:?}");
                    assert!(
                        bytes[end as usize..s as usize].iter().all(|&b| b == 0),
                        "non-zero bytes in [{end:#x}, {s:#x}), outside the data ranges {ranges:?}"
                    );
                    end = e;
                }
                assert!(bytes[end as usize..].iter().all(|&b| b == 0), "tail");
            }
            Some(fnv(bytes, FNV_START))
        }
        Err(e) => {
            check_error(&e);
            None
        }
    };
    Load::Loaded {
        meta,
        state,
        memory,
    }
}

fn check_chain(dir: &Path) {
    let chain = match snapshot::memory_chain(dir) {
        Ok(chain) => chain,
        Err(e) => {
            check_error(&e);
            return;
        }
    };
    let head = snapshot::read_meta(dir).expect("a chain's head has a meta");
    assert!(!chain.is_empty());
    assert!(!chain[0].incremental, "the base of a chain is incremental");
    assert_eq!(chain.last().expect("not empty").id, head.id);
    let mut ram = None;
    for pair in chain.windows(2) {
        assert!(pair[1].incremental, "a full snapshot above the base");
        let child = snapshot::read_meta(&pair[1].dir).expect("a chain's layer has a meta");
        assert_eq!(child.parent.as_deref(), Some(pair[0].id.as_str()));
    }
    for layer in &chain {
        let meta = snapshot::read_meta(&layer.dir).expect("meta");
        assert_eq!(*ram.get_or_insert(meta.ram_bytes), meta.ram_bytes);
        let len = layer.file.metadata().expect("stat").len();
        assert_eq!(
            len,
            meta.ram_bytes,
            "{}: memory.img length",
            layer.dir.display()
        );
    }
}

fn check_list(root: &Path) -> Option<Vec<snapshot::SnapshotInfo>> {
    let all = match snapshot::list(root) {
        Ok(all) => all,
        Err(e) => {
            check_error(&e);
            return None;
        }
    };
    let parents: HashMap<&str, Option<&str>> = all
        .iter()
        .map(|i| (i.meta.id.as_str(), i.meta.parent.as_deref()))
        .collect();
    for info in &all {
        assert_eq!(info.dir, root.join(&info.meta.id));
        if info.incremental {
            let parent = info
                .meta
                .parent
                .as_deref()
                .expect("an incremental one has a parent");
            assert!(
                parents.contains_key(parent),
                "missing parent {parent:?} listed"
            );
        }
        let mut id = info.meta.id.as_str();
        let mut steps = 0;
        while let Some(Some(parent)) = parents.get(id) {
            steps += 1;
            assert!(
                steps <= all.len(),
                "a cycle of parents through {id:?} listed"
            );
            id = parent;
        }
    }
    Some(all)
}

fn check_specs(root: &Path, all: Option<&[snapshot::SnapshotInfo]>, first_id: Option<&str>) {
    let r = root.display();
    let mut specs = vec![
        format!("{r}@latest"),
        format!("{r}@2s"),
        format!("{r}@exit:3"),
    ];
    if let Some(id) = first_id {
        // A directory name that is no snapshot id (the fuzzer's names are
        // any bytes) may be refused by the parser (after an '@'), naming
        // the text; every other text here parses.
        for spec in [format!("{r}@{id}"), format!("{r}/{id}")] {
            match spec.parse::<run::moment::Moment>() {
                Ok(_) => specs.push(spec),
                Err(e) => {
                    assert!(snapshot::validate_id(id).is_err(), "{spec}: {e}");
                    assert!(e.to_string().contains(&format!("{spec:?}")), "{e}");
                    check_error(&e);
                }
            }
        }
    }
    for spec in specs {
        let moment = spec
            .parse::<run::moment::Moment>()
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        match moment.resolve() {
            Ok(res) => {
                assert!(
                    res.snapshot.dir.starts_with(root),
                    "{spec}: {:?}",
                    res.snapshot.dir
                );
                let meta = &res.snapshot.meta;
                match res.target {
                    Target::VirtualTime(ns) => assert!(meta.virtual_ns <= ns, "{spec}"),
                    Target::ExitIndex(n) => assert!(meta.exit_index <= n, "{spec}"),
                    Target::Latest => {
                        let all = all.expect("@latest resolved, so the root lists");
                        assert_eq!(Some(meta), all.last().map(|i| &i.meta), "{spec}");
                    }
                    Target::Snapshot => {}
                }
            }
            Err(e) => {
                check_error(&e);
            }
        }
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let scratch = Scratch::new("file_snapshot_dir-seeds");
    let root = scratch.reset();
    let ram = 4 * PAGE_SIZE as usize;
    let mut mem = vec![0u8; ram];
    mem[0] = 1;
    mem[2 * 4096 + 7] = 2;
    let state = serde_json::json!({"cpu": {"rip": 4096}, "devices": [1, 2]});
    let base = SnapshotMeta::new("base", devices::VirtNanos(1_000_000_000), 10, ram as u64, 7);
    snapshot::write_snapshot(&root, &base, &state, &mem).expect("base");
    let mut out = vec![encode_tree(&root, 0), encode_tree(&root, 1)];
    mem[2 * 4096 + 7] = 0;
    mem[3 * 4096] = 3;
    let mut child = SnapshotMeta::new(
        "child",
        devices::VirtNanos(2_000_000_000),
        20,
        ram as u64,
        7,
    );
    child.parent = Some("base".into());
    snapshot::write_incremental_snapshot(&root, &child, &state, &mem, &[2, 3]).expect("child");
    mem[4096] = 9; // page 1
    let mut grandchild =
        SnapshotMeta::new("t3s", devices::VirtNanos(3_000_000_000), 30, ram as u64, 7);
    grandchild.parent = Some("child".into());
    snapshot::write_incremental_snapshot(&root, &grandchild, &(), &mem, &[1]).expect("t3s");
    out.push(encode_tree(&root, 0));
    out.push(encode_tree(&root, 1));
    let _ = std::fs::remove_dir_all(&scratch.base);
    out
}

/// Reads every snapshot of `root` through every entry point.
fn read_all(root: &Path) {
    let all = check_list(root);
    let mut names: Vec<_> = std::fs::read_dir(root)
        .expect("root")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    names.sort();
    names.truncate(MAX_DIRS);
    for name in &names {
        let dir = root.join(name);
        match snapshot::info(&dir) {
            Ok(info) => assert_eq!(info.dir, dir),
            Err(e) => {
                check_error(&e);
            }
        }
        let first = load(&dir);
        let second = load(&dir);
        assert_eq!(first, second, "{}: two loads differ", dir.display());
        check_chain(&dir);
        if let Err(e) = snapshot::verify_memory(&dir) {
            check_error(&e);
        }
    }
    let first_id = names.first().and_then(|n| n.to_str());
    check_specs(root, all.as_deref(), first_id);
}

fuzz_target!(
    init: {
        files::maybe_write_seeds(seeds);
    },
    |data: &[u8]| {
    let s = scratch();
    let (root, flags) = s.decode(data);
    if flags & 1 != 0 {
        reframe_all(&root);
    }
    s.check_read_only(&root, "reading the snapshots", || read_all(&root));
});
