//! The report as JUnit XML, the format CI systems read: one test suite,
//! `properties`, with one test case per property (its name the property's,
//! its class name its kind). A failed property is a failure whose message
//! is why and whose text names each finding that fails it with its replay
//! command; a property never reached where that is allowed is skipped; a
//! passed one is a success.

use crate::model::*;
use quick_junit::{NonSuccessKind, TestCase, TestCaseStatus, TestSuite};

/// Why the XML could not be made.
#[derive(Debug, thiserror::Error)]
#[error("writing the JUnit XML")]
pub struct JunitError(#[source] quick_junit::SerializeError);

/// The JUnit XML of `report`.
pub fn junit(report: &Report) -> Result<String, JunitError> {
    let mut junit = quick_junit::Report::new("detvisor campaign");
    let mut suite = TestSuite::new("properties");
    for p in &report.properties {
        let status = match p.verdict {
            Verdict::Passed => TestCaseStatus::success(),
            Verdict::NeverReached => {
                let mut status = TestCaseStatus::skipped();
                status.set_message("never reached");
                status
            }
            Verdict::Failed => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                let findings: Vec<&FindingReport> = report
                    .findings
                    .iter()
                    .filter(|f| p.findings.contains(&f.key))
                    .collect();
                let message = match (&p.why, findings.first()) {
                    (Some(why), _) => format!("{}: {why}", p.name),
                    (None, Some(f)) => f.summary.clone(),
                    (None, None) => format!("{} failed", p.name),
                };
                status.set_message(message);
                status.set_type(p.kind.word());
                let mut text = String::new();
                for f in &findings {
                    text.push_str(&format!(
                        "finding {:04} ({}): {}\nfailed at {}\nreplay: {}\n",
                        f.number, f.key, f.summary, f.moment, f.replay
                    ));
                    for copy in &f.also_in {
                        text.push_str(&format!("also found: {}\n", copy.replay));
                    }
                }
                if findings.is_empty() {
                    text.push_str(
                        "no finding: the campaign as a whole fails it (no history to replay)\n",
                    );
                }
                status.set_description(text);
                status
            }
        };
        let mut case = TestCase::new(p.name.clone(), status);
        case.set_classname(format!("{}.{}", p.kind.word(), p.key));
        suite.add_test_case(case);
    }
    junit.add_test_suite(suite);
    junit.to_string().map_err(JunitError)
}
