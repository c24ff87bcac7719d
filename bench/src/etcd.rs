//! `detvisor bench etcd [--runs N]`: the etcd example (`examples/etcd/cluster.toml`: three
//! members healthy, a put and a get by the `etcd-smoke` workload) run by detvisor and by a
//! deterministic peer, side by side in one run:
//!
//! 1. **QEMU TCG with `-icount shift=0,sleep=off`** on the host ([`crate::etcd_baseline`]): the same kernel
//!    and the same assembled initrd, with a script doing what the agent does (namespaces, a
//!    root and a NIC per node; a bridge for the switch); its serial output is compared across
//!    runs.
//! 2. **detvisor**: the run `detvisor up <manifest> --quiet` makes (`run::api::Request::Up`,
//!    the guest assembled once on the host by `run::up::prepare`, as `detvisor up` does),
//!    carried out by the run library in the worker's process on a thread of its own, inside the
//!    helper VM (L1) when the host's KVM cannot run guests (else on the host). Its run digest
//!    (console, with everything the agent said, memory and devices) is compared across runs.
//!
//! The node image is built here when missing or stale: `examples/etcd/build-oci.sh` (cached
//! OCI layout), then the node image of `<layout>:latest` (what `detvisor image build` writes)
//! at `<cache>/examples/etcd-bench/etcd.img`, next to a copy of `cluster.toml` (whose `image =
//! "etcd.img"` is relative to the manifest). The wall time of a run is spawn to exit of the
//! process for QEMU, the request's call to its return for detvisor (VM creation to teardown),
//! on the clock of the machine it runs on.

#[path = "etcd_report.rs"]
mod report;

use anyhow::{bail, Context, Result};
use clap::Args;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::check_runs_and_timeout;
use super::etcd_baseline;
use super::etcd_worker::{describe, worker, EtcdWorkerPlan, EtcdWorkerReport};
use super::helper::HelperLaunch;
use super::machine::{loadavg, TempDir};
use super::process::command_words;
use super::report::{because, Session, NOT_MEASURED};
use super::serve::BenchCall;
use crate::say;
use helper_vm::HostVmMode;
use run::up::{Initrd, PreparedUp};

use run::{guest, manifest, units, up};
use vmm::VirtNanos;

/// Guest RAM when the manifest says nothing.
const DEFAULT_MEM: &str = "1G";
const DEFAULT_RTC_EPOCH: i64 = 1_704_067_200;

#[derive(Args, Debug, Clone)]
pub struct EtcdArgs {
    /// Repetitions per side.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Time limit of each run, in seconds (the helper VM gets 300 s more in all); a run over
    /// it is killed and counted as failed.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// detvisor's seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// detvisor's virtual-time limit (`detvisor up --until`).
    #[arg(long, default_value = "300s")]
    pub until: VirtNanos,
    /// Where detvisor runs.
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    pub host_vm: HostVmMode,
    /// Do not run the QEMU TCG baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// Do not run detvisor.
    #[arg(long)]
    pub no_detvisor: bool,
}

// ---------------------------------------------------------------------------------------------
// The host side.

/// Runs a command to its end, its stderr passed through; returns its stdout.
fn run_tool(mut cmd: Command, what: &str) -> Result<String> {
    cmd.stdin(Stdio::null()).stderr(Stdio::inherit());
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!("{what} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The node image and the manifest beside it: builds (or reuses) the OCI layout with
/// `examples/etcd/build-oci.sh`, then `etcd.img` from it unless it was built from the same
/// layout (`etcd.img.source` holds the layout's `index.json` and `stamp`).
fn prepare_manifest(file: &str) -> Result<PathBuf> {
    let example = guest::source_dir().join("examples/etcd");
    let script = example.join("build-oci.sh");
    if !script.is_file() {
        bail!(
            "{} is missing: bench etcd needs the source tree it was built from",
            script.display()
        );
    }
    say!("bench: the etcd OCI layout ({})", script.display());
    let out = run_tool(Command::new(&script), "examples/etcd/build-oci.sh")?;
    let layout = PathBuf::from(
        out.lines()
            .last()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .context("build-oci.sh printed no layout directory")?,
    );
    let dir = guest::cache_root().join("examples/etcd-bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let img = dir.join("etcd.img");
    let source_file = dir.join("etcd.img.source");
    let mut source = fs::read(layout.join("index.json"))
        .with_context(|| format!("reading {}/index.json", layout.display()))?;
    source.extend(fs::read(layout.join("stamp")).unwrap_or_default());
    if !img.is_file() || fs::read(&source_file).ok().as_ref() != Some(&source) {
        say!("bench: building the node image {}", img.display());
        build_node_image(&format!("{}:latest", layout.display()), &img)?;
        fs::write(&source_file, &source)?;
    } else {
        say!("bench: node image up to date: {}", img.display());
    }
    let manifest = dir.join(file);
    fs::copy(example.join(file), &manifest)
        .with_context(|| format!("copying {file} to {}", manifest.display()))?;
    Ok(manifest)
}

/// Writes the node image of the OCI image `oci` (`LAYOUT:TAG`) to `out`, as `detvisor image
/// build --oci` does.
fn build_node_image(oci: &str, out: &Path) -> Result<()> {
    let flat = |e: image_builder::ImageError| anyhow::anyhow!("{e}");
    let r = image_builder::parse_oci_ref(oci).map_err(flat)?;
    let (config, layers) = image_builder::read_image(&r)
        .map_err(flat)
        .with_context(|| format!("cannot read OCI image {oci}"))?;
    let root = image_builder::flatten(&layers).map_err(flat)?;
    let mut bytes = Vec::new();
    image_builder::write_node_image(&config, &root, &mut bytes).map_err(flat)?;
    let partial = out.with_extension("img.partial");
    fs::write(&partial, &bytes).with_context(|| format!("cannot write {}", partial.display()))?;
    fs::rename(&partial, out).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(())
}

/// The default initrd with `overlay` appended (what `detvisor up` boots).
fn initrd_with(base: &[u8], overlay: &image_builder::RootFs) -> Result<Vec<u8>> {
    let mut initrd = base.to_vec();
    while !initrd.len().is_multiple_of(4) {
        initrd.push(0);
    }
    image_builder::write_initramfs(overlay, &mut initrd).context("packing the guest initramfs")?;
    Ok(initrd)
}

/// detvisor in the helper VM: the kernel and the assembled initrd shipped.
fn helper_session(host_plan: &EtcdWorkerPlan) -> (Session, Option<EtcdWorkerReport>) {
    Session::record(|session| {
        let Initrd::File(initrd) = &host_plan.prepared.initrd else {
            bail!("the assembled initrd is not in a file");
        };
        let files: Vec<(PathBuf, String)> = vec![
            (host_plan.prepared.kernel.clone(), "bench/vmlinux".into()),
            (initrd.clone(), "bench/initrd".into()),
        ];
        let initrd_len = fs::metadata(initrd).map_or(0, |m| m.len());
        let mut plan = EtcdWorkerPlan {
            place: "helper VM".into(),
            ..host_plan.clone()
        };
        plan.prepared.kernel = helper_vm::payload_path("bench/vmlinux").into();
        plan.prepared.initrd = Initrd::File(helper_vm::payload_path("bench/initrd").into());
        let launch = HelperLaunch {
            // As `detvisor up` sizes it: the initrd is shipped, then read into the VMM.
            memory_mib: ((plan.prepared.ram_bytes >> 20) as u32)
                .saturating_add(1536)
                .saturating_add(((3 * initrd_len) >> 20) as u32)
                .max(2048),
            files,
            shared_dirs: Vec::new(),
        };
        launch.run(&BenchCall::Etcd(plan), session, |s| {
            format!(
                "bench: starting the helper VM ({} MiB of payload files)",
                s.payload_file_bytes >> 20
            )
        })
    })
}

/// An etcd scenario, assembled on the host: detvisor's guest and the baseline's.
pub struct Assembled {
    /// The manifest (copied beside the node image).
    pub manifest_path: PathBuf,
    /// Guest RAM, as the manifest says (or [`DEFAULT_MEM`]).
    pub mem: String,
    pub ram_bytes: u64,
    /// detvisor's guest, as `detvisor up` assembles it, its initrd in a file.
    pub prepared: PreparedUp,
    /// The same initrd bytes plus the baseline's script ([`etcd_baseline::script`]), or why the
    /// baseline cannot run the scenario (a fault its script does not model).
    pub qemu_initrd: Result<PathBuf, String>,
    /// The kernel QEMU boots (built with the `vmlinux` detvisor boots).
    pub bzimage: PathBuf,
    pub image: guest::GuestImage,
    pub rtc_epoch: i64,
}

/// Assembles the scenario of `examples/etcd/<manifest_file>` (building the node image if
/// needed), its initrds written in `tmp` as `initrd-up<tag>` and `initrd-qemu<tag>`.
pub fn assemble(manifest_file: &str, tmp: &Path, tag: &str) -> Result<Assembled> {
    let manifest_path = prepare_manifest(manifest_file)?;
    let manifest = manifest::load(&manifest_path)?;
    let mem = manifest.mem.clone().unwrap_or_else(|| DEFAULT_MEM.into());
    let ram_bytes = units::parse_size(&mem)?;
    let image = guest::default_image()?;
    let bzimage = image.kernel.with_file_name("bzImage");
    let agent = guest::agent_binary()?;
    let (specs, mut overlay) = up::assemble(&manifest, &agent)?;
    let base = fs::read(&image.initrd)
        .with_context(|| format!("cannot read {}", image.initrd.display()))?;
    // detvisor's guest, as `detvisor up` assembles it (its initrd staged in a file).
    let mut prepared = up::prepare(&manifest, &[], Some(ram_bytes), Some(&image.kernel))?;
    if let Initrd::Bytes(bytes) = &prepared.initrd {
        let up_initrd = tmp.join(format!("initrd-up{tag}"));
        fs::write(&up_initrd, bytes)?;
        prepared.initrd = Initrd::File(up_initrd);
    }
    // The baseline: the same bytes plus the script the default /init runs.
    let qemu_initrd =
        match etcd_baseline::script(&specs, manifest.workload.as_ref(), &prepared.faults) {
            Ok(script) => {
                overlay.add_file("detvisor/cmd", 0o644, script.into_bytes())?;
                let path = tmp.join(format!("initrd-qemu{tag}"));
                fs::write(&path, initrd_with(&base, &overlay)?)?;
                Ok(path)
            }
            Err(e) => Err(format!("{e:#}")),
        };
    Ok(Assembled {
        manifest_path,
        mem,
        ram_bytes,
        prepared,
        qemu_initrd,
        bzimage,
        image,
        rtc_epoch: manifest.rtc_epoch.unwrap_or(DEFAULT_RTC_EPOCH),
    })
}

pub fn orchestrate(args: &EtcdArgs) -> Result<u8> {
    let loadavg_before = loadavg();
    check_runs_and_timeout(args.runs, args.timeout)?;
    let tmp = TempDir::new("detvisor-bench-etcd-")
        .context("cannot create a temporary directory for the benchmark")?;
    let Assembled {
        manifest_path,
        mem,
        prepared,
        qemu_initrd,
        bzimage,
        image,
        rtc_epoch,
        ..
    } = assemble("cluster.toml", tmp.path(), "")?;
    let cmdline = guest::default_cmdline();

    let placement = helper_vm::placement(args.host_vm);
    let place = placement.name();
    say!(
        "bench: etcd scenario ({}), {mem} RAM, {} run(s) per side; detvisor on the {place}{}, \
         QEMU TCG icount on the host",
        manifest_path.display(),
        args.runs,
        because(&placement)
    );

    // 1. The baseline on the host, alone on the machine.
    let mut base_sys = report::Side::default();
    if args.no_baseline {
        base_sys.skipped = Some("--no-baseline".into());
    } else {
        match (crate::qemu::find_qemu(), &qemu_initrd) {
            (Err(e), _) => base_sys.error = Some(format!("{e:#}")),
            (_, Err(e)) => base_sys.error = Some(e.clone()),
            (Ok(_), _) if !bzimage.is_file() => {
                base_sys.error = Some(format!(
                    "{} is missing (QEMU boots the bzImage built with {}): rebuild the guest \
                     image",
                    bzimage.display(),
                    image.kernel.display()
                ))
            }
            (Ok(qemu), Ok(qemu_initrd)) => {
                let b = etcd_baseline::Baseline {
                    qemu: &qemu,
                    bzimage: &bzimage,
                    initrd: qemu_initrd,
                    cmdline: &cmdline,
                    mem: &mem,
                    rtc_base: etcd_baseline::rtc_base(rtc_epoch),
                    scratch: tmp.path(),
                    limit: Duration::from_secs(args.timeout),
                };
                base_sys.command = command_words(&b.command(0).0);
                for i in 1..=args.runs {
                    let r = b.run(i);
                    say!(
                        "bench [host]: QEMU TCG icount run {i}/{}: {}",
                        args.runs,
                        describe(&r)
                    );
                    base_sys.runs.push(r);
                }
            }
        }
    }

    // 2. detvisor.
    let plan = EtcdWorkerPlan {
        runs: args.runs,
        timeout_s: args.timeout,
        seed: args.seed,
        until: args.until,
        prepared,
        place: "host".into(),
    };
    let mut det_sys = report::Side::default();
    let mut session = None;
    if args.no_detvisor {
        det_sys.skipped = Some("--no-detvisor".into());
    } else {
        let worker_report = if placement.in_helper_vm() {
            let (s, r) = helper_session(&plan);
            session = Some(s);
            r
        } else {
            Some(worker(&plan))
        };
        match worker_report {
            Some(r) => {
                det_sys.runs = r.runs;
                det_sys.error = r.error;
                det_sys.command = r.command;
            }
            None => det_sys.error = Some(NOT_MEASURED.into()),
        }
    }

    let r = report::build(report::Inputs {
        args,
        manifest: &manifest_path,
        mem: &mem,
        cmdline: &cmdline,
        placement: &placement,
        detvisor: &det_sys,
        baseline: &base_sys,
        session,
        loadavg_before,
    });
    report::print(&r)?;
    Ok(if r.all_ok { 0 } else { 1 })
}
