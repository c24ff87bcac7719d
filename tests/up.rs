//! `detvisor up`, end to end: nodes from a manifest as containers in one
//! guest, driven by the in-guest agent over the control channel, talking over
//! the simulated switch, with faults on a schedule.

mod common;

use common::cluster::Cluster;
use common::*;

/// n1 answers on TCP port 7000; n2 ticks; the workload runs inside n2.
const TWO_NODES: &str = r#"
[network]
latency = "1ms..3ms"

[[node]]
name = "n1"
rootfs = "root"
command = ["sh", "-c", "echo n1 up on $(hostname); while true; do echo pong | nc -l -p 7000; done"]

[[node]]
name = "n2"
rootfs = "root"
env = { GREETING = "hello from n2" }
command = ["sh", "-c", "echo $GREETING; while true; do sleep 1; done"]

[workload]
node = "n2"
command = ["sh", "-c", "ping -c 2 192.0.2.1 && echo hi | nc 192.0.2.1 7000 && echo workload on $(hostname); exit 3"]
"#;

#[test]
fn test_up_runs_nodes_and_the_workload_and_exits_with_its_status() {
    let cluster = Cluster::new("basic", TWO_NODES);
    let out = cluster.up(&["--seed", "1", "--until", "60s"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(3), "the workload's status");
    // Node output, prefixed with the node's name.
    assert!(text.contains("      n1 | n1 up on n1\n"), "{text}");
    assert!(text.contains("      n2 | hello from n2\n"), "{text}");
    // The workload reached n1 over the switch, from inside n2.
    assert!(
        text.contains("workload | 2 packets transmitted, 2 packets received"),
        "{text}"
    );
    assert!(text.contains("workload | pong\n"), "{text}");
    assert!(text.contains("workload | workload on n2\n"), "{text}");
    assert!(
        stderr(&out).contains("workload exited (status 3)"),
        "{}",
        stderr(&out)
    );
    // Per-node logs hold the raw output.
    assert_eq!(cluster.log("n1"), "n1 up on n1\nhi\n");
    assert!(cluster.log("workload").contains("pong\n"));
}

/// n2 pings n1 every half second and prints virtual uptime and the result.
const PINGER: &str = r#"
[[node]]
name = "n1"
rootfs = "root"
command = ["sh", "-c", "while true; do echo tick $(cut -d' ' -f1 /proc/uptime); sleep 0.5; done"]

[[node]]
name = "n2"
rootfs = "root"
command = ["sh", "-c", "while true; do sleep 1; done"]

[workload]
node = "n2"
command = ["sh", "-c", "for i in $(seq 1 16); do if ping -c 1 -W 1 192.0.2.1 >/dev/null; then r=ok; else r=lost; fi; echo $(cut -d' ' -f1 /proc/uptime) $r; sleep 0.5; done"]
"#;

/// (uptime, ok) pairs the PINGER workload printed.
fn pings(text: &str) -> Vec<(f64, bool)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("workload | "))
        .filter_map(|l| {
            let (t, r) = l.split_once(' ')?;
            Some((t.parse().ok()?, r == "ok"))
        })
        .collect()
}

#[test]
fn test_up_partition_cuts_a_node_off_until_the_heal_and_runs_are_identical() {
    let cluster = Cluster::new("partition", PINGER);
    let out = cluster.up(&[
        "--seed",
        "7",
        "--until",
        "60s",
        "--fault",
        "at=4s partition n1 | n2 for=3s",
        "--runs",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.contains("identical: 2 runs"), "{text}");
    let pings = pings(&text);
    assert_eq!(pings.len(), 16, "{text}");
    let lost: Vec<f64> = pings.iter().filter(|p| !p.1).map(|p| p.0).collect();
    assert!(
        !lost.is_empty(),
        "no ping was lost during the partition: {text}"
    );
    // A ping that ends (1 s timeout) inside [4 s, 7 s + 1 s] can be lost; none other.
    for t in &lost {
        assert!((4.0..=8.2).contains(t), "lost at {t}: {text}");
    }
    assert!(pings.iter().any(|p| p.1 && p.0 < 4.0), "{text}");
    assert!(
        pings.iter().any(|p| p.1 && p.0 > 7.0),
        "no ping after the heal: {text}"
    );
    let err = stderr(&out);
    assert!(err.contains("fault: partition n1 | n2"), "{err}");
    assert!(err.contains("fault: heal"), "{err}");
}

#[test]
fn test_up_pause_stops_a_node_for_its_duration() {
    let cluster = Cluster::new("pause", PINGER);
    let out = cluster.up(&[
        "--seed",
        "3",
        "--until",
        "60s",
        "--fault",
        "at=4s pause n1 for=2s",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(err.contains("node n1 paused"), "{err}");
    assert!(err.contains("node n1 resumed"), "{err}");
    let ticks: Vec<f64> = cluster
        .log("n1")
        .lines()
        .filter_map(|l| l.strip_prefix("tick ")?.parse().ok())
        .collect();
    // n1 ticks every 0.5 s, except for a gap of about 2 s starting at 4 s.
    let gaps: Vec<(f64, f64)> = ticks
        .windows(2)
        .map(|w| (w[0], w[1] - w[0]))
        .filter(|(_, gap)| *gap > 1.0)
        .collect();
    assert_eq!(gaps.len(), 1, "ticks: {ticks:?}");
    let (start, gap) = gaps[0];
    assert!(
        (3.4..=4.1).contains(&start),
        "paused after the tick at {start}: {ticks:?}"
    );
    assert!((1.9..=2.7).contains(&gap), "gap {gap}: {ticks:?}");
}

#[test]
fn test_up_same_seed_same_digest_other_seed_other_digest() {
    let cluster = Cluster::new("seeds", TWO_NODES);
    let digest = |seed: &str| {
        let out = cluster.up(&["--seed", seed, "--until", "60s", "--json", "--quiet"]);
        assert_eq!(out.status.code(), Some(3));
        summary(&out)["digest"].as_str().unwrap().to_string()
    };
    let (a, b, c) = (digest("11"), digest("11"), digest("12"));
    assert_eq!(a, b, "same seed, same history");
    assert_ne!(a, c, "another seed, another history");
}

/// Prints user-mode RDTSC three times around 100 ms sleeps.
const RDTSC_C: &str = r#"
#include <stdio.h>
#include <stdint.h>
#include <unistd.h>
static uint64_t rdtsc(void) {
    uint32_t lo, hi;
    __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
int main(void) {
    for (int i = 0; i < 3; i++) {
        printf("tsc %llu\n", (unsigned long long)rdtsc());
        fflush(stdout);
        usleep(100000);
    }
    return 0;
}
"#;

#[test]
fn test_user_mode_rdtsc_reads_virtual_time_identically_across_runs() {
    let cluster = Cluster::new(
        "rdtsc",
        "[[node]]\nname = \"n1\"\nrootfs = \"root\"\ncommand = [\"sleep\", \"1000\"]\n\
         [workload]\nnode = \"n1\"\ncommand = [\"/bin/rdtsc\"]\n",
    );
    let source = cluster.dir.join("rdtsc.c");
    std::fs::write(&source, RDTSC_C).unwrap();
    let status = std::process::Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(cluster.dir.join("root/bin/rdtsc"))
        .arg(&source)
        .status()
        .expect("gcc runs");
    assert!(status.success());
    let values = |out: &std::process::Output| -> Vec<u64> {
        stdout(out)
            .lines()
            .filter_map(|l| l.strip_prefix("workload | tsc ")?.parse().ok())
            .collect()
    };
    let first = cluster.up(&["--seed", "5", "--until", "30s"]);
    let second = cluster.up(&["--seed", "5", "--until", "30s"]);
    assert_eq!(first.status.code(), Some(0));
    let (a, b) = (values(&first), values(&second));
    assert_eq!(a.len(), 3, "{}", stdout(&first));
    assert_eq!(a, b, "RDTSC differs between runs with one seed");
    // A 1 GHz counter of virtual time since boot: 100 ms sleeps are ~1e8 apart.
    assert!(a[2] < 30_000_000_000, "{a:?}");
    for pair in a.windows(2) {
        let delta = pair[1] - pair[0];
        assert!((100_000_000..150_000_000).contains(&delta), "{a:?}");
    }
}

#[test]
fn test_up_bad_manifests_get_errors_naming_the_problem() {
    let cluster = Cluster::new(
        "bad",
        "[[node]]\nname = \"n1\"\nrootfs = \"root\"\ncomand = [\"true\"]\n",
    );
    let out = cluster.up(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown field `comand`"),
        "{}",
        stderr(&out)
    );

    let missing = Cluster::new(
        "missing",
        "[[node]]\nname = \"n1\"\nrootfs = \"nowhere\"\ncommand = [\"true\"]\n",
    );
    let out = missing.up(&["--host-vm", "never"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("nowhere"), "{}", stderr(&out));

    let fault = Cluster::new("fault", TWO_NODES);
    let out = fault.up(&["--fault", "at=1s pause n7"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no node is named \"n7\""),
        "{}",
        stderr(&out)
    );
}

const LONG_LINE: &str = r#"
[[node]]
name = "n1"
rootfs = "root"
command = ["sleep", "3600"]

[workload]
node = "n1"
command = ["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a; echo; echo done"]
"#;

/// A node that prints 300,000 bytes without a newline: the host prints
/// them in pieces of at most 64 KiB (`MAX_LINE` in `run/src/conversation/output.rs`), each on
/// a line of its own, holds no more than that, and the node's log keeps the
/// raw bytes; the run ends as usual.
#[test]
fn test_up_output_without_newlines_is_printed_in_bounded_pieces() {
    const PIECE: usize = 64 << 10;
    const BYTES: usize = 300_000; // as LONG_LINE's workload prints
    let cluster = Cluster::new("long-line", LONG_LINE);
    let out = cluster.up(&["--seed", "1", "--until", "60s"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let pieces: Vec<usize> = text
        .lines()
        .filter_map(|l| l.strip_prefix("workload | "))
        .filter(|l| l.starts_with('a'))
        .map(|l| {
            assert!(l.bytes().all(|b| b == b'a'), "only the printed bytes");
            l.len()
        })
        .collect();
    let full = BYTES / PIECE;
    let mut want = vec![PIECE; full];
    want.push(BYTES - full * PIECE);
    assert_eq!(pieces, want);
    assert!(text.contains("workload | done\n"), "{text}");
    assert_eq!(
        cluster.log("workload"),
        format!("{}\ndone\n", "a".repeat(BYTES))
    );
}

/// Snapshots of an `up` run: taking them leaves the run as it was; a shell
/// opens in a fork of one (beside the nodes or inside one); and a branch
/// from one, in a new process (at the snapshot, or replayed forward from it,
/// with frames in flight in the switch and the agent conversation under
/// way), ends with the straight run's status, digest and node output. Other
/// seeds from that moment, in place or one process each, agree.
#[test]
fn test_up_snapshots_branch_to_the_straight_runs_history() {
    let cluster = Cluster::new("snapshots", TWO_NODES);
    let straight = cluster.up(&["--seed", "3", "--json", "--quiet"]);
    assert_eq!(straight.status.code(), Some(3), "{}", stderr(&straight));
    let straight = summary(&straight);
    let exits = straight["exits"].as_u64().unwrap();

    // Snapshots every 25 exits through the middle of the run (incremental
    // after the first).
    let snaps = cluster.dir.join("snaps").display().to_string();
    let points: Vec<String> = (exits / 2..exits * 95 / 100)
        .step_by(25)
        .map(|e| e.to_string())
        .collect();
    let mut args = vec!["--seed", "3", "--json", "--quiet", "--snapshots", &snaps];
    for point in &points {
        args.extend(["--snapshot-at-exit", point.as_str()]);
    }
    let with = cluster.up(&args);
    assert_eq!(with.status.code(), Some(3), "{}", stderr(&with));
    assert_eq!(
        summary(&with)["digest"],
        straight["digest"],
        "taking snapshots perturbed the run"
    );

    // One with frames in flight, taken while the workload talks to n1.
    let listed = detvisor(&["snapshot", "ls", &snaps, "--json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(stdout(&listed).trim()).unwrap();
    assert_eq!(rows.len(), points.len());
    let (id, exit_index) = rows
        .iter()
        .map(|row| {
            (
                row["id"].as_str().unwrap().to_string(),
                row["exit_index"].as_u64().unwrap(),
            )
        })
        .find(|(id, _)| {
            let info = detvisor(&["snapshot", "info", &format!("{snaps}/{id}")]);
            let info: serde_json::Value = serde_json::from_str(&stdout(&info)).unwrap();
            assert_eq!(info["kind"], "up");
            assert_eq!(info["nodes"], serde_json::json!(["n1", "n2"]));
            info["frames_in_flight"].as_u64().unwrap() > 0
        })
        .expect("a snapshot with frames in flight");

    // A shell in a fork of that moment, on a pseudo-terminal the agent
    // opens: beside the nodes (they are paused), then inside n2; its exit
    // status is the command's. The branches below show the history untouched.
    let moment = format!("{snaps}/{id}");
    let out = detvisor_with_input(
        &["shell", &moment],
        b"ls /nodes; echo via-fork-$((6*7))\nexit 7\n",
    );
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("n1  n2\r\n"), "{text}");
    assert!(text.contains("via-fork-42\r\n"), "{text}");
    assert!(stderr(&out).contains("node n1 paused"), "{}", stderr(&out));
    let out = detvisor_with_input(
        &["shell", &moment, "--node", "n2"],
        b"hostname; grep State /proc/1/status\n",
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("(fork) n2:/ # "), "{text}");
    assert!(text.contains("\r\nn2\r\n"), "{text}");
    // The node's PID 1 (its command), frozen at that moment.
    assert!(text.contains("State:\tT (stopped)"), "{text}");
    // The debugger's `exec` at a moment past the last snapshot, where the
    // workload has printed: the replay to it is quiet, so stdout is the
    // command's alone.
    let late = format!("{snaps}@exit:{}", exits * 97 / 100);
    let out = detvisor(&["exec", &late, "--node", "n2", "--", "echo", "only-this"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "only-this\n", "{}", stderr(&out));
    let out = detvisor(&["shell", &moment, "--node", "n9"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("could not open a shell: no node \"n9\""),
        "{}",
        stderr(&out)
    );

    for spec in [
        format!("{snaps}/{id}"),
        format!("{snaps}@exit:{}", exit_index + 7),
    ] {
        let out = detvisor(&["branch", &spec, "--json"]);
        assert_eq!(out.status.code(), Some(3), "{spec}: {}", stderr(&out));
        let branch = summary(&out);
        assert_eq!(branch["exit_status"], 3, "{spec}");
        assert_eq!(branch["digest"], straight["digest"], "{spec}");
        assert_eq!(branch["exits"], straight["exits"], "{spec}");
        // Node output after the moment, prefixed as under `up`.
        assert!(
            stdout(&out).contains("workload | workload on n2\n"),
            "{spec}: {}",
            stdout(&out)
        );
    }

    // Alternate histories from that moment: every one still completes, and
    // resetting in place gives each seed the history its own process gives.
    let spec = format!("{snaps}/{id}");
    let alone: Vec<serde_json::Value> = ["1", "2"]
        .iter()
        .map(|seed| {
            let out = detvisor(&["branch", &spec, "--seed", seed, "--json"]);
            assert_eq!(out.status.code(), Some(3), "seed {seed}: {}", stderr(&out));
            summary(&out)
        })
        .collect();
    let branches = branch_seeds_1_2_in_place(&spec);
    for (branch, alone) in branches.iter().zip(&alone) {
        assert_eq!(branch["exit_status"], 3);
        assert_eq!(branch["digest"], alone["digest"], "seed {}", branch["seed"]);
    }
}

/// n1 keeps its data on a disk: on its first start it writes B with fsync,
/// then A without (ext4 commits its journal every 5 s: A is not flushed by
/// the crash at 3 s); started again after the crash, it lists what is left.
const CRASH: &str = r#"
faults = ["at=CRASH_AT crash n1", "at=RESTART_AT restart n1"]

[[node]]
name = "n1"
rootfs = "root"
disk = "16M"
command = ["sh", "-c", "if [ -e /data/B ]; then echo after: $(ls /data); cat /data/B; else echo b | dd of=/data/B conv=fsync 2>/dev/null; echo a > /data/A; echo written: $(ls /data); fi; while true; do sleep 1; done"]

# Keeps the run going while n1 is down (a run whose nodes all ended is over).
[[node]]
name = "n2"
rootfs = "root"
command = ["sh", "-c", "while true; do sleep 1; done"]
"#;

/// The CRASH manifest with its fault times.
fn crash_manifest(crash_at: &str, restart_at: &str) -> String {
    CRASH
        .replace("CRASH_AT", crash_at)
        .replace("RESTART_AT", restart_at)
}

#[test]
fn test_up_crash_loses_unsynced_writes_keeps_fsynced_ones_and_is_deterministic() {
    let cluster = Cluster::new("disk-crash", &crash_manifest("3s", "4s"));
    let out = cluster.up(&["--seed", "5", "--until", "8s", "--runs", "2"]);
    let (text, events) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{events}");
    assert!(text.contains("identical: 2 runs"), "{text}");
    assert!(text.contains("n1 | written: A B lost+found\n"), "{text}");
    // After the crash and the restart: B (fsynced) is there, A is not.
    assert!(text.contains("n1 | after: B lost+found\n"), "{text}");
    assert!(text.contains("n1 | b\n"), "{text}");
    for event in [
        "fault: crash n1",
        "disk n1 released (node gone, file system unmounted)",
        "disk n1 ready (mounted at the node's next start)",
        "fault: restart n1",
    ] {
        assert!(events.contains(event), "{event}: {events}");
    }
}

/// n1 fsyncs a small file and writes 16 KiB (without fsync) every 500 ms,
/// printing when each fsync started and ended and how each went.
const FSYNC_LOOP: &str = r#"
[[node]]
name = "n1"
rootfs = "root"
disk = "16M"
data = "/var/lib/n1"
command = ["sh", "-c", "cd /var/lib/n1; i=0; while true; do i=$((i+1)); t0=$(cut -d' ' -f1 /proc/uptime); if echo x | dd of=f$i conv=fsync 2>/dev/null; then r=ok; else r=failed; fi; t1=$(cut -d' ' -f1 /proc/uptime); if dd if=/dev/zero of=big$i bs=4096 count=4 2>/tmp/e; then w=ok; elif grep -q 'No space' /tmp/e; then w=nospace; else w=error; fi; echo $t0 $t1 $r $w; sleep 0.5; done"]
"#;

/// (start, end, fsync ok, write result) of each FSYNC_LOOP line.
fn fsyncs(text: &str) -> Vec<(f64, f64, bool, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("      n1 | "))
        .filter_map(|l| {
            let words: Vec<&str> = l.split(' ').collect();
            let [t0, t1, r, w] = words[..] else {
                return None;
            };
            Some((t0.parse().ok()?, t1.parse().ok()?, r == "ok", w.to_string()))
        })
        .collect()
}

#[test]
fn test_up_fsync_delay_and_full_disk() {
    let cluster = Cluster::new("disk-delay", FSYNC_LOOP);
    let out = cluster.up(&[
        "--seed",
        "3",
        "--until",
        "9s",
        "--fault",
        "at=3s disk n1 fsync-delay=500ms for=2s",
        "--fault",
        "at=6s disk n1 full for=1500ms",
    ]);
    let (text, events) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{events}");
    let lines = fsyncs(&text);
    assert!(lines.len() > 6, "{text}");
    // Every fsync away from the full disk succeeds; those begun inside the
    // delay window take at least the delay, those before it much less.
    assert!(
        lines.iter().filter(|l| l.1 < 6.0 || l.0 > 7.5).all(|l| l.2),
        "{text}"
    );
    let took = |l: &(f64, f64, bool, String)| l.1 - l.0;
    let inside: Vec<_> = lines.iter().filter(|l| l.0 >= 3.0 && l.1 <= 5.0).collect();
    let before: Vec<_> = lines.iter().filter(|l| l.1 < 3.0).collect();
    assert!(!inside.is_empty() && !before.is_empty(), "{text}");
    assert!(inside.iter().all(|l| took(l) >= 0.5), "{text}");
    assert!(before.iter().all(|l| took(l) < 0.5), "{text}");
    // The full disk refuses writes with ENOSPC while full (6 s to 7.5 s),
    // not otherwise. (/proc/uptime has 10 ms steps: lines at the edges are
    // left out.)
    let mut full = 0;
    for line in &lines {
        let expected = if line.0 > 6.0 && line.1 < 7.5 {
            full += 1;
            "nospace"
        } else if line.1 < 6.0 || line.0 > 7.5 {
            "ok"
        } else {
            continue;
        };
        assert_eq!(line.3, expected, "{line:?}: {text}");
    }
    assert!(full > 0, "{text}");
    assert!(
        events.contains("fault: disk n1 fsync-delay=500ms"),
        "{events}"
    );
    assert!(events.contains("fault: disk n1 fsync-ok"), "{events}");
    assert!(events.contains("disk n1 full ("), "{events}");
    assert!(events.contains("disk n1 freed"), "{events}");
}

#[test]
fn test_up_fsync_error_fails_fsync_in_the_guest() {
    let cluster = Cluster::new("disk-error", FSYNC_LOOP);
    let out = cluster.up(&[
        "--seed",
        "3",
        "--until",
        "6s",
        "--fault",
        "at=3s disk n1 fsync-error for=1s",
    ]);
    let (text, events) = (stdout(&out), stderr(&out));
    assert_eq!(out.status.code(), Some(0), "{events}");
    let lines = fsyncs(&text);
    assert!(lines.iter().filter(|l| l.1 < 3.0).all(|l| l.2), "{text}");
    assert!(lines.iter().any(|l| l.1 < 3.0), "{text}");
    // An fsync inside the window fails (and the journal is aborted after it,
    // as Linux does when a flush fails, so later ones fail too).
    assert!(
        lines.iter().any(|l| l.0 >= 3.0 && l.1 <= 4.0 && !l.2),
        "{text}"
    );
    assert!(events.contains("fault: disk n1 fsync-error"), "{events}");
}

#[test]
fn test_up_disk_faults_on_a_node_without_a_disk_are_refused() {
    let cluster = Cluster::new("disk-none", TWO_NODES);
    let out = cluster.up(&["--until", "2s", "--fault", "at=1s disk n2 full"]);
    assert_eq!(out.status.code(), Some(2), "bad input");
    assert!(
        stderr(&out).contains("fault disk n2 full: node n2 has no disk"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn test_up_disk_state_and_faults_survive_snapshots() {
    let cluster = Cluster::new("disk-snapshots", &crash_manifest("3s", "4s"));
    let until = ["--seed", "5", "--until", "8s"];
    let straight = cluster.up(&[&until[..], &["--json", "--quiet"]].concat());
    assert_eq!(straight.status.code(), Some(0), "{}", stderr(&straight));
    let straight = summary(&straight);
    let snaps = cluster.dir.join("snaps").display().to_string();
    let with = cluster.up(&[
        &until[..],
        &[
            "--json",
            "--quiet",
            "--snapshots",
            &snaps,
            "--snapshot-every",
            "1s",
        ],
    ]
    .concat());
    assert_eq!(with.status.code(), Some(0), "{}", stderr(&with));
    assert_eq!(summary(&with)["digest"], straight["digest"]);

    // Before the crash (the disk's crash still scheduled in its state, the
    // fsynced file durable, the other only in the guest's page cache) and
    // after the restart: each branch continues the very same history.
    for at in ["2.5s", "4.5s"] {
        let spec = format!("{snaps}@{at}");
        let out = detvisor(&["branch", &spec, "--until", "8s", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{spec}: {}", stderr(&out));
        assert_eq!(summary(&out)["digest"], straight["digest"], "{spec}");
        assert!(
            stdout(&out).contains("n1 | after: B lost+found\n"),
            "{spec}: {}",
            stdout(&out)
        );
    }
}

/// Per-node clocks (`clock`, `drift`): reads every realtime interface and
/// checks that monotonic and boot time never go back, printing one line a
/// second (`clock mono=<ns> real=<ns> tod=<s> time=<s> coarse=<s>`).
const CLOCKWATCH_C: &str = r#"
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>
#include <sys/time.h>
static long long ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(void) {
    long long last_mono = 0, last_boot = 0;
    for (;;) {
        for (int i = 0; i < 20; i++) {
            long long m = ns(CLOCK_MONOTONIC), b = ns(CLOCK_BOOTTIME);
            if (m < last_mono || b < last_boot)
                printf("BACK mono %lld after %lld, boot %lld after %lld\n", m, last_mono, b, last_boot);
            last_mono = m;
            last_boot = b;
        }
        struct timeval tv;
        long long mono = ns(CLOCK_MONOTONIC), real = ns(CLOCK_REALTIME);
        gettimeofday(&tv, NULL);
        long long t = time(NULL), coarse = ns(CLOCK_REALTIME_COARSE) / 1000000000LL;
        printf("clock mono=%lld real=%lld tod=%lld time=%lld coarse=%lld\n",
               mono, real, (long long)tv.tv_sec, t, coarse);
        fflush(stdout);
        struct timespec second = {1, 0};
        nanosleep(&second, NULL);
    }
}
"#;

/// Absolute CLOCK_REALTIME deadlines, set from the namespace's realtime:
/// how long (monotonic) each waited.
const DEADLINES_C: &str = r#"
#define _GNU_SOURCE
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <signal.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/timerfd.h>
static long long ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}
static struct timespec real_in(int seconds) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += seconds;
    return t;
}
int main(void) {
    long long start = ms();
    struct timespec deadline = real_in(2);
    clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &deadline, NULL);
    printf("nanosleep %lldms\n", ms() - start);

    int fd = timerfd_create(CLOCK_REALTIME, 0);
    struct itimerspec its = {{0, 0}, real_in(1)};
    start = ms();
    timerfd_settime(fd, TFD_TIMER_ABSTIME, &its, NULL);
    uint64_t expirations;
    if (read(fd, &expirations, sizeof expirations) != sizeof expirations)
        return 1;
    printf("timerfd %lldms\n", ms() - start);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    struct sigevent event = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGUSR1};
    timer_t timer;
    timer_create(CLOCK_REALTIME, &event, &timer);
    struct itimerspec value = {{0, 0}, real_in(1)};
    start = ms();
    timer_settime(timer, TIMER_ABSTIME, &value, NULL);
    int signal;
    sigwait(&set, &signal);
    printf("timer %lldms\n", ms() - start);

    pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
    struct timespec until = real_in(1);
    start = ms();
    pthread_mutex_lock(&mutex);
    pthread_cond_timedwait(&cond, &mutex, &until);
    printf("condvar %lldms\n", ms() - start);
    return 0;
}
"#;

/// `gcc -static` of `source` into the cluster's root as /bin/`name`.
fn build_guest_program(cluster: &Cluster, name: &str, source: &str) {
    let path = cluster.dir.join(format!("{name}.c"));
    std::fs::write(&path, source).unwrap();
    let status = std::process::Command::new("gcc")
        .args(["-static", "-O2", "-pthread", "-o"])
        .arg(cluster.dir.join("root/bin").join(name))
        .arg(&path)
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc {name}.c");
}

/// (mono ns, real ns) of every `clock` line clockwatch printed in `log`,
/// after checking the other realtime readers agree with `real` and no
/// monotonic or boot time read went back.
fn clock_lines(log: &str) -> Vec<(i64, i64)> {
    assert!(!log.contains("BACK"), "a clock went back: {log}");
    log.lines()
        .filter_map(|l| l.strip_prefix("clock "))
        .map(|l| {
            let field = |name: &str| -> i64 {
                l.split(' ')
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{name} in {l:?}"))
            };
            let (mono, real) = (field("mono"), field("real"));
            for other in ["tod", "time", "coarse"] {
                let seconds = field(other);
                assert!(
                    (real / 1_000_000_000 - seconds).abs() <= 1,
                    "{other} disagrees with CLOCK_REALTIME: {l}"
                );
            }
            (mono, real)
        })
        .collect()
}

/// realtime - monotonic (ns) of each clock line, with its monotonic time in s.
fn offsets(lines: &[(i64, i64)]) -> Vec<(f64, i64)> {
    lines
        .iter()
        .map(|&(mono, real)| (mono as f64 / 1e9, real - mono))
        .collect()
}

/// n2's realtime steps +30 s, then -2 s (n1's does not move), its monotonic
/// and boot time never go back, and the offset survives a restart; in n3
/// (an hour ahead) absolute realtime deadlines are kept in n3's view. Two
/// runs with one seed are identical.
#[test]
fn test_up_clock_steps_a_nodes_realtime_only() {
    let cluster = Cluster::new(
        "clock",
        r#"
[[node]]
name = "n1"
rootfs = "root"
command = ["sh", "-c", "/bin/clockwatch & while true; do echo date $(date +%s); sleep 0.5; done"]

[[node]]
name = "n2"
rootfs = "root"
command = ["sh", "-c", "/bin/clockwatch & while true; do echo date $(date +%s); sleep 0.5; done"]

[[node]]
name = "n3"
rootfs = "root"
command = ["sleep", "1000"]

[workload]
node = "n3"
command = ["sh", "-c", "sleep 10; /bin/deadlines"]
"#,
    );
    build_guest_program(&cluster, "clockwatch", CLOCKWATCH_C);
    build_guest_program(&cluster, "deadlines", DEADLINES_C);
    let out = cluster.up(&[
        "--seed",
        "4",
        "--until",
        "60s",
        "--fault",
        "at=3s clock n2 +30s",
        "--fault",
        "at=5s clock n2 -2s",
        "--fault",
        "at=7s restart n2",
        "--fault",
        "at=2s clock n3 +1h",
        "--runs",
        "2",
    ]);
    let text = stdout(&out);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(text.contains("identical: 2 runs"), "{text}");
    assert!(err.contains("fault: clock n2 +30s"), "{err}");
    assert!(
        err.contains("node n2 clock: realtime offset +30s, drift 0ppm"),
        "{err}"
    );
    assert!(
        err.contains("node n2 clock: realtime offset +28s, drift 0ppm"),
        "{err}"
    );

    // `date +%s`: n1 counts on, n2 jumps 30 s ahead once.
    let dates = |node: &str| -> Vec<i64> {
        cluster
            .log(node)
            .lines()
            .filter_map(|l| l.strip_prefix("date ")?.parse().ok())
            .collect()
    };
    let (d1, d2) = (dates("n1"), dates("n2"));
    assert!(d1.len() > 20 && d2.len() > 20, "{d1:?} {d2:?}");
    assert!(
        d1.windows(2).all(|w| (0..=1).contains(&(w[1] - w[0]))),
        "{d1:?}"
    );
    assert_eq!(
        d2.windows(2)
            .filter(|w| (29..=31).contains(&(w[1] - w[0])))
            .count(),
        1,
        "{d2:?}"
    );

    // realtime - monotonic: constant in n1; in n2 +30 s from 3 s, +28 s
    // from 5 s on, across the restart at 7 s.
    let base = offsets(&clock_lines(&cluster.log("n1")));
    let reference = base[0].1;
    for (t, offset) in &base {
        assert!(
            (offset - reference).abs() < 1_000_000,
            "n1 at {t}: {base:?}"
        );
    }
    let n2 = offsets(&clock_lines(&cluster.log("n2")));
    let expected = |t: f64| -> Option<i64> {
        match t {
            t if t < 2.9 => Some(0),
            t if (3.2..4.9).contains(&t) => Some(30),
            t if t > 5.2 => Some(28),
            _ => None,
        }
    };
    assert!(
        n2.iter().any(|(t, _)| *t > 8.0),
        "no line after the restart: {n2:?}"
    );
    for (t, offset) in &n2 {
        if let Some(seconds) = expected(*t) {
            let want = reference + seconds * 1_000_000_000;
            assert!((offset - want).abs() < 1_000_000, "n2 at {t}: {n2:?}");
        }
    }

    // Absolute deadlines an hour ahead of the guest's clock, kept in n3's view.
    for (what, wanted) in [
        ("nanosleep", 2000),
        ("timerfd", 1000),
        ("timer", 1000),
        ("condvar", 1000),
    ] {
        let waited: i64 = text
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("workload | {what} "))?
                    .strip_suffix("ms")?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {what} line: {text}"));
        assert!(
            (wanted..wanted + 150).contains(&waited),
            "{what} waited {waited} ms for a deadline {wanted} ms ahead: {text}"
        );
    }
}

/// `drift n2 +200ppm for=60s`: n2's realtime gains 200 µs a second on n1's
/// for 60 s (12 ms), then keeps what it gained.
#[test]
fn test_up_drift_makes_a_nodes_realtime_run_fast_for_a_while() {
    let cluster = Cluster::new(
        "drift",
        r#"
[[node]]
name = "n1"
rootfs = "root"
command = ["/bin/clockwatch"]

[[node]]
name = "n2"
rootfs = "root"
command = ["/bin/clockwatch"]

[workload]
node = "n1"
command = ["sleep", "80"]
"#,
    );
    build_guest_program(&cluster, "clockwatch", CLOCKWATCH_C);
    let out = cluster.up(&[
        "--seed",
        "9",
        "--until",
        "120s",
        "--fault",
        "at=5s drift n2 +200ppm for=60s",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("fault: drift n2 +200ppm"), "{err}");
    assert!(err.contains("fault: drift n2 0ppm"), "{err}");
    let n1 = offsets(&clock_lines(&cluster.log("n1")));
    let n2 = offsets(&clock_lines(&cluster.log("n2")));
    let reference = n1[0].1;
    assert!(
        n1.iter().all(|(_, o)| (o - reference).abs() < 1_000_000),
        "{n1:?}"
    );
    // 200 ppm of the time since 5 s, up to 60 s of it: 12 ms.
    for (t, offset) in &n2 {
        let gained = ((t - 5.0).clamp(0.0, 60.0) * 200e3) as i64; // ns
        assert!(
            (offset - reference - gained).abs() < 500_000,
            "n2 at {t}s: gained {} ns, expected {gained}: {n2:?}",
            offset - reference
        );
    }
    assert!(n2.iter().any(|(t, _)| *t > 70.0), "{n2:?}");
}
