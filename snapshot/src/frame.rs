//! The framed file layout shared by `state.bin` and `memory.idx`:
//!
//! | offset | size | field                                  |
//! |-------:|-----:|----------------------------------------|
//! | 0      | 8    | magic                                  |
//! | 8      | 4    | format version, u32 LE                 |
//! | 12     | 4    | flags, u32 LE                          |
//! | 16     | 8    | payload length, u64 LE                 |
//! | 24     | 8    | CRC-64/XZ of the payload, u64 LE       |
//! | 32     | len  | payload                                |

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{io, Result, SnapshotError};
use crate::{FORMAT_VERSION, OLDEST_READ_VERSION};

pub(crate) const HEADER_LEN: usize = 32;

/// The largest `state.bin` or `memory.idx` read or written (1 GiB), so that
/// a file that is not a snapshot part cannot exhaust memory. A machine's
/// state is far below it (the switch's frames in flight are bounded, see
/// `devices::switch::MAX_IN_FLIGHT`) except for its disks' changed blocks,
/// which the state holds (hex: two bytes a byte): a guest that changes more
/// than about 500 MiB of disk makes the snapshot fail with
/// [`SnapshotError::PartTooLarge`] rather than write one that cannot be read.
pub const MAX_FRAMED_BYTES: u64 = 1 << 30;

/// CRC-64/XZ (a.k.a. CRC-64/GO-ECMA): ECMA-182 polynomial 0x42F0E1EBA9EA3693, reflected,
/// init and xorout all ones. The CRC of `b"123456789"` is `0x995dc9bbdf1939fa`.
pub(crate) const CRC64: crc::Crc<u64, crc::Table<16>> =
    crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_XZ);

/// Writes header and payload to a new file at `path` and fsyncs it; refuses
/// a file larger than [`MAX_FRAMED_BYTES`], which could not be read back.
pub(crate) fn write_framed(path: &Path, magic: &[u8; 8], flags: u32, payload: &[u8]) -> Result<()> {
    write_framed_within(path, magic, flags, payload, MAX_FRAMED_BYTES)
}

fn write_framed_within(
    path: &Path,
    magic: &[u8; 8],
    flags: u32,
    payload: &[u8],
    max: u64,
) -> Result<()> {
    let bytes = (HEADER_LEN + payload.len()) as u64;
    if bytes > max {
        return Err(SnapshotError::PartTooLarge {
            path: path.to_owned(),
            bytes,
            max,
        });
    }
    let mut buf = Vec::with_capacity(HEADER_LEN + payload.len());
    buf.extend_from_slice(magic);
    buf.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    buf.extend_from_slice(&flags.to_le_bytes());
    buf.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    buf.extend_from_slice(&CRC64.checksum(payload).to_le_bytes());
    buf.extend_from_slice(payload);
    let mut f = File::create(path).map_err(io(path, "create"))?;
    f.write_all(&buf).map_err(io(path, "write"))?;
    f.sync_all().map_err(io(path, "fsync"))?;
    Ok(())
}

/// Reads and checks a framed file: magic, version, length, checksum. Returns the flags, the
/// payload and its checksum. `what` names the part for a `MissingPart` error.
pub(crate) fn read_framed(
    path: &Path,
    magic: &[u8; 8],
    what: &'static str,
) -> Result<(u32, Vec<u8>, u64)> {
    // A regular file only (never a FIFO or a device), of bounded size.
    let mut bytes = match hostfile::read_limited(path, MAX_FRAMED_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(SnapshotError::MissingPart {
                path: path.to_owned(),
                what,
            })
        }
        Err(e) => return Err(SnapshotError::Read(e)),
    };
    let actual = bytes.len() as u64;
    let head = &bytes[..bytes.len().min(8)];
    if head != &magic[..head.len()] {
        return Err(SnapshotError::BadMagic {
            path: path.to_owned(),
            expected: magic.escape_ascii().to_string(),
            found: head.escape_ascii().to_string(),
        });
    }
    if bytes.len() < HEADER_LEN {
        return Err(SnapshotError::Truncated {
            path: path.to_owned(),
            expected: HEADER_LEN as u64,
            actual,
        });
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    let version = u32_at(8);
    let flags = u32_at(12);
    let len = u64_at(16);
    let crc = u64_at(24);
    if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(SnapshotError::UnsupportedVersion {
            path: path.to_owned(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let expected = len.saturating_add(HEADER_LEN as u64);
    if actual < expected {
        return Err(SnapshotError::Truncated {
            path: path.to_owned(),
            expected,
            actual,
        });
    }
    if actual > expected {
        return Err(SnapshotError::TrailingData {
            path: path.to_owned(),
            expected,
            actual,
        });
    }
    let payload = bytes.split_off(HEADER_LEN);
    let sum = CRC64.checksum(&payload);
    if sum != crc {
        return Err(SnapshotError::ChecksumMismatch {
            path: path.to_owned(),
            expected: crc,
            actual: sum,
        });
    }
    Ok((flags, payload, crc))
}

/// Checks that `flags` has no bits outside `known`.
pub(crate) fn check_flags(path: &Path, flags: u32, known: u32) -> Result<()> {
    if flags & !known != 0 {
        return Err(SnapshotError::UnsupportedFlags {
            path: path.to_owned(),
            found: flags,
            known,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state too large to read back is refused when written, naming the
    /// sizes, and leaves no file; one at the limit is written and read back.
    #[test]
    fn test_a_part_over_the_read_limit_is_refused_when_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.bin");
        let payload = vec![7u8; 100];
        let max = (HEADER_LEN + 99) as u64;
        let err = write_framed_within(&path, b"DVSTATE\0", 0, &payload, max).unwrap_err();
        assert!(
            matches!(err, SnapshotError::PartTooLarge { bytes, max: m, .. } if bytes == max + 1 && m == max),
            "{err:?}"
        );
        assert!(
            err.to_string().contains(&format!("over the {max} bytes")),
            "{err}"
        );
        assert!(!path.exists());
        write_framed_within(&path, b"DVSTATE\0", 0, &payload[..99], max).unwrap();
        let (_, back, _) = read_framed(&path, b"DVSTATE\0", "state").unwrap();
        assert_eq!(back, payload[..99]);
    }
}
