//! `detvisor bench reverse-step`: issue 31's "reverse-stepi latency as a function of the steps
//! since the last exit and the distance to the nearest snapshot", and the single-step rate in a
//! Linux guest (the ceiling of instruction-granular seeks). The default guest's boot to 1 s with
//! a snapshot at exit 200, then a `detvisor gdb` session's timeline (the gdb-server library, no
//! gdb client) on it: each reverse step is timed from a position reached beforehand.

use crate::campaign_run::{Common, Lines};
use crate::say;
use anyhow::{Context, Result};
use clap::Args;
use gdb_server::Timeline;
use helper_vm::client::Placed;
use run::client::{Calls, InProcess, Runner};
use run::moment::Moment;
use run::plain::GuestSpec;
use run::snapshots::SnapshotPlan;
use std::time::Instant;
use vmm::position::InsnPosition;
use vmm::VirtNanos;

/// The exit the snapshot is taken at (the session's start).
const SNAPSHOT_EXIT: u64 = 200;

#[derive(Args, Debug, Clone)]
pub struct ReverseStepArgs {
    /// Steps into the interval after `--exit` to reverse-step from (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000,10000,30000")]
    pub steps: Vec<u64>,
    /// The interval whose steps are measured (its exit index; its length must pass the
    /// largest of `--steps`).
    #[arg(long, default_value_t = 216)]
    pub exit: u64,
    /// Exits to reverse-step one step from, farther and farther from the snapshot
    /// (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "216,300,400,500,580")]
    pub exits: Vec<u64>,
    #[command(flatten)]
    pub common: Common,
}

fn runner(common: &Common) -> Box<dyn Runner> {
    Box::new(Placed::new(
        helper_vm::placement(common.host_vm),
        InProcess::new,
        None,
        true,
        false,
    ))
}

/// Times `f` in milliseconds.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let value = f();
    (value, start.elapsed().as_secs_f64() * 1000.0)
}

pub fn orchestrate(args: &ReverseStepArgs) -> Result<u8> {
    let setup = args.common.setup("reverse-step", VirtNanos::from_secs(1))?;
    let snaps = setup.dir.join("snaps");
    say!("bench: reverse-step: the default guest to 1 s, a snapshot at exit {SNAPSHOT_EXIT}");
    let guest = GuestSpec {
        until: Some(VirtNanos::from_secs(1)),
        ..GuestSpec::default()
    };
    let plan = SnapshotPlan {
        dir: snaps.clone(),
        every: None,
        at_exits: vec![SNAPSHOT_EXIT],
    };
    let mut make = runner(&args.common);
    Calls::new(&mut *make)
        .run(guest, Some(plan), None, None)
        .map_err(|e| anyhow::anyhow!(e.into_cause()))?;
    drop(make);
    let moment: Moment = format!("{}@exit:{SNAPSHOT_EXIT}", snaps.display())
        .parse()
        .context("the snapshot's moment")?;
    let (timeline, open_ms) = timed(|| Timeline::open(runner(&args.common), moment));
    let mut timeline = timeline?;
    let start = timeline.start();
    let mut out = Lines::default();
    out.line(
        "detvisor bench reverse-step: the default guest's boot, a snapshot at exit 200, \
              a gdb session's timeline on it",
    );
    out.line(format!("machine: {}", setup.machine));
    out.line(format!(
        "opening the session (a helper VM, the restore): {open_ms:.0} ms"
    ));

    // The single-step rate: the largest count of steps into the interval, from its exit.
    let largest = args.steps.iter().copied().max().unwrap_or(1);
    let at = |exit, steps| InsnPosition { exit, steps };
    timeline.goto(at(args.exit, 0))?;
    let (reached, step_ms) = timed(|| timeline.goto(at(args.exit, largest)));
    reached?;
    let rate = largest as f64 / (step_ms / 1000.0);
    out.line(format!(
        "single steps: {largest} in {step_ms:.0} ms from exit {}: {rate:.0} steps/s \
         (one request; the unstepped rate of a bare guest is in bench/insn-probe-results.txt)",
        args.exit
    ));

    out.line(format!(
        "reverse-stepi from exit:{}+insn:K, the nearest checkpoint the snapshot ({start}), \
         then one kept at exit:{}:",
        args.exit, args.exit
    ));
    out.line(format!(
        "{:>8} {:>16} {:>20}",
        "K", "from the snapshot", "from exit:N's checkpoint"
    ));
    let mut json_steps = Vec::new();
    for &k in &args.steps {
        timeline.goto(at(args.exit, k))?;
        let (stepped, far_ms) = timed(|| timeline.reverse_step());
        stepped?;
        json_steps.push((k, far_ms));
        out.line(format!("{k:>8} {far_ms:>14.0} ms {:>20}", "-"));
    }
    // The same with a checkpoint kept at the interval's exit.
    timeline.goto(at(args.exit, 0))?;
    timeline.keep_here()?;
    let mut json_near = Vec::new();
    for &k in &args.steps {
        timeline.goto(at(args.exit, k))?;
        let (stepped, near_ms) = timed(|| timeline.reverse_step());
        stepped?;
        json_near.push((k, near_ms));
        out.line(format!("{k:>8} {:>16} {near_ms:>17.0} ms", "-"));
    }
    timeline.forget_kept()?;

    out.line(format!(
        "reverse-stepi from exit:N+insn:1 and from exit:N (into the interval before), \
         the nearest checkpoint the snapshot at exit {SNAPSHOT_EXIT}:"
    ));
    out.line(format!(
        "{:>8} {:>10} {:>16} {:>16}",
        "N", "exits back", "from +insn:1", "from +insn:0"
    ));
    let mut json_exits = Vec::new();
    for &n in &args.exits {
        let one = match timeline.goto(at(n, 1)) {
            Ok(()) => {
                let (stepped, ms) = timed(|| timeline.reverse_step());
                stepped.map(|_| ms).ok()
            }
            Err(_) => None,
        };
        timeline.goto(at(n, 0))?;
        let (stepped, zero_ms) = timed(|| timeline.reverse_step());
        let zero = stepped.map(|_| zero_ms).ok();
        let show = |ms: Option<f64>| ms.map_or("n/a".to_string(), |ms| format!("{ms:.0} ms"));
        out.line(format!(
            "{n:>8} {:>10} {:>16} {:>16}",
            n - SNAPSHOT_EXIT,
            show(one),
            show(zero)
        ));
        json_exits.push((n, one, zero));
    }
    timeline.close()?;
    out.line(
        serde_json::json!({
            "bench": "reverse-step",
            "open_ms": open_ms,
            "steps_per_s": rate,
            "from_snapshot_ms": json_steps,
            "from_exit_checkpoint_ms": json_near,
            "exits_back_ms": json_exits,
        })
        .to_string(),
    );
    args.common
        .finish(&setup, "reverse-step", &out, args.common.results.is_none())
}
