//! A plain run (`detvisor run`): one guest booted from a kernel and an
//! initramfs, running one command, with an optional simulated network.

use crate::driven::Driven;
use crate::guest;
use crate::outcome::RunSummary;
use crate::pcap::PcapRecorder;
use crate::snapshots::{SnapshotPlan, Snapshotter};
use devices::ClockKind;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use vmm::pmu_clock::PmuCounterChoice;
use vmm::record::RecordConfig;
use vmm::stall::StallTimeout;
use vmm::vm::{ConsoleInput, VmConfig};
use vmm::{ExitPath, VirtNanos};

/// Guest RAM of a plain run unless told otherwise (256 MiB).
pub const DEFAULT_RAM_BYTES: u64 = 256 << 20;
/// The guest's CMOS clock at boot unless told otherwise: 2024-01-01 UTC.
pub const DEFAULT_RTC_EPOCH: i64 = 1_704_067_200;

/// Everything a plain run's guest is made of.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GuestSpec {
    /// Seed of every source of nondeterminism the guest can observe.
    pub seed: u64,
    /// Kernel (uncompressed vmlinux ELF); `None`: the default guest image's.
    pub kernel: Option<PathBuf>,
    /// Initramfs; `None`: the default guest image's.
    pub initrd: Option<PathBuf>,
    /// Kernel command line replacing [`guest::default_cmdline`].
    pub cmdline: Option<String>,
    pub ram_bytes: u64,
    /// Stop after this much virtual time.
    pub until: Option<VirtNanos>,
    /// Wall-clock date the guest's CMOS clock starts at, as unix seconds.
    pub rtc_epoch_unix_secs: i64,
    /// Virtio NICs joined by the simulated switch (none: no network).
    pub network: Option<PlainNetwork>,
    /// The command to run inside the guest (empty: a shell on the console).
    pub command: Vec<String>,
    /// Wall time the guest may run without a VM exit before the run ends
    /// as stalled (host policy, not part of the history).
    #[serde(default)]
    pub stall_timeout: StallTimeout,
    /// How the guest reads the time and takes interrupts (the clock page
    /// unless told otherwise; the legacy HPET path is for comparisons).
    #[serde(default)]
    pub exit_path: ExitPath,
    /// What moves virtual time (`exit` unless told otherwise).
    #[serde(default, skip_serializing_if = "ClockKind::is_exit")]
    pub clock: ClockKind,
    /// What the pmu clock counts with (the host's PMU unless told
    /// otherwise; ignored by the other clocks).
    #[serde(default, skip_serializing_if = "PmuCounterChoice::is_hardware")]
    pub pmu_counter: PmuCounterChoice,
}

impl Default for GuestSpec {
    fn default() -> Self {
        GuestSpec {
            seed: 0,
            kernel: None,
            initrd: None,
            cmdline: None,
            ram_bytes: DEFAULT_RAM_BYTES,
            until: None,
            rtc_epoch_unix_secs: DEFAULT_RTC_EPOCH,
            network: None,
            command: Vec::new(),
            stall_timeout: StallTimeout::default(),
            exit_path: ExitPath::default(),
            clock: ClockKind::Exit,
            pmu_counter: PmuCounterChoice::Hardware,
        }
    }
}

/// NICs (eth0..) and the switch between them.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct PlainNetwork {
    pub nics: u8,
    pub config: devices::NetworkConfig,
}

/// Why a plain guest's configuration was refused, or its run failed.
#[derive(Debug, thiserror::Error)]
pub enum PlainError {
    #[error("{what} {} does not exist or is not a file", path.display())]
    NotAFile { what: &'static str, path: PathBuf },
    #[error("{nics} NICs: this machine has interrupt lines for 1 to {most}")]
    Nics { nics: u8, most: usize },
    #[error("network settings: {0}")]
    Network(devices::SwitchError),
    #[error("ram_bytes")]
    Ram(#[source] crate::units::RamError),
    #[error("rtc_epoch_unix_secs")]
    RtcEpoch(#[source] crate::units::RtcEpochError),
    #[error(transparent)]
    Guest(#[from] crate::guest::GuestImageError),
    #[error(transparent)]
    Vm(#[from] vmm::vm::VmError),
    /// Taking the run's snapshots (and running it between them).
    #[error(transparent)]
    Snapshots(#[from] crate::snapshots::SnapshotsError),
    #[error(transparent)]
    Driven(#[from] crate::driven::DrivenError),
    #[error(transparent)]
    Pcap(#[from] crate::pcap::PcapError),
    #[error(transparent)]
    Trace(#[from] crate::trace::TraceError),
}

type Result<T, E = PlainError> = std::result::Result<T, E>;

/// The kernel and initramfs files a guest boots from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageFiles {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl GuestSpec {
    /// The kernel and initramfs, the default image's where none is given
    /// (building it on first use). Both must be files.
    pub fn image_files(&self) -> Result<ImageFiles> {
        let (kernel, initrd) = match (&self.kernel, &self.initrd) {
            (Some(k), Some(i)) => (k.clone(), i.clone()),
            (k, i) => {
                let image = guest::default_image()?;
                (
                    k.clone().unwrap_or(image.kernel),
                    i.clone().unwrap_or(image.initrd),
                )
            }
        };
        for (what, path) in [("kernel", &kernel), ("initrd", &initrd)] {
            if !path.is_file() {
                return Err(PlainError::NotAFile {
                    what,
                    path: path.clone(),
                });
            }
        }
        Ok(ImageFiles { kernel, initrd })
    }

    /// Checks what can be checked without building anything.
    pub fn validate(&self) -> Result<()> {
        crate::units::check_ram(self.ram_bytes).map_err(PlainError::Ram)?;
        crate::units::check_rtc_epoch(self.rtc_epoch_unix_secs).map_err(PlainError::RtcEpoch)?;
        if let Some(network) = &self.network {
            let most = devices::layout::VIRTIO_MMIO_IRQS.len() - 1;
            if network.nics == 0 || usize::from(network.nics) > most {
                return Err(PlainError::Nics {
                    nics: network.nics,
                    most,
                });
            }
            network.config.validate().map_err(PlainError::Network)?;
        }
        Ok(())
    }

    /// The VMM's configuration for this guest.
    pub fn vm_config(&self, record: RecordConfig) -> Result<VmConfig> {
        self.validate()?;
        let image = self.image_files()?;
        let initrd = guest::initrd_with_command(&image.initrd, &self.command)?;
        Ok(VmConfig {
            kernel: image.kernel,
            initrd,
            cmdline: self.cmdline.clone().unwrap_or_else(guest::default_cmdline),
            ram_bytes: self.ram_bytes,
            seed: self.seed,
            until: self.until,
            rtc_epoch_unix_secs: self.rtc_epoch_unix_secs,
            record,
            perturbation: None,
            network: self.network.as_ref().map(|n| vmm::vm::NetworkSpec {
                nics: n.nics,
                config: n.config,
            }),
            // The control channel, for the fork-shell listener (see `guest::FORK_SHELL_LISTENER`).
            control_channel: true,
            stall_timeout: self.stall_timeout,
            disks: Vec::new(),
            exit_path: self.exit_path,
            clock: self.clock,
            pmu_counter: self.pmu_counter,
        })
    }
}

/// Boots `spec`'s guest and runs it to its end, taking snapshots as
/// `snapshots` asks, capturing the network's frames into `pcap` (a
/// directory) and writing every exit into `trace` (a file, see
/// [`crate::trace`]) if given; the console goes to `console`, `input` (when
/// given) to the guest's console.
pub fn run(
    spec: &GuestSpec,
    snapshots: Option<&SnapshotPlan>,
    pcap: Option<&std::path::Path>,
    trace: Option<&std::path::Path>,
    console: Box<dyn std::io::Write + Send>,
    input: Option<ConsoleInput>,
    report: &mut dyn FnMut(&str),
) -> Result<RunSummary> {
    let config = spec.vm_config(RecordConfig::default())?;
    // Before the VM starts: a path that cannot be written stops nothing running.
    let trace = crate::trace::TraceFile::create_if(trace)?;
    let mut session = vmm::vm::Session::boot(&config, console, input)?;
    if let Some(trace) = &trace {
        trace.attach(&mut session);
    }
    let capture = match pcap {
        Some(dir) => {
            let nics = spec.network.as_ref().map_or(0, |n| n.nics);
            Some(PcapRecorder::attach(
                session.devices_mut(),
                dir,
                &crate::pcap::plain_nic_names(nics),
            )?)
        }
        None => None,
    };
    let outcome = match snapshots {
        None => {
            let stop = session.run_to_end()?;
            session.finish(stop)
        }
        Some(plan) => {
            let mut snapshotter = Snapshotter::new(plan, None)?;
            let mut driven = Driven::plain(session);
            let stop = snapshotter.run(&mut driven)?;
            report(&snapshotter.report());
            driven.session.finish(stop)
        }
    };
    if let Some(capture) = capture {
        capture.finish()?;
    }
    if let Some(trace) = trace {
        trace.finish()?;
    }
    Ok(RunSummary::new(spec.seed, &outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_an_error_chain_names_each_cause_once() {
        let spec = GuestSpec {
            kernel: Some("/nonexistent/vmlinux".into()),
            initrd: Some("/nonexistent/initrd".into()),
            ..GuestSpec::default()
        };
        let e = spec.vm_config(RecordConfig::default()).unwrap_err();
        assert_eq!(
            format!("{:#}", anyhow::Error::from(e)),
            "kernel /nonexistent/vmlinux does not exist or is not a file"
        );
        let spec = GuestSpec {
            network: Some(PlainNetwork {
                nics: 0,
                config: devices::NetworkConfig::reliable(devices::LatencyDist::Fixed(
                    VirtNanos::ZERO,
                )),
            }),
            ..GuestSpec::default()
        };
        let e = spec.validate().unwrap_err();
        assert!(format!("{:#}", anyhow::Error::from(e)).starts_with("0 NICs: "));
    }

    #[test]
    fn test_ram_and_the_wall_clock_are_checked_before_boot() {
        let spec = |ram_bytes, rtc_epoch_unix_secs| GuestSpec {
            ram_bytes,
            rtc_epoch_unix_secs,
            ..GuestSpec::default()
        };
        let text =
            |spec: GuestSpec| format!("{:#}", anyhow::Error::from(spec.validate().unwrap_err()));
        assert_eq!(
            text(spec(1 << 20, DEFAULT_RTC_EPOCH)),
            "ram_bytes: guest RAM of 1M is out of range: give 64M..=64G"
        );
        assert!(text(spec((256 << 20) + 512, DEFAULT_RTC_EPOCH)).contains("4K pages"));
        assert!(text(spec(256 << 20, 99_999_999_999_999))
            .starts_with("rtc_epoch_unix_secs: 99999999999999 is outside 1970..9999"));
        spec(256 << 20, DEFAULT_RTC_EPOCH).validate().unwrap();
    }
}
