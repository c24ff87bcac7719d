//! `detvisor report` on the shared stale-read campaign (tests/common/stale.rs):
//! HTML, JSON, JUnit and the terminal summary from one real campaign
//! directory, the same directory given twice merged without doubling its
//! finding, and the HTML page opened in Debian's headless Chromium (its
//! tables and plots in the DOM, no console error, a screenshot).

mod common;

use common::stale::*;
use common::*;
use std::path::Path;
use std::process::Command;

/// Headless Chromium on `args` (as root it needs `--no-sandbox`); its
/// status, stdout and stderr.
fn chromium(args: &[&str]) -> std::process::Output {
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .args(args)
        .output()
        .expect("chromium runs (scripts/test installs Debian's chromium)");
    eprintln!(
        "$ chromium {}\n--- status: {:?}\n--- stderr:\n{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// What Chromium logged as the page's own errors: console messages and
/// uncaught script errors.
fn page_errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught") || l.contains(":ERROR:CONSOLE"))
        .collect()
}

#[test]
fn test_report_of_the_stale_campaign_in_html_json_junit_and_a_browser() {
    let dir = stale_campaign();
    let out = tempfile::tempdir().unwrap();
    let (html, json, junit) = (
        out.path().join("report.html"),
        out.path().join("report.json"),
        out.path().join("junit.xml"),
    );
    let run = detvisor(&[
        "report",
        dir.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--junit",
        junit.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));

    // The JSON: versioned; the finding with its schedule, moments named
    // as the debugger names them, and its replay command.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["version"], 1);
    assert_eq!(
        report["exploration"]["branches"],
        BRANCHES.parse::<u64>().unwrap()
    );
    assert!(
        report["exploration"]["phases"]["root_ms"].as_u64().unwrap() > 0,
        "boot to root is recorded: {}",
        report["exploration"]
    );
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:?}");
    let finding = &findings[0];
    let finding_dir = stale_finding();
    assert!(finding["key"]
        .as_str()
        .unwrap()
        .starts_with("checker:linearizability:"));
    assert_eq!(
        finding["moment"],
        format!("{}@failure", finding_dir.display())
    );
    assert_eq!(
        finding["replay"],
        format!("detvisor replay {}", finding_dir.display())
    );
    assert!(!finding["faults"].as_array().unwrap().is_empty());
    assert!(finding["checker_html"]
        .as_str()
        .unwrap()
        .contains("Not linearizable"));
    assert!(finding["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["kind"] == "fault"));
    assert!(!finding["logs"]["workload"].as_array().unwrap().is_empty());
    let checker = report["properties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "linearizability")
        .expect("the checker's property");
    assert_eq!(checker["verdict"], "failed");
    assert_eq!(
        checker["counterexamples"][0]["moment"],
        format!("{}@failure", finding_dir.display())
    );

    // JUnit: the checker's case fails with the replay command.
    let xml = std::fs::read_to_string(&junit).unwrap();
    let doc = roxmltree::Document::parse(&xml).expect("well-formed JUnit XML");
    let case = doc
        .descendants()
        .find(|n| n.has_tag_name("testcase") && n.attribute("name") == Some("linearizability"))
        .expect("a test case per property");
    let failure = case
        .children()
        .find(|n| n.has_tag_name("failure"))
        .expect("it failed");
    assert!(failure
        .text()
        .unwrap_or_default()
        .contains(finding["replay"].as_str().unwrap()));

    // The terminal summary, and the same directory twice: merged, its
    // finding once (the other copy listed), its branches counted twice.
    let summary = detvisor(&["report", dir.to_str().unwrap()]);
    assert_eq!(summary.status.code(), Some(0));
    let text = stdout(&summary);
    assert!(text.starts_with("REPORT  1 campaign dir(s)"), "{text}");
    assert!(text.contains(finding["replay"].as_str().unwrap()), "{text}");
    let twice = out.path().join("twice.json");
    let run = detvisor(&[
        "report",
        dir.to_str().unwrap(),
        dir.to_str().unwrap(),
        "--json",
        twice.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let twice: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&twice).unwrap()).unwrap();
    assert_eq!(twice["findings"].as_array().unwrap().len(), 1);
    assert_eq!(twice["findings"][0]["also_in"].as_array().unwrap().len(), 1);
    assert_eq!(
        twice["exploration"]["branches"],
        2 * BRANCHES.parse::<u64>().unwrap()
    );

    // Against a baseline that knows the finding and an entry found no
    // more: known with its note, and the other possibly fixed.
    let baseline = out.path().join("triage.toml");
    std::fs::write(
        &baseline,
        format!(
            "[finding.\"{}\"]\nstatus = \"known\"\nnote = \"upstream #123\"\n\n\
             [finding.\"checker:linearizability:gone\"]\nstatus = \"ignored\"\nnote = \"old\"\n",
            finding["key"].as_str().unwrap()
        ),
    )
    .unwrap();
    let triaged = out.path().join("triaged.json");
    let run = detvisor(&[
        "report",
        dir.to_str().unwrap(),
        "--baseline",
        baseline.to_str().unwrap(),
        "--json",
        triaged.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let triaged: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&triaged).unwrap()).unwrap();
    assert_eq!(
        triaged["findings"][0]["triage"],
        serde_json::json!({"status": "known", "note": "upstream #123"})
    );
    assert_eq!(
        triaged["possibly_fixed"][0]["key"],
        "checker:linearizability:gone"
    );

    open_in_chromium(&html, out.path());
}

/// The page in headless Chromium: its DOM has the tables and the plots,
/// nothing it logged is a page error, and the screenshot is a PNG.
fn open_in_chromium(html: &Path, out: &Path) {
    let url = format!("file://{}", html.display());
    let dom = chromium(&["--dump-dom", &url]);
    assert_eq!(dom.status.code(), Some(0));
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    assert!(page_errors(&String::from_utf8_lossy(&dom.stderr)).is_empty());
    for (what, want) in [
        ("<table class=\"properties\"", 1),
        ("<table class=\"faults\"", 1),
        ("<table class=\"exploration\"", 1),
        ("<svg", 5),
        ("<iframe class=\"checker\"", 1),
    ] {
        assert_eq!(dom_text.matches(what).count(), want, "{what} in the DOM");
    }
    let png = out.join("report.png");
    let shot = chromium(&[
        &format!("--screenshot={}", png.display()),
        "--window-size=1280,2000",
        &url,
    ]);
    assert_eq!(shot.status.code(), Some(0));
    assert!(page_errors(&String::from_utf8_lossy(&shot.stderr)).is_empty());
    let bytes = std::fs::read(&png).expect("a screenshot");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        bytes.len() > 20_000,
        "more than a blank page: {} bytes",
        bytes.len()
    );
}
