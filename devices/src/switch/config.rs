//! How links behave: the latency distributions, a link's configuration and
//! the exact arithmetic of draws and probabilities (see the switch's module
//! documentation, "Numbers").

use super::SwitchError;
use crate::time::VirtNanos;
use rand_chacha::ChaCha20Rng;
use rand_core::RngCore;
use serde::{Deserialize, Serialize};

/// How long a frame takes on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LatencyDist {
    /// Always this long.
    Fixed(VirtNanos),
    /// Uniform over `min..=max`.
    Uniform { min: VirtNanos, max: VirtNanos },
    /// Bell-shaped over `min..=max` around the midpoint: the mean of `terms`
    /// uniform draws over `min..=max` (Irwin-Hall). 1 term is uniform; 4 to
    /// 12 look normal.
    Normal {
        min: VirtNanos,
        max: VirtNanos,
        terms: u8,
    },
}

/// The longest latency a link may have (a minute): a frame waits at most
/// this long in the switch, which bounds the frames a guest can keep in
/// flight together with [`super::MAX_IN_FLIGHT`].
pub const MAX_LATENCY: VirtNanos = VirtNanos(60_000_000_000);

impl LatencyDist {
    /// The longest latency this distribution draws.
    pub fn max(&self) -> VirtNanos {
        match *self {
            LatencyDist::Fixed(latency) => latency,
            LatencyDist::Uniform { min, max } | LatencyDist::Normal { min, max, .. } => {
                min.max(max)
            }
        }
    }

    /// Checks `min <= max`, `terms >= 1` and at most [`MAX_LATENCY`].
    pub fn validate(&self) -> Result<(), SwitchError> {
        if self.max() > MAX_LATENCY {
            return Err(SwitchError::InvalidConfig {
                reason: format!("latency {} is above the largest, {MAX_LATENCY}", self.max()),
            });
        }
        match *self {
            LatencyDist::Fixed(_) => Ok(()),
            LatencyDist::Uniform { min, max } | LatencyDist::Normal { min, max, .. }
                if min > max =>
            {
                Err(SwitchError::InvalidConfig {
                    reason: format!("latency minimum {min} is above its maximum {max}"),
                })
            }
            LatencyDist::Normal { terms: 0, .. } => Err(SwitchError::InvalidConfig {
                reason: "a normal latency needs at least one term".into(),
            }),
            _ => Ok(()),
        }
    }

    /// Draws a latency. Total on any value: bounds given the wrong way
    /// round are swapped, 0 terms count as 1 (only a state written by hand
    /// can hold either). Uses no draw for `Fixed`, one for `Uniform` and
    /// `terms` for `Normal`.
    pub(super) fn sample(&self, rng: &mut ChaCha20Rng) -> VirtNanos {
        match *self {
            LatencyDist::Fixed(latency) => latency,
            LatencyDist::Uniform { min, max } => VirtNanos(draw_between(rng, min.0, max.0)),
            LatencyDist::Normal { min, max, terms } => {
                let (low, high) = (min.0.min(max.0), min.0.max(max.0));
                let terms = u128::from(terms.max(1));
                let sum: u128 = (0..terms)
                    .map(|_| u128::from(draw_between(rng, 0, high - low)))
                    .sum();
                // The mean of draws in 0..=high-low is in that range too.
                VirtNanos(low + (sum / terms) as u64)
            }
        }
    }
}

/// The behaviour of one directed link. Probabilities are in `0.0..=1.0`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct NetworkConfig {
    pub latency: LatencyDist,
    /// Probability that a frame is lost.
    #[serde(with = "exact_f64")]
    pub loss: f64,
    /// Probability that a frame arrives twice.
    #[serde(with = "exact_f64")]
    pub duplicate: f64,
    /// Probability that a copy is held back by `reorder_delay`.
    #[serde(with = "exact_f64")]
    pub reorder: f64,
    /// The extra delay of a reordered copy.
    pub reorder_delay: LatencyDist,
}

impl NetworkConfig {
    /// A link that delivers every frame once, in order, after `latency`.
    pub fn reliable(latency: LatencyDist) -> Self {
        NetworkConfig {
            latency,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: LatencyDist::Fixed(VirtNanos::ZERO),
        }
    }

    /// Checks that the probabilities are numbers in `0.0..=1.0` and the
    /// distributions well formed.
    pub fn validate(&self) -> Result<(), SwitchError> {
        for (name, p) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(SwitchError::InvalidConfig {
                    reason: format!("{name} probability {p} is not in 0..=1"),
                });
            }
        }
        self.latency.validate()?;
        self.reorder_delay.validate()
    }
}

/// Bit-for-bit equality of the probabilities, so that the relation is
/// total and a saved state compares equal to its restored copy.
impl PartialEq for NetworkConfig {
    fn eq(&self, other: &Self) -> bool {
        self.latency == other.latency
            && self.loss.to_bits() == other.loss.to_bits()
            && self.duplicate.to_bits() == other.duplicate.to_bits()
            && self.reorder.to_bits() == other.reorder.to_bits()
            && self.reorder_delay == other.reorder_delay
    }
}

impl Eq for NetworkConfig {}

/// Whether the 64 random bits `x` hit probability `p`.
pub(super) fn chance(x: u64, p: f64) -> bool {
    const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
    // Exact: x >> 11 has 53 bits, and scaling by a power of two is exact.
    ((x >> 11) as f64) * SCALE < p
}

/// A draw uniform over `a..=b` (either order), from one 64-bit word by
/// multiply-shift: deterministic, one word per draw, bias below 2^-64 per
/// value.
fn draw_between(rng: &mut ChaCha20Rng, a: u64, b: u64) -> u64 {
    let (low, high) = (a.min(b), a.max(b));
    let x = rng.next_u64();
    let span = high - low;
    if span == u64::MAX {
        return x;
    }
    low + ((u128::from(x) * (u128::from(span) + 1)) >> 64) as u64
}

/// Serializes an f64 as the string of its shortest round-trip notation and
/// reads it back exactly (serde_json's own float parsing may be off by one
/// unit in the last place). Plain JSON numbers are accepted on input.
pub(super) mod exact_f64 {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};
    use std::fmt;

    pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{value:?}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        deserializer.deserialize_any(ExactF64)
    }

    struct ExactF64;

    impl Visitor<'_> for ExactF64 {
        type Value = f64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number, or a string holding one")
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<f64, E> {
            value.parse().map_err(E::custom)
        }

        fn visit_f64<E: de::Error>(self, value: f64) -> Result<f64, E> {
            Ok(value)
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<f64, E> {
            Ok(value as f64)
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<f64, E> {
            Ok(value as f64)
        }
    }
}
