//! The values of the clock faults (`clock n2 +30s`, `drift n2 +200ppm`): a
//! signed step of a node's CLOCK_REALTIME and a drift rate in parts per
//! million, parsed and printed here only (the fault grammar in
//! [`crate::faults`] uses them). The guest kernel applies them per node
//! (guest-image/patches/0003; see docs/determinism.md, "Per-node clocks").

use crate::units::parse_duration;
use devices::time::DurationError;
use devices::VirtNanos;

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
    use proptest::prelude::*;

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
