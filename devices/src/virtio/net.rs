//! virtio-net (device ID 1, spec 5.1): one NIC of the simulated network.
//! Its frames go to the VMM's switch ([`crate::switch`]), never to a host
//! interface.
//!
//! Modern only, and deliberately plain: the device offers VIRTIO_NET_F_MAC
//! (the address is in configuration space) and, through the transport,
//! VIRTIO_F_VERSION_1 and VIRTIO_RING_F_EVENT_IDX; no checksum or segmentation offloads, no mergeable
//! receive buffers, no control queue, no link status. Every buffer starts
//! with the 12-byte `virtio_net_hdr_v1` (VERSION_1 makes it include
//! `num_buffers`).
//!
//! * transmitq (queue 1): each chain is one frame: the header, then the
//!   Ethernet frame. The header must ask for no offload (flags 0, gso_type
//!   NONE, spec 5.1.6.2.1); a header asking for one, or a chain shorter than
//!   the header, is a driver violation that breaks the device.
//!   `num_buffers` is not checked: Linux leaves it unset on transmit unless
//!   mergeable buffers were negotiated. A frame (header stripped) shorter
//!   than an Ethernet header ([`MIN_FRAME_LEN`]) or longer than
//!   [`MAX_FRAME_LEN`] is dropped and counted, not a violation: it is the
//!   payload that is wrong, not the ring, and a real NIC counts runts and
//!   giants too. Accepted frames go to an outbox the VMM drains with
//!   [`VirtioNet::take_transmitted`]; beyond [`OUTBOX_LIMIT`] undrained
//!   frames, more are dropped and counted. Transmit buffers are always
//!   returned at once.
//! * receiveq (queue 0): [`VirtioMmioTransport::<VirtioNet>::deliver`]
//!   writes the header (all zero but `num_buffers` = 1) and the frame into
//!   the next buffer the driver posted, and raises the used-buffer
//!   interrupt. Frames are never held back: with no buffer posted, or the
//!   driver not ready, the frame is dropped and counted, as a NIC whose
//!   receive ring is empty drops it. A posted buffer too small for header
//!   and frame is returned empty (length 0, which Linux counts as a length
//!   error and reposts) and the frame is dropped and counted.
//!
//! A device reset keeps the address, the outbox and the counters: they
//! belong to the machine, not to the driver.

use super::mmio::VirtioMmioTransport;
use super::{QueueFault, VirtioDevice, Virtqueue};
use crate::persist::{Persist, RestoreError};
use crate::time::VirtNanos;
use crate::GuestMemory;
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MAC, VIRTIO_NET_HDR_GSO_NONE};

pub const RECEIVEQ: usize = 0;
pub const TRANSMITQ: usize = 1;
pub const NET_QUEUE_SIZE: u16 = 256;
/// sizeof(struct virtio_net_hdr_v1).
pub const NET_HDR_LEN: usize = 12;
/// The shortest frame accepted: an Ethernet header.
pub const MIN_FRAME_LEN: usize = 14;
/// The longest frame accepted: 65535 bytes of IP plus an Ethernet header
/// with a VLAN tag (the spec's 65562-byte buffer less the header).
pub const MAX_FRAME_LEN: usize = 65550;
/// Undrained transmitted frames the device keeps; more are dropped.
pub const OUTBOX_LIMIT: usize = 1024;
/// The device-specific features offered.
pub const NET_FEATURES: u64 = 1 << VIRTIO_NET_F_MAC;

const QUEUE_MAX_SIZES: [u16; 2] = [NET_QUEUE_SIZE, NET_QUEUE_SIZE];
/// Offsets of num_buffers in the header, and of flags and gso_type.
const HDR_FLAGS: usize = 0;
const HDR_GSO_TYPE: usize = 1;
const HDR_NUM_BUFFERS: usize = 10;

/// What happened to a frame handed to the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RxOutcome {
    Delivered,
    /// The driver is not running, the receive queue is not ready, or the
    /// device is (or just became) broken.
    DroppedNotReady,
    /// The driver had posted no receive buffer.
    DroppedNoBuffer,
    /// The next receive buffer was too small; it was returned empty.
    DroppedBufferTooSmall,
    /// The frame is shorter than [`MIN_FRAME_LEN`] or longer than [`MAX_FRAME_LEN`].
    DroppedBadLength,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioNetCounters {
    /// Frames accepted from the guest, and their bytes (header excluded).
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Transmitted frames dropped for their length.
    pub tx_dropped_bad_length: u64,
    /// Transmitted frames dropped because the outbox was full.
    pub tx_dropped_outbox_full: u64,
    /// Frames written into the guest's buffers, and their bytes.
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub rx_dropped_not_ready: u64,
    pub rx_dropped_no_buffer: u64,
    pub rx_dropped_buffer_too_small: u64,
    pub rx_dropped_bad_length: u64,
}

/// Saved state of the NIC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VirtioNetState {
    pub mac: [u8; 6],
    /// Transmitted frames the VMM has not taken yet.
    pub outbox: Vec<Vec<u8>>,
    pub counters: VirtioNetCounters,
}

#[derive(Clone, Debug)]
pub struct VirtioNet {
    mac: [u8; 6],
    outbox: Vec<Vec<u8>>,
    counters: VirtioNetCounters,
    /// The frame being delivered, only during a `deliver` call.
    rx_frame: Option<Vec<u8>>,
    /// What became of it.
    rx_outcome: Option<RxOutcome>,
}

impl VirtioNet {
    pub fn new(mac: [u8; 6]) -> Self {
        VirtioNet {
            mac,
            outbox: Vec::new(),
            counters: VirtioNetCounters::default(),
            rx_frame: None,
            rx_outcome: None,
        }
    }

    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    pub fn counters(&self) -> VirtioNetCounters {
        self.counters
    }

    /// Every frame the guest transmitted since the last call, in order,
    /// without the virtio-net header.
    pub fn take_transmitted(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.outbox)
    }

    fn transmit(&mut self, queue: &mut Virtqueue, mem: &GuestMemory) -> Result<(), QueueFault> {
        while let Some(chain) = queue.pop(mem)? {
            chain.require_device_readable()?;
            let head = chain.head_index();
            let len = chain.readable_len();
            let frame_len = (len as usize)
                .checked_sub(NET_HDR_LEN)
                .ok_or(QueueFault::NetHeaderTooShort { head, len })?;
            let length_ok = (MIN_FRAME_LEN..=MAX_FRAME_LEN).contains(&frame_len);
            // A frame that will be dropped is not read beyond its header.
            let read = if length_ok { len as usize } else { NET_HDR_LEN };
            let mut bytes = chain.read_readable(mem, read)?;
            let (flags, gso_type) = (bytes[HDR_FLAGS], bytes[HDR_GSO_TYPE]);
            if flags != 0 || u32::from(gso_type) != VIRTIO_NET_HDR_GSO_NONE {
                return Err(QueueFault::NetHeaderOffload {
                    head,
                    flags,
                    gso_type,
                });
            }
            if !length_ok {
                self.counters.tx_dropped_bad_length += 1;
            } else if self.outbox.len() >= OUTBOX_LIMIT {
                self.counters.tx_dropped_outbox_full += 1;
            } else {
                bytes.drain(..NET_HDR_LEN);
                self.counters.tx_frames += 1;
                self.counters.tx_bytes += frame_len as u64;
                self.outbox.push(bytes);
            }
            // The device wrote nothing into a transmit buffer.
            queue.add_used(mem, head, 0)?;
        }
        Ok(())
    }

    /// Writes the frame being delivered (if any) into the next receive buffer.
    fn receive(&mut self, queue: &mut Virtqueue, mem: &GuestMemory) -> Result<(), QueueFault> {
        let Some(frame) = self.rx_frame.take() else {
            return Ok(());
        };
        // Until it is written, a fault loses the frame with the device.
        self.rx_outcome = Some(RxOutcome::DroppedNotReady);
        let Some(chain) = queue.pop(mem)? else {
            self.rx_outcome = Some(RxOutcome::DroppedNoBuffer);
            return Ok(());
        };
        chain.require_device_writable()?;
        let needed = NET_HDR_LEN + frame.len();
        if (chain.writable_len() as usize) < needed {
            self.rx_outcome = Some(RxOutcome::DroppedBufferTooSmall);
            return queue.add_used(mem, chain.head_index(), 0);
        }
        let mut bytes = vec![0u8; NET_HDR_LEN];
        bytes[HDR_NUM_BUFFERS..NET_HDR_LEN].copy_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&frame);
        let written = chain.write_writable(mem, &bytes)?;
        queue.add_used(mem, chain.head_index(), written)?;
        self.rx_outcome = Some(RxOutcome::Delivered);
        Ok(())
    }

    fn count_rx(&mut self, outcome: RxOutcome, frame_len: usize) {
        let counters = &mut self.counters;
        let counter = match outcome {
            RxOutcome::Delivered => {
                counters.rx_bytes += frame_len as u64;
                &mut counters.rx_frames
            }
            RxOutcome::DroppedNotReady => &mut counters.rx_dropped_not_ready,
            RxOutcome::DroppedNoBuffer => &mut counters.rx_dropped_no_buffer,
            RxOutcome::DroppedBufferTooSmall => &mut counters.rx_dropped_buffer_too_small,
            RxOutcome::DroppedBadLength => &mut counters.rx_dropped_bad_length,
        };
        *counter += 1;
    }
}

impl Persist for VirtioNet {
    type State = VirtioNetState;

    fn save(&self) -> VirtioNetState {
        VirtioNetState {
            mac: self.mac,
            outbox: self.outbox.clone(),
            counters: self.counters,
        }
    }

    fn restore(&mut self, state: &VirtioNetState) -> Result<(), RestoreError> {
        self.mac = state.mac;
        self.outbox = state.outbox.clone();
        self.counters = state.counters;
        self.rx_frame = None;
        self.rx_outcome = None;
        Ok(())
    }
}

impl VirtioDevice for VirtioNet {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn device_features(&self) -> u64 {
        NET_FEATURES
    }

    fn queue_max_sizes(&self) -> &'static [u16] {
        &QUEUE_MAX_SIZES
    }

    /// struct virtio_net_config: `mac` at 0..6; the fields after it exist
    /// only with features never offered and read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = offset
                .checked_add(i as u64)
                .and_then(|at| usize::try_from(at).ok())
                .and_then(|at| self.mac.get(at).copied())
                .unwrap_or(0);
        }
    }

    fn process_queue(
        &mut self,
        queue_index: usize,
        queue: &mut Virtqueue,
        mem: &GuestMemory,
        _now: VirtNanos,
    ) -> Result<(), QueueFault> {
        match queue_index {
            RECEIVEQ => self.receive(queue, mem),
            TRANSMITQ => self.transmit(queue, mem),
            _ => Ok(()),
        }
    }
}

impl VirtioMmioTransport<VirtioNet> {
    /// Hands `frame` (an Ethernet frame, no virtio header) to the NIC at
    /// `now`: it is written into the next receive buffer the guest posted,
    /// raising the used-buffer interrupt, or dropped and counted (see the
    /// module documentation). Call only at deterministic points.
    pub fn deliver(&mut self, frame: Vec<u8>, mem: &GuestMemory, now: VirtNanos) -> RxOutcome {
        let frame_len = frame.len();
        let outcome = if (MIN_FRAME_LEN..=MAX_FRAME_LEN).contains(&frame_len) {
            let device = self.device_mut();
            device.rx_frame = Some(frame);
            device.rx_outcome = None;
            self.process_queue(RECEIVEQ, mem, now);
            let device = self.device_mut();
            // Not taken: the transport did not run the queue.
            device.rx_frame = None;
            device
                .rx_outcome
                .take()
                .unwrap_or(RxOutcome::DroppedNotReady)
        } else {
            RxOutcome::DroppedBadLength
        };
        self.device_mut().count_rx(outcome, frame_len);
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::mmio::{
        INTERRUPT_USED_BUFFER, STATUS_ACKNOWLEDGE, STATUS_DRIVER, STATUS_NEEDS_RESET,
    };
    use crate::virtio::testing::*;
    use crate::virtio::VirtioViolation;

    const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
    const PEER: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x57];

    struct LiveNet {
        device: DirectTransport<VirtioNet>,
        receiveq: DriverQueue,
        transmitq: DriverQueue,
    }

    /// Linux's sequence, accepting VIRTIO_NET_F_MAC and VERSION_1.
    fn live_net() -> LiveNet {
        let mut device = DirectTransport::new(VirtioNet::new(MAC));
        let receiveq = DriverQueue::new(QUEUE0_BASE, 16);
        let transmitq = DriverQueue::new(QUEUE1_BASE, 16);
        device.write32(REG_STATUS, 0);
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE);
        device.write32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        device.write32(REG_DRIVER_FEATURES_SEL, 1);
        device.write32(REG_DRIVER_FEATURES, 1); // VERSION_1
        device.write32(REG_DRIVER_FEATURES_SEL, 0);
        device.write32(REG_DRIVER_FEATURES, NET_FEATURES as u32);
        device.write32(REG_STATUS, STATUS_UP_TO_FEATURES_OK);
        setup_queue(&mut device, 0, &receiveq);
        setup_queue(&mut device, 1, &transmitq);
        device.write32(REG_STATUS, STATUS_LIVE);
        LiveNet {
            device,
            receiveq,
            transmitq,
        }
    }

    fn frame(destination: [u8; 6], payload: &[u8]) -> Vec<u8> {
        let mut frame = destination.to_vec();
        frame.extend_from_slice(&MAC);
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(payload);
        frame
    }

    fn header(flags: u8, gso_type: u8) -> [u8; NET_HDR_LEN] {
        let mut header = [0u8; NET_HDR_LEN];
        header[0] = flags;
        header[1] = gso_type;
        // Left over by Linux on transmit: must be ignored.
        header[10] = 0xaa;
        header
    }

    impl LiveNet {
        /// Transmits header and frame split over two readable buffers.
        fn transmit(&mut self, header: &[u8], frame: &[u8]) -> u16 {
            write_bytes(&self.device.mem, DATA_BASE, header);
            write_bytes(&self.device.mem, DATA_BASE + 0x100, frame);
            let head = self.transmitq.add_chain(
                &self.device.mem,
                &[
                    readable(DATA_BASE, header.len() as u32),
                    readable(DATA_BASE + 0x100, frame.len() as u32),
                ],
            );
            self.device.write32(REG_QUEUE_NOTIFY, TRANSMITQ as u32);
            head
        }

        fn post(&mut self, buffers: &[Buffer]) -> u16 {
            let head = self.receiveq.add_chain(&self.device.mem, buffers);
            self.device.write32(REG_QUEUE_NOTIFY, RECEIVEQ as u32);
            head
        }

        fn deliver(&mut self, frame: Vec<u8>) -> RxOutcome {
            let mem = self.device.mem.clone();
            self.device.transport.deliver(frame, &mem, VirtNanos(5_000))
        }

        fn counters(&self) -> VirtioNetCounters {
            self.device.transport.device().counters()
        }
    }

    #[test]
    fn test_net_identifies_with_mac_feature_and_two_queues() {
        // Arrange
        let mut device = DirectTransport::new(VirtioNet::new(MAC));

        // Act
        let device_id = device.read32(REG_DEVICE_ID);
        let features: Vec<u32> = (0..2)
            .map(|select| {
                device.write32(REG_DEVICE_FEATURES_SEL, select);
                device.read32(REG_DEVICE_FEATURES)
            })
            .collect();
        let sizes: Vec<u32> = (0..3)
            .map(|queue| {
                device.write32(REG_QUEUE_SEL, queue);
                device.read32(REG_QUEUE_NUM_MAX)
            })
            .collect();

        // Assert
        assert_eq!(device_id, 1);
        assert_eq!(features, [(1 << 5) | (1 << 29), 1]);
        assert_eq!(sizes, [256, 256, 0]);
    }

    #[test]
    fn test_net_config_space_holds_the_mac_at_any_width() {
        // Arrange
        let mut device = DirectTransport::new(VirtioNet::new(MAC));
        let mut whole = [0xffu8; 8];
        let mut one = [0u8; 1];

        // Act
        device.transport.read(REG_CONFIG, &mut whole);
        device.transport.read(REG_CONFIG + 5, &mut one);
        device
            .transport
            .write(REG_CONFIG, &[0; 6], &device.mem, device.now);
        let mut after_write = [0u8; 6];
        device.transport.read(REG_CONFIG, &mut after_write);
        let mut far = [0xffu8; 4];
        device.transport.read(u64::MAX - 1, &mut far);

        // Assert
        assert_eq!(whole[..6], MAC);
        assert_eq!(whole[6..], [0, 0]);
        assert_eq!(one, [0x56]);
        assert_eq!(after_write, MAC);
        assert_eq!(far, [0; 4]);
    }

    #[test]
    fn test_net_features_are_accepted_by_the_driver() {
        // Arrange / Act
        let net = live_net();

        // Assert
        assert_eq!(net.device.transport.status(), STATUS_LIVE);
        assert_eq!(
            net.device.transport.driver_features(),
            NET_FEATURES | (1 << 32)
        );
    }

    #[test]
    fn test_net_transmit_strips_the_header_end_to_end() {
        // Arrange
        let mut net = live_net();
        let sent = frame(PEER, b"hello, peer");

        // Act
        let head = net.transmit(&header(0, 0), &sent);

        // Assert
        assert_eq!(
            net.device.transport.device_mut().take_transmitted(),
            std::slice::from_ref(&sent)
        );
        assert_eq!(
            net.transmitq.take_used(&net.device.mem),
            [(u32::from(head), 0)]
        );
        assert_eq!(
            net.device.read32(REG_INTERRUPT_STATUS),
            INTERRUPT_USED_BUFFER
        );
        assert_eq!(net.counters().tx_frames, 1);
        assert_eq!(net.counters().tx_bytes, sent.len() as u64);
        assert!(net
            .device
            .transport
            .device_mut()
            .take_transmitted()
            .is_empty());
    }

    #[test]
    fn test_net_transmit_frames_of_bad_length_are_dropped_and_counted() {
        // Arrange
        let mut net = live_net();
        let runt = vec![0u8; MIN_FRAME_LEN - 1];
        let giant = vec![0u8; MAX_FRAME_LEN + 1];
        let smallest = vec![0u8; MIN_FRAME_LEN];
        let largest = vec![0u8; MAX_FRAME_LEN];

        // Act
        for frame in [&runt, &giant, &smallest, &largest] {
            net.transmit(&header(0, 0), frame);
        }

        // Assert
        let sent = net.device.transport.device_mut().take_transmitted();
        assert_eq!(sent, [smallest, largest]);
        assert_eq!(net.counters().tx_dropped_bad_length, 2);
        assert_eq!(net.transmitq.take_used(&net.device.mem).len(), 4);
        assert_eq!(net.device.transport.violation(), None);
    }

    #[test]
    fn test_net_transmit_header_asking_for_offload_breaks_device() {
        // Arrange
        let mut net = live_net();

        // Act
        net.transmit(&header(1, 0), &frame(PEER, b"csum")); // NEEDS_CSUM

        // Assert
        assert_eq!(
            net.device.transport.violation(),
            Some(VirtioViolation::Queue {
                queue: TRANSMITQ as u16,
                fault: QueueFault::NetHeaderOffload {
                    head: 0,
                    flags: 1,
                    gso_type: 0
                },
            })
        );
        assert_ne!(net.device.read32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
        assert!(net
            .device
            .transport
            .device_mut()
            .take_transmitted()
            .is_empty());
    }

    #[test]
    fn test_net_transmit_gso_header_breaks_device() {
        // Arrange
        let mut net = live_net();

        // Act
        net.transmit(&header(0, 1), &frame(PEER, b"tso")); // GSO_TCPV4

        // Assert
        assert!(matches!(
            net.device.transport.violation(),
            Some(VirtioViolation::Queue {
                fault: QueueFault::NetHeaderOffload { gso_type: 1, .. },
                ..
            })
        ));
    }

    #[test]
    fn test_net_transmit_chain_shorter_than_header_breaks_device() {
        // Arrange
        let mut net = live_net();
        net.transmitq
            .add_chain(&net.device.mem, &[readable(DATA_BASE, 11)]);

        // Act
        net.device.write32(REG_QUEUE_NOTIFY, TRANSMITQ as u32);

        // Assert
        assert_eq!(
            net.device.transport.violation(),
            Some(VirtioViolation::Queue {
                queue: TRANSMITQ as u16,
                fault: QueueFault::NetHeaderTooShort { head: 0, len: 11 },
            })
        );
    }

    #[test]
    fn test_net_transmit_writable_buffer_breaks_device() {
        // Arrange
        let mut net = live_net();
        net.transmitq
            .add_chain(&net.device.mem, &[writable(DATA_BASE, 64)]);

        // Act
        net.device.write32(REG_QUEUE_NOTIFY, TRANSMITQ as u32);

        // Assert
        assert_eq!(
            net.device.transport.violation(),
            Some(VirtioViolation::Queue {
                queue: TRANSMITQ as u16,
                fault: QueueFault::WritableDescriptor { index: 0 },
            })
        );
    }

    #[test]
    fn test_net_transmit_beyond_outbox_limit_is_dropped_and_counted() {
        // Arrange
        let mut net = live_net();
        let sent = frame(PEER, b"x");
        write_bytes(&net.device.mem, DATA_BASE, &header(0, 0));
        write_bytes(&net.device.mem, DATA_BASE + 0x100, &sent);

        // Act: the same two descriptors, offered again and again.
        net.transmitq
            .write_descriptor(&net.device.mem, 0, DATA_BASE, NET_HDR_LEN as u32, 1, 1);
        net.transmitq.write_descriptor(
            &net.device.mem,
            1,
            DATA_BASE + 0x100,
            sent.len() as u32,
            0,
            0,
        );
        for _ in 0..OUTBOX_LIMIT + 3 {
            net.transmitq.make_available(&net.device.mem, 0);
            net.device.write32(REG_QUEUE_NOTIFY, TRANSMITQ as u32);
        }

        // Assert
        assert_eq!(
            net.device.transport.device_mut().take_transmitted().len(),
            OUTBOX_LIMIT
        );
        assert_eq!(net.counters().tx_dropped_outbox_full, 3);
    }

    #[test]
    fn test_net_deliver_writes_header_and_frame_end_to_end() {
        // Arrange
        let mut net = live_net();
        // Split the buffer where Linux would not, to check the spreading.
        let head = net.post(&[writable(DATA_BASE, 8), writable(DATA_BASE + 0x100, 1518)]);
        let received = frame(MAC, b"hello, guest");

        // Act
        let outcome = net.deliver(received.clone());

        // Assert
        assert_eq!(outcome, RxOutcome::Delivered);
        let len = NET_HDR_LEN + received.len();
        assert_eq!(
            net.receiveq.take_used(&net.device.mem),
            [(u32::from(head), len as u32)]
        );
        let mut written = read_bytes(&net.device.mem, DATA_BASE, 8);
        written.extend(read_bytes(&net.device.mem, DATA_BASE + 0x100, len - 8));
        let mut expected = vec![0u8; NET_HDR_LEN];
        expected[10] = 1; // num_buffers
        expected.extend_from_slice(&received);
        assert_eq!(written, expected);
        assert_eq!(
            net.device.read32(REG_INTERRUPT_STATUS),
            INTERRUPT_USED_BUFFER
        );
        assert_eq!(net.counters().rx_frames, 1);
        assert_eq!(net.counters().rx_bytes, received.len() as u64);
    }

    #[test]
    fn test_net_deliver_without_posted_buffer_drops_and_counts() {
        // Arrange
        let mut net = live_net();

        // Act
        let outcome = net.deliver(frame(MAC, b"nobody listens"));
        net.post(&[writable(DATA_BASE, 1526)]);
        let used_after_posting = net.receiveq.used_idx(&net.device.mem);

        // Assert: the frame was not held for the later buffer.
        assert_eq!(outcome, RxOutcome::DroppedNoBuffer);
        assert_eq!(used_after_posting, 0);
        assert_eq!(net.counters().rx_dropped_no_buffer, 1);
        assert_eq!(net.device.read32(REG_INTERRUPT_STATUS), 0);
    }

    #[test]
    fn test_net_deliver_into_too_small_buffer_returns_it_empty() {
        // Arrange
        let mut net = live_net();
        let head = net.post(&[writable(DATA_BASE, 40)]);
        write_bytes(&net.device.mem, DATA_BASE, &[0xcc; 40]);

        // Act
        let outcome = net.deliver(frame(MAC, &[7; 100]));

        // Assert
        assert_eq!(outcome, RxOutcome::DroppedBufferTooSmall);
        assert_eq!(
            net.receiveq.take_used(&net.device.mem),
            [(u32::from(head), 0)]
        );
        assert_eq!(read_bytes(&net.device.mem, DATA_BASE, 40), [0xcc; 40]);
        assert_eq!(net.counters().rx_dropped_buffer_too_small, 1);
    }

    #[test]
    fn test_net_deliver_before_driver_ok_drops_and_counts() {
        // Arrange
        let mut device = DirectTransport::new(VirtioNet::new(MAC));
        let mem = device.mem.clone();

        // Act
        let outcome = device
            .transport
            .deliver(frame(MAC, b"too early"), &mem, VirtNanos(1));

        // Assert
        assert_eq!(outcome, RxOutcome::DroppedNotReady);
        assert_eq!(device.transport.device().counters().rx_dropped_not_ready, 1);
    }

    #[test]
    fn test_net_deliver_of_bad_length_drops_and_counts() {
        // Arrange
        let mut net = live_net();
        net.post(&[writable(DATA_BASE, 1526)]);

        // Act
        let outcome = net.deliver(vec![0; MIN_FRAME_LEN - 1]);

        // Assert
        assert_eq!(outcome, RxOutcome::DroppedBadLength);
        assert_eq!(net.receiveq.used_idx(&net.device.mem), 0);
        assert_eq!(net.counters().rx_dropped_bad_length, 1);
    }

    #[test]
    fn test_net_deliver_into_read_only_buffer_breaks_device() {
        // Arrange
        let mut net = live_net();
        net.post(&[readable(DATA_BASE, 1526)]);

        // Act
        let outcome = net.deliver(frame(MAC, b"x"));

        // Assert
        assert_eq!(outcome, RxOutcome::DroppedNotReady);
        assert_eq!(
            net.device.transport.violation(),
            Some(VirtioViolation::Queue {
                queue: RECEIVEQ as u16,
                fault: QueueFault::ReadOnlyDescriptor { index: 0 },
            })
        );
        assert_eq!(net.counters().rx_dropped_not_ready, 1);
    }

    #[test]
    fn test_net_reset_keeps_mac_outbox_and_counters() {
        // Arrange
        let mut net = live_net();
        let sent = frame(PEER, b"sent");
        net.transmit(&header(0, 0), &sent);

        // Act
        net.device.write32(REG_STATUS, 0);

        // Assert
        let backend = net.device.transport.device_mut();
        assert_eq!(backend.mac(), MAC);
        assert_eq!(backend.counters().tx_frames, 1);
        assert_eq!(backend.take_transmitted(), [sent]);
    }

    /// A frame in the outbox and a receive drop counted.
    fn used_net() -> VirtioNet {
        let mut net = live_net();
        net.transmit(&header(0, 0), &frame(PEER, b"out"));
        net.deliver(frame(MAC, b"dropped: no buffer"));
        net.device.transport.device().clone()
    }

    crate::persist::persist_round_trip_tests! {
        mod net_persist {
            fresh: VirtioNet::new([0; 6]),
            saved: used_net(),
            mutate: |net: &mut VirtioNet| {
                net.take_transmitted();
            },
        }
    }
}
