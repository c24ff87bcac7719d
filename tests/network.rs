//! The simulated network, end to end: two virtio NICs in one guest (one moved
//! into its own network namespace), joined by detvisor's switch, which
//! delivers frames in virtual time; and the switch's faults as `up` nodes
//! see them (cuts, one-way partitions, Jepsen's topologies, slow and lossy
//! links) and `--pcap` captures read back by tcpdump.

mod common;

use common::*;
use std::path::Path;

/// Node A at 192.0.2.1 (eth0), node B at 192.0.2.2 (eth1, own netns); A pings B.
const PING: &str = "ip link set lo up; ip addr add 192.0.2.1/24 dev eth0; ip link set eth0 up; \
    unshare -n sleep 100000 & P=$!; sleep 0.1; ip link set eth1 netns $P; \
    nsenter -t $P -n sh -c 'ip link set lo up; ip addr add 192.0.2.2/24 dev eth1; ip link set eth1 up'; \
    ping -c 4 192.0.2.2";

#[test]
fn test_ping_round_trip_is_twice_the_switch_latency_in_virtual_time() {
    let out = detvisor(&[
        "run",
        "--json",
        "--nics",
        "2",
        "--net-latency",
        "5ms",
        "--",
        "sh",
        "-c",
        PING,
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(
        text.contains("4 packets transmitted, 4 packets received"),
        "{text}"
    );
    // After ARP, every echo takes exactly 5 ms each way (plus a few microseconds of exits).
    let times: Vec<f64> = text
        .lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.trim_end_matches(" ms").parse().ok())
        .collect();
    assert_eq!(times.len(), 4);
    for t in &times[1..] {
        assert!((10.0..10.5).contains(t), "round trip {t} ms");
    }
}

#[test]
fn test_total_loss_drops_every_frame() {
    let out = detvisor(&[
        "run",
        "--nics",
        "2",
        "--net-loss",
        "1",
        "--until",
        "30s",
        "--",
        "sh",
        "-c",
        PING,
    ]);
    let text = stdout(&out);
    assert!(
        text.contains("0 packets received, 100% packet loss"),
        "{text}"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "ping fails when nothing arrives"
    );
}

#[test]
fn test_audit_with_network_traffic_is_identical() {
    let out = detvisor(&[
        "audit",
        "--runs",
        "2",
        "--nics",
        "2",
        "--net-latency",
        "1ms..9ms",
        "--seed",
        "4",
        "--",
        "sh",
        "-c",
        PING,
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).starts_with("identical: 2 runs"));
}

#[test]
fn test_snapshot_with_frames_in_flight_resumes_identically() {
    let dir = std::env::temp_dir().join(format!("detvisor-net-snaps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let snaps = dir.to_str().unwrap();
    let args = ["--nics", "2", "--net-latency", "2ms..8ms", "--seed", "9"];
    let mut straight_args = vec!["run", "--json"];
    straight_args.extend(args);
    straight_args.extend(["--", "sh", "-c", PING]);
    let straight = detvisor(&straight_args);
    assert_eq!(straight.status.code(), Some(0));
    let a = summary(&straight);
    // Snapshot every virtual millisecond while the pings are under way: some
    // snapshots are taken with frames in flight in the switch.
    let mut snap_args = vec![
        "run",
        "--json",
        "--snapshots",
        snaps,
        "--snapshot-every",
        "1ms",
    ];
    snap_args.extend(args);
    snap_args.extend(["--", "sh", "-c", PING]);
    let taken = detvisor(&snap_args);
    assert_eq!(summary(&taken)["digest"], a["digest"]);
    let ls = detvisor(&["snapshot", "ls", snaps, "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert!(
        rows.len() > 10,
        "expected many snapshots, got {}",
        rows.len()
    );
    // Resume, in new processes, from snapshots taken while frames were in
    // flight in the switch (as `snapshot info` reads them from the state).
    let in_flight: Vec<String> = rows
        .iter()
        .map(|row| format!("{snaps}/{}", row["id"].as_str().unwrap()))
        .filter(|path| {
            let info = detvisor(&["snapshot", "info", path]);
            let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
            info["frames_in_flight"].as_u64().unwrap() > 0
        })
        .collect();
    assert!(
        !in_flight.is_empty(),
        "no snapshot caught a frame in flight"
    );
    for path in in_flight.iter().take(2) {
        let resumed = detvisor(&["branch", path, "--json"]);
        assert_eq!(summary(&resumed)["digest"], a["digest"], "from {path}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Waits until the guest's uptime (virtual time since boot) reaches $1 seconds.
const AT: &str = "at() { while [ $(cut -d. -f1 /proc/uptime) -lt $1 ]; do sleep 0.1; done; }; ";
/// A node that does nothing.
const IDLE: &str = "while true; do sleep 1; done";

/// Five nodes (192.0.2.1..5). At each checkpoint every node pings every
/// other once, all at the same time, and prints
/// `<checkpoint> n<me>-n<other> ok|lost`.
fn five_node_manifest() -> String {
    let checker = format!(
        "{AT}ME=$(hostname | cut -c2-); for t in 11 15 19 23; do at $t; for j in 1 2 3 4 5; do \
         [ $j = $ME ] && continue; (if ping -c 1 -W 1 192.0.2.$j >/dev/null; then echo $t n$ME-n$j ok; \
         else echo $t n$ME-n$j lost; fi) & done; wait; done; {IDLE}"
    );
    cluster::manifest(
        "1ms",
        &[
            checker.clone(),
            checker.clone(),
            checker.clone(),
            checker.clone(),
            checker,
        ],
        ("n5", &format!("{AT}at 25")),
    )
}

/// Who reached whom at checkpoint `t`: the (from, to) node numbers whose
/// ping came back, and how many results there were.
fn reached(text: &str, t: u32) -> (Vec<(u32, u32)>, usize) {
    let prefix = format!("{t} n");
    let results: Vec<(u32, u32, bool)> = text
        .lines()
        .filter_map(|l| l.split_once(" | ").map(|(_, rest)| rest))
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| {
            let (pair, result) = l.split_once(' ')?;
            let (a, b) = pair.split_once("-n")?;
            Some((a.parse().ok()?, b.parse().ok()?, result == "ok"))
        })
        .collect();
    let mut ok: Vec<(u32, u32)> = results
        .iter()
        .filter(|r| r.2)
        .map(|&(a, b, _)| (a, b))
        .collect();
    ok.sort();
    (ok, results.len())
}

/// Every ordered pair of distinct nodes among 1..=5 except those `cut`
/// separates (in either direction).
fn all_but(cut: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut pairs = Vec::new();
    for a in 1..=5 {
        for b in 1..=5 {
            if a != b && !cut.contains(&(a, b)) && !cut.contains(&(b, a)) {
                pairs.push((a, b));
            }
        }
    }
    pairs
}

/// `up` of `cluster` with `seed` until 60 s, `faults`, then `extra` options.
fn up_with_faults(
    cluster: &cluster::Cluster,
    seed: &str,
    faults: &[&str],
    extra: &[&str],
) -> std::process::Output {
    let mut args = vec!["--seed", seed, "--until", "60s"];
    for fault in faults {
        args.extend(["--fault", fault]);
    }
    args.extend(extra);
    cluster.up(&args)
}

#[test]
fn test_up_cut_bridge_and_majorities_ring_cut_exactly_their_links() {
    let cluster = cluster::Cluster::new("topologies", &five_node_manifest());
    let out = up_with_faults(
        &cluster,
        "5",
        &[
            "at=10s cut n1 <-> n2,n3 for=3s",
            "at=14s bridge for=3s",
            "at=18s majorities-ring for=3s",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    // The cut: n1 loses n2 and n3 only; n4 and n5 still reach both sides.
    assert_eq!(
        reached(&text, 11),
        (all_but(&[(1, 2), (1, 3)]), 20),
        "{text}"
    );
    // The bridge: n1,n2 | n4,n5, with n3 talking to everyone.
    assert_eq!(
        reached(&text, 15),
        (all_but(&[(1, 4), (1, 5), (2, 4), (2, 5)]), 20),
        "{text}"
    );
    // The ring: each node reaches its two neighbours, a majority with itself.
    assert_eq!(
        reached(&text, 19),
        (all_but(&[(1, 3), (1, 4), (2, 4), (2, 5), (3, 5)]), 20),
        "{text}"
    );
    assert_eq!(reached(&text, 23), (all_but(&[]), 20), "{text}");
    let err = stderr(&out);
    for event in [
        "[10s] fault: cut n1 <-> n2,n3",
        "[13s] fault: heal n1 <-> n2,n3",
        "[14s] fault: bridge",
        "[17s] fault: heal",
        "[18s] fault: majorities-ring",
        "[21s] fault: heal",
    ] {
        assert!(err.contains(event), "{event}: {err}");
    }
}

/// n1 and n2 idle; the workload (in n2) pings n1 every half second until
/// 20 s and prints `ping <uptime at start> <round trip in ms>|lost`.
fn ping_loop_manifest() -> String {
    let pinger = "while [ $(cut -d. -f1 /proc/uptime) -lt 20 ]; do t=$(cut -d' ' -f1 /proc/uptime); \
        r=$(ping -c 1 -W 2 192.0.2.1 | awk -F'time=' '/time=/ {print $2+0}'); echo ping $t ${r:-lost}; \
        sleep 0.5; done";
    cluster::manifest("1ms", &[IDLE.into(), IDLE.into()], ("n2", pinger))
}

/// (start, round trip in ms or `None` if lost) of each ping of `ping_loop_manifest`.
fn timed_pings(text: &str) -> Vec<(f64, Option<f64>)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("workload | ping "))
        .filter_map(|l| {
            let (t, r) = l.split_once(' ')?;
            Some((t.parse().ok()?, r.parse().ok()))
        })
        .collect()
}

#[test]
fn test_up_slow_node_and_loss_burst_last_their_windows() {
    let cluster = cluster::Cluster::new("slow-loss", &ping_loop_manifest());
    let out = up_with_faults(
        &cluster,
        "2",
        &[
            "at=5s slow n1 latency=200ms..800ms for=4s",
            "at=12s loss n1 0.5 for=5s",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    let pings = timed_pings(&text);
    let within = |from: f64, to: f64| pings.iter().filter(move |p| (from..to).contains(&p.0));
    // Slow: both ways 200..800 ms on n1's links, so a round trip of 0.4..1.6 s.
    assert!(within(5.0, 8.0).count() >= 2, "{text}");
    for (t, rtt) in within(5.0, 8.0) {
        let rtt = rtt.unwrap_or_else(|| panic!("ping at {t} lost: {text}"));
        assert!((400.0..=1600.0).contains(&rtt), "{t}: {rtt} ms: {text}");
    }
    // Before, between and after: 1 ms each way.
    for (t, rtt) in within(0.0, 4.9)
        .chain(within(9.0, 11.9))
        .chain(within(17.0, 99.0))
    {
        let rtt = rtt.unwrap_or_else(|| panic!("ping at {t} lost: {text}"));
        assert!(rtt < 5.0, "{t}: {rtt} ms: {text}");
    }
    assert!(
        within(0.0, 4.9).count() > 0 && within(17.0, 99.0).count() > 0,
        "{text}"
    );
    // The loss burst: half of n1's frames each way are lost.
    assert!(within(12.0, 17.0).any(|p| p.1.is_none()), "{text}");
    let err = stderr(&out);
    for event in [
        "[5s] fault: slow n1 latency=200ms..800ms",
        "[9s] fault: slow n1 off",
        "[12s] fault: loss n1 0.5",
        "[17s] fault: loss n1 off",
    ] {
        assert!(err.contains(event), "{event}: {err}");
    }
}

/// The frames `tcpdump -r` reads from `file`, as (virtual seconds, summary).
fn tcpdump(file: &Path) -> Vec<(f64, String)> {
    let out = std::process::Command::new("tcpdump")
        .args(["-tt", "-n", "-r"])
        .arg(file)
        .output()
        .expect("tcpdump is installed (scripts/test installs it)");
    assert!(
        out.status.success(),
        "tcpdump -r {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (t, rest) = l.split_once(' ')?;
            Some((t.parse().ok()?, rest.to_owned()))
        })
        .collect()
}

/// Each echo request of `requests` with the first echo reply of `replies`
/// after it: their delivery times.
fn echo_pairs(requests: &[(f64, String)], replies: &[(f64, String)]) -> Vec<(f64, f64)> {
    requests
        .iter()
        .filter(|(_, s)| s.contains("ICMP echo request"))
        .filter_map(|&(sent, _)| {
            replies
                .iter()
                .find(|(t, s)| *t >= sent && s.contains("ICMP echo reply"))
                .map(|&(t, _)| (sent, t))
        })
        .collect()
}

/// n1 counts the frames it receives around a one-way partition n1 -> n2
/// (its replies never reach n2); the workload in n2 pings n1 during it and
/// after it.
fn one_way_manifest() -> String {
    let counter = format!(
        "{AT}rx() {{ awk '/eth/ {{ sub(/.*:/, \"\"); print $2 }}' /proc/net/dev; }}; at 5; echo rx-before $(rx); \
         if ping -c 1 -W 1 192.0.2.2 >/dev/null; then echo to-n2 ok; else echo to-n2 lost; fi; \
         at 7; echo rx-after $(rx); {IDLE}"
    );
    let pinger = format!("{AT}at 5; ping -c 2 -W 1 192.0.2.1; at 9; ping -c 1 -W 1 192.0.2.1");
    cluster::manifest("1ms", &[counter, IDLE.into()], ("n2", &pinger))
}

#[test]
fn test_up_one_way_partition_drops_one_direction_and_pcap_changes_nothing() {
    let cluster = cluster::Cluster::new("one-way", &one_way_manifest());
    let pcap = cluster.dir.join("pcap").display().to_string();
    let out = up_with_faults(
        &cluster,
        "4",
        &["at=4s partition n1 -> n2 for=4s"],
        &["--pcap", &pcap, "--runs", "2"],
    );
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    // The first run wrote the capture, the second did not: same history.
    assert!(text.contains("identical: 2 runs"), "{text}");
    // n1 -> n2 is cut: n1's ping and n2's (whose replies go n1 -> n2) fail ...
    assert!(text.contains("      n1 | to-n2 lost\n"), "{text}");
    assert!(
        text.contains("workload | 2 packets transmitted, 0 packets received"),
        "{text}"
    );
    // ... yet n1 received n2's frames meanwhile.
    let rx = |what: &str| -> u64 {
        let prefix = format!("      n1 | {what} ");
        let line = text.lines().find_map(|l| l.strip_prefix(&prefix));
        line.and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {what}: {text}"))
    };
    assert!(rx("rx-after") >= rx("rx-before") + 2, "{text}");
    // After the heal, both ways again.
    assert!(
        text.contains("workload | 1 packets transmitted, 1 packets received"),
        "{text}"
    );
    let err = stderr(&out);
    assert!(err.contains("[4s] fault: partition n1 -> n2"), "{err}");
    assert!(err.contains("[8s] fault: heal n1 -> n2"), "{err}");

    // The capture, read by tcpdump: n2's frames reached n1 during the
    // partition; after it, each echo request arrived at n1 and its reply at
    // n2 1 ms (the link's latency) and a few microseconds of n1 later, in
    // virtual seconds since boot.
    let dir = Path::new(&pcap);
    let to_n1 = tcpdump(&dir.join("n2.to.n1.pcapng"));
    let to_n2 = tcpdump(&dir.join("n1.to.n2.pcapng"));
    assert!(
        to_n1
            .iter()
            .any(|(t, s)| (5.0..8.0).contains(t) && s.contains("192.0.2.2")),
        "{to_n1:?}"
    );
    let pairs = echo_pairs(&to_n1, &to_n2);
    let after: Vec<&(f64, f64)> = pairs.iter().filter(|p| p.0 >= 9.0).collect();
    assert_eq!(after.len(), 1, "{to_n1:?} {to_n2:?}");
    let (request, reply) = *after[0];
    assert!(request < 10.0, "{request}");
    assert!(
        (0.001..0.0015).contains(&(reply - request)),
        "{request} -> {reply}"
    );
}

#[test]
fn test_run_pcap_shows_the_pings_at_their_virtual_times_and_changes_no_digest() {
    let dir = std::env::temp_dir().join(format!("detvisor-net-pcap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pcap = dir.to_str().unwrap();
    let args = [
        "run",
        "--json",
        "--nics",
        "2",
        "--net-latency",
        "5ms",
        "--seed",
        "3",
    ];
    let mut plain = args.to_vec();
    plain.extend(["--", "sh", "-c", PING]);
    let mut captured = args.to_vec();
    captured.extend(["--pcap", pcap, "--", "sh", "-c", PING]);

    let without = detvisor(&plain);
    let with = detvisor(&captured);

    assert_eq!(with.status.code(), Some(0));
    assert_eq!(summary(&with)["digest"], summary(&without)["digest"]);
    // eth0 (192.0.2.1) pings eth1: each request reaches eth1, and its reply
    // eth0 5 ms later (plus the reply's few microseconds in the guest).
    let requests = tcpdump(&dir.join("eth0.to.eth1.pcapng"));
    let replies = tcpdump(&dir.join("eth1.to.eth0.pcapng"));
    let pairs = echo_pairs(&requests, &replies);
    assert_eq!(pairs.len(), 4, "{requests:?} {replies:?}");
    for &(request, reply) in &pairs {
        assert!(
            (0.005..0.0055).contains(&(reply - request)),
            "{request} -> {reply}"
        );
    }
    // One ping a second, in virtual time (the host took much longer).
    for w in pairs.windows(2) {
        assert!((0.99..1.01).contains(&(w[1].0 - w[0].0)), "{pairs:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn test_up_slow_and_loss_resume_from_snapshots_to_the_same_history() {
    let cluster = cluster::Cluster::new("slow-loss-snaps", &ping_loop_manifest());
    let faults = [
        "at=5s slow n1 latency=200ms..800ms for=4s",
        "at=12s loss n1 0.5 for=5s",
    ];
    let straight = up_with_faults(&cluster, "6", &faults, &["--json", "--quiet"]);
    assert_eq!(straight.status.code(), Some(0));
    let digest = summary(&straight)["digest"].clone();
    let snaps = cluster.dir.join("snaps").display().to_string();
    let taken = up_with_faults(
        &cluster,
        "6",
        &faults,
        &[
            "--json",
            "--quiet",
            "--snapshots",
            &snaps,
            "--snapshot-every",
            "1500ms",
        ],
    );
    assert_eq!(summary(&taken)["digest"], digest);
    // Resumed inside the slow window (overrides, the slow stream's position
    // and slow frames in flight come from the snapshot) and inside the loss
    // burst: the same history to the end.
    for moment in ["6.2s", "13.7s"] {
        let spec = format!("{snaps}@{moment}");
        let out = detvisor(&["branch", &spec, "--json"]);
        assert_eq!(out.status.code(), Some(0), "{spec}: {}", stderr(&out));
        assert_eq!(summary(&out)["digest"], digest, "{spec}");
    }
}
