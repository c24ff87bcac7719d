//! `detvisor bench`: benchmarks that print ratios against baselines run side by side.
//!
//! `detvisor bench boot [--runs N]` boots the default guest image and runs `true` with:
//!
//! 1. **detvisor** (deterministic): `detvisor run --host-vm never --json -- true` as a child
//!    process, inside the helper VM (L1) when the host's KVM cannot run guests, else on the host.
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
//! 4. When a helper VM is used: **detvisor end to end**, `detvisor run --json -- true` on the
//!    host as a user runs it (one helper VM boot per run).
//!
//! Every QEMU gets `-nodefaults -no-user-config -display none -no-reboot`, the serial port in a
//! file and an `isa-debugcon` at port 0x610 that captures the status byte the guest's init
//! writes there (detvisor ends the run at that write; QEMU ignores it and the init's
//! `reboot -f` with `reboot=t` triple-faults, which `-no-reboot` turns into an exit).
//!
//! Wall time of a run = from just before `spawn()` to the moment `wait()` returns (fork, exec,
//! boot, guest, exit, reap), measured with the monotonic clock of the machine the process runs
//! on (L1's own clock inside the helper VM; under TCG without icount it follows the host's real
//! time). Waiting is blocking (a thread in `wait()`), so the timed runs are not disturbed by
//! polling; one extra *instrumented* run per system samples `/proc/<pid>/status` and
//! `/proc/<pid>/smaps` every 20 ms for the peak memory and, inside the helper VM, holds the VM's
//! per-VM KVM debugfs statistics open to read its exit counts after it ends. That run is not part
//! of the wall-time statistics.
//!
//! Inside the helper VM this same binary is the payload (`bench boot --worker-plan FILE`); on
//! the host an intermediate `bench boot --launch-plan FILE` process calls [`hostvm::run`], so
//! that the payload's stdout (result lines) reaches this process through a pipe and each line
//! can be time-stamped on arrival: the first line gives the helper VM's boot overhead.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use snapshot::SnapshotMeta;
use vmm::vm::{Session as VmSession, SessionState};

use crate::{guest, hostvm, units};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Boot the default guest and run `true`: detvisor vs QEMU-KVM (same helper VM) vs QEMU TCG
    /// with icount (host). Prints a table and a final JSON line.
    Boot(BootArgs),
    /// Snapshot and restore latency, forks/s and resets/s against guest RAM size and dirty
    /// fraction, with full-copy baselines. Prints a table and a final JSON line.
    Snapshot(SnapshotBenchArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchHostVm {
    /// Use the helper VM only when the host's KVM cannot run the guest.
    Auto,
    /// Always measure detvisor and QEMU-KVM inside the helper VM.
    Always,
    /// Never: measure them on the host's KVM.
    Never,
}

#[derive(Args, Debug, Clone)]
pub struct BootArgs {
    /// Repetitions of each measurement.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Time limit of each process, in seconds (a helper VM boot gets 300 s more); a process
    /// over it is killed and its run counted as failed.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Where detvisor and QEMU-KVM run.
    #[arg(long, value_enum, default_value_t = BenchHostVm::Auto)]
    pub host_vm: BenchHostVm,
    /// Skip the end-to-end detvisor runs on the host (one helper VM boot each).
    #[arg(long)]
    pub no_end_to_end: bool,
    /// Internal: run the measurements described in this plan (inside the helper VM).
    #[arg(long, hide = true)]
    pub worker_plan: Option<PathBuf>,
    /// Internal: start the helper VM described in this plan.
    #[arg(long, hide = true)]
    pub launch_plan: Option<PathBuf>,
}

pub fn run(args: BenchArgs) -> Result<u8> {
    match args.command {
        BenchCommand::Boot(boot) => {
            if let Some(plan) = &boot.worker_plan {
                worker_main(plan)
            } else if let Some(plan) = &boot.launch_plan {
                launch_main(plan)
            } else {
                orchestrate(&boot)
            }
        }
        BenchCommand::Snapshot(args) => run_snapshot_bench(&args),
    }
}

/// The command the guest runs.
const GUEST_COMMAND: &str = "true";
/// Guest RAM of every system.
const GUEST_MEM: &str = "256M";
/// QEMU machine type: `pc` (i440FX, SeaBIOS). `microvm` would boot faster, but with this
/// kernel and `reboot=t` it does not exit after the guest's `reboot -f` (it hangs).
const QEMU_MACHINE: &str = "pc";
const QEMU_BIN: &str = "qemu-system-x86_64";
/// The firmware QEMU 7.2 `-M pc` opens when booting with `-kernel` (seen with strace): SeaBIOS,
/// the fw_cfg DMA Linux boot option ROM, the vAPIC option ROM.
const QEMU_FIRMWARE: [&str; 3] = ["bios-256k.bin", "linuxboot_dma.bin", "kvmvapic.bin"];
/// Where QEMU firmware is looked up on the host (Debian puts SeaBIOS in /usr/share/seabios).
const QEMU_FIRMWARE_DIRS: [&str; 4] = [
    "/usr/share/qemu",
    "/usr/share/seabios",
    "/usr/lib/ipxe/qemu",
    "/usr/local/share/qemu",
];
/// First stdout line of the worker (its argument: L1 uptime in seconds).
const MARK_READY: &str = "detvisor-bench-ready ";
/// Last stdout line of the worker (its argument: the [`WorkerReport`] as JSON).
const MARK_REPORT: &str = "detvisor-bench-report ";
/// Extra time allowed for a helper VM to boot and shut down.
const HELPER_VM_ALLOWANCE: Duration = Duration::from_secs(300);
/// Memory sampling interval of the extra memory run.
const MEM_SAMPLE_INTERVAL: Duration = Duration::from_millis(20);
/// How much of a process's stderr is kept for error messages.
const TAIL_BYTES: usize = 16 * 1024;
/// KVM statistics (L1 debugfs) recorded per run, as deltas.
const KVM_STATS: [&str; 5] = ["exits", "io_exits", "mmio_exits", "halt_exits", "irq_exits"];
const DEBUGFS_KVM: &str = "/sys/kernel/debug/kvm";
/// How often the per-VM KVM statistics are looked for until the VM exists.
const KVM_POLL: Duration = Duration::from_millis(5);

// ---------------------------------------------------------------------------------------------
// Plans and results exchanged between the host and the helper VM.

/// How to run QEMU (paths as seen where it runs).
#[derive(Serialize, Deserialize, Debug, Clone)]
struct QemuPlan {
    bin: PathBuf,
    /// `LD_LIBRARY_PATH` (the shipped libraries), if any.
    lib_dir: Option<PathBuf>,
    /// QEMU's ELF interpreter (`PT_INTERP`, as `ldd` shows it on the host) ...
    interp: Option<PathBuf>,
    /// ... and its shipped copy, used explicitly when `interp` does not exist where QEMU runs.
    loader: Option<PathBuf>,
    /// `-L` (the shipped firmware), if any.
    firmware_dir: Option<PathBuf>,
}

/// What the worker measures (detvisor and QEMU-KVM); paths as seen where it runs.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct WorkerPlan {
    runs: u32,
    timeout_s: u64,
    mem: String,
    ram_bytes: u64,
    cmdline: String,
    kernel: PathBuf,
    initrd: PathBuf,
    bzimage: PathBuf,
    /// `initrd` with the command archive appended (exactly what detvisor builds).
    qemu_initrd: PathBuf,
    qemu: Option<QemuPlan>,
    /// Why QEMU-KVM cannot be measured, when `qemu` is `None`.
    qemu_error: Option<String>,
    /// Inside the helper VM: may mount debugfs for KVM statistics.
    in_helper_vm: bool,
    place: String,
}

/// What the launcher process hands to [`hostvm::run`].
#[derive(Serialize, Deserialize, Debug)]
struct LaunchPlan {
    assets_dir: PathBuf,
    memory_mib: u32,
    args: Vec<String>,
    /// (host path, payload name)
    files: Vec<(PathBuf, String)>,
    /// Host directories shared read-write (9p), mounted at the same path in L1.
    #[serde(default)]
    shared_dirs: Vec<PathBuf>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct RunResult {
    ok: bool,
    /// Process start to exit (ms).
    wall_ms: f64,
    error: Option<String>,
    /// Status the guest reported (detvisor's JSON; QEMU: the byte written to port 0x610).
    guest_status: Option<u8>,
    /// Exits to the VMM (detvisor's JSON `exits`).
    vmm_exits: Option<u64>,
    /// detvisor's own phases (its JSON): vm::run total, setup, final hashing (ms).
    inner_wall_ms: Option<u64>,
    inner_setup_ms: Option<u64>,
    inner_finish_ms: Option<u64>,
    /// Deltas of the KVM statistics (debugfs) over the run.
    kvm: Option<BTreeMap<String, u64>>,
    /// Fingerprint of the guest's output: detvisor's digest, or FNV-1a 64 of the serial bytes.
    output: Option<String>,
    output_bytes: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct MemoryPeak {
    samples: u32,
    interval_ms: u64,
    /// Last `VmHWM` read (the kernel's high-water mark of the RSS; a lower bound of the peak as
    /// the last <20 ms are not sampled).
    vm_hwm_kib: u64,
    /// Guest RAM configured.
    guest_ram_kib: u64,
    /// Resident part of the guest-RAM mapping at the sample with the largest RSS.
    guest_ram_resident_kib: u64,
    /// Largest (VmRSS - resident part of the guest-RAM mapping) over the samples: the process's
    /// own memory beyond guest RAM.
    beyond_guest_ram_kib: u64,
    /// How the guest-RAM mapping was found in smaps: "exact" (anonymous, exactly the RAM size),
    /// "approx" (smallest anonymous mapping at least that large), "not found".
    guest_mapping: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct SystemResult {
    /// The timed runs.
    runs: Vec<RunResult>,
    /// One more run, with memory sampling and KVM statistics (not in the wall statistics).
    instrumented: Option<RunResult>,
    memory: Option<MemoryPeak>,
    memory_error: Option<String>,
    /// Set when the system could not be measured at all.
    error: Option<String>,
    /// Set when the system was deliberately not measured.
    skipped: Option<String>,
    command: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Default)]
struct WorkerReport {
    place: String,
    uptime_at_start_s: Option<f64>,
    elapsed_ms: f64,
    /// "L1 debugfs" when KVM statistics were recorded, else why not.
    kvm_stats: String,
    detvisor: SystemResult,
    qemu_kvm: SystemResult,
}

// ---------------------------------------------------------------------------------------------
// Running a process with a time limit.

enum ErrMode {
    /// Keep the tail only.
    Capture,
    /// Copy to our stderr as it arrives, and keep the tail.
    Tee,
}

struct Finished {
    wall: Duration,
    /// `None` when killed at the time limit (or the wait failed: see `wait_error`).
    status: Option<ExitStatus>,
    timed_out: bool,
    wait_error: Option<String>,
    /// Stdout lines (without `\n`) with their arrival time.
    lines: Vec<(Instant, String)>,
    stderr_tail: Vec<u8>,
    started: Instant,
    memory: Option<MemoryPeak>,
    /// The VM's final KVM statistics ([`Watch::kvm`]).
    kvm: Option<BTreeMap<String, u64>>,
}

impl Finished {
    fn stdout_text(&self) -> String {
        self.lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr_tail)
            .trim()
            .to_string()
    }

    /// A one-paragraph description of an abnormal end.
    fn failure(&self, what: &str, limit: Duration) -> String {
        let how = if self.timed_out {
            format!("{what} killed after the {} s time limit", limit.as_secs())
        } else if let Some(e) = &self.wait_error {
            format!("{what}: {e}")
        } else {
            match self.status {
                Some(s) => format!("{what} exited with {s}"),
                None => format!("{what} ended without a status"),
            }
        };
        let err = last_lines(&self.stderr_text(), 12);
        if err.is_empty() {
            how
        } else {
            format!("{how}; its stderr ends with:\n{err}")
        }
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn kill_process(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes two integers and touches no memory of ours. `pid` is a child of
    // ours whose exit the waiter thread has not reported, so (but for the instant between its
    // reaping and this call) it still names that child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// What to watch while a process runs.
#[derive(Clone, Copy, Default)]
struct Watch {
    /// Sample its memory every [`MEM_SAMPLE_INTERVAL`] (the value: guest RAM bytes).
    ram: Option<u64>,
    /// Grab its VM's KVM statistics: look for them every [`KVM_POLL`] until found.
    kvm: bool,
}

/// Runs `cmd` (stdin /dev/null, stdout and stderr piped) to its end or until `limit`, when it is
/// killed. Unless `watch` asks for something, the calling thread just blocks until it ends.
fn run_timed(
    mut cmd: Command,
    limit: Duration,
    err_mode: ErrMode,
    watch: Watch,
) -> Result<Finished> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let program = cmd.get_program().to_string_lossy().into_owned();
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            anyhow!("{program} not found")
        } else {
            anyhow!("cannot start {program}: {e}")
        }
    })?;
    let pid = child.id();
    let stdout = child.stdout.take().context("child stdout")?;
    let stderr = child.stderr.take().context("child stderr")?;

    let (out_tx, out_rx) = mpsc::channel();
    thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut lines = Vec::new();
        let mut kept = 0usize;
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let at = Instant::now();
                    let line = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .to_string();
                    kept += line.len();
                    lines.push((at, line));
                    // Keep memory bounded: drop the oldest lines beyond 8 MiB.
                    while kept > 8 << 20 && lines.len() > 1 {
                        kept -= lines.remove(0).1.len();
                    }
                }
            }
        }
        let _ = out_tx.send(lines);
    });
    let (err_tx, err_rx) = mpsc::channel();
    let tee = matches!(err_mode, ErrMode::Tee);
    thread::spawn(move || {
        let mut stderr = stderr;
        let mut tail = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match stderr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tee {
                        let mut e = io::stderr().lock();
                        let _ = e.write_all(&buf[..n]).and_then(|()| e.flush());
                    }
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > 2 * TAIL_BYTES {
                        tail.drain(..tail.len() - TAIL_BYTES);
                    }
                }
            }
        }
        let _ = err_tx.send(tail);
    });
    let (wait_tx, wait_rx) = mpsc::channel();
    thread::spawn(move || {
        let status = child.wait();
        let _ = wait_tx.send((status, Instant::now()));
    });

    let deadline = started + limit;
    let mut sampler = watch.ram.map(|ram| Sampler::new(pid, ram));
    let mut grab = watch.kvm.then_some(KvmGrab { pid, files: None });
    let mut timed_out = false;
    let (status, ended) = loop {
        let now = Instant::now();
        if now >= deadline {
            timed_out = true;
            kill_process(pid);
            match wait_rx.recv_timeout(Duration::from_secs(30)) {
                Ok((status, at)) => break (status, at),
                Err(_) => {
                    break (
                        Err(io::Error::other("did not end after SIGKILL")),
                        Instant::now(),
                    )
                }
            }
        }
        let wait = if sampler.is_some() {
            MEM_SAMPLE_INTERVAL
        } else if grab.as_ref().is_some_and(|g| g.files.is_none()) {
            KVM_POLL
        } else {
            deadline - now
        }
        .min(deadline - now);
        match wait_rx.recv_timeout(wait) {
            Ok((status, at)) => break (status, at),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(s) = &mut sampler {
                    s.sample();
                }
                if let Some(g) = &mut grab {
                    g.try_grab();
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break (
                    Err(io::Error::other("waiter thread vanished")),
                    Instant::now(),
                )
            }
        }
    };
    // A grandchild holding the pipes open must not hang us: wait a bounded time for the readers.
    let lines = out_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_default();
    let stderr_tail = err_rx
        .recv_timeout(Duration::from_secs(10))
        .unwrap_or_default();
    let (status, wait_error) = match status {
        Ok(s) if !timed_out => (Some(s), None),
        Ok(_) => (None, None),
        Err(e) => (None, Some(e.to_string())),
    };
    Ok(Finished {
        wall: ended.duration_since(started),
        status,
        timed_out,
        wait_error,
        lines,
        stderr_tail: tail_of(&stderr_tail, TAIL_BYTES).to_vec(),
        started,
        memory: sampler.map(|s| s.peak),
        kvm: grab.and_then(|g| g.read()),
    })
}

fn tail_of(bytes: &[u8], max: usize) -> &[u8] {
    &bytes[bytes.len().saturating_sub(max)..]
}

// ---------------------------------------------------------------------------------------------
// Memory sampling from /proc.

struct Sampler {
    pid: u32,
    peak: MemoryPeak,
    best_rss: u64,
}

impl Sampler {
    fn new(pid: u32, ram_bytes: u64) -> Self {
        Sampler {
            pid,
            peak: MemoryPeak {
                interval_ms: MEM_SAMPLE_INTERVAL.as_millis() as u64,
                guest_ram_kib: ram_bytes >> 10,
                guest_mapping: "not found".into(),
                ..MemoryPeak::default()
            },
            best_rss: 0,
        }
    }

    fn sample(&mut self) {
        let Ok(status) = fs::read_to_string(format!("/proc/{}/status", self.pid)) else {
            return;
        };
        let field = |name: &str| -> Option<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        };
        let (Some(hwm), Some(rss)) = (field("VmHWM:"), field("VmRSS:")) else {
            return; // exiting (a zombie has no memory fields)
        };
        let smaps = fs::read_to_string(format!("/proc/{}/smaps", self.pid)).unwrap_or_default();
        let (guest, how) = guest_mapping_rss(&smaps, self.peak.guest_ram_kib);
        self.peak.samples += 1;
        self.peak.vm_hwm_kib = self.peak.vm_hwm_kib.max(hwm);
        if let Some(guest) = guest {
            let beyond = rss.saturating_sub(guest);
            if beyond >= self.peak.beyond_guest_ram_kib {
                self.peak.beyond_guest_ram_kib = beyond;
            }
            if self.peak.guest_mapping != "exact" {
                self.peak.guest_mapping = how.into();
            }
        }
        if rss >= self.best_rss {
            self.best_rss = rss;
            self.peak.guest_ram_resident_kib = guest.unwrap_or(0);
        }
    }
}

/// The resident KiB of the guest-RAM mapping in an smaps text: the anonymous mapping of exactly
/// `ram_kib`, else the smallest anonymous one at least that large.
fn guest_mapping_rss(smaps: &str, ram_kib: u64) -> (Option<u64>, &'static str) {
    let mut exact = None;
    let mut approx: Option<(u64, u64)> = None;
    let mut current: Option<(bool, u64)> = None; // (anonymous, size)
    for line in smaps.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // start-end perms offset dev inode [path]
            let rest: Vec<&str> = parts.collect();
            let anonymous = rest.len() == 4 && rest[3] == "0";
            current = Some((anonymous, 0));
        } else if first == "Size:" {
            if let Some((_, size)) = &mut current {
                *size = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            }
        } else if first == "Rss:" {
            if let Some((true, size)) = current {
                let rss: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                if size == ram_kib && exact.is_none() {
                    exact = Some(rss);
                } else if size > ram_kib && approx.is_none_or(|(s, _)| size < s) {
                    approx = Some((size, rss));
                }
            }
        }
    }
    match (exact, approx) {
        (Some(r), _) => (Some(r), "exact"),
        (None, Some((_, r))) => (Some(r), "approx"),
        _ => (None, "not found"),
    }
}

// ---------------------------------------------------------------------------------------------
// KVM statistics (debugfs).

fn kvm_stats_available(may_mount: bool) -> String {
    let probe = Path::new(DEBUGFS_KVM).join("exits");
    if fs::read_to_string(&probe).is_ok() {
        return "debugfs".into();
    }
    if !may_mount {
        return format!("{} not readable", probe.display());
    }
    let out = Command::new("mount")
        .args(["-t", "debugfs", "debugfs", "/sys/kernel/debug"])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(_) if fs::read_to_string(&probe).is_ok() => "debugfs".into(),
        Ok(o) => format!(
            "debugfs unavailable: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run mount: {e}"),
    }
}

/// The KVM statistics of one process's VM, from its per-VM debugfs directory
/// (`/sys/kernel/debug/kvm/<pid>-<fd>/`; the global files only sum over live VMs). An open stat
/// file holds a reference on the VM, so files opened while it lives give its final counts after
/// the process has exited.
struct KvmGrab {
    pid: u32,
    files: Option<Vec<(String, fs::File)>>,
}

impl KvmGrab {
    fn try_grab(&mut self) {
        if self.files.is_some() {
            return;
        }
        let Ok(dir) = fs::read_dir(DEBUGFS_KVM) else {
            return;
        };
        let prefix = format!("{}-", self.pid);
        for entry in dir.flatten() {
            if !entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
            {
                continue;
            }
            let files: Vec<(String, fs::File)> = KVM_STATS
                .iter()
                .filter_map(|s| {
                    let f = fs::File::open(entry.path().join(s)).ok()?;
                    Some((s.to_string(), f))
                })
                .collect();
            if files.len() == KVM_STATS.len() {
                self.files = Some(files);
                return;
            }
        }
    }

    fn read(&self) -> Option<BTreeMap<String, u64>> {
        let mut map = BTreeMap::new();
        for (name, f) in self.files.as_ref()? {
            let mut buf = [0u8; 64];
            // The first read of a stat file (they are not seekable) gives its current value.
            let n = (&*f).read(&mut buf).ok()?;
            let value = std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()?;
            map.insert(name.clone(), value);
        }
        Some(map)
    }
}

// ---------------------------------------------------------------------------------------------
// One run of each system.

fn detvisor_command(detvisor: &Path, plan: &WorkerPlan) -> Command {
    let mut cmd = Command::new(detvisor);
    cmd.arg("run")
        .args(["--host-vm", "never", "--kernel"])
        .arg(&plan.kernel)
        .arg("--initrd")
        .arg(&plan.initrd)
        .args([
            "--mem",
            &plan.mem,
            "--cmdline",
            &plan.cmdline,
            "--json",
            "--",
        ])
        .arg(GUEST_COMMAND);
    cmd
}

fn command_words(cmd: &Command) -> Vec<String> {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// The JSON summary `detvisor run --json` prints as its last stdout line.
fn detvisor_summary(finished: &Finished) -> Option<serde_json::Value> {
    finished
        .lines
        .iter()
        .rev()
        .find(|(_, l)| l.starts_with('{'))
        .and_then(|(_, l)| serde_json::from_str(l).ok())
}

/// Judges a finished `detvisor run --json -- true`.
fn detvisor_result(finished: &Finished, limit: Duration, what: &str) -> RunResult {
    let mut r = RunResult {
        wall_ms: ms(finished.wall),
        ..RunResult::default()
    };
    let summary = detvisor_summary(finished);
    if let Some(s) = &summary {
        let u = |k: &str| s.get(k).and_then(serde_json::Value::as_u64);
        r.guest_status = u("exit_status").and_then(|v| u8::try_from(v).ok());
        r.vmm_exits = u("exits");
        r.inner_wall_ms = u("wall_ms");
        r.inner_setup_ms = u("wall_setup_ms");
        r.inner_finish_ms = u("wall_finish_ms");
        r.output = s.get("digest").and_then(|d| d.as_str()).map(String::from);
        r.output_bytes = u("console_bytes");
    }
    let exited_ok = finished.status.is_some_and(|s| s.success());
    r.ok = exited_ok && r.guest_status == Some(0);
    if !r.ok {
        r.error = Some(if !exited_ok {
            finished.failure(what, limit)
        } else if summary.is_none() {
            format!(
                "{what} printed no JSON summary; stdout ends with:\n{}",
                last_lines(&finished.stdout_text(), 8)
            )
        } else {
            format!("the guest reported status {:?}, not 0", r.guest_status)
        });
    }
    r
}

fn run_detvisor(
    detvisor: &Path,
    plan: &WorkerPlan,
    sample: bool,
    stats: bool,
) -> (RunResult, Option<MemoryPeak>) {
    let limit = Duration::from_secs(plan.timeout_s);
    let watch = Watch {
        ram: sample.then_some(plan.ram_bytes),
        kvm: stats,
    };
    let finished = match run_timed(
        detvisor_command(detvisor, plan),
        limit,
        ErrMode::Capture,
        watch,
    ) {
        Ok(f) => f,
        Err(e) => {
            return (
                RunResult {
                    error: Some(format!("{e:#}")),
                    ..RunResult::default()
                },
                None,
            )
        }
    };
    let mut r = detvisor_result(&finished, limit, "detvisor");
    r.kvm = finished.kvm.clone();
    (r, finished.memory)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Accel {
    Kvm,
    TcgIcount,
}

struct QemuFiles<'a> {
    bzimage: &'a Path,
    initrd: &'a Path,
    cmdline: &'a str,
    mem: &'a str,
}

/// Escapes a value inside a QEMU `key=value,...` option.
fn qemu_opt(path: &Path) -> String {
    path.to_string_lossy().replace(',', ",,")
}

fn qemu_command(
    q: &QemuPlan,
    accel: Accel,
    files: &QemuFiles,
    serial: &Path,
    status: &Path,
) -> Command {
    let interp_missing = q.interp.as_ref().is_some_and(|i| !i.exists());
    let mut cmd = match (&q.loader, &q.lib_dir) {
        (Some(loader), Some(lib_dir)) if interp_missing => {
            let mut c = Command::new(loader);
            c.arg("--library-path").arg(lib_dir).arg(&q.bin);
            c
        }
        _ => Command::new(&q.bin),
    };
    if let Some(lib_dir) = &q.lib_dir {
        cmd.env("LD_LIBRARY_PATH", lib_dir);
    }
    if let Some(fw) = &q.firmware_dir {
        cmd.arg("-L").arg(fw);
    }
    match accel {
        Accel::Kvm => cmd.args(["-accel", "kvm"]),
        Accel::TcgIcount => cmd.args([
            "-accel",
            "tcg",
            "-icount",
            "shift=0,sleep=off",
            "-rtc",
            "clock=vm",
        ]),
    };
    cmd.args(["-M", QEMU_MACHINE, "-m", files.mem])
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ])
        .arg("-chardev")
        .arg(format!("file,id=ser0,path={}", qemu_opt(serial)))
        .args(["-serial", "chardev:ser0"])
        .arg("-chardev")
        .arg(format!("file,id=status,path={}", qemu_opt(status)))
        .args(["-device", "isa-debugcon,iobase=0x610,chardev=status"])
        .arg("-kernel")
        .arg(files.bzimage)
        .arg("-initrd")
        .arg(files.initrd)
        .arg("-append")
        .arg(files.cmdline);
    cmd
}

/// FNV-1a 64 of `bytes`, as hex.
fn fnv1a(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

struct QemuRun<'a> {
    q: &'a QemuPlan,
    accel: Accel,
    files: QemuFiles<'a>,
    scratch: &'a Path,
    label: &'a str,
    limit: Duration,
    ram_bytes: u64,
}

impl QemuRun<'_> {
    fn command(&self, index: u32) -> (Command, PathBuf, PathBuf) {
        let serial = self.scratch.join(format!("{}-{index}.serial", self.label));
        let status = self.scratch.join(format!("{}-{index}.status", self.label));
        let _ = fs::remove_file(&serial);
        let _ = fs::remove_file(&status);
        let cmd = qemu_command(self.q, self.accel, &self.files, &serial, &status);
        (cmd, serial, status)
    }

    fn run(&self, index: u32, sample: bool, stats: bool) -> (RunResult, Option<MemoryPeak>) {
        let (cmd, serial_path, status_path) = self.command(index);
        let watch = Watch {
            ram: sample.then_some(self.ram_bytes),
            kvm: stats,
        };
        let finished = match run_timed(cmd, self.limit, ErrMode::Capture, watch) {
            Ok(f) => f,
            Err(e) => {
                return (
                    RunResult {
                        error: Some(format!("{e:#}")),
                        ..RunResult::default()
                    },
                    None,
                )
            }
        };
        let serial = fs::read(&serial_path).unwrap_or_default();
        let status = fs::read(&status_path).unwrap_or_default();
        let mut r = RunResult {
            wall_ms: ms(finished.wall),
            guest_status: (status.len() == 1).then(|| status[0]),
            kvm: finished.kvm.clone(),
            output: Some(fnv1a(&serial)),
            output_bytes: Some(serial.len() as u64),
            ..RunResult::default()
        };
        let exited_ok = finished.status.is_some_and(|s| s.success());
        r.ok = exited_ok && status == [0];
        if !r.ok {
            r.error = Some(if !exited_ok {
                finished.failure("QEMU", self.limit)
            } else {
                format!(
                    "the guest wrote {:?} to port 0x610 (expected one byte 0); serial ends with:\n{}",
                    status,
                    last_lines(&String::from_utf8_lossy(&serial), 8)
                )
            });
        }
        (r, finished.memory)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn describe(r: &RunResult) -> String {
    if r.ok {
        let mut s = format!("{:.0} ms", r.wall_ms);
        if let Some(e) = r.vmm_exits {
            s.push_str(&format!(", {e} exits"));
        }
        if let Some(k) = r.kvm.as_ref().and_then(|k| k.get("exits")) {
            s.push_str(&format!(", {k} KVM exits"));
        }
        s
    } else {
        format!("FAILED: {}", r.error.as_deref().unwrap_or("unknown error"))
    }
}

// ---------------------------------------------------------------------------------------------
// The worker: detvisor and QEMU-KVM side by side (inside the helper VM, or on the host).

fn worker(plan: &WorkerPlan) -> WorkerReport {
    let started = Instant::now();
    let tag = format!("bench [{}]", plan.place);
    let mut report = WorkerReport {
        place: plan.place.clone(),
        uptime_at_start_s: uptime(),
        ..WorkerReport::default()
    };
    report.kvm_stats = kvm_stats_available(plan.in_helper_vm);
    let stats = report.kvm_stats == "debugfs";
    let detvisor = match std::env::current_exe() {
        Ok(p) => Some(p),
        Err(e) => {
            report.detvisor.error = Some(format!("cannot locate the detvisor executable: {e}"));
            None
        }
    };
    if let Some(d) = &detvisor {
        report.detvisor.command = command_words(&detvisor_command(d, plan));
    }
    let scratch = match TempDir::new("detvisor-bench-") {
        Ok(t) => Some(t),
        Err(e) => {
            report.qemu_kvm.error = Some(format!("cannot create a scratch directory: {e}"));
            None
        }
    };
    let qemu = match (&plan.qemu, &scratch) {
        (Some(q), Some(dir)) => Some(QemuRun {
            q,
            accel: Accel::Kvm,
            files: QemuFiles {
                bzimage: &plan.bzimage,
                initrd: &plan.qemu_initrd,
                cmdline: &plan.cmdline,
                mem: &plan.mem,
            },
            scratch: dir.path(),
            label: "qemu-kvm",
            limit: Duration::from_secs(plan.timeout_s),
            ram_bytes: plan.ram_bytes,
        }),
        (None, _) => {
            report.qemu_kvm.error = plan
                .qemu_error
                .clone()
                .or_else(|| Some("QEMU unavailable".into()));
            None
        }
        _ => None,
    };
    if let Some(q) = &qemu {
        report.qemu_kvm.command = command_words(&q.command(0).0);
    }
    let n = plan.runs;
    for i in 1..=n {
        if let Some(d) = &detvisor {
            let (r, _) = run_detvisor(d, plan, false, false);
            eprintln!("{tag}: detvisor run {i}/{n}: {}", describe(&r));
            report.detvisor.runs.push(r);
        }
        if let Some(q) = &qemu {
            let (r, _) = q.run(i, false, false);
            eprintln!("{tag}: QEMU-KVM run {i}/{n}: {}", describe(&r));
            report.qemu_kvm.runs.push(r);
        }
    }
    // The instrumented runs: memory sampling and KVM statistics, kept out of the timed runs
    // (holding a VM's stat files open also defers its teardown past the process's exit).
    if let Some(d) = &detvisor {
        let (r, mem) = run_detvisor(d, plan, true, stats);
        record_instrumented(&mut report.detvisor, &tag, "detvisor", r, mem);
    }
    if let Some(q) = &qemu {
        let (r, mem) = q.run(n + 1, true, stats);
        record_instrumented(&mut report.qemu_kvm, &tag, "QEMU-KVM", r, mem);
    }
    report.elapsed_ms = ms(started.elapsed());
    report
}

fn record_instrumented(
    sys: &mut SystemResult,
    tag: &str,
    name: &str,
    r: RunResult,
    mem: Option<MemoryPeak>,
) {
    sys.instrumented = Some(r.clone());
    match (r.ok, mem) {
        (true, Some(m)) if m.samples > 0 => {
            eprintln!(
                "{tag}: {name} instrumented run: {}; VmHWM {} MiB, {} MiB beyond guest RAM \
                 ({} samples)",
                describe(&r),
                m.vm_hwm_kib >> 10,
                m.beyond_guest_ram_kib >> 10,
                m.samples
            );
            sys.memory = Some(m);
        }
        (true, _) => {
            sys.memory_error = Some("the process ended before the first sample".into());
        }
        (false, _) => {
            sys.memory_error = Some(format!(
                "the instrumented run failed: {}",
                r.error.unwrap_or_default()
            ));
        }
    }
}

fn uptime() -> Option<f64> {
    fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `bench boot --worker-plan FILE`: the payload inside the helper VM.
fn worker_main(plan_path: &Path) -> Result<u8> {
    let plan: WorkerPlan = serde_json::from_slice(
        &fs::read(plan_path).with_context(|| format!("cannot read {}", plan_path.display()))?,
    )
    .context("bad worker plan")?;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "{MARK_READY}{}",
        uptime().map_or("null".into(), |u| u.to_string())
    )?;
    out.flush()?;
    drop(out);
    let report = worker(&plan);
    let mut out = io::stdout().lock();
    writeln!(out, "{MARK_REPORT}{}", serde_json::to_string(&report)?)?;
    out.flush()?;
    Ok(0)
}

/// `bench boot --launch-plan FILE`: runs the helper VM; its payload's stdout is ours.
fn launch_main(plan_path: &Path) -> Result<u8> {
    let plan: LaunchPlan = serde_json::from_slice(
        &fs::read(plan_path).with_context(|| format!("cannot read {}", plan_path.display()))?,
    )
    .context("bad launch plan")?;
    let config = hostvm::HelperVmConfig {
        assets_dir: plan.assets_dir,
        memory_mib: plan.memory_mib,
        shared_dirs: plan.shared_dirs,
        ..hostvm::HelperVmConfig::default()
    };
    let files: Vec<hostvm::PayloadFile> = plan
        .files
        .into_iter()
        .map(|(host_path, payload_name)| hostvm::PayloadFile {
            host_path,
            payload_name,
        })
        .collect();
    let args: Vec<OsString> = plan.args.into_iter().map(OsString::from).collect();
    let exe = std::env::current_exe().context("locating the detvisor executable")?;
    let status = hostvm::run(&config, &exe, &args, &files)?;
    Ok(u8::try_from(status).unwrap_or(125))
}

// ---------------------------------------------------------------------------------------------
// The host's QEMU installation.

struct QemuInstall {
    bin: PathBuf,
    /// Shared libraries (as `ldd` names them) and the ELF interpreter.
    libs: Vec<PathBuf>,
    interp: Option<PathBuf>,
    firmware: Vec<PathBuf>,
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

fn discover_qemu() -> Result<QemuInstall> {
    let bin = find_in_path(QEMU_BIN)
        .with_context(|| format!("{QEMU_BIN} not found in PATH: install qemu-system-x86"))?;
    let out = Command::new("ldd")
        .arg(&bin)
        .stdin(Stdio::null())
        .output()
        .context("cannot run ldd (libc-bin) to list QEMU's libraries")?;
    if !out.status.success() {
        bail!(
            "ldd {} failed: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut libs = Vec::new();
    let mut interp = None;
    for line in String::from_utf8_lossy(&out.stdout).lines().map(str::trim) {
        let (name, target) = match line.split_once(" => ") {
            Some((name, rest)) => {
                if rest.trim_start().starts_with("not found") {
                    bail!("QEMU's shared library {name} not found");
                }
                (Some(name), rest)
            }
            None => (None, line),
        };
        let path = target.rsplit_once(" (0x").map_or(target, |(p, _)| p).trim();
        if path.starts_with('/') {
            if name.is_none() {
                interp = Some(PathBuf::from(path));
            }
            libs.push(PathBuf::from(path));
        }
    }
    let bin_dir = bin.parent().unwrap_or(Path::new("/"));
    let mut dirs: Vec<PathBuf> = vec![
        bin_dir.join("../share/qemu"),
        bin_dir.join("../share/seabios"),
    ];
    dirs.extend(QEMU_FIRMWARE_DIRS.iter().map(PathBuf::from));
    let mut firmware = Vec::new();
    for name in QEMU_FIRMWARE {
        let found = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file());
        match found {
            Some(p) => firmware.push(p),
            None => bail!(
                "QEMU firmware {name} not found in {}",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    Ok(QemuInstall {
        bin,
        libs,
        interp,
        firmware,
    })
}

fn file_name(p: &Path) -> Result<String> {
    p.file_name()
        .and_then(|n| n.to_str())
        .map(String::from)
        .with_context(|| format!("unusable file name {}", p.display()))
}

// ---------------------------------------------------------------------------------------------
// The host side.

/// The helper VM session as seen from the host.
#[derive(Serialize, Default)]
struct Session {
    /// Launcher start to the payload's first line (helper VM boot, incl. assembling its initrd).
    boot_ms: Option<f64>,
    /// The payload's last line to the launcher's exit (helper VM shutdown).
    shutdown_ms: Option<f64>,
    /// Launcher start to exit.
    total_ms: f64,
    /// First to last payload line, on the host's clock ...
    payload_host_ms: Option<f64>,
    /// ... and the worker's own duration on L1's clock (a check of L1's clock).
    payload_l1_ms: Option<f64>,
    /// L1's uptime when the payload started (L1 kernel boot + init, on L1's clock).
    l1_uptime_at_payload_s: Option<f64>,
    /// Bytes shipped as payload files (QEMU, its libraries and firmware, kernels, initrds).
    payload_file_bytes: u64,
    error: Option<String>,
}

struct Inputs {
    kernel: PathBuf,
    initrd: PathBuf,
    bzimage: PathBuf,
    qemu_initrd: PathBuf,
    cmdline: String,
    ram_bytes: u64,
}

fn helper_session(
    args: &BootArgs,
    inputs: &Inputs,
    qemu: &Result<QemuInstall>,
    tmp: &Path,
) -> (Session, Option<WorkerReport>) {
    let mut session = Session::default();
    match helper_session_inner(args, inputs, qemu, tmp, &mut session) {
        Ok(report) => (session, Some(report)),
        Err(e) => {
            session.error = Some(format!("{e:#}"));
            (session, None)
        }
    }
}

fn helper_session_inner(
    args: &BootArgs,
    inputs: &Inputs,
    qemu: &Result<QemuInstall>,
    tmp: &Path,
    session: &mut Session,
) -> Result<WorkerReport> {
    let assets = hostvm::ensure_assets(None)?;
    let mut files: Vec<(PathBuf, String)> = vec![
        (inputs.kernel.clone(), "bench/vmlinux".into()),
        (inputs.initrd.clone(), "bench/initrd".into()),
        (inputs.bzimage.clone(), "bench/bzImage".into()),
        (inputs.qemu_initrd.clone(), "bench/initrd-cmd".into()),
    ];
    let (qemu_plan, qemu_error) = match qemu {
        Ok(q) => {
            files.push((q.bin.clone(), format!("qemu/bin/{QEMU_BIN}")));
            let mut seen = std::collections::BTreeSet::new();
            for lib in &q.libs {
                let name = file_name(lib)?;
                if seen.insert(name.clone()) {
                    files.push((lib.clone(), format!("qemu/lib/{name}")));
                }
            }
            for fw in &q.firmware {
                files.push((fw.clone(), format!("qemu/share/{}", file_name(fw)?)));
            }
            let lib_dir = PathBuf::from(hostvm::payload_path("qemu/lib"));
            let loader = match &q.interp {
                Some(i) => Some(lib_dir.join(file_name(i)?)),
                None => None,
            };
            let plan = QemuPlan {
                bin: hostvm::payload_path(&format!("qemu/bin/{QEMU_BIN}")).into(),
                lib_dir: Some(lib_dir),
                // The worker uses the loader only if QEMU's PT_INTERP is missing in L1 (it is
                // there when detvisor itself is dynamically linked: the launcher ships it).
                interp: q.interp.clone(),
                loader,
                firmware_dir: Some(hostvm::payload_path("qemu/share").into()),
            };
            (Some(plan), None)
        }
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let worker_plan = WorkerPlan {
        runs: args.runs,
        timeout_s: args.timeout,
        mem: GUEST_MEM.into(),
        ram_bytes: inputs.ram_bytes,
        cmdline: inputs.cmdline.clone(),
        kernel: hostvm::payload_path("bench/vmlinux").into(),
        initrd: hostvm::payload_path("bench/initrd").into(),
        bzimage: hostvm::payload_path("bench/bzImage").into(),
        qemu_initrd: hostvm::payload_path("bench/initrd-cmd").into(),
        qemu: qemu_plan,
        qemu_error,
        in_helper_vm: true,
        place: "helper VM".into(),
    };
    let plan_path = tmp.join("worker-plan.json");
    fs::write(&plan_path, serde_json::to_vec(&worker_plan)?)?;
    files.push((plan_path, "bench/plan.json".into()));
    session.payload_file_bytes = files
        .iter()
        .map(|(p, _)| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .sum();
    let launch = LaunchPlan {
        assets_dir: assets,
        memory_mib: ((inputs.ram_bytes >> 20) as u32)
            .saturating_add(1024)
            .max(2048),
        args: vec![
            "bench".into(),
            "boot".into(),
            "--worker-plan".into(),
            hostvm::payload_path("bench/plan.json"),
        ],
        files,
        shared_dirs: Vec::new(),
    };
    let launch_path = tmp.join("launch-plan.json");
    fs::write(&launch_path, serde_json::to_vec(&launch)?)?;

    let exe = std::env::current_exe().context("locating the detvisor executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "boot", "--launch-plan"])
        .arg(&launch_path);
    let runs = u64::from(args.runs);
    let limit = HELPER_VM_ALLOWANCE + Duration::from_secs(args.timeout * (2 * runs + 2));
    eprintln!(
        "bench: starting the helper VM ({} MiB of payload files; time limit {} s)",
        session.payload_file_bytes >> 20,
        limit.as_secs()
    );
    let finished = run_timed(cmd, limit, ErrMode::Tee, Watch::default())?;
    session.total_ms = ms(finished.wall);
    let ready = finished
        .lines
        .iter()
        .find(|(_, l)| l.starts_with(MARK_READY));
    let report_line = finished
        .lines
        .iter()
        .rev()
        .find(|(_, l)| l.starts_with(MARK_REPORT));
    if let Some((at, line)) = ready {
        session.boot_ms = Some(ms(at.duration_since(finished.started)));
        session.l1_uptime_at_payload_s = line[MARK_READY.len()..].trim().parse().ok();
    }
    let Some((report_at, report_text)) = report_line else {
        bail!(
            "no result came back: {}",
            finished.failure("the helper VM launcher", limit)
        );
    };
    let report: WorkerReport = serde_json::from_str(&report_text[MARK_REPORT.len()..])
        .context("unparsable result line from the helper VM")?;
    let end = finished.started + finished.wall;
    session.shutdown_ms = Some(ms(end.saturating_duration_since(*report_at)));
    if let Some((ready_at, _)) = ready {
        session.payload_host_ms = Some(ms(report_at.duration_since(*ready_at)));
    }
    session.payload_l1_ms = Some(report.elapsed_ms);
    if !finished.status.is_some_and(|s| s.success()) {
        session.error = Some(finished.failure("the helper VM launcher", limit));
    }
    Ok(report)
}

/// QEMU TCG with icount on the host: `runs` timed runs and one memory run.
fn tcg_baseline(
    args: &BootArgs,
    inputs: &Inputs,
    qemu: &Result<QemuInstall>,
    tmp: &Path,
) -> SystemResult {
    let mut sys = SystemResult::default();
    let q = match qemu {
        Ok(q) => QemuPlan {
            bin: q.bin.clone(),
            lib_dir: None,
            interp: None,
            loader: None,
            firmware_dir: None,
        },
        Err(e) => {
            sys.error = Some(format!("{e:#}"));
            return sys;
        }
    };
    let run = QemuRun {
        q: &q,
        accel: Accel::TcgIcount,
        files: QemuFiles {
            bzimage: &inputs.bzimage,
            initrd: &inputs.qemu_initrd,
            cmdline: &inputs.cmdline,
            mem: GUEST_MEM,
        },
        scratch: tmp,
        label: "qemu-tcg",
        limit: Duration::from_secs(args.timeout),
        ram_bytes: inputs.ram_bytes,
    };
    sys.command = command_words(&run.command(0).0);
    let n = args.runs;
    for i in 1..=n {
        let (r, _) = run.run(i, false, false);
        eprintln!(
            "bench [host]: QEMU TCG icount run {i}/{n}: {}",
            describe(&r)
        );
        sys.runs.push(r);
    }
    let (r, mem) = run.run(n + 1, true, false);
    record_instrumented(&mut sys, "bench [host]", "QEMU TCG icount", r, mem);
    sys
}

/// detvisor as a user runs it on this host (`detvisor run --json -- true`: helper VM included).
fn end_to_end(args: &BootArgs) -> SystemResult {
    let mut sys = SystemResult::default();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            sys.error = Some(format!("cannot locate the detvisor executable: {e}"));
            return sys;
        }
    };
    let limit = HELPER_VM_ALLOWANCE + Duration::from_secs(args.timeout);
    let host_vm = match args.host_vm {
        BenchHostVm::Always => "always",
        _ => "auto",
    };
    let make = || {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "run",
            "--host-vm",
            host_vm,
            "--mem",
            GUEST_MEM,
            "--json",
            "--",
        ])
        .arg(GUEST_COMMAND);
        cmd
    };
    sys.command = command_words(&make());
    let n = args.runs;
    for i in 1..=n {
        let r = match run_timed(make(), limit, ErrMode::Capture, Watch::default()) {
            Ok(f) => detvisor_result(&f, limit, "detvisor run"),
            Err(e) => RunResult {
                error: Some(format!("{e:#}")),
                ..RunResult::default()
            },
        };
        eprintln!(
            "bench [host]: detvisor end-to-end run {i}/{n}: {}",
            describe(&r)
        );
        sys.runs.push(r);
    }
    sys
}

// ---------------------------------------------------------------------------------------------
// Statistics and the report.

fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

fn median_u64(values: impl Iterator<Item = u64>) -> Option<u64> {
    let mut v: Vec<f64> = values.map(|x| x as f64).collect();
    median(&mut v).map(|m| m.round() as u64)
}

#[derive(Serialize, Default)]
struct Summary {
    name: String,
    place: String,
    runs: usize,
    ok_runs: usize,
    median_ms: Option<f64>,
    min_ms: Option<f64>,
    max_ms: Option<f64>,
    wall_ms: Vec<f64>,
    /// Exits to the VMM (detvisor only), median over runs.
    vmm_exits: Option<u64>,
    vmm_exits_per_sec: Option<f64>,
    /// All VM exits KVM handled for the guest (per-VM debugfs `exits`), in the instrumented run;
    /// per second of that run's wall time.
    kvm_exits: Option<u64>,
    kvm_exits_per_sec: Option<f64>,
    kvm_stats: Option<BTreeMap<String, u64>>,
    instrumented_wall_ms: Option<f64>,
    /// How many runs' outputs `output_identical` compares.
    output_runs: usize,
    /// detvisor's own phases (median of its JSON): vm::run total, setup, final hashing.
    inner_wall_ms: Option<u64>,
    inner_setup_ms: Option<u64>,
    inner_finish_ms: Option<u64>,
    /// Whether the guest output is byte-identical across the successful runs (detvisor: the
    /// run digest, which covers the console, memory and devices; QEMU: the serial bytes).
    output_identical: Option<bool>,
    output: Option<String>,
    output_bytes: Option<u64>,
    memory: Option<MemoryPeak>,
    memory_error: Option<String>,
    error: Option<String>,
    skipped: Option<String>,
    failures: Vec<String>,
    command: Vec<String>,
}

fn summarize(name: &str, place: &str, sys: &SystemResult) -> Summary {
    let ok: Vec<&RunResult> = sys.runs.iter().filter(|r| r.ok).collect();
    let mut walls: Vec<f64> = ok.iter().map(|r| r.wall_ms).collect();
    let med = median(&mut walls);
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
        min_ms: walls.first().copied(),
        max_ms: walls.last().copied(),
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
        failures: sys
            .runs
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.error.as_ref().map(|e| format!("run {}: {e}", i + 1)))
            .collect(),
        command: sys.command.clone(),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

#[derive(Serialize)]
struct Ratios {
    detvisor_over_qemu_kvm: Option<f64>,
    detvisor_end_to_end_over_qemu_tcg_icount: Option<f64>,
    detvisor_process_over_qemu_tcg_icount: Option<f64>,
    detvisor_vm_run_over_qemu_tcg_icount: Option<f64>,
}

#[derive(Serialize)]
struct BenchReport {
    benchmark: &'static str,
    guest_command: &'static str,
    runs: u32,
    mem: &'static str,
    cmdline: String,
    qemu_machine: &'static str,
    placement: String,
    placement_reason: Option<String>,
    clock: &'static str,
    kvm_stats: Option<String>,
    detvisor: Summary,
    qemu_kvm: Summary,
    qemu_tcg_icount: Summary,
    detvisor_end_to_end: Summary,
    helper_vm: Option<Session>,
    ratios: Ratios,
    /// The host's 1/5/15-minute load averages before and after (other work on the machine
    /// makes the numbers noisy), and its CPU count.
    host_loadavg_before: Option<[f64; 3]>,
    host_loadavg_after: Option<[f64; 3]>,
    host_cpus: usize,
    all_ok: bool,
}

fn loadavg() -> Option<[f64; 3]> {
    let text = fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

fn orchestrate(args: &BootArgs) -> Result<u8> {
    let loadavg_before = loadavg();
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if args.timeout == 0 {
        bail!("--timeout must be at least 1 second");
    }
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
    let inputs = Inputs {
        kernel: image.kernel.clone(),
        initrd: image.initrd.clone(),
        bzimage: bzimage.clone(),
        qemu_initrd,
        cmdline: guest::default_cmdline(),
        ram_bytes: units::parse_size(GUEST_MEM)?,
    };
    let mut qemu = discover_qemu();
    if qemu.is_ok() && !bzimage.is_file() {
        qemu = Err(anyhow!(
            "{} is missing (QEMU boots the bzImage built with {}): rebuild the guest image",
            bzimage.display(),
            image.kernel.display()
        ));
    }
    let (use_helper, reason) = match args.host_vm {
        BenchHostVm::Always => (true, Some("--host-vm always".to_string())),
        BenchHostVm::Never => (false, None),
        BenchHostVm::Auto => {
            let report = vmm::probe::host_report();
            if report.can_run_guests {
                (false, None)
            } else {
                (true, report.reason)
            }
        }
    };
    let place = if use_helper { "helper VM" } else { "host" };
    eprintln!(
        "bench: boot `{GUEST_COMMAND}` on the default guest ({}), {GUEST_MEM} RAM, {} run(s) each; \
         detvisor and QEMU-KVM on the {place}{}",
        image.kernel.display(),
        args.runs,
        reason
            .as_deref()
            .map(|r| format!(" (because {r})"))
            .unwrap_or_default()
    );

    // 1. The deterministic peer on the host, alone on the machine.
    let tcg = tcg_baseline(args, &inputs, &qemu, tmp.path());

    // 2. detvisor and QEMU-KVM side by side.
    let (session, report) = if use_helper {
        let (s, r) = helper_session(args, &inputs, &qemu, tmp.path());
        (Some(s), r)
    } else {
        let plan = WorkerPlan {
            runs: args.runs,
            timeout_s: args.timeout,
            mem: GUEST_MEM.into(),
            ram_bytes: inputs.ram_bytes,
            cmdline: inputs.cmdline.clone(),
            kernel: inputs.kernel.clone(),
            initrd: inputs.initrd.clone(),
            bzimage: inputs.bzimage.clone(),
            qemu_initrd: inputs.qemu_initrd.clone(),
            qemu: qemu.as_ref().ok().map(|q| QemuPlan {
                bin: q.bin.clone(),
                lib_dir: None,
                interp: None,
                loader: None,
                firmware_dir: None,
            }),
            qemu_error: qemu.as_ref().err().map(|e| format!("{e:#}")),
            in_helper_vm: false,
            place: "host".into(),
        };
        (None, Some(worker(&plan)))
    };
    let session_error = session.as_ref().and_then(|s| s.error.clone());
    let (det_sys, kvm_sys, kvm_stats) = match report {
        Some(r) => (r.detvisor, r.qemu_kvm, Some(r.kvm_stats)),
        None => {
            let failed = SystemResult {
                error: Some("not measured: the helper VM session failed (see below)".into()),
                ..SystemResult::default()
            };
            (failed.clone(), failed, None)
        }
    };

    // 3. detvisor end to end, as a user runs it (helper VM boot included).
    let e2e = if use_helper && !args.no_end_to_end {
        end_to_end(args)
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
        cmdline: inputs.cmdline.clone(),
        qemu_machine: QEMU_MACHINE,
        placement: place.into(),
        placement_reason: reason,
        clock: "wall time from just before spawn() to wait() returning, CLOCK_MONOTONIC of the \
                machine the process runs on (L1's for the helper VM); memory (/proc sampled \
                every 20 ms) and KVM statistics from one extra instrumented run per system",
        kvm_stats,
        detvisor,
        qemu_kvm,
        qemu_tcg_icount: qemu_tcg,
        detvisor_end_to_end: detvisor_e2e,
        helper_vm: session,
        ratios,
        host_loadavg_before: loadavg_before,
        host_loadavg_after: loadavg(),
        host_cpus: thread::available_parallelism().map_or(0, |n| n.get()),
        all_ok,
    };
    print_report(&report)?;
    Ok(if all_ok { 0 } else { 1 })
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

fn opt_count(v: Option<u64>) -> String {
    v.map_or("n/a".into(), |v| v.to_string())
}

fn opt_rate(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0}"))
}

fn opt_ratio(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.2}x"))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn print_report(r: &BenchReport) -> Result<()> {
    let mut o = io::stdout().lock();
    writeln!(
        o,
        "detvisor bench boot: default guest runs `{}`; {} RAM; {} run(s) per system; QEMU -M {}",
        r.guest_command, r.mem, r.runs, r.qemu_machine
    )?;
    writeln!(o, "kernel cmdline (all systems): {}", r.cmdline)?;
    let load = |l: &Option<[f64; 3]>| {
        l.map_or("?".into(), |l| {
            format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
        })
    };
    writeln!(
        o,
        "host: {} CPUs, load average {} before, {} after (other work on the host adds noise)",
        r.host_cpus,
        load(&r.host_loadavg_before),
        load(&r.host_loadavg_after)
    )?;
    writeln!(
        o,
        "wall = process start to exit (spawn .. wait returns), ms, on the clock of the machine \
         running it; median [min .. max] over successful runs"
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
    for s in [
        &r.detvisor,
        &r.qemu_kvm,
        &r.qemu_tcg_icount,
        &r.detvisor_end_to_end,
    ] {
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
             {} + final hashing {finish}; the rest of its {} ms is process start, reading the \
             kernel and initrd, and exit",
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
    let place = &r.placement;
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
            "\nhelper VM: launcher start to payload start {} ms (incl. assembling a {} MiB payload \
             initrd and L1's boot), payload end to exit {} ms; payload lasted {} ms on the host's \
             clock, {} ms on L1's",
            opt_ms(s.boot_ms),
            s.payload_file_bytes >> 20,
            opt_ms(s.shutdown_ms),
            opt_ms(s.payload_host_ms),
            opt_ms(s.payload_l1_ms)
        )?;
    }
    let mut failed = false;
    for s in [
        &r.detvisor,
        &r.qemu_kvm,
        &r.qemu_tcg_icount,
        &r.detvisor_end_to_end,
    ] {
        if s.error.is_some() || !s.failures.is_empty() {
            if !failed {
                writeln!(o, "\nfailures:")?;
                failed = true;
            }
            if let Some(e) = &s.error {
                writeln!(o, "  {}: {e}", s.name)?;
            }
            for f in &s.failures {
                writeln!(o, "  {}: {f}", s.name)?;
            }
        }
    }
    if let Some(e) = r.helper_vm.as_ref().and_then(|s| s.error.as_ref()) {
        if !failed {
            writeln!(o, "\nfailures:")?;
        }
        writeln!(o, "  helper VM: {e}")?;
    }
    writeln!(o)?;
    writeln!(o, "{}", serde_json::to_string(r)?)?;
    o.flush()?;
    Ok(())
}

// =============================================================================================
// `detvisor bench snapshot`
//
// Layers (each bounded by a time limit, each a process of its own):
//
//   host: `bench snapshot`           orchestrates, prints the table and the JSON line
//     `bench snapshot --launch-plan` calls hostvm::run (helper VM, with a 9p share)
//       L1: `bench snapshot --worker-plan`   one per session: runs the cells in turn
//         `bench snapshot --cell-plan`       one per (RAM, dirty %) cell: boots the guest,
//                                            snapshots, restores, forks, resets in process
//           `bench snapshot --restore-child` one restore + first exit per process
//
// Without a helper VM (the host's KVM runs guests) the worker runs on the host directly.

/// Printed by the guest once the dirtying command has finished.
const SNAP_MARKER: &[u8] = b"detvisor-bench-dirtied";
/// A 63-character line (64 bytes with its newline) the guest writes into its RAM: non-zero, so
/// the sparse snapshot format has to store it.
const SNAP_FILLER: &str = "detvisor-snapshot-benchmark-filler-0123456789abcdefghijklmnopqrs";
/// Last stdout line of a cell process (its argument: the [`CellResult`] as JSON).
const MARK_CELL: &str = "detvisor-bench-cell ";
/// The line a restore child prints once the first exit after resume has been handled.
const MARK_FIRST_EXIT: &str = "detvisor-bench-first-exit ";
/// Time limit of one restore child process.
const RESTORE_CHILD_LIMIT: Duration = Duration::from_secs(120);
/// Sequential writes of the full-copy baseline.
const FULL_COPY_CHUNK: usize = 8 << 20;
/// Longest burst the reset calibration tries, in exits.
const BURST_MAX_EXITS: u64 = 20_000;
const PAGE: usize = 4096;
/// statfs f_type values.
const TMPFS_MAGIC: i64 = 0x0102_1994;
const EXT4_MAGIC: i64 = 0xef53;

/// Where `bench snapshot` writes its snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapStore {
    /// The helper VM's own tmpfs (/tmp in L1); without a helper VM, the host's temp directory.
    Tmpfs,
    /// A host temporary directory shared into the helper VM over virtio-9p.
    Share,
    /// Both, side by side.
    Both,
}

#[derive(Args, Debug, Clone)]
pub struct SnapshotBenchArgs {
    /// Repetitions of each snapshot, baseline and restore measurement.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Guest RAM sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "256M,1G")]
    pub mem: Vec<String>,
    /// Percentages of guest RAM the guest fills with non-zero data before the snapshot
    /// (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0.1,1,10")]
    pub dirty: Vec<f64>,
    /// Where snapshots are written (and restored from).
    #[arg(long, value_enum, default_value_t = SnapStore::Both)]
    pub store: SnapStore,
    /// Restores (+ first exit) per cell for the in-process forks-per-second loop.
    #[arg(long, default_value_t = 10)]
    pub forks: u32,
    /// Iterations of the reset loop per cell.
    #[arg(long, default_value_t = 20)]
    pub resets: u32,
    /// Pages the reset loop's burst should dirty (it runs the fewest exits that dirty this many).
    #[arg(long, default_value_t = 100)]
    pub burst_pages: u64,
    /// Time limit of each cell's process, in seconds (the helper VM gets 300 s more in all).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Where the guests run.
    #[arg(long, value_enum, default_value_t = BenchHostVm::Auto)]
    pub host_vm: BenchHostVm,
    /// Internal: run the cells described in this plan (inside the helper VM).
    #[arg(long, hide = true)]
    pub worker_plan: Option<PathBuf>,
    /// Internal: start the helper VM described in this plan.
    #[arg(long, hide = true)]
    pub launch_plan: Option<PathBuf>,
    /// Internal: measure one cell.
    #[arg(long, hide = true)]
    pub cell_plan: Option<PathBuf>,
    /// Internal: restore this snapshot directory, run to the first exit, report, exit.
    #[arg(long, hide = true)]
    pub restore_child: Option<PathBuf>,
}

fn run_snapshot_bench(args: &SnapshotBenchArgs) -> Result<u8> {
    if let Some(plan) = &args.worker_plan {
        snap_worker_main(plan)
    } else if let Some(plan) = &args.launch_plan {
        launch_main(plan)
    } else if let Some(plan) = &args.cell_plan {
        cell_main(plan)
    } else if let Some(dir) = &args.restore_child {
        restore_child_main(dir)
    } else {
        snap_orchestrate(args)
    }
}

// ---------------------------------------------------------------------------------------------
// Plans and results.

#[derive(Serialize, Deserialize, Debug, Clone)]
struct CellSpec {
    mem: String,
    ram_bytes: u64,
    dirty_pct: f64,
}

impl CellSpec {
    /// Bytes the guest writes: `dirty_pct` of RAM, whole pages.
    fn dirty_bytes(&self) -> u64 {
        let bytes = (self.ram_bytes as f64 * self.dirty_pct / 100.0) as u64;
        bytes / PAGE as u64 * PAGE as u64
    }

    fn label(&self) -> String {
        format!("{}/{}%", self.mem, self.dirty_pct)
    }
}

/// A directory snapshots are written to.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct SnapLocation {
    /// "L1 tmpfs", "9p share", "host tmp".
    name: String,
    dir: PathBuf,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct SnapWorkerPlan {
    runs: u32,
    timeout_s: u64,
    cells: Vec<CellSpec>,
    kernel: PathBuf,
    initrd: PathBuf,
    cmdline: String,
    /// Write snapshots to a directory of the worker's own temp dir (L1's tmpfs).
    local: Option<String>,
    /// The 9p share (same path in L1 and on the host).
    shared: Option<SnapLocation>,
    forks: u32,
    resets: u32,
    burst_pages: u64,
    place: String,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
struct CellPlan {
    spec: CellSpec,
    runs: u32,
    kernel: PathBuf,
    initrd: PathBuf,
    cmdline: String,
    /// Each cell writes into a subdirectory of each.
    locations: Vec<SnapLocation>,
    forks: u32,
    resets: u32,
    burst_pages: u64,
    tag: String,
}

/// The phases of one restore, in ms.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct RestorePhases {
    /// `snapshot::read_snapshot`: state.bin and memory.idx read and checked, state decoded.
    read_ms: f64,
    /// `memory_file` + `memory_chain` (the index again, for the data ranges), staging into a
    /// memfd when on 9p, `memory_from_file` (mmap MAP_PRIVATE).
    map_ms: f64,
    /// `Session::resume`: a new KVM VM over the mapping, vCPU and device state restored.
    resume_ms: f64,
    /// `run_until(exits + 1)`: enter the guest, take and handle its first exit.
    first_exit_ms: f64,
    /// read_snapshot call to the first exit handled.
    total_ms: f64,
    /// Dropping the session (KVM VM and mapping torn down); not part of `total_ms`.
    teardown_ms: Option<f64>,
    /// The memory file was on 9p and was copied into a memfd first.
    staged: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct ChildRestore {
    ok: bool,
    error: Option<String>,
    /// Just before spawn() to the arrival of its "first exit handled" line.
    to_first_exit_ms: Option<f64>,
    /// Just before spawn() to wait() returning (process exit and VM teardown included).
    wall_ms: f64,
    inner: Option<RestorePhases>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct LocationResult {
    name: String,
    dir: PathBuf,
    /// File system type (statfs).
    fs: String,
    /// `Session::capture` per run.
    capture_ms: Vec<f64>,
    /// `snapshot::write_snapshot` per run (zero-page scan, writes, CRC, fsyncs, rename).
    write_ms: Vec<f64>,
    /// capture + write per run.
    snapshot_ms: Vec<f64>,
    /// Baseline per run: all of guest RAM into one file here, 8 MiB writes, then fsync.
    full_copy_ms: Vec<f64>,
    full_copy_error: Option<String>,
    /// Of the first snapshot.
    stored_pages: u64,
    disk_bytes: u64,
    state_bytes: u64,
    /// Warm restores (after `cold_restore` in the same process).
    restores: Vec<RestorePhases>,
    /// The first restore of the cell process, untimed in the statistics.
    cold_restore: Option<RestorePhases>,
    /// 9p only: warm restores mapping memory.img over 9p without staging.
    direct_restores: Vec<RestorePhases>,
    child_restores: Vec<ChildRestore>,
    error: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct ForkResult {
    store: String,
    iterations: u32,
    total_ms: f64,
    per_sec: f64,
    /// Each iteration: read_snapshot .. first exit, then teardown.
    iteration_ms: Vec<f64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct ResetResult {
    store: String,
    /// Exits per burst (counted from the resume, the first exit included).
    burst_exits: u64,
    /// Copy-on-write pages after a burst (anonymous pages of the private mapping, from
    /// /proc/self/pagemap): guest RAM the burst wrote.
    dirty_pages: u64,
    /// Whether the calibration reached the requested page count within BURST_MAX_EXITS.
    reached_target: bool,
    /// The same count after one more reset (the guest is deterministic: it should match).
    dirty_pages_check: Option<u64>,
    iterations: u32,
    total_ms: f64,
    per_sec: f64,
    /// Medians per iteration: restore through the first exit, the rest of the burst, teardown.
    restore_ms: f64,
    burst_ms: f64,
    teardown_ms: f64,
}

/// Host-side memory revert, no KVM involved: write one byte into each of `pages` file-backed
/// pages of a MAP_PRIVATE mapping of the snapshot's memory.img (copy-on-write faults), then
/// `madvise(MADV_DONTNEED)` each page (drops the copies: the mapping reads the file again).
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct MemRevert {
    pages: u64,
    iterations: u32,
    per_reset_us: f64,
    per_sec: f64,
    content_restored: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct PageCounts {
    /// Pages of guest RAM.
    ram: u64,
    /// Pages of non-zero data the guest command wrote (the dirty fraction).
    written: u64,
    /// Pages the host has backed (mincore) at the snapshot: touched since boot by the guest or
    /// the VMM (transparent huge pages may round this up).
    resident: u64,
    /// Non-zero pages at the snapshot (= what a full snapshot stores).
    nonzero: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct CellResult {
    mem: String,
    ram_bytes: u64,
    dirty_pct: f64,
    ok: bool,
    error: Option<String>,
    /// Non-fatal problems.
    warnings: Vec<String>,
    guest_command: String,
    /// Session::boot to the marker line (kernel boot, init, the dirtying command).
    boot_and_dirty_ms: f64,
    exits_at_snapshot: u64,
    virtual_ns_at_snapshot: u64,
    pages: PageCounts,
    /// Per run: scanning all of guest RAM for non-zero pages (write_snapshot's first step, same
    /// algorithm), alone.
    zero_scan_ms: Vec<f64>,
    /// Per run: all of guest RAM copied into a pre-faulted buffer (in-memory baseline).
    memcpy_ms: Vec<f64>,
    locations: Vec<LocationResult>,
    forks: Option<ForkResult>,
    resets: Option<ResetResult>,
    memory_revert: Option<MemRevert>,
    /// Wall time of the cell process, and its time limit.
    cell_wall_ms: f64,
}

#[derive(Serialize, Deserialize, Debug, Default)]
struct SnapWorkerReport {
    place: String,
    uptime_at_start_s: Option<f64>,
    elapsed_ms: f64,
    /// MemTotal of the machine the worker runs on (L1).
    mem_total_kib: Option<u64>,
    locations: Vec<(String, String)>,
    cells: Vec<CellResult>,
}

// ---------------------------------------------------------------------------------------------
// Small helpers on memory and files.

/// The type of the file system holding `path`: the mount table's entry with the longest mount
/// point containing it (statfs is no help for 9p: with 9p2000.L its `f_type` is the host file
/// system's), else statfs's magic.
fn fs_type(path: &Path) -> String {
    if let Some(t) = mount_fs_type(path) {
        return t;
    }
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return "?".into();
    };
    // SAFETY: statfs is plain old data; all-zero is a valid value to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid statfs to fill.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "?".into();
    }
    match st.f_type as i64 {
        TMPFS_MAGIC => "tmpfs".into(),
        EXT4_MAGIC => "ext4".into(),
        other => format!("{other:#x}"),
    }
}

fn mount_fs_type(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let _source = fields.next()?;
            let point = unescape_mount_field(fields.next()?);
            let fs_type = fields.next()?;
            Some((PathBuf::from(point), fs_type.to_string()))
        })
        .filter(|(point, _)| path.starts_with(point))
        // The last of the longest: a later mount on the same point hides the earlier.
        .max_by_key(|(point, _)| point.as_os_str().len())
        .map(|(_, t)| t)
}

/// Undoes the octal escapes (`\040` for a space, ...) of a /proc/self/mounts field.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |a, c| a.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Copies the data ranges of a 9p-backed memory file into a memfd with large reads: the same
/// staging `snapshots::restore` (used by `branch` and `seek`) does before mapping.
fn stage_in_memfd(file: &fs::File, len: u64, ranges: &[(u64, u64)]) -> Result<fs::File> {
    use std::os::unix::fs::FileExt;
    // SAFETY: the name is a valid NUL-terminated string; the fd is checked, then owned below.
    let fd = unsafe { libc::memfd_create(c"detvisor-bench-memory".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error()).context("memfd_create");
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let staged = unsafe { <fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    staged.set_len(len)?;
    let mut buf = vec![0u8; 1 << 20];
    for &(start, end) in ranges {
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            file.read_exact_at(&mut buf[..n], at)?;
            staged.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
    }
    Ok(staged)
}

/// The snapshot crate's zero test (OR-folding 256-byte blocks).
fn page_is_zero(bytes: &[u8]) -> bool {
    let mut chunks = bytes.chunks_exact(256);
    for c in &mut chunks {
        if c.iter().fold(0u8, |a, &b| a | b) != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&b| b == 0)
}

fn nonzero_pages(mem: &[u8]) -> u64 {
    mem.chunks(PAGE).filter(|p| !page_is_zero(p)).count() as u64
}

/// Pages of `mem` the host has backed (mincore).
fn resident_pages(mem: &[u8]) -> Option<u64> {
    let mut v = vec![0u8; mem.len().div_ceil(PAGE)];
    // SAFETY: `mem` is a live, page-aligned mapping (guest RAM) of `mem.len()` bytes and `v`
    // has one byte per page, as mincore(2) requires; nothing is written to `mem`.
    let rc = unsafe { libc::mincore(mem.as_ptr() as *mut libc::c_void, mem.len(), v.as_mut_ptr()) };
    (rc == 0).then(|| v.iter().filter(|b| *b & 1 != 0).count() as u64)
}

/// Pages of a private file mapping `mem` that are anonymous copies now (present, neither
/// file-backed nor shared, per /proc/self/pagemap): the pages written since it was mapped.
fn cow_pages(mem: &[u8]) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    const PRESENT: u64 = 1 << 63;
    const FILE_OR_SHARED: u64 = 1 << 61;
    let pages = mem.len() / PAGE;
    let mut entries = vec![0u8; pages * 8];
    fs::File::open("/proc/self/pagemap")?
        .read_exact_at(&mut entries, (mem.as_ptr() as u64 / PAGE as u64) * 8)?;
    Ok(entries
        .chunks_exact(8)
        .map(|e| u64::from_le_bytes(e.try_into().expect("8-byte chunk")))
        .filter(|e| e & PRESENT != 0 && e & FILE_OR_SHARED == 0)
        .count() as u64)
}

fn mem_total_kib() -> Option<u64> {
    fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The baseline: all of `mem` into a new file at `path` with large sequential writes, fsync.
/// The file is removed afterwards (not timed).
fn full_copy(mem: &[u8], path: &Path) -> io::Result<Duration> {
    let started = Instant::now();
    let mut f = fs::File::create(path)?;
    for chunk in mem.chunks(FULL_COPY_CHUNK) {
        f.write_all(chunk)?;
    }
    f.sync_all()?;
    let took = started.elapsed();
    drop(f);
    fs::remove_file(path)?;
    Ok(took)
}

/// A console that discards the guest's output but notices [`SNAP_MARKER`] and keeps a tail.
struct MarkerConsole {
    seen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tail: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Write for MarkerConsole {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        use std::sync::atomic::Ordering;
        let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.extend_from_slice(buf);
        if !self.seen.load(Ordering::Relaxed)
            && tail.windows(SNAP_MARKER.len()).any(|w| w == SNAP_MARKER)
        {
            self.seen.store(true, Ordering::Relaxed);
        }
        if tail.len() > 4096 {
            let cut = tail.len() - 2048;
            tail.drain(..cut);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Restores.

/// How a restore gets the memory file's pages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Staging {
    /// Copy the stored pages into a memfd first when the file is on 9p (what
    /// `snapshots::restore` intends).
    On9p,
    /// Map the file as it is, wherever it is.
    Never,
}

/// Restores `dir` as `snapshots::restore` does (read_snapshot, memory_file, memory_chain,
/// staging on 9p, memory_from_file, Session::resume) and handles the first exit after resume.
fn restore_to_first_exit(dir: &Path, staging: Staging) -> Result<(VmSession, RestorePhases)> {
    let t0 = Instant::now();
    let (_, state): (SnapshotMeta, SessionState) = snapshot::read_snapshot(dir)
        .with_context(|| format!("reading snapshot {}", dir.display()))?;
    let t_read = Instant::now();
    let (file, len) = snapshot::memory_file(dir)?;
    let ranges: Vec<(u64, u64)> = snapshot::memory_chain(dir)?
        .iter()
        .flat_map(|layer| layer.runs.iter().map(|run| run.byte_range()))
        .collect();
    let staged = staging == Staging::On9p && fs_type(dir) == "9p";
    let file = if staged {
        stage_in_memfd(&file, len, &ranges)?
    } else {
        file
    };
    let memory = vmm::vm::memory_from_file(file, len)?;
    let t_map = Instant::now();
    let mut session = VmSession::resume(
        &vmm::vm::ResumeConfig::default(),
        &state,
        memory,
        ranges,
        Box::new(io::sink()),
        None,
    )?;
    let t_resume = Instant::now();
    let exits = session.exits();
    if let Some(stop) = session.run_until(Some(exits + 1), None)? {
        bail!("the restored guest stopped at its first exit: {stop:?}");
    }
    let t_first = Instant::now();
    Ok((
        session,
        RestorePhases {
            read_ms: ms(t_read - t0),
            map_ms: ms(t_map - t_read),
            resume_ms: ms(t_resume - t_map),
            first_exit_ms: ms(t_first - t_resume),
            total_ms: ms(t_first - t0),
            teardown_ms: None,
            staged,
        },
    ))
}

fn restore_and_teardown(dir: &Path, staging: Staging) -> Result<RestorePhases> {
    let (session, mut phases) = restore_to_first_exit(dir, staging)?;
    let t = Instant::now();
    drop(session);
    phases.teardown_ms = Some(ms(t.elapsed()));
    Ok(phases)
}

/// `bench snapshot --restore-child DIR`: one restore to the first exit, reported on stdout
/// as soon as it is handled; then the process tears the VM down and exits.
fn restore_child_main(dir: &Path) -> Result<u8> {
    let (session, phases) = restore_to_first_exit(dir, Staging::On9p)?;
    let mut out = io::stdout().lock();
    writeln!(out, "{MARK_FIRST_EXIT}{}", serde_json::to_string(&phases)?)?;
    out.flush()?;
    drop(out);
    drop(session);
    Ok(0)
}

fn child_restore(dir: &Path) -> ChildRestore {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return ChildRestore {
                error: Some(format!("cannot locate the detvisor executable: {e}")),
                ..ChildRestore::default()
            }
        }
    };
    let mut cmd = Command::new(exe);
    cmd.args(["bench", "snapshot", "--restore-child"]).arg(dir);
    let finished = match run_timed(cmd, RESTORE_CHILD_LIMIT, ErrMode::Capture, Watch::default()) {
        Ok(f) => f,
        Err(e) => {
            return ChildRestore {
                error: Some(format!("{e:#}")),
                ..ChildRestore::default()
            }
        }
    };
    let line = finished
        .lines
        .iter()
        .find(|(_, l)| l.starts_with(MARK_FIRST_EXIT));
    let mut r = ChildRestore {
        wall_ms: ms(finished.wall),
        to_first_exit_ms: line.map(|(at, _)| ms(at.duration_since(finished.started))),
        inner: line.and_then(|(_, l)| serde_json::from_str(&l[MARK_FIRST_EXIT.len()..]).ok()),
        ..ChildRestore::default()
    };
    r.ok = finished.status.is_some_and(|s| s.success()) && r.to_first_exit_ms.is_some();
    if !r.ok {
        r.error = Some(finished.failure("the restore child", RESTORE_CHILD_LIMIT));
    }
    r
}

// ---------------------------------------------------------------------------------------------
// One cell: boot, dirty, snapshot (vs baselines), restore, forks, resets.

fn snap_guest_script(dirty_bytes: u64) -> String {
    let marker = String::from_utf8_lossy(SNAP_MARKER);
    format!(
        "yes {SNAP_FILLER} | head -c {dirty_bytes} > /dev/shm/dirty; echo {marker}; i=0; \
         while :; do [ $((i % 8)) = 0 ] && echo .; printf %16384s $i > /dev/shm/b$((i % 64)); \
         i=$((i + 1)); done"
    )
}

/// `bench snapshot --cell-plan FILE`.
fn cell_main(plan_path: &Path) -> Result<u8> {
    let plan: CellPlan = serde_json::from_slice(
        &fs::read(plan_path).with_context(|| format!("cannot read {}", plan_path.display()))?,
    )
    .context("bad cell plan")?;
    let started = Instant::now();
    let mut result = CellResult {
        mem: plan.spec.mem.clone(),
        ram_bytes: plan.spec.ram_bytes,
        dirty_pct: plan.spec.dirty_pct,
        guest_command: snap_guest_script(plan.spec.dirty_bytes()),
        ..CellResult::default()
    };
    if let Err(e) = cell(&plan, &mut result) {
        result.error = Some(format!("{e:#}"));
    }
    result.ok = result.error.is_none();
    result.cell_wall_ms = ms(started.elapsed());
    for loc in &plan.locations {
        let _ = fs::remove_dir_all(loc.dir.join(cell_dir_name(&plan.spec)));
    }
    let mut out = io::stdout().lock();
    writeln!(out, "{MARK_CELL}{}", serde_json::to_string(&result)?)?;
    out.flush()?;
    Ok(0)
}

fn cell_dir_name(spec: &CellSpec) -> String {
    format!("cell-{}-{}pct", spec.mem, spec.dirty_pct)
}

fn cell(plan: &CellPlan, result: &mut CellResult) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let tag = &plan.tag;
    let spec = &plan.spec;
    let command = vec!["sh".to_string(), "-c".into(), result.guest_command.clone()];
    let config = vmm::vm::VmConfig {
        kernel: plan.kernel.clone(),
        initrd: guest::initrd_with_command(&plan.initrd, &command)?,
        cmdline: plan.cmdline.clone(),
        ram_bytes: spec.ram_bytes,
        seed: 0,
        until: None,
        rtc_epoch_unix_secs: 1_704_067_200,
        record: vmm::record::RecordConfig::default(),
        perturbation: None,
        network: None,
    };

    // 1. Boot and dirty.
    let seen = Arc::new(AtomicBool::new(false));
    let tail = Arc::new(Mutex::new(Vec::new()));
    let console = MarkerConsole {
        seen: seen.clone(),
        tail: tail.clone(),
    };
    let t = Instant::now();
    let mut session = VmSession::boot(&config, Box::new(console), None)?;
    while !seen.load(Ordering::Relaxed) {
        let exits = session.exits();
        if let Some(stop) = session.run_until(Some(exits + 1), None)? {
            let tail = tail.lock().unwrap_or_else(|e| e.into_inner()).clone();
            bail!(
                "the guest stopped ({stop:?}) before printing the marker; console ends with:\n{}",
                last_lines(&String::from_utf8_lossy(&tail), 8)
            );
        }
    }
    result.boot_and_dirty_ms = ms(t.elapsed());
    result.exits_at_snapshot = session.exits();
    result.virtual_ns_at_snapshot = session.now().0;
    let ram_pages = spec.ram_bytes / PAGE as u64;
    result.pages = PageCounts {
        ram: ram_pages,
        written: spec.dirty_bytes() / PAGE as u64,
        resident: resident_pages(session.memory()).unwrap_or(0),
        nonzero: nonzero_pages(session.memory()),
    };
    eprintln!(
        "{tag}: booted and wrote {} MiB in {:.1} s (exit {}); {} of {} pages non-zero, {} resident",
        spec.dirty_bytes() >> 20,
        result.boot_and_dirty_ms / 1000.0,
        result.exits_at_snapshot,
        result.pages.nonzero,
        ram_pages,
        result.pages.resident
    );

    // 2. Snapshots against the baselines.
    for loc in &plan.locations {
        let dir = loc.dir.join(cell_dir_name(spec));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        result.locations.push(LocationResult {
            name: loc.name.clone(),
            fs: fs_type(&dir),
            dir,
            ..LocationResult::default()
        });
    }
    let mut buffer = vec![1u8; session.memory().len()];
    // One untimed warm-up per store: the first writes into memory the machine has not used yet
    // pay for it once (under the helper VM, QEMU backing L1's RAM on first touch).
    for loc in &mut result.locations {
        let warm = session.capture().context("capturing the VM state")?;
        let meta = SnapshotMeta::new(
            "warm-up",
            session.now().0,
            session.exits(),
            warm.ram_bytes,
            warm.seed,
        );
        if let Err(e) = snapshot::write_snapshot(&loc.dir, &meta, &warm, session.memory()) {
            loc.error = Some(format!("writing the warm-up snapshot: {e}"));
            continue;
        }
        let _ = fs::remove_dir_all(loc.dir.join("warm-up"));
        if let Err(e) = full_copy(session.memory(), &loc.dir.join("full-copy.img")) {
            loc.full_copy_error = Some(format!("warm-up: {e}"));
        }
    }
    for run in 1..=plan.runs {
        let t = Instant::now();
        let n = nonzero_pages(session.memory());
        result.zero_scan_ms.push(ms(t.elapsed()));
        if n != result.pages.nonzero {
            result.warnings.push(format!(
                "run {run}: {n} non-zero pages, first count {}",
                result.pages.nonzero
            ));
        }
        let t = Instant::now();
        buffer.copy_from_slice(session.memory());
        result.memcpy_ms.push(ms(t.elapsed()));
        for loc in &mut result.locations {
            if loc.error.is_some() {
                continue;
            }
            let id = format!("run-{run}");
            let t0 = Instant::now();
            let state = session.capture().context("capturing the VM state")?;
            let t1 = Instant::now();
            let meta = SnapshotMeta::new(
                id.clone(),
                session.now().0,
                session.exits(),
                state.ram_bytes,
                state.seed,
            );
            let written = snapshot::write_snapshot(&loc.dir, &meta, &state, session.memory());
            let t2 = Instant::now();
            let info = match written {
                Ok(i) => i,
                Err(e) => {
                    loc.error = Some(format!("writing snapshot {id}: {e}"));
                    continue;
                }
            };
            loc.capture_ms.push(ms(t1 - t0));
            loc.write_ms.push(ms(t2 - t1));
            loc.snapshot_ms.push(ms(t2 - t0));
            if run == 1 {
                loc.stored_pages = info.memory_pages_stored;
                loc.disk_bytes = info.disk_bytes;
                loc.state_bytes = info.state_bytes;
            } else {
                let _ = fs::remove_dir_all(loc.dir.join(&id));
            }
            match full_copy(session.memory(), &loc.dir.join("full-copy.img")) {
                Ok(d) => loc.full_copy_ms.push(ms(d)),
                Err(e) => loc.full_copy_error = Some(e.to_string()),
            }
            eprintln!(
                "{tag}: run {run}/{} {}: snapshot {:.1} ms (capture {:.2} + write {:.1}), \
                 {} pages, {} KiB on disk; full copy {}",
                plan.runs,
                loc.name,
                ms(t2 - t0),
                ms(t1 - t0),
                ms(t2 - t1),
                info.memory_pages_stored,
                info.disk_bytes >> 10,
                loc.full_copy_ms
                    .last()
                    .filter(|_| loc.full_copy_error.is_none())
                    .map_or("failed".into(), |v| format!("{v:.1} ms")),
            );
        }
    }
    drop(buffer);
    drop(session);

    // 3. Restores: in process, then as child processes.
    for loc in &mut result.locations {
        if loc.error.is_some() {
            continue;
        }
        let dir = loc.dir.join("run-1");
        // The first restore in a process runs cold code (under TCG: not yet translated); it is
        // kept apart, and the timed ones below are warm.
        match restore_and_teardown(&dir, Staging::On9p) {
            Ok(p) => {
                eprintln!(
                    "{tag}: first (cold, untimed) restore in this process from {}: {:.1} ms",
                    loc.name, p.total_ms
                );
                loc.cold_restore = Some(p);
            }
            Err(e) => {
                loc.error = Some(format!("restore: {e:#}"));
                continue;
            }
        }
        for run in 1..=plan.runs {
            match restore_and_teardown(&dir, Staging::On9p) {
                Ok(p) => {
                    eprintln!(
                        "{tag}: restore {run}/{} from {}: {:.1} ms to the first exit (read {:.1}, \
                         map {:.1}, resume {:.1}, first exit {:.1}), teardown {:.1} ms",
                        plan.runs,
                        loc.name,
                        p.total_ms,
                        p.read_ms,
                        p.map_ms,
                        p.resume_ms,
                        p.first_exit_ms,
                        p.teardown_ms.unwrap_or(0.0)
                    );
                    loc.restores.push(p);
                }
                Err(e) => {
                    loc.error = Some(format!("restore: {e:#}"));
                    break;
                }
            }
        }
        if loc.fs == "9p" {
            for run in 1..=plan.runs {
                match restore_and_teardown(&dir, Staging::Never) {
                    Ok(p) => {
                        eprintln!(
                            "{tag}: restore {run}/{} from {}, memory.img mapped directly: {:.1} ms \
                             to the first exit (map {:.1}, first exit {:.1})",
                            plan.runs, loc.name, p.total_ms, p.map_ms, p.first_exit_ms
                        );
                        loc.direct_restores.push(p);
                    }
                    Err(e) => {
                        loc.error = Some(format!("restore without staging: {e:#}"));
                        break;
                    }
                }
            }
        }
        for run in 1..=plan.runs {
            let c = child_restore(&dir);
            eprintln!(
                "{tag}: child restore {run}/{} from {}: {}",
                plan.runs,
                loc.name,
                if c.ok {
                    format!(
                        "{:.1} ms to the first exit, {:.1} ms until reaped",
                        c.to_first_exit_ms.unwrap_or(0.0),
                        c.wall_ms
                    )
                } else {
                    format!("FAILED: {}", c.error.as_deref().unwrap_or("?"))
                }
            );
            loc.child_restores.push(c);
        }
    }

    // 4. Forks and resets, from the first store (the in-memory one when measured).
    let Some(source) = result
        .locations
        .iter()
        .find(|l| l.error.is_none())
        .map(|l| (l.name.clone(), l.dir.join("run-1")))
    else {
        bail!("no snapshot could be written or restored");
    };
    let (store, dir) = source;
    if plan.forks > 0 {
        let mut fr = ForkResult {
            store: store.clone(),
            iterations: plan.forks,
            ..ForkResult::default()
        };
        let t = Instant::now();
        for _ in 0..plan.forks {
            let i = Instant::now();
            restore_and_teardown(&dir, Staging::On9p)?;
            fr.iteration_ms.push(ms(i.elapsed()));
        }
        fr.total_ms = ms(t.elapsed());
        fr.per_sec = f64::from(plan.forks) / (fr.total_ms / 1000.0);
        eprintln!(
            "{tag}: {} sequential restores + first exit + teardown in {:.0} ms: {:.1} forks/s",
            plan.forks, fr.total_ms, fr.per_sec
        );
        result.forks = Some(fr);
    }
    if plan.resets > 0 {
        result.resets = Some(resets(plan, &store, &dir)?);
        match memory_revert(&dir, plan.burst_pages, 200) {
            Ok(m) => result.memory_revert = Some(m),
            Err(e) => result.warnings.push(format!("memory revert: {e:#}")),
        }
    }
    Ok(())
}

/// Calibrates the burst (fewest exits after resume that dirty `burst_pages` pages), then
/// times `resets` iterations of restore + burst + teardown.
fn resets(plan: &CellPlan, store: &str, dir: &Path) -> Result<ResetResult> {
    let tag = &plan.tag;
    let (mut session, _) = restore_to_first_exit(dir, Staging::On9p)?;
    let start = session.exits() - 1;
    let mut dirty = cow_pages(session.memory())?;
    while dirty < plan.burst_pages && session.exits() - start < BURST_MAX_EXITS {
        // One exit at a time for the first 512, then in steps of ~1/64 of the burst so far.
        let step = ((session.exits() - start) / 64).max(1);
        if let Some(stop) = session.run_until(Some(session.exits() + step), None)? {
            bail!("the restored guest stopped during the burst calibration: {stop:?}");
        }
        dirty = cow_pages(session.memory())?;
    }
    let burst = session.exits() - start;
    drop(session);
    let mut r = ResetResult {
        store: store.into(),
        burst_exits: burst,
        dirty_pages: dirty,
        reached_target: dirty >= plan.burst_pages,
        iterations: plan.resets,
        ..ResetResult::default()
    };
    let (mut restore, mut burst_t, mut teardown) = (Vec::new(), Vec::new(), Vec::new());
    let t = Instant::now();
    for _ in 0..plan.resets {
        let (mut s, phases) = restore_to_first_exit(dir, Staging::On9p)?;
        let b = Instant::now();
        if let Some(stop) = s.run_until(Some(start + burst), None)? {
            bail!("the restored guest stopped during a burst: {stop:?}");
        }
        let d = Instant::now();
        drop(s);
        restore.push(phases.total_ms);
        burst_t.push(ms(d - b));
        teardown.push(ms(d.elapsed()));
    }
    r.total_ms = ms(t.elapsed());
    r.per_sec = f64::from(plan.resets) / (r.total_ms / 1000.0);
    r.restore_ms = median(&mut restore).unwrap_or(0.0);
    r.burst_ms = median(&mut burst_t).unwrap_or(0.0);
    r.teardown_ms = median(&mut teardown).unwrap_or(0.0);
    // One more, untimed, to check that the burst dirties the same pages again.
    let (mut s, _) = restore_to_first_exit(dir, Staging::On9p)?;
    if s.run_until(Some(start + burst), None)?.is_none() {
        r.dirty_pages_check = cow_pages(s.memory()).ok();
    }
    drop(s);
    eprintln!(
        "{tag}: resets: burst of {burst} exits dirties {dirty} pages; {} resets in {:.0} ms: \
         {:.1} resets/s (restore {:.1} + burst {:.1} + teardown {:.1} ms)",
        plan.resets, r.total_ms, r.per_sec, r.restore_ms, r.burst_ms, r.teardown_ms
    );
    Ok(r)
}

/// An mmap, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing refers to it any more.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

/// See [`MemRevert`].
fn memory_revert(dir: &Path, pages: u64, iterations: u32) -> Result<MemRevert> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let (file, len) = snapshot::memory_file(dir)?;
    let stored: Vec<u64> = snapshot::memory_chain(dir)?
        .iter()
        .flat_map(|l| l.runs.iter().flat_map(|r| r.first..r.first + r.count))
        .collect();
    if stored.is_empty() {
        bail!("the snapshot stores no pages");
    }
    let n = (pages as usize).min(stored.len());
    let picks: Vec<usize> = (0..n)
        .map(|i| stored[i * stored.len() / n] as usize)
        .collect();
    let len = usize::try_from(len)?;
    // SAFETY: a new private mapping of `len` bytes of an open file; checked below and owned by
    // `Mapping`, which unmaps it.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_NORESERVE,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error()).context("mmap of memory.img");
    }
    let map = Mapping {
        ptr: ptr as *mut u8,
        len,
    };
    // Every `p` is a page index from the snapshot's index, so `p * PAGE` lies inside the
    // `len`-byte mapping `map`, which lives until the end of this function. Accesses are
    // volatile because the contents change under us (MADV_DONTNEED).
    // SAFETY: the offset stays inside the mapping (above).
    let at = |p: usize| unsafe { map.ptr.add(p * PAGE) };
    for &p in &picks {
        // SAFETY: see above.
        unsafe { std::ptr::read_volatile(at(p)) };
    }
    let t = Instant::now();
    for _ in 0..iterations {
        for &p in &picks {
            // SAFETY: see above.
            unsafe {
                let v = std::ptr::read_volatile(at(p));
                std::ptr::write_volatile(at(p), !v);
            }
        }
        for &p in &picks {
            // SAFETY: a page-aligned, page-long range of our own private mapping.
            let rc =
                unsafe { libc::madvise(at(p) as *mut libc::c_void, PAGE, libc::MADV_DONTNEED) };
            if rc != 0 {
                return Err(io::Error::last_os_error()).context("madvise(MADV_DONTNEED)");
            }
        }
    }
    let took = t.elapsed();
    let mut want = vec![0u8; PAGE];
    file.read_exact_at(&mut want, (picks[0] * PAGE) as u64)?;
    // SAFETY: one page of the mapping, read while nothing writes it.
    let have = unsafe { std::slice::from_raw_parts(at(picks[0]), PAGE) };
    let content_restored = have == want.as_slice();
    drop(map);
    let per_reset = took.as_secs_f64() / f64::from(iterations.max(1));
    Ok(MemRevert {
        pages: n as u64,
        iterations,
        per_reset_us: per_reset * 1e6,
        per_sec: if per_reset > 0.0 {
            1.0 / per_reset
        } else {
            0.0
        },
        content_restored,
    })
}

// ---------------------------------------------------------------------------------------------
// The worker (inside the helper VM, or on the host).

fn snap_worker(plan: &SnapWorkerPlan) -> SnapWorkerReport {
    let started = Instant::now();
    let tag = format!("bench snapshot [{}]", plan.place);
    let mut report = SnapWorkerReport {
        place: plan.place.clone(),
        uptime_at_start_s: uptime(),
        mem_total_kib: mem_total_kib(),
        ..SnapWorkerReport::default()
    };
    let fail_all = |report: &mut SnapWorkerReport, why: String| {
        for spec in &plan.cells {
            report.cells.push(CellResult {
                mem: spec.mem.clone(),
                ram_bytes: spec.ram_bytes,
                dirty_pct: spec.dirty_pct,
                error: Some(why.clone()),
                ..CellResult::default()
            });
        }
    };
    let scratch = match TempDir::new("detvisor-bench-snap-") {
        Ok(t) => t,
        Err(e) => {
            fail_all(
                &mut report,
                format!("cannot create a scratch directory: {e}"),
            );
            return report;
        }
    };
    let mut locations = Vec::new();
    if let Some(name) = &plan.local {
        let dir = scratch.path().join("snapshots");
        match fs::create_dir(&dir) {
            Ok(()) => locations.push(SnapLocation {
                name: name.clone(),
                dir,
            }),
            Err(e) => eprintln!("{tag}: cannot create {}: {e}", dir.display()),
        }
    }
    locations.extend(plan.shared.iter().cloned());
    report.locations = locations
        .iter()
        .map(|l| {
            (
                l.name.clone(),
                format!("{} ({})", l.dir.display(), fs_type(&l.dir)),
            )
        })
        .collect();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            fail_all(
                &mut report,
                format!("cannot locate the detvisor executable: {e}"),
            );
            return report;
        }
    };
    let limit = Duration::from_secs(plan.timeout_s);
    for (i, spec) in plan.cells.iter().enumerate() {
        let cell_tag = format!("{tag} {}", spec.label());
        let cell_plan = CellPlan {
            spec: spec.clone(),
            runs: plan.runs,
            kernel: plan.kernel.clone(),
            initrd: plan.initrd.clone(),
            cmdline: plan.cmdline.clone(),
            locations: locations.clone(),
            forks: plan.forks,
            resets: plan.resets,
            burst_pages: plan.burst_pages,
            tag: cell_tag.clone(),
        };
        let path = scratch.path().join(format!("cell-{i}.json"));
        let written = serde_json::to_vec(&cell_plan)
            .map_err(anyhow::Error::from)
            .and_then(|b| fs::write(&path, b).map_err(anyhow::Error::from));
        let result = written.and_then(|()| {
            let mut cmd = Command::new(&exe);
            cmd.args(["bench", "snapshot", "--cell-plan"]).arg(&path);
            run_timed(cmd, limit, ErrMode::Tee, Watch::default())
        });
        let cell = match result {
            Err(e) => CellResult {
                error: Some(format!("{e:#}")),
                ..CellResult::default()
            },
            Ok(f) => {
                let parsed = f
                    .lines
                    .iter()
                    .rev()
                    .find(|(_, l)| l.starts_with(MARK_CELL))
                    .and_then(|(_, l)| {
                        serde_json::from_str::<CellResult>(&l[MARK_CELL.len()..]).ok()
                    });
                match parsed {
                    Some(c) if f.status.is_some_and(|s| s.success()) => c,
                    Some(mut c) => {
                        c.ok = false;
                        c.error
                            .get_or_insert_with(|| f.failure("the cell process", limit));
                        c
                    }
                    None => CellResult {
                        cell_wall_ms: ms(f.wall),
                        error: Some(f.failure("the cell process", limit)),
                        ..CellResult::default()
                    },
                }
            }
        };
        let cell = CellResult {
            mem: spec.mem.clone(),
            ram_bytes: spec.ram_bytes,
            dirty_pct: spec.dirty_pct,
            ..cell
        };
        if let Some(e) = &cell.error {
            eprintln!("{cell_tag}: FAILED: {e}");
        }
        report.cells.push(cell);
    }
    report.elapsed_ms = ms(started.elapsed());
    report
}

/// `bench snapshot --worker-plan FILE`.
fn snap_worker_main(plan_path: &Path) -> Result<u8> {
    let plan: SnapWorkerPlan = serde_json::from_slice(
        &fs::read(plan_path).with_context(|| format!("cannot read {}", plan_path.display()))?,
    )
    .context("bad worker plan")?;
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "{MARK_READY}{}",
        uptime().map_or("null".into(), |u| u.to_string())
    )?;
    out.flush()?;
    drop(out);
    let report = snap_worker(&plan);
    let mut out = io::stdout().lock();
    writeln!(out, "{MARK_REPORT}{}", serde_json::to_string(&report)?)?;
    out.flush()?;
    Ok(0)
}

// ---------------------------------------------------------------------------------------------
// The host side of `bench snapshot`.

/// Runs the worker in the helper VM: kernel and initrd shipped as payload files, `share`
/// mounted read-write at its own path.
fn snap_helper_session(
    plan: &SnapWorkerPlan,
    image: &guest::GuestImage,
    share: Option<&Path>,
    memory_mib: u32,
    limit: Duration,
    tmp: &Path,
) -> (Session, Option<SnapWorkerReport>) {
    let mut session = Session::default();
    let result = (|| -> Result<SnapWorkerReport> {
        let assets = hostvm::ensure_assets(None)?;
        let mut plan = plan.clone();
        plan.kernel = hostvm::payload_path("bench/vmlinux").into();
        plan.initrd = hostvm::payload_path("bench/initrd").into();
        let plan_path = tmp.join("snapshot-worker-plan.json");
        fs::write(&plan_path, serde_json::to_vec(&plan)?)?;
        let files: Vec<(PathBuf, String)> = vec![
            (image.kernel.clone(), "bench/vmlinux".into()),
            (image.initrd.clone(), "bench/initrd".into()),
            (plan_path, "bench/plan.json".into()),
        ];
        session.payload_file_bytes = files
            .iter()
            .map(|(p, _)| fs::metadata(p).map(|m| m.len()).unwrap_or(0))
            .sum();
        let launch = LaunchPlan {
            assets_dir: assets,
            memory_mib,
            args: vec![
                "bench".into(),
                "snapshot".into(),
                "--worker-plan".into(),
                hostvm::payload_path("bench/plan.json"),
            ],
            files,
            shared_dirs: share.into_iter().map(Path::to_path_buf).collect(),
        };
        let launch_path = tmp.join("snapshot-launch-plan.json");
        fs::write(&launch_path, serde_json::to_vec(&launch)?)?;
        let exe = std::env::current_exe().context("locating the detvisor executable")?;
        let mut cmd = Command::new(exe);
        cmd.args(["bench", "snapshot", "--launch-plan"])
            .arg(&launch_path);
        eprintln!(
            "bench snapshot: starting the helper VM ({memory_mib} MiB; time limit {} s)",
            limit.as_secs()
        );
        let finished = run_timed(cmd, limit, ErrMode::Tee, Watch::default())?;
        session.total_ms = ms(finished.wall);
        let ready = finished
            .lines
            .iter()
            .find(|(_, l)| l.starts_with(MARK_READY));
        if let Some((at, line)) = ready {
            session.boot_ms = Some(ms(at.duration_since(finished.started)));
            session.l1_uptime_at_payload_s = line[MARK_READY.len()..].trim().parse().ok();
        }
        let Some((report_at, text)) = finished
            .lines
            .iter()
            .rev()
            .find(|(_, l)| l.starts_with(MARK_REPORT))
        else {
            bail!(
                "no result came back: {}",
                finished.failure("the helper VM launcher", limit)
            );
        };
        let report: SnapWorkerReport = serde_json::from_str(&text[MARK_REPORT.len()..])
            .context("unparsable result line from the helper VM")?;
        let end = finished.started + finished.wall;
        session.shutdown_ms = Some(ms(end.saturating_duration_since(*report_at)));
        if let Some((ready_at, _)) = ready {
            session.payload_host_ms = Some(ms(report_at.duration_since(*ready_at)));
        }
        session.payload_l1_ms = Some(report.elapsed_ms);
        if !finished.status.is_some_and(|s| s.success()) {
            session.error = Some(finished.failure("the helper VM launcher", limit));
        }
        Ok(report)
    })();
    match result {
        Ok(r) => (session, Some(r)),
        Err(e) => {
            session.error = Some(format!("{e:#}"));
            (session, None)
        }
    }
}

/// min / median / max of the values.
#[derive(Serialize, Debug, Clone, Copy, Default)]
struct Stat {
    n: usize,
    median: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
}

fn stat(values: impl IntoIterator<Item = f64>) -> Stat {
    let mut v: Vec<f64> = values.into_iter().collect();
    let m = median(&mut v);
    Stat {
        n: v.len(),
        median: m,
        min: v.first().copied(),
        max: v.last().copied(),
    }
}

/// One row of the report per (cell, store).
#[derive(Serialize, Debug, Default)]
struct SnapRow {
    mem: String,
    dirty_pct: f64,
    store: String,
    fs: String,
    snapshot_ms: Stat,
    capture_ms: Stat,
    write_ms: Stat,
    full_copy_ms: Stat,
    snapshot_over_full_copy: Option<f64>,
    memcpy_ms: Stat,
    snapshot_over_memcpy: Option<f64>,
    zero_scan_ms: Stat,
    stored_pages: u64,
    disk_bytes: u64,
    state_bytes: u64,
    restore_ms: Stat,
    restore_read_ms: Stat,
    restore_map_ms: Stat,
    restore_resume_ms: Stat,
    restore_first_exit_ms: Stat,
    restore_teardown_ms: Stat,
    /// The first restore in the cell process (cold code), to the first exit.
    restore_cold_ms: Option<f64>,
    /// 9p only: restores that map memory.img over 9p without staging.
    direct_restore_ms: Stat,
    direct_map_ms: Stat,
    direct_first_exit_ms: Stat,
    direct_teardown_ms: Stat,
    /// Restore to first exit over the snapshot latency.
    restore_over_snapshot: Option<f64>,
    child_first_exit_ms: Stat,
    child_wall_ms: Stat,
    /// 1000 / median child wall: sequential child processes per second.
    child_forks_per_sec: Option<f64>,
    error: Option<String>,
}

fn snap_rows(cells: &[CellResult]) -> Vec<SnapRow> {
    let mut rows = Vec::new();
    for c in cells {
        for l in &c.locations {
            let snapshot_ms = stat(l.snapshot_ms.iter().copied());
            let full_copy_ms = stat(l.full_copy_ms.iter().copied());
            let memcpy_ms = stat(c.memcpy_ms.iter().copied());
            let restore_ms = stat(l.restores.iter().map(|r| r.total_ms));
            let ok_children: Vec<&ChildRestore> =
                l.child_restores.iter().filter(|c| c.ok).collect();
            let child_wall_ms = stat(ok_children.iter().map(|c| c.wall_ms));
            rows.push(SnapRow {
                mem: c.mem.clone(),
                dirty_pct: c.dirty_pct,
                store: l.name.clone(),
                fs: l.fs.clone(),
                snapshot_over_full_copy: ratio(snapshot_ms.median, full_copy_ms.median),
                snapshot_over_memcpy: ratio(snapshot_ms.median, memcpy_ms.median),
                restore_over_snapshot: ratio(restore_ms.median, snapshot_ms.median),
                snapshot_ms,
                capture_ms: stat(l.capture_ms.iter().copied()),
                write_ms: stat(l.write_ms.iter().copied()),
                full_copy_ms,
                memcpy_ms,
                zero_scan_ms: stat(c.zero_scan_ms.iter().copied()),
                stored_pages: l.stored_pages,
                disk_bytes: l.disk_bytes,
                state_bytes: l.state_bytes,
                restore_ms,
                restore_read_ms: stat(l.restores.iter().map(|r| r.read_ms)),
                restore_map_ms: stat(l.restores.iter().map(|r| r.map_ms)),
                restore_resume_ms: stat(l.restores.iter().map(|r| r.resume_ms)),
                restore_first_exit_ms: stat(l.restores.iter().map(|r| r.first_exit_ms)),
                restore_teardown_ms: stat(l.restores.iter().filter_map(|r| r.teardown_ms)),
                restore_cold_ms: l.cold_restore.as_ref().map(|r| r.total_ms),
                direct_restore_ms: stat(l.direct_restores.iter().map(|r| r.total_ms)),
                direct_map_ms: stat(l.direct_restores.iter().map(|r| r.map_ms)),
                direct_first_exit_ms: stat(l.direct_restores.iter().map(|r| r.first_exit_ms)),
                direct_teardown_ms: stat(l.direct_restores.iter().filter_map(|r| r.teardown_ms)),
                child_first_exit_ms: stat(ok_children.iter().filter_map(|c| c.to_first_exit_ms)),
                child_forks_per_sec: child_wall_ms
                    .median
                    .filter(|m| *m > 0.0)
                    .map(|m| 1000.0 / m),
                child_wall_ms,
                error: l.error.clone().or_else(|| l.full_copy_error.clone()),
            });
        }
    }
    rows
}

#[derive(Serialize)]
struct SnapBenchReport {
    benchmark: &'static str,
    runs: u32,
    mem: Vec<String>,
    dirty_pct: Vec<f64>,
    forks: u32,
    resets: u32,
    burst_pages: u64,
    guest_command: String,
    cmdline: String,
    placement: String,
    placement_reason: Option<String>,
    clock: &'static str,
    definitions: BTreeMap<&'static str, &'static str>,
    anchors: [&'static str; 4],
    stores: Vec<(String, String)>,
    l1_mem_total_kib: Option<u64>,
    rows: Vec<SnapRow>,
    cells: Vec<CellResult>,
    helper_vm: Option<Session>,
    error: Option<String>,
    host_loadavg_before: Option<[f64; 3]>,
    host_loadavg_after: Option<[f64; 3]>,
    host_cpus: usize,
    all_ok: bool,
}

const SNAP_ANCHORS: [&str; 4] = [
    "Firecracker restores a snapshot from disk in under 8 ms (2 vCPU, 512 MiB guest)",
    "detvisor's goal: an in-memory fork in under 1 ms at 1 GiB RAM / 1% dirty, on hardware KVM",
    "kAFL: up to 17,000 executions/s",
    "detvisor's goal: 20,000 resets/s at 100 dirty pages, on hardware KVM",
];

fn snap_definitions() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        (
            "snapshot",
            "after one untimed warm-up snapshot and full copy per store: Session::capture (vCPU, \
             devices, clock, records) + snapshot::write_snapshot into a new directory of the \
             store: scan of all RAM for non-zero pages, pwrite of those pages into a sparse \
             memory.img, CRC-64 over them, memory.idx and state.bin, fsync of each file and the \
             directory, rename, fsync of the root",
        ),
        (
            "full_copy",
            "baseline: all of guest RAM (every byte of the mapping, zero pages included) written \
             to one new file in the same store with 8 MiB sequential write(2)s, then fsync; the \
             file is removed afterwards, untimed",
        ),
        (
            "memcpy",
            "baseline: all of guest RAM copied into a pre-faulted buffer of the same size in the \
             same process (no file system)",
        ),
        (
            "zero_scan",
            "the zero-page scan of all RAM alone (write_snapshot's first step, same algorithm)",
        ),
        (
            "restore",
            "from the call to snapshot::read_snapshot to the first guest exit after resume \
             handled, in one process, as snapshots::restore does it: read_snapshot, memory_file, \
             memory_chain, (9p: copy the stored pages into a memfd), memory_from_file \
             (MAP_PRIVATE, pages fault in lazily), Session::resume (new KVM VM), \
             run_until(+1 exit)",
        ),
        (
            "child",
            "a `detvisor bench snapshot --restore-child DIR` process: from just before spawn() \
             to the arrival of its line printed after the first exit (exec, dynamic loading and \
             process start included), and until wait() returns (VM teardown, exit)",
        ),
        (
            "forks_per_sec",
            "in-process: N sequential (restore to the first exit + teardown) in one process, N / \
             total time; child: 1000 / median child wall (sequential child processes)",
        ),
        (
            "resets_per_sec",
            "in-process loop from the first store: restore (full Session::resume: new KVM VM \
             over a fresh MAP_PRIVATE mapping) + a burst of K exits + teardown; K is the fewest \
             exits after resume whose copy-on-write pages (/proc/self/pagemap) reach \
             --burst-pages; the vmm has no in-place reset, so each reset is a full restore",
        ),
        (
            "memory_revert",
            "host-side memory part of an in-place reset, no KVM: write one byte to each of \
             --burst-pages stored pages of a MAP_PRIVATE mapping of memory.img (copy-on-write \
             faults), then madvise(MADV_DONTNEED) each of them",
        ),
        (
            "pages",
            "written: pages of non-zero data the guest command wrote; resident: guest RAM pages \
             the host backed at the snapshot (mincore; touched since boot, THP may round up); \
             stored: pages in memory.idx (the non-zero pages); disk: st_blocks of the snapshot's \
             files",
        ),
    ])
}

fn snap_orchestrate(args: &SnapshotBenchArgs) -> Result<u8> {
    let loadavg_before = loadavg();
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if args.timeout == 0 {
        bail!("--timeout must be at least 1 second");
    }
    let mut mems = Vec::new();
    for m in &args.mem {
        let bytes = units::parse_size(m).with_context(|| format!("--mem {m}"))?;
        if bytes < 64 << 20 || bytes % PAGE as u64 != 0 {
            bail!("--mem {m}: guest RAM must be at least 64M and a multiple of 4 KiB");
        }
        mems.push((m.clone(), bytes));
    }
    for d in &args.dirty {
        if !(0.0..=40.0).contains(d) {
            bail!(
                "--dirty {d}: percentages must be within 0..=40 (the guest's /dev/shm holds \
                 half its RAM)"
            );
        }
    }
    if mems.is_empty() || args.dirty.is_empty() {
        bail!("--mem and --dirty need at least one value each");
    }
    let cells: Vec<CellSpec> = mems
        .iter()
        .flat_map(|(mem, ram_bytes)| {
            args.dirty.iter().map(move |&dirty_pct| CellSpec {
                mem: mem.clone(),
                ram_bytes: *ram_bytes,
                dirty_pct,
            })
        })
        .collect();
    let image = guest::default_image()?;
    let (use_helper, reason) = match args.host_vm {
        BenchHostVm::Always => (true, Some("--host-vm always".to_string())),
        BenchHostVm::Never => (false, None),
        BenchHostVm::Auto => {
            let report = vmm::probe::host_report();
            if report.can_run_guests {
                (false, None)
            } else {
                (true, report.reason)
            }
        }
    };
    let place = if use_helper { "helper VM" } else { "host" };
    let tmp = TempDir::new("detvisor-bench-snap-")
        .context("cannot create a temporary directory for the benchmark")?;
    let want_tmpfs = matches!(args.store, SnapStore::Tmpfs | SnapStore::Both);
    let want_share = matches!(args.store, SnapStore::Share | SnapStore::Both);
    let share = if use_helper && want_share {
        let dir = tmp.path().join("share");
        fs::create_dir(&dir)?;
        Some(dir.canonicalize()?)
    } else {
        None
    };
    if !use_helper && want_share && !want_tmpfs {
        bail!("--store share needs the helper VM (the 9p share exists only there)");
    }
    let max_ram_mib = mems.iter().map(|(_, b)| b >> 20).max().unwrap_or(256);
    // The guest, a same-size copy buffer, a full-copy file in tmpfs, snapshots, the kernel.
    let memory_mib = u32::try_from(max_ram_mib * 3 + 1536)
        .unwrap_or(u32::MAX)
        .max(2048);
    let plan = SnapWorkerPlan {
        runs: args.runs,
        timeout_s: args.timeout,
        cells: cells.clone(),
        kernel: image.kernel.clone(),
        initrd: image.initrd.clone(),
        cmdline: guest::default_cmdline(),
        local: want_tmpfs.then(|| {
            if use_helper {
                "L1 tmpfs".to_string()
            } else {
                "host tmp".to_string()
            }
        }),
        shared: share.as_ref().map(|dir| SnapLocation {
            name: "9p share".into(),
            dir: dir.clone(),
        }),
        forks: args.forks,
        resets: args.resets,
        burst_pages: args.burst_pages,
        place: place.into(),
    };
    eprintln!(
        "bench snapshot: {} cell(s) ({} x {}), {} run(s) each, guests in the {place}{}",
        cells.len(),
        args.mem.join(","),
        args.dirty
            .iter()
            .map(|d| format!("{d}%"))
            .collect::<Vec<_>>()
            .join(","),
        args.runs,
        reason
            .as_deref()
            .map(|r| format!(" (because {r})"))
            .unwrap_or_default()
    );
    let limit = HELPER_VM_ALLOWANCE + Duration::from_secs(args.timeout * cells.len() as u64);
    let (session, report) = if use_helper {
        let (s, r) = snap_helper_session(
            &plan,
            &image,
            share.as_deref(),
            memory_mib,
            limit,
            tmp.path(),
        );
        (Some(s), r)
    } else {
        (None, Some(snap_worker(&plan)))
    };
    let error = session.as_ref().and_then(|s| s.error.clone());
    let (cells_out, stores, l1_mem) = match report {
        Some(r) => (r.cells, r.locations, r.mem_total_kib),
        None => (
            cells
                .iter()
                .map(|c| CellResult {
                    mem: c.mem.clone(),
                    ram_bytes: c.ram_bytes,
                    dirty_pct: c.dirty_pct,
                    error: Some("not measured: the helper VM session failed (see below)".into()),
                    ..CellResult::default()
                })
                .collect(),
            Vec::new(),
            None,
        ),
    };
    let rows = snap_rows(&cells_out);
    let all_ok = error.is_none()
        && cells_out.iter().all(|c| c.ok && c.error.is_none())
        && rows.iter().all(|r| r.error.is_none());
    let report = SnapBenchReport {
        benchmark: "snapshot",
        runs: args.runs,
        mem: args.mem.clone(),
        dirty_pct: args.dirty.clone(),
        forks: args.forks,
        resets: args.resets,
        burst_pages: args.burst_pages,
        guest_command: snap_guest_script(0).replace("head -c 0", "head -c <dirty bytes>"),
        cmdline: guest::default_cmdline(),
        placement: place.into(),
        placement_reason: reason,
        clock: "Instant (CLOCK_MONOTONIC) of the machine running the step: L1's inside the \
                helper VM (under TCG without icount it follows the host's real time)",
        definitions: snap_definitions(),
        anchors: SNAP_ANCHORS,
        stores,
        l1_mem_total_kib: l1_mem,
        rows,
        cells: cells_out,
        helper_vm: session,
        error,
        host_loadavg_before: loadavg_before,
        host_loadavg_after: loadavg(),
        host_cpus: thread::available_parallelism().map_or(0, |n| n.get()),
        all_ok,
    };
    print_snap_report(&report)?;
    Ok(if all_ok { 0 } else { 1 })
}

fn fmt_ms(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v < 10.0 => format!("{v:.2}"),
        Some(v) if v < 100.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
    }
}

fn fmt_stat(s: &Stat) -> String {
    match (s.median, s.min, s.max) {
        (Some(m), Some(lo), Some(hi)) if s.n > 1 => {
            format!(
                "{} [{}..{}]",
                fmt_ms(Some(m)),
                fmt_ms(Some(lo)),
                fmt_ms(Some(hi))
            )
        }
        (Some(m), _, _) => fmt_ms(Some(m)),
        _ => "-".into(),
    }
}

fn print_snap_report(r: &SnapBenchReport) -> Result<()> {
    let mut o = io::stdout().lock();
    let load = |l: &Option<[f64; 3]>| {
        l.map_or("?".into(), |l| {
            format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2])
        })
    };
    writeln!(
        o,
        "detvisor bench snapshot: default guest, RAM {}, dirty {}% of RAM; {} run(s) per \
         measurement",
        r.mem.join(", "),
        r.dirty_pct
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join("%, "),
        r.runs
    )?;
    writeln!(
        o,
        "guests run in the {}{}",
        r.placement,
        r.placement_reason
            .as_deref()
            .map(|w| format!(" (QEMU TCG + nested SVM, because {w})"))
            .unwrap_or_default()
    )?;
    writeln!(
        o,
        "guest command (snapshot taken at the exit where its marker line appears): sh -c '{}'",
        r.guest_command
    )?;
    for (name, dir) in &r.stores {
        writeln!(o, "store {name}: {dir}")?;
    }
    if let Some(kib) = r.l1_mem_total_kib {
        writeln!(
            o,
            "memory of the machine running the guests: {} MiB",
            kib >> 10
        )?;
    }
    writeln!(
        o,
        "host: {} CPUs, load average {} before, {} after (other work on the host adds noise)",
        r.host_cpus,
        load(&r.host_loadavg_before),
        load(&r.host_loadavg_after)
    )?;
    writeln!(
        o,
        "times in ms on {}; median [min..max] over the runs",
        if r.placement == "helper VM" {
            "L1's monotonic clock"
        } else {
            "the host's monotonic clock"
        }
    )?;

    writeln!(
        o,
        "\n1. snapshot latency = capture + write_snapshot (to disk, fsynced), against full-copy \
         baselines"
    )?;
    writeln!(
        o,
        "{:<6} {:>6} {:<9} {:>9} {:>18} {:>18} {:>8} {:>9} {:>8} {:>9}",
        "RAM",
        "dirty",
        "store",
        "capture",
        "snapshot",
        "full copy (file)",
        "ratio",
        "memcpy",
        "ratio",
        "zero scan"
    )?;
    for row in &r.rows {
        writeln!(
            o,
            "{:<6} {:>5}% {:<9} {:>9} {:>18} {:>18} {:>8} {:>9} {:>8} {:>9}",
            row.mem,
            row.dirty_pct,
            row.store,
            fmt_ms(row.capture_ms.median),
            fmt_stat(&row.snapshot_ms),
            fmt_stat(&row.full_copy_ms),
            opt_ratio(row.snapshot_over_full_copy),
            fmt_ms(row.memcpy_ms.median),
            opt_ratio(row.snapshot_over_memcpy),
            fmt_ms(row.zero_scan_ms.median),
        )?;
    }
    writeln!(
        o,
        "  snapshot: {}\n  full copy: {}\n  memcpy: {}\n  zero scan: {}\n  ratio = snapshot / \
         baseline (below 1: the snapshot is faster)",
        snap_definitions()["snapshot"],
        snap_definitions()["full_copy"],
        snap_definitions()["memcpy"],
        snap_definitions()["zero_scan"]
    )?;

    writeln!(
        o,
        "\nmemory per snapshot against dirty pages (first snapshot of each cell)"
    )?;
    writeln!(
        o,
        "{:<6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10} {:>10} {:>9} {:>10}",
        "RAM",
        "dirty",
        "RAM pg",
        "written",
        "resident",
        "stored",
        "stored%",
        "stored/wr",
        "disk MiB",
        "state KiB",
        "store"
    )?;
    for c in &r.cells {
        for l in &c.locations {
            writeln!(
                o,
                "{:<6} {:>5}% {:>9} {:>9} {:>9} {:>9} {:>7.2}% {:>10} {:>10.1} {:>9.1} {:>10}",
                c.mem,
                c.dirty_pct,
                c.pages.ram,
                c.pages.written,
                c.pages.resident,
                l.stored_pages,
                if c.pages.ram > 0 {
                    100.0 * l.stored_pages as f64 / c.pages.ram as f64
                } else {
                    0.0
                },
                if c.pages.written > 0 {
                    format!("{:.2}x", l.stored_pages as f64 / c.pages.written as f64)
                } else {
                    "-".into()
                },
                l.disk_bytes as f64 / (1 << 20) as f64,
                l.state_bytes as f64 / 1024.0,
                l.name
            )?;
        }
    }
    writeln!(o, "  {}", snap_definitions()["pages"])?;

    writeln!(
        o,
        "\n2. restore latency = read_snapshot .. first guest exit after resume handled"
    )?;
    let line = |o: &mut io::StdoutLock, c: [&str; 15]| {
        writeln!(
            o,
            "{:<6} {:>6} {:<9} {:>6} {:>6} {:>6} {:>6} {:>15} {:>6} {:>8} {:>15} {:>15} {:>7} \
             {:>9} {:>8}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            c[6],
            c[7],
            c[8],
            c[9],
            c[10],
            c[11],
            c[12],
            c[13],
            c[14]
        )
    };
    line(
        &mut o,
        [
            "RAM",
            "dirty",
            "store",
            "read",
            "map",
            "resume",
            "1st ex",
            "warm total",
            "cold",
            "teardown",
            "child->1st ex",
            "child wall",
            "",
            "forks/s",
            "child f/s",
        ],
    )?;
    for row in &r.rows {
        let forks = r
            .cells
            .iter()
            .find(|c| c.mem == row.mem && c.dirty_pct == row.dirty_pct)
            .and_then(|c| c.forks.as_ref())
            .filter(|f| f.store == row.store);
        let dirty = format!("{}%", row.dirty_pct);
        line(
            &mut o,
            [
                &row.mem,
                &dirty,
                &row.store,
                &fmt_ms(row.restore_read_ms.median),
                &fmt_ms(row.restore_map_ms.median),
                &fmt_ms(row.restore_resume_ms.median),
                &fmt_ms(row.restore_first_exit_ms.median),
                &fmt_stat(&row.restore_ms),
                &fmt_ms(row.restore_cold_ms),
                &fmt_ms(row.restore_teardown_ms.median),
                &fmt_stat(&row.child_first_exit_ms),
                &fmt_stat(&row.child_wall_ms),
                "",
                &forks.map_or("-".into(), |f| format!("{:.1}", f.per_sec)),
                &opt_rate1(row.child_forks_per_sec),
            ],
        )?;
        if row.direct_restore_ms.n > 0 {
            line(
                &mut o,
                [
                    "",
                    "",
                    " (direct)",
                    "",
                    &fmt_ms(row.direct_map_ms.median),
                    "",
                    &fmt_ms(row.direct_first_exit_ms.median),
                    &fmt_stat(&row.direct_restore_ms),
                    "",
                    &fmt_ms(row.direct_teardown_ms.median),
                    "",
                    "",
                    "",
                    "",
                    "",
                ],
            )?;
        }
    }
    writeln!(
        o,
        "  restore: {}\n  warm total: median [min..max] of the timed restores, which follow one \
         untimed restore in the same process; cold: that first restore (code not yet run in the \
         process)\n  map: on 9p it includes staging (copying the stored pages into a memfd); \
         \"(direct)\": restores that map memory.img over 9p without staging, page faults going \
         to 9p\n  child: {}\n  forks/s: {}",
        snap_definitions()["restore"],
        snap_definitions()["child"],
        snap_definitions()["forks_per_sec"]
    )?;

    writeln!(
        o,
        "\n3. resets (fuzzing-like loop: restore the same snapshot, run a short burst, repeat)"
    )?;
    writeln!(
        o,
        "{:<6} {:>6} {:<9} {:>7} {:>11} {:>9} {:>9} {:>8} {:>9} {:>24}",
        "RAM",
        "dirty",
        "store",
        "burst",
        "dirty pages",
        "resets/s",
        "restore",
        "burst",
        "teardown",
        "memory-only revert"
    )?;
    for c in &r.cells {
        let Some(s) = &c.resets else { continue };
        let revert = c.memory_revert.as_ref().map_or("-".into(), |m| {
            format!(
                "{:.0} us = {:.0}/s ({} pg)",
                m.per_reset_us, m.per_sec, m.pages
            )
        });
        writeln!(
            o,
            "{:<6} {:>5}% {:<9} {:>7} {:>11} {:>9.1} {:>9} {:>8} {:>9} {:>24}",
            c.mem,
            c.dirty_pct,
            s.store,
            format!("{} ex", s.burst_exits),
            match s.dirty_pages_check {
                Some(check) if check != s.dirty_pages => format!("{}/{check}", s.dirty_pages),
                _ => s.dirty_pages.to_string(),
            },
            s.per_sec,
            fmt_ms(Some(s.restore_ms)),
            fmt_ms(Some(s.burst_ms)),
            fmt_ms(Some(s.teardown_ms)),
            revert
        )?;
    }
    writeln!(
        o,
        "  resets/s: {}\n  memory-only revert: {}",
        snap_definitions()["resets_per_sec"],
        snap_definitions()["memory_revert"]
    )?;

    writeln!(
        o,
        "\nanchors, for context only (not claims about these numbers):"
    )?;
    for a in &r.anchors {
        writeln!(o, "  - {a}")?;
    }
    if r.placement == "helper VM" {
        writeln!(
            o,
            "  everything above ran under nested virtualization on an emulated CPU (QEMU TCG), \
             orders of magnitude slower than hardware KVM: compare ratios against the in-run \
             baselines, not absolute numbers against the anchors"
        )?;
    }
    if let Some(s) = r.helper_vm.as_ref().filter(|s| s.boot_ms.is_some()) {
        writeln!(
            o,
            "\nhelper VM: launcher start to payload start {} ms, payload end to exit {} ms; \
             payload lasted {} ms on the host's clock, {} ms on L1's",
            opt_ms(s.boot_ms),
            opt_ms(s.shutdown_ms),
            opt_ms(s.payload_host_ms),
            opt_ms(s.payload_l1_ms)
        )?;
    }
    let mut failures = Vec::new();
    for c in &r.cells {
        let name = format!("{}/{}%", c.mem, c.dirty_pct);
        if let Some(e) = &c.error {
            failures.push(format!("{name}: {e}"));
        }
        for w in &c.warnings {
            failures.push(format!("{name} (warning): {w}"));
        }
        for l in &c.locations {
            if let Some(e) = l.error.as_ref().or(l.full_copy_error.as_ref()) {
                failures.push(format!("{name} {}: {e}", l.name));
            }
            for (i, ch) in l.child_restores.iter().enumerate() {
                if let Some(e) = &ch.error {
                    failures.push(format!("{name} {} child restore {}: {e}", l.name, i + 1));
                }
            }
        }
        if let Some(s) = &c.resets {
            if !s.reached_target {
                failures.push(format!(
                    "{name} (warning): the burst dirtied only {} pages within {} exits",
                    s.dirty_pages, s.burst_exits
                ));
            }
        }
        if let Some(m) = &c.memory_revert {
            if !m.content_restored {
                failures.push(format!(
                    "{name}: memory revert did not restore the page contents"
                ));
            }
        }
    }
    if let Some(e) = &r.error {
        failures.push(format!("helper VM: {e}"));
    }
    if !failures.is_empty() {
        writeln!(o, "\nfailures and warnings:")?;
        for f in failures {
            writeln!(o, "  {f}")?;
        }
    }
    writeln!(o)?;
    writeln!(o, "{}", serde_json::to_string(r)?)?;
    o.flush()?;
    Ok(())
}

fn opt_rate1(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

// ---------------------------------------------------------------------------------------------

/// A private temporary directory, removed with its contents on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        for n in 0..1000u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = base.join(format!("{prefix}{}-{nanos:x}-{n}", std::process::id()));
            match fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(TempDir(path)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other("no free temporary directory name"))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn guest_mapping_is_found_in_smaps() {
        let smaps = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
Rss:                  12 kB
7f0000000000-7f0010000000 rw-p 00000000 00:00 0 
Size:             262144 kB
Rss:               30720 kB
7f0010000000-7f0010200000 r-xp 00000000 08:01 1234                       /usr/lib/libc.so.6
Size:               2048 kB
Rss:                1024 kB
";
        assert_eq!(guest_mapping_rss(smaps, 262144), (Some(30720), "exact"));
        assert_eq!(guest_mapping_rss(smaps, 200000), (Some(30720), "approx"));
        assert_eq!(guest_mapping_rss(smaps, 300000), (None, "not found"));
    }

    #[test]
    fn mount_fields_are_unescaped() {
        assert_eq!(unescape_mount_field("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mount_field("/plain"), "/plain");
        assert_eq!(unescape_mount_field("/x\\"), "/x\\");
        assert_eq!(
            mount_fs_type(Path::new("/proc/self")).as_deref(),
            Some("proc")
        );
    }

    #[test]
    fn dirty_bytes_are_whole_pages() {
        let spec = CellSpec {
            mem: "256M".into(),
            ram_bytes: 256 << 20,
            dirty_pct: 0.1,
        };
        assert_eq!(spec.dirty_bytes() % PAGE as u64, 0);
        assert_eq!(spec.dirty_bytes() / PAGE as u64, 65);
        assert!(snap_guest_script(4096).contains("head -c 4096 "));
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), "cbf29ce484222325");
        assert_eq!(fnv1a(b"a"), "af63dc4c8601ec8c");
    }

    #[test]
    fn timed_process_is_killed_at_its_limit() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let f = run_timed(
            cmd,
            Duration::from_millis(200),
            ErrMode::Capture,
            Watch::default(),
        )
        .unwrap();
        assert!(f.timed_out);
        assert!(f.wall < Duration::from_secs(10));
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo one; echo two >&2; exit 3"]);
        let f = run_timed(
            cmd,
            Duration::from_secs(30),
            ErrMode::Capture,
            Watch {
                ram: Some(1 << 20),
                kvm: true,
            },
        )
        .unwrap();
        assert!(!f.timed_out);
        assert_eq!(f.status.and_then(|s| s.code()), Some(3));
        assert_eq!(f.stdout_text(), "one");
        assert_eq!(f.stderr_text(), "two");
    }
}
