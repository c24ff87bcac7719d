//! Alternate histories that really differ: a branch re-keys every seeded
//! stream (the switch's latencies, the hwrng, and through the agent the
//! guest kernel's CRNG), and a branch can add faults at its moment.

mod common;

use common::cluster::{self, Cluster};
use common::*;

/// Eight bytes of the kernel's CRNG as hex, in busybox `sh`.
const RANDOM: &str = "$(head -c8 /dev/urandom | od -An -tx1 | tr -d ' \\n')";

/// Random reads right after a branch. Until 2 s every process sleeps (n2
/// for good). Then n1 reads once and spins through [`SPINS`] reads in a
/// row, without sleeping; the workload (in n2) reads once at 2 s and ends
/// a second later.
fn urandom_manifest() -> String {
    let n1 = format!(
        "sleep 2; echo n1-first {RANDOM}; i=0; \
         while [ $i -lt {SPINS} ]; do i=$((i+1)); echo spin $i {RANDOM}; done; sleep 100000"
    );
    let workload = format!("sleep 2; echo wl-first {RANDOM}; sleep 1; exit 0");
    cluster::manifest("1ms", &[n1, "sleep 100000".to_string()], ("n2", &workload))
}

/// How many reads n1 makes in a row without sleeping.
const SPINS: u32 = 24;

/// The bytes printed after `tag` (`n1-first`, `wl-first`, `spin 7`).
fn read_after(out: &str, tag: &str) -> Option<String> {
    let prefix = format!("{tag} ");
    out.lines().find_map(|line| {
        let at = line.find(&prefix)?;
        let bytes = line[at + prefix.len()..].split_whitespace().next()?;
        (bytes.len() == 16).then(|| bytes.to_string())
    })
}

/// n1's spin reads, by index (1-based), as far as `out` printed them.
fn spins(out: &str) -> Vec<Option<String>> {
    (1..=SPINS)
        .map(|i| read_after(out, &format!("spin {i}")))
        .collect()
}

/// The exit at which the host read n1's output line `spin <i>` (from an
/// `up --records` file): a moment in the middle of n1's spin.
fn exit_of_spin(records: &std::path::Path, i: u32) -> u64 {
    let text = std::fs::read_to_string(records).unwrap();
    let needle = format!("spin {i} ");
    text.lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|record| {
            record["body"]["kind"] == "output"
                && record["body"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains(&needle))
        })
        .and_then(|record| record["exit"].as_u64())
        .unwrap_or_else(|| panic!("no output record with {needle:?} in {text}"))
}

/// The guest kernel's CRNG is re-keyed at the branch exit itself, before
/// any guest code runs: the first read after a branch taken while every
/// process sleeps (in a node and in the workload, woken by their timers)
/// differs by seed, repeats per seed and differs from the parent's; so do
/// the reads of a node that spins through the branch point, from the first
/// read after it. One `up` run and its snapshots serve every case.
#[test]
fn test_urandom_right_after_a_branch_differs_per_seed_and_repeats_per_seed() {
    let cluster = Cluster::new("urandom", &urandom_manifest());
    let snaps = cluster.dir.join("snaps").display().to_string();
    let records = cluster.dir.join("records.jsonl");
    let straight = cluster.up(&[
        "--seed",
        "5",
        "--snapshots",
        &snaps,
        "--snapshot-every",
        "1s",
        "--records",
        &records.display().to_string(),
    ]);
    assert_eq!(straight.status.code(), Some(0), "{}", stderr(&straight));
    let parent = stdout(&straight);
    let parent_spins = spins(&parent);
    assert!(parent_spins.iter().all(Option::is_some), "{parent}");

    // Branched at 1.5 s, while every process sleeps: the branch exit is
    // the timer's that wakes n1 and the workload at 2 s.
    let asleep = format!("{snaps}@1500ms");
    let branch = |spec: &str, seed: Option<&str>| {
        let mut args = vec!["branch", spec];
        args.extend(seed.iter().flat_map(|seed| ["--seed", *seed]));
        let out = detvisor(&args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "seed {seed:?}: {}",
            stderr(&out)
        );
        stdout(&out)
    };
    let (five, six, five_again) = (
        branch(&asleep, Some("5")),
        branch(&asleep, Some("6")),
        branch(&asleep, Some("5")),
    );
    for tag in ["n1-first", "wl-first"] {
        let read = |out: &str| read_after(out, tag).unwrap_or_else(|| panic!("no {tag} in {out}"));
        let (p, a, b, a_again) = (read(&parent), read(&five), read(&six), read(&five_again));
        assert_eq!(a, a_again, "{tag}: one seed, one history");
        assert_ne!(a, b, "{tag}: another seed, other bytes");
        assert_ne!(a, p, "{tag}: the branch's first read is not the parent's");
        assert_ne!(b, p, "{tag}: the branch's first read is not the parent's");
    }
    assert_eq!(spins(&five), spins(&five_again));

    // Branched in the middle of n1's spin, at the exit where the host read
    // `spin 8`: the reads n1 made before that exit are the parent's, and
    // every one after it is the branch's own, from the first.
    let spinning = format!("{snaps}@exit:{}", exit_of_spin(&records, 8));
    let (five, six) = (
        spins(&branch(&spinning, Some("5"))),
        spins(&branch(&spinning, Some("6"))),
    );
    for (seed, reads) in [("5", &five), ("6", &six)] {
        let after: Vec<usize> = (0..SPINS as usize)
            .filter(|&i| reads[i].is_some() && reads[i] != parent_spins[i])
            .collect();
        let first = *after
            .first()
            .unwrap_or_else(|| panic!("seed {seed}: {reads:?}"));
        assert!(
            first >= 8,
            "seed {seed}: read {} before the branch point differs",
            first + 1
        );
        assert_eq!(
            after,
            (first..SPINS as usize).collect::<Vec<_>>(),
            "seed {seed}: every read after the first re-keyed one is the branch's own"
        );
        assert!(
            SPINS as usize - first >= 8,
            "seed {seed}: too few reads after the branch"
        );
    }
    let first_six = (0..SPINS as usize).find(|&i| six[i] != parent_spins[i]);
    let first_five = (0..SPINS as usize).find(|&i| five[i] != parent_spins[i]);
    assert_eq!(
        first_five, first_six,
        "the same read is the first after the branch"
    );
    let i = first_five.unwrap();
    assert_ne!(
        five[i], six[i],
        "the first read after the branch differs by seed"
    );

    // Without a seed, the branch is the parent's own history.
    assert_eq!(spins(&branch(&spinning, None)), parent_spins);
}

/// A node command that does nothing, forever.
const IDLE: &str = "while true; do sleep 1; done";

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

/// The default guest kernel's CRNG is found where `nm` says it is (the
/// VMM re-keys it in guest memory at a branch); a stripped kernel has no
/// CRNG the VMM could find (the agent reseeds it instead).
#[test]
fn test_the_default_kernels_crng_is_found_and_a_stripped_kernel_has_none() {
    let kernel = run::guest::default_image().unwrap().kernel;
    let nm = std::process::Command::new("nm")
        .arg(&kernel)
        .output()
        .unwrap();
    let symbols = String::from_utf8(nm.stdout).unwrap();
    let virtual_address = |name: &str| {
        symbols
            .lines()
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                let (address, _, symbol) = (fields.next()?, fields.next()?, fields.next()?);
                (symbol == name).then(|| u64::from_str_radix(address, 16).unwrap())
            })
            .unwrap_or_else(|| panic!("no {name} in the default kernel"))
    };
    // The kernel runs at 0xffffffff80000000 + its physical address.
    let physical = |name: &str| virtual_address(name) - 0xffff_ffff_8000_0000;
    let open = |path: &std::path::Path| std::fs::File::open(path).unwrap();
    let crng = vmm::guest_crng::GuestCrng::find(open(&kernel)).expect("found");
    assert_eq!(crng.base_crng, physical("base_crng"));
    assert_eq!(crng.input_pool, physical("input_pool"));

    let dir = std::env::temp_dir().join(format!("detvisor-stripped-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stripped = dir.join("vmlinux");
    let status = std::process::Command::new("objcopy")
        .arg("--strip-all")
        .arg(&kernel)
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(vmm::guest_crng::GuestCrng::find(open(&stripped)), None);
    let _ = std::fs::remove_dir_all(&dir);
}
