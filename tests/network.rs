//! The simulated network, end to end: two virtio NICs in one guest (one moved
//! into its own network namespace), joined by detvisor's switch, which
//! delivers frames in virtual time.

mod common;

use common::*;

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
