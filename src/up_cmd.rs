//! The `detvisor up` command: arguments, guest assembly, placement (host or
//! helper VM), the runs (one, or several compared as an audit) and the summary.

use crate::{hostvm, placement, HostVmMode, Placement, SnapshotArgs, EXIT_NO_STATUS};
use anyhow::{bail, Context, Result};
use clap::Args;
use run::api::{Request, Response};
use run::manifest::{self, Manifest};
use run::units;
use run::up::{Initrd, PreparedUp, UpOptions};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct UpArgs {
    /// The manifest (TOML): nodes, workload, network, faults. See docs/manifest.md.
    manifest: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop after this much virtual time (e.g. 60s).
    #[arg(long)]
    until: Option<String>,
    /// A fault, e.g. 'at=10s partition n1 | n2,n3 for=15s' or 'at=30s pause n2 for=5s'
    /// (repeatable; added to the manifest's `faults`).
    #[arg(long = "fault")]
    faults: Vec<String>,
    /// Guest RAM (e.g. 1G), overriding the manifest's machine.mem.
    #[arg(long)]
    mem: Option<String>,
    /// Directory for per-node logs (<node>.log, raw output of each node).
    #[arg(long, default_value = "detvisor-logs")]
    logs: PathBuf,
    /// Do not stream node output to stdout (the logs still get it).
    #[arg(long)]
    quiet: bool,
    /// Run this many times and compare every exit (an audit); 1: just run.
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Kernel (uncompressed vmlinux); default: the built-in guest image's.
    #[arg(long)]
    kernel: Option<PathBuf>,
    /// A guest initrd already assembled (with --node-specs); internal.
    #[arg(long, hide = true, requires = "node_specs")]
    initrd: Option<PathBuf>,
    /// The agent's node requests as JSON, for --initrd; internal.
    #[arg(long, hide = true)]
    node_specs: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = HostVmMode::Auto)]
    host_vm: HostVmMode,
    /// Snapshots of the (first) run, to branch, seek or open a shell in later.
    #[command(flatten)]
    snapshots: SnapshotArgs,
}

impl UpArgs {
    /// Guest RAM from --mem, if given.
    fn ram_bytes(&self) -> Result<Option<u64>> {
        self.mem
            .as_deref()
            .map(units::parse_size)
            .transpose()
            .context("--mem")
    }

    fn options(&self) -> Result<UpOptions> {
        Ok(UpOptions {
            seed: self.seed,
            until: self
                .until
                .as_deref()
                .map(units::parse_duration)
                .transpose()
                .context("--until")?,
            runs: self.runs,
            logs: Some(self.logs.clone()),
            stream_output: !self.quiet && !self.json,
            snapshots: self.snapshots.plan()?,
        })
    }
}

pub fn cmd_up(args: UpArgs) -> Result<u8> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let manifest = manifest::load(&args.manifest)?;
    let options = args.options()?;
    if let Placement::HelperVm { reason } = placement(args.host_vm) {
        // Everything is checked here, before paying for the helper VM.
        run::faults::schedule(
            &manifest
                .faults
                .iter()
                .chain(&args.faults)
                .cloned()
                .collect::<Vec<_>>(),
            &manifest.node_names(),
        )?;
        return up_in_helper_vm(&args, &manifest, &reason);
    }
    let prepared = match (&args.initrd, &args.node_specs) {
        // Inside the helper VM: the guest was assembled on the host.
        (Some(initrd), Some(specs)) => {
            let mut prepared = prepare_without_images(&manifest, &args)?;
            prepared.initrd = Initrd::File(initrd.clone());
            prepared.specs = serde_json::from_slice(
                &std::fs::read(specs)
                    .with_context(|| format!("cannot read {}", specs.display()))?,
            )
            .with_context(|| format!("node specs {}", specs.display()))?;
            prepared
        }
        _ => run::up::prepare(
            &manifest,
            &args.faults,
            args.ram_bytes()?,
            args.kernel.as_deref(),
        )?,
    };
    match crate::handle(
        Request::Up { prepared, options },
        crate::StdStreams::default(),
    )? {
        Response::Up(summary) => crate::print::up(&summary, args.json),
        other => crate::print::unexpected(&other),
    }
}

/// The run's plan where the assembled guest comes from the host.
fn prepare_without_images(manifest: &Manifest, args: &UpArgs) -> Result<PreparedUp> {
    let kernel = match &args.kernel {
        Some(k) => k.clone(),
        None => run::guest::default_image()?.kernel,
    };
    let names = manifest.node_names();
    let texts: Vec<String> = manifest
        .faults
        .iter()
        .chain(&args.faults)
        .cloned()
        .collect();
    Ok(PreparedUp {
        kernel,
        initrd: Initrd::Bytes(Vec::new()),
        specs: Vec::new(),
        faults: run::faults::schedule(&texts, &names)?,
        node_names: names,
        workload: manifest.workload.clone(),
        network: manifest.network,
        rtc_epoch_unix_secs: manifest.rtc_epoch.unwrap_or(run::plain::DEFAULT_RTC_EPOCH),
        ram_bytes: match (args.ram_bytes()?, &manifest.mem) {
            (Some(bytes), _) => bytes,
            (None, Some(mem)) => units::parse_size(mem).context("machine.mem")?,
            (None, None) => run::up::DEFAULT_RAM_BYTES,
        },
    })
}

/// Assembles the guest here (the images are on this host), then runs
/// `detvisor up` inside the helper VM on the assembled files.
fn up_in_helper_vm(args: &UpArgs, manifest: &Manifest, reason: &str) -> Result<u8> {
    let guest = run::up::prepare(
        manifest,
        &args.faults,
        args.ram_bytes()?,
        args.kernel.as_deref(),
    )?;
    let Initrd::Bytes(initrd_bytes) = &guest.initrd else {
        bail!("internal error: a prepared guest's initrd is in memory");
    };
    let mem = format!("{}", guest.ram_bytes);
    // Removed with its files when this function returns.
    let staging_dir = crate::tempdir::TempDir::new("detvisor-up-")
        .context("creating a staging directory for the helper VM's files")?;
    let staging = staging_dir.path();
    let initrd = staging.join("initrd");
    std::fs::write(&initrd, initrd_bytes)
        .with_context(|| format!("writing {}", initrd.display()))?;
    let specs = staging.join("specs.json");
    std::fs::write(&specs, serde_json::to_vec(&guest.specs)?)
        .with_context(|| format!("writing {}", specs.display()))?;
    std::fs::create_dir_all(&args.logs)
        .with_context(|| format!("creating the log directory {}", args.logs.display()))?;
    let logs = args
        .logs
        .canonicalize()
        .with_context(|| format!("logs directory {}", args.logs.display()))?;
    eprintln!("detvisor: running inside a helper VM (QEMU TCG with nested SVM) because {reason}");
    let assets = hostvm::ensure_assets(None)?;
    let file = |host_path: &Path, name: &str| hostvm::PayloadFile {
        host_path: host_path.to_path_buf(),
        payload_name: name.into(),
    };
    let files = vec![
        file(&guest.kernel, "vmlinux"),
        file(&initrd, "initrd"),
        file(&specs, "specs.json"),
        file(&args.manifest, "manifest.toml"),
    ];
    let mut inner: Vec<OsString> = vec![
        "up".into(),
        hostvm::payload_path("manifest.toml").into(),
        "--host-vm".into(),
        "never".into(),
        "--kernel".into(),
        hostvm::payload_path("vmlinux").into(),
        "--initrd".into(),
        hostvm::payload_path("initrd").into(),
        "--node-specs".into(),
        hostvm::payload_path("specs.json").into(),
        "--seed".into(),
        args.seed.to_string().into(),
        "--mem".into(),
        mem.clone().into(),
        "--logs".into(),
        logs.clone().into(),
        "--runs".into(),
        args.runs.to_string().into(),
    ];
    if let Some(until) = &args.until {
        inner.extend(["--until".into(), until.into()]);
    }
    for fault in &args.faults {
        inner.extend(["--fault".into(), fault.into()]);
    }
    if args.quiet {
        inner.push("--quiet".into());
    }
    if args.json {
        inner.push("--json".into());
    }
    let mut shared_dirs = vec![logs];
    if let Some((options, dir)) = args.snapshots.forwarded()? {
        inner.extend(options.into_iter().map(OsString::from));
        shared_dirs.push(dir);
    }
    let ram = guest.ram_bytes;
    let config = hostvm::HelperVmConfig {
        assets_dir: assets,
        // The initrd is shipped in the helper's own initramfs and then read
        // into the VMM: count it about three times over.
        memory_mib: ((ram >> 20) as u32)
            .saturating_add(1536)
            .saturating_add(((3 * initrd_bytes.len()) >> 20) as u32)
            .max(2048),
        shared_dirs,
        ..hostvm::HelperVmConfig::default()
    };
    let exe = std::env::current_exe().context("locating the detvisor executable")?;
    let status = hostvm::run(&config, &exe, &inner, &files)?;
    Ok(u8::try_from(status).unwrap_or(EXIT_NO_STATUS))
}
