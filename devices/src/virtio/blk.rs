//! virtio-blk (device ID 2, spec 5.2): a disk whose write cache the VMM owns.
//!
//! The disk is kept in memory in 4 KiB blocks over a read-only base image
//! ([`DiskImage`], the freshly made file system, named by its content
//! digest). Three layers answer a read, the first that has the block: the
//! **cache** (written, not yet flushed: volatile), the **durable** blocks
//! (flushed) and the base image; blocks in none of them are zeros.
//! VIRTIO_BLK_F_FLUSH is offered, so the guest treats the disk as having a
//! write-back cache and sends FLUSH on `fsync` and on journal commits; a
//! FLUSH moves the whole cache into the durable layer.
//!
//! Faults are device state ([`DiskCommand`], scheduled at exact virtual
//! times like the switch's partitions, or applied at once):
//! - [`FlushMode::Delay`]: a FLUSH completes only that long after it was
//!   made available (the request waits in [`VirtioBlk`]'s pending list, and
//!   [`VirtioBlk::next_deadline`] wakes an idle guest for it);
//! - [`FlushMode::Error`]: a FLUSH completes with VIRTIO_BLK_S_IOERR and the
//!   cache stays volatile (a later successful FLUSH persists it, a crash
//!   loses it), as a disk whose cache flush failed: Linux fails the `fsync`
//!   (and jbd2 aborts the journal, as on real hardware);
//! - [`DiskCommand::Crash`]: the cache is dropped and, until
//!   [`VirtioBlk::end_crash`] (the agent has unmounted the file system of
//!   the crashed node), every write is discarded, so nothing the guest's page
//!   cache still holds for that file system reaches the disk; reads see the
//!   durable state. Delayed FLUSHes then complete at once.
//!
//! Everything the guest supplies is checked: a chain without room for the
//! 16-byte header and the status byte is a driver violation (the device is
//! marked broken); a data length that is not whole sectors or a range
//! beyond the capacity completes with VIRTIO_BLK_S_IOERR; an unknown request
//! type with VIRTIO_BLK_S_UNSUPP. Requests complete in the order they are
//! made available, except delayed FLUSHes, which complete at their due time
//! (both functions of virtual time only).

use super::{QueueFault, VirtioDevice, Virtqueue};
use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use crate::GuestMemory;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use thiserror::Error;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR,
    VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use vm_memory::{Bytes, GuestAddress};

/// Bytes of one block of the in-memory disk (and of snapshots' disk state).
pub const BLOCK_SIZE: usize = 4096;
/// Bytes of one sector, the unit of request offsets.
pub const SECTOR_SIZE: u64 = 512;
/// The queue size offered.
pub const BLK_QUEUE_SIZE: u16 = 128;
/// Bytes of a request header (type, reserved, sector).
const HEADER_LEN: usize = 16;

const QUEUE_MAX_SIZES: [u16; 1] = [BLK_QUEUE_SIZE];

type Block = Box<[u8; BLOCK_SIZE]>;

/// A block number: byte offset / [`BLOCK_SIZE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BlockNo(pub u64);

/// Why bytes are not a disk image.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DiskImageError {
    #[error("a disk image of {len} bytes is not a whole number of {BLOCK_SIZE}-byte blocks")]
    NotWholeBlocks { len: u64 },
    #[error("a disk image cannot be empty")]
    Empty,
}

/// The read-only base of a disk: its non-zero blocks, its size, and the
/// digest of its content (computed by whoever made it), which names it in
/// saved state.
#[derive(Debug, PartialEq, Eq)]
pub struct DiskImage {
    capacity_bytes: u64,
    digest: String,
    blocks: BTreeMap<BlockNo, Block>,
}

impl DiskImage {
    /// The image whose content is `bytes` (a whole number of blocks),
    /// named by `digest`.
    pub fn from_bytes(bytes: &[u8], digest: String) -> Result<Self, DiskImageError> {
        let len = bytes.len() as u64;
        if len == 0 {
            return Err(DiskImageError::Empty);
        }
        if !len.is_multiple_of(BLOCK_SIZE as u64) {
            return Err(DiskImageError::NotWholeBlocks { len });
        }
        let blocks = bytes
            .chunks_exact(BLOCK_SIZE)
            .enumerate()
            .filter(|(_, chunk)| chunk.iter().any(|&b| b != 0))
            .map(|(index, chunk)| {
                let mut block: Block = Box::new([0; BLOCK_SIZE]);
                block.copy_from_slice(chunk);
                (BlockNo(index as u64), block)
            })
            .collect();
        Ok(DiskImage {
            capacity_bytes: len,
            digest,
            blocks,
        })
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    pub fn digest(&self) -> &str {
        &self.digest
    }

    fn block_count(&self) -> u64 {
        self.capacity_bytes / BLOCK_SIZE as u64
    }
}

/// How FLUSH requests complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FlushMode {
    /// At once, making the cache durable.
    #[default]
    Normal,
    /// `delay` after the request was made available, making the cache durable.
    Delay { delay: VirtNanos },
    /// At once, with VIRTIO_BLK_S_IOERR; the cache stays volatile.
    Error,
}

/// A change of the disk's fault state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum DiskCommand {
    SetFlush(FlushMode),
    /// Drop the cache and discard writes until [`VirtioBlk::end_crash`].
    Crash,
}

/// A command due at a virtual time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledDiskCommand {
    pub at: VirtNanos,
    pub command: DiskCommand,
}

/// A FLUSH request waiting for its due time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingFlush {
    pub head: u16,
    /// Guest address of the request's status byte.
    pub status_address: u64,
    /// What the used element reports: the bytes written (the status byte).
    pub used_len: u32,
    pub due: VirtNanos,
}

/// What the disk did, for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtioBlkCounters {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub failed_flushes: u64,
    /// Writes dropped while crashed.
    pub discarded_writes: u64,
    /// Requests completed with VIRTIO_BLK_S_IOERR or _UNSUPP (flushes aside).
    pub failed_requests: u64,
}

/// One block of saved state, its bytes in hex.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedBlock {
    pub block: BlockNo,
    pub hex: String,
}

/// Saved state: the base image by digest, the blocks changed over it
/// (durable and cached), the faults and the FLUSHes waiting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtioBlkState {
    pub base_digest: String,
    pub capacity_bytes: u64,
    pub serial: String,
    pub durable: Vec<SavedBlock>,
    pub cache: Vec<SavedBlock>,
    pub flush_mode: FlushMode,
    pub discarding: bool,
    pub pending: Vec<PendingFlush>,
    pub scheduled: Vec<ScheduledDiskCommand>,
    pub counters: VirtioBlkCounters,
}

/// The disk device.
#[derive(Debug)]
pub struct VirtioBlk {
    base: Arc<DiskImage>,
    /// At most [`VIRTIO_BLK_ID_BYTES`] bytes, answered to GET_ID.
    serial: String,
    durable: BTreeMap<BlockNo, Block>,
    cache: BTreeMap<BlockNo, Block>,
    flush_mode: FlushMode,
    discarding: bool,
    /// In due order; same-due FLUSHes in the order they were made available.
    pending: Vec<PendingFlush>,
    /// In time order; same-time commands in the order scheduled.
    scheduled: Vec<ScheduledDiskCommand>,
    counters: VirtioBlkCounters,
}

pub use crate::error::SerialError;

impl VirtioBlk {
    /// A disk showing `base`, with nothing written yet; `serial` is what
    /// the guest reads as the disk's ID (`/sys/block/vdX/serial`).
    pub fn new(base: Arc<DiskImage>, serial: &str) -> Result<Self, SerialError> {
        if serial.len() > VIRTIO_BLK_ID_BYTES as usize || !serial.is_ascii() {
            return Err(SerialError {
                serial: serial.to_owned(),
            });
        }
        Ok(VirtioBlk {
            base,
            serial: serial.to_owned(),
            durable: BTreeMap::new(),
            cache: BTreeMap::new(),
            flush_mode: FlushMode::Normal,
            discarding: false,
            pending: Vec::new(),
            scheduled: Vec::new(),
            counters: VirtioBlkCounters::default(),
        })
    }

    pub fn counters(&self) -> VirtioBlkCounters {
        self.counters
    }

    pub fn flush_mode(&self) -> FlushMode {
        self.flush_mode
    }

    /// Whether writes are being discarded (from a crash to its end).
    pub fn discarding(&self) -> bool {
        self.discarding
    }

    /// Blocks written and not flushed.
    pub fn cached_blocks(&self) -> usize {
        self.cache.len()
    }

    /// Schedules `command` at `at` (applied by [`Self::apply_due`]); same-time
    /// commands apply in the order scheduled.
    pub fn schedule(&mut self, at: VirtNanos, command: DiskCommand) {
        let position = self.scheduled.partition_point(|s| s.at <= at);
        self.scheduled
            .insert(position, ScheduledDiskCommand { at, command });
    }

    /// The commands scheduled and not applied yet, in time order.
    pub fn scheduled(&self) -> &[ScheduledDiskCommand] {
        &self.scheduled
    }

    /// Ends the discarding a crash began: the file system was unmounted, so
    /// the guest's writes from now on are those of its next mount. Returns
    /// whether the disk was discarding.
    pub fn end_crash(&mut self) -> bool {
        std::mem::take(&mut self.discarding)
    }

    /// Applies every scheduled command due at or before `now`.
    pub fn apply_due(&mut self, now: VirtNanos) {
        let due = self.scheduled.partition_point(|s| s.at <= now);
        let commands: Vec<_> = self.scheduled.drain(..due).collect();
        for scheduled in commands {
            self.apply(scheduled.command, now);
        }
    }

    fn apply(&mut self, command: DiskCommand, now: VirtNanos) {
        match command {
            DiskCommand::SetFlush(mode) => self.flush_mode = mode,
            DiskCommand::Crash => {
                self.cache.clear();
                self.discarding = true;
                for pending in &mut self.pending {
                    pending.due = pending.due.min(now);
                }
            }
        }
    }

    /// Whether a FLUSH is due at or before `now` (the queue must then be
    /// processed to complete it).
    pub fn has_due_completion(&self, now: VirtNanos) -> bool {
        self.pending.first().is_some_and(|p| p.due <= now)
    }

    /// The next virtual time the disk does something by itself: a delayed
    /// FLUSH completes or a scheduled command applies.
    pub fn next_deadline(&self) -> Option<VirtNanos> {
        let flush = self.pending.first().map(|p| p.due);
        let command = self.scheduled.first().map(|s| s.at);
        flush.into_iter().chain(command).min()
    }

    /// The block as reads see it.
    fn block(&self, block: BlockNo) -> Option<&Block> {
        self.cache
            .get(&block)
            .or_else(|| self.durable.get(&block))
            .or_else(|| self.base.blocks.get(&block))
    }

    /// `len` bytes from byte `offset` (inside the capacity).
    fn read_range(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; len];
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            let block = BlockNo(at / BLOCK_SIZE as u64);
            let within = (at % BLOCK_SIZE as u64) as usize;
            let take = (BLOCK_SIZE - within).min(len - done);
            if let Some(data) = self.block(block) {
                bytes[done..done + take].copy_from_slice(&data[within..within + take]);
            }
            done += take;
        }
        bytes
    }

    /// Writes `data` at byte `offset` (inside the capacity) into the cache.
    fn write_range(&mut self, offset: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let block = BlockNo(at / BLOCK_SIZE as u64);
            let within = (at % BLOCK_SIZE as u64) as usize;
            let take = (BLOCK_SIZE - within).min(data.len() - done);
            if !self.cache.contains_key(&block) {
                let current = self
                    .block(block)
                    .cloned()
                    .unwrap_or_else(|| Box::new([0; BLOCK_SIZE]));
                self.cache.insert(block, current);
            }
            if let Some(cached) = self.cache.get_mut(&block) {
                cached[within..within + take].copy_from_slice(&data[done..done + take]);
            }
            done += take;
        }
    }

    /// Makes the cache durable.
    fn persist_cache(&mut self) {
        let mut cache = std::mem::take(&mut self.cache);
        self.durable.append(&mut cache);
    }

    /// The byte range `sector`.. of `len` bytes, if it is whole sectors
    /// inside the capacity.
    fn checked_range(&self, sector: u64, len: usize) -> Option<u64> {
        let len = len as u64;
        if !len.is_multiple_of(SECTOR_SIZE) {
            return None;
        }
        let offset = sector.checked_mul(SECTOR_SIZE)?;
        let end = offset.checked_add(len)?;
        (end <= self.base.capacity_bytes).then_some(offset)
    }

    /// Completes the pending FLUSHes due at or before `now`.
    fn complete_due(
        &mut self,
        queue: &mut Virtqueue,
        mem: &GuestMemory,
        now: VirtNanos,
    ) -> Result<(), QueueFault> {
        let due = self.pending.partition_point(|p| p.due <= now);
        let completed: Vec<_> = self.pending.drain(..due).collect();
        for flush in completed {
            if !self.discarding {
                self.persist_cache();
            }
            self.counters.flushes += 1;
            write_status(mem, flush.status_address, VIRTIO_BLK_S_OK)?;
            queue.add_used(mem, flush.head, flush.used_len)?;
        }
        Ok(())
    }

    /// Serves one request; `None` when it completes later (a delayed FLUSH),
    /// else the used element's head and length (the bytes written: data,
    /// then the status byte, the chain's last writable byte). Nothing is
    /// allocated for a request that fails, however long its buffers.
    fn serve(
        &mut self,
        chain: &super::DescriptorChain,
        mem: &GuestMemory,
        now: VirtNanos,
    ) -> Result<Option<(u32, u32)>, QueueFault> {
        let head = chain.head_index();
        let readable = chain.readable_len() as usize;
        let writable = chain.writable_len() as usize;
        let too_short = QueueFault::BlkRequestTooShort {
            head,
            readable: readable as u32,
            writable: writable as u32,
        };
        if readable < HEADER_LEN {
            return Err(too_short);
        }
        let status_at = status_address(chain).ok_or(too_short)?;
        let header = chain.read_readable(mem, HEADER_LEN)?;
        let kind = u32::from_le_bytes(header[0..4].try_into().unwrap_or_default());
        let sector = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        let data_in = writable - 1;
        let data_out = readable - HEADER_LEN;
        // The bytes written before the status byte.
        let mut written = 0usize;
        let status = match kind {
            VIRTIO_BLK_T_IN => match self.checked_range(sector, data_in) {
                Some(offset) => {
                    let data = self.read_range(offset, data_in);
                    written = chain.write_writable(mem, &data)? as usize;
                    self.counters.reads += 1;
                    VIRTIO_BLK_S_OK
                }
                None => VIRTIO_BLK_S_IOERR,
            },
            VIRTIO_BLK_T_OUT => match self.checked_range(sector, data_out) {
                Some(offset) => {
                    let bytes = chain.read_readable(mem, readable)?;
                    if self.discarding {
                        self.counters.discarded_writes += 1;
                    } else {
                        self.write_range(offset, &bytes[HEADER_LEN..]);
                        self.counters.writes += 1;
                    }
                    VIRTIO_BLK_S_OK
                }
                None => VIRTIO_BLK_S_IOERR,
            },
            VIRTIO_BLK_T_FLUSH => match self.flush_mode {
                FlushMode::Normal => {
                    if !self.discarding {
                        self.persist_cache();
                    }
                    self.counters.flushes += 1;
                    VIRTIO_BLK_S_OK
                }
                FlushMode::Error if !self.discarding => {
                    self.counters.failed_flushes += 1;
                    write_status(mem, status_at, VIRTIO_BLK_S_IOERR)?;
                    return Ok(Some((u32::from(head), 1)));
                }
                FlushMode::Error => VIRTIO_BLK_S_OK,
                FlushMode::Delay { delay } => {
                    let due = if self.discarding {
                        now
                    } else {
                        now.saturating_add(delay)
                    };
                    // After those due at the same time or earlier (a shorter
                    // delay set since may make this one due before older ones).
                    let position = self.pending.partition_point(|p| p.due <= due);
                    self.pending.insert(
                        position,
                        PendingFlush {
                            head,
                            status_address: status_at,
                            used_len: 1,
                            due,
                        },
                    );
                    return Ok(None);
                }
            },
            VIRTIO_BLK_T_GET_ID => {
                let mut id = [0u8; VIRTIO_BLK_ID_BYTES as usize];
                id[..self.serial.len()].copy_from_slice(self.serial.as_bytes());
                let len = id.len().min(data_in);
                written = chain.write_writable(mem, &id[..len])? as usize;
                VIRTIO_BLK_S_OK
            }
            _ => VIRTIO_BLK_S_UNSUPP,
        };
        if status != VIRTIO_BLK_S_OK {
            self.counters.failed_requests += 1;
        }
        write_status(mem, status_at, status)?;
        Ok(Some((u32::from(head), (written + 1) as u32)))
    }
}

/// The guest address of a chain's last writable byte (its status byte).
fn status_address(chain: &super::DescriptorChain) -> Option<u64> {
    let last = chain
        .segments()
        .iter()
        .rev()
        .find(|s| s.device_writable && s.len > 0)?;
    last.address.checked_add(u64::from(last.len) - 1)
}

fn write_status(mem: &GuestMemory, address: u64, status: u32) -> Result<(), QueueFault> {
    mem.write_obj(status as u8, GuestAddress(address))
        .map_err(|_| QueueFault::GuestMemory { address })
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    text
}

fn from_hex(text: &str) -> Option<Block> {
    let digits = text.as_bytes();
    if digits.len() != 2 * BLOCK_SIZE {
        return None;
    }
    let nibble = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let mut block: Block = Box::new([0; BLOCK_SIZE]);
    for (byte, pair) in block.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(block)
}

fn save_blocks(blocks: &BTreeMap<BlockNo, Block>) -> Vec<SavedBlock> {
    blocks
        .iter()
        .map(|(&block, data)| SavedBlock {
            block,
            hex: to_hex(&data[..]),
        })
        .collect()
}

impl VirtioBlk {
    fn load_blocks(&self, saved: &[SavedBlock]) -> Result<BTreeMap<BlockNo, Block>, RestoreError> {
        let mut blocks = BTreeMap::new();
        for entry in saved {
            if entry.block.0 >= self.base.block_count() {
                return Err(RestoreError::DiskBlock {
                    block: entry.block.0,
                    reason: "beyond the disk's capacity",
                });
            }
            let data = from_hex(&entry.hex).ok_or(RestoreError::DiskBlock {
                block: entry.block.0,
                reason: "not 4096 bytes in lowercase hex",
            })?;
            if blocks.insert(entry.block, data).is_some() {
                return Err(RestoreError::DiskBlock {
                    block: entry.block.0,
                    reason: "saved twice",
                });
            }
        }
        Ok(blocks)
    }
}

impl Persist for VirtioBlk {
    type State = VirtioBlkState;

    fn save(&self) -> VirtioBlkState {
        VirtioBlkState {
            base_digest: self.base.digest.clone(),
            capacity_bytes: self.base.capacity_bytes,
            serial: self.serial.clone(),
            durable: save_blocks(&self.durable),
            cache: save_blocks(&self.cache),
            flush_mode: self.flush_mode,
            discarding: self.discarding,
            pending: self.pending.clone(),
            scheduled: self.scheduled.clone(),
            counters: self.counters,
        }
    }

    /// The state must be over this disk's base image (same digest and
    /// capacity) and serial, its blocks inside the capacity, its pending
    /// FLUSHes and scheduled commands in time order.
    fn validate(&self, state: &VirtioBlkState) -> Result<(), RestoreError> {
        if state.base_digest != self.base.digest || state.capacity_bytes != self.base.capacity_bytes
        {
            return Err(RestoreError::DiskBase {
                saved: format!("{} ({} bytes)", state.base_digest, state.capacity_bytes),
                attached: format!("{} ({} bytes)", self.base.digest, self.base.capacity_bytes),
            });
        }
        if state.serial != self.serial {
            return Err(RestoreError::Incompatible {
                part: "disk serial",
                reason: format!("saved {:?}, attached {:?}", state.serial, self.serial),
            });
        }
        self.load_blocks(&state.durable)?;
        self.load_blocks(&state.cache)?;
        let ordered = |times: &mut dyn Iterator<Item = VirtNanos>| {
            let times: Vec<_> = times.collect();
            times.windows(2).all(|w| w[0] <= w[1])
        };
        if !ordered(&mut state.pending.iter().map(|p| p.due))
            || !ordered(&mut state.scheduled.iter().map(|s| s.at))
        {
            return Err(RestoreError::Incompatible {
                part: "disk schedule",
                reason: "pending flushes or scheduled commands out of time order".into(),
            });
        }
        if state.pending.iter().any(|p| p.head >= BLK_QUEUE_SIZE) {
            return Err(RestoreError::Incompatible {
                part: "disk pending flushes",
                reason: format!("a head beyond the queue's {BLK_QUEUE_SIZE} descriptors"),
            });
        }
        Ok(())
    }

    fn restore(&mut self, state: &VirtioBlkState) -> Result<(), RestoreError> {
        self.validate(state)?;
        self.durable = self.load_blocks(&state.durable)?;
        self.cache = self.load_blocks(&state.cache)?;
        self.flush_mode = state.flush_mode;
        self.discarding = state.discarding;
        self.pending = state.pending.clone();
        self.scheduled = state.scheduled.clone();
        self.counters = state.counters;
        Ok(())
    }
}

impl VirtioDevice for VirtioBlk {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn device_features(&self) -> u64 {
        (1 << VIRTIO_BLK_F_FLUSH) | (1 << VIRTIO_BLK_F_SEG_MAX)
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &QUEUE_MAX_SIZES
    }

    /// `capacity` (sectors, offset 0) and `seg_max` (offset 12); the rest
    /// of the configuration space reads as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; 24];
        config[0..8].copy_from_slice(&(self.base.capacity_bytes / SECTOR_SIZE).to_le_bytes());
        // Header and status take a descriptor each.
        config[12..16].copy_from_slice(&u32::from(BLK_QUEUE_SIZE - 2).to_le_bytes());
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|at| config.get(at))
                .copied()
                .unwrap_or(0);
        }
    }

    fn process_queue(
        &mut self,
        _queue_index: usize,
        queue: &mut Virtqueue,
        mem: &GuestMemory,
        now: VirtNanos,
    ) -> Result<(), QueueFault> {
        self.apply_due(now);
        self.complete_due(queue, mem, now)?;
        while let Some(chain) = queue.pop(mem)? {
            if let Some((head, len)) = self.serve(&chain, mem, now)? {
                queue.add_used(mem, head as u16, len)?;
            }
        }
        Ok(())
    }

    /// The driver's requests are gone with the reset; the disk's content,
    /// cache and faults are the device's and stay.
    fn reset(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
#[path = "blk_tests.rs"]
mod tests;
