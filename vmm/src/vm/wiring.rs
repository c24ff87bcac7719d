//! The machine's device set: the legacy devices, then the virtio devices in
//! their fixed slot order (entropy, control channel, NICs) and the switch
//! between the NICs, all seeded from the run's seed.

use super::console::{ConsoleCapture, ConsoleSink};
use super::SetupError;
use crate::entropy::{self, stream};
use devices::{Devices, DevicesConfig, GuestMemory, NetworkConfig};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// The simulated network: how many NICs (one per node) and how the switch
/// between them behaves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    pub nics: u8,
    pub config: NetworkConfig,
}

/// The MAC address of NIC `index` (locally administered, unicast).
pub fn nic_mac(index: u8) -> [u8; 6] {
    [0x52, 0x54, 0x00, 0xd7, 0x00, index + 1]
}

/// The device set of a machine, with the console hashed and forwarded
/// through `console` (shared with the session, which reads its hash).
pub(super) fn build_devices(
    console: ConsoleCapture,
    rtc_epoch_unix_secs: i64,
    memory: GuestMemory,
    seed: u64,
    network: Option<&NetworkSpec>,
    control_channel: bool,
) -> Result<(Devices, Arc<Mutex<ConsoleCapture>>), SetupError> {
    let console = Arc::new(Mutex::new(console));
    let mut devices = Devices::new(
        DevicesConfig {
            rtc_epoch_unix_secs,
        },
        Box::new(ConsoleSink {
            shared: console.clone(),
        }),
    );
    attach_virtio(&mut devices, memory, seed, network, control_channel)?;
    Ok((devices, console))
}

/// Attaches the virtio devices, in a fixed order (their slots are part of the
/// guest-visible machine and of saved device state): the entropy device, the
/// agent's control channel if any, then one NIC per node and the switch
/// between them.
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
    fn nic_macs_are_locally_administered_unicast_and_distinct() {
        let first = nic_mac(0);
        assert_eq!(first[0] & 0b11, 0b10, "locally administered, unicast");
        assert_eq!(first, [0x52, 0x54, 0x00, 0xd7, 0x00, 1]);
        assert_ne!(nic_mac(1), first);
    }
}
