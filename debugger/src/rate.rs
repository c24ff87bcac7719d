//! A failure rate and its 95% Wilson score interval: the one estimate
//! `verify` and `likelihood` both report.

use serde::{Deserialize, Serialize};

/// z for a two-sided 95% interval.
const Z95: f64 = 1.959_963_984_540_054;

/// A failure rate with its 95% Wilson score interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub failed: u32,
    pub runs: u32,
    pub rate: f64,
    pub low: f64,
    pub high: f64,
}

impl Rate {
    /// `failed` of `runs`, with the Wilson interval, which
    /// stays inside 0..1 and is not empty at 0 or `runs` failures.
    pub fn wilson(failed: u32, runs: u32) -> Rate {
        let n = f64::from(runs.max(1));
        let p = f64::from(failed) / n;
        let z2 = Z95 * Z95;
        let denominator = 1.0 + z2 / n;
        let center = (p + z2 / (2.0 * n)) / denominator;
        let half = Z95 / denominator * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
        // Exactly 0 and 1 at the ends (where the rounding would leave a
        // hair); no runs tell nothing.
        let (low, high) = if runs == 0 {
            (0.0, 1.0)
        } else {
            (
                if failed == 0 {
                    0.0
                } else {
                    (center - half).max(0.0)
                },
                if failed >= runs {
                    1.0
                } else {
                    (center + half).min(1.0)
                },
            )
        };
        Rate {
            failed,
            runs,
            rate: if runs == 0 { 0.0 } else { p },
            low,
            high,
        }
    }
}

/// `3/32 = 9.4% (95% CI 3.2%-24.2%)`.
impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} = {:.1}% (95% CI {:.1}%-{:.1}%)",
            self.failed,
            self.runs,
            100.0 * self.rate,
            100.0 * self.low,
            100.0 * self.high
        )
    }
}
