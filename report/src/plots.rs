//! The report's plots, as inline SVG drawn with `plotters`' SVG backend
//! (text as SVG text: no font is read): findings over time, branches per
//! hour, property hits, fault kinds realised, and each finding's timeline.

use crate::model::*;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Why a plot could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("drawing the {plot} plot: {message}")]
pub struct PlotError {
    plot: &'static str,
    message: String,
}

const WIDTH: u32 = 560;
const HEIGHT: u32 = 300;

fn error(plot: &'static str) -> impl Fn(&dyn std::fmt::Display) -> PlotError {
    move |e| PlotError {
        plot,
        message: e.to_string(),
    }
}

/// The SVG element alone (no XML declaration), for embedding in HTML.
fn element(svg: String) -> String {
    match svg.find("<svg") {
        Some(at) => svg[at..].to_owned(),
        None => svg,
    }
}

/// A plot that says there is nothing to draw.
fn nothing(plot: &'static str, title: &str, why: &str) -> Result<String, PlotError> {
    let e = error(plot);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, 80)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        root.draw(&Text::new(
            format!("{title}: {why}"),
            (20, 35),
            ("sans-serif", 16).into_font().color(&BLACK.mix(0.6)),
        ))
        .map_err(|x| e(&x))?;
        root.present().map_err(|x| e(&x))?;
    }
    Ok(element(out))
}

/// Bars, one per label, each a stack of `(value, color)` parts.
fn bars(
    plot: &'static str,
    title: &str,
    y_desc: &str,
    labels: &[String],
    stacks: &[Vec<(f64, RGBColor)>],
    legend: &[(&str, RGBColor)],
) -> Result<String, PlotError> {
    if labels.is_empty() {
        return nothing(plot, title, "nothing recorded");
    }
    let e = error(plot);
    let top = stacks
        .iter()
        .map(|s| s.iter().map(|(v, _)| v).sum::<f64>())
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.15;
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let n = labels.len() as u32;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d((0u32..n).into_segmented(), 0f64..top)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(y_desc)
            .x_labels(labels.len().min(24))
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels
                    .get(*i as usize)
                    .map(|l| shorten(l, 18))
                    .unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(|x| e(&x))?;
        for (i, stack) in stacks.iter().enumerate() {
            let i = i as u32;
            let mut base = 0.0;
            for (value, color) in stack {
                if *value <= 0.0 {
                    continue;
                }
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [
                            (SegmentValue::Exact(i), base),
                            (SegmentValue::Exact(i + 1), base + value),
                        ],
                        color.filled(),
                    )))
                    .map_err(|x| e(&x))?;
                base += value;
            }
        }
        for (j, (name, color)) in legend.iter().enumerate() {
            let x = WIDTH as i32 - 150;
            let y = 30 + 18 * j as i32;
            root.draw(&Rectangle::new([(x, y), (x + 12, y + 12)], color.filled()))
                .map_err(|x| e(&x))?;
            root.draw(&Text::new(
                name.to_string(),
                (x + 18, y),
                ("sans-serif", 13).into_font(),
            ))
            .map_err(|x| e(&x))?;
        }
        root.present().map_err(|x| e(&x))?;
    }
    Ok(element(out))
}

fn shorten(text: &str, most: usize) -> String {
    if text.chars().count() <= most {
        text.to_owned()
    } else {
        let head: String = text.chars().take(most - 1).collect();
        format!("{head}…")
    }
}

const GREEN: RGBColor = RGBColor(46, 125, 50);
const FAIL: RGBColor = RGBColor(198, 40, 40);
const STEEL: RGBColor = RGBColor(63, 111, 181);

/// Findings over time: the count of findings found by each minute of the
/// campaigns' wall time.
pub fn findings_over_time(report: &Report) -> Result<String, PlotError> {
    const TITLE: &str = "Findings over time";
    let mut times: Vec<f64> = report
        .findings
        .iter()
        .filter_map(|f| f.found_at_ms)
        .map(|ms| ms as f64 / 60_000.0)
        .collect();
    if times.len() < report.findings.len() {
        return nothing(
            "findings",
            TITLE,
            "not recorded (a campaign from before it was kept)",
        );
    }
    times.sort_by(f64::total_cmp);
    let end = (report.exploration.wall_ms as f64 / 60_000.0)
        .max(times.last().copied().unwrap_or(0.0))
        .max(0.1);
    let e = error("findings");
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(TITLE, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(55)
            .build_cartesian_2d(0f64..end * 1.02, 0f64..(times.len() as f64 + 1.0))
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("wall time (minutes)")
            .y_desc("findings")
            .y_labels(times.len() + 2)
            .y_label_formatter(&|y| {
                if y.fract() == 0.0 {
                    format!("{y:.0}")
                } else {
                    String::new()
                }
            })
            .draw()
            .map_err(|x| e(&x))?;
        let mut steps = vec![(0.0, 0.0)];
        for (i, t) in times.iter().enumerate() {
            steps.push((*t, i as f64));
            steps.push((*t, i as f64 + 1.0));
        }
        steps.push((end, times.len() as f64));
        chart
            .draw_series(LineSeries::new(steps, FAIL.stroke_width(2)))
            .map_err(|x| e(&x))?;
        chart
            .draw_series(
                times
                    .iter()
                    .enumerate()
                    .map(|(i, t)| Circle::new((*t, i as f64 + 1.0), 4, FAIL.filled())),
            )
            .map_err(|x| e(&x))?;
        root.present().map_err(|x| e(&x))?;
    }
    Ok(element(out))
}

/// Branches per hour in each minute of wall time (all campaigns together).
pub fn branches_per_hour(report: &Report) -> Result<String, PlotError> {
    let by_minute = &report.exploration.branches_by_minute;
    let labels: Vec<String> = (0..by_minute.len()).map(|m| format!("{m}")).collect();
    let stacks: Vec<Vec<(f64, RGBColor)>> = by_minute
        .iter()
        .map(|n| vec![(*n as f64 * 60.0, STEEL)])
        .collect();
    bars(
        "branches",
        "Branches per hour, by minute of wall time",
        "branches per hour",
        &labels,
        &stacks,
        &[],
    )
}

/// Each property's passes and failures.
pub fn property_hits(report: &Report) -> Result<String, PlotError> {
    let labels: Vec<String> = report.properties.iter().map(|p| p.name.clone()).collect();
    let stacks: Vec<Vec<(f64, RGBColor)>> = report
        .properties
        .iter()
        .map(|p| vec![(p.passes as f64, GREEN), (p.failures as f64, FAIL)])
        .collect();
    bars(
        "properties",
        "Property hits",
        "hits",
        &labels,
        &stacks,
        &[("passed", GREEN), ("failed", FAIL)],
    )
}

/// The stretches in which each fault kind began.
pub fn fault_kinds(report: &Report) -> Result<String, PlotError> {
    let labels: Vec<String> = report.fault_kinds.keys().cloned().collect();
    let stacks: Vec<Vec<(f64, RGBColor)>> = report
        .fault_kinds
        .values()
        .map(|n| vec![(*n as f64, STEEL)])
        .collect();
    bars(
        "faults",
        "Fault kinds realised",
        "stretches",
        &labels,
        &stacks,
        &[],
    )
}

/// A finding's notable moments on lanes by kind against virtual time.
pub fn timeline(finding: &FindingReport) -> Result<String, PlotError> {
    const LANES: [&str; 5] = ["branch", "fault", "node", "property_failed", "failure"];
    let e = error("timeline");
    let seconds = |ns: vmm::VirtNanos| ns.0 as f64 / 1e9;
    let first = finding
        .timeline
        .iter()
        .map(|t| seconds(t.virtual_ns))
        .fold(f64::INFINITY, f64::min);
    let last = seconds(finding.virtual_ns).max(seconds(finding.failure.virtual_ns));
    let first = if first.is_finite() { first } else { 0.0 };
    let margin = ((last - first) * 0.03).max(0.01);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH + 160, 230)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Timeline", ("sans-serif", 15))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(110)
            .build_cartesian_2d(
                (first - margin)..(last + margin),
                -0.5f64..(LANES.len() as f64 - 0.5),
            )
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("virtual time (s)")
            .y_labels(LANES.len())
            .y_label_formatter(&|y| {
                let i = y.round();
                if (y - i).abs() < 1e-6 && i >= 0.0 {
                    LANES
                        .get(i as usize)
                        .map_or(String::new(), |l| l.to_string())
                } else {
                    String::new()
                }
            })
            .draw()
            .map_err(|x| e(&x))?;
        for entry in &finding.timeline {
            let Some(lane) = LANES.iter().position(|l| *l == entry.kind) else {
                continue;
            };
            let color = match entry.kind.as_str() {
                "failure" | "property_failed" => FAIL,
                "fault" => RGBColor(199, 107, 0),
                "branch" => STEEL,
                _ => RGBColor(90, 90, 90),
            };
            chart
                .draw_series(std::iter::once(Circle::new(
                    (seconds(entry.virtual_ns), lane as f64),
                    5,
                    color.filled(),
                )))
                .map_err(|x| e(&x))?;
        }
        let failure = seconds(finding.failure.virtual_ns);
        chart
            .draw_series(LineSeries::new(
                [(failure, -0.5), (failure, LANES.len() as f64 - 0.5)],
                FAIL.stroke_width(1),
            ))
            .map_err(|x| e(&x))?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("failure at {} ", finding.failure.virtual_ns),
                (failure, LANES.len() as f64 - 0.6),
                ("sans-serif", 12)
                    .into_font()
                    .color(&FAIL)
                    .pos(Pos::new(HPos::Right, VPos::Top)),
            )))
            .map_err(|x| e(&x))?;
        root.present().map_err(|x| e(&x))?;
    }
    Ok(element(out))
}
