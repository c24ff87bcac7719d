//! End-to-end tests of the snapshot format on a real file system.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use snapshot::*;

const PAGE: usize = PAGE_SIZE as usize;
const MIB: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestState {
    regs: Vec<u64>,
    clock_ns: u64,
    console: String,
}

/// What a newer VMM might write: one more field.
#[derive(Serialize)]
struct TestStateV2 {
    regs: Vec<u64>,
    clock_ns: u64,
    console: String,
    new_device: u32,
}

fn state() -> TestState {
    TestState {
        regs: vec![1, 2, u64::MAX],
        clock_ns: 12_500_000_000,
        console: "login: \u{1F980}".into(),
    }
}

fn meta(id: &str, virtual_ns: u64, exit_index: u64, ram: usize) -> SnapshotMeta {
    SnapshotMeta::new(
        id,
        devices::VirtNanos(virtual_ns),
        exit_index,
        ram as u64,
        0xdead_beef,
    )
}

/// 64 MiB of zeros with a few non-zero pages.
fn ram_64m() -> Vec<u8> {
    let mut m = vec![0u8; 64 * MIB];
    for (page, byte) in [
        (0usize, 0x11u8),
        (1, 0x22),
        (777, 0x33),
        (64 * MIB / PAGE - 1, 0x44),
    ] {
        m[page * PAGE..(page + 1) * PAGE].fill(byte);
    }
    m[5000 * PAGE + 123] = 0x55;
    m
}

fn small_ram() -> Vec<u8> {
    let mut m = vec![0u8; MIB];
    m[3 * PAGE..4 * PAGE].fill(7);
    m
}

/// Writes a small valid snapshot `s` and returns its directory.
fn small_snapshot(root: &Path) -> PathBuf {
    write_snapshot(root, &meta("s", 1, 1, MIB), &state(), &small_ram()).unwrap();
    root.join("s")
}

fn read(dir: &Path) -> Result<(SnapshotMeta, TestState)> {
    read_snapshot(dir)
}

/// Replaces the payload of `state.bin` and fixes the header's length and checksum.
fn rewrite_payload(path: &Path, payload: &[u8]) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes.truncate(32);
    bytes[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes[24..32].copy_from_slice(&checksum(payload).to_le_bytes());
    bytes.extend_from_slice(payload);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn round_trip_64mib_sparse_and_private_mapping() {
    let root = tempfile::tempdir().unwrap();
    let mem = ram_64m();
    let m = meta("boot", 12_500_000_000, 123_456, mem.len());
    let info = write_snapshot(root.path(), &m, &state(), &mem).unwrap();
    let dir = root.path().join("boot");
    assert_eq!(info.dir, dir);
    assert!(!info.incremental);
    assert_eq!(info.memory_pages_stored, 5);
    assert!(
        info.disk_bytes < MIB as u64,
        "disk usage {}",
        info.disk_bytes
    );

    let (m2, s2) = read(&dir).unwrap();
    assert_eq!(m2, m);
    assert_eq!(m2.format_version, FORMAT_VERSION);
    assert_eq!(s2, state());

    // Real holes: allocated blocks far below 64 MiB, and SEEK_DATA finds only the data.
    let img = dir.join(MEMORY_FILE);
    let md = std::fs::metadata(&img).unwrap();
    assert_eq!(md.len(), 64 * MIB as u64);
    assert!(
        md.blocks() * 512 <= 64 * 1024,
        "memory.img allocates {} bytes",
        md.blocks() * 512
    );
    let (file, len) = memory_file(&dir).unwrap();
    assert_eq!(len, mem.len() as u64);
    let ranges = data_ranges(&file);
    let data: u64 = ranges.iter().map(|(s, e)| e - s).sum();
    assert!(data < MIB as u64, "data ranges {ranges:?}");
    assert_eq!(
        memory_data_ranges(&dir).unwrap().first(),
        Some(&(0, 2 * PAGE_SIZE))
    );
    for (page, _) in [
        (0u64, ()),
        (777, ()),
        (5000, ()),
        (64 * MIB as u64 / PAGE_SIZE - 1, ()),
    ] {
        let off = page * PAGE_SIZE;
        assert!(
            ranges.iter().any(|&(s, e)| s <= off && off < e),
            "page {page} not in {ranges:?}"
        );
    }

    // The private mapping shows the same bytes, and writes to it stay private.
    let mut mapped = map_memory_private(&dir).unwrap();
    assert_eq!(mapped.len(), mem.len());
    assert!(mapped.as_slice() == mem.as_slice());
    mapped.as_mut_slice()[777 * PAGE] = 0xff;
    mapped.as_mut_slice()[10 * PAGE] = 0xee;
    assert_eq!(mapped.as_slice()[777 * PAGE], 0xff);
    let mut buf = [0u8; 1];
    file.read_exact_at(&mut buf, 777 * PAGE_SIZE).unwrap();
    assert_eq!(buf[0], 0x33);
    file.read_exact_at(&mut buf, 10 * PAGE_SIZE).unwrap();
    assert_eq!(buf[0], 0);
    drop(mapped);
    assert!(map_memory_private(&dir).unwrap().as_slice() == mem.as_slice());
    verify_memory(&dir).unwrap();
}

#[test]
fn corrupted_payload_is_a_checksum_mismatch() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    let path = dir.join(STATE_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[40] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    let err = read(&dir).unwrap_err();
    assert!(
        matches!(err, SnapshotError::ChecksumMismatch { ref path, .. } if path.ends_with("s/state.bin")),
        "{err}"
    );
    assert!(err.to_string().contains("state.bin"), "{err}");
}

#[test]
fn truncated_state_is_reported_with_lengths() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    let path = dir.join(STATE_FILE);
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 10).unwrap();
    match read(&dir).unwrap_err() {
        SnapshotError::Truncated {
            expected, actual, ..
        } => {
            assert_eq!((expected, actual), (len, len - 10));
        }
        e => panic!("expected Truncated, got {e}"),
    }
    f.set_len(20).unwrap();
    assert!(matches!(
        read(&dir).unwrap_err(),
        SnapshotError::Truncated {
            expected: 32,
            actual: 20,
            ..
        }
    ));
    f.set_len(3).unwrap();
    assert!(matches!(
        read(&dir).unwrap_err(),
        SnapshotError::Truncated { .. }
    ));
}

#[test]
fn trailing_bytes_are_rejected() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    let path = dir.join(STATE_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(b"junk");
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(
        read(&dir).unwrap_err(),
        SnapshotError::TrailingData { .. }
    ));
}

#[test]
fn foreign_file_is_bad_magic() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    std::fs::write(dir.join(STATE_FILE), "hello world, I am a text file\n").unwrap();
    let err = read(&dir).unwrap_err();
    assert!(
        matches!(err, SnapshotError::BadMagic { ref found, .. } if found == "hello wo"),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("not a detvisor snapshot")
            && msg.contains("hello wo")
            && msg.contains("state.bin"),
        "{msg}"
    );
}

#[test]
fn wrong_version_is_unsupported() {
    // Older formats (version 1 held the machine's state alone, version 2 an
    // `up` run's own copy of its network faults) and a newer one are all
    // refused, naming both versions.
    for version in [1, OLDEST_READ_VERSION - 1, FORMAT_VERSION + 1] {
        let root = tempfile::tempdir().unwrap();
        let dir = small_snapshot(root.path());
        let path = dir.join(STATE_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8..12].copy_from_slice(&version.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let err = read(&dir).unwrap_err();
        assert!(
            matches!(
                err,
                SnapshotError::UnsupportedVersion { found, supported, .. }
                    if found == version && supported == FORMAT_VERSION
            ),
            "{err}"
        );
        // The message names both versions.
        let text = err.to_string();
        assert!(
            text.contains(&format!("unsupported snapshot format version {version}"))
                && text.contains(&format!(
                    "this build reads versions {OLDEST_READ_VERSION} to {FORMAT_VERSION}"
                )),
            "{text}"
        );
    }
}

/// A version 5 snapshot (before the metadata named its clock) still reads,
/// as the exit clock's; a history of another clock keeps its name.
#[test]
fn version_5_reads_as_the_exit_clock_and_a_clock_round_trips() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    let path = dir.join(STATE_FILE);
    let bytes = std::fs::read(&path).unwrap();
    let text = String::from_utf8(bytes[32..].to_vec()).unwrap();
    assert!(!text.contains("\"clock\":"), "{text}");
    let old = text.replace(
        &format!("\"format_version\":{FORMAT_VERSION}"),
        "\"format_version\":5",
    );
    assert_ne!(old, text);
    rewrite_payload(&path, old.as_bytes());
    let mut header = std::fs::read(&path).unwrap();
    header[8..12].copy_from_slice(&5u32.to_le_bytes());
    std::fs::write(&path, header).unwrap();
    let (meta, _) = read(&dir).unwrap();
    assert_eq!(
        (meta.format_version, meta.clock),
        (5, devices::ClockKind::Exit)
    );

    let mut stepped = meta_of_clock("t", devices::ClockKind::Step);
    write_snapshot(root.path(), &stepped, &state(), &small_ram()).unwrap();
    let (back, _) = read(&root.path().join("t")).unwrap();
    stepped.format_version = FORMAT_VERSION;
    assert_eq!(back, stepped);
}

fn meta_of_clock(id: &str, clock: devices::ClockKind) -> SnapshotMeta {
    SnapshotMeta {
        clock,
        ..meta(id, 1, 1, MIB)
    }
}

#[test]
fn unknown_flags_are_unsupported() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    let path = dir.join(STATE_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[12..16].copy_from_slice(&0x80u32.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
    assert!(matches!(
        read(&dir).unwrap_err(),
        SnapshotError::UnsupportedFlags { found: 0x80, .. }
    ));
}

#[test]
fn missing_or_wrong_size_memory() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    let img = dir.join(MEMORY_FILE);
    let f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    f.set_len(MIB as u64 - 4096).unwrap();
    let err = read(&dir).unwrap_err();
    assert!(
        matches!(err, SnapshotError::MemoryLength { expected, actual, .. } if expected == MIB as u64 && actual == MIB as u64 - 4096),
        "{err}"
    );
    assert!(matches!(
        map_memory_private(&dir).unwrap_err(),
        SnapshotError::MemoryLength { .. }
    ));
    std::fs::remove_file(&img).unwrap();
    let err = read(&dir).unwrap_err();
    assert!(
        matches!(err, SnapshotError::MissingPart { ref path, .. } if path.ends_with("memory.img")),
        "{err}"
    );
    assert!(matches!(
        memory_file(&dir).unwrap_err(),
        SnapshotError::MissingPart { .. }
    ));
    assert!(matches!(
        info(&dir).unwrap_err(),
        SnapshotError::MissingPart { .. }
    ));
    std::fs::remove_file(dir.join(INDEX_FILE)).unwrap();
    assert!(
        matches!(read(&dir).unwrap_err(), SnapshotError::MissingPart { ref path, .. } if path.ends_with("memory.idx"))
    );
    assert!(matches!(
        read(&root.path().join("nope")).unwrap_err(),
        SnapshotError::MissingPart { .. }
    ));
}

#[test]
fn unknown_field_in_state_is_a_schema_mismatch() {
    let root = tempfile::tempdir().unwrap();
    let s = TestStateV2 {
        regs: vec![1],
        clock_ns: 2,
        console: String::new(),
        new_device: 3,
    };
    write_snapshot(root.path(), &meta("v2", 1, 1, MIB), &s, &small_ram()).unwrap();
    let err = read(&root.path().join("v2")).unwrap_err();
    assert!(matches!(err, SnapshotError::SchemaMismatch { .. }), "{err}");
    // The cause is the source, printed once by whoever prints the chain.
    let cause = std::error::Error::source(&err)
        .expect("the JSON error")
        .to_string();
    assert!(cause.contains("unknown field `new_device`"), "{cause}");
    assert!(!err.to_string().contains("unknown field"), "{err}");
}

#[test]
fn bad_json_is_corrupt_json_and_extra_envelope_field_is_schema_mismatch() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    let path = dir.join(STATE_FILE);
    let good = std::fs::read(&path).unwrap()[32..].to_vec();
    rewrite_payload(&path, &good[..good.len() - 1]);
    let err = read(&dir).unwrap_err();
    assert!(matches!(err, SnapshotError::CorruptJson { .. }), "{err}");

    let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    v["extra"] = serde_json::json!(1);
    rewrite_payload(&path, &serde_json::to_vec(&v).unwrap());
    assert!(matches!(
        read(&dir).unwrap_err(),
        SnapshotError::SchemaMismatch { .. }
    ));

    let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
    v["meta"]["wall_clock"] = serde_json::json!(1);
    rewrite_payload(&path, &serde_json::to_vec(&v).unwrap());
    assert!(matches!(
        read(&dir).unwrap_err(),
        SnapshotError::SchemaMismatch { .. }
    ));
}

#[test]
fn corrupt_memory_page_is_caught_by_verify() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    verify_memory(&dir).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(MEMORY_FILE))
        .unwrap();
    f.write_all_at(&[8], 3 * PAGE_SIZE + 9).unwrap();
    assert!(matches!(
        verify_memory(&dir).unwrap_err(),
        SnapshotError::MemoryChecksum { .. }
    ));
    // Data outside the indexed pages (here: a hole filled in) is caught too.
    let dir2 = root.path().join("t");
    write_snapshot(root.path(), &meta("t", 2, 2, MIB), &state(), &small_ram()).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir2.join(MEMORY_FILE))
        .unwrap();
    f.write_all_at(&[1], 100 * PAGE_SIZE).unwrap();
    assert!(matches!(
        verify_memory(&dir2).unwrap_err(),
        SnapshotError::Inconsistent { .. }
    ));
}

#[test]
fn crash_leftovers_are_ignored_and_cleaned() {
    let root = tempfile::tempdir().unwrap();
    // A crash mid-write of "a" by some earlier process, and one of ours.
    let stale = root.path().join(".tmp-a-99999");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join(STATE_FILE), b"DVSNAP\0\0half").unwrap();
    let ours = root.path().join(format!(".tmp-a-{}", std::process::id()));
    std::fs::create_dir_all(&ours).unwrap();
    std::fs::write(ours.join(MEMORY_FILE), b"partial").unwrap();
    let other = root.path().join(".tmp-b-1");
    std::fs::create_dir_all(&other).unwrap();
    assert!(list(root.path()).unwrap().is_empty());
    assert!(matches!(
        select(root.path(), Target::Latest),
        Err(SnapshotError::NotFound { .. })
    ));

    write_snapshot(root.path(), &meta("a", 1, 1, MIB), &state(), &small_ram()).unwrap();
    assert!(!stale.exists() && !ours.exists());
    assert!(
        other.exists(),
        "another id's work directory is not ours to remove"
    );
    let all = list(root.path()).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(read(&all[0].dir).unwrap().1, state());

    // Immutable: the same id again fails and leaves no work directory behind.
    let err =
        write_snapshot(root.path(), &meta("a", 2, 2, MIB), &state(), &small_ram()).unwrap_err();
    assert!(matches!(err, SnapshotError::AlreadyExists { .. }), "{err}");
    let names: Vec<String> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!names.iter().any(|n| n.starts_with(".tmp-a-")), "{names:?}");
}

#[test]
fn bad_arguments_are_rejected_before_writing() {
    let root = tempfile::tempdir().unwrap();
    let mem = small_ram();
    let e = write_snapshot(root.path(), &meta("../x", 1, 1, MIB), &state(), &mem).unwrap_err();
    assert!(matches!(e, SnapshotError::InvalidId { .. }));
    let e = write_snapshot(root.path(), &meta("x", 1, 1, 2 * MIB), &state(), &mem).unwrap_err();
    assert!(matches!(e, SnapshotError::InvalidArgument(_)));
    let e = write_incremental_snapshot(root.path(), &meta("x", 1, 1, MIB), &state(), &mem, &[1])
        .unwrap_err();
    assert!(
        matches!(e, SnapshotError::InvalidArgument(_)),
        "no parent: {e}"
    );
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

/// Three snapshots of one timeline: 1 s / exit 100, 5 s / exit 500, 10 s / exit 900.
fn timeline(root: &Path) {
    for (id, t, exit) in [("s1", 1u64, 100u64), ("s2", 5, 500), ("s3", 10, 900)] {
        let mut mem = small_ram();
        mem[0] = exit as u8;
        write_snapshot(
            root,
            &meta(id, t * 1_000_000_000, exit, MIB),
            &state(),
            &mem,
        )
        .unwrap();
    }
}

#[test]
fn list_is_sorted_by_time_exit_id() {
    let root = tempfile::tempdir().unwrap();
    write_snapshot(root.path(), &meta("z", 5, 1, MIB), &state(), &small_ram()).unwrap();
    write_snapshot(root.path(), &meta("b", 5, 0, MIB), &state(), &small_ram()).unwrap();
    write_snapshot(root.path(), &meta("a", 5, 1, MIB), &state(), &small_ram()).unwrap();
    write_snapshot(root.path(), &meta("y", 1, 9, MIB), &state(), &small_ram()).unwrap();
    std::fs::write(root.path().join("notes.txt"), "not a snapshot").unwrap();
    let ids: Vec<String> = list(root.path())
        .unwrap()
        .into_iter()
        .map(|i| i.meta.id)
        .collect();
    assert_eq!(ids, ["y", "b", "a", "z"]);
}

#[test]
fn resolve_time_exit_and_id() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("snaps");
    timeline(&root);
    let id_of = |res: Result<Resolved, SnapshotError>| res.unwrap().snapshot.meta.id;
    let at = |target: Target| {
        let res = select(&root, target).unwrap_or_else(|e| panic!("{target}: {e}"));
        assert_eq!(res.target, target);
        res.snapshot.meta.id
    };
    let s = 1_000_000_000u64;
    for (target, id) in [
        (
            Target::VirtualTime(devices::VirtNanos(12 * s + s / 2)),
            "s3",
        ),
        (Target::VirtualTime(devices::VirtNanos(5 * s)), "s2"),
        (Target::VirtualTime(devices::VirtNanos(4_999_000_000)), "s1"),
        (Target::VirtualTime(devices::VirtNanos(7 * s + s / 2)), "s2"),
        (Target::VirtualTime(devices::VirtNanos(s)), "s1"),
        (Target::VirtualTime(devices::VirtNanos(600 * s)), "s3"),
        (Target::VirtualTime(devices::VirtNanos(4 * s + s / 2)), "s1"),
        (Target::VirtualTime(devices::VirtNanos(120 * s)), "s3"),
        (Target::ExitIndex(123_456), "s3"),
        (Target::ExitIndex(499), "s1"),
        (Target::ExitIndex(500), "s2"),
        (Target::Latest, "s3"),
    ] {
        assert_eq!(at(target), id, "{target}");
    }
    for dir in [root.join("s2"), root.join("s2/")] {
        let res = resolve_dir(&dir).unwrap();
        assert_eq!(
            (res.snapshot.meta.id, res.target),
            ("s2".into(), Target::Snapshot)
        );
    }
    assert_eq!(by_id(&root, "s1").unwrap().target, Target::Snapshot);
    assert_eq!(id_of(by_id(&root, "s1")), "s1");

    // The chosen snapshot is usable as is.
    let res = select(&root, Target::VirtualTime(devices::VirtNanos(6 * s))).unwrap();
    assert_eq!(read(&res.snapshot.dir).unwrap().0.exit_index, 500);

    let err = select(&root, Target::VirtualTime(devices::VirtNanos(s / 2))).unwrap_err();
    assert!(matches!(err, SnapshotError::TooEarly { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("500ms") && msg.contains("\"s1\"") && msg.contains("1s"),
        "{msg}"
    );
    assert!(matches!(
        select(&root, Target::ExitIndex(99)).unwrap_err(),
        SnapshotError::TooEarly { .. }
    ));

    // A directory of snapshots is not one snapshot.
    let err = resolve_dir(&root).unwrap_err();
    assert!(matches!(err, SnapshotError::BadSpec { .. }), "{err}");
    assert!(matches!(
        by_id(&root, "nosuch").unwrap_err(),
        SnapshotError::NotFound { .. }
    ));
    assert!(matches!(
        resolve_dir(&root.join("nosuch")).unwrap_err(),
        SnapshotError::NotFound { .. }
    ));
}

#[test]
fn incremental_chain_round_trip() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let n = 4 * MIB;
    let mut mem = vec![0u8; n];
    for p in [0usize, 1, 2, 100, 500] {
        mem[p * PAGE..(p + 1) * PAGE].fill(p as u8 + 1);
    }
    let base_mem = mem.clone();
    write_snapshot(r, &meta("base", 1, 10, n), &state(), &mem).unwrap();

    // Child: page 1 changes, page 2 becomes zero, page 300 appears; 0/100/500 untouched.
    mem[PAGE + 5] = 0xaa;
    mem[2 * PAGE..3 * PAGE].fill(0);
    mem[300 * PAGE..301 * PAGE].fill(0x30);
    let mut m = meta("child", 2, 20, n);
    m.parent = Some("base".into());
    let ci = write_incremental_snapshot(r, &m, &state(), &mem, &[300, 2, 1, 2]).unwrap();
    assert!(ci.incremental);
    assert_eq!(ci.memory_pages_stored, 3);
    let child_mem = mem.clone();

    // Grandchild: page 300 again, page 0 zeroed, page 1000 appears (clean pages listed dirty
    // too: harmless).
    mem[300 * PAGE] = 0x31;
    mem[..PAGE].fill(0);
    mem[1000 * PAGE + 17] = 9;
    let mut m = meta("grand", 3, 30, n);
    m.parent = Some("child".into());
    write_incremental_snapshot(r, &m, &state(), &mem, &[0, 300, 1000, 999]).unwrap();

    for (id, want) in [("base", &base_mem), ("child", &child_mem), ("grand", &mem)] {
        let dir = r.join(id);
        assert_eq!(read(&dir).unwrap().0.id, id);
        let mapped = map_memory_private(&dir).unwrap();
        assert!(mapped.as_slice() == want.as_slice(), "{id}");
        verify_memory(&dir).unwrap();
        // memory_data_ranges covers every non-zero page and nothing much else.
        let ranges = memory_data_ranges(&dir).unwrap();
        for (p, page) in want.chunks(PAGE).enumerate() {
            let off = (p * PAGE) as u64;
            let listed = ranges.iter().any(|&(s, e)| s <= off && off < e);
            if page.iter().any(|&b| b != 0) {
                assert!(listed, "{id}: page {p} missing from {ranges:?}");
            }
        }
        let listed: u64 = ranges.iter().map(|(s, e)| e - s).sum();
        assert!(listed <= 16 * PAGE_SIZE, "{id}: {ranges:?}");
    }
    let ranges = memory_data_ranges(&r.join("grand")).unwrap();
    assert!(
        !ranges.iter().any(|&(s, _)| s == 0),
        "page 0 was zeroed: {ranges:?}"
    );

    let chain = memory_chain(&r.join("grand")).unwrap();
    let ids: Vec<&str> = chain.iter().map(|l| l.id.as_str()).collect();
    assert_eq!(ids, ["base", "child", "grand"]);
    assert!(matches!(
        memory_file(&r.join("grand")).unwrap_err(),
        SnapshotError::Incremental { .. }
    ));

    // The chain keeps its parents alive, and breaks loudly if one disappears.
    let err = remove_snapshot(r, "child").unwrap_err();
    assert!(
        matches!(err, SnapshotError::HasDependents { ref children, .. } if children == &["grand"]),
        "{err}"
    );
    remove_snapshot(r, "grand").unwrap();
    remove_snapshot(r, "child").unwrap();
    assert_eq!(list(r).unwrap().len(), 1);

    let mut m = meta("c2", 2, 20, n);
    m.parent = Some("base".into());
    write_incremental_snapshot(r, &m, &state(), &child_mem, &[1, 2, 300]).unwrap();
    std::fs::rename(r.join("base"), r.join("base-moved")).unwrap();
    let err = read(&r.join("c2")).unwrap_err();
    assert!(matches!(err, SnapshotError::BrokenChain { .. }), "{err}");
    assert!(matches!(
        map_memory_private(&r.join("c2")).unwrap_err(),
        SnapshotError::BrokenChain { .. }
    ));
    let err = list(r).unwrap_err();
    assert!(
        matches!(
            err,
            SnapshotError::Inconsistent { .. } | SnapshotError::BrokenChain { .. }
        ),
        "{err}"
    );
}

#[test]
fn incremental_needs_a_compatible_parent() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    let mut m = meta("orphan", 1, 1, MIB);
    m.parent = Some("nobody".into());
    let err = write_incremental_snapshot(r, &m, &state(), &small_ram(), &[0]).unwrap_err();
    assert!(matches!(err, SnapshotError::MissingPart { .. }), "{err}");
    write_snapshot(
        r,
        &meta("big", 1, 1, 2 * MIB),
        &state(),
        &vec![0u8; 2 * MIB],
    )
    .unwrap();
    m.parent = Some("big".into());
    let err = write_incremental_snapshot(r, &m, &state(), &small_ram(), &[0]).unwrap_err();
    assert!(matches!(err, SnapshotError::InvalidArgument(_)), "{err}");
    let err = write_incremental_snapshot(
        r,
        &meta("x", 1, 1, 2 * MIB),
        &state(),
        &vec![0u8; 2 * MIB],
        &[512],
    );
    assert!(err.is_err());
}

#[test]
fn lineage_parent_on_a_full_snapshot_is_not_required_to_exist() {
    let root = tempfile::tempdir().unwrap();
    let mut m = meta("restored", 1, 1, MIB);
    m.parent = Some("gone".into());
    write_snapshot(root.path(), &m, &state(), &small_ram()).unwrap();
    let (m2, _) = read(&root.path().join("restored")).unwrap();
    assert_eq!(m2.parent.as_deref(), Some("gone"));
    assert_eq!(list(root.path()).unwrap().len(), 1);
}

#[test]
fn mapped_memory_into_raw_hands_over_the_mapping() {
    let root = tempfile::tempdir().unwrap();
    let dir = small_snapshot(root.path());
    let m = map_memory_private(&dir).unwrap();
    let (ptr, len) = m.into_raw();
    assert_eq!(len, MIB);
    // SAFETY: ptr/len come from into_raw, so the mapping is live and now ours to unmap, once.
    unsafe {
        assert_eq!(*ptr.add(3 * PAGE), 7);
        assert_eq!(libc::munmap(ptr.cast(), len), 0);
    }
}

/// An error and its causes, as one line.
fn chain_text(e: &SnapshotError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[test]
fn a_parent_in_another_root_round_trips_and_is_refused_when_moved_or_changed() {
    let top = tempfile::tempdir().unwrap();
    let x = top.path().join("x");
    let (orig, branch) = (x.join("orig"), x.join("runs/branch"));
    let n = 4 * MIB;
    let mut mem = vec![0u8; n];
    for p in [0usize, 7, 300] {
        mem[p * PAGE..(p + 1) * PAGE].fill(p as u8 + 1);
    }
    write_snapshot(&orig, &meta("base", 1, 10, n), &state(), &mem).unwrap();
    mem[7 * PAGE] = 0x70;
    let mut m = meta("child", 2, 20, n);
    m.parent = Some("base".into());
    write_incremental_snapshot(&orig, &m, &state(), &mem, &[7]).unwrap();
    let child_mem = mem.clone();

    // The branch's first snapshot, over `orig/child`, in another root.
    mem[300 * PAGE..301 * PAGE].fill(0);
    mem[900 * PAGE + 1] = 9;
    let b1 = write_incremental_snapshot_over(
        &branch,
        &meta("b1", 3, 30, n),
        &state(),
        &mem,
        &[300, 900],
        &orig.join("child"),
    )
    .unwrap();
    assert!(b1.incremental);
    assert_eq!(b1.memory_pages_stored, 2);
    assert_eq!(b1.meta.parent.as_deref(), Some("child"));
    let link = b1.meta.parent_link.clone().expect("a link to another root");
    assert_eq!(link.path, "../../orig/child");
    let b1_mem = mem.clone();

    // The next one in the branch is over b1, in its own root: named by id alone.
    mem[5 * PAGE] = 5;
    let b2 = write_incremental_snapshot_over(
        &branch,
        &meta("b2", 4, 40, n),
        &state(),
        &mem,
        &[5],
        &branch.join("b1"),
    )
    .unwrap();
    assert_eq!(b2.meta.parent.as_deref(), Some("b1"));
    assert_eq!(b2.meta.parent_link, None);

    let check = |root: &Path| {
        for (id, want) in [("b1", &b1_mem), ("b2", &mem)] {
            let dir = root.join(id);
            let (back, _) = read(&dir).unwrap();
            assert_eq!(back.id, id);
            assert!(map_memory_private(&dir).unwrap().as_slice() == want.as_slice());
            verify_memory(&dir).unwrap();
        }
        let chain = memory_chain(&root.join("b2")).unwrap();
        let ids: Vec<&str> = chain.iter().map(|l| l.id.as_str()).collect();
        assert_eq!(ids, ["base", "child", "b1", "b2"]);
        let listed: Vec<String> = list(root).unwrap().into_iter().map(|i| i.meta.id).collect();
        assert_eq!(listed, ["b1", "b2"]);
    };
    check(&branch);
    assert_eq!(read(&branch.join("b1")).unwrap().0, b1.meta);

    // Both directories moved together: the relative link still holds.
    let y = top.path().join("y");
    std::fs::rename(&x, &y).unwrap();
    let branch = y.join("runs/branch");
    check(&branch);

    // The parent gone: every read names it and where it was looked for.
    std::fs::rename(y.join("orig"), y.join("orig-moved")).unwrap();
    for e in [
        read(&branch.join("b2")).unwrap_err(),
        map_memory_private(&branch.join("b1"))
            .map(drop)
            .unwrap_err(),
        list(&branch).map(drop).unwrap_err(),
    ] {
        let text = chain_text(&e);
        assert!(matches!(e, SnapshotError::BrokenChain { .. }), "{text}");
        assert!(
            text.contains("parent snapshot \"child\" not found at")
                && text.contains("orig/child")
                && text.contains("linked as \"../../orig/child\""),
            "{text}"
        );
    }

    // Another snapshot of the same id in its place: refused, never read as the parent.
    let orig = y.join("orig");
    write_snapshot(&orig, &meta("child", 2, 20, n), &state(), &child_mem).unwrap();
    let e = read(&branch.join("b1")).unwrap_err();
    let text = chain_text(&e);
    assert!(matches!(e, SnapshotError::BrokenChain { .. }), "{text}");
    assert!(
        text.contains("parent snapshot \"child\" at")
            && text.contains("is not the one this snapshot was written over"),
        "{text}"
    );
    // The old parent back: all is well again.
    std::fs::remove_dir_all(&orig).unwrap();
    std::fs::rename(y.join("orig-moved"), &orig).unwrap();
    check(&branch);
}

#[test]
fn a_parent_link_of_a_bad_form_is_refused_when_written_and_when_read() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    write_snapshot(r, &meta("base", 1, 1, MIB), &state(), &small_ram()).unwrap();
    let link = |path: &str| ParentLink {
        path: path.into(),
        state_crc: 0,
        index_crc: 0,
    };
    let mut m = meta("child", 2, 2, MIB);
    m.parent = Some("base".into());
    for (path, why) in [
        ("/tmp/base", "not a relative path"),
        ("../other", "does not end in the parent's id"),
    ] {
        m.parent_link = Some(link(path));
        let e = write_incremental_snapshot(r, &m, &state(), &small_ram(), &[3]).unwrap_err();
        assert!(
            matches!(e, SnapshotError::InvalidArgument(ref t) if t.contains(why)),
            "{e}"
        );
    }
    // A full snapshot names no linked parent.
    m.parent_link = Some(link("../x/base"));
    let e = write_snapshot(r, &m, &state(), &small_ram()).unwrap_err();
    assert!(matches!(e, SnapshotError::InvalidArgument(_)), "{e}");
    // A link whose checksums are not the parent's: refused when written.
    m.parent_link = Some(link(&format!(
        "../{}/base",
        r.file_name().unwrap().to_str().unwrap()
    )));
    let e = write_incremental_snapshot(r, &m, &state(), &small_ram(), &[3]).unwrap_err();
    assert!(
        chain_text(&e).contains("is not the one this snapshot was written over"),
        "{e}"
    );
}
