use super::virtio::{window, Window, MASTER_MASK_VIRTIO, RNG_KEY};
use super::*;
use crate::switch::{LatencyDist, NetworkConfig};
use crate::virtio::mmio::INTERRUPT_USED_BUFFER;
use crate::virtio::net::{NET_HDR_LEN, RECEIVEQ, TRANSMITQ};
use crate::virtio::testing::{
    self as virtio_testing, initialize, read_bytes, readable, writable, write_bytes, DriverQueue,
    Registers, DATA_BASE, QUEUE0_BASE, REG_INTERRUPT_ACK, REG_INTERRUPT_STATUS, REG_QUEUE_NOTIFY,
};

const SWITCH_KEY: [u8; 32] = [0x5e; 32];
const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xb];
const LATENCY: u64 = 100_000;
const RX_BUFFER_LEN: u32 = 1526;

/// A NIC's queues and buffers in the test memory.
struct Nic {
    base: u64,
    receiveq: DriverQueue,
    transmitq: DriverQueue,
    tx_buffer: u64,
    rx_buffer: u64,
}

/// Two NICs (A in slot 0 on IRQ5, B in slot 1 on IRQ6), initialized,
/// joined by a switch with a fixed latency unless `switch` is false.
struct NetMachine {
    devices: Devices,
    mem: GuestMemory,
    nics: [Nic; 2],
}

fn nic(index: u64) -> Nic {
    let queues = QUEUE0_BASE + index * 0x2000;
    Nic {
        base: layout::VIRTIO_MMIO_BASE + index * layout::VIRTIO_MMIO_STRIDE,
        receiveq: DriverQueue::new(queues, 16),
        transmitq: DriverQueue::new(queues + 0x1000, 16),
        tx_buffer: DATA_BASE + index * 0x4000,
        rx_buffer: DATA_BASE + index * 0x4000 + 0x2000,
    }
}

fn net_machine(switch: bool) -> NetMachine {
    let (mut devices, _output) = new_devices();
    let mem = virtio_testing::test_memory();
    devices.attach_guest_memory(mem.clone());
    devices.attach_virtio_net(MAC_A).unwrap();
    if switch {
        devices
            .attach_switch(
                SWITCH_KEY,
                NetworkConfig::reliable(LatencyDist::Fixed(VirtNanos(LATENCY))),
            )
            .unwrap();
    }
    // Joins the switch on attach.
    devices.attach_virtio_net(MAC_B).unwrap();
    init_pic(&mut devices, MASTER_MASK_VIRTIO, 0xff);
    let nics = [nic(0), nic(1)];
    for nic in &nics {
        initialize(
            &mut window(&mut devices, nic.base),
            &[&nic.receiveq, &nic.transmitq],
        );
    }
    NetMachine { devices, mem, nics }
}

fn ethernet_frame(to: [u8; 6], from: [u8; 6], payload: &[u8]) -> Vec<u8> {
    [&to[..], &from[..], &[0x88, 0xb5], payload].concat()
}

impl NetMachine {
    fn window(&mut self, nic: usize, now: u64) -> Window<'_> {
        Window {
            devices: &mut self.devices,
            base: self.nics[nic].base,
            now,
        }
    }

    /// NIC `nic` transmits `frame` at `now`; its transmit interrupt is
    /// acknowledged (PIC and device) right after.
    fn send(&mut self, nic: usize, now: u64, frame: &[u8]) {
        let buffer = self.nics[nic].tx_buffer;
        write_bytes(&self.mem, buffer, &[0; NET_HDR_LEN]);
        write_bytes(&self.mem, buffer + NET_HDR_LEN as u64, frame);
        let len = (NET_HDR_LEN + frame.len()) as u32;
        self.nics[nic]
            .transmitq
            .add_chain(&self.mem, &[readable(buffer, len)]);
        self.window(nic, now)
            .write32(REG_QUEUE_NOTIFY, TRANSMITQ as u32);
        self.devices.acknowledge_interrupt();
        outb(&mut self.devices, now, 0x20, 0x20); // EOI
        self.window(nic, now)
            .write32(REG_INTERRUPT_ACK, INTERRUPT_USED_BUFFER);
    }

    fn post_receive_buffer(&mut self, nic: usize, now: u64) {
        let buffer = self.nics[nic].rx_buffer;
        self.nics[nic]
            .receiveq
            .add_chain(&self.mem, &[writable(buffer, RX_BUFFER_LEN)]);
        self.window(nic, now)
            .write32(REG_QUEUE_NOTIFY, RECEIVEQ as u32);
    }

    /// The frames NIC `nic` received since the last call.
    fn received(&mut self, nic: usize) -> Vec<Vec<u8>> {
        let buffer = self.nics[nic].rx_buffer;
        self.nics[nic]
            .receiveq
            .take_used(&self.mem)
            .into_iter()
            .map(|(_, len)| read_bytes(&self.mem, buffer, len as usize)[NET_HDR_LEN..].to_vec())
            .collect()
    }
}

#[test]
fn test_devices_frame_from_nic_a_reaches_nic_b_after_the_latency() {
    // Arrange
    let mut machine = net_machine(true);
    machine.post_receive_buffer(1, 1_000);
    let frame = ethernet_frame(MAC_B, MAC_A, b"hello from node a");
    let sent_at = 5_000;

    // Act
    machine.send(0, sent_at, &frame);
    let deadline = machine.devices.next_deadline();
    machine.devices.advance_to(VirtNanos(sent_at + LATENCY - 1));
    let early = (machine.received(1), machine.devices.has_pending_interrupt());
    machine.devices.advance_to(VirtNanos(sent_at + LATENCY));
    let vector = machine.devices.acknowledge_interrupt();

    // Assert
    assert_eq!(deadline, Some(VirtNanos(sent_at + LATENCY)));
    assert_eq!(early, (Vec::new(), false));
    assert_eq!(vector, Some(MASTER_VECTOR_BASE + 6));
    assert_eq!(machine.received(1), [frame]);
    assert_eq!(machine.devices.next_deadline(), None);
    let switch = machine.devices.switch().unwrap();
    assert_eq!(switch.counters(PortId(0)).unwrap().sent, 1);
    assert_eq!(switch.counters(PortId(1)).unwrap().delivered, 1);
    let counters = machine.devices.virtio_net_counters(1).unwrap();
    assert_eq!(counters.rx_frames, 1);
    assert_eq!(machine.devices.virtio_net_counters(0).unwrap().tx_frames, 1);
}

#[test]
fn test_devices_frame_due_is_delivered_before_a_later_access_is_served() {
    // Arrange
    let mut machine = net_machine(true);
    machine.post_receive_buffer(0, 1_000);
    machine.send(1, 2_000, &ethernet_frame(MAC_A, MAC_B, b"reply"));

    // Act: any access after the delivery time, without advance_to.
    let status = machine
        .window(0, 2_000 + LATENCY + 7)
        .read32(REG_INTERRUPT_STATUS);

    // Assert
    assert_eq!(status, INTERRUPT_USED_BUFFER);
    assert_eq!(machine.received(0).len(), 1);
}

#[test]
fn test_devices_several_nics_and_switch_in_any_attach_order() {
    // Arrange
    let (mut devices, _output) = new_devices();
    devices.attach_guest_memory(virtio_testing::test_memory());
    devices.attach_virtio_rng(RNG_KEY).unwrap();
    let first = devices.attach_virtio_net(MAC_A).unwrap();

    // Act
    devices
        .attach_switch(
            SWITCH_KEY,
            NetworkConfig::reliable(LatencyDist::Fixed(VirtNanos(1))),
        )
        .unwrap();
    let second = devices.attach_virtio_net(MAC_B).unwrap();
    let more: Vec<VirtioSlot> = (0..8)
        .map(|i| devices.attach_virtio_net([0x52, 0x54, 0, 0, 1, i]).unwrap())
        .collect();
    let again = devices.attach_switch(
        SWITCH_KEY,
        NetworkConfig::reliable(LatencyDist::Fixed(VirtNanos(1))),
    );

    // Assert
    assert_eq!((first.index, first.irq), (1, 6));
    assert_eq!((second.index, second.irq), (2, 7));
    assert_eq!(more.last().unwrap().irq, 13);
    assert_eq!(
        devices.attach_virtio_net([0x52, 0x54, 0, 0, 2, 0]),
        Err(DevicesError::VirtioSlotsExhausted { max: 11 })
    );
    assert_eq!(again, Err(SwitchError::AlreadyAttached));
    let ports = devices.switch().unwrap().ports();
    assert_eq!(ports.len(), 10);
    assert_eq!(ports[0], (PortId(1), MAC_A));
    assert_eq!(ports[1], (second.port(), MAC_B));
}

#[test]
fn test_devices_without_a_switch_frames_go_nowhere() {
    // Arrange
    let mut machine = net_machine(false);
    machine.post_receive_buffer(1, 1_000);

    // Act
    machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"into the void"));
    machine.devices.advance_to(VirtNanos::from_secs(1));

    // Assert
    assert_eq!(machine.devices.next_deadline(), None);
    assert!(machine.received(1).is_empty());
    assert_eq!(machine.devices.virtio_net_counters(0).unwrap().tx_frames, 1);
    assert!(machine.devices.save().virtio[0].transport.queues[1].ready);
    assert_eq!(
        machine
            .devices
            .schedule_network_fault(VirtNanos(0), Fault::Heal),
        Err(SwitchError::NotAttached)
    );
}

/// (time, from, to, dropped) of frame events.
type Kept = std::sync::Arc<std::sync::Mutex<Vec<(u64, usize, usize, bool)>>>;

/// A tap keeping every frame event.
struct KeepEvents(Kept);

impl FrameTap for KeepEvents {
    fn frame(&mut self, event: &crate::switch::FrameEvent) {
        self.0.lock().unwrap().push((
            event.at.0,
            event.from.0,
            event.to.0,
            event.dropped.is_some(),
        ));
    }
}

#[test]
fn test_devices_frame_tap_sees_deliveries_and_drops_in_time_order_and_changes_nothing() {
    // Arrange: A -> B blocked one way from 50 us.
    let run = |tap: bool| {
        let mut machine = net_machine(true);
        let events = Kept::default();
        if tap {
            let keep = KeepEvents(std::sync::Arc::clone(&events));
            machine.devices.set_frame_tap(Some(Box::new(keep))).unwrap();
        }
        machine.post_receive_buffer(1, 1_000);
        machine
            .devices
            .schedule_network_fault(
                VirtNanos(50_000),
                Fault::Block(crate::switch::Links {
                    from: vec![PortId(0)],
                    to: vec![PortId(1)],
                    both_ways: false,
                }),
            )
            .unwrap();

        // Act
        machine.post_receive_buffer(0, 1_000);
        machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"cut in flight"));
        machine.send(1, 10_000, &ethernet_frame(MAC_A, MAC_B, b"the other way"));
        machine.devices.advance_to(VirtNanos(30_000));
        machine.send(0, 60_000, &ethernet_frame(MAC_B, MAC_A, b"cut at send"));
        machine.devices.advance_to(VirtNanos::from_secs(1));
        let kept = events.lock().unwrap().clone();
        (machine.devices.save(), kept)
    };
    let (quiet, none) = run(false);
    let (tapped, events) = run(true);

    // Assert
    assert_eq!(quiet, tapped);
    assert!(none.is_empty());
    assert_eq!(
        events,
        [
            (50_000, 0, 1, true),
            (60_000, 0, 1, true),
            (10_000 + LATENCY, 1, 0, false)
        ]
    );
}

#[test]
fn test_devices_scheduled_partition_cuts_the_frame_in_flight() {
    // Arrange
    let mut machine = net_machine(true);
    machine.post_receive_buffer(1, 1_000);
    machine
        .devices
        .schedule_network_fault(
            VirtNanos(50_000),
            Fault::Partition(vec![vec![PortId(0)], vec![PortId(1)]]),
        )
        .unwrap();
    machine
        .devices
        .schedule_network_fault(VirtNanos(60_000), Fault::Heal)
        .unwrap();

    // Act
    machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"cut"));
    let deadline = machine.devices.next_deadline();
    machine.devices.advance_to(VirtNanos::from_secs(1));

    // Assert
    assert_eq!(deadline, None);
    assert!(machine.received(1).is_empty());
    let switch = machine.devices.switch().unwrap();
    assert_eq!(switch.counters(PortId(0)).unwrap().dropped_partition, 1);
    assert_eq!(switch.blocked_links(), []);
}

#[test]
fn test_devices_state_round_trip_with_frames_in_flight() {
    // Arrange
    let mut machine = net_machine(true);
    machine.post_receive_buffer(1, 1_000);
    machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"in flight"));
    let saved = machine.devices.save();
    let json = serde_json::to_string(&saved).unwrap();
    let receiveq = machine.nics[1].receiveq.clone();
    let memory_at_save = read_bytes(&machine.mem, 0, virtio_testing::MEMORY_SIZE as usize);
    machine.devices.advance_to(VirtNanos(2_000 + LATENCY));
    let first_run = (machine.received(1), machine.devices.save());

    // Act
    machine
        .devices
        .restore(&serde_json::from_str(&json).unwrap())
        .unwrap();
    let restored_state = machine.devices.save();
    write_bytes(&machine.mem, 0, &memory_at_save);
    machine.nics[1].receiveq = receiveq;
    let deadline = machine.devices.next_deadline();
    machine.devices.advance_to(VirtNanos(2_000 + LATENCY));
    let second_run = (machine.received(1), machine.devices.save());

    // Assert
    assert_eq!(restored_state, saved);
    assert_eq!(saved.switch.as_ref().unwrap().in_flight.len(), 1);
    assert_eq!(deadline, Some(VirtNanos(2_000 + LATENCY)));
    assert_eq!(second_run, first_run);
    assert_eq!(first_run.0.len(), 1);
}

#[test]
fn test_devices_restore_of_switch_not_matching_the_nics_changes_nothing() {
    // Arrange
    let mut machine = net_machine(true);
    machine.send(0, 2_000, &ethernet_frame(MAC_B, MAC_A, b"x"));
    let before = machine.devices.save();
    let mut other_mac = before.clone();
    other_mac
        .switch
        .as_mut()
        .unwrap()
        .ports
        .get_mut(&PortId(1))
        .unwrap()
        .mac = MAC_A;
    let mut missing_port = before.clone();
    missing_port
        .switch
        .as_mut()
        .unwrap()
        .ports
        .remove(&PortId(0));
    let mut frame_to_nowhere = before.clone();
    for frame in frame_to_nowhere
        .switch
        .as_mut()
        .unwrap()
        .in_flight
        .values_mut()
    {
        frame.to = PortId(5);
    }

    // Act
    let results = [
        machine.devices.restore(&other_mac),
        machine.devices.restore(&missing_port),
        machine.devices.restore(&frame_to_nowhere),
    ];

    // Assert
    assert_eq!(
        results,
        [
            Err(RestoreError::SwitchPortMismatch { port: 1 }),
            Err(RestoreError::SwitchPortMismatch { port: 0 }),
            Err(RestoreError::SwitchUnknownPort { port: 5 }),
        ]
    );
    assert_eq!(machine.devices.save(), before);
}

#[test]
fn test_devices_state_without_switch_restores_and_detaches_it() {
    // Arrange
    let mut machine = net_machine(true);
    let mut json: serde_json::Value = serde_json::to_value(machine.devices.save()).unwrap();
    json.as_object_mut().unwrap().remove("switch");

    // Act
    let state: DevicesState = serde_json::from_value(json).unwrap();
    let result = machine.devices.restore(&state);

    // Assert
    assert_eq!(result, Ok(()));
    assert!(machine.devices.switch().is_none());
}

/// Two NICs on the switch, frames in flight.
fn used_net_devices() -> Devices {
    let mut machine = net_machine(true);
    machine.send(0, 1_000, &ethernet_frame(MAC_B, MAC_A, b"ping"));
    machine.devices
}

crate::persist::persist_round_trip_tests! {
    mod net_devices_persist {
        fresh: net_machine(true).devices,
        saved: used_net_devices(),
        mutate: |devices: &mut Devices| {
            devices.advance_to(VirtNanos::from_secs(1));
        },
    }
}
