//! Spilling through the engine on the simulated run: moments let go are
//! written and loaded back, and `spill/`'s bound and a disk that fills: a
//! moment that cannot be kept on disk is let go unwritten, a line says so,
//! and the campaign makes the same search as one that only replays.

use super::*;

/// A campaign of 14 branches under a memory budget of three checkpoints,
/// its spill bounded by `spill_limit`, in `dir`: its summary, and how many
/// requests of each name its run answered; checked to make the same
/// search, and find the same, as with one checkpoint and replays only.
fn under_a_tiny_memory_budget(
    dir: &Path,
    spill_limit: Option<u64>,
) -> (CampaignSummary, impl Fn(&str) -> usize) {
    let replayed = tempfile::tempdir().unwrap();
    let (_, one) = campaign(replayed.path(), 1, 14);
    let calls = Arc::new(Mutex::new(Vec::new()));
    let sim = Sim {
        calls: calls.clone(),
        ..Sim::default()
    };
    let mut spec = spec(8);
    spec.checkpoint_memory = Some(3_000);
    spec.spill_limit = spill_limit;
    let (summary, nodes) = campaign_on(sim, dir, spec, 14);
    assert_eq!(summary.branches, 14);
    assert_eq!(nodes, one, "the same search");
    let a = Store::open(replayed.path()).unwrap().findings().unwrap();
    let b = Store::open(dir).unwrap().findings().unwrap();
    assert_eq!(a, b);
    assert!(
        !dir.join(crate::spill::SPILL_DIR).exists(),
        "spill/ is removed at the end"
    );
    let count = move |name: &str| calls.lock().unwrap().iter().filter(|c| *c == name).count();
    (summary, count)
}

#[test]
fn test_a_tiny_memory_budget_spills_moments_and_loads_them_back_for_the_same_search() {
    let dir = tempfile::tempdir().unwrap();
    let (summary, count) = under_a_tiny_memory_budget(dir.path(), None);
    assert_eq!(summary.spill.written, count("Spill") as u64);
    assert!(count("Spill") > 0);
    assert!(count("LoadInPlace") > 0);
}

/// Two workers under a tiny memory budget spill to their own folders (a
/// moment both let go is written by each) and make the same search as two
/// workers that only replay.
#[test]
fn test_workers_spill_to_their_own_folders_for_the_same_search() {
    let replayed = tempfile::tempdir().unwrap();
    let sims = || vec![jittery(1), jittery(2)];
    let (_, one, found) = campaign_with(replayed.path(), 2, 16, sims());
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<Sim> = sims()
        .into_iter()
        .map(|sim| Sim {
            calls: calls.clone(),
            ..sim
        })
        .collect();
    let count = |name: &str| calls.lock().unwrap().iter().filter(|c| *c == name).count();
    let mut spec = spec(8);
    spec.batch_width = 2;
    spec.checkpoint_memory = Some(3_000);
    let summary = try_campaign(dir.path(), spec, 16, workers).unwrap();
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.nodes().unwrap(), one, "the same search");
    assert_eq!(store.findings().unwrap(), found);
    assert_eq!(summary.workers, 2);
    assert_eq!(summary.spill.written, count("Spill") as u64);
    assert!(count("Spill") > 0 && count("LoadInPlace") > 0);
    assert!(!dir.path().join(crate::spill::SPILL_DIR).exists());
}

/// The simulated run on a full disk: every spill writes part of its
/// snapshot into a work directory, then fails as a full disk makes it
/// fail; the request after the reset back to the present finds that work
/// directory gone.
struct FullDisk(Sim, Option<std::path::PathBuf>);

impl Runner for FullDisk {
    fn call(&mut self, request: Request) -> std::result::Result<Response, String> {
        // After the reset back to the present, which comes first.
        if !matches!(request, Request::Reset { .. }) {
            if let Some(partial) = self.1.take() {
                assert!(
                    !partial.exists(),
                    "{} is left on the full disk",
                    partial.display()
                );
            }
        }
        if let Request::Spill { dir, id, .. } = &request {
            let partial = dir.join(format!(".tmp-{id}"));
            std::fs::create_dir(&partial).map_err(|e| e.to_string())?;
            std::fs::write(partial.join("memory.img"), [1u8; 4096]).map_err(|e| e.to_string())?;
            self.1 = Some(partial);
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
    let runner: Box<dyn Runner + Send> = Box::new(FullDisk(Sim::default(), None));
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
        wall: None,
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
