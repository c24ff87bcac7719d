//! The machine's disks: virtio-blk devices in their slots, numbered among
//! themselves in attach order, with their faults on their own schedules.

use super::slots::{VirtioDevices, VirtioSlotDevice};
use super::{Devices, VirtioSlot};
use crate::error::DevicesError;
use crate::time::VirtNanos;
use crate::virtio::{
    DiskCommand, DiskImage, ScheduledDiskCommand, VirtioBlk, VirtioBlkCounters, VirtioMmioTransport,
};
use std::sync::Arc;

impl Devices {
    /// Attaches a virtio-blk disk over `image`, answering `serial` to the
    /// guest's GET_ID; there may be one per node, as far as slots go. Disks
    /// are numbered in attach order from 0 ([`Devices::schedule_disk`]).
    pub fn attach_virtio_blk(
        &mut self,
        image: Arc<DiskImage>,
        serial: &str,
    ) -> Result<VirtioSlot, DevicesError> {
        let disk = VirtioBlk::new(image, serial).map_err(DevicesError::DiskSerial)?;
        let transport = VirtioMmioTransport::new(disk)?;
        self.attach_virtio(VirtioSlotDevice::Blk(Box::new(transport)))
    }

    /// The attached disks, in attach order.
    fn disks_mut(&mut self) -> impl Iterator<Item = &mut VirtioMmioTransport<VirtioBlk>> {
        self.virtio
            .iter_mut()
            .flat_map(|virtio| virtio.slots.iter_mut())
            .filter_map(|device| match device {
                VirtioSlotDevice::Blk(transport) => Some(transport.as_mut()),
                _ => None,
            })
    }

    pub(super) fn disks(&self) -> impl Iterator<Item = &VirtioMmioTransport<VirtioBlk>> {
        self.slot_devices().filter_map(|(_, device)| match device {
            VirtioSlotDevice::Blk(transport) => Some(transport.as_ref()),
            _ => None,
        })
    }

    fn disk_mut(&mut self, disk: usize) -> Result<&mut VirtioBlk, DevicesError> {
        self.disks_mut()
            .nth(disk)
            .map(|transport| transport.device_mut())
            .ok_or(DevicesError::NoSuchDisk { disk })
    }

    /// Schedules `command` on disk `disk` at virtual time `at` (applied at
    /// that exact time: it is one of [`Devices::next_deadline`]'s). A time
    /// already past applies at the next device step.
    pub fn schedule_disk(
        &mut self,
        disk: usize,
        at: VirtNanos,
        command: DiskCommand,
    ) -> Result<(), DevicesError> {
        self.disk_mut(disk)?.schedule(at, command);
        Ok(())
    }

    /// Ends disk `disk`'s crash (see [`VirtioBlk::end_crash`]); whether it
    /// was discarding writes.
    pub fn end_disk_crash(&mut self, disk: usize) -> Result<bool, DevicesError> {
        Ok(self.disk_mut(disk)?.end_crash())
    }

    /// Every disk's commands not applied yet: (disk, command), each disk's
    /// in time order.
    pub fn scheduled_disk_commands(&self) -> Vec<(usize, ScheduledDiskCommand)> {
        self.disks()
            .enumerate()
            .flat_map(|(disk, transport)| {
                transport
                    .device()
                    .scheduled()
                    .iter()
                    .map(move |scheduled| (disk, *scheduled))
            })
            .collect()
    }

    /// The counters of disk `disk`, if there is one.
    pub fn disk_counters(&self, disk: usize) -> Option<VirtioBlkCounters> {
        self.disks().nth(disk).map(|t| t.device().counters())
    }

    /// Applies the disks' commands due by now and completes their FLUSHes
    /// due by now.
    pub(super) fn advance_disks(&mut self) {
        let Some(VirtioDevices { memory, slots }) = &mut self.virtio else {
            return;
        };
        let now = self.now;
        for device in slots.iter_mut() {
            if let VirtioSlotDevice::Blk(transport) = device {
                transport.device_mut().apply_due(now);
                if transport.device().has_due_completion(now) {
                    transport.process_queue(0, memory, now);
                }
            }
        }
    }
}
