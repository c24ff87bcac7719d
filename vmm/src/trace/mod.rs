//! The per-exit trace (`--trace FILE`): one JSON line per guest-caused exit,
//! the [`ExitRecord`] the audit compares plus the name of the device the
//! exit hit, and the report made from such lines ([`report`]).
//!
//! A trace only observes: an [`ExitObserver`] set on a session
//! ([`crate::vm::Session::set_exit_observer`]) hears of each record after
//! it is made and cannot change it, the digest or anything the guest sees.
//!
//! A line, with the hashes and the injected vector `null` where the record
//! has none, and 64-bit values as hex strings (so that tools reading JSON
//! numbers as doubles lose nothing):
//!
//! ```json
//! {"index":41,"time_ns":1230000,"kind":"IoOut","device":"serial","address":"0x3f8",
//!  "data":"0x41","size":1,"rip":"0xffffffff81461b2a","regs_hash":"0x5c1d...",
//!  "injected":null,"device_hash":null,"memory_hash":null}
//! ```
//!
//! `device` is the name the bus gives the owner of the port or address
//! (`"hpet"`, `"pic-master"`, `"serial"`, `"acpi-pm-timer"`, `"clock-page"`,
//! `"virtio-net@0xd0002000"`, ...), [`UNOWNED`] for a port or address no
//! device owns, [`MSR_DEVICE`] for an MSR access, and `null` for exits
//! that concern no address (`Hlt`, `IrqWindowOpen`, ...).

pub mod report;

use crate::exit::ExitKind;
pub use crate::record::ExitObserver;
use crate::record::{ExitRecord, NO_HASH, NO_VECTOR};
use devices::{Devices, VirtNanos};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// The device of a port or MMIO access no device owns.
pub const UNOWNED: &str = "unowned";
/// The device of an MSR access: the CPU model's MSR policy.
pub const MSR_DEVICE: &str = "msr";

/// The name of the device an exit of `kind` at `address` hit (see the
/// module documentation).
pub fn exit_device(devices: &Devices, kind: ExitKind, address: u64) -> Option<Cow<'static, str>> {
    match kind {
        ExitKind::IoIn | ExitKind::IoOut => Some(
            u16::try_from(address)
                .ok()
                .and_then(|port| devices.port_owner(port))
                .unwrap_or(Cow::Borrowed(UNOWNED)),
        ),
        ExitKind::MmioRead | ExitKind::MmioWrite => Some(
            devices
                .mmio_owner(address)
                .unwrap_or(Cow::Borrowed(UNOWNED)),
        ),
        ExitKind::RdMsr | ExitKind::WrMsr => Some(Cow::Borrowed(MSR_DEVICE)),
        ExitKind::Hlt
        | ExitKind::IrqWindowOpen
        | ExitKind::Shutdown
        | ExitKind::Interrupted
        | ExitKind::Fatal
        | ExitKind::SingleStep => None,
    }
}

/// One line of a trace: an [`ExitRecord`] and the device it hit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceLine {
    pub index: u64,
    /// Virtual time at the exit since boot (nanoseconds in the JSON).
    pub time_ns: VirtNanos,
    pub kind: ExitKind,
    pub device: Option<String>,
    /// Port, MMIO address or MSR index.
    #[serde(with = "hex")]
    pub address: u64,
    /// Data written, or returned to the guest, little-endian.
    #[serde(with = "hex")]
    pub data: u64,
    pub size: u8,
    #[serde(with = "hex")]
    pub rip: u64,
    #[serde(with = "hex")]
    pub regs_hash: u64,
    /// The vector injected before re-entering the guest.
    pub injected: Option<u16>,
    #[serde(with = "hex_or_null")]
    pub device_hash: Option<u64>,
    #[serde(with = "hex_or_null")]
    pub memory_hash: Option<u64>,
}

impl TraceLine {
    pub fn new(record: &ExitRecord, device: Option<&str>) -> Self {
        TraceLine {
            index: record.index,
            time_ns: record.time,
            kind: record.kind,
            device: device.map(str::to_owned),
            address: record.address,
            data: record.data,
            size: record.size,
            rip: record.rip,
            regs_hash: record.regs_hash,
            injected: (record.injected != NO_VECTOR).then_some(record.injected),
            device_hash: (record.device_hash != NO_HASH).then_some(record.device_hash),
            memory_hash: (record.memory_hash != NO_HASH).then_some(record.memory_hash),
        }
    }

    /// The record this line was made from.
    pub fn record(&self) -> ExitRecord {
        ExitRecord {
            index: self.index,
            time: self.time_ns,
            kind: self.kind,
            address: self.address,
            data: self.data,
            size: self.size,
            rip: self.rip,
            regs_hash: self.regs_hash,
            injected: self.injected.unwrap_or(NO_VECTOR),
            device_hash: self.device_hash.unwrap_or(NO_HASH),
            memory_hash: self.memory_hash.unwrap_or(NO_HASH),
        }
    }

    /// The line as JSON, without its newline.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a trace line always serializes")
    }

    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

fn parse_hex(text: &str) -> Result<u64, String> {
    let digits = text
        .strip_prefix("0x")
        .ok_or_else(|| format!("{text:?} is not a hex value (0x...)"))?;
    u64::from_str_radix(digits, 16).map_err(|e| format!("{text:?}: {e}"))
}

/// A u64 as a `"0x..."` string.
mod hex {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{value:#x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        super::parse_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// An optional u64 as a `"0x..."` string or `null`.
mod hex_or_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => s.collect_str(&format_args!("{value:#x}")),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Option::<std::borrow::Cow<str>>::deserialize(d)?
            .map(|text| super::parse_hex(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::DevicesConfig;

    fn record() -> ExitRecord {
        ExitRecord {
            index: 41,
            time: VirtNanos(1_230_000),
            kind: ExitKind::IoOut,
            address: 0x3f8,
            data: 0x41,
            size: 1,
            rip: 0xffff_ffff_8146_1b2a,
            regs_hash: u64::MAX,
            injected: NO_VECTOR,
            device_hash: NO_HASH,
            memory_hash: NO_HASH,
        }
    }

    #[test]
    fn test_trace_line_round_trips_every_record_field_through_json() {
        let mut hashed = record();
        hashed.kind = ExitKind::MmioRead;
        hashed.address = 0xfed0_00f0;
        hashed.data = 0x0123_4567_89ab_cdef;
        hashed.size = 8;
        hashed.injected = 0x30;
        hashed.device_hash = 0xdead_beef_0000_0001;
        hashed.memory_hash = 7;
        for (record, device) in [(record(), Some("serial")), (hashed, None)] {
            let line = TraceLine::new(&record, device);
            let json = line.to_json();
            assert!(!json.contains('\n'));
            let back = TraceLine::from_json(&json).unwrap();
            assert_eq!(back, line);
            assert_eq!(back.record(), record);
            assert_eq!(back.device.as_deref(), device);
        }
    }

    #[test]
    fn test_trace_line_json_has_hex_strings_and_nulls() {
        let json = TraceLine::new(&record(), Some("serial")).to_json();
        assert_eq!(
            json,
            concat!(
                r#"{"index":41,"time_ns":1230000,"kind":"IoOut","device":"serial","#,
                r#""address":"0x3f8","data":"0x41","size":1,"rip":"0xffffffff81461b2a","#,
                r#""regs_hash":"0xffffffffffffffff","injected":null,"device_hash":null,"#,
                r#""memory_hash":null}"#
            )
        );
    }

    #[test]
    fn test_trace_line_rejects_decimal_where_hex_is_due() {
        let json = TraceLine::new(&record(), None)
            .to_json()
            .replace(r#""0x3f8""#, r#""1016""#);
        let error = TraceLine::from_json(&json).unwrap_err().to_string();
        assert!(error.contains("not a hex value"), "{error}");
    }

    #[test]
    fn test_exit_device_names_bus_owners_msrs_and_nothing() {
        let devices = Devices::new(
            DevicesConfig {
                rtc_epoch_unix_secs: 0,
            },
            Box::new(std::io::sink()),
        );
        let name = |kind, address| exit_device(&devices, kind, address).map(Cow::into_owned);
        assert_eq!(name(ExitKind::IoOut, 0x3f8).as_deref(), Some("serial"));
        assert_eq!(name(ExitKind::IoIn, 0x21).as_deref(), Some("pic-master"));
        assert_eq!(
            name(ExitKind::IoIn, 0x608).as_deref(),
            Some("acpi-pm-timer")
        );
        assert_eq!(name(ExitKind::IoIn, 0x3e8).as_deref(), Some(UNOWNED));
        assert_eq!(
            name(ExitKind::MmioRead, 0xfed0_00f0).as_deref(),
            Some("hpet")
        );
        assert_eq!(name(ExitKind::MmioWrite, 0x1000).as_deref(), Some(UNOWNED));
        assert_eq!(name(ExitKind::RdMsr, 0x10).as_deref(), Some(MSR_DEVICE));
        assert_eq!(name(ExitKind::Hlt, 0), None);
        assert_eq!(name(ExitKind::IrqWindowOpen, 0), None);
    }
}
