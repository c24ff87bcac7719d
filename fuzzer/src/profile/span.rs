//! The ranges of a fault profile (`"1s..10s"`, `"10ppm..500ppm"`,
//! `"0.05..0.5"`, or one value for a fixed one), parsed and printed here
//! only.

use devices::switch::Probability;
use devices::VirtNanos;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A value a [`Span`] ranges over.
pub trait Bound: Copy + fmt::Debug + PartialEq {
    /// What the value is, for errors (`a duration`).
    const WHAT: &'static str;
    fn parse_bound(text: &str) -> Result<Self, String>;
    fn bound_text(&self) -> String;
    fn at_most(&self, other: &Self) -> bool;
}

/// `min..=max`, written `"<min>..<max>"`, or `"<value>"` when they are equal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span<T> {
    pub min: T,
    pub max: T,
}

/// A drift rate's magnitude in parts per million (the profile draws its sign).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ppm(pub u32);

/// Why a span's text is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpanError {
    #[error("{text:?}: {problem} (write <min>..<max> or one value, e.g. {example})")]
    Bound {
        text: String,
        problem: String,
        example: &'static str,
    },
    #[error("{text:?}: the minimum is above the maximum")]
    Order { text: String },
}

impl<T: Bound> Span<T> {
    pub fn new(min: T, max: T) -> Self {
        Span { min, max }
    }

    pub fn fixed(value: T) -> Self {
        Span {
            min: value,
            max: value,
        }
    }

    /// Whether `min <= max`.
    pub fn is_ordered(&self) -> bool {
        self.min.at_most(&self.max)
    }

    pub fn parse(text: &str) -> Result<Self, SpanError> {
        let bound = |t: &str| {
            T::parse_bound(t.trim()).map_err(|problem| SpanError::Bound {
                text: text.to_owned(),
                problem,
                example: example::<T>(),
            })
        };
        let span = match text.split_once("..") {
            Some((min, max)) => Span::new(bound(min)?, bound(max)?),
            None => Span::fixed(bound(text)?),
        };
        if !span.is_ordered() {
            return Err(SpanError::Order {
                text: text.to_owned(),
            });
        }
        Ok(span)
    }
}

fn example<T: Bound>() -> &'static str {
    match T::WHAT {
        "a duration" => "1s..10s",
        "a drift rate" => "10ppm..500ppm",
        _ => "0.05..0.5",
    }
}

impl<T: Bound> fmt::Display for Span<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.min == self.max {
            f.write_str(&self.min.bound_text())
        } else {
            write!(f, "{}..{}", self.min.bound_text(), self.max.bound_text())
        }
    }
}

impl<T: Bound> Serialize for Span<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de, T: Bound> Deserialize<'de> for Span<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Span::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl Bound for VirtNanos {
    const WHAT: &'static str = "a duration";

    fn parse_bound(text: &str) -> Result<Self, String> {
        text.parse::<VirtNanos>().map_err(|e| e.to_string())
    }

    fn bound_text(&self) -> String {
        self.to_string()
    }

    fn at_most(&self, other: &Self) -> bool {
        self <= other
    }
}

impl Bound for Ppm {
    const WHAT: &'static str = "a drift rate";

    fn parse_bound(text: &str) -> Result<Self, String> {
        if text.starts_with('-') {
            return Err("a magnitude, without a sign (the sign is drawn)".into());
        }
        let ppm = run::units::parse_ppm(text).map_err(|e| e.to_string())?;
        Ok(Ppm(ppm.unsigned_abs()))
    }

    fn bound_text(&self) -> String {
        format!("{}ppm", self.0)
    }

    fn at_most(&self, other: &Self) -> bool {
        self <= other
    }
}

impl Bound for Probability {
    const WHAT: &'static str = "a probability";

    fn parse_bound(text: &str) -> Result<Self, String> {
        text.parse::<Probability>()
            .map_err(|_| "not a probability (a number in 0..=1)".to_string())
    }

    fn bound_text(&self) -> String {
        self.to_string()
    }

    fn at_most(&self, other: &Self) -> bool {
        self.get() <= other.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_spans_parse_print_and_refuse() {
        let d = Span::<VirtNanos>::parse("1s..2.5s").unwrap();
        assert_eq!(
            d,
            Span::new(VirtNanos::from_secs(1), VirtNanos(2_500_000_000))
        );
        assert_eq!(d.to_string(), "1s..2.5s");
        let fixed = Span::<VirtNanos>::parse("250ms").unwrap();
        assert_eq!(fixed.to_string(), "250ms");
        assert_eq!(Span::<Ppm>::parse("10ppm..500ppm").unwrap().max, Ppm(500));
        let p = Span::<Probability>::parse("0.05..0.5").unwrap();
        assert_eq!(p.to_string(), "0.05..0.5");
        let err = |e: SpanError| e.to_string();
        assert_eq!(
            err(Span::<VirtNanos>::parse("5s..1s").unwrap_err()),
            "\"5s..1s\": the minimum is above the maximum"
        );
        assert!(err(Span::<VirtNanos>::parse("soon..1s").unwrap_err())
            .contains("unparsable duration \"soon\""));
        assert!(err(Span::<Probability>::parse("0.5..1.5").unwrap_err())
            .contains("\"0.5..1.5\": not a probability (a number in 0..=1)"));
        assert!(err(Span::<Ppm>::parse("-5ppm..5ppm").unwrap_err()).contains("without a sign"));
        assert!(err(Span::<Ppm>::parse("5..7").unwrap_err()).contains("e.g. 10ppm..500ppm"));
    }
}
