//! A moment's digest is one definition: the same moment of the same history
//! (same boot seed, same steps, same virtual time) reports the same exit,
//! time and digest whichever verb reached it:
//!
//! - the campaign's way: booted with records collected, run to the root by
//!   the campaign's rule ([`fuzzer::session::reach`]), the path's step taken
//!   ([`fuzzer::session::apply_steps`]: run to its time, re-key), run to the
//!   branch's end, the run's digest read there;
//! - `branch SNAPSHOT --seed S --until E`: restored from a snapshot of the
//!   root, re-keyed, run to its virtual-time limit (no records collected);
//! - `up --until E`: booted with the limit and run to it (no records), the
//!   same moment as the campaign's without the step.
//!
//! The runs happen where the campaign's would: the run library here, or a
//! helper VM (its requests sent to it as a campaign's worker sends them).
//! A helper VM's payload is this executable run as `serve-channel`, so the
//! test has its own `main` (no libtest harness, see Cargo.toml): with that
//! argument it serves, as `detvisor serve-channel` does.

use fuzzer::session::{apply_steps, reach};
use fuzzer::spec::RootRule;
use fuzzer::step::Step;
use helper_vm::client::Placed;
use helper_vm::{HostVmMode, Placement};
use run::api::{Request, Until};
use run::branch::BranchRequest;
use run::client::{Calls, InProcess};
use run::moment::Moment;
use run::up::{PreparedUp, UpOptions};
use std::path::Path;
use std::time::Instant;
use vmm::VirtNanos;

/// Two idle nodes (they sleep most of the time: a time limit often falls
/// while the guest is halted) and a workload that pings between them.
const TWO_NODES: &str = r#"
[network]
latency = "1ms..3ms"

[[node]]
name = "n1"
rootfs = "root"
command = ["sh", "-c", "while true; do echo pong | nc -l -p 7000; done"]

[[node]]
name = "n2"
rootfs = "root"
command = ["sh", "-c", "while true; do sleep 1; done"]

[workload]
node = "n2"
command = ["sh", "-c", "while true; do sleep 1; ping -c 1 -w 2 192.0.2.1; done"]
"#;

const SEED: u64 = 7;
const BRANCH_SEED: u64 = 99;

/// The manifest's guest, assembled on this host (busybox as the nodes' root).
fn prepare(dir: &Path) -> PreparedUp {
    let bin = dir.join("root/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy("/bin/busybox", bin.join("busybox")).expect("busybox-static is installed");
    for applet in ["sh", "echo", "sleep", "ping", "nc", "true"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let manifest = run::manifest::parse(TWO_NODES, dir).unwrap();
    run::up::prepare(&manifest, &[], None, None).unwrap()
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("serve-channel") {
        helper_vm::client::serve().expect("serving run requests in the helper VM");
        return;
    }
    test_a_moment_reached_by_the_campaign_by_branch_and_by_up_has_one_digest();
    println!(
        "test test_a_moment_reached_by_the_campaign_by_branch_and_by_up_has_one_digest ... ok"
    );
}

fn test_a_moment_reached_by_the_campaign_by_branch_and_by_up_has_one_digest() {
    let started = Instant::now();
    let scratch = tempfile::tempdir().unwrap();
    let prepared = prepare(scratch.path());
    let snaps = scratch.path().join("snaps");
    std::fs::create_dir_all(&snaps).unwrap();

    // Where the runs happen, as a campaign's worker decides it.
    let placement = helper_vm::placement(HostVmMode::Auto);
    let mut request = Request::BootUp {
        prepared: prepared.clone(),
        options: UpOptions::new(SEED),
    };
    let mut runner = Placed::new(placement.clone(), InProcess::new, None, true, false);
    if let Placement::HelperVm { reason } = &placement {
        eprintln!("the runs happen in a helper VM: {reason}");
        let mut needs = helper_vm::client::needs(&mut request).unwrap();
        needs.share(&snaps).unwrap();
        runner.start(needs).unwrap();
    }
    let Request::BootUp { prepared, .. } = request else {
        unreachable!("the request stays a BootUp")
    };
    let mut calls = Calls::new(&mut runner);

    let root_at = VirtNanos::from_secs(3);
    let end = VirtNanos::from_micros(4_500_000);

    // The campaign's way: records collected, the root by its rule, then the
    // step (re-key at the root) and the slice to `end`.
    let (run, _) = calls
        .start(Request::BootUp {
            prepared: prepared.clone(),
            options: UpOptions::new(SEED),
        })
        .unwrap();
    calls.collect_records(run).unwrap();
    let (root, root_records) = reach(&mut calls, run, &RootRule::At { at_ns: root_at }).unwrap();
    assert!(!root_records.is_empty(), "the root's stretch has records");
    let (root_checkpoint, _) = calls.checkpoint(run).unwrap();
    let row = calls.snapshot(run, &snaps).unwrap();
    assert_eq!(row.exit_index, root.exits);
    let step = Step {
        at_ns: root.virtual_ns,
        seed: BRANCH_SEED,
        faults: Vec::new(),
    };
    let branched = apply_steps(&mut calls, run, std::slice::from_ref(&step), end).unwrap();
    assert_eq!(branched.stop, None, "the slice ran to its end");
    let campaign_branch = calls.outcome(run).unwrap();
    drop(calls.take_records(run).unwrap());
    // And the same moment without the step (the root's history run on).
    calls.reset(run, root_checkpoint).unwrap();
    let unbranched = calls.run_until(run, Until::Time(end)).unwrap();
    let campaign_plain = calls.outcome(run).unwrap();
    calls.close(run).unwrap();
    assert_eq!(campaign_branch.exits, branched.exits);
    assert_eq!(campaign_plain.exits, unbranched.exits);
    assert_ne!(
        campaign_branch.digest, campaign_plain.digest,
        "the re-key made another history"
    );

    // `branch SNAPSHOT --seed S --until E`: no records collected.
    let branch = calls
        .branch(BranchRequest {
            moment: Moment::Snapshot(snaps.join(&row.id)),
            until: Some(end),
            seed: Some(BRANCH_SEED),
            snapshots: None,
            events: false,
            faults: Vec::new(),
            stall_timeout: Default::default(),
            trace: None,
            clock: None,
        })
        .unwrap();
    let at = |s: &run::RunSummary| (s.exits, s.virtual_ns, s.digest.clone());
    assert_eq!(
        at(&branch),
        at(&campaign_branch),
        "branch --until and the campaign at the same moment (parts: {:?} / {:?})",
        branch.digest_parts,
        campaign_branch.digest_parts
    );

    // `up --until E`: no records, the limit set at boot.
    let up = calls
        .up(
            prepared,
            UpOptions {
                until: Some(end),
                ..UpOptions::new(SEED)
            },
        )
        .unwrap();
    assert_eq!(
        at(&up.run),
        at(&campaign_plain),
        "up --until and the campaign at the same moment (parts: {:?} / {:?})",
        up.run.digest_parts,
        campaign_plain.digest_parts
    );
    eprintln!(
        "one digest per moment: {} at exit {} ({}), {} at exit {} ({}); {:.1} s",
        campaign_branch.digest,
        campaign_branch.exits,
        campaign_branch.virtual_ns,
        campaign_plain.digest,
        campaign_plain.exits,
        campaign_plain.virtual_ns,
        started.elapsed().as_secs_f64()
    );
}
