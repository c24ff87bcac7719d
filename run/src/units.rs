//! Sizes, durations, node names and clock steps and rates as people write
//! them, on the command line, in manifests and in faults.
//!
//! Durations have one grammar, `VirtNanos`'s `FromStr` in `devices::time` (shared with
//! snapshot specs); sizes have one, [`ByteSize`]'s here. Both are exact (no floating point),
//! and both types print text that parses back to the same value.

use std::fmt;
use std::str::FromStr;

use devices::time::{parse_with_unit, DecimalError, DurationError};
use vmm::VirtNanos;

/// A number of bytes, as written in `--mem` and manifests.
///
/// The grammar: a decimal number (`4096`, `1.5`, `.5`; no sign, exponent or separators),
/// then directly an optional unit, case-insensitive: none or `B` (bytes), `K`, `M`, `G` or
/// `T`, each optionally followed by `B` or `iB` (`512M`, `512MB`, `512MiB`, `1.5g`). Every
/// unit is binary: K = 1024 bytes, whatever the spelling. The value must be a whole number
/// of bytes (`1.5G` = 1610612736; `0.1K` and `1.5` are errors) no larger than `u64::MAX`.
/// Spaces around the whole are ignored.
///
/// `Display` prints the largest unit that divides the value exactly, without a fraction:
/// `1G`, `1536M`, `4K`, `1000` (bytes), `0`; it parses back to the same value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

/// Why a text is not a size (see [`ByteSize`]). Each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("unparsable size {text:?}: expected a decimal number and a unit ({SIZE_UNITS}; no unit means bytes), e.g. 512M or 1.5G")]
    NotANumber { text: String },
    #[error("unparsable size {text:?}: negative")]
    Negative { text: String },
    #[error(
        "unparsable size {text:?}: unknown unit {unit:?} (use {SIZE_UNITS}; no unit means bytes)"
    )]
    UnknownUnit { text: String, unit: String },
    #[error("unparsable size {text:?}: not a whole number of bytes")]
    NotWholeBytes { text: String },
    #[error("unparsable size {text:?}: beyond the largest, {} bytes", u64::MAX)]
    TooLarge { text: String },
}

const SIZE_UNITS: &str = "B, K, M, G or T, optionally as KB or KiB";

/// The units of [`ByteSize`], largest first.
const BINARY_UNITS: [(&str, u64); 4] = [
    ("T", 1 << 40),
    ("G", 1 << 30),
    ("M", 1 << 20),
    ("K", 1 << 10),
];

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(text: &str) -> Result<Self, SizeError> {
        let unit = |u: &str| {
            let u = u.to_ascii_lowercase();
            if u.is_empty() || u == "b" {
                return Some(1);
            }
            let prefix = u
                .strip_suffix("ib")
                .or_else(|| u.strip_suffix('b'))
                .unwrap_or(&u);
            BINARY_UNITS
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(prefix))
                .map(|&(_, bytes)| bytes)
        };
        let text = text.to_owned();
        parse_with_unit(&text, unit)
            .map(ByteSize)
            .map_err(|e| match e {
                DecimalError::NotANumber => SizeError::NotANumber { text },
                DecimalError::Negative => SizeError::Negative { text },
                DecimalError::UnknownUnit(unit) => SizeError::UnknownUnit { text, unit },
                DecimalError::NotWhole => SizeError::NotWholeBytes { text },
                DecimalError::TooLarge => SizeError::TooLarge { text },
            })
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match BINARY_UNITS
            .iter()
            .find(|&&(_, bytes)| n != 0 && n.is_multiple_of(bytes))
        {
            Some((name, bytes)) => f.pad(&format!("{}{name}", n / bytes)),
            None => f.pad(&n.to_string()),
        }
    }
}

/// A size in bytes: the [`ByteSize`] grammar (`512M`, `1.5G`, `4096`).
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    Ok(text.parse::<ByteSize>()?.0)
}

/// Why a text or a number of bytes is not a guest RAM size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RamError {
    #[error(transparent)]
    Size(#[from] SizeError),
    #[error("guest RAM of {} is out of range: give {}..={}", ByteSize(*bytes), ByteSize(vmm::boot::MIN_RAM), ByteSize(vmm::boot::MAX_RAM))]
    Range { bytes: u64 },
    #[error("guest RAM of {bytes} bytes is not a whole number of 4K pages")]
    Unaligned { bytes: u64 },
}

/// Checks a guest RAM size: `vmm::boot::MIN_RAM..=MAX_RAM`, whole 4 KiB pages.
pub fn check_ram(bytes: u64) -> Result<u64, RamError> {
    if !(vmm::boot::MIN_RAM..=vmm::boot::MAX_RAM).contains(&bytes) {
        return Err(RamError::Range { bytes });
    }
    if !bytes.is_multiple_of(4096) {
        return Err(RamError::Unaligned { bytes });
    }
    Ok(bytes)
}

/// A guest RAM size (`--mem`, `machine.mem`): a size, checked by [`check_ram`].
pub fn parse_ram(text: &str) -> Result<u64, RamError> {
    check_ram(parse_size(text)?)
}

/// The latest wall-clock date the guest's CMOS clock can show (9999-12-31
/// 23:59:59 UTC), as unix seconds; the earliest is 0 (1970).
pub const MAX_RTC_EPOCH: i64 = 253_402_300_799;

/// A wall-clock start the CMOS clock cannot show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{epoch} is outside 1970..9999 (unix seconds 0..={MAX_RTC_EPOCH})")]
pub struct RtcEpochError {
    pub epoch: i64,
}

/// Checks a guest wall-clock start (`--rtc-epoch`, `machine.rtc_epoch`).
pub fn check_rtc_epoch(epoch: i64) -> Result<i64, RtcEpochError> {
    if (0..=MAX_RTC_EPOCH).contains(&epoch) {
        Ok(epoch)
    } else {
        Err(RtcEpochError { epoch })
    }
}

/// The latest virtual time a campaign file or a fault may name: 365 days
/// (`31536000s`). Far beyond any run here (a campaign's slices are seconds to
/// minutes, a boot to its root a few minutes), so a time past it is a typo
/// (`5000000h`, 570 years, which would overflow the guest's clocks) rather
/// than a run that could ever get there.
pub const MAX_VIRTUAL_TIME: VirtNanos = VirtNanos::from_secs(365 * 24 * 3600);

/// A duration: the one grammar of `VirtNanos`'s `FromStr` (`30s`, `500ms`, `5µs`, `2.5s`,
/// `600` = seconds).
pub fn parse_duration(text: &str) -> Result<VirtNanos, DurationError> {
    text.parse()
}

/// A link latency: a duration (`5ms`) or a uniform range (`1ms..10ms`).
pub fn parse_latency(text: &str) -> Result<devices::LatencyDist, DurationError> {
    Ok(match text.split_once("..") {
        Some((min, max)) => devices::LatencyDist::Uniform {
            min: parse_duration(min)?,
            max: parse_duration(max)?,
        },
        None => devices::LatencyDist::Fixed(parse_duration(text)?),
    })
}

/// A node's name: 1-32 characters of a-z, 0-9 and '-', not starting
/// with '-' (a manifest's nodes, and the names a fault text gives).
pub fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

/// The values of the clock faults (`clock n2 +30s`, `drift n2 +200ppm`): a
/// signed step of a node's CLOCK_REALTIME and a drift rate in parts per
/// million. The guest kernel applies them per node (guest-image/patches/0003;
/// see docs/determinism.md, "Per-node clocks").
/// The largest drift either way: the kernel takes |rate| < 10^6 ppm, so a
/// node's realtime always moves forward.
pub const MAX_PPM: i32 = 999_999;

/// Why a step or a rate is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockTextError {
    #[error("expected a sign and a duration, e.g. +30s or -1.5s")]
    NoSign,
    #[error(transparent)]
    Duration(#[from] DurationError),
    #[error("beyond the largest step, {}ns (about 292 years)", i64::MAX)]
    TooLarge,
    #[error("expected a whole number of ppm with its unit, e.g. +200ppm, -50ppm or 0ppm")]
    NotPpm,
    #[error("beyond the largest drift, {MAX_PPM}ppm either way")]
    PpmRange,
}

/// A step: `+` or `-`, then a duration in the one grammar (`+30s`, `-1.5s`,
/// `+250ms`). The sign is required: the step is relative, never a time.
pub fn parse_step(text: &str) -> Result<i64, ClockTextError> {
    let (negative, rest) = match text.split_at_checked(1) {
        Some(("+", rest)) => (false, rest),
        Some(("-", rest)) => (true, rest),
        _ => return Err(ClockTextError::NoSign),
    };
    let magnitude = parse_duration(rest)?.0;
    let magnitude = i64::try_from(magnitude).map_err(|_| ClockTextError::TooLarge)?;
    Ok(if negative { -magnitude } else { magnitude })
}

/// A step as [`parse_step`] reads it back: its sign (`+` for 0), then its
/// size in the one duration printer's text (`-1.5s`).
pub fn step_text(by_ns: i64) -> String {
    let sign = if by_ns < 0 { '-' } else { '+' };
    format!("{sign}{}", VirtNanos(by_ns.unsigned_abs()))
}

/// A rate: an optional sign, a whole number and `ppm` (`+200ppm`, `-50ppm`,
/// `0ppm`), at most [`MAX_PPM`] either way.
pub fn parse_ppm(text: &str) -> Result<i32, ClockTextError> {
    let number = text.strip_suffix("ppm").ok_or(ClockTextError::NotPpm)?;
    let digits = number.strip_prefix(['+', '-']).unwrap_or(number);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ClockTextError::NotPpm);
    }
    let ppm: i64 = number.parse().map_err(|_| ClockTextError::PpmRange)?;
    if ppm.abs() > i64::from(MAX_PPM) {
        return Err(ClockTextError::PpmRange);
    }
    Ok(ppm as i32)
}

/// A rate as [`parse_ppm`] reads it back: `+200ppm`, `-50ppm`, `0ppm`.
pub fn ppm_text(ppm: i32) -> String {
    if ppm > 0 {
        format!("+{ppm}ppm")
    } else {
        format!("{ppm}ppm")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ram_is_checked_for_range_and_pages() {
        assert_eq!(parse_ram("256M"), Ok(256 << 20));
        assert_eq!(parse_ram("64M"), Ok(64 << 20));
        assert_eq!(parse_ram("64G"), Ok(64 << 30));
        assert_eq!(parse_ram("1M"), Err(RamError::Range { bytes: 1 << 20 }));
        assert_eq!(parse_ram("65G"), Err(RamError::Range { bytes: 65 << 30 }));
        let odd = (256 << 20) + 1;
        assert_eq!(
            parse_ram(&odd.to_string()),
            Err(RamError::Unaligned { bytes: odd })
        );
        assert_eq!(
            RamError::Range { bytes: 1 << 20 }.to_string(),
            "guest RAM of 1M is out of range: give 64M..=64G"
        );
        assert!(matches!(parse_ram("lots"), Err(RamError::Size(_))));
    }

    #[test]
    fn test_rtc_epoch_is_within_the_cmos_years() {
        assert_eq!(check_rtc_epoch(0), Ok(0));
        assert_eq!(check_rtc_epoch(MAX_RTC_EPOCH), Ok(MAX_RTC_EPOCH));
        assert!(check_rtc_epoch(99_999_999_999_999).is_err());
        assert!(check_rtc_epoch(-1).is_err());
    }
    use proptest::prelude::*;

    #[test]
    fn test_parse_size_units() {
        for (text, bytes) in [
            ("512M", 512 << 20),
            ("1G", 1 << 30),
            ("1g", 1 << 30),
            ("1.5G", 1_610_612_736),
            ("1536M", 1_610_612_736),
            ("4096", 4096),
            ("4096b", 4096),
            ("64kb", 64 << 10),
            ("64KiB", 64 << 10),
            ("2MiB", 2 << 20),
            ("1t", 1 << 40),
            ("1.25TB", 5 << 38),
            (".5K", 512),
            ("0", 0),
            (" 8M ", 8 << 20),
            ("16383.999999999068677425384521484375G", (16384 << 30) - 1),
        ] {
            assert_eq!(parse_size(text).unwrap(), bytes, "{text:?}");
        }
    }

    #[test]
    fn test_size_errors_name_the_text() {
        let text = |t: &str| t.to_owned();
        let err = |t: &str| t.parse::<ByteSize>().unwrap_err();
        for bad in ["", "M", ".", "5.M", "NaN", "+1M"] {
            assert_eq!(err(bad), SizeError::NotANumber { text: text(bad) });
        }
        assert_eq!(err("-1M"), SizeError::Negative { text: text("-1M") });
        for (bad, unit) in [("12X", "X"), ("1iB", "iB"), ("1Ki", "Ki"), ("1 M", " M")] {
            assert_eq!(
                err(bad),
                SizeError::UnknownUnit {
                    text: text(bad),
                    unit: text(unit)
                }
            );
        }
        for bad in ["1.5", "0.1K", "1.0000000001G"] {
            assert_eq!(err(bad), SizeError::NotWholeBytes { text: text(bad) });
        }
        for bad in ["99999999999999G", "18446744073709551616", "16777216T"] {
            assert_eq!(err(bad), SizeError::TooLarge { text: text(bad) });
        }
        // One message, naming the text, through anyhow as through the type.
        let msg = format!("{:#}", anyhow::Error::from(parse_size("1.5x").unwrap_err()));
        assert_eq!(
            msg,
            "unparsable size \"1.5x\": unknown unit \"x\" (use B, K, M, G or T, optionally as KB or KiB; no unit means bytes)"
        );
    }

    #[test]
    fn test_size_display() {
        for (bytes, text) in [
            (0, "0"),
            (1, "1"),
            (1000, "1000"),
            (4096, "4K"),
            (512 << 20, "512M"),
            (1_610_612_736, "1536M"),
            (1 << 30, "1G"),
            (3 << 40, "3T"),
            (u64::MAX, "18446744073709551615"),
        ] {
            assert_eq!(ByteSize(bytes).to_string(), text);
        }
    }

    #[test]
    fn test_parse_duration_units() {
        // The one grammar (tested in full beside VirtNanos), through the wrapper.
        assert_eq!(parse_duration("30s").unwrap(), VirtNanos::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), VirtNanos(500_000_000));
        assert_eq!(parse_duration("10m").unwrap(), VirtNanos::from_secs(600));
        assert_eq!(parse_duration("2.5").unwrap(), VirtNanos(2_500_000_000));
        // `--until 600` is ten minutes, as `DIR@600` is.
        assert_eq!(parse_duration("600").unwrap(), VirtNanos::from_secs(600));
        assert_eq!(parse_duration("5µs").unwrap(), VirtNanos(5_000));
        assert_eq!(parse_duration("5us").unwrap(), VirtNanos(5_000));
        assert_eq!(
            format!("{:#}", parse_duration("5 parsecs").unwrap_err()),
            "unparsable duration \"5 parsecs\": unknown unit \" parsecs\" (use ns, us or µs, ms, s, m or min, h; no unit means seconds)"
        );
        for bad in ["", "-1s", "NaN", "1.5ns", "99999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn test_parse_latency() {
        assert_eq!(
            parse_latency("5ms").unwrap(),
            devices::LatencyDist::Fixed(VirtNanos(5_000_000))
        );
        assert_eq!(
            parse_latency("1ms..10µs").unwrap(),
            devices::LatencyDist::Uniform {
                min: VirtNanos(1_000_000),
                max: VirtNanos(10_000),
            }
        );
        assert!(parse_latency("1ms..").is_err());
    }

    proptest! {
        #[test]
        fn prop_duration_display_round_trips(ns: u64) {
            let text = VirtNanos(ns).to_string();
            prop_assert_eq!(parse_duration(&text).unwrap(), VirtNanos(ns), "{}", text);
        }

        #[test]
        fn prop_round_durations_round_trip(n in 0u64..1_000_000, pow in 0u32..13) {
            let ns = n * 10u64.pow(pow);
            prop_assert_eq!(parse_duration(&VirtNanos(ns).to_string()).unwrap(), VirtNanos(ns));
        }

        #[test]
        fn prop_seconds_with_nanoseconds_parse_exactly(secs in 0u64..18_000_000_000, frac in 0u64..1_000_000_000) {
            let text = format!("{secs}.{frac:09}");
            prop_assert_eq!(parse_duration(&text).unwrap(), VirtNanos(secs * 1_000_000_000 + frac));
        }

        #[test]
        fn prop_size_display_round_trips(bytes: u64) {
            let text = ByteSize(bytes).to_string();
            prop_assert_eq!(text.parse::<ByteSize>(), Ok(ByteSize(bytes)), "{}", text);
        }

        #[test]
        fn prop_unit_sizes_round_trip(n in 0u64..1 << 23, shift in 0u32..41) {
            let bytes = n << shift;
            let text = ByteSize(bytes).to_string();
            prop_assert_eq!(text.parse::<ByteSize>(), Ok(ByteSize(bytes)), "{}", text);
        }
    }

    #[test]
    fn test_steps_and_rates_read_as_written() {
        assert_eq!(parse_step("+30s"), Ok(30_000_000_000));
        assert_eq!(parse_step("-2s"), Ok(-2_000_000_000));
        assert_eq!(parse_step("-1.5s"), Ok(-1_500_000_000));
        assert_eq!(parse_step("+0s"), Ok(0));
        assert_eq!(parse_step("30s"), Err(ClockTextError::NoSign));
        assert_eq!(parse_step(""), Err(ClockTextError::NoSign));
        assert!(matches!(
            parse_step("+soon"),
            Err(ClockTextError::Duration(_))
        ));
        assert_eq!(parse_step("+600h"), Ok(600 * 3_600_000_000_000));
        assert_eq!(parse_step("+3000000h"), Err(ClockTextError::TooLarge));
        assert_eq!(step_text(30_000_000_000), "+30s");
        assert_eq!(step_text(-2_000_000_000), "-2s");
        assert_eq!(step_text(-1_500_000_000), "-1.5s");
        assert_eq!(step_text(0), "+0s");
        assert_eq!(parse_ppm("+200ppm"), Ok(200));
        assert_eq!(parse_ppm("-50ppm"), Ok(-50));
        assert_eq!(parse_ppm("0ppm"), Ok(0));
        assert_eq!(parse_ppm("200"), Err(ClockTextError::NotPpm));
        assert_eq!(parse_ppm("+ppm"), Err(ClockTextError::NotPpm));
        assert_eq!(parse_ppm("1.5ppm"), Err(ClockTextError::NotPpm));
        assert_eq!(parse_ppm("+1000000ppm"), Err(ClockTextError::PpmRange));
        assert_eq!(
            parse_ppm("-99999999999999999999ppm"),
            Err(ClockTextError::PpmRange)
        );
        assert_eq!(ppm_text(200), "+200ppm");
        assert_eq!(ppm_text(-50), "-50ppm");
        assert_eq!(ppm_text(0), "0ppm");
    }

    proptest! {
        #[test]
        fn prop_steps_round_trip(by_ns in -(1i64 << 53)..(1i64 << 53)) {
            prop_assert_eq!(parse_step(&step_text(by_ns)), Ok(by_ns));
        }

        #[test]
        fn prop_rates_round_trip(ppm in -MAX_PPM..=MAX_PPM) {
            prop_assert_eq!(parse_ppm(&ppm_text(ppm)), Ok(ppm));
        }
    }
}
