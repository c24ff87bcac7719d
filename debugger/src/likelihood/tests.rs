use super::*;
use crate::budget::{SharedLimits, SharedScope};

const S: u64 = 1_000_000_000;

#[test]
fn test_points_run_from_the_root_to_one_spacing_before_the_failure() {
    let at = |s: &[u64]| s.iter().map(|&n| VirtNanos(n)).collect::<Vec<_>>();
    assert_eq!(
        point_times(VirtNanos(2 * S), VirtNanos(10 * S), 4),
        at(&[2 * S, 4 * S, 6 * S, 8 * S])
    );
    assert_eq!(
        point_times(VirtNanos(2 * S), VirtNanos(10 * S), 1),
        at(&[2 * S])
    );
    // Rounded down, in nanoseconds.
    assert_eq!(point_times(VirtNanos(0), VirtNanos(10), 3), at(&[0, 3, 6]));
    // No overflow near the largest times.
    let late = point_times(VirtNanos(u64::MAX - 8), VirtNanos(u64::MAX), 2);
    assert_eq!(late, at(&[u64::MAX - 8, u64::MAX - 4]));
}

#[test]
fn test_wilson_interval_holds_p_and_stays_inside_0_1() {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-4;
    let (low, high) = wilson(0, 4);
    assert!(close(low, 0.0) && close(high, 0.4899), "{low} {high}");
    let (low, high) = wilson(4, 4);
    assert!(close(low, 0.5101) && close(high, 1.0), "{low} {high}");
    let (low, high) = wilson(2, 4);
    assert!(close(low, 0.1500) && close(high, 0.8500), "{low} {high}");
    let (low, high) = wilson(1, 4);
    assert!(close(low, 0.0456) && close(high, 0.6994), "{low} {high}");
    // Symmetric, around the estimate, narrower with more branches.
    for n in [1, 4, 16, 100] {
        for x in 0..=n {
            let (low, high) = wilson(x, n);
            let (l2, h2) = wilson(n - x, n);
            assert!(close(low, 1.0 - h2) && close(high, 1.0 - l2));
            let p = f64::from(x) / f64::from(n);
            assert!((0.0..=p).contains(&low) && (p..=1.0).contains(&high));
        }
    }
    let width = |n| {
        let (low, high) = wilson(n / 2, n);
        high - low
    };
    assert!(width(16) < width(4) && width(100) < width(16));
    assert_eq!(wilson(0, 0), (0.0, 1.0));
}

#[test]
fn test_branch_seeds_are_fixed_per_base_point_and_branch_and_all_differ() {
    let mut seen = std::collections::BTreeSet::new();
    for base in [1, 2] {
        for point in 0..8 {
            for branch in 0..16 {
                let seed = branch_seed(base, point, branch);
                assert_eq!(seed, branch_seed(base, point, branch));
                assert!(seen.insert(seed), "{base} {point} {branch}");
            }
        }
    }
    // The documented derivation.
    assert_eq!(
        branch_seed(7, 3, 5),
        EntropyStream::new(7, "likelihood-point-3-branch-5").next_u64()
    );
}

/// A measured likelihood as a finding of the coin target would give.
fn sample() -> Likelihood {
    let dir = PathBuf::from("/c/findings/0001");
    let points: Vec<PointEstimate> = [(2, 1), (4, 2), (6, 2), (8, 4)]
        .iter()
        .map(|&(secs, failures)| {
            let at = VirtNanos(secs * S);
            let moment = MomentId::of_source(&dir, When::Time(at));
            let (low, high) = wilson(failures, 4);
            PointEstimate {
                digest: format!("digest-{secs}"),
                planned_ns: at,
                virtual_ns: at,
                branches: 4,
                failures,
                p: f64::from(failures) / 4.0,
                low,
                high,
                outcomes: (0..4)
                    .map(|j| BranchOutcome {
                        seed: branch_seed(1, secs as u32, j),
                        moment: moment.then(
                            Action::Seed {
                                at,
                                seed: branch_seed(1, secs as u32, j),
                            },
                            When::Time(at),
                        ),
                        faults: 0,
                        failed: j < failures,
                        failures: if j < failures {
                            vec!["property:p@f:1".into()]
                        } else {
                            vec![]
                        },
                        end_ns: VirtNanos(12 * S),
                        simulated_ns: VirtNanos(12 * S - at.0),
                    })
                    .collect(),
                moment,
            }
        })
        .collect();
    Likelihood {
        failure: MomentId::of_source(&dir, When::Failure),
        finding: dir,
        key: "property:p@f:1".into(),
        failure_ns: VirtNanos(10 * S),
        root_ns: VirtNanos(2 * S),
        end_ns: VirtNanos(12 * S),
        seed: 1,
        confidence: 0.95,
        points,
        used: Usage::default(),
    }
}

#[test]
fn test_json_names_each_point_its_moment_estimate_interval_and_seeds() {
    let likelihood = sample();
    let json = serde_json::to_value(&likelihood).unwrap();
    assert_eq!(json["key"], "property:p@f:1");
    assert_eq!(json["failure"], "/c/findings/0001@failure");
    assert_eq!(json["failure_ns"], 10 * S);
    assert_eq!(json["confidence"], 0.95);
    let point = &json["points"][1];
    for field in [
        "moment",
        "digest",
        "planned_ns",
        "virtual_ns",
        "branches",
        "failures",
        "p",
        "low",
        "high",
        "outcomes",
    ] {
        assert!(point.get(field).is_some(), "{field} in {point}");
    }
    assert_eq!(point["moment"], "/c/findings/0001@4s");
    assert_eq!(point["p"], 0.5);
    let outcome = &point["outcomes"][0];
    assert_eq!(outcome["seed"], branch_seed(1, 4, 0));
    assert_eq!(
        outcome["moment"],
        format!("/c/findings/0001~4s:seed={}@4s", branch_seed(1, 4, 0))
    );
    assert_eq!(outcome["failed"], true);
    // Read back whole.
    let text = serde_json::to_string(&likelihood).unwrap();
    assert_eq!(
        serde_json::from_str::<Likelihood>(&text).unwrap(),
        likelihood
    );
}

#[test]
fn test_svg_is_written_without_fonts_one_circle_a_point() {
    let likelihood = sample();
    let svg = svg(&likelihood).unwrap();
    let document = roxmltree::Document::parse(&svg).unwrap();
    assert_eq!(document.root_element().tag_name().name(), "svg");
    let circles = document
        .descendants()
        .filter(|n| n.tag_name().name() == "circle")
        .count();
    assert_eq!(circles, likelihood.points.len());
    let texts: Vec<&str> = document
        .descendants()
        .filter(|n| n.tag_name().name() == "text")
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    assert!(texts.contains(&"virtual time (s)"), "{texts:?}");
    assert!(texts.iter().any(|t| t.starts_with("failure")), "{texts:?}");
}

#[test]
fn test_a_plan_refuses_nothing_to_do_and_what_passes_the_budget() {
    let plan = Plan {
        dir: "/c/findings/0001".into(),
        key: "property:p@f:1".into(),
        root_ns: VirtNanos(2 * S),
        failure_ns: VirtNanos(10 * S),
        end_ns: VirtNanos(12 * S),
        seed: 1,
        points: point_times(VirtNanos(2 * S), VirtNanos(10 * S), 4)
            .into_iter()
            .map(|planned_ns| PlannedPoint {
                planned_ns,
                seeds: vec![1; 16],
            })
            .collect(),
    };
    plan.check(&Limits::default(), 4, &[]).unwrap();
    let siblings = Limits {
        siblings: 15,
        ..Limits::default()
    };
    assert_eq!(
        plan.check(&siblings, 1, &[]).unwrap_err().budget,
        "siblings"
    );
    let created = Limits {
        branches_created: 63,
        ..Limits::default()
    };
    assert_eq!(
        plan.check(&created, 1, &[]).unwrap_err().budget,
        "branches_created"
    );
    // 16 branches each of 10 s, 8 s, 6 s and 4 s: 448 s.
    let short = Limits {
        call_virtual: VirtNanos(447 * S),
        ..Limits::default()
    };
    let error = plan.check(&short, 1, &[]).unwrap_err();
    assert_eq!((error.budget, error.over.as_str()), ("call_virtual", "1s"));
    assert_eq!(
        plan.check(&Limits::default(), 65, &[]).unwrap_err().budget,
        "workers"
    );
    // A shared budget refuses it before anything runs too, naming itself.
    let server = SharedBudget::new(
        SharedScope::Server,
        SharedLimits {
            virtual_time: VirtNanos(100 * S),
            ..SharedLimits::default()
        },
    );
    let error = plan.check(&Limits::default(), 1, &[server]).unwrap_err();
    assert_eq!(error.budget, "server_virtual_time", "{error}");
    for (points, branches, what) in [(0, 1, "points"), (1, 0, "branches")] {
        let options = LikelihoodOptions {
            points,
            branches,
            seed: None,
            limits: Limits::default(),
        };
        let error = super::plan(Path::new("/nonexistent"), &options).unwrap_err();
        assert_eq!(error.to_string(), format!("{what} must be at least 1"));
    }
}

#[test]
fn test_a_branch_moment_carries_only_its_own_actions() {
    let point = MomentId::of_source("/f/0001", When::Time(VirtNanos(2 * S)));
    let fault: run::faults::Fault = "at=+1s pause n1 for=1s".parse().unwrap();
    // At an instant where the finding took a step: the session's history
    // continues the step (see `Session::history`), the id adds the branch's.
    let moment = branch_moment(&point, VirtNanos(2 * S), 7, std::slice::from_ref(&fault));
    assert_eq!(
        moment.to_string(),
        "/f/0001~2s:seed=7~2s:fault=at=+1s pause n1 for=1s@2s"
    );
    assert_eq!(moment.depth(), 1);
    let moment = branch_moment(&point, VirtNanos(5 * S), 7, &[]);
    assert_eq!(moment.to_string(), "/f/0001~5s:seed=7@5s");
}
