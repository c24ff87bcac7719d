//! The `bench etcd` report: a summary of each side's runs, the ratios, the table and the final
//! JSON line.

use anyhow::Result;
use serde::Serialize;
use std::io::{self, Write};
use std::path::Path;

use super::EtcdArgs;
use crate::etcd_worker::EtcdRun;
use crate::machine::HostLoad;
use crate::report::{run_failures, RunTimes, Session, Where};
use crate::stats::{fmt_s, median_u64, opt_count, opt_ratio, ratio};
use helper_vm::Placement;
use vmm::VirtNanos;

/// The measurements of one side.
#[derive(Default)]
pub struct Side {
    pub runs: Vec<EtcdRun>,
    pub error: Option<String>,
    pub skipped: Option<String>,
    pub command: Vec<String>,
}

#[derive(Serialize, Default)]
pub struct Summary {
    pub name: String,
    pub place: String,
    #[serde(flatten)]
    pub times: RunTimes,
    pub exits: Option<u64>,
    /// `exits` per second of the median wall time.
    pub exits_per_s: Option<f64>,
    /// detvisor's `vm::run` (median, ms).
    pub inner_wall_ms: Option<u64>,
    /// Whether every successful run gave the same output (detvisor: the run digest; QEMU: the
    /// serial bytes).
    pub output_identical: Option<bool>,
    pub outputs: Vec<Option<String>>,
    pub output_bytes: Option<u64>,
    pub workload_tail: Option<String>,
    pub error: Option<String>,
    pub skipped: Option<String>,
    pub failures: Vec<String>,
    pub command: Vec<String>,
}

fn summarize(name: &str, place: &str, side: &Side) -> Summary {
    let ok: Vec<&EtcdRun> = side.runs.iter().filter(|r| r.ok).collect();
    let times = RunTimes::of(side.runs.iter().map(|r| (r.ok, r.wall_ms, r.virtual_ns)));
    let exits = median_u64(ok.iter().filter_map(|r| r.exits));
    let outputs: Vec<&String> = ok.iter().filter_map(|r| r.output.as_ref()).collect();
    let mut error = side.error.clone();
    if error.is_none() && !side.runs.is_empty() && ok.is_empty() {
        error = Some("every run failed".into());
    }
    Summary {
        name: name.into(),
        place: place.into(),
        exits,
        exits_per_s: ratio(exits.map(|e| e as f64), times.median_s),
        inner_wall_ms: median_u64(ok.iter().filter_map(|r| r.inner_wall_ms)),
        output_identical: (outputs.len() >= 2).then(|| outputs.iter().all(|o| *o == outputs[0])),
        outputs: side.runs.iter().map(|r| r.output.clone()).collect(),
        output_bytes: ok.first().and_then(|r| r.output_bytes),
        workload_tail: ok
            .first()
            .copied()
            .or(side.runs.first())
            .and_then(|r| r.workload_tail.clone()),
        error,
        skipped: side.skipped.clone(),
        failures: run_failures(side.runs.iter().map(|r| r.error.as_ref())),
        command: side.command.clone(),
        times,
    }
}

#[derive(Serialize)]
pub struct Ratios {
    pub detvisor_over_baseline: Option<f64>,
    pub baseline_over_detvisor: Option<f64>,
}

#[derive(Serialize)]
pub struct Report {
    pub benchmark: &'static str,
    pub scenario: &'static str,
    pub manifest: String,
    pub runs: u32,
    pub mem: String,
    pub seed: u64,
    /// As `--until` reads it back (`300s`).
    #[serde(serialize_with = "crate::report::as_text")]
    pub until: VirtNanos,
    pub cmdline: String,
    #[serde(flatten)]
    pub place: Where,
    pub caveat: Option<String>,
    pub clock: &'static str,
    pub baseline_differences: &'static str,
    pub detvisor: Summary,
    pub qemu_tcg_icount: Summary,
    pub ratios: Ratios,
    pub helper_vm: Option<Session>,
    #[serde(flatten)]
    pub host: HostLoad,
    pub all_ok: bool,
}

pub struct Inputs<'a> {
    pub args: &'a EtcdArgs,
    pub manifest: &'a Path,
    pub mem: &'a str,
    pub cmdline: &'a str,
    pub placement: &'a Placement,
    pub detvisor: &'a Side,
    pub baseline: &'a Side,
    pub session: Option<Session>,
    pub loadavg_before: Option<[f64; 3]>,
}

const BASELINE_DIFFERENCES: &str = "the baseline runs the same kernel and initrd bytes with a \
    script in place of the agent: a bridge with veths instead of detvisor's switch (no link \
    latency), net/UTS/IPC namespaces (no PID or mount namespace), the workload with its node's \
    environment under its own";

pub fn build(i: Inputs) -> Report {
    let place = i.placement.name();
    let detvisor = summarize("detvisor up", place, i.detvisor);
    let baseline = summarize("QEMU TCG -icount shift=0", "host", i.baseline);
    let caveat = i.placement.in_helper_vm().then(|| {
        "detvisor runs in nested KVM inside the helper VM, itself QEMU TCG (this host's KVM \
         cannot run guests): every guest instruction detvisor runs is emulated twice over, so \
         the ratio is not the hardware figure"
            .to_string()
    });
    let side_ok = |s: &Summary| s.skipped.is_some() || (s.error.is_none() && s.times.all_ok());
    let all_ok = side_ok(&detvisor)
        && side_ok(&baseline)
        && i.session.as_ref().is_none_or(|s| s.error.is_none());
    Report {
        benchmark: "etcd",
        scenario: "3 etcd members healthy, a put and a get (workload etcd-smoke)",
        manifest: i.manifest.display().to_string(),
        runs: i.args.runs,
        mem: i.mem.into(),
        seed: i.args.seed,
        until: i.args.until,
        cmdline: i.cmdline.into(),
        place: Where::from(i.placement),
        caveat,
        clock: "wall time from just before spawn() to wait() returning (QEMU), from just before \
                the run's thread starts to the request's return (detvisor, in process), \
                CLOCK_MONOTONIC of the machine it runs on (L1's for the helper VM)",
        baseline_differences: BASELINE_DIFFERENCES,
        ratios: Ratios {
            detvisor_over_baseline: ratio(detvisor.times.median_s, baseline.times.median_s),
            baseline_over_detvisor: ratio(baseline.times.median_s, detvisor.times.median_s),
        },
        detvisor,
        qemu_tcg_icount: baseline,
        helper_vm: i.session,
        host: HostLoad::since(i.loadavg_before),
        all_ok,
    }
}

pub fn print(r: &Report) -> Result<()> {
    let mut o = io::stdout().lock();
    writeln!(
        o,
        "detvisor bench etcd: {} ({}); {} RAM; {} run(s) per side; detvisor seed {}",
        r.scenario, r.manifest, r.mem, r.runs, r.seed
    )?;
    writeln!(o, "kernel cmdline (both): {}", r.cmdline)?;
    writeln!(o, "{}", r.host.line())?;
    if let Some(c) = &r.caveat {
        writeln!(o, "CAVEAT: {c}")?;
    }
    writeln!(
        o,
        "wall = QEMU: process start to exit (spawn .. wait returns); detvisor: the up request's \
         call to its return (in process); seconds, on the clock of the machine running it; \
         virtual = guest time at the end"
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "{:<26} {:<10} {:>5} {:<28} {:>8} {:>9} {:>10} {:>8} {:>10}",
        "system",
        "where",
        "ok",
        "wall s per run",
        "median",
        "virtual",
        "exits",
        "exits/s",
        "identical"
    )?;
    for s in [&r.detvisor, &r.qemu_tcg_icount] {
        if let Some(why) = &s.skipped {
            writeln!(o, "{:<26} {:<10} skipped ({why})", s.name, s.place)?;
            continue;
        }
        let identical = match s.output_identical {
            Some(true) => "yes".to_string(),
            Some(false) => "NO".to_string(),
            None => "n/a".to_string(),
        };
        writeln!(
            o,
            "{:<26} {:<10} {:>5} {:<28} {:>8} {:>9} {:>10} {:>8} {:>10}",
            s.name,
            s.place,
            s.times.tally(),
            s.times.per_run(),
            fmt_s(s.times.median_s),
            s.times.virtual_s.map_or("-".into(), |v| format!("{v:.3}")),
            opt_count(s.exits),
            s.exits_per_s.map_or("n/a".into(), |v| format!("{v:.0}")),
            identical,
        )?;
    }
    writeln!(o, "(! = failed run; QEMU TCG has no VM exits)")?;
    if let Some(s) = r.helper_vm.as_ref() {
        writeln!(
            o,
            "helper VM: boot {} s, shutdown {} s, whole session {} s (not in the wall times)",
            fmt_s(s.boot_ms.map(|v| v / 1000.0)),
            fmt_s(s.shutdown_ms.map(|v| v / 1000.0)),
            fmt_s(Some(s.total_ms / 1000.0))
        )?;
    }
    if let Some(w) = r.detvisor.inner_wall_ms {
        writeln!(
            o,
            "detvisor's own vm::run (its JSON, median): {:.1} s of its {} s",
            w as f64 / 1000.0,
            fmt_s(r.detvisor.times.median_s)
        )?;
    }
    writeln!(o, "\nratios of median wall times:")?;
    writeln!(
        o,
        "  detvisor / QEMU TCG icount   {}",
        opt_ratio(r.ratios.detvisor_over_baseline)
    )?;
    writeln!(
        o,
        "  QEMU TCG icount / detvisor   {}",
        opt_ratio(r.ratios.baseline_over_detvisor)
    )?;
    writeln!(o, "\nsame output in every successful run:")?;
    for (s, what) in [
        (
            &r.detvisor,
            "run digest: console incl. the agent's messages, memory, devices",
        ),
        (&r.qemu_tcg_icount, "FNV-1a 64 of the serial bytes"),
    ] {
        let verdict = match s.output_identical {
            Some(true) => format!("identical in {} runs", s.times.ok_runs),
            Some(false) => format!("DIFFERENT across {} runs", s.times.ok_runs),
            None => "n/a (fewer than 2 successful runs)".into(),
        };
        let outs = s
            .outputs
            .iter()
            .map(|o| o.as_deref().unwrap_or("-"))
            .collect::<Vec<_>>()
            .join(" ");
        writeln!(
            o,
            "  {:<26} {verdict} ({what}: {outs}; {} bytes)",
            s.name,
            opt_count(s.output_bytes)
        )?;
    }
    writeln!(o, "\nbaseline differences: {}", r.baseline_differences)?;
    for s in [&r.detvisor, &r.qemu_tcg_icount] {
        if let Some(t) = &s.workload_tail {
            writeln!(o, "\n{}: the workload's output ends with:\n{t}", s.name)?;
        }
    }
    let failures: Vec<(&str, Option<&String>, &[String])> = [&r.detvisor, &r.qemu_tcg_icount]
        .into_iter()
        .map(|s| (s.name.as_str(), s.error.as_ref(), s.failures.as_slice()))
        .collect();
    let helper_error = r.helper_vm.as_ref().and_then(|s| s.error.as_ref());
    crate::boot_report::print_tail(&mut o, &failures, helper_error, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A side's summary is written as it always was (the JSON line of `bench etcd`).
    #[test]
    fn a_summary_serializes_as_before() {
        let ok = EtcdRun {
            ok: true,
            wall_ms: 2500.0,
            status: Some(0),
            virtual_ns: Some(VirtNanos(12_000_000_000)),
            exits: Some(400),
            inner_wall_ms: Some(2400),
            output: Some("d1".into()),
            output_bytes: Some(10),
            workload_tail: Some("put ok".into()),
            ..EtcdRun::default()
        };
        let side = Side {
            runs: vec![ok.clone(), EtcdRun::failed(&anyhow::anyhow!("boom")), ok],
            error: None,
            skipped: None,
            command: vec!["up".into()],
        };
        let summary = summarize("detvisor", "host", &side);
        let json = r#"{"name":"detvisor","place":"host","runs":3,"ok_runs":2,"wall_s":[2.5,0.0,2.5],"ok":[true,false,true],"median_s":2.5,"min_s":2.5,"max_s":2.5,"virtual_s":12.0,"exits":400,"exits_per_s":160.0,"inner_wall_ms":2400,"output_identical":true,"outputs":["d1",null,"d1"],"output_bytes":10,"workload_tail":"put ok","error":null,"skipped":null,"failures":["run 2: boom"],"command":["up"]}"#;
        assert_eq!(serde_json::to_string(&summary).unwrap(), json);
    }

    /// `--until` is read once, by clap, and the report's JSON line holds it as the text
    /// the flag reads back, as when the report held the flag's string (`"300s"`).
    #[test]
    fn the_until_flag_is_typed_and_reported_as_its_text() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: EtcdArgs,
        }
        let side = Side::default();
        let until = |argv: &[&str]| {
            let args = Cli::try_parse_from(argv)?.args;
            let report = build(Inputs {
                args: &args,
                manifest: Path::new("etcd.toml"),
                mem: "1G",
                cmdline: "console=ttyS0",
                placement: &Placement::HelperVm {
                    reason: "test".into(),
                },
                detvisor: &side,
                baseline: &side,
                session: None,
                loadavg_before: None,
            });
            assert_eq!(report.until, args.until);
            Ok::<_, clap::Error>(serde_json::to_value(&report).unwrap()["until"].clone())
        };
        assert_eq!(until(&["x"]).unwrap(), "300s");
        assert_eq!(until(&["x", "--until", "2.5s"]).unwrap(), "2.5s");
        assert_eq!(until(&["x", "--until", "90"]).unwrap(), "90s");
        let refused = until(&["x", "--until", "soon"]).unwrap_err();
        assert_eq!(refused.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(
            refused.to_string().contains("unparsable duration \"soon\""),
            "{refused}"
        );
    }
}
