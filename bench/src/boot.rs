//! `detvisor bench boot [--runs N]` boots the default guest image and runs `true` with:
//!
//! 1. **detvisor** (deterministic): the run `detvisor run -- true` makes
//!    (`run::api::Request::Run`), carried out by the run library in the worker's process on a
//!    thread of its own, inside the helper VM (L1) when the host's KVM cannot run guests, else
//!    on the host.
//! 2. **QEMU with KVM** (non-deterministic baseline): `qemu-system-x86_64 -accel kvm -M pc`
//!    booting the same kernel (the cache's `bzImage`, built with the `vmlinux` detvisor boots),
//!    the same initrd bytes (`guest::initrd_with_command`, written to a file), the same kernel
//!    command line (`guest::default_cmdline()`) and the same RAM, in the *same* L1 session as
//!    (1), runs interleaved (detvisor 1, QEMU 1, detvisor 2, ...). The host's QEMU binary, the
//!    shared libraries `ldd` resolves for it and the firmware `-M pc` loads with `-kernel`
//!    (`bios-256k.bin`, `linuxboot_dma.bin`, `kvmvapic.bin`, found with strace) are shipped into
//!    L1 as payload files and run with `LD_LIBRARY_PATH` and `-L`.
//! 3. **QEMU TCG with `-icount shift=0,sleep=off -rtc clock=vm`** (the deterministic peer) on
//!    the host, same kernel/initrd/cmdline/RAM; its serial output is compared across runs.
//! 4. When a helper VM is used: **detvisor end to end**, what `detvisor run -- true` does on
//!    the host as a user runs it: a helper VM started for the one request, the request answered
//!    there by the run library, the helper VM shut down (one helper VM boot per run).
//!
//! Every QEMU gets `-nodefaults -no-user-config -display none -no-reboot`, the serial port in a
//! file and an `isa-debugcon` at port 0x610 that captures the status byte the guest's init
//! writes there (detvisor ends the run at that write; QEMU ignores it and the init's
//! `reboot -f` with `reboot=t` triple-faults, which `-no-reboot` turns into an exit).
//!
//! Wall time of a QEMU run = from just before `spawn()` to the moment `wait()` returns (fork,
//! exec, boot, guest, exit, reap); of a detvisor run, from just before its thread starts to the
//! request's return (VM creation, boot, guest, VM teardown; no exec and no process exit). Both
//! are measured with the monotonic clock of the machine the process runs
//! on (L1's own clock inside the helper VM; under TCG without icount it follows the host's real
//! time). Waiting is blocking (a thread in `wait()`), so the timed runs are not disturbed by
//! polling; one extra *instrumented* run per system samples `/proc/<pid>/status` and
//! `/proc/<pid>/smaps` every 20 ms for the peak memory (for detvisor: the worker's own, its
//! high-water mark reset first through `/proc/self/clear_refs`) and, inside the helper VM, holds the VM's
//! per-VM KVM debugfs statistics open to read its exit counts after it ends. That run is not part
//! of the wall-time statistics.
//!
//! Inside the helper VM the worker ([`worker`] of [`super::boot_worker`]) is answered by the
//! bench server there ([`super::serve`]); see [`super::helper`].

use anyhow::{anyhow, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::boot_report::{print_report, summarize, BenchReport, Ratios};
use super::boot_worker::{
    describe, detvisor_guest, detvisor_result, record_instrumented, request_words, worker,
    BootWorkerReport, SystemResult, WorkerPlan, GUEST_COMMAND,
};
use super::helper::{call_vm, HelperLaunch, HELPER_VM_ALLOWANCE};
use super::machine::{loadavg, HostLoad, TempDir};
use super::process::{command_words, run_in_process, Watch};
use super::qemu::{discover_qemu, Accel, QemuFiles, QemuInstall, QemuRun, QEMU_MACHINE};
use super::report::{because, Session, Where, NOT_MEASURED};
use super::serve::{BenchCall, BenchReply};
use super::stats::ratio;
use super::{check_runs_and_timeout, BootArgs};
use crate::say;

use run::{guest, units};

/// Guest RAM of every system.
const GUEST_MEM: &str = "256M";

/// Runs the worker in the helper VM: `host_plan`'s kernels and initrds, QEMU, its libraries and
/// its firmware shipped as payload files.
fn helper_session(
    host_plan: &WorkerPlan,
    qemu: &Result<QemuInstall>,
) -> (Session, Option<BootWorkerReport>) {
    Session::record(|session| {
        let mut files: Vec<(PathBuf, String)> = vec![
            (host_plan.kernel.clone(), "bench/vmlinux".into()),
            (host_plan.initrd.clone(), "bench/initrd".into()),
            (host_plan.bzimage.clone(), "bench/bzImage".into()),
            (host_plan.qemu_initrd.clone(), "bench/initrd-cmd".into()),
        ];
        let qemu_plan = match qemu {
            Ok(q) => Some(q.ship(&mut files)?),
            Err(_) => None,
        };
        let plan = WorkerPlan {
            kernel: helper_vm::payload_path("bench/vmlinux").into(),
            initrd: helper_vm::payload_path("bench/initrd").into(),
            bzimage: helper_vm::payload_path("bench/bzImage").into(),
            qemu_initrd: helper_vm::payload_path("bench/initrd-cmd").into(),
            qemu: qemu_plan,
            in_helper_vm: true,
            place: "helper VM".into(),
            ..host_plan.clone()
        };
        let launch = HelperLaunch {
            memory_mib: ((plan.ram_bytes >> 20) as u32)
                .saturating_add(1024)
                .max(2048),
            files,
            shared_dirs: Vec::new(),
        };
        launch.run(&BenchCall::Boot(plan), session, |s| {
            format!(
                "bench: starting the helper VM ({} MiB of payload files)",
                s.payload_file_bytes >> 20
            )
        })
    })
}

/// QEMU TCG with icount on the host: `runs` timed runs and one memory run.
fn tcg_baseline(plan: &WorkerPlan, qemu: &Result<QemuInstall>, tmp: &Path) -> SystemResult {
    let mut sys = SystemResult::default();
    let q = match qemu {
        Ok(q) => q.on_host(),
        Err(e) => {
            sys.error = Some(format!("{e:#}"));
            return sys;
        }
    };
    let run = QemuRun {
        q: &q,
        accel: Accel::TcgIcount,
        files: QemuFiles {
            bzimage: &plan.bzimage,
            initrd: &plan.qemu_initrd,
            cmdline: &plan.cmdline,
            mem: GUEST_MEM,
        },
        scratch: tmp,
        label: "qemu-tcg",
        limit: Duration::from_secs(plan.timeout_s),
        ram_bytes: plan.ram_bytes,
    };
    sys.command = command_words(&run.command(0).0);
    let n = plan.runs;
    for i in 1..=n {
        let (r, _) = run.run(i, false, false);
        say!(
            "bench [host]: QEMU TCG icount run {i}/{n}: {}",
            describe(&r)
        );
        sys.runs.push(r);
    }
    let (r, mem) = run.run(n + 1, true, false);
    record_instrumented(&mut sys, "bench [host]", "QEMU TCG icount", r, mem);
    sys
}

/// detvisor as a user runs it on this host (`detvisor run --mem 256M -- true` with the default
/// guest: a helper VM started for the one request, its kernel and initrd shipped, the request
/// answered there by the run library, the helper VM shut down), timed from just before the
/// helper VM starts to its exit.
fn end_to_end(args: &BootArgs, plan: &WorkerPlan) -> SystemResult {
    let mut sys = SystemResult::default();
    let limit = HELPER_VM_ALLOWANCE + Duration::from_secs(args.timeout);
    let guest = detvisor_guest(&WorkerPlan {
        kernel: helper_vm::payload_path("vmlinux").into(),
        initrd: helper_vm::payload_path("initrd").into(),
        ..plan.clone()
    });
    sys.command = request_words(
        "a helper VM per run, answering run::api::Request::Run:",
        &guest,
    );
    let n = args.runs;
    for i in 1..=n {
        let launch = HelperLaunch {
            // As `detvisor run` sizes it.
            memory_mib: ((plan.ram_bytes >> 20) as u32)
                .saturating_add(1024)
                .max(2048),
            files: vec![
                (plan.kernel.clone(), "vmlinux".into()),
                (plan.initrd.clone(), "initrd".into()),
            ],
            shared_dirs: Vec::new(),
        };
        let guest = guest.clone();
        let done = run_in_process(
            move || {
                let mut session = Session::default();
                let summary = launch.session(&mut session, "", |vm| {
                    match call_vm(vm, &BenchCall::Run(Box::new(guest)))? {
                        BenchReply::Run(summary) => Ok(*summary),
                        _ => anyhow::bail!("the helper VM answered another call"),
                    }
                });
                summary.map_err(|e| format!("{e:#}"))
            },
            limit,
            Watch::default(),
        );
        let summary = done
            .result
            .unwrap_or_else(|| Err("the run's thread panicked".into()));
        let r = detvisor_result(summary, done.wall, done.timed_out.then_some(limit));
        say!(
            "bench [host]: detvisor end-to-end run {i}/{n}: {}",
            describe(&r)
        );
        sys.runs.push(r);
    }
    sys
}

/// `bench boot`: measures every system, prints the report; 1 unless everything went well.
pub fn orchestrate(args: &BootArgs) -> Result<u8> {
    let loadavg_before = loadavg();
    check_runs_and_timeout(args.runs, args.timeout)?;
    let image = guest::default_image()?;
    let bzimage = image.kernel.with_file_name("bzImage");
    let tmp = TempDir::new("detvisor-bench-")
        .context("cannot create a temporary directory for the benchmark")?;
    let command = vec![GUEST_COMMAND.to_string()];
    let qemu_initrd = tmp.path().join("initrd-cmd.img");
    fs::write(
        &qemu_initrd,
        guest::initrd_with_command(&image.initrd, &command)?,
    )
    .with_context(|| format!("cannot write {}", qemu_initrd.display()))?;
    let cmdline = guest::default_cmdline();
    let ram_bytes = units::parse_size(GUEST_MEM)?;
    let mut qemu = discover_qemu();
    if qemu.is_ok() && !bzimage.is_file() {
        qemu = Err(anyhow!(
            "{} is missing (QEMU boots the bzImage built with {}): rebuild the guest image",
            bzimage.display(),
            image.kernel.display()
        ));
    }
    // The plan of the worker on the host; the helper VM's ships these files.
    let plan = WorkerPlan {
        runs: args.runs,
        timeout_s: args.timeout,
        mem: GUEST_MEM.into(),
        ram_bytes,
        cmdline,
        kernel: image.kernel.clone(),
        initrd: image.initrd.clone(),
        bzimage,
        qemu_initrd,
        qemu: qemu.as_ref().ok().map(QemuInstall::on_host),
        qemu_error: qemu.as_ref().err().map(|e| format!("{e:#}")),
        in_helper_vm: false,
        place: "host".into(),
    };
    let placement = helper_vm::placement(args.host_vm);
    let use_helper = placement.in_helper_vm();
    let place = placement.name();
    say!(
        "bench: boot `{GUEST_COMMAND}` on the default guest ({}), {GUEST_MEM} RAM, {} run(s) each; \
         detvisor and QEMU-KVM on the {place}{}",
        image.kernel.display(),
        args.runs,
        because(&placement)
    );

    // 1. The deterministic peer on the host, alone on the machine.
    let tcg = tcg_baseline(&plan, &qemu, tmp.path());

    // 2. detvisor and QEMU-KVM side by side.
    let (session, report) = if use_helper {
        let (s, r) = helper_session(&plan, &qemu);
        (Some(s), r)
    } else {
        (None, Some(worker(&plan)))
    };
    let session_error = session.as_ref().and_then(|s| s.error.clone());
    let (det_sys, kvm_sys, kvm_stats) = match report {
        Some(r) => (r.detvisor, r.qemu_kvm, Some(r.kvm_stats)),
        None => {
            let failed = SystemResult {
                error: Some(NOT_MEASURED.into()),
                ..SystemResult::default()
            };
            (failed.clone(), failed, None)
        }
    };

    // 3. detvisor end to end, as a user runs it (helper VM boot included).
    let e2e = if use_helper && !args.no_end_to_end {
        end_to_end(args, &plan)
    } else if use_helper {
        SystemResult {
            skipped: Some("--no-end-to-end".into()),
            ..SystemResult::default()
        }
    } else {
        det_sys.clone() // on the host, the detvisor process is the end-to-end run
    };

    let detvisor = summarize("detvisor (deterministic)", place, &det_sys);
    let qemu_kvm = summarize("QEMU -accel kvm", place, &kvm_sys);
    let qemu_tcg = summarize("QEMU TCG -icount shift=0", "host", &tcg);
    let e2e_place = if use_helper {
        "host, helper VM per run"
    } else {
        "host"
    };
    let detvisor_e2e = summarize("detvisor end to end", e2e_place, &e2e);
    let ratios = Ratios {
        detvisor_over_qemu_kvm: ratio(detvisor.median_ms, qemu_kvm.median_ms),
        detvisor_end_to_end_over_qemu_tcg_icount: ratio(detvisor_e2e.median_ms, qemu_tcg.median_ms),
        detvisor_process_over_qemu_tcg_icount: ratio(detvisor.median_ms, qemu_tcg.median_ms),
        detvisor_vm_run_over_qemu_tcg_icount: ratio(
            detvisor.inner_wall_ms.map(|v| v as f64),
            qemu_tcg.median_ms,
        ),
    };
    let all_ok = [&detvisor, &qemu_kvm, &qemu_tcg, &detvisor_e2e]
        .iter()
        .all(|s| s.skipped.is_some() || (s.error.is_none() && s.ok_runs == s.runs))
        && session_error.is_none();
    let report = BenchReport {
        benchmark: "boot",
        guest_command: GUEST_COMMAND,
        runs: args.runs,
        mem: GUEST_MEM,
        cmdline: plan.cmdline.clone(),
        qemu_machine: QEMU_MACHINE,
        place: Where::from(&placement),
        clock: "wall time from just before spawn() to wait() returning (QEMU), from just before \
                the run's thread starts to the request's return (detvisor, in process), \
                CLOCK_MONOTONIC of the machine it runs on (L1's for the helper VM); memory (/proc sampled \
                every 20 ms) and KVM statistics from one extra instrumented run per system",
        kvm_stats,
        detvisor,
        qemu_kvm,
        qemu_tcg_icount: qemu_tcg,
        detvisor_end_to_end: detvisor_e2e,
        helper_vm: session,
        ratios,
        host: HostLoad::since(loadavg_before),
        all_ok,
    };
    print_report(&report)?;
    Ok(if all_ok { 0 } else { 1 })
}
