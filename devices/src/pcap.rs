//! pcapng encoding of the switch's frames (<https://www.ietf.org/archive/id/draft-ietf-opsawg-pcapng-02.html>):
//! the bytes only, no I/O. A capture file is a [`section_header`], one
//! [`interface`] (an Ethernet link named after the directed link it
//! records) and one [`packet`] per frame event, in time order.
//!
//! Timestamps are virtual time in nanoseconds (`if_tsresol` = 9) since the
//! machine started, so Wireshark shows what the guest's clocks show, to the
//! nanosecond, whatever the host did. A frame the switch dropped is written
//! too, at the time it was dropped, with the comment `dropped: partition`
//! or `dropped: loss`; every other frame is one the destination received at
//! that time. All integers are little-endian (the section's byte-order
//! magic says so to readers).

use crate::switch::FrameEvent;

const SECTION_HEADER: u32 = 0x0A0D_0D0A;
const INTERFACE_DESCRIPTION: u32 = 1;
const ENHANCED_PACKET: u32 = 6;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;
const LINKTYPE_ETHERNET: u16 = 1;

const OPT_END: u16 = 0;
const OPT_COMMENT: u16 = 1;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;
/// `if_tsresol` 9: timestamps count 10^-9 s.
const NANOSECONDS: u8 = 9;

/// The section header block that starts a file.
pub fn section_header() -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&BYTE_ORDER_MAGIC.to_le_bytes());
    body.extend_from_slice(&1u16.to_le_bytes()); // major version
    body.extend_from_slice(&0u16.to_le_bytes()); // minor version
    body.extend_from_slice(&(-1i64).to_le_bytes()); // section length: not given
    option(&mut body, SHB_USERAPPL, b"detvisor");
    end_of_options(&mut body);
    block(SECTION_HEADER, &body)
}

/// The interface description block of an Ethernet link called `name`,
/// with nanosecond timestamps and no snapshot length limit.
pub fn interface(name: &str) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes()); // reserved
    body.extend_from_slice(&0u32.to_le_bytes()); // snaplen: none
    option(&mut body, IF_NAME, name.as_bytes());
    option(&mut body, IF_TSRESOL, &[NANOSECONDS]);
    end_of_options(&mut body);
    block(INTERFACE_DESCRIPTION, &body)
}

/// The enhanced packet block of `event` on interface 0.
pub fn packet(event: &FrameEvent) -> Vec<u8> {
    let ns = event.at.as_nanos();
    let len = u32::try_from(event.frame.len()).unwrap_or(u32::MAX);
    let mut body = Vec::new();
    body.extend_from_slice(&0u32.to_le_bytes()); // interface id
    body.extend_from_slice(&((ns >> 32) as u32).to_le_bytes());
    body.extend_from_slice(&(ns as u32).to_le_bytes());
    body.extend_from_slice(&len.to_le_bytes()); // captured
    body.extend_from_slice(&len.to_le_bytes()); // on the wire
    body.extend_from_slice(&event.frame);
    pad(&mut body);
    if let Some(reason) = event.dropped {
        let comment = format!("dropped: {}", reason.as_str());
        option(&mut body, OPT_COMMENT, comment.as_bytes());
        end_of_options(&mut body);
    }
    block(ENHANCED_PACKET, &body)
}

/// A block: type, total length, body, total length again.
fn block(kind: u32, body: &[u8]) -> Vec<u8> {
    let total = u32::try_from(body.len() + 12).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(body.len() + 12);
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&total.to_le_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(&total.to_le_bytes());
    out
}

/// An option: code, length, value padded to 32 bits.
fn option(body: &mut Vec<u8>, code: u16, value: &[u8]) {
    body.extend_from_slice(&code.to_le_bytes());
    body.extend_from_slice(&(value.len() as u16).to_le_bytes());
    body.extend_from_slice(value);
    pad(body);
}

fn end_of_options(body: &mut Vec<u8>) {
    body.extend_from_slice(&OPT_END.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes());
}

fn pad(bytes: &mut Vec<u8>) {
    while !bytes.len().is_multiple_of(4) {
        bytes.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::{DropReason, PortId};
    use crate::time::VirtNanos;

    fn u32_at(bytes: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
    }

    /// (type, body) of each block, checking both length fields.
    fn blocks(mut bytes: &[u8]) -> Vec<(u32, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let total = u32_at(bytes, 4) as usize;
            assert_eq!(total % 4, 0, "blocks are 32-bit aligned");
            assert_eq!(u32_at(bytes, total - 4) as usize, total);
            out.push((u32_at(bytes, 0), bytes[8..total - 4].to_vec()));
            bytes = &bytes[total..];
        }
        out
    }

    /// (code, value) of each option in `options`, up to the end marker.
    fn options(mut options: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut out = Vec::new();
        loop {
            let code = u16::from_le_bytes([options[0], options[1]]);
            let len = usize::from(u16::from_le_bytes([options[2], options[3]]));
            if code == OPT_END {
                assert_eq!(len, 0);
                return out;
            }
            out.push((code, options[4..4 + len].to_vec()));
            options = &options[4 + len.next_multiple_of(4)..];
        }
    }

    #[test]
    fn test_pcap_file_blocks_carry_virtual_nanoseconds_and_drop_comments() {
        // Arrange
        let delivered = FrameEvent {
            at: VirtNanos(5_000_000_123),
            from: PortId(2),
            to: PortId(3),
            dropped: None,
            frame: vec![0xab; 61],
        };
        let lost = FrameEvent {
            dropped: Some(DropReason::Loss),
            ..delivered.clone()
        };

        // Act
        let mut file = section_header();
        file.extend(interface("n1.to.n2"));
        file.extend(packet(&delivered));
        file.extend(packet(&lost));
        let blocks = blocks(&file);

        // Assert
        let kinds: Vec<u32> = blocks.iter().map(|b| b.0).collect();
        assert_eq!(kinds, [SECTION_HEADER, 1, 6, 6]);
        assert_eq!(u32_at(&blocks[0].1, 0), BYTE_ORDER_MAGIC);
        assert_eq!(
            options(&blocks[1].1[8..]),
            [(IF_NAME, b"n1.to.n2".to_vec()), (IF_TSRESOL, vec![9])]
        );
        let epb = &blocks[2].1;
        let ns = (u64::from(u32_at(epb, 4)) << 32) | u64::from(u32_at(epb, 8));
        assert_eq!(ns, 5_000_000_123);
        assert_eq!((u32_at(epb, 12), u32_at(epb, 16)), (61, 61));
        assert_eq!(&epb[20..81], &[0xab; 61][..]);
        assert_eq!(epb.len(), 20 + 64, "no options on a delivered frame");
        assert_eq!(
            options(&blocks[3].1[20 + 64..]),
            [(OPT_COMMENT, b"dropped: loss".to_vec())]
        );
    }
}
