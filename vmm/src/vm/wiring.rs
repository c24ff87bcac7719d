//! The machine's device set: the legacy devices, then the virtio devices in
//! their fixed slot order (entropy, control channel, NICs, disks) and the
//! switch between the NICs, all seeded from the run's seed.

use super::console::{ConsoleCapture, ConsoleSink};
use super::SetupError;
use crate::entropy::{self, stream};
use devices::virtio::DiskImage;
use devices::{Devices, DevicesConfig, ExitPath, GuestMemory, NetworkConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The simulated network: how many NICs (one per node) and how the switch
/// between them behaves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    pub nics: u8,
    pub config: NetworkConfig,
}

/// A virtio-blk disk: its base image (a file of whole 4 KiB blocks, read
/// once, checked against `digest`) and the serial the guest reads
/// (`/sys/block/vdX/serial`). What the guest writes stays in the VMM (and
/// in snapshots), never in the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    pub image: PathBuf,
    /// BLAKE3 of the image's bytes, hex.
    pub digest: String,
    pub serial: String,
}

/// The hex BLAKE3 digest disk images are named by.
pub fn disk_digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// The largest disk image read (a regular file only): 4 GiB, the largest
/// node disk.
pub const MAX_DISK_IMAGE_BYTES: u64 = 4 << 30;

impl DiskSpec {
    /// Reads the image and checks its digest.
    pub fn load(&self) -> Result<DiskImage, SetupError> {
        let path = &self.image;
        let bytes =
            hostfile::read_limited(path, MAX_DISK_IMAGE_BYTES).map_err(SetupError::ReadDisk)?;
        let found = disk_digest(&bytes);
        if found != self.digest {
            return Err(SetupError::DiskDigest {
                path: path.clone(),
                found,
                expected: self.digest.clone(),
            });
        }
        DiskImage::from_bytes(&bytes, found).map_err(|source| SetupError::DiskImage {
            path: path.clone(),
            source,
        })
    }

    /// The spec of the image at `image`, its digest computed now.
    pub fn of_file(image: &Path, serial: &str) -> Result<DiskSpec, SetupError> {
        let bytes =
            hostfile::read_limited(image, MAX_DISK_IMAGE_BYTES).map_err(SetupError::ReadDisk)?;
        Ok(DiskSpec {
            image: image.to_path_buf(),
            digest: disk_digest(&bytes),
            serial: serial.to_owned(),
        })
    }
}

/// The MAC address of NIC `index` (locally administered, unicast).
pub fn nic_mac(index: u8) -> [u8; 6] {
    [0x52, 0x54, 0x00, 0xd7, 0x00, index + 1]
}

/// What a machine's device set is built from (a new run's config or a
/// saved session's state).
pub(super) struct DeviceSetSpec<'a> {
    pub rtc_epoch_unix_secs: i64,
    pub seed: u64,
    pub network: Option<&'a NetworkSpec>,
    pub control_channel: bool,
    pub disks: &'a [DiskSpec],
    pub exit_path: ExitPath,
}

/// The device set of a machine, with the console hashed and forwarded
/// through `console` (shared with the session, which reads its hash).
pub(super) fn build_devices(
    console: ConsoleCapture,
    memory: GuestMemory,
    spec: DeviceSetSpec<'_>,
) -> Result<(Devices, Arc<Mutex<ConsoleCapture>>), SetupError> {
    let DeviceSetSpec {
        rtc_epoch_unix_secs,
        seed,
        network,
        control_channel,
        disks,
        exit_path,
    } = spec;
    let console = Arc::new(Mutex::new(console));
    let mut devices = Devices::new(
        DevicesConfig {
            rtc_epoch_unix_secs,
        },
        Box::new(ConsoleSink {
            shared: console.clone(),
        }),
    );
    if exit_path == ExitPath::ClockPage {
        devices.attach_clock_page(memory.clone());
    }
    attach_virtio(&mut devices, memory, seed, network, control_channel)?;
    for disk in disks {
        devices
            .attach_virtio_blk(Arc::new(disk.load()?), &disk.serial)
            .map_err(SetupError::Devices)?;
    }
    Ok((devices, console))
}

/// Attaches the virtio devices, in a fixed order (their slots are part of the
/// guest-visible machine and of saved device state): the entropy device, the
/// agent's control channel if any, then one NIC per node and the switch
/// between them (the disks come after, see [`build_devices`]).
fn attach_virtio(
    devices: &mut Devices,
    memory: GuestMemory,
    seed: u64,
    network: Option<&NetworkSpec>,
    control_channel: bool,
) -> Result<(), SetupError> {
    devices.attach_guest_memory(memory);
    devices
        .attach_virtio_rng(entropy::stream_key(seed, stream::VIRTIO_RNG))
        .map_err(SetupError::Devices)?;
    if control_channel {
        devices
            .attach_virtio_console()
            .map_err(SetupError::Devices)?;
    }
    if let Some(network) = network {
        for index in 0..network.nics {
            devices
                .attach_virtio_net(nic_mac(index))
                .map_err(SetupError::Devices)?;
        }
        devices
            .attach_switch(
                entropy::stream_key(seed, stream::NETWORK_SWITCH),
                network.config,
            )
            .map_err(SetupError::Network)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_images_are_checked_against_their_digest() {
        let path = std::env::temp_dir().join(format!("detvisor-disk-{}.img", std::process::id()));
        let mut bytes = vec![0u8; 8 * 4096];
        bytes[4096] = 7;
        std::fs::write(&path, &bytes).unwrap();
        let spec = DiskSpec::of_file(&path, "s").unwrap();
        let image = spec.load().unwrap();
        assert_eq!(image.capacity_bytes(), 8 * 4096);
        assert_eq!(image.digest(), disk_digest(&bytes));
        bytes[4096] = 8;
        std::fs::write(&path, &bytes).unwrap();
        let changed = spec.load();
        std::fs::write(&path, [0u8; 100]).unwrap();
        let not_blocks = DiskSpec::of_file(&path, "s").unwrap().load();
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(changed, Err(SetupError::DiskDigest { .. })));
        assert!(matches!(not_blocks, Err(SetupError::DiskImage { .. })));
    }

    #[test]
    fn nic_macs_are_locally_administered_unicast_and_distinct() {
        let first = nic_mac(0);
        assert_eq!(first[0] & 0b11, 0b10, "locally administered, unicast");
        assert_eq!(first, [0x52, 0x54, 0x00, 0xd7, 0x00, 1]);
        assert_ne!(nic_mac(1), first);
    }
}
