//! `detvisor bench branch-snapshots`: what keeping a branch's snapshots costs. An `up` run of
//! a busybox cluster keeps snapshots; then the same branch of one of its moments (`detvisor
//! branch DIR@T --seed S`) runs side by side without snapshots, with them as `branch
//! --snapshots` keeps them (the first incremental over the snapshot it was restored from), and
//! with a full first snapshot (the behaviour before), interleaved run by run
//! ([`crate::branch_snapshots_worker`]). Prints the medians, the ratios to the branch without
//! snapshots (issue 28's target: at most 1.5x) and a final JSON line.
//!
//! The cluster: three busybox nodes, each filling `--fill` MiB of its root (guest RAM, as a
//! database holds its data) with random bytes before the branch point, then printing a random
//! line every 50 ms; the workload sleeps and ends the run. The guest is assembled on the host
//! as `detvisor up` assembles it; the snapshots go to a host directory, shared with the helper
//! VM over 9p when the guests run there (as `detvisor` shares snapshot directories). There,
//! the helper VM's page cache is dropped before each branch (unless `--warm`): each
//! `detvisor branch` starts a fresh helper VM that holds none of the snapshot's pages, and a
//! full snapshot reads every page of guest RAM through the restored mapping.

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use std::fs;
use std::path::{Path, PathBuf};

use super::branch_snapshots_worker::{worker, BranchSnapshotsPlan, BranchSnapshotsReport, Side};
use super::check_runs_and_timeout;
use super::helper::HelperLaunch;
use super::machine::TempDir;
use super::report::{because, Session};
use super::serve::BenchCall;
use super::stats::{median, ratio};
use crate::say;
use helper_vm::HostVmMode;
use run::up::Initrd;
use run::{guest, manifest, units, up};
use vmm::VirtNanos;

#[derive(Args, Debug, Clone)]
pub struct BranchSnapshotsArgs {
    /// Repetitions of each side.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Time limit of each run, in seconds (the helper VM gets 300 s more in all).
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Guest RAM.
    #[arg(long, default_value = "1G")]
    pub mem: String,
    /// MiB of random bytes each of the three nodes keeps in its root before the branch point.
    #[arg(long, default_value_t = 64)]
    pub fill: u32,
    /// The `up` run's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The branches' seed (`branch --seed`).
    #[arg(long, default_value_t = 7)]
    pub branch_seed: u64,
    /// The moment branched (`DIR@<at>`).
    #[arg(long, default_value = "4s")]
    pub at: VirtNanos,
    /// When the workload ends the run (virtual).
    #[arg(long, default_value = "10s")]
    pub end: VirtNanos,
    /// Snapshots every this much virtual time, in the `up` run and in the branches.
    #[arg(long, default_value = "1s")]
    pub snapshot_every: VirtNanos,
    /// Where the guests run.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    pub host_vm: HostVmMode,
    /// Keep the helper VM's page cache between branches (by default it is dropped before
    /// each, as a `detvisor branch` in a fresh helper VM starts; on the host it is never
    /// dropped).
    #[arg(long)]
    pub warm: bool,
}

/// Busybox's applets the nodes use.
const APPLETS: &[&str] = &[
    "sh", "echo", "sleep", "head", "od", "tr", "dd", "true", "cat",
];

/// The cluster's manifest and busybox root in `dir`; returns the manifest's path.
fn write_cluster(dir: &Path, args: &BranchSnapshotsArgs) -> Result<PathBuf> {
    let bin = dir.join("root/bin");
    fs::create_dir_all(&bin)?;
    fs::copy("/bin/busybox", bin.join("busybox"))
        .context("copying /bin/busybox (install busybox-static)")?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bin.join(applet))?;
    }
    let node = format!(
        "dd if=/dev/urandom of=/fill bs=1M count={} 2>/dev/null; \
         while true; do echo tick $(head -c8 /dev/urandom | od -An -tx1 | tr -d ' \\n'); \
         sleep 0.05; done",
        args.fill
    );
    let mut text = String::from("[network]\nlatency = \"1ms\"\n");
    for i in 1..=3 {
        text.push_str(&format!(
            "\n[[node]]\nname = \"n{i}\"\nrootfs = \"root\"\ncommand = [\"sh\", \"-c\", {node:?}]\n"
        ));
    }
    let end_s = args.end.0 as f64 / 1e9;
    text.push_str(&format!(
        "\n[workload]\nnode = \"n1\"\ncommand = [\"sh\", \"-c\", \"sleep {end_s}; exit 0\"]\n"
    ));
    let path = dir.join("cluster.toml");
    fs::write(&path, text)?;
    Ok(path)
}

/// The worker in the helper VM: the kernel and the assembled initrd shipped, the snapshots'
/// directory shared.
fn helper_session(host_plan: &BranchSnapshotsPlan) -> (Session, Option<BranchSnapshotsReport>) {
    Session::record(|session| {
        let Initrd::File(initrd) = &host_plan.prepared.initrd else {
            anyhow::bail!("the assembled initrd is not in a file");
        };
        let files = vec![
            (host_plan.prepared.kernel.clone(), "bench/vmlinux".into()),
            (initrd.clone(), "bench/initrd".into()),
        ];
        let initrd_len = fs::metadata(initrd).map_or(0, |m| m.len());
        let mut plan = BranchSnapshotsPlan {
            place: "helper VM".into(),
            ..host_plan.clone()
        };
        plan.prepared.kernel = helper_vm::payload_path("bench/vmlinux").into();
        plan.prepared.initrd = Initrd::File(helper_vm::payload_path("bench/initrd").into());
        let launch = HelperLaunch {
            // As `detvisor up` sizes it, and room for a restore and the page cache.
            memory_mib: ((plan.prepared.ram_bytes >> 20) as u32)
                .saturating_add(1536)
                .saturating_add(((3 * initrd_len) >> 20) as u32)
                .max(2048),
            files,
            shared_dirs: vec![host_plan.scratch.clone()],
        };
        launch.run(&BenchCall::BranchSnapshots(plan), session, |s| {
            format!(
                "bench: starting the helper VM ({} MiB of payload files)",
                s.payload_file_bytes >> 20
            )
        })
    })
}

/// One side's figures.
#[derive(Serialize, Debug)]
struct SideFigures {
    side: Side,
    runs_ok: usize,
    median_wall_ms: Option<f64>,
    /// Median wall time over the branch without snapshots.
    ratio_to_plain: Option<f64>,
    first_incremental: Option<bool>,
    first_pages_stored: Option<u64>,
}

#[derive(Serialize)]
struct Summary<'a> {
    bench: &'static str,
    place: &'a str,
    mem: &'a str,
    fill_mib_per_node: u32,
    moment: &'a str,
    page_cache_dropped: bool,
    up_wall_ms: Option<f64>,
    sides: Vec<SideFigures>,
    /// Every branch ended with one digest (they are one history).
    one_history: bool,
    session: Option<&'a Session>,
    error: Option<&'a str>,
}

pub fn orchestrate(args: &BranchSnapshotsArgs) -> Result<u8> {
    check_runs_and_timeout(args.runs, args.timeout)?;
    let tmp = TempDir::new("detvisor-bench-branch-snapshots-")
        .context("cannot create a temporary directory for the benchmark")?;
    let cluster = tmp.path().join("cluster");
    let manifest_path = write_cluster(&cluster, args)?;
    let manifest = manifest::load(&manifest_path)?;
    let ram_bytes = units::parse_size(&args.mem)?;
    let image = guest::default_image()?;
    let mut prepared = up::prepare(&manifest, &[], Some(ram_bytes), Some(&image.kernel))?;
    if let Initrd::Bytes(bytes) = &prepared.initrd {
        let file = tmp.path().join("initrd-up");
        fs::write(&file, bytes)?;
        prepared.initrd = Initrd::File(file);
    }
    let scratch = tmp.path().join("snapshots");
    fs::create_dir_all(&scratch)?;
    let placement = helper_vm::placement(args.host_vm);
    say!(
        "bench: branch-snapshots: 3 busybox nodes, {} RAM, {} MiB each; branch at {} with and \
         without snapshots every {}, {} run(s) per side, on the {}{}{}",
        args.mem,
        args.fill,
        args.at,
        args.snapshot_every,
        args.runs,
        placement.name(),
        because(&placement),
        if placement.in_helper_vm() && !args.warm {
            "; its page cache dropped before each branch"
        } else {
            ""
        }
    );
    let plan = BranchSnapshotsPlan {
        runs: args.runs,
        timeout_s: args.timeout,
        seed: args.seed,
        branch_seed: args.branch_seed,
        until: VirtNanos(args.end.0 + 5_000_000_000),
        at: args.at,
        snapshot_every: args.snapshot_every,
        prepared,
        scratch,
        cold: placement.in_helper_vm() && !args.warm,
        place: "host".into(),
    };
    let (session, report) = if placement.in_helper_vm() {
        let (s, r) = helper_session(&plan);
        (Some(s), r)
    } else {
        (None, Some(worker(&plan)))
    };
    let empty = BranchSnapshotsReport::default();
    let report = report.as_ref().unwrap_or(&empty);
    let sides: Vec<SideFigures> = Side::ALL
        .iter()
        .map(|&side| {
            let ok: Vec<_> = report
                .runs
                .iter()
                .filter(|r| r.side == side && r.ok)
                .collect();
            let mut walls: Vec<f64> = ok.iter().map(|r| r.wall_ms).collect();
            SideFigures {
                side,
                runs_ok: ok.len(),
                median_wall_ms: median(&mut walls),
                ratio_to_plain: None,
                first_incremental: ok.first().and_then(|r| r.first_incremental),
                first_pages_stored: ok.first().and_then(|r| r.first_pages_stored),
            }
        })
        .collect();
    let plain = sides[0].median_wall_ms;
    let sides: Vec<SideFigures> = sides
        .into_iter()
        .map(|s| SideFigures {
            ratio_to_plain: ratio(s.median_wall_ms, plain),
            ..s
        })
        .collect();
    let digests: Vec<&str> = report
        .runs
        .iter()
        .filter_map(|r| r.digest.as_deref())
        .collect();
    let one_history = !digests.is_empty() && digests.iter().all(|d| *d == digests[0]);
    println!(
        "branch of {} (seed {}), snapshots every {}; up run {:.1} s",
        report.moment,
        args.branch_seed,
        args.snapshot_every,
        report.up_wall_ms.unwrap_or(0.0) / 1000.0
    );
    println!(
        "{:<34} {:>5} {:>12} {:>9} {:>14}",
        "side", "ok", "median wall", "ratio", "first snapshot"
    );
    for s in &sides {
        let first = match (s.first_incremental, s.first_pages_stored) {
            (Some(incremental), Some(pages)) => {
                format!("{} {pages}p", if incremental { "incr" } else { "full" })
            }
            _ => "-".into(),
        };
        println!(
            "{:<34} {:>5} {:>10.1} s {:>8} {:>14}",
            s.side.name(),
            s.runs_ok,
            s.median_wall_ms.unwrap_or(f64::NAN) / 1000.0,
            s.ratio_to_plain.map_or("-".into(), |r| format!("{r:.2}x")),
            first
        );
    }
    println!(
        "one history (every branch's digest equal): {one_history}; target: keeping snapshots \
         at most 1.5x"
    );
    let error = report
        .error
        .as_deref()
        .or(session.as_ref().and_then(|s| s.error.as_deref()));
    let all_ok =
        error.is_none() && one_history && sides.iter().all(|s| s.runs_ok == args.runs as usize);
    let summary = Summary {
        bench: "branch-snapshots",
        place: placement.name(),
        mem: &args.mem,
        fill_mib_per_node: args.fill,
        moment: &report.moment,
        page_cache_dropped: placement.in_helper_vm() && !args.warm,
        up_wall_ms: report.up_wall_ms,
        sides,
        one_history,
        session: session.as_ref(),
        error,
    };
    println!("{}", serde_json::to_string(&summary)?);
    Ok(if all_ok { 0 } else { 1 })
}
