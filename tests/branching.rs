//! Alternate histories that really differ: a branch re-keys every seeded
//! stream (the switch's latencies, the hwrng, and through the agent the
//! guest kernel's CRNG), and a branch can add faults at its moment.

mod common;

use common::cluster::{self, Cluster};
use common::*;

/// Two idle nodes; the workload, in n2, waits, then reads the kernel's CRNG.
fn urandom_manifest() -> String {
    cluster::manifest(
        "1ms",
        &[IDLE.to_string(), IDLE.to_string()],
        (
            "n2",
            "sleep 4; echo random $(head -c8 /dev/urandom | od -An -tx1 | tr -d ' '); exit 0",
        ),
    )
}

/// A node command that does nothing, forever.
const IDLE: &str = "while true; do sleep 1; done";

/// The line the workload printed with its random bytes.
fn random_line(out: &std::process::Output) -> String {
    stdout(out)
        .lines()
        .find_map(|line| line.split_once("random ").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| panic!("no random line in {}", stdout(out)))
}

#[test]
fn test_urandom_right_after_a_branch_differs_per_seed_and_repeats_per_seed() {
    let cluster = Cluster::new("urandom", &urandom_manifest());
    let snaps = cluster.dir.join("snaps").display().to_string();
    let straight = cluster.up(&[
        "--seed",
        "5",
        "--snapshots",
        &snaps,
        "--snapshot-every",
        "1s",
    ]);
    assert_eq!(straight.status.code(), Some(0), "{}", stderr(&straight));
    let parent = random_line(&straight);
    // The branch point is inside the workload's sleep: the bytes it reads
    // come after the branch, from a CRNG seeded before it.
    let started = event_time(&stderr(&straight), "] workload started");
    assert!(started.0 < 3_000_000_000, "workload started at {started}");
    let spec = format!("{snaps}@3s");
    let branch = |seed: &str| {
        let out = detvisor(&["branch", &spec, "--seed", seed]);
        assert_eq!(out.status.code(), Some(0), "seed {seed}: {}", stderr(&out));
        random_line(&out)
    };
    let (one, one_again, two) = (branch("1"), branch("1"), branch("2"));
    assert_eq!(one, one_again, "one seed, one history");
    assert_ne!(one, two, "other seed, other bytes");
    assert_ne!(one, parent, "a re-keyed branch is not the parent's history");
    // Without a seed the branch is the parent's own history.
    let same = detvisor(&["branch", &spec]);
    assert_eq!(random_line(&same), parent);
}

/// The virtual time of the first event line of `up` containing `what`.
fn event_time(events: &str, what: &str) -> vmm::VirtNanos {
    let line = events
        .lines()
        .find(|line| line.contains(what))
        .unwrap_or_else(|| panic!("no {what:?} in {events}"));
    let time = line
        .split('[')
        .nth(1)
        .and_then(|t| t.split(']').next())
        .unwrap();
    time.parse().unwrap_or_else(|_| panic!("time of {line}"))
}

/// A ping every 200 ms over a link whose latency the switch draws from 1..40 ms.
const PINGS: &str = "ip link set lo up; ip addr add 192.0.2.1/24 dev eth0; ip link set eth0 up; \
    unshare -n sleep 100000 & P=$!; sleep 0.1; ip link set eth1 netns $P; \
    nsenter -t $P -n sh -c 'ip link set lo up; ip addr add 192.0.2.2/24 dev eth1; ip link set eth1 up'; \
    ping -c 20 -i 0.2 192.0.2.2";

/// The round-trip times ping printed after `from_seq`.
fn rtts(out: &std::process::Output, from_seq: u32) -> Vec<String> {
    stdout(out)
        .lines()
        .filter(|l| {
            l.split("seq=")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.parse::<u32>().ok())
                .is_some_and(|seq| seq >= from_seq)
        })
        .filter_map(|l| l.split("time=").nth(1).map(str::to_string))
        .collect()
}

#[test]
fn test_branch_ping_round_trips_differ_between_seeds() {
    let dir = std::env::temp_dir().join(format!("detvisor-branch-rtt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let snaps = dir.join("snaps").display().to_string();
    let run = detvisor(&[
        "run",
        "--nics",
        "2",
        "--net-latency",
        "1ms..40ms",
        "--snapshots",
        &snaps,
        "--snapshot-every",
        "1s",
        "--",
        "sh",
        "-c",
        PINGS,
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let spec = format!("{snaps}@2s");
    let branch = |seed: &str| {
        let out = detvisor(&["branch", &spec, "--seed", seed]);
        assert_eq!(out.status.code(), Some(0), "seed {seed}: {}", stderr(&out));
        // Pings sent after the branch point (the first ones were before it).
        rtts(&out, 12)
    };
    let (one, one_again, two) = (branch("1"), branch("1"), branch("2"));
    assert!(one.len() >= 6, "{one:?}");
    assert_eq!(one, one_again);
    assert_ne!(one, two, "the switch's latencies are re-keyed at a branch");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two idle nodes; the workload, in n2, pings n1 for a while.
fn faults_manifest() -> String {
    cluster::manifest(
        "1ms",
        &[IDLE.to_string(), IDLE.to_string()],
        ("n2", "ping -c 12 -i 0.5 192.0.2.1; exit 0"),
    )
}

#[test]
fn test_branch_adds_faults_relative_to_its_moment_and_keeps_them_in_its_snapshots() {
    let cluster = Cluster::new("branch-fault", &faults_manifest());
    let snaps = cluster.dir.join("snaps").display().to_string();
    let out = cluster.up(&[
        "--seed",
        "1",
        "--snapshots",
        &snaps,
        "--snapshot-every",
        "1s",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let straight_lost = stdout(&out).contains("100% packet loss");
    assert!(!straight_lost, "{}", stdout(&out));

    // n2 cut off from 1 s after the branch point for 2 s: pings in that
    // window are lost, the rest answered.
    let spec = format!("{snaps}@3s");
    let branch_snaps = cluster.dir.join("branch-snaps").display().to_string();
    let out = detvisor(&[
        "branch",
        &spec,
        "--fault",
        "at=+1s partition n1 | n2 for=2s",
        "--snapshots",
        &branch_snaps,
        "--snapshot-every",
        "1s",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The partition 1 s after the branch point (the first exit at or after
    // 3 s), the heal 2 s later, at their exact times.
    let events = stderr(&out);
    let partition = event_time(&events, "] fault: partition n1 | n2");
    let heal = event_time(&events, "] fault: heal");
    assert!(
        (4_000_000_000..4_010_000_000).contains(&partition.0),
        "{events}"
    );
    assert_eq!(heal.0 - partition.0, 2_000_000_000, "{events}");
    let text = stdout(&out);
    let received: u32 = text
        .lines()
        .find_map(|l| {
            l.split(" packets received")
                .next()?
                .rsplit(", ")
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no ping summary in {text}"));
    assert!((5..12).contains(&received), "received {received}: {text}");

    // The branch's own snapshot after the fault holds it: a branch of it
    // replays the same heal without being told.
    let again = detvisor(&["branch", &format!("{branch_snaps}@5s")]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(event_time(&stderr(&again), "] fault: heal"), heal);

    // Bad faults at a branch name the problem.
    let before = detvisor(&["branch", &spec, "--fault", "at=1s heal"]);
    assert_eq!(before.status.code(), Some(2), "{}", stderr(&before));
    assert!(stderr(&before).contains("before"), "{}", stderr(&before));
    let unknown = detvisor(&["branch", &spec, "--fault", "at=+1s pause n7"]);
    assert_eq!(unknown.status.code(), Some(2), "{}", stderr(&unknown));
    assert!(
        stderr(&unknown).contains("no node is named \"n7\""),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn test_a_fault_at_a_branch_of_a_plain_run_is_a_named_error() {
    let dir = std::env::temp_dir().join(format!("detvisor-branch-plain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let snaps = dir.join("snaps").display().to_string();
    let run = detvisor(&[
        "run",
        "--snapshots",
        &snaps,
        "--snapshot-every",
        "1s",
        "--",
        "sleep",
        "3",
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let out = detvisor(&[
        "branch",
        &format!("{snaps}@2s"),
        "--fault",
        "at=+1s pause n1",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("this is a plain `run` (no nodes, no agent)"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
