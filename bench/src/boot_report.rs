//! The `bench boot` report: a summary of each system's runs, the ratios, the table and the
//! final JSON line.

use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, Write};

use super::boot_worker::SystemResult;
use super::machine::HostLoad;
use super::monitor::MemoryPeak;
use super::report::{run_failures, RunResult, Session, Where};
use super::stats::{median_u64, mib, opt_count, opt_ms, opt_rate, opt_ratio, stat};

#[derive(Serialize, Default)]
pub struct Summary {
    pub name: String,
    pub place: String,
    pub runs: usize,
    pub ok_runs: usize,
    pub median_ms: Option<f64>,
    pub min_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub wall_ms: Vec<f64>,
    /// Exits to the VMM (detvisor only), median over runs.
    pub vmm_exits: Option<u64>,
    pub vmm_exits_per_sec: Option<f64>,
    /// All VM exits KVM handled for the guest (per-VM debugfs `exits`), in the instrumented run;
    /// per second of that run's wall time.
    pub kvm_exits: Option<u64>,
    pub kvm_exits_per_sec: Option<f64>,
    pub kvm_stats: Option<BTreeMap<String, u64>>,
    pub instrumented_wall_ms: Option<f64>,
    /// How many runs' outputs `output_identical` compares.
    pub output_runs: usize,
    /// detvisor's own phases (median of its JSON): vm::run total, setup, final hashing.
    pub inner_wall_ms: Option<u64>,
    pub inner_setup_ms: Option<u64>,
    pub inner_finish_ms: Option<u64>,
    /// Whether the guest output is byte-identical across the successful runs (detvisor: the
    /// run digest, which covers the console, memory and devices; QEMU: the serial bytes).
    pub output_identical: Option<bool>,
    pub output: Option<String>,
    pub output_bytes: Option<u64>,
    pub memory: Option<MemoryPeak>,
    pub memory_error: Option<String>,
    pub error: Option<String>,
    pub skipped: Option<String>,
    pub failures: Vec<String>,
    pub command: Vec<String>,
}

pub fn summarize(name: &str, place: &str, sys: &SystemResult) -> Summary {
    let ok: Vec<&RunResult> = sys.runs.iter().filter(|r| r.ok).collect();
    let walls = stat(ok.iter().map(|r| r.wall_ms));
    let med = walls.median;
    let per_sec = |count: Option<u64>| match (count, med) {
        (Some(c), Some(m)) if m > 0.0 => Some(c as f64 / (m / 1000.0)),
        _ => None,
    };
    let vmm_exits = median_u64(ok.iter().filter_map(|r| r.vmm_exits));
    let instrumented = sys.instrumented.as_ref().filter(|r| r.ok);
    let kvm_stats = instrumented.and_then(|r| r.kvm.clone());
    let kvm_exits = kvm_stats.as_ref().and_then(|k| k.get("exits").copied());
    let kvm_exits_per_sec = match (kvm_exits, instrumented) {
        (Some(e), Some(r)) if r.wall_ms > 0.0 => Some(e as f64 / (r.wall_ms / 1000.0)),
        _ => None,
    };
    // Determinism of the output: every successful run, the instrumented one included.
    let outputs: Vec<&String> = ok
        .iter()
        .copied()
        .chain(instrumented)
        .filter_map(|r| r.output.as_ref())
        .collect();
    let output_identical = (outputs.len() >= 2).then(|| outputs.iter().all(|o| *o == outputs[0]));
    let mut error = sys.error.clone();
    if error.is_none() && !sys.runs.is_empty() && ok.is_empty() {
        error = Some("every run failed".into());
    }
    Summary {
        name: name.into(),
        place: place.into(),
        runs: sys.runs.len(),
        ok_runs: ok.len(),
        median_ms: med,
        min_ms: walls.min,
        max_ms: walls.max,
        wall_ms: sys.runs.iter().map(|r| r.wall_ms).collect(),
        vmm_exits,
        vmm_exits_per_sec: per_sec(vmm_exits),
        kvm_exits,
        kvm_exits_per_sec,
        kvm_stats,
        instrumented_wall_ms: instrumented.map(|r| r.wall_ms),
        output_runs: outputs.len(),
        inner_wall_ms: median_u64(ok.iter().filter_map(|r| r.inner_wall_ms)),
        inner_setup_ms: median_u64(ok.iter().filter_map(|r| r.inner_setup_ms)),
        inner_finish_ms: median_u64(ok.iter().filter_map(|r| r.inner_finish_ms)),
        output_identical,
        output: ok.first().and_then(|r| r.output.clone()),
        output_bytes: ok.first().and_then(|r| r.output_bytes),
        memory: sys.memory.clone(),
        memory_error: sys.memory_error.clone(),
        error,
        skipped: sys.skipped.clone(),
        failures: run_failures(sys.runs.iter().map(|r| r.error.as_ref())),
        command: sys.command.clone(),
    }
}

#[derive(Serialize)]
pub struct Ratios {
    pub detvisor_over_qemu_kvm: Option<f64>,
    pub detvisor_end_to_end_over_qemu_tcg_icount: Option<f64>,
    pub detvisor_process_over_qemu_tcg_icount: Option<f64>,
    pub detvisor_vm_run_over_qemu_tcg_icount: Option<f64>,
}

#[derive(Serialize)]
pub struct BenchReport {
    pub benchmark: &'static str,
    pub guest_command: &'static str,
    pub runs: u32,
    pub mem: &'static str,
    pub cmdline: String,
    pub qemu_machine: &'static str,
    #[serde(flatten)]
    pub place: Where,
    pub clock: &'static str,
    pub kvm_stats: Option<String>,
    pub detvisor: Summary,
    pub qemu_kvm: Summary,
    pub qemu_tcg_icount: Summary,
    pub detvisor_end_to_end: Summary,
    pub helper_vm: Option<Session>,
    pub ratios: Ratios,
    /// The host's 1/5/15-minute load averages before and after (other work on the machine
    /// makes the numbers noisy), and its CPU count.
    #[serde(flatten)]
    pub host: HostLoad,
    pub all_ok: bool,
}

impl BenchReport {
    /// The four systems, in the table's order.
    fn systems(&self) -> [&Summary; 4] {
        [
            &self.detvisor,
            &self.qemu_kvm,
            &self.qemu_tcg_icount,
            &self.detvisor_end_to_end,
        ]
    }
}

pub fn print_report(r: &BenchReport) -> Result<()> {
    let mut o = io::stdout().lock();
    writeln!(
        o,
        "detvisor bench boot: default guest runs `{}`; {} RAM; {} run(s) per system; QEMU -M {}",
        r.guest_command, r.mem, r.runs, r.qemu_machine
    )?;
    writeln!(o, "kernel cmdline (all systems): {}", r.cmdline)?;
    writeln!(o, "{}", r.host.line())?;
    writeln!(
        o,
        "wall = QEMU: process start to exit (spawn .. wait returns); detvisor: the run request's \
         call to its return (in process); ms, on the clock of the machine running it; median \
         [min .. max] over successful runs"
    )?;
    writeln!(o)?;
    writeln!(
        o,
        "{:<26} {:<24} {:>5} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}",
        "system",
        "where",
        "ok",
        "median",
        "min",
        "max",
        "VMM exits",
        "VMM ex/s",
        "KVM exits",
        "KVM ex/s"
    )?;
    for s in r.systems() {
        if let Some(why) = &s.skipped {
            writeln!(o, "{:<26} {:<24} skipped ({why})", s.name, s.place)?;
            continue;
        }
        if s.ok_runs == 0 {
            writeln!(
                o,
                "{:<26} {:<24} {:>5} FAILED (see failures below)",
                s.name,
                s.place,
                format!("{}/{}", s.ok_runs, s.runs)
            )?;
            continue;
        }
        writeln!(
            o,
            "{:<26} {:<24} {:>5} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10}",
            s.name,
            s.place,
            format!("{}/{}", s.ok_runs, s.runs),
            opt_ms(s.median_ms),
            opt_ms(s.min_ms),
            opt_ms(s.max_ms),
            opt_count(s.vmm_exits),
            opt_rate(s.vmm_exits_per_sec),
            opt_count(s.kvm_exits),
            opt_rate(s.kvm_exits_per_sec),
        )?;
    }
    if let Some(s) = r.helper_vm.as_ref().filter(|s| s.boot_ms.is_none()) {
        writeln!(
            o,
            "{:<26} {:<24} {:>5} FAILED (see failures below)",
            "helper VM overhead",
            "host",
            if s.error.is_none() { "1/1" } else { "0/1" },
        )?;
    }
    if let Some(s) = r.helper_vm.as_ref().filter(|s| s.boot_ms.is_some()) {
        writeln!(
            o,
            "{:<26} {:<24} {:>5} {:>9}   boot {} ms + shutdown {} ms (L1 uptime at payload start {} s)",
            "helper VM overhead",
            "host",
            if s.error.is_none() { "1/1" } else { "0/1" },
            opt_ms(match (s.boot_ms, s.shutdown_ms) {
                (Some(b), Some(d)) => Some(b + d),
                _ => None,
            }),
            opt_ms(s.boot_ms),
            opt_ms(s.shutdown_ms),
            s.l1_uptime_at_payload_s
                .map_or("-".into(), |u| format!("{u:.2}")),
        )?;
    }
    writeln!(o)?;
    let d = &r.detvisor;
    if let (Some(w), Some(setup), Some(finish)) =
        (d.inner_wall_ms, d.inner_setup_ms, d.inner_finish_ms)
    {
        writeln!(
            o,
            "detvisor's own phases (its JSON, medians): vm::run {w} ms = setup {setup} + guest \
             {} + final hashing {finish}; the rest of its {} ms is reading the kernel and \
             initrd, and VM teardown",
            w.saturating_sub(setup + finish),
            opt_ms(d.median_ms)
        )?;
    }
    if let Some(k) = &r.kvm_stats {
        if k == "debugfs" {
            writeln!(
                o,
                "VMM exits: exits detvisor's own loop handled (its JSON), per second of the median \
                 wall. KVM exits: all exits of the guest's VM, handled in L1's kernel or not (per-VM \
                 debugfs `exits`), in the instrumented run, per second of that run's wall"
            )?;
        } else {
            writeln!(o, "KVM exits: not available ({k})")?;
        }
    }
    writeln!(o, "\nratios of median wall times:")?;
    let place = r.place.placement;
    for (label, value) in [
        (
            format!("detvisor / QEMU-KVM (both in the {place})"),
            r.ratios.detvisor_over_qemu_kvm,
        ),
        (
            "detvisor end to end (host) / QEMU TCG icount (host)".to_string(),
            r.ratios.detvisor_end_to_end_over_qemu_tcg_icount,
        ),
        (
            format!("detvisor process ({place}) / QEMU TCG icount (host)"),
            r.ratios.detvisor_process_over_qemu_tcg_icount,
        ),
        (
            format!("detvisor vm::run only ({place}) / QEMU TCG icount (host)"),
            r.ratios.detvisor_vm_run_over_qemu_tcg_icount,
        ),
    ] {
        writeln!(o, "  {label:<62} {}", opt_ratio(value))?;
    }
    writeln!(
        o,
        "\nsame guest output in every successful run (timed and instrumented):"
    )?;
    for (s, what) in [
        (&r.detvisor, "run digest (console, memory, devices)"),
        (&r.qemu_kvm, "serial bytes"),
        (&r.qemu_tcg_icount, "serial bytes"),
    ] {
        let verdict = match s.output_identical {
            Some(true) => format!("identical in {} runs", s.output_runs),
            Some(false) => format!("DIFFERENT across {} runs", s.output_runs),
            None => {
                writeln!(o, "  {:<26} n/a (fewer than 2 successful runs)", s.name)?;
                continue;
            }
        };
        writeln!(
            o,
            "  {:<26} {verdict} ({what}: {}, {} bytes)",
            s.name,
            s.output.as_deref().unwrap_or("-"),
            opt_count(s.output_bytes)
        )?;
    }
    writeln!(
        o,
        "\npeak memory (instrumented run, /proc/<pid>/status and smaps sampled every 20 ms):"
    )?;
    for s in [&r.detvisor, &r.qemu_kvm, &r.qemu_tcg_icount] {
        match (&s.memory, &s.memory_error) {
            (Some(m), _) => writeln!(
                o,
                "  {:<26} VmHWM {}; guest RAM {} of which {} resident; beyond guest RAM {} \
                 (guest mapping: {})",
                s.name,
                mib(m.vm_hwm_kib),
                mib(m.guest_ram_kib),
                mib(m.guest_ram_resident_kib),
                mib(m.beyond_guest_ram_kib),
                m.guest_mapping
            )?,
            (None, Some(e)) => writeln!(o, "  {:<26} n/a: {e}", s.name)?,
            (None, None) => writeln!(o, "  {:<26} n/a", s.name)?,
        }
    }
    if let Some(s) = r.helper_vm.as_ref().filter(|s| s.boot_ms.is_some()) {
        writeln!(
            o,
            "\nhelper VM: start to payload serving {} ms (incl. assembling a {} MiB payload \
             initrd and L1's boot), payload end to exit {} ms; payload lasted {} ms on the host's \
             clock, {} ms on L1's",
            opt_ms(s.boot_ms),
            s.payload_file_bytes >> 20,
            opt_ms(s.shutdown_ms),
            opt_ms(s.payload_host_ms),
            opt_ms(s.payload_l1_ms)
        )?;
    }
    let failures: Vec<(&str, Option<&String>, &[String])> = r
        .systems()
        .into_iter()
        .map(|s| (s.name.as_str(), s.error.as_ref(), s.failures.as_slice()))
        .collect();
    let helper_error = r.helper_vm.as_ref().and_then(|s| s.error.as_ref());
    print_tail(&mut o, &failures, helper_error, r)
}

/// The end of a report (this one's and `bench etcd`'s): the failures of each system (name,
/// error, failures) and of the helper VM, then the report as one JSON line.
pub fn print_tail(
    o: &mut dyn Write,
    systems: &[(&str, Option<&String>, &[String])],
    helper_error: Option<&String>,
    report: &impl Serialize,
) -> Result<()> {
    let mut failed = false;
    for (name, error, failures) in systems {
        if error.is_some() || !failures.is_empty() {
            if !failed {
                writeln!(o, "\nfailures:")?;
                failed = true;
            }
            if let Some(e) = error {
                writeln!(o, "  {name}: {e}")?;
            }
            for f in *failures {
                writeln!(o, "  {name}: {f}")?;
            }
        }
    }
    if let Some(e) = helper_error {
        if !failed {
            writeln!(o, "\nfailures:")?;
        }
        writeln!(o, "  helper VM: {e}")?;
    }
    writeln!(o)?;
    writeln!(o, "{}", serde_json::to_string(report)?)?;
    o.flush()?;
    Ok(())
}
