//! Units of virtual time. The guest never sees host time: every clock it can
//! read is derived from a `VirtNanos` that the VMM advances deterministically.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, Sub};

/// A point (or span) on the virtual timeline, in nanoseconds since the VM was created.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
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

impl fmt::Display for VirtNanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0 / 1_000_000_000;
        let frac = self.0 % 1_000_000_000;
        write!(f, "{secs}.{frac:09}s")
    }
}
