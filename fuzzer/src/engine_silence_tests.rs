//! The warning of a campaign that cannot fail (see `crate::silence`),
//! through the engine on the simulated run, whose stretches hold output
//! and events only unless faults make it report.

use super::*;

/// Draws no fault: the simulated run never reports a property.
struct NoFaults;

impl FaultSource for NoFaults {
    fn draw(&self, _seed: u64, _slice_ns: vmm::VirtNanos) -> Vec<run::faults::Fault> {
        Vec::new()
    }
}

/// The simulated run, whose first records (the root's) hold an SDK record.
struct Reporting(Sim, bool);

impl Runner for Reporting {
    fn call(&mut self, request: Request) -> std::result::Result<Response, String> {
        let take = matches!(request, Request::TakeRecords { .. });
        let mut response = self.0.call(request)?;
        if let (true, false, Response::Records { records }) = (take, self.1, &mut response) {
            self.1 = true;
            records.push(record(1, serde_json::json!({"antithesis_sdk": {}})));
        }
        Ok(response)
    }
}

/// Each warning, with the number of branches reported before it.
#[derive(Default)]
struct Heard(Vec<(u64, String)>, u64);

impl Progress for Heard {
    fn root(&mut self, _: &Position, _: &str) {}
    fn branch(&mut self, _: &BranchReport) {
        self.1 += 1;
    }
    fn finding(&mut self, _: u32, _: &str, _: &str, _: &Path) {}
    fn warning(&mut self, text: &str) {
        self.0.push((self.1, text.to_string()));
    }
}

fn run_heard(mut engine: Engine<'_>, branches: u64) -> (CampaignSummary, Heard) {
    let mut heard = Heard::default();
    let budget = Budget {
        wall: None,
        branches,
    };
    let summary = engine.run(budget, &mut heard, &|| false).unwrap();
    (summary, heard)
}

fn create(dir: &Path, runner: Box<dyn Runner + Send>) -> Engine<'static> {
    let files = tempfile::tempdir().unwrap();
    let run = prepared(files.path());
    let judge = Box::new(FailJudge::default());
    Engine::create(
        vec![runner],
        spec(3),
        &run,
        run.clone(),
        crate::store::NewCampaignDir::claim(dir).unwrap(),
        judge,
        Box::new(NoFaults),
    )
    .unwrap()
}

#[test]
fn test_a_campaign_whose_first_branches_report_nothing_warns_once_and_in_its_summary() {
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let engine = create(dir.path(), Box::new(Sim::default()));

    // Act
    let (summary, heard) = run_heard(engine, 6);
    let resumed = Engine::resume(
        vec![Box::new(Sim::default()) as Box<dyn Runner + Send>],
        dir.path(),
        Box::new(FailJudge::default()),
        |_| Box::new(NoFaults) as Box<dyn FaultSource>,
        |_, run| Ok(run),
    )
    .unwrap();
    let (resumed_summary, resumed_heard) = run_heard(resumed, 8);

    // Assert: once the root and 3 branches are in, and again (once) when
    // resumed, as soon as the root is reached again.
    assert_eq!(heard.0.len(), 1, "{:?}", heard.0);
    let (after, text) = &heard.0[0];
    assert_eq!(*after, 3);
    assert!(text.contains("no SDK record and no history line"), "{text}");
    assert_eq!(summary.warnings, vec![text.clone()]);
    assert_eq!(summary.branches, 6);
    assert_eq!(resumed_heard.0, vec![(0, text.clone())]);
    assert_eq!(resumed_summary.warnings, vec![text.clone()]);
}

#[test]
fn test_a_campaign_whose_root_reports_an_sdk_record_does_not_warn() {
    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let engine = create(dir.path(), Box::new(Reporting(Sim::default(), false)));

    // Act
    let (summary, heard) = run_heard(engine, 6);

    // Assert
    assert!(heard.0.is_empty(), "{:?}", heard.0);
    assert!(summary.warnings.is_empty());
    assert_eq!(summary.branches, 6);
}
