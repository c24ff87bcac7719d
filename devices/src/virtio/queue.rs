//! One split virtqueue (spec 2.7), as the device side uses it.
//!
//! The ring bookkeeping (sizes, ring addresses, next_avail/next_used, the
//! available-index check, writing used elements and avail_event) is
//! virtio-queue's [`Queue`]. Descriptor chains are walked here rather than
//! with virtio-queue's `DescriptorChain` iterator, because that iterator ends
//! quietly on a malformed chain (a loop, an index out of range, a length
//! overflow) while this device must tell a well-formed chain from a broken
//! one: every fault is reported as a [`QueueFault`], and a chain is only
//! handed to a backend once every buffer in it lies inside guest memory.
//!
//! VIRTIO_RING_F_INDIRECT_DESC is never offered, so an indirect descriptor
//! is a fault.
//!
//! # Notification suppression (spec 2.7.7, 2.7.10)
//!
//! The transport offers VIRTIO_RING_F_EVENT_IDX on every device. Once the
//! driver accepted it ([`Virtqueue::set_event_idx`], saved with the queue):
//!
//! * driver to device: after each pass of the backend over the queue,
//!   [`Virtqueue::publish_avail_event`] writes avail_event = next_avail, so
//!   the driver notifies again only when it makes available the entry the
//!   device has not seen yet, i.e. only when the device had consumed
//!   everything. A backend that stops early on purpose (no input to
//!   deliver) is run again by the VMM when it has some, not on a notify.
//!   If the pass ended with the ring drained and the driver made buffers
//!   available meanwhile (it may have read the old avail_event), the device
//!   takes another pass (spec 2.7.10's re-check; with one vCPU stopped in the
//!   exit this cannot happen, but the device does not rely on it).
//! * device to driver: [`Virtqueue::needs_interrupt`] asks for the
//!   used-buffer interrupt only if the used index, moving from its value
//!   before the device step to its value after, passed the driver's
//!   used_event (`vring_need_event`).
//!
//! Without the feature, used_event and avail_event are never touched, the
//! driver notifies every time (the device never sets
//! VRING_USED_F_NO_NOTIFY) and the device honours the driver's
//! VRING_AVAIL_F_NO_INTERRUPT flag instead.
//!
//! Both decisions read guest memory only inside the device step the VMM
//! runs at a guest-caused exit, so they are as deterministic as the step.

use super::{QueueFault, RingPart};
use crate::error::DevicesError;
use crate::persist::{Persist, RestoreError};
use crate::GuestMemory;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{Error as QueueError, Queue, QueueOwnedT, QueueState, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

/// Size in bytes of one descriptor table entry.
const DESCRIPTOR_SIZE: u64 = 16;
const LOW_HALF: u64 = 0xffff_ffff;

/// Saved state of one virtqueue: what the driver configured and how far
/// both sides got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtqueueState {
    pub max_size: u16,
    pub size: u16,
    pub ready: bool,
    pub desc_table: u64,
    pub avail_ring: u64,
    pub used_ring: u64,
    /// Index of the next available-ring entry the device will read.
    pub next_avail: u16,
    /// Index of the next used-ring entry the device will write.
    pub next_used: u16,
    /// VIRTIO_RING_F_EVENT_IDX was negotiated: avail_event and used_event
    /// are in use. Absent from states saved before the feature was offered.
    #[serde(default)]
    pub event_idx_enabled: bool,
}

/// A split virtqueue whose configuration the driver writes through the
/// transport.
#[derive(Debug)]
pub struct Virtqueue {
    queue: Queue,
    /// Set when [`Virtqueue::pop`] found the available ring empty, cleared
    /// when it found a chain: whether the backend's pass consumed everything
    /// the driver had made available. Only meaningful within a device step.
    drained: bool,
}

/// One descriptor of a validated chain. A non-empty buffer lies entirely
/// inside guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSegment {
    /// The descriptor's index in the descriptor table.
    pub index: u16,
    pub address: u64,
    pub len: u32,
    pub device_writable: bool,
}

/// A descriptor chain that passed every check: at most queue-size
/// descriptors, no loop, every index in range, every buffer inside guest
/// memory, at most 2^32 - 1 bytes in total, readable buffers before
/// writable ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescriptorChain {
    head_index: u16,
    segments: Vec<BufferSegment>,
}

impl Virtqueue {
    /// A queue of at most `max_size` entries; `max_size` must be a power of
    /// two no larger than 32768.
    pub fn new(max_size: u16) -> Result<Self, DevicesError> {
        let queue =
            Queue::new(max_size).map_err(|_| DevicesError::VirtqueueMaxSize { max_size })?;
        Ok(Virtqueue {
            queue,
            drained: false,
        })
    }

    pub fn max_size(&self) -> u16 {
        self.queue.max_size()
    }

    pub fn size(&self) -> u16 {
        self.queue.size()
    }

    pub fn ready(&self) -> bool {
        self.queue.ready()
    }

    pub fn next_avail(&self) -> u16 {
        self.queue.next_avail()
    }

    pub fn next_used(&self) -> u16 {
        self.queue.next_used()
    }

    /// Whether VIRTIO_RING_F_EVENT_IDX is in use on this queue.
    pub fn event_idx(&self) -> bool {
        self.queue.event_idx_enabled()
    }

    /// Whether the driver negotiated VIRTIO_RING_F_EVENT_IDX; the transport
    /// sets it when it accepts FEATURES_OK, a device reset clears it.
    pub fn set_event_idx(&mut self, enabled: bool) {
        self.queue.set_event_idx(enabled);
    }

    fn check_not_ready(&self) -> Result<(), QueueFault> {
        if self.queue.ready() {
            // The spec lets the driver change a queue only while it is not
            // ready; a ready queue may be mid-use.
            return Err(QueueFault::WriteWhileReady);
        }
        Ok(())
    }

    /// The driver's QueueNum write.
    pub fn set_size(&mut self, size: u32) -> Result<(), QueueFault> {
        self.check_not_ready()?;
        let invalid = QueueFault::InvalidSize {
            size,
            max: self.queue.max_size(),
        };
        let size = u16::try_from(size).map_err(|_| invalid)?;
        self.queue.try_set_size(size).map_err(|_| invalid)
    }

    /// The driver's write of one 32-bit half of a ring address register.
    /// Alignment depends on the low half only, so it is checked on each write.
    pub fn set_address_half(
        &mut self,
        part: RingPart,
        high_half: bool,
        value: u32,
    ) -> Result<(), QueueFault> {
        self.check_not_ready()?;
        let current = match part {
            RingPart::DescriptorTable => self.queue.desc_table(),
            RingPart::AvailRing => self.queue.avail_ring(),
            RingPart::UsedRing => self.queue.used_ring(),
        };
        let address = if high_half {
            (u64::from(value) << 32) | (current & LOW_HALF)
        } else {
            (current & !LOW_HALF) | u64::from(value)
        };
        let result = match part {
            RingPart::DescriptorTable => {
                self.queue.try_set_desc_table_address(GuestAddress(address))
            }
            RingPart::AvailRing => self.queue.try_set_avail_ring_address(GuestAddress(address)),
            RingPart::UsedRing => self.queue.try_set_used_ring_address(GuestAddress(address)),
        };
        result.map_err(|_| QueueFault::MisalignedRing { part, address })
    }

    /// The driver's QueueReady write. A queue only becomes ready if all
    /// three rings lie inside guest memory, so that no later ring access
    /// can leave it.
    pub fn set_ready(&mut self, ready: bool, mem: &GuestMemory) -> Result<(), QueueFault> {
        if !ready || self.queue.ready() {
            self.queue.set_ready(ready);
            return Ok(());
        }
        self.queue.set_ready(true);
        if !self.rings_in_memory(mem) {
            self.queue.set_ready(false);
            return Err(QueueFault::RingOutsideMemory);
        }
        Ok(())
    }

    /// Whether the rings lie inside `mem`. virtio-queue treats an available
    /// ring at address 0 as an unconfigured queue and refuses to use it, so
    /// such a queue is refused here too.
    fn rings_in_memory(&self, mem: &GuestMemory) -> bool {
        self.queue.avail_ring() != 0 && self.queue.is_valid(mem)
    }

    /// Device reset: the queue returns to its unconfigured state.
    pub fn reset(&mut self) {
        self.queue.reset();
        self.drained = false;
    }

    /// The next chain the driver made available, checked; `None` if the
    /// driver has made nothing more available.
    pub fn pop(&mut self, mem: &GuestMemory) -> Result<Option<DescriptorChain>, QueueFault> {
        let size = self.queue.size();
        let next_avail = self.queue.next_avail();
        // `iter` checks that the available index moved by at most the queue
        // size; its `next` reads one ring entry, inside the ring checked at
        // QueueReady, and advances next_avail.
        let popped = self
            .queue
            .iter(mem)
            .map(|mut available| available.next().map(|chain| chain.head_index()));
        let head = match popped {
            Ok(Some(head)) => head,
            Ok(None) => {
                self.drained = true;
                return Ok(None);
            }
            Err(QueueError::InvalidAvailRingIndex) => {
                let avail_idx = self
                    .queue
                    .avail_idx(mem, Ordering::Acquire)
                    .map_or(next_avail, |idx| idx.0);
                return Err(QueueFault::AvailIndexJump {
                    distance: avail_idx.wrapping_sub(next_avail),
                    size,
                });
            }
            Err(_) => return Err(QueueFault::RingOutsideMemory),
        };
        self.drained = false;
        self.walk_chain(mem, head).map(Some)
    }

    /// Reads and checks the chain from `head`: first its shape (indexes,
    /// length, flags, total size), then that every buffer lies inside guest
    /// memory, so a chain that is malformed is reported as such wherever its
    /// buffers point.
    fn walk_chain(&self, mem: &GuestMemory, head: u16) -> Result<DescriptorChain, QueueFault> {
        let segments = self.read_chain(mem, head)?;
        for segment in &segments {
            // An empty buffer is never accessed, so its address does not matter.
            if segment.len == 0 {
                continue;
            }
            let (index, address, len) = (segment.index, segment.address, segment.len);
            if address.checked_add(u64::from(len)).is_none() {
                return Err(QueueFault::BufferAddressOverflow {
                    index,
                    address,
                    len,
                });
            }
            if !GuestMemoryBackend::check_range(mem, GuestAddress(address), len as usize) {
                return Err(QueueFault::BufferOutsideMemory {
                    index,
                    address,
                    len,
                });
            }
        }
        Ok(DescriptorChain {
            head_index: head,
            segments,
        })
    }

    fn read_chain(&self, mem: &GuestMemory, head: u16) -> Result<Vec<BufferSegment>, QueueFault> {
        let size = self.queue.size();
        let table = self.queue.desc_table();
        let mut segments = Vec::new();
        let mut index = head;
        let mut total_len: u32 = 0;
        let mut seen_writable = false;
        // A well-formed chain has at most `size` descriptors; a chain still
        // going after that many revisits one, so this bound also ends loops.
        for _ in 0..size {
            if index >= size {
                return Err(QueueFault::DescriptorIndexOutOfRange { index, size });
            }
            // Inside the table checked at QueueReady (index < size), so the
            // sum cannot wrap; checked all the same rather than trusted.
            let entry = table
                .checked_add(u64::from(index) * DESCRIPTOR_SIZE)
                .ok_or(QueueFault::GuestMemory { address: table })?;
            let descriptor: Descriptor = mem
                .read_obj(GuestAddress(entry))
                .map_err(|_| QueueFault::GuestMemory { address: entry })?;
            if descriptor.refers_to_indirect_table() {
                return Err(QueueFault::IndirectDescriptor { index });
            }
            let len = descriptor.len();
            // The spec caps a chain below 2^32 bytes; the used ring's length is 32 bits.
            total_len = total_len
                .checked_add(len)
                .ok_or(QueueFault::ChainLengthOverflow { head })?;
            let device_writable = descriptor.is_write_only();
            if device_writable {
                seen_writable = true;
            } else if seen_writable {
                // Spec 2.7.4.2: device-readable buffers come first.
                return Err(QueueFault::ReadableAfterWritable { index });
            }
            segments.push(BufferSegment {
                index,
                address: descriptor.addr().0,
                len,
                device_writable,
            });
            if !descriptor.has_next() {
                return Ok(segments);
            }
            index = descriptor.next();
        }
        Err(QueueFault::ChainTooLong { head, size })
    }

    /// Returns a chain to the driver, `len` bytes of it written by the device.
    pub fn add_used(
        &mut self,
        mem: &GuestMemory,
        head_index: u16,
        len: u32,
    ) -> Result<(), QueueFault> {
        // Cannot fail for a head `pop` returned: the used ring was checked
        // at QueueReady and the head is below the queue size.
        self.queue
            .add_used(mem, head_index, len)
            .map_err(|_| QueueFault::GuestMemory {
                address: self.queue.used_ring(),
            })
    }

    /// Starts one pass of a backend over the queue (see
    /// [`Self::publish_avail_event`]).
    pub fn start_pass(&mut self) {
        self.drained = false;
    }

    /// Ends a backend's pass over the queue. With EVENT_IDX, writes
    /// avail_event = next_avail: the driver notifies next when it makes
    /// available the first entry the device has not consumed. Returns
    /// whether the device must take another pass: the pass drained the ring
    /// and the available index has moved since (a driver that added buffers
    /// while avail_event still held its old value may not have notified).
    /// Without EVENT_IDX it does nothing: the driver notifies every time.
    pub fn publish_avail_event(&mut self, mem: &GuestMemory) -> Result<bool, QueueFault> {
        if !self.queue.event_idx_enabled() {
            return Ok(false);
        }
        // Writes avail_event (inside the used ring checked at QueueReady),
        // then re-reads the available index.
        let more = self
            .queue
            .enable_notification(mem)
            .map_err(|_| QueueFault::GuestMemory {
                address: self.queue.used_ring(),
            })?;
        Ok(more && std::mem::take(&mut self.drained))
    }

    /// Whether the driver wants the used-buffer interrupt for the used
    /// elements written since the used index was `used_before`: with
    /// EVENT_IDX, whether the used index passed used_event on its way from
    /// `used_before` to now (`vring_need_event`, spec 2.7.10); without it,
    /// unless the driver set VRING_AVAIL_F_NO_INTERRUPT (spec 2.7.7). False
    /// if no element was written. A ring that cannot be read asks for the
    /// interrupt: a spurious one costs the driver a look, a missing one can
    /// hang it.
    pub fn needs_interrupt(&self, mem: &GuestMemory, used_before: u16) -> bool {
        let used = self.queue.next_used();
        if used == used_before {
            return false;
        }
        let avail = self.queue.avail_ring();
        if self.queue.event_idx_enabled() {
            // used_event follows the available ring's entries (inside the
            // ring checked at QueueReady).
            let used_event = avail
                .checked_add(4 + 2 * u64::from(self.queue.size()))
                .and_then(|address| read_u16(mem, address));
            used_event.is_none_or(|event| need_event(event, used, used_before))
        } else {
            read_u16(mem, avail).is_none_or(|flags| flags & VRING_AVAIL_F_NO_INTERRUPT as u16 == 0)
        }
    }
}

/// Linux's `vring_need_event`: whether moving an index from `old` to `new`
/// passed `event` (the event is one of old..new, in 16-bit wrapping order).
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// A little-endian 16-bit ring field of guest memory.
fn read_u16(mem: &GuestMemory, address: u64) -> Option<u16> {
    mem.read_obj::<u16>(GuestAddress(address))
        .ok()
        .map(u16::from_le)
}

impl VirtqueueState {
    /// The queue this state describes, checked as the driver's writes would
    /// have been: a valid size and aligned rings.
    fn to_queue(self) -> Result<Queue, RestoreError> {
        Queue::try_from(QueueState {
            max_size: self.max_size,
            next_avail: self.next_avail,
            next_used: self.next_used,
            event_idx_enabled: self.event_idx_enabled,
            size: self.size,
            ready: self.ready,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        })
        .map_err(|e| RestoreError::VirtqueueState {
            reason: e.to_string(),
        })
    }

    /// Checks that, if the queue is ready, its rings lie inside `mem`, as
    /// the driver's QueueReady write was checked. Guest memory is not part
    /// of a queue, so [`Persist::restore`] cannot check this: whoever holds
    /// the memory does, before restoring.
    pub fn check_rings_in(&self, mem: &GuestMemory) -> Result<(), RestoreError> {
        let queue = Virtqueue {
            queue: self.to_queue()?,
            drained: false,
        };
        if queue.ready() && !queue.rings_in_memory(mem) {
            return Err(RestoreError::RingsOutsideMemory);
        }
        Ok(())
    }
}

impl Persist for Virtqueue {
    type State = VirtqueueState;

    fn save(&self) -> VirtqueueState {
        let state = self.queue.state();
        VirtqueueState {
            max_size: state.max_size,
            size: state.size,
            ready: state.ready,
            desc_table: state.desc_table,
            avail_ring: state.avail_ring,
            used_ring: state.used_ring,
            next_avail: state.next_avail,
            next_used: state.next_used,
            event_idx_enabled: state.event_idx_enabled,
        }
    }

    /// The maximum size must be this queue's (it is the device's, not the
    /// driver's), the size valid and the rings aligned.
    fn validate(&self, state: &VirtqueueState) -> Result<(), RestoreError> {
        if state.max_size != self.max_size() {
            return Err(RestoreError::VirtqueueMaxSize {
                max_size: state.max_size,
                expected: self.max_size(),
            });
        }
        state.to_queue().map(drop)
    }

    fn restore(&mut self, state: &VirtqueueState) -> Result<(), RestoreError> {
        self.validate(state)?;
        self.queue = state.to_queue()?;
        self.drained = false;
        Ok(())
    }
}

impl DescriptorChain {
    pub fn head_index(&self) -> u16 {
        self.head_index
    }

    pub fn segments(&self) -> &[BufferSegment] {
        &self.segments
    }

    /// Fails unless every buffer is device-writable (receive-type queues).
    pub fn require_device_writable(&self) -> Result<(), QueueFault> {
        match self.segments.iter().find(|s| !s.device_writable) {
            Some(segment) => Err(QueueFault::ReadOnlyDescriptor {
                index: segment.index,
            }),
            None => Ok(()),
        }
    }

    /// Fails unless every buffer is device-readable (transmit-type queues).
    pub fn require_device_readable(&self) -> Result<(), QueueFault> {
        match self.segments.iter().find(|s| s.device_writable) {
            Some(segment) => Err(QueueFault::WritableDescriptor {
                index: segment.index,
            }),
            None => Ok(()),
        }
    }

    /// Total bytes of the device-writable buffers (below 2^32 by validation).
    pub fn writable_len(&self) -> u32 {
        self.segments
            .iter()
            .filter(|s| s.device_writable)
            .map(|s| s.len)
            .sum()
    }

    /// Total bytes of the device-readable buffers (below 2^32 by validation).
    pub fn readable_len(&self) -> u32 {
        self.segments
            .iter()
            .filter(|s| !s.device_writable)
            .map(|s| s.len)
            .sum()
    }

    /// The first `limit` bytes (at most) of the device-readable buffers, in
    /// chain order.
    pub fn read_readable(&self, mem: &GuestMemory, limit: usize) -> Result<Vec<u8>, QueueFault> {
        let mut bytes = Vec::new();
        for segment in self.segments.iter().filter(|s| !s.device_writable) {
            let room = limit - bytes.len();
            if room == 0 {
                break;
            }
            let take = room.min(segment.len as usize);
            let start = bytes.len();
            bytes.resize(start + take, 0);
            mem.read_slice(&mut bytes[start..], GuestAddress(segment.address))
                .map_err(|_| QueueFault::GuestMemory {
                    address: segment.address,
                })?;
        }
        Ok(bytes)
    }

    /// Writes `bytes` into the device-writable buffers in chain order, as
    /// far as they reach; returns how many bytes were written.
    pub fn write_writable(&self, mem: &GuestMemory, bytes: &[u8]) -> Result<u32, QueueFault> {
        let mut written = 0usize;
        for segment in self.segments.iter().filter(|s| s.device_writable) {
            let rest = &bytes[written..];
            if rest.is_empty() {
                break;
            }
            let take = rest.len().min(segment.len as usize);
            mem.write_slice(&rest[..take], GuestAddress(segment.address))
                .map_err(|_| QueueFault::GuestMemory {
                    address: segment.address,
                })?;
            written += take;
        }
        // At most writable_len(), which fits in u32.
        Ok(u32::try_from(written).unwrap_or(u32::MAX))
    }
}
