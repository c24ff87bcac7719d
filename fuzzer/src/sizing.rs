//! How much memory a worker's live checkpoints may hold when the campaign
//! file leaves it to detvisor (neither `search.live_checkpoints` nor
//! `search.checkpoint_memory` given; [`crate::spec::CampaignSpec`]'s
//! `size_checkpoints_from_memory`).
//!
//! Going back to a moment that is not live costs a load from `spill/` or a
//! replay of its slices, a reset to a live one tens of milliseconds: the
//! more moments stay live, the less a campaign spends going back. So the
//! workers' checkpoints get half of what the machine that holds the runs
//! has spare when the campaign starts (`MemAvailable`, less each worker's
//! run and a reserve for everything else), split evenly between them. The
//! other half stays free for the host's page cache and whatever else runs
//! there. Where the runs are in helper VMs, each helper VM is given its
//! share on top of what its run needs, so the bytes are there to hold.

/// Left alone for the rest of the machine, before the spare is split.
pub const RESERVE_BYTES: u64 = 1 << 30;
/// Below this a share is not worth sizing by: the count-based default
/// (`DEFAULT_LIVE_CHECKPOINTS`) applies instead.
pub const MIN_SHARE_BYTES: u64 = 256 << 20;
/// The most one worker's checkpoints are given, however much is spare.
pub const MAX_SHARE_BYTES: u64 = 64 << 30;

/// Each worker's share of `available` bytes (what the machine has
/// available now) for its checkpoints, when each of the `workers` runs
/// needs `run_bytes` of it besides; `None` when too little is spare.
pub fn checkpoint_share(available: u64, workers: u32, run_bytes: u64) -> Option<u64> {
    let workers = u64::from(workers.max(1));
    let spare = available
        .checked_sub(workers.saturating_mul(run_bytes))?
        .checked_sub(RESERVE_BYTES)?;
    let share = (spare / 2 / workers).min(MAX_SHARE_BYTES);
    (share >= MIN_SHARE_BYTES).then_some(share)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn test_half_of_the_spare_split_between_the_workers() {
        // 20 GiB available, one worker whose helper VM needs 3 GiB: 16
        // spare after the reserve, 8 for the checkpoints.
        assert_eq!(checkpoint_share(20 * GIB, 1, 3 * GIB), Some(8 * GIB));
        // Two of them: 13 spare, 6.5 for both, 3.25 each.
        assert_eq!(checkpoint_share(20 * GIB, 2, 3 * GIB), Some(13 * GIB / 4));
    }

    #[test]
    fn test_too_little_spare_is_no_share() {
        assert_eq!(checkpoint_share(4 * GIB, 1, 3 * GIB), None);
        assert_eq!(checkpoint_share(2 * GIB, 1, 3 * GIB), None);
        assert_eq!(checkpoint_share(0, 0, 0), None);
        // Just enough: 512 MiB spare, 256 MiB for one worker.
        assert_eq!(
            checkpoint_share(4 * GIB + 512 * (1 << 20), 1, 3 * GIB),
            Some(MIN_SHARE_BYTES)
        );
    }

    #[test]
    fn test_a_huge_machine_is_capped() {
        assert_eq!(checkpoint_share(4096 * GIB, 1, GIB), Some(MAX_SHARE_BYTES));
    }
}
