//! Units of virtual time. The guest never sees host time: every clock it can
//! read is derived from a `VirtNanos` that the VMM advances deterministically.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, Sub};
use std::str::FromStr;

/// A point (or span) on the virtual timeline, in nanoseconds since the VM was created.
/// Serialized as the bare number of nanoseconds, so a field of this type
/// reads and writes the same JSON as the `u64` it replaced.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct VirtNanos(pub u64);

impl VirtNanos {
    pub const ZERO: VirtNanos = VirtNanos(0);

    pub const fn from_secs(secs: u64) -> Self {
        VirtNanos(secs * 1_000_000_000)
    }

    pub const fn from_micros(micros: u64) -> Self {
        VirtNanos(micros * 1_000)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    pub fn saturating_sub(self, other: VirtNanos) -> VirtNanos {
        VirtNanos(self.0.saturating_sub(other.0))
    }

    pub fn saturating_add(self, other: VirtNanos) -> VirtNanos {
        VirtNanos(self.0.saturating_add(other.0))
    }
}

impl Add for VirtNanos {
    type Output = VirtNanos;
    fn add(self, rhs: VirtNanos) -> VirtNanos {
        VirtNanos(self.0 + rhs.0)
    }
}

impl Sub for VirtNanos {
    type Output = VirtNanos;
    fn sub(self, rhs: VirtNanos) -> VirtNanos {
        VirtNanos(self.0 - rhs.0)
    }
}

/// Prints the exact value in the largest of `s`, `ms`, `us`, `ns` it reaches (seconds from
/// 1 s up, and for 0), with as many decimals as it takes and no trailing zeros: `0s`,
/// `42ns`, `5us`, `1.5ms`, `4s`, `12.000000001s`, `3600s`. [`VirtNanos::from_str`] reads
/// every such text back to the same value. Honours width and alignment (`{:>12}`).
impl fmt::Display for VirtNanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        let (per, unit, decimals) = match n {
            0 | 1_000_000_000.. => (1_000_000_000, "s", 9),
            1_000_000.. => (1_000_000, "ms", 6),
            1_000.. => (1_000, "us", 3),
            _ => (1, "ns", 0),
        };
        let (whole, frac) = (n / per, n % per);
        if frac == 0 {
            f.pad(&format!("{whole}{unit}"))
        } else {
            let digits = format!("{frac:0decimals$}");
            f.pad(&format!("{whole}.{}{unit}", digits.trim_end_matches('0')))
        }
    }
}

/// Why a text is not a duration (see [`VirtNanos::from_str`]). Each names the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("unparsable duration {text:?}: expected a decimal number and a unit ({DURATION_UNITS}; no unit means seconds), e.g. 12.5s, 250ms or 600")]
    NotANumber { text: String },
    #[error("unparsable duration {text:?}: negative")]
    Negative { text: String },
    #[error("unparsable duration {text:?}: unknown unit {unit:?} (use {DURATION_UNITS}; no unit means seconds)")]
    UnknownUnit { text: String, unit: String },
    #[error("unparsable duration {text:?}: finer than a nanosecond")]
    FinerThanNanosecond { text: String },
    #[error(
        "unparsable duration {text:?}: beyond the largest, {}ns (about 584 years)",
        u64::MAX
    )]
    TooLarge { text: String },
}

const DURATION_UNITS: &str = "ns, us or µs, ms, s, m or min, h";

/// The one duration grammar, for every flag, manifest field and snapshot spec:
///
/// * a decimal number, `12`, `12.5` or `.5` (no sign, exponent or separators), then
///   directly a unit: `ns`; `us` or `µs`; `ms`; `s`; `m` or `min`; `h`. No unit means
///   seconds (`600` is ten minutes). Units are lower case. Spaces around the whole are
///   ignored.
/// * The value is exact (no floating point): `2.5s` is 2 500 000 000 ns, and a value finer
///   than a nanosecond (`1.5ns`, `0.0000000001s`) is an error, as are negatives, `NaN`,
///   `inf`, and anything beyond `u64::MAX` ns.
///
/// [`VirtNanos`]'s `Display` prints text this reads back to the same value.
impl FromStr for VirtNanos {
    type Err = DurationError;

    fn from_str(text: &str) -> Result<Self, DurationError> {
        let unit = |u: &str| {
            Some(match u {
                "ns" => 1,
                "us" | "µs" | "μs" => 1_000,
                "ms" => 1_000_000,
                "" | "s" => 1_000_000_000,
                "m" | "min" => 60_000_000_000,
                "h" => 3_600_000_000_000,
                _ => return None,
            })
        };
        let text = text.to_owned();
        parse_with_unit(&text, unit)
            .map(VirtNanos)
            .map_err(|e| match e {
                DecimalError::NotANumber => DurationError::NotANumber { text },
                DecimalError::Negative => DurationError::Negative { text },
                DecimalError::UnknownUnit(unit) => DurationError::UnknownUnit { text, unit },
                DecimalError::NotWhole => DurationError::FinerThanNanosecond { text },
                DecimalError::TooLarge => DurationError::TooLarge { text },
            })
    }
}

/// What [`parse_with_unit`] found wrong; the grammar using it names the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecimalError {
    /// No decimal number at the start (`""`, `"s"`, `"5."`, `"1.2.3"`, `"NaN"`).
    NotANumber,
    /// A leading `-`.
    Negative,
    /// The unit function knows no such unit (the text after the number).
    UnknownUnit(String),
    /// The number times the unit is not a whole number of the base unit.
    NotWhole,
    /// The number times the unit is beyond `u64::MAX`.
    TooLarge,
}

/// The lexer and exact arithmetic shared by the duration grammar above and the size
/// grammar (`run::units::ByteSize`): `text`, trimmed, is a decimal number (`12`, `12.5`,
/// `.5`) followed directly by a unit, which `unit` maps to its multiple of the base unit
/// (the empty unit included, if allowed). Returns the number times that multiple, exactly,
/// if it is a whole number that fits in a u64.
pub fn parse_with_unit(
    text: &str,
    unit: impl Fn(&str) -> Option<u64>,
) -> Result<u64, DecimalError> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(DecimalError::Negative);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(split);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let only_digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if (int.is_empty() && frac.is_empty())
        || number.ends_with('.')
        || !only_digits(int)
        || !only_digits(frac)
    {
        return Err(DecimalError::NotANumber);
    }
    let mult = unit(suffix).ok_or_else(|| DecimalError::UnknownUnit(suffix.to_owned()))?;
    // The fraction times `mult`, by schoolbook multiplication of its digits from the right:
    // the low `frac.len()` digits of the product must be zero, and the carry left over is
    // the whole part (below `mult`), so this is exact for any number of digits.
    let mut carry: u128 = 0;
    for d in frac.bytes().rev() {
        let v = u128::from(d - b'0') * u128::from(mult) + carry;
        if !v.is_multiple_of(10) {
            return Err(DecimalError::NotWhole);
        }
        carry = v / 10;
    }
    let whole = int.bytes().try_fold(0u64, |acc, d| {
        acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    });
    whole
        .and_then(|w| w.checked_mul(mult))
        .and_then(|w| w.checked_add(u64::try_from(carry).ok()?))
        .ok_or(DecimalError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<VirtNanos, DurationError> {
        text.parse()
    }

    #[test]
    fn test_durations_parse_exactly() {
        let s = 1_000_000_000u64;
        for (text, ns) in [
            ("600", 600 * s),
            ("2.5", 2 * s + s / 2),
            ("12.5s", 12 * s + s / 2),
            (".5s", s / 2),
            ("0", 0),
            ("0s", 0),
            ("250ms", 250_000_000),
            ("7us", 7_000),
            ("5µs", 5_000),
            ("5μs", 5_000),
            ("42ns", 42),
            ("1.0ns", 1),
            ("1.5m", 90 * s),
            ("10min", 600 * s),
            ("2h", 7200 * s),
            ("0.000000001s", 1),
            ("1.000000000000000000000000000s", s),
            (" 30s ", 30 * s),
            ("18446744073709551615ns", u64::MAX),
            ("18446744073.709551615", u64::MAX),
        ] {
            assert_eq!(parse(text), Ok(VirtNanos(ns)), "{text:?}");
        }
    }

    #[test]
    fn test_duration_errors_name_the_text() {
        let text = |t: &str| t.to_owned();
        for bad in ["", "s", ".", ".s", "5.s", "1.2.3s", "NaN", "inf", "+1s"] {
            assert_eq!(
                parse(bad),
                Err(DurationError::NotANumber { text: text(bad) })
            );
        }
        assert_eq!(
            parse("-1s"),
            Err(DurationError::Negative { text: text("-1s") })
        );
        assert_eq!(
            parse("12.5parsecs"),
            Err(DurationError::UnknownUnit {
                text: text("12.5parsecs"),
                unit: text("parsecs")
            })
        );
        for (bad, unit) in [("1e3s", "e3s"), ("5 s", " s"), ("5S", "S"), ("1,5s", ",5s")] {
            assert_eq!(
                parse(bad),
                Err(DurationError::UnknownUnit {
                    text: text(bad),
                    unit: text(unit)
                })
            );
        }
        for bad in ["1.5ns", "0.0000000001s", "0.0000000005"] {
            assert_eq!(
                parse(bad),
                Err(DurationError::FinerThanNanosecond { text: text(bad) })
            );
        }
        for bad in [
            "18446744073709551616ns",
            "99999999999999999999s",
            "5124096h",
        ] {
            assert_eq!(parse(bad), Err(DurationError::TooLarge { text: text(bad) }));
        }
        let msg = parse("5x").unwrap_err().to_string();
        assert!(msg.contains("\"5x\"") && msg.contains("\"x\""), "{msg}");
    }

    #[test]
    fn test_duration_display() {
        for (ns, text) in [
            (0, "0s"),
            (1, "1ns"),
            (999, "999ns"),
            (5_000, "5us"),
            (1_500, "1.5us"),
            (1_500_000, "1.5ms"),
            (500_000_000, "500ms"),
            (999_999_999, "999.999999ms"),
            (4_000_000_000, "4s"),
            (12_500_000_000, "12.5s"),
            (12_000_000_001, "12.000000001s"),
            (3_600_000_000_000, "3600s"),
        ] {
            assert_eq!(VirtNanos(ns).to_string(), text);
        }
        assert_eq!(format!("[{:>6}]", VirtNanos(4_000_000_000)), "[    4s]");
    }

    #[test]
    fn test_duration_display_round_trips() {
        let mut values = vec![0, 1, u64::MAX, u64::MAX - 1];
        for p in 0..20 {
            let ten = 10u64.pow(p);
            values.extend([ten - 1, ten, ten + 1, ten.wrapping_mul(7) / 3]);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.extend([x, x >> (x % 64)]);
        }
        for v in values {
            assert_eq!(parse(&VirtNanos(v).to_string()), Ok(VirtNanos(v)), "{v}");
        }
    }
}
