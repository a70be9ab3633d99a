//! `--plot FILE.svg`: acquire-wait and handoff distributions of each wait
//! mode side by side, as cumulative distributions on a log time axis.

use std::fmt::Write;

use crate::scenarios::{Contended, mode_name};

const PANEL_W: f64 = 460.0;
const PANEL_H: f64 = 300.0;
const MARGIN: f64 = 50.0;
const COLORS: [&str; 4] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];

/// Renders the SVG document.
pub(crate) fn render(runs: &[&Contended]) -> String {
    let width = 2.0 * (PANEL_W + 2.0 * MARGIN);
    let height = PANEL_H + 2.0 * MARGIN + 30.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let workers = runs.first().map_or(0, |r| r.workers);
    let hold = runs.first().map_or(0.0, |r| r.hold_ms);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="14">fencelock bench: {workers} workers, {hold} ms hold: cumulative share of samples at or below a time</text>"#,
        width / 2.0
    );
    panel(&mut svg, 0.0, "acquire wait (ms)", runs, |r| &r.waits_ms);
    panel(
        &mut svg,
        PANEL_W + 2.0 * MARGIN,
        "handoff to another worker (ms)",
        runs,
        |r| &r.handoffs_ms,
    );
    // Legend.
    for (i, run) in runs.iter().enumerate() {
        let x = MARGIN + i as f64 * 150.0;
        let y = height - 12.0;
        let color = COLORS[i % COLORS.len()];
        let _ = writeln!(
            svg,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{} (p99 wait {:.2} ms)</text>"#,
            x + 20.0,
            x + 25.0,
            y + 4.0,
            mode_name(run.mode),
            run.wait_ms(0.99)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn panel(
    svg: &mut String,
    left: f64,
    title: &str,
    runs: &[&Contended],
    samples: impl Fn(&Contended) -> &Vec<f64>,
) {
    let x0 = left + MARGIN;
    let y0 = MARGIN + 30.0;
    let all: Vec<f64> = runs
        .iter()
        .flat_map(|r| samples(r).iter().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let lo = all
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1e-3)
        .log10()
        .floor();
    let hi = all
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .max(1e-2)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let sx = |v: f64| x0 + (v.max(10f64.powf(lo)).log10() - lo) / (hi - lo) * PANEL_W;
    let sy = |share: f64| y0 + (1.0 - share) * PANEL_H;
    let _ = writeln!(
        svg,
        r##"<rect x="{x0}" y="{y0}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#888"/><text x="{}" y="{}" text-anchor="middle">{title}</text>"##,
        x0 + PANEL_W / 2.0,
        y0 + PANEL_H + 35.0
    );
    let mut decade = lo;
    while decade <= hi {
        let x = sx(10f64.powf(decade));
        let _ = writeln!(
            svg,
            r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{}" stroke="#eee"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            y0 + PANEL_H,
            y0 + PANEL_H + 15.0,
            format_ms(10f64.powf(decade))
        );
        decade += 1.0;
    }
    for share in [0.0, 0.5, 0.9, 0.99, 1.0] {
        let y = sy(share);
        let _ = writeln!(
            svg,
            r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#eee"/><text x="{}" y="{}" text-anchor="end">{share}</text>"##,
            x0 + PANEL_W,
            x0 - 5.0,
            y + 4.0
        );
    }
    for (i, run) in runs.iter().enumerate() {
        let data = samples(run);
        if data.is_empty() {
            continue;
        }
        let step = (data.len() / 400).max(1);
        let mut points = String::new();
        for (j, v) in data.iter().enumerate().step_by(step) {
            let _ = write!(
                points,
                "{:.1},{:.1} ",
                sx(*v),
                sy((j + 1) as f64 / data.len() as f64)
            );
        }
        let last = data[data.len() - 1];
        let _ = write!(points, "{:.1},{:.1}", sx(last), sy(1.0));
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{points}"/>"#,
            COLORS[i % COLORS.len()]
        );
    }
}

fn format_ms(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}
