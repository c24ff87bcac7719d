//! The network: virtio-net NICs in their slots and the switch joining them
//! (each NIC on the port of its slot index), its faults and configuration,
//! and each device step's traffic between them.

use super::slots::{VirtioDevices, VirtioSlotDevice};
use super::{Devices, DevicesState, VirtioBackendState, VirtioSlot};
use crate::error::DevicesError;
use crate::persist::RestoreError;
use crate::switch::{Fault, FrameTap, NetworkConfig, PortId, Switch, SwitchError};
use crate::time::VirtNanos;
use crate::virtio::{RxOutcome, VirtioMmioTransport, VirtioNet, VirtioNetCounters};

impl Devices {
    /// Attaches a virtio-net NIC with address `mac`; there may be one per
    /// node, as far as slots go. Its switch port is [`VirtioSlot::port`].
    /// If a switch is attached, the NIC joins it at once.
    pub fn attach_virtio_net(&mut self, mac: [u8; 6]) -> Result<VirtioSlot, DevicesError> {
        let transport = VirtioMmioTransport::new(VirtioNet::new(mac))?;
        let slot = self.attach_virtio(VirtioSlotDevice::Net(Box::new(transport)))?;
        if let Some(switch) = &mut self.switch {
            switch.add_port(slot.port(), mac);
        }
        Ok(slot)
    }

    /// Attaches the network switch: every NIC, attached before or after,
    /// is on the port of its slot index. Its draws come from the ChaCha20
    /// stream keyed by `key`; every link follows `config` until overridden.
    pub fn attach_switch(
        &mut self,
        key: [u8; 32],
        config: NetworkConfig,
    ) -> Result<(), SwitchError> {
        if self.switch.is_some() {
            return Err(SwitchError::AlreadyAttached);
        }
        let mut switch = Switch::new(key, config)?;
        for (port, mac) in self.virtio_net_macs() {
            switch.add_port(port, mac);
        }
        self.switch = Some(switch);
        Ok(())
    }

    /// The switch ports of the attached NICs, in attach order (NIC `i` of the
    /// guest, `eth<i>`, is on the `i`-th).
    pub fn nic_ports(&self) -> Vec<PortId> {
        self.virtio_net_macs()
            .into_iter()
            .map(|(port, _)| port)
            .collect()
    }

    /// The attached NICs' ports and addresses, in slot order.
    fn virtio_net_macs(&self) -> Vec<(PortId, [u8; 6])> {
        self.slot_devices()
            .filter_map(|(index, device)| match device {
                VirtioSlotDevice::Net(transport) => Some((PortId(index), transport.device().mac())),
                _ => None,
            })
            .collect()
    }

    /// The switch, for its counters, ports, partition and frames in flight.
    pub fn switch(&self) -> Option<&Switch> {
        self.switch.as_ref()
    }

    fn switch_mut(&mut self) -> Result<&mut Switch, SwitchError> {
        self.switch.as_mut().ok_or(SwitchError::NotAttached)
    }

    /// Schedules a network fault at virtual time `at` (see
    /// [`Switch::schedule_fault`]); ports are NIC slot indexes.
    pub fn schedule_network_fault(
        &mut self,
        at: VirtNanos,
        fault: Fault,
    ) -> Result<(), SwitchError> {
        self.switch_mut()?.schedule_fault(at, fault)
    }

    /// Sends every frame event of the switch from now on to `tap` (or, with
    /// `None`, nowhere). Observing changes nothing in the run.
    pub fn set_frame_tap(&mut self, tap: Option<Box<dyn FrameTap>>) -> Result<(), SwitchError> {
        self.switch_mut()?.record_frames(tap.is_some());
        self.frame_tap = tap;
        Ok(())
    }

    /// Replaces the default link configuration, for frames sent from now on.
    pub fn set_network_config(&mut self, config: NetworkConfig) -> Result<(), SwitchError> {
        self.switch_mut()?.set_config(config)
    }

    /// Overrides (or, with `None`, stops overriding) the configuration of
    /// the directed link `from` -> `to`, for frames sent from now on.
    pub fn set_link_config(
        &mut self,
        from: PortId,
        to: PortId,
        config: Option<NetworkConfig>,
    ) -> Result<(), SwitchError> {
        self.switch_mut()?.set_link_config(from, to, config)
    }

    /// The counters of the NIC in slot `slot`, if it is one.
    pub fn virtio_net_counters(&self, slot: usize) -> Option<VirtioNetCounters> {
        match self.virtio.as_ref()?.slots.get(slot)? {
            VirtioSlotDevice::Net(transport) => Some(transport.device().counters()),
            _ => None,
        }
    }

    /// Re-keys the switch's stream (an alternate history from this moment
    /// on): its draws continue from the start of the stream `key`. Frames
    /// already in flight keep their delivery times. Returns false when no
    /// switch is attached.
    pub fn rekey_switch(&mut self, key: [u8; 32]) -> bool {
        match &mut self.switch {
            Some(switch) => {
                switch.rekey(key);
                true
            }
            None => false,
        }
    }

    /// Submits what the NICs transmitted to the switch at `now`, in slot
    /// order, then delivers every frame due by `now` into its NIC.
    pub(super) fn advance_network(&mut self) {
        let Some(VirtioDevices { memory, slots }) = &mut self.virtio else {
            return;
        };
        let now = self.now;
        for (index, device) in slots.iter_mut().enumerate() {
            let VirtioSlotDevice::Net(transport) = device else {
                continue;
            };
            let frames = transport.device_mut().take_transmitted();
            let Some(switch) = &mut self.switch else {
                continue;
            };
            for frame in frames {
                // Every NIC is a port of the switch, so this cannot fail.
                let _ = switch.submit(now, PortId(index), frame);
            }
        }
        let Some(switch) = &mut self.switch else {
            return;
        };
        for (port, frame) in switch.due(now) {
            if let Some(VirtioSlotDevice::Net(transport)) = slots.get_mut(port.0) {
                let _: RxOutcome = transport.deliver(frame, memory, now);
            }
        }
        if let Some(tap) = &mut self.frame_tap {
            let mut events = switch.take_frame_events();
            // Drops at submit (now) come before deliveries due earlier:
            // sorted, every batch's events are later than the last batch's.
            events.sort_by_key(|event| event.at);
            for event in &events {
                tap.frame(event);
            }
        }
    }

    /// Checks that `state`'s switch (if any) has exactly the state's NICs
    /// as ports, with their addresses, and carries frames between them only.
    /// (Every other switch state is valid, see [`Switch::from_state`].)
    pub(super) fn validate_switch(state: &DevicesState) -> Result<(), RestoreError> {
        let Some(switch) = &state.switch else {
            return Ok(());
        };
        let nics: Vec<(PortId, [u8; 6])> = state
            .virtio
            .iter()
            .enumerate()
            .filter_map(|(index, device)| match &device.backend {
                VirtioBackendState::Net(net) => Some((PortId(index), net.mac)),
                _ => None,
            })
            .collect();
        let ports: Vec<(PortId, [u8; 6])> = switch
            .ports
            .iter()
            .map(|(&port, saved)| (port, saved.mac))
            .collect();
        if let Some(&(port, _)) = ports
            .iter()
            .find(|port| !nics.contains(port))
            .or_else(|| nics.iter().find(|nic| !ports.contains(nic)))
        {
            return Err(RestoreError::SwitchPortMismatch { port: port.0 });
        }
        let is_port = |port: &PortId| switch.ports.contains_key(port);
        let named = switch
            .in_flight
            .values()
            .flat_map(|frame| [frame.from, frame.to])
            .chain(switch.blocked.iter().flat_map(|&(from, to)| [from, to]))
            .chain(switch.port_latency.keys().copied())
            .chain(switch.port_loss.keys().copied())
            .chain(
                switch
                    .link_configs
                    .iter()
                    .flat_map(|(from, links)| std::iter::once(*from).chain(links.keys().copied())),
            );
        for port in named {
            if !is_port(&port) {
                return Err(RestoreError::SwitchUnknownPort { port: port.0 });
            }
        }
        Ok(())
    }
}
