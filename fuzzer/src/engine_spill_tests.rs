//! `spill/`'s bound and a disk that fills: a moment that cannot be kept
//! on disk is let go unwritten, a line says so, and the campaign makes the
//! same search as one that only replays.

use super::*;

/// The simulated run on a full disk: every spill writes part of its
/// snapshot, then fails as a full disk makes it fail.
struct FullDisk(Sim);

impl Runner for FullDisk {
    fn call(&mut self, request: Request) -> std::result::Result<Response, String> {
        if let Request::Spill { dir, id, .. } = &request {
            let path = dir.join(id);
            std::fs::create_dir(&path).map_err(|e| e.to_string())?;
            std::fs::write(path.join("memory.img"), [1u8; 4096]).map_err(|e| e.to_string())?;
            return Err(format!(
                "writing the moment {id}: {}",
                std::io::Error::from_raw_os_error(libc::ENOSPC)
            ));
        }
        self.0.call(request)
    }
}

/// What the spill said, and whether the search was the one of a campaign
/// that only replays.
fn spill_warnings(summary: &CampaignSummary) -> Vec<&String> {
    summary
        .warnings
        .iter()
        .filter(|w| w.contains("spill/"))
        .collect()
}

/// A bound below one checkpoint: the first moment let go is written,
/// found too large, removed, and no other is written; the campaign goes on
/// to the same search, saying so once.
#[test]
fn test_a_spill_bound_below_one_checkpoint_lets_moments_go_unwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, count) = under_a_tiny_memory_budget(dir.path(), Some(1));
    assert_eq!(count("Spill"), 1, "one write tried, then none");
    assert_eq!(count("LoadInPlace"), 0);
    assert_eq!(summary.spill.written, 0);
    let said = spill_warnings(&summary);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].contains("spill/ reached its bound"), "{said:?}");
}

/// A write that fails (a full disk): what it wrote is removed, the moment
/// is let go unwritten, and the campaign goes on to the same search,
/// saying why once.
#[test]
fn test_a_spill_write_that_fails_lets_the_moment_go_and_the_campaign_goes_on() {
    let replayed = tempfile::tempdir().unwrap();
    let (_, one) = campaign(replayed.path(), 1, 14);
    let dir = tempfile::tempdir().unwrap();
    let mut spec = spec(8);
    spec.checkpoint_memory = Some(3_000);
    let runner: Box<dyn Runner + Send> = Box::new(FullDisk(Sim::default()));
    let files = tempfile::tempdir().unwrap();
    let run = prepared(files.path());
    let mut engine = Engine::create(
        vec![runner],
        spec,
        &run,
        run.clone(),
        crate::store::NewCampaignDir::claim(dir.path()).unwrap(),
        Box::new(FailJudge::default()),
        Box::new(Draw),
    )
    .unwrap();
    let budget = Budget {
        wall_ms: 0,
        branches: 14,
    };
    let summary = engine.run(budget, &mut Quiet, &|| false).unwrap();
    assert_eq!(summary.branches, 14);
    drop(engine);
    assert_eq!(Store::open(dir.path()).unwrap().nodes().unwrap(), one);
    let said = spill_warnings(&summary);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("writing moment") && said[0].contains("No space left on device"),
        "{said:?}"
    );
    assert_eq!(summary.spill.written, 0);
}
