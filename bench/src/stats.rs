//! Medians, min/median/max, ratios, and how the reports format numbers.

use serde::Serialize;
use std::time::Duration;

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The median of `values`, which it sorts.
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

pub fn median_u64(values: impl Iterator<Item = u64>) -> Option<u64> {
    let mut v: Vec<f64> = values.map(|x| x as f64).collect();
    median(&mut v).map(|m| m.round() as u64)
}

/// min / median / max of the values.
#[derive(Serialize, Debug, Clone, Copy, Default)]
pub struct Stat {
    pub n: usize,
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

pub fn stat(values: impl IntoIterator<Item = f64>) -> Stat {
    let mut v: Vec<f64> = values.into_iter().collect();
    let m = median(&mut v);
    Stat {
        n: v.len(),
        median: m,
        min: v.first().copied(),
        max: v.last().copied(),
    }
}

/// `a / b`, when both are known and `b` is positive.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Formatting.

/// Whole milliseconds, "-" when unknown.
pub fn opt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

pub fn opt_count(v: Option<u64>) -> String {
    v.map_or("n/a".into(), |v| v.to_string())
}

pub fn opt_rate(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0}"))
}

pub fn opt_rate1(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

pub fn opt_ratio(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.2}x"))
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Milliseconds with three significant digits or so, "-" when unknown.
pub fn fmt_ms(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v < 10.0 => format!("{v:.2}"),
        Some(v) if v < 100.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
    }
}

/// "median [min..max]" ([`fmt_ms`]), or the median alone for a single value.
pub fn fmt_stat(s: &Stat) -> String {
    match (s.median, s.min, s.max) {
        (Some(m), Some(lo), Some(hi)) if s.n > 1 => {
            format!(
                "{} [{}..{}]",
                fmt_ms(Some(m)),
                fmt_ms(Some(lo)),
                fmt_ms(Some(hi))
            )
        }
        (Some(m), _, _) => fmt_ms(Some(m)),
        _ => "-".into(),
    }
}

/// Seconds, one decimal; `-` when unknown.
pub fn fmt_s(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

/// FNV-1a 64 of `bytes`, as hex.
pub fn fnv1a(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), "cbf29ce484222325");
        assert_eq!(fnv1a(b"a"), "af63dc4c8601ec8c");
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn stats_are_min_median_max() {
        let s = stat([3.0, 1.0, 2.0, 10.0]);
        assert_eq!(
            (s.n, s.median, s.min, s.max),
            (4, Some(2.5), Some(1.0), Some(10.0))
        );
        assert_eq!(fmt_stat(&s), "2.50 [1.00..10.0]");
        assert_eq!(fmt_stat(&stat([])), "-");
    }
}
