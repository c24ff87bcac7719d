//! The virtio-mmio transport and the virtqueue descriptor chains of the
//! net, console and rng devices (chosen by the input), over guest memory
//! the fuzzer owns, with guard pages around it. The guest is the input: it
//! writes registers (Linux's initialization sequence as one step, or any
//! register with any value and width), writes descriptors and available
//! ring entries (well placed or anywhere), stores anything anywhere in its
//! RAM and notifies; the host delivers frames and console input.
//!
//! Invariants asserted:
//! 1. No panic; no access outside guest memory (it would hit a guard page
//!    and crash the target).
//! 2. Every chain the device takes is returned at once: while the device is
//!    not broken, every queue's next used index equals its next available
//!    index after each step.
//! 3. A used element's length is at most the writable bytes of its chain
//!    (checked against the descriptor table as it was before the step,
//!    whenever the device's writes could not have changed the table or the
//!    used ring during the step).
//! 4. The device is broken exactly when its status has DEVICE_NEEDS_RESET.
//! 5. MagicValue, Version and DeviceID always read their fixed values.
//! 6. Determinism: a second device and memory fed the same steps, with a
//!    save, JSON round trip and restore into a fresh device wherever the
//!    input asks, reads the same registers, delivers and transmits the
//!    same bytes and ends with the same state and the same guest memory.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use detvisor_fuzz::virtio_driver::{
    init_writes, split_rings, QueueSetup, REG_DEVICE_ID, REG_MAGIC, REG_QUEUE_NOTIFY, REG_VERSION,
};
use detvisor_fuzz::{fnv1a, two_memories};
use devices::persist::Persist;
use devices::virtio::mmio::{MMIO_MAGIC, MMIO_VERSION, STATUS_NEEDS_RESET};
use devices::virtio::{VirtioConsole, VirtioDevice, VirtioMmioTransport, VirtioNet, VirtioRng};
use devices::{GuestMemory, VirtNanos};
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress};

/// Guest RAM: queues from 0x1000, data buffers from 0x8000.
const MEMORY_SIZE: usize = 0x1_0000;
const QUEUE_BASE: u64 = 0x1000;
const QUEUE_STRIDE: u64 = 0x2000;
const DATA_BASE: u64 = 0x8000;

/// Registers the guest writes most (any other offset is reachable too).
const REGISTERS: [u64; 24] = [
    0x000, 0x004, 0x008, 0x00c, 0x010, 0x014, 0x020, 0x024, 0x030, 0x034, 0x038, 0x044, 0x050,
    0x060, 0x064, 0x070, 0x080, 0x084, 0x090, 0x094, 0x0a0, 0x0a4, 0x0fc, 0x100,
];

const VRING_DESC_F_NEXT: u16 = 1;
const VRING_DESC_F_WRITE: u16 = 2;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Register {
    Known(u8),
    Any(u16),
}

impl Register {
    fn offset(self) -> u64 {
        match self {
            Register::Known(i) => REGISTERS[usize::from(i) % REGISTERS.len()],
            Register::Any(offset) => u64::from(offset % 0x200),
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Address {
    /// In the data area.
    Data(u16),
    /// Anywhere (mostly outside guest memory).
    Any(u64),
}

impl Address {
    fn get(self) -> u64 {
        match self {
            Address::Data(offset) => {
                DATA_BASE + u64::from(offset) % (MEMORY_SIZE as u64 - DATA_BASE)
            }
            Address::Any(address) => address,
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    /// Reset, feature negotiation, every queue at the standard layout with
    /// `1 << size_log2` entries (capped at the maximum), DRIVER_OK.
    Initialize {
        features: u64,
        size_log2: u8,
    },
    Write {
        register: Register,
        width: u8,
        value: u64,
    },
    Read {
        register: Register,
        width: u8,
    },
    /// Descriptor `index` of queue `queue`'s table at the standard layout.
    Descriptor {
        queue: u8,
        index: u16,
        address: Address,
        len: u16,
        flags: u16,
        next: u16,
    },
    /// Makes `head` available on queue `queue` and publishes it.
    Publish {
        queue: u8,
        head: u16,
    },
    /// Any store of the guest into its RAM.
    Store {
        address: u16,
        bytes: Vec<u8>,
    },
    Notify {
        queue: u8,
    },
    /// Host input: a frame (net) or console input of `len` bytes.
    Deliver {
        len: u16,
        fill: u8,
    },
    /// Save, serialize, deserialize, restore into a fresh device (in the
    /// second run only).
    SaveRestore,
}

#[derive(Arbitrary, Debug)]
enum Kind {
    Net,
    Console,
    Rng,
}

#[derive(Arbitrary, Debug)]
struct Input {
    kind: Kind,
    ops: Vec<Op>,
}

/// A backend with what the host does with it.
trait Backend: VirtioDevice + Persist + Sized {
    fn make() -> Self;
    /// Host input into the device; returns what the trace records.
    fn deliver(t: &mut VirtioMmioTransport<Self>, bytes: Vec<u8>, mem: &GuestMemory) -> String;
    /// What the device gave the host since the last call.
    fn take(t: &mut VirtioMmioTransport<Self>) -> Vec<u8>;
}

const NOW: VirtNanos = VirtNanos(1_000_000);

impl Backend for VirtioNet {
    fn make() -> Self {
        VirtioNet::new([0x52, 0x54, 0, 0, 0, 1])
    }
    fn deliver(t: &mut VirtioMmioTransport<Self>, bytes: Vec<u8>, mem: &GuestMemory) -> String {
        format!("{:?}", t.deliver(bytes, mem, NOW))
    }
    fn take(t: &mut VirtioMmioTransport<Self>) -> Vec<u8> {
        t.device_mut().take_transmitted().concat()
    }
}

impl Backend for VirtioConsole {
    fn make() -> Self {
        VirtioConsole::new()
    }
    fn deliver(t: &mut VirtioMmioTransport<Self>, bytes: Vec<u8>, mem: &GuestMemory) -> String {
        t.device_mut().enqueue_input(&bytes);
        t.deliver(mem, NOW);
        format!("pending {}", t.device().pending_input_len())
    }
    fn take(t: &mut VirtioMmioTransport<Self>) -> Vec<u8> {
        t.device_mut().take_output()
    }
}

impl Backend for VirtioRng {
    fn make() -> Self {
        VirtioRng::new([7; 32])
    }
    fn deliver(_: &mut VirtioMmioTransport<Self>, _: Vec<u8>, _: &GuestMemory) -> String {
        String::new()
    }
    fn take(_: &mut VirtioMmioTransport<Self>) -> Vec<u8> {
        Vec::new()
    }
}

/// Where queue `queue`'s rings are at the standard layout.
fn layout(queue: u64, size: u16) -> (u64, u64, u64) {
    split_rings(QUEUE_BASE + queue * QUEUE_STRIDE, size)
}

fn write32<D: Backend>(t: &mut VirtioMmioTransport<D>, mem: &GuestMemory, offset: u64, v: u32) {
    t.write(offset, &v.to_le_bytes(), mem, NOW);
}

fn initialize<D: Backend>(
    t: &mut VirtioMmioTransport<D>,
    mem: &GuestMemory,
    features: u64,
    size_log2: u8,
) {
    let queues: Vec<QueueSetup> = t
        .device()
        .queue_max_sizes()
        .iter()
        .enumerate()
        .map(|(queue, &max)| QueueSetup {
            size: (1u16 << (size_log2 % 16)).min(max),
            desc: QUEUE_BASE + queue as u64 * QUEUE_STRIDE,
        })
        .collect();
    for (offset, value) in init_writes(features, &queues) {
        write32(t, mem, offset, value);
    }
}

/// Each queue's (size, desc, avail, used, next_avail, next_used, ready).
fn queues<D: Backend>(t: &VirtioMmioTransport<D>) -> Vec<devices::virtio::VirtqueueState> {
    (0..t.device().queue_max_sizes().len())
        .map(|i| t.queue(i).expect("queue").save())
        .collect()
}

/// The writable bytes of the chain from `head` in `table` (a snapshot of
/// guest memory), and its writable ranges; `None` if the chain is not
/// well formed (then the device breaks instead of using it).
fn writable(memory: &[u8], desc: u64, size: u16, head: u16) -> Option<(u64, Vec<(u64, u64)>)> {
    let mut index = head;
    let mut total = 0u64;
    let mut ranges = Vec::new();
    for _ in 0..size {
        let entry = usize::try_from(desc + 16 * u64::from(index)).ok()?;
        let bytes = memory.get(entry..entry + 16)?;
        let address = u64::from_le_bytes(bytes[0..8].try_into().ok()?);
        let len = u64::from(u32::from_le_bytes(bytes[8..12].try_into().ok()?));
        let flags = u16::from_le_bytes(bytes[12..14].try_into().ok()?);
        if flags & VRING_DESC_F_WRITE != 0 {
            total += len;
            ranges.push((address, len));
        }
        if flags & VRING_DESC_F_NEXT == 0 {
            return Some((total, ranges));
        }
        index = u16::from_le_bytes(bytes[14..16].try_into().ok()?);
        if index >= size {
            return None;
        }
    }
    None
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0.saturating_add(b.1) && b.0 < a.0.saturating_add(a.1)
}

/// Invariants 2 and 3 after a step (see the top of the file).
fn check_step<D: Backend>(
    t: &VirtioMmioTransport<D>,
    mem: &GuestMemory,
    before_memory: &[u8],
    before: &[devices::virtio::VirtqueueState],
    skip_used: bool,
) {
    let broken = t.violation().is_some();
    assert_eq!(
        broken,
        t.status() & STATUS_NEEDS_RESET != 0,
        "broken {:?} with status {:#x}",
        t.violation(),
        t.status()
    );
    let after = queues(t);
    if broken {
        return;
    }
    for queue in after.iter().filter(|q| q.ready) {
        assert_eq!(
            queue.next_avail, queue.next_used,
            "a chain was kept: {queue:?}"
        );
    }
    // Where every ring is, in the step: a writable buffer over any of them
    // makes the used elements unreadable afterwards.
    let rings: Vec<(u64, u64)> = after
        .iter()
        .filter(|q| q.ready)
        .flat_map(|q| {
            let size = u64::from(q.size);
            [
                (q.desc_table, 16 * size),
                (q.avail_ring, 6 + 2 * size),
                (q.used_ring, 6 + 8 * size),
            ]
        })
        .collect();
    if skip_used {
        // Not a queue step (a register write may also reset the device,
        // rewinding the indexes over old used elements).
        return;
    }
    for (old, new) in before.iter().zip(&after) {
        let added = new.next_used.wrapping_sub(old.next_used);
        let same_queue = (old.desc_table, old.used_ring, old.size, old.ready)
            == (new.desc_table, new.used_ring, new.size, new.ready);
        if added == 0 || !same_queue || !new.ready || added > new.size {
            continue;
        }
        let mut elements = Vec::new();
        for i in 0..added {
            let slot = u64::from(old.next_used.wrapping_add(i) % new.size);
            let element = new.used_ring + 4 + 8 * slot;
            let id = mem
                .read_obj::<u32>(GuestAddress(element))
                .expect("used ring");
            let len = mem
                .read_obj::<u32>(GuestAddress(element + 4))
                .expect("used ring");
            elements.push((id, len));
        }
        // Element k may have been overwritten by a later chain's data, so
        // each is checked only if no chain's buffer covers a ring.
        let mut checks = Vec::new();
        for &(id, len) in &elements {
            let Some((capacity, ranges)) = u16::try_from(id)
                .ok()
                .filter(|&head| head < new.size)
                .and_then(|head| writable(before_memory, new.desc_table, new.size, head))
            else {
                return;
            };
            if ranges
                .iter()
                .any(|&r| rings.iter().any(|&ring| overlaps(r, ring)))
            {
                return;
            }
            checks.push((len, capacity));
        }
        for (len, capacity) in checks {
            assert!(
                u64::from(len) <= capacity,
                "used length {len} > writable {capacity}"
            );
        }
    }
}

/// Runs the steps on memory `which`; with `restore`, a SaveRestore step
/// replaces the device with a fresh one restored from its saved state.
fn run<D: Backend>(ops: &[Op], which: usize, restore: bool) -> (Vec<String>, String, Vec<u8>) {
    let guarded = &two_memories(MEMORY_SIZE)[which];
    guarded.clear();
    let mem = guarded.memory();
    let mut t = VirtioMmioTransport::new(D::make()).expect("a valid device");
    let mut trace = Vec::new();
    let mut avail_idx = [0u16; 2];
    for op in ops {
        // Only these steps run the queues and are checked (see check_step).
        let runs_queues = matches!(op, Op::Notify { .. } | Op::Deliver { .. });
        let before_memory = if runs_queues {
            guarded.contents()
        } else {
            Vec::new()
        };
        let before = queues(&t);
        let queue_size = |q: usize| before.get(q).map_or(1, |s| s.size.max(1));
        match op {
            Op::Initialize {
                features,
                size_log2,
            } => {
                initialize(&mut t, mem, *features, *size_log2);
                avail_idx = [0; 2];
            }
            Op::Write {
                register,
                width,
                value,
            } => {
                let width = [1, 2, 4, 8][usize::from(*width % 4)];
                t.write(register.offset(), &value.to_le_bytes()[..width], mem, NOW);
            }
            Op::Read { register, width } => {
                let width = [1, 2, 4, 8][usize::from(*width % 4)];
                let mut data = [0u8; 8];
                let offset = register.offset();
                t.read(offset, &mut data[..width]);
                let value = u64::from_le_bytes(data);
                if width == 4 {
                    let fixed = match offset {
                        REG_MAGIC => Some(u64::from(MMIO_MAGIC)),
                        REG_VERSION => Some(u64::from(MMIO_VERSION)),
                        REG_DEVICE_ID => Some(u64::from(t.device().device_id())),
                        _ => None,
                    };
                    if let Some(fixed) = fixed {
                        assert_eq!(value, fixed, "register {offset:#x}");
                    }
                }
                trace.push(format!("read {offset:#x}/{width} = {value:#x}"));
            }
            Op::Descriptor {
                queue,
                index,
                address,
                len,
                flags,
                next,
            } => {
                let q = usize::from(*queue % 2);
                let size = queue_size(q);
                let (desc, _, _) = layout(q as u64, size);
                let mut entry = [0u8; 16];
                entry[0..8].copy_from_slice(&address.get().to_le_bytes());
                entry[8..12].copy_from_slice(&u32::from(*len).to_le_bytes());
                entry[12..14].copy_from_slice(&(flags & 0x7).to_le_bytes());
                entry[14..16].copy_from_slice(&(next % size).to_le_bytes());
                guarded.write_clipped(desc + 16 * u64::from(index % size), &entry);
            }
            Op::Publish { queue, head } => {
                let q = usize::from(*queue % 2);
                let size = queue_size(q);
                let (_, avail, _) = layout(q as u64, size);
                let slot = u64::from(avail_idx[q] % size);
                guarded.write_clipped(avail + 4 + 2 * slot, &(head % size).to_le_bytes());
                avail_idx[q] = avail_idx[q].wrapping_add(1);
                guarded.write_clipped(avail + 2, &avail_idx[q].to_le_bytes());
            }
            Op::Store { address, bytes } => guarded.write_clipped(u64::from(*address), bytes),
            Op::Notify { queue } => write32(&mut t, mem, REG_QUEUE_NOTIFY, u32::from(*queue % 3)),
            Op::Deliver { len, fill } => {
                let bytes = vec![*fill; usize::from(*len % 2048)];
                trace.push(D::deliver(&mut t, bytes, mem));
            }
            Op::SaveRestore => {
                if restore {
                    let saved = (t.save(), t.device().save());
                    let json = serde_json::to_string(&saved).expect("state serializes");
                    let (transport, backend): (devices::virtio::VirtioMmioState, D::State) =
                        serde_json::from_str(&json).expect("state deserializes");
                    let mut fresh = VirtioMmioTransport::new(D::make()).expect("a valid device");
                    transport
                        .check_rings_in(mem)
                        .expect("the rings of a live device are in memory");
                    fresh
                        .restore(&transport)
                        .expect("a saved transport restores");
                    fresh
                        .device_mut()
                        .restore(&backend)
                        .expect("a saved backend restores");
                    assert_eq!((fresh.save(), fresh.device().save()), saved);
                    t = fresh;
                }
            }
        }
        check_step(&t, mem, &before_memory, &before, !runs_queues);
        let taken = D::take(&mut t);
        if !taken.is_empty() {
            trace.push(format!("took {:x}", fnv1a(&taken)));
        }
        trace.push(format!(
            "irq {:#x} status {:#x}",
            t.interrupt_status(),
            t.status()
        ));
    }
    let state = serde_json::to_string(&(t.save(), t.device().save())).expect("serializes");
    (trace, state, guarded.contents())
}

fn check<D: Backend>(ops: &[Op]) {
    let plain = run::<D>(ops, 0, false);
    let restored = run::<D>(ops, 1, true);
    assert_eq!(plain.0, restored.0, "the traces differ");
    assert_eq!(plain.1, restored.1, "the final states differ");
    assert!(plain.2 == restored.2, "guest memory differs");
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    match input.kind {
        Kind::Net => check::<VirtioNet>(&input.ops),
        Kind::Console => check::<VirtioConsole>(&input.ops),
        Kind::Rng => check::<VirtioRng>(&input.ops),
    }
});
