//! Parsing of sizes and durations given on the command line.

use anyhow::{bail, Context, Result};
use vmm::VirtNanos;

/// "512M", "1G", "64m", "268435456" (bytes) -> bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let (digits, mult) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (t, 1u64),
        Some((i, _)) => {
            let unit = t[i..].to_ascii_lowercase();
            let mult = match unit.as_str() {
                "k" | "kb" | "kib" => 1 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                "b" => 1,
                _ => bail!("unparsable size {text:?}: unknown unit {unit:?} (use K, M or G)"),
            };
            (&t[..i], mult)
        }
    };
    if digits.is_empty() {
        bail!("unparsable size {text:?}: no number");
    }
    let n: u64 = digits
        .parse()
        .with_context(|| format!("unparsable size {text:?}"))?;
    n.checked_mul(mult)
        .with_context(|| format!("size {text:?} is too large"))
}

/// "30s", "500ms", "10m", "1h", "2.5s", "600" (seconds) -> virtual nanoseconds.
pub fn parse_duration(text: &str) -> Result<VirtNanos> {
    let t = text.trim();
    let split = t
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map(|(i, _)| i)
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: f64 = match unit {
        "" | "s" => 1e9,
        "ms" => 1e6,
        "us" => 1e3,
        "ns" => 1.0,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        _ => {
            bail!("unparsable duration {text:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h)")
        }
    };
    let value: f64 = number
        .parse()
        .with_context(|| format!("unparsable duration {text:?}"))?;
    let nanos = value * scale;
    if !nanos.is_finite() || nanos < 0.0 || nanos > u64::MAX as f64 {
        bail!("duration {text:?} is out of range");
    }
    Ok(VirtNanos(nanos.round() as u64))
}

/// A link latency: a duration (`5ms`) or a uniform range (`1ms..10ms`).
pub fn parse_latency(text: &str) -> Result<devices::LatencyDist> {
    Ok(match text.split_once("..") {
        Some((min, max)) => devices::LatencyDist::Uniform {
            min: parse_duration(min)?,
            max: parse_duration(max)?,
        },
        None => devices::LatencyDist::Fixed(parse_duration(text)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_parse_size_units() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12X").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn test_parse_duration_units() {
        assert_eq!(parse_duration("30s").unwrap(), VirtNanos::from_secs(30));
        assert_eq!(parse_duration("500ms").unwrap(), VirtNanos(500_000_000));
        assert_eq!(parse_duration("10m").unwrap(), VirtNanos::from_secs(600));
        assert_eq!(parse_duration("2.5").unwrap(), VirtNanos(2_500_000_000));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("").is_err());
    }
}
