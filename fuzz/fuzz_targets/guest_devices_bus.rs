//! The whole device board as the VMM drives it: [`Devices`] with guest
//! memory (guard pages around it), the clock page, virtio rng, console and
//! two NICs on a switch. The input is the guest's exits in random order:
//! port and MMIO reads and writes of any width anywhere (mostly at the
//! devices), stores into RAM, virtio driver steps (initialization, posting
//! receive buffers, transmitting frames), interrupt acknowledgements, and
//! the host's side: time progression, console input, network faults.
//!
//! Invariants asserted:
//! 1. No panic; no access outside guest memory (guard pages).
//! 2. An MMIO access is owned exactly when it falls in the HPET or in an
//!    attached virtio window; an unowned read returns all ones and counts
//!    one unhandled access, an owned one counts none.
//! 3. Reads of unowned ports return all ones.
//! 4. Time: after every step that is an exit (every one but a store into
//!    RAM), the next device deadline (if any) is later than the board's
//!    time: nothing due is left unfired.
//! 5. Determinism: a second board fed the same steps, with a save, JSON
//!    round trip and restore into a freshly built board wherever the input
//!    asks, reads the same values, acknowledges the same vectors, reports
//!    the same guest events, prints the same console output and ends with
//!    the same saved state and guest memory.

#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use detvisor_fuzz::virtio_driver::{
    init_writes, split_rings, QueueSetup, FEATURE_VERSION_1, REG_QUEUE_NOTIFY,
};
use detvisor_fuzz::{fnv1a, two_memories, GuardedMemory};
use devices::layout;
use devices::persist::Persist;
use devices::switch::{Fault, LatencyDist, NetworkConfig};
use devices::{Devices, DevicesConfig, DevicesState, PortId, VirtNanos};
use libfuzzer_sys::fuzz_target;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Guest RAM: up to the clock page and beyond (it is at 0x9f000).
const MEMORY_SIZE: usize = 0x10_0000;
/// Per virtio slot: queues from here, `SLOT_STRIDE` apart.
const QUEUE_AREA: u64 = 0x1_0000;
const SLOT_STRIDE: u64 = 0x1_0000;
const QUEUE_STRIDE: u64 = 0x4000;
/// Data buffers of a slot, after its queues.
const DATA_OFFSET: u64 = 0x8000;
/// Slots: rng, console, net, net.
const SLOTS: usize = 4;
const NET_SLOTS: [usize; 2] = [2, 3];
const NET_HDR_LEN: usize = 12;

/// Ports the devices own, and a few around them.
const PORTS: [u16; 22] = [
    0x20, 0x21, 0xa0, 0xa1, 0x4d0, 0x4d1, 0x3f8, 0x3f9, 0x3fa, 0x3fb, 0x3fc, 0x3fd, 0x70, 0x71,
    0x60, 0x64, 0x80, 0x600, 0x604, 0x608, 0x610, 0x614,
];

/// The console writer: COM1's output, kept across a restore.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<Vec<u8>>>);

impl Write for Output {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("output lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Port {
    Known(u8),
    Any(u16),
}

impl Port {
    fn get(self) -> u16 {
        match self {
            Port::Known(i) => PORTS[usize::from(i) % PORTS.len()],
            Port::Any(port) => port,
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Mmio {
    Hpet(u16),
    Virtio { slot: u8, offset: u16 },
    Any(u64),
}

impl Mmio {
    fn get(self) -> u64 {
        match self {
            Mmio::Hpet(offset) => layout::HPET_BASE + u64::from(offset % 0x408),
            Mmio::Virtio { slot, offset } => {
                layout::VIRTIO_MMIO_BASE
                    + u64::from(slot % 6) * layout::VIRTIO_MMIO_STRIDE
                    + u64::from(offset % 0x200)
            }
            Mmio::Any(address) => address,
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
enum FaultKind {
    Partition,
    Heal,
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    PioRead {
        port: Port,
        width: u8,
    },
    PioWrite {
        port: Port,
        width: u8,
        value: u32,
    },
    MmioRead {
        address: Mmio,
        width: u8,
    },
    MmioWrite {
        address: Mmio,
        width: u8,
        value: u64,
    },
    /// Time passes by `ns << shift` nanoseconds.
    Advance {
        ns: u16,
        shift: u8,
    },
    Acknowledge,
    TakeEvent,
    SerialInput(Vec<u8>),
    VirtioConsoleInput(Vec<u8>),
    /// A store of the guest into its RAM.
    Store {
        address: u32,
        bytes: Vec<u8>,
    },
    /// Linux's virtio initialization of slot `slot`, queues at its area.
    VirtioInit {
        slot: u8,
        size_log2: u8,
    },
    /// Posts a receive buffer of `len` bytes on queue 0 of `slot` and notifies.
    PostReceive {
        slot: u8,
        len: u16,
    },
    /// A NIC transmits a frame of `len` bytes to the other NIC (or broadcast).
    Transmit {
        nic: bool,
        len: u16,
        broadcast: bool,
    },
    NetworkFault {
        after: u32,
        fault: FaultKind,
    },
    /// Save, serialize, deserialize, restore into a fresh board (second run).
    SaveRestore,
}

#[derive(Arbitrary, Debug)]
struct Input {
    rtc_epoch: u32,
    latency_us: u16,
    loss: bool,
    ops: Vec<Op>,
}

fn mac(slot: usize) -> [u8; 6] {
    [0x52, 0x54, 0, 0, 0, slot as u8]
}

fn board(input: &Input, memory: &GuardedMemory, output: &Output) -> Devices {
    let config = DevicesConfig {
        rtc_epoch_unix_secs: i64::from(input.rtc_epoch),
    };
    let mut devices = Devices::new(config, Box::new(output.clone()));
    devices.attach_clock_page(memory.memory().clone());
    devices.attach_guest_memory(memory.memory().clone());
    devices.attach_virtio_rng([3; 32]).expect("slot 0");
    devices.attach_virtio_console().expect("slot 1");
    for slot in NET_SLOTS {
        devices.attach_virtio_net(mac(slot)).expect("a NIC slot");
    }
    let latency = LatencyDist::Fixed(VirtNanos(u64::from(input.latency_us) * 1000));
    let mut network = NetworkConfig::reliable(latency);
    network.loss = if input.loss { 0.5 } else { 0.0 };
    devices.attach_switch([5; 32], network).expect("one switch");
    devices
}

/// The driver's view of one queue, at the slot's area.
#[derive(Clone, Copy, Default)]
struct DriverQueue {
    size: u16,
    avail_idx: u16,
}

/// Where `queue` of `slot` has its descriptor table.
fn queue_desc(slot: usize, queue: usize) -> u64 {
    QUEUE_AREA + slot as u64 * SLOT_STRIDE + queue as u64 * QUEUE_STRIDE
}

struct Machine<'a> {
    devices: Devices,
    memory: &'a GuardedMemory,
    output: Output,
    now: VirtNanos,
    queues: [[DriverQueue; 2]; SLOTS],
    trace: Vec<String>,
}

impl Machine<'_> {
    fn mmio_write32(&mut self, slot: usize, offset: u64, value: u32) {
        let base = layout::virtio_mmio_base(slot).expect("slot");
        self.devices
            .mmio_write(self.now, base + offset, &value.to_le_bytes());
    }

    fn virtio_init(&mut self, slot: usize, size_log2: u8) {
        let size = 1u16 << (size_log2 % 9);
        let queues: Vec<QueueSetup> = (0..if slot == 0 { 1 } else { 2 })
            .map(|queue| QueueSetup {
                size,
                desc: queue_desc(slot, queue),
            })
            .collect();
        // Clear the rings: a driver starts from zeroed memory.
        for queue in &queues {
            let (desc, _, used) = split_rings(queue.desc, size);
            self.memory.write_clipped(
                desc,
                &vec![0; (used - desc + 8 * u64::from(size) + 6) as usize],
            );
        }
        for (offset, value) in init_writes(FEATURE_VERSION_1, &queues) {
            self.mmio_write32(slot, offset, value);
        }
        for (queue, _) in queues.iter().enumerate() {
            self.queues[slot][queue] = DriverQueue { size, avail_idx: 0 };
        }
    }

    /// Makes a one-buffer chain available on `queue` of `slot` and notifies.
    fn post(&mut self, slot: usize, queue: usize, bytes: &[u8], len: u32, writable: bool) {
        let driver = self.queues[slot][queue];
        if driver.size == 0 {
            return;
        }
        let (desc, avail, _) = split_rings(queue_desc(slot, queue), driver.size);
        let index = driver.avail_idx % driver.size;
        let buffer = QUEUE_AREA
            + slot as u64 * SLOT_STRIDE
            + DATA_OFFSET
            + queue as u64 * 0x4000 / 2
            + u64::from(index % 2) * 0x1000;
        self.memory.write_clipped(buffer, bytes);
        let mut entry = [0u8; 16];
        entry[0..8].copy_from_slice(&buffer.to_le_bytes());
        entry[8..12].copy_from_slice(&len.min(0x1000).to_le_bytes());
        entry[12..14].copy_from_slice(&(if writable { 2u16 } else { 0 }).to_le_bytes());
        self.memory
            .write_clipped(desc + 16 * u64::from(index), &entry);
        self.memory
            .write_clipped(avail + 4 + 2 * u64::from(index), &index.to_le_bytes());
        let next = driver.avail_idx.wrapping_add(1);
        self.memory.write_clipped(avail + 2, &next.to_le_bytes());
        self.queues[slot][queue].avail_idx = next;
        self.mmio_write32(slot, REG_QUEUE_NOTIFY, queue as u32);
    }

    fn step(&mut self, op: &Op, input: &Input, restore: bool) {
        let width = |w: u8| [1usize, 2, 4, 8][usize::from(w % 4)];
        match op {
            Op::PioRead { port, width: w } => {
                let port = port.get();
                let mut data = [0u8; 4];
                let n = width(*w).min(4);
                self.devices.pio_read(self.now, port, &mut data[..n]);
                if (0x1000..0x2000).contains(&port) {
                    assert!(
                        data[..n].iter().all(|&b| b == 0xff),
                        "unowned port {port:#x}"
                    );
                }
                self.trace.push(format!("in {port:#x} {:?}", &data[..n]));
            }
            Op::PioWrite {
                port,
                width: w,
                value,
            } => {
                let n = width(*w).min(4);
                self.devices
                    .pio_write(self.now, port.get(), &value.to_le_bytes()[..n]);
            }
            Op::MmioRead { address, width: w } => {
                let address = address.get();
                let mut data = [0u8; 8];
                let n = width(*w);
                let unhandled = self.devices.unhandled_accesses();
                let owned = self.devices.mmio_read(self.now, address, &mut data[..n]);
                assert_eq!(owned, owns(address), "ownership of {address:#x}");
                let counted = self.devices.unhandled_accesses() - unhandled;
                assert_eq!(
                    counted,
                    u64::from(!owned),
                    "unhandled count at {address:#x}"
                );
                if !owned {
                    assert!(data[..n].iter().all(|&b| b == 0xff));
                }
                self.trace
                    .push(format!("read {address:#x} {:?}", &data[..n]));
            }
            Op::MmioWrite {
                address,
                width: w,
                value,
            } => {
                let address = address.get();
                let owned =
                    self.devices
                        .mmio_write(self.now, address, &value.to_le_bytes()[..width(*w)]);
                assert_eq!(owned, owns(address), "ownership of {address:#x}");
            }
            Op::Advance { ns, shift } => {
                self.now = self
                    .now
                    .saturating_add(VirtNanos(u64::from(*ns) << (shift % 36)));
                self.devices.advance_to(self.now);
            }
            Op::Acknowledge => {
                let vector = self.devices.acknowledge_interrupt();
                self.trace.push(format!("ack {vector:?}"));
            }
            Op::TakeEvent => {
                let event = self.devices.take_event();
                self.trace.push(format!("event {event:?}"));
            }
            Op::SerialInput(bytes) => self.devices.enqueue_console_input(bytes),
            Op::VirtioConsoleInput(bytes) => self
                .devices
                .enqueue_virtio_console_input(self.now, bytes)
                .expect("the board has a console"),
            Op::Store { address, bytes } => self
                .memory
                .write_clipped(u64::from(*address) % 0x6_0000, bytes),
            Op::VirtioInit { slot, size_log2 } => {
                self.virtio_init(usize::from(*slot) % SLOTS, *size_log2)
            }
            Op::PostReceive { slot, len } => {
                let slot = usize::from(*slot) % SLOTS;
                self.post(slot, 0, &[], u32::from(*len), true);
            }
            Op::Transmit {
                nic,
                len,
                broadcast,
            } => {
                let (from, to) = if *nic { (3, 2) } else { (2, 3) };
                let mut frame = vec![0u8; NET_HDR_LEN];
                frame.extend_from_slice(&if *broadcast { [0xff; 6] } else { mac(to) });
                frame.extend_from_slice(&mac(from));
                frame.resize(NET_HDR_LEN + usize::from(*len % 1600), 0x5a);
                let len = frame.len() as u32;
                self.post(from, 1, &frame, len, false);
            }
            Op::NetworkFault { after, fault } => {
                let at = self.now.saturating_add(VirtNanos(u64::from(*after) << 10));
                let fault = match fault {
                    FaultKind::Partition => Fault::Partition(vec![
                        vec![PortId(NET_SLOTS[0])],
                        vec![PortId(NET_SLOTS[1])],
                    ]),
                    FaultKind::Heal => Fault::Heal,
                };
                self.devices
                    .schedule_network_fault(at, fault)
                    .expect("a fault now or later");
            }
            Op::SaveRestore => {
                if restore {
                    let saved = self.devices.save();
                    let json = serde_json::to_string(&saved).expect("state serializes");
                    let state: DevicesState =
                        serde_json::from_str(&json).expect("state deserializes");
                    let mut fresh = board(input, self.memory, &self.output);
                    fresh.restore(&state).expect("a saved state restores");
                    assert_eq!(fresh.save(), saved, "restore changed the state");
                    self.devices = fresh;
                }
            }
        }
        // A store is no exit: a clock-page deadline it set in the past is
        // only seen at the next device step.
        if !matches!(op, Op::Store { .. }) {
            if let Some(deadline) = self.devices.next_deadline() {
                assert!(
                    deadline > self.now,
                    "deadline {deadline} not after {}",
                    self.now
                );
            }
        }
        let console = self.devices.take_virtio_console_output();
        if !console.is_empty() {
            self.trace.push(format!("hvc {:x}", fnv1a(&console)));
        }
        self.trace.push(format!(
            "intr {} unhandled {}",
            self.devices.has_pending_interrupt(),
            self.devices.unhandled_accesses()
        ));
    }
}

/// Whether an MMIO address is a device's.
fn owns(address: u64) -> bool {
    let hpet = (layout::HPET_BASE..layout::HPET_BASE + layout::HPET_LEN).contains(&address);
    let virtio = (0..SLOTS).any(|slot| {
        let base = layout::virtio_mmio_base(slot).expect("slot");
        (base..base + layout::VIRTIO_MMIO_STRIDE).contains(&address)
    });
    hpet || virtio
}

fn run(input: &Input, which: usize, restore: bool) -> (Vec<String>, String, Vec<u8>) {
    let memory = &two_memories(MEMORY_SIZE)[which];
    memory.clear();
    let output = Output::default();
    let mut machine = Machine {
        devices: board(input, memory, &output),
        memory,
        output: output.clone(),
        now: VirtNanos::ZERO,
        queues: [[DriverQueue::default(); 2]; SLOTS],
        trace: Vec::new(),
    };
    for op in &input.ops {
        machine.step(op, input, restore);
    }
    let serial = output.0.lock().expect("output lock").clone();
    machine.trace.push(format!("com1 {:x}", fnv1a(&serial)));
    let state = serde_json::to_string(&machine.devices.save()).expect("serializes");
    (machine.trace, state, memory.contents())
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let plain = run(&input, 0, false);
    let restored = run(&input, 1, true);
    assert_eq!(plain.0, restored.0, "the traces differ");
    assert_eq!(plain.1, restored.1, "the final states differ");
    assert!(plain.2 == restored.2, "guest memory differs");
});
