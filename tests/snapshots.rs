//! Snapshot transparency, end to end: a run that takes snapshots has the same
//! history as one that does not, and a run resumed from a snapshot in a new
//! process (directly or replayed forward to an exact exit) finishes with the
//! same digest as the straight run.

mod common;

use common::*;
use std::path::Path;
use std::process::Output;

const WORKLOAD: &str =
    "for i in 1 2 3; do head -c4 /dev/urandom | od -An -tx1; sleep 1; done; echo done";

#[test]
fn test_snapshot_restore_in_new_process_continues_identical_history() {
    let dir = std::env::temp_dir().join(format!("detvisor-snaps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let snaps = dir.to_str().unwrap();

    // A: straight from boot to the end.
    let straight = detvisor(&["run", "--json", "--seed", "5", "--", "sh", "-c", WORKLOAD]);
    assert_eq!(straight.status.code(), Some(0));
    let a = summary(&straight);
    let exits = a["exits"].as_u64().unwrap();
    let (t1, t2, mid) = (exits / 3, 2 * exits / 3, exits / 2);

    // B: the same run, snapshotting at two exits; snapshots must not perturb it.
    let (t1s, t2s) = (t1.to_string(), t2.to_string());
    let with_snaps = detvisor(&[
        "run",
        "--json",
        "--seed",
        "5",
        "--snapshots",
        snaps,
        "--snapshot-at-exit",
        &t1s,
        "--snapshot-at-exit",
        &t2s,
        "--",
        "sh",
        "-c",
        WORKLOAD,
    ]);
    assert_eq!(with_snaps.status.code(), Some(0));
    assert_eq!(summary(&with_snaps)["digest"], a["digest"]);

    let ls = detvisor(&["snapshot", "ls", snaps, "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let listed: Vec<u64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["exit_index"].as_u64().unwrap())
        .collect();
    assert_eq!(listed, vec![t1, t2]);
    // The first is full; the second holds only the pages dirtied since the
    // first (KVM's dirty log plus the VMM's own writes) over it.
    let rows = rows.as_array().unwrap();
    assert_eq!(rows[0]["incremental"], false);
    assert_eq!(rows[1]["incremental"], true);
    assert_eq!(rows[1]["parent"], rows[0]["id"]);
    let (full_pages, dirty_pages) = (
        rows[0]["memory_pages_stored"].as_u64().unwrap(),
        rows[1]["memory_pages_stored"].as_u64().unwrap(),
    );
    // (The first third of the run is early boot, which writes much of the
    // memory the kernel will use: fewer pages, not a fixed fraction.)
    assert!(
        dirty_pages > 0 && dirty_pages < full_pages,
        "incremental snapshot stores {dirty_pages} pages, the full one {full_pages}"
    );

    // C': resume the incremental snapshot (its parent's image with its own
    // pages over it) in a new process: the same history too.
    let second = format!("{snaps}/exit-{t2:012}");
    let resumed = detvisor(&["branch", &second, "--json"]);
    assert_eq!(resumed.status.code(), Some(0));
    assert_eq!(
        summary(&resumed)["digest"],
        a["digest"],
        "resumed history differs"
    );

    // C: resume the first snapshot in a new process and run to the end.
    let first = format!("{snaps}/exit-{t1:012}");
    let resumed = detvisor(&["branch", &first, "--json"]);
    assert_eq!(resumed.status.code(), Some(0));
    let c = summary(&resumed);
    assert_eq!(c["digest"], a["digest"], "resumed history differs");
    assert_eq!(c["exits"], a["exits"]);
    assert_eq!(c["virtual_ns"], a["virtual_ns"]);
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("done"));

    // D: seek to an exit between the snapshots: replay from the first one, exactly.
    let mid_spec = format!("{snaps}@exit:{mid}");
    let seek = detvisor(&["seek", &mid_spec, "--json"]);
    assert_eq!(seek.status.code(), Some(0));
    let s: serde_json::Value = serde_json::from_slice(&seek.stdout).unwrap();
    assert_eq!(s["exit_index"].as_u64(), Some(mid));
    assert_eq!(s["snapshot"], format!("exit-{t1:012}"));

    // E: branch from that exact moment: still the same history.
    let from_mid = detvisor(&["branch", &mid_spec, "--json"]);
    assert_eq!(summary(&from_mid)["digest"], a["digest"]);

    // F: a corrupted snapshot is refused with a clear error.
    let state = Path::new(&first).join("state.bin");
    let mut bytes = std::fs::read(&state).unwrap();
    let last = bytes.len() - 10;
    bytes[last] ^= 0x55;
    std::fs::write(&state, &bytes).unwrap();
    let corrupt = detvisor(&["branch", &first]);
    assert_eq!(corrupt.status.code(), Some(2));
    let err = String::from_utf8_lossy(&corrupt.stderr).to_lowercase();
    assert!(err.contains("checksum"), "{err}");

    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn test_branch_with_seed_gives_alternate_history_reproducibly() {
    let dir = std::env::temp_dir().join(format!("detvisor-alt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let snaps = dir.to_str().unwrap();
    // The workload reads the virtio-rng device after the snapshot point.
    let workload = "sleep 1; head -c256 /dev/hwrng | od -An -tx1 | tail -1";
    let original = detvisor(&["run", "--json", "--seed", "5", "--", "sh", "-c", workload]);
    let exits = summary(&original)["exits"].as_u64().unwrap();
    let at = (exits / 3).to_string();
    let taken = detvisor(&[
        "run",
        "--seed",
        "5",
        "--snapshots",
        snaps,
        "--snapshot-at-exit",
        &at,
        "--",
        "sh",
        "-c",
        workload,
    ]);
    assert_eq!(taken.status.code(), Some(0));
    let snap = format!("{snaps}/exit-{:012}", exits / 3);
    let last_line = |o: &Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .rev()
            .find(|l| !l.starts_with('{') && !l.trim().is_empty())
            .unwrap_or_default()
            .to_string()
    };
    let same = detvisor(&["branch", &snap, "--json"]);
    let alt1 = detvisor(&["branch", &snap, "--seed", "1", "--json"]);
    let alt1_again = detvisor(&["branch", &snap, "--seed", "1", "--json"]);
    let alt2 = detvisor(&["branch", &snap, "--seed", "2", "--json"]);
    assert_eq!(summary(&same)["digest"], summary(&original)["digest"]);
    assert_eq!(last_line(&same), last_line(&original));
    assert_ne!(
        last_line(&alt1),
        last_line(&original),
        "seed 1 must change the entropy"
    );
    assert_ne!(last_line(&alt1), last_line(&alt2));
    assert_eq!(summary(&alt1)["digest"], summary(&alt1_again)["digest"]);
    assert_eq!(last_line(&alt1), last_line(&alt1_again));

    // In place: one process restores the moment once and returns to it in
    // memory between seeds (seed 2 runs after a reset from seed 1's history):
    // each seed's history is the one its own process gave.
    let branches = branch_seeds_1_2_in_place(&snap);
    assert_eq!(branches[0]["digest"], summary(&alt1)["digest"]);
    assert_eq!(branches[1]["digest"], summary(&alt2)["digest"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two NICs (one moved into its own network namespace), a 300 ms switch
/// latency and a ping every 100 ms: several frames are always in flight.
const PING_IN_FLIGHT: &str = "ip link set lo up; ip addr add 192.0.2.1/24 dev eth0; ip link set eth0 up; \
    unshare -n sleep 100000 & P=$!; sleep 0.1; ip link set eth1 netns $P; \
    nsenter -t $P -n sh -c 'ip link set lo up; ip addr add 192.0.2.2/24 dev eth1; ip link set eth1 up'; \
    ping -c 20 -i 0.1 192.0.2.2 | tail -2";

#[test]
fn test_snapshots_with_frames_in_flight_resume_to_the_same_history() {
    let dir = std::env::temp_dir().join(format!("detvisor-snaps-net-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let snaps = dir.to_str().unwrap();
    let net = ["--nics", "2", "--net-latency", "300ms", "--seed", "3"];
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--json"];
        args.extend_from_slice(&net);
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", PING_IN_FLIGHT]);
        detvisor(&args)
    };
    let straight = run(&[]);
    assert_eq!(straight.status.code(), Some(0));
    assert!(stdout(&straight).contains("20 packets transmitted, 20 packets received"));
    let a = summary(&straight);
    let exits = a["exits"].as_u64().unwrap();
    // Three moments in the second half, while the pings are going.
    let points: Vec<String> = [5, 6, 7]
        .iter()
        .map(|k| (exits * k / 8).to_string())
        .collect();
    let mut extra = vec!["--snapshots", snaps];
    for p in &points {
        extra.extend_from_slice(&["--snapshot-at-exit", p]);
    }
    let with_snaps = run(&extra);
    assert_eq!(summary(&with_snaps)["digest"], a["digest"]);
    let mut in_flight_seen = 0;
    for p in &points {
        let snap = format!("{snaps}/exit-{:012}", p.parse::<u64>().unwrap());
        let info = detvisor(&["snapshot", "info", &snap]);
        let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
        if info["frames_in_flight"].as_u64().unwrap() > 0 {
            in_flight_seen += 1;
        }
        // Resumed in a new process, the frames arrive as they would have.
        let resumed = detvisor(&["branch", &snap, "--json"]);
        assert_eq!(resumed.status.code(), Some(0));
        let r = summary(&resumed);
        assert_eq!(
            r["digest"], a["digest"],
            "history resumed from {snap} differs"
        );
        assert_eq!(r["exits"], a["exits"]);
    }
    assert!(
        in_flight_seen >= 2,
        "snapshots with frames in flight: {in_flight_seen}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `detvisor shell DIR@T`: commands run inside the guest at that moment (the
/// workload's file is there, its processes are frozen), and the saved
/// history is untouched (a branch from the same moment still ends with the
/// straight run's digest).
#[test]
fn test_shell_in_a_fork_sees_that_moment_and_leaves_the_history_alone() {
    let dir = std::env::temp_dir().join(format!("detvisor-shell-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let snaps = dir.to_str().unwrap();
    let workload =
        "echo fork-marker-42 > /tmp/marker; sleep 30 & for i in 1 2 3; do sleep 1; echo tick $i; done; kill $!";
    let straight = detvisor(&[
        "run",
        "--json",
        "--seed",
        "2",
        "--snapshots",
        snaps,
        "--snapshot-every",
        "1s",
        "--",
        "sh",
        "-c",
        workload,
    ]);
    assert_eq!(straight.status.code(), Some(0));
    let moment = format!("{snaps}@1.5s");
    let out = detvisor_with_input(
        &["shell", &moment],
        b"cat /tmp/marker\necho via-fork-$((6*7))\nps -o stat,comm | grep -c '^T *sleep$'\nexit\n",
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0));
    assert!(text.contains("fork-marker-42"), "{text}");
    assert!(text.contains("via-fork-42"), "{text}");
    // The workload's sleeps are there, stopped: the background one at least
    // (with the clock page a sleeping guest makes no exit until it wakes, so
    // a moment in the middle of `sleep 1` is the exit where it ends).
    let stopped_sleeps: u32 = text
        .lines()
        .filter_map(|l| l.strip_prefix("# ")?.trim().parse().ok())
        .next()
        .unwrap_or_else(|| panic!("no count of stopped sleeps: {text}"));
    assert!(stopped_sleeps >= 1, "{text}");

    let branch = detvisor(&["branch", &moment, "--json"]);
    assert_eq!(summary(&branch)["digest"], summary(&straight)["digest"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// RAM beyond the 32-bit MMIO hole: a 4 GiB guest has 3 GiB at 0 and 1 GiB
/// at 4 GiB (in its e820 map, so in /proc/iomem), fills memory the kernel
/// takes from above 4 GiB first, and a snapshot taken with data there
/// resumes in a new process, both as a full and as an incremental one, to
/// the straight run's history; an in-place reset loop agrees too.
#[test]
fn test_ram_beyond_4_gib_is_used_and_snapshots_of_it_resume_identically() {
    let dir = std::env::temp_dir().join(format!("detvisor-snaps-4g-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let snaps = dir.to_str().unwrap();
    let workload = "grep 'System RAM' /proc/iomem; \
        head -c 48M /dev/urandom > /dev/shm/a; sleep 1; \
        head -c 16M /dev/urandom > /dev/shm/b; sleep 1; md5sum /dev/shm/a /dev/shm/b | cut -c1-32";
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--json", "--mem", "4G", "--seed", "4"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", workload]);
        detvisor(&args)
    };
    let straight = run(&[]);
    assert_eq!(straight.status.code(), Some(0), "{}", stderr(&straight));
    let text = stdout(&straight);
    assert!(text.contains("100000000-13fffffff : System RAM"), "{text}");
    let a = summary(&straight);
    let exits = a["exits"].as_u64().unwrap();
    let (t1, t2) = (exits * 6 / 10, exits * 8 / 10);
    let with_snaps = run(&[
        "--snapshots",
        snaps,
        "--snapshot-at-exit",
        &t1.to_string(),
        "--snapshot-at-exit",
        &t2.to_string(),
    ]);
    assert_eq!(summary(&with_snaps)["digest"], a["digest"]);
    for exit in [t1, t2] {
        let spec = format!("{snaps}/exit-{exit:012}");
        let resumed = detvisor(&["branch", &spec, "--json"]);
        assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
        assert_eq!(summary(&resumed)["digest"], a["digest"], "from exit {exit}");
    }
    let spec = format!("{snaps}/exit-{t1:012}");
    let alone = detvisor(&["branch", &spec, "--seed", "2", "--json"]);
    let branches = branch_seeds_1_2_in_place(&spec);
    assert_eq!(branches[1]["digest"], summary(&alone)["digest"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `snapshot ls DIR --json`, checked to succeed.
fn snapshot_rows(dir: &str) -> Vec<serde_json::Value> {
    let ls = detvisor(&["snapshot", "ls", dir, "--json"]);
    assert_eq!(ls.status.code(), Some(0), "{}", stderr(&ls));
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    rows.as_array().unwrap().clone()
}

/// A branch that keeps snapshots writes its first one incremental over
/// the snapshot it was restored from, which lives in another directory: it
/// stores only the pages written since the restore, each of the branch's
/// snapshots resumes to the branch's own history, and with the parent
/// directory gone every use names the missing parent.
#[test]
fn test_a_branchs_first_snapshot_is_incremental_over_the_snapshot_it_was_restored_from() {
    let dir = std::env::temp_dir().join(format!("detvisor-branch-incr-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let snaps = dir.join("snaps").display().to_string();
    let branch_snaps = dir.join("runs/branch").display().to_string();
    // Random reads every 250 ms: exits at every snapshot point.
    let workload =
        "for i in 1 2 3 4 5 6 7 8; do head -c4 /dev/urandom | od -An -tx1; sleep 0.25; done; echo done";
    let run = detvisor(&[
        "run",
        "--seed",
        "5",
        "--snapshots",
        &snaps,
        "--snapshot-every",
        "500ms",
        "--",
        "sh",
        "-c",
        workload,
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let originals = snapshot_rows(&snaps);
    // The branch restores the last snapshot at or before 0.8 s.
    let restored = originals
        .iter()
        .rfind(|r| r["virtual_ns"].as_u64().unwrap() <= 800_000_000)
        .expect("a snapshot at or before 0.8 s");
    let restored_id = restored["id"].as_str().unwrap();
    let full_pages = originals[0]["memory_pages_stored"].as_u64().unwrap();
    assert_eq!(originals[0]["incremental"], false);

    let moment = format!("{snaps}@800ms");
    let branch = detvisor(&[
        "branch",
        &moment,
        "--seed",
        "9",
        "--json",
        "--snapshots",
        &branch_snaps,
        "--snapshot-every",
        "300ms",
    ]);
    assert_eq!(branch.status.code(), Some(0), "{}", stderr(&branch));
    let b = summary(&branch);
    let rows = snapshot_rows(&branch_snaps);
    assert!(rows.len() >= 2, "{rows:?}");
    let first = &rows[0];
    assert_eq!(first["incremental"], true, "{first}");
    assert_eq!(first["parent"], restored_id, "{first}");
    assert_eq!(
        first["parent_path"],
        format!("../../snaps/{restored_id}"),
        "{first}"
    );
    let stored = first["memory_pages_stored"].as_u64().unwrap();
    assert!(
        stored > 0 && stored < full_pages,
        "the branch's first snapshot stores {stored} pages, a full one {full_pages}"
    );
    for row in &rows[1..] {
        assert_eq!(row["incremental"], true, "{row}");
    }
    let first_id = first["id"].as_str().unwrap();
    let first_dir = format!("{branch_snaps}/{first_id}");
    let info = detvisor(&["snapshot", "info", &first_dir]);
    assert_eq!(info.status.code(), Some(0), "{}", stderr(&info));
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["incremental"], true);
    assert_eq!(info["parent"], restored_id);

    // Each of the branch's snapshots resumes to the branch's own history.
    for row in [first, rows.last().unwrap()] {
        let id = row["id"].as_str().unwrap();
        let resumed = detvisor(&["branch", &format!("{branch_snaps}/{id}"), "--json"]);
        assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
        let r = summary(&resumed);
        assert_eq!(r["digest"], b["digest"], "resumed from {id}");
        assert_eq!(r["exits"], b["exits"], "resumed from {id}");
    }
    // A moment between the branch's first two snapshots: reached from the
    // branch's snapshots, it is the moment the branch itself went through.
    let between_ms = first["virtual_ns"].as_u64().unwrap() / 1_000_000 + 100;
    let until = format!("{between_ms}ms");
    let direct = detvisor(&[
        "branch", &moment, "--seed", "9", "--until", &until, "--json",
    ]);
    // (124: stopped at the time limit.)
    assert_eq!(direct.status.code(), Some(124), "{}", stderr(&direct));
    let at = format!("{branch_snaps}@{until}");
    let replayed = detvisor(&["branch", &at, "--until", &until, "--json"]);
    assert_eq!(replayed.status.code(), Some(124), "{}", stderr(&replayed));
    assert_eq!(summary(&direct)["stop"]["kind"], "time_limit");
    assert_eq!(summary(&replayed)["digest"], summary(&direct)["digest"]);
    assert_eq!(summary(&replayed)["exits"], summary(&direct)["exits"]);
    let seek = detvisor(&["seek", &at, "--json"]);
    assert_eq!(seek.status.code(), Some(0), "{}", stderr(&seek));
    let s: serde_json::Value = serde_json::from_slice(&seek.stdout).unwrap();
    assert_eq!(s["snapshot"], first_id);

    // The parent directory gone: the branch's snapshots name what is missing.
    std::fs::rename(&snaps, format!("{snaps}-gone")).unwrap();
    let missing = format!("parent snapshot \"{restored_id}\" not found at");
    let orphan = detvisor(&["branch", &first_dir]);
    assert_eq!(orphan.status.code(), Some(2), "{}", stderr(&orphan));
    assert!(
        stderr(&orphan).contains(&missing) && stderr(&orphan).contains("../../snaps/"),
        "{}",
        stderr(&orphan)
    );
    let ls = detvisor(&["snapshot", "ls", &branch_snaps]);
    assert_eq!(ls.status.code(), Some(2), "{}", stderr(&ls));
    assert!(stderr(&ls).contains(&missing), "{}", stderr(&ls));
    std::fs::remove_dir_all(&dir).unwrap();
}
