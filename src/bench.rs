//! `detvisor bench`: benchmarks that print ratios against baselines run side by side.

use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Repetitions of each measurement.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
}

pub fn run(_args: BenchArgs) -> Result<u8> {
    anyhow::bail!("not implemented yet")
}
