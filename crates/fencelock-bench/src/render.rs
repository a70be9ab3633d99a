//! Showing a [`Report`]: the human table or one JSON object per line, the
//! only place where either is written.
//!
//! Every kind of [`Measurement`] has its text (a block opening, a row, a
//! block closing) and its JSON object here, picked by one `match` each: a
//! new kind of record adds arms without changing the existing ones.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use serde_json::Value;

use crate::report::{Header, Measurement, Report};
use crate::scenarios::{Contended, Many, Uncontended, mode_name};

/// How a report is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The human table, with a header line naming the Redis.
    Text,
    /// One JSON object per record and line, keys in alphabetical order, no
    /// header.
    JsonLines,
}

/// Shows a report while it grows: each call returns the text not shown yet,
/// so the records of a long run appear as they are measured. The output of
/// [`Renderer::update`] calls followed by [`Renderer::finish`] is
/// [`Report::render`]'s, whatever the number of updates.
#[derive(Debug, Clone)]
pub struct Renderer {
    format: Format,
    header_shown: bool,
    /// Records shown so far.
    shown: usize,
}

impl Renderer {
    /// A renderer that has shown nothing yet.
    pub fn new(format: Format) -> Self {
        Renderer {
            format,
            header_shown: false,
            shown: 0,
        }
    }

    /// The header (on the first call) and the records of `report` added
    /// since the last call. `report` must be the same, grown, report.
    pub fn update(&mut self, report: &Report) -> String {
        let mut out = String::new();
        if !self.header_shown {
            self.header_shown = true;
            if self.format == Format::Text {
                header_text(&mut out, &report.header);
            }
        }
        for i in self.shown..report.records.len() {
            match self.format {
                Format::Text => {
                    let step = report.records[i].step;
                    if i > 0 && report.records[i - 1].step != step {
                        close_block(&mut out, report, i - 1);
                    }
                    if i == 0 || report.records[i - 1].step != step {
                        open_block(&mut out, &report.records[i].measurement);
                    }
                    row_text(&mut out, &report.records[i].measurement);
                }
                Format::JsonLines => {
                    let _ = writeln!(out, "{}", json_line(&report.records[i].measurement));
                }
            }
        }
        self.shown = report.records.len();
        out
    }

    /// What [`Renderer::update`] has not shown yet, and the end of the last
    /// block (in text, the footer of the `contended` table).
    pub fn finish(&mut self, report: &Report) -> String {
        let mut out = self.update(report);
        if self.format == Format::Text && !report.records.is_empty() {
            close_block(&mut out, report, report.records.len() - 1);
        }
        out
    }

    /// The note that the plot was written to `path` (text only).
    pub fn plot_written(&self, path: &Path) -> String {
        match self.format {
            Format::Text => format!("\nplot written to {}\n", path.display()),
            Format::JsonLines => String::new(),
        }
    }
}

fn header_text(out: &mut String, header: &Header) {
    let _ = writeln!(
        out,
        "fencelock bench on {}: {} s per scenario, loopback round trips measured in the same run",
        header.redis,
        header.duration.as_secs_f64()
    );
}

/// Before the first record of a block.
fn open_block(out: &mut String, first: &Measurement) {
    match first {
        Measurement::Contended(c) => {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "contended: {} workers (threads with their own runtime and connections), one name, hold {} ms",
                c.workers, c.hold_ms
            );
            let _ = writeln!(
                out,
                "  {:<7} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8} {:>8} {:>8} {:>5}",
                "mode",
                "compl/s",
                "util",
                "wait p50",
                "wait p99",
                "hand p50",
                "hand p99",
                "jain",
                "cmd/comp",
                "cpu/1k",
                "same %",
                "ovl"
            );
        }
        Measurement::Uncontended(_) | Measurement::Many(_) => {}
    }
}

/// One record.
fn row_text(out: &mut String, measurement: &Measurement) {
    match measurement {
        Measurement::Uncontended(r) => uncontended_text(out, r),
        Measurement::Contended(r) => contended_row(out, r),
        Measurement::Many(r) => many_text(out, r),
    }
}

/// After the last record of the block that ends with record `last`.
fn close_block(out: &mut String, report: &Report, last: usize) {
    let step = report.records[last].step;
    let first = report.records[..=last]
        .iter()
        .rposition(|r| r.step != step)
        .map_or(0, |i| i + 1);
    let block = &report.records[first..=last];
    match &block[0].measurement {
        Measurement::Contended(_) => {
            let runs: Vec<&Contended> = block
                .iter()
                .filter_map(|r| match &r.measurement {
                    Measurement::Contended(c) => Some(c),
                    _ => None,
                })
                .collect();
            contended_footer(out, &runs);
        }
        Measurement::Uncontended(_) | Measurement::Many(_) => {}
    }
}

fn uncontended_text(out: &mut String, r: &Uncontended) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "uncontended: one connection, acquire + release of one name ({} mode)",
        mode_name(r.mode)
    );
    let _ = writeln!(
        out,
        "  cycles/s {:>10.0}   Redis PING/s {:>10.0}   ratio to the 2-round-trip bound {:.2}",
        r.cycles_per_s, r.redis_ping_per_s, r.ratio_to_bound
    );
    let _ = writeln!(
        out,
        "  fenced floor {:>6.0} cycles/s (ratio to the bound {:.2}); fencelock reaches {:.2} of it",
        r.floor.cycles_per_s,
        r.floor_ratio_to_bound(),
        r.ratio_to_floor()
    );
}

fn contended_row(out: &mut String, r: &Contended) {
    let _ = writeln!(
        out,
        "  {:<7} {:>9.0} {:>6.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>6.3} {:>8.2} {:>8.1} {:>7.1}% {:>5}",
        mode_name(r.mode),
        r.completions_per_s,
        r.utilization,
        r.wait_ms(0.5),
        r.wait_ms(0.99),
        r.handoff_ms(0.5),
        r.handoff_ms(0.99),
        r.jain_fairness,
        r.commands_per_completion,
        r.redis_cpu_ms_per_1k,
        r.same_worker_share * 100.0,
        r.overlaps
    );
}

fn contended_footer(out: &mut String, runs: &[&Contended]) {
    let holds: Vec<String> = runs
        .iter()
        .map(|r| format!("{} {:.3} ms", mode_name(r.mode), r.real_hold_ms))
        .collect();
    let _ = writeln!(out, "  measured hold per completion: {}", holds.join(", "));
    let bounds: Vec<String> = runs
        .iter()
        .map(|r| format!("{} {:.3}", mode_name(r.mode), r.utilization_bound()))
        .collect();
    let handoff_floor = runs.first().map_or(f64::NAN, |r| r.handoff_floor_ms);
    let _ = writeln!(
        out,
        "  handoff floor (a publishing script after a hold -> another connection receives it) p50 {handoff_floor:.3} ms: utilization bound {}",
        bounds.join(", ")
    );
    let _ = writeln!(
        out,
        "  (times in ms; hand = release -> grant to a different worker; same % = grants back to the releasing worker; cpu/1k = Redis CPU ms per 1,000 completions; ovl = overlapping holders, must be 0)"
    );
}

fn many_text(out: &mut String, r: &Many) {
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "many: {} tasks on {} names sharing one client",
        r.tasks, r.tasks
    );
    let _ = writeln!(
        out,
        "  cycles/s {:>10.0}   Redis PING/s with {} connections {:>10.0}   ratio to bound {:.2}   Redis CPU {:.1} µs/cycle",
        r.cycles_per_s, r.tasks, r.redis_ping_c64_per_s, r.ratio_to_bound, r.redis_cpu_us_per_cycle
    );
    let _ = writeln!(
        out,
        "  fenced floor {:>6.0} cycles/s (ratio to the bound {:.2}, Redis CPU {:.1} µs/cycle); fencelock reaches {:.2} of it",
        r.floor.cycles_per_s,
        r.floor_ratio_to_bound(),
        r.floor.redis_cpu_us_per_cycle,
        r.ratio_to_floor()
    );
}

/// One record as a JSON object on one line. Field names are snake_case and
/// carry their unit (DESIGN.md §6); rates are rounded to integers, ratios
/// and times to 3 decimals; a quantile without samples is `null`.
fn json_line(measurement: &Measurement) -> String {
    let fields: Vec<(&str, Value)> = match measurement {
        Measurement::Uncontended(r) => vec![
            ("scenario", "uncontended".into()),
            ("mode", mode_name(r.mode).into()),
            ("cycles_per_s", round(r.cycles_per_s).into()),
            ("redis_ping_per_s", round(r.redis_ping_per_s).into()),
            ("ratio_to_bound", round3(r.ratio_to_bound).into()),
            ("floor_cycles_per_s", round(r.floor.cycles_per_s).into()),
            (
                "floor_ratio_to_bound",
                round3(r.floor_ratio_to_bound()).into(),
            ),
            ("ratio_to_floor", round3(r.ratio_to_floor()).into()),
        ],
        Measurement::Contended(r) => vec![
            ("scenario", "contended".into()),
            ("mode", mode_name(r.mode).into()),
            ("workers", r.workers.into()),
            ("hold_ms", r.hold_ms.into()),
            ("real_hold_ms", round3(r.real_hold_ms).into()),
            ("completions", r.completions.into()),
            ("completions_per_s", round(r.completions_per_s).into()),
            ("utilization", round3(r.utilization).into()),
            ("wait_p50_ms", round3(r.wait_ms(0.5)).into()),
            ("wait_p99_ms", round3(r.wait_ms(0.99)).into()),
            ("wait_max_ms", round3(r.wait_ms(1.0)).into()),
            ("handoff_p50_ms", round3(r.handoff_ms(0.5)).into()),
            ("handoff_p99_ms", round3(r.handoff_ms(0.99)).into()),
            ("handoffs", r.handoffs_ms.len().into()),
            ("same_worker_share", round3(r.same_worker_share).into()),
            ("jain_fairness", round3(r.jain_fairness).into()),
            (
                "commands_per_completion",
                round3(r.commands_per_completion).into(),
            ),
            ("redis_cpu_ms_per_1k", round3(r.redis_cpu_ms_per_1k).into()),
            ("overlaps", r.overlaps.into()),
            ("handoff_floor_ms", round3(r.handoff_floor_ms).into()),
            ("utilization_bound", round3(r.utilization_bound()).into()),
        ],
        Measurement::Many(r) => vec![
            ("scenario", "many".into()),
            ("tasks", r.tasks.into()),
            ("cycles_per_s", round(r.cycles_per_s).into()),
            ("redis_ping_c64_per_s", round(r.redis_ping_c64_per_s).into()),
            ("ratio_to_bound", round3(r.ratio_to_bound).into()),
            (
                "redis_cpu_us_per_cycle",
                round3(r.redis_cpu_us_per_cycle).into(),
            ),
            ("commands_per_cycle", round3(r.commands_per_cycle).into()),
            ("floor_cycles_per_s", round(r.floor.cycles_per_s).into()),
            (
                "floor_ratio_to_bound",
                round3(r.floor_ratio_to_bound()).into(),
            ),
            (
                "floor_redis_cpu_us_per_cycle",
                round3(r.floor.redis_cpu_us_per_cycle).into(),
            ),
        ],
    };
    // Sorted here, so the order does not depend on serde_json's features.
    let sorted: BTreeMap<&str, Value> = fields.into_iter().collect();
    let object: serde_json::Map<String, Value> = sorted
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    Value::Object(object).to_string()
}

fn round(v: f64) -> f64 {
    v.round()
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fencelock::WaitMode;

    use super::*;
    use crate::floor::Floor;
    use crate::report::{Header, Record};

    fn contended(mode: WaitMode, handoffs_ms: Vec<f64>) -> Contended {
        Contended {
            mode,
            workers: 8,
            hold_ms: 1.0,
            real_hold_ms: 1.0912,
            completions: 5000,
            completions_per_s: 654.5,
            utilization: 0.7123,
            waits_ms: vec![0.1, 0.3125, 13.6],
            handoffs_ms,
            jain_fairness: 0.99951,
            commands_per_completion: 24.98765,
            redis_cpu_ms_per_1k: 123.456,
            overlaps: 0,
            same_worker_share: 0.98765,
            handoff_floor_ms: 0.27449,
        }
    }

    fn report() -> Report {
        let floor = |cycles_per_s, redis_cpu_us_per_cycle| Floor {
            cycles_per_s,
            redis_cpu_us_per_cycle,
        };
        let mut report = Report::new(Header {
            redis: "redis://:***@127.0.0.1:6379/".into(),
            duration: Duration::from_millis(2500),
        });
        let measurements = [
            (
                0,
                Measurement::Uncontended(Uncontended {
                    cycles_per_s: 4910.4,
                    redis_ping_per_s: 21130.5,
                    ratio_to_bound: 0.46477,
                    mode: WaitMode::Notify,
                    floor: floor(6971.5, 12.3),
                }),
            ),
            (
                1,
                Measurement::Contended(contended(WaitMode::Poll, vec![0.38, 50.1])),
            ),
            (1, Measurement::Contended(contended(WaitMode::Fair, vec![]))),
            (
                2,
                Measurement::Many(Many {
                    tasks: 64,
                    cycles_per_s: 18103.4,
                    redis_ping_c64_per_s: 61017.0,
                    ratio_to_bound: 0.59339,
                    redis_cpu_us_per_cycle: 39.94,
                    commands_per_cycle: 10.0123,
                    floor: floor(36510.2, 24.44),
                }),
            ),
        ];
        for (step, measurement) in measurements {
            report.records.push(Record { step, measurement });
        }
        report
    }

    /// The text of `fencelock bench` as it was before the engine had its own
    /// crate, character for character.
    const TEXT: &str = "\
fencelock bench on redis://:***@127.0.0.1:6379/: 2.5 s per scenario, loopback round trips measured in the same run

uncontended: one connection, acquire + release of one name (notify mode)
  cycles/s       4910   Redis PING/s      21130   ratio to the 2-round-trip bound 0.46
  fenced floor   6972 cycles/s (ratio to the bound 0.66); fencelock reaches 0.70 of it

contended: 8 workers (threads with their own runtime and connections), one name, hold 1 ms
  mode      compl/s   util  wait p50  wait p99  hand p50  hand p99   jain cmd/comp   cpu/1k   same %   ovl
  poll          654  0.712     0.312    13.600    50.100    50.100  1.000    24.99    123.5    98.8%     0
  fair          654  0.712     0.312    13.600       NaN       NaN  1.000    24.99    123.5    98.8%     0
  measured hold per completion: poll 1.091 ms, fair 1.091 ms
  handoff floor (a publishing script after a hold -> another connection receives it) p50 0.274 ms: utilization bound poll 0.799, fair 0.799
  (times in ms; hand = release -> grant to a different worker; same % = grants back to the releasing worker; cpu/1k = Redis CPU ms per 1,000 completions; ovl = overlapping holders, must be 0)

many: 64 tasks on 64 names sharing one client
  cycles/s      18103   Redis PING/s with 64 connections      61017   ratio to bound 0.59   Redis CPU 39.9 µs/cycle
  fenced floor  36510 cycles/s (ratio to the bound 1.20, Redis CPU 24.4 µs/cycle); fencelock reaches 0.50 of it
";

    const JSON: &str = r#"{"cycles_per_s":4910.0,"floor_cycles_per_s":6972.0,"floor_ratio_to_bound":0.66,"mode":"notify","ratio_to_bound":0.465,"ratio_to_floor":0.704,"redis_ping_per_s":21131.0,"scenario":"uncontended"}
{"commands_per_completion":24.988,"completions":5000,"completions_per_s":655.0,"handoff_floor_ms":0.274,"handoff_p50_ms":50.1,"handoff_p99_ms":50.1,"handoffs":2,"hold_ms":1.0,"jain_fairness":1.0,"mode":"poll","overlaps":0,"real_hold_ms":1.091,"redis_cpu_ms_per_1k":123.456,"same_worker_share":0.988,"scenario":"contended","utilization":0.712,"utilization_bound":0.799,"wait_max_ms":13.6,"wait_p50_ms":0.313,"wait_p99_ms":13.6,"workers":8}
{"commands_per_completion":24.988,"completions":5000,"completions_per_s":655.0,"handoff_floor_ms":0.274,"handoff_p50_ms":null,"handoff_p99_ms":null,"handoffs":0,"hold_ms":1.0,"jain_fairness":1.0,"mode":"fair","overlaps":0,"real_hold_ms":1.091,"redis_cpu_ms_per_1k":123.456,"same_worker_share":0.988,"scenario":"contended","utilization":0.712,"utilization_bound":0.799,"wait_max_ms":13.6,"wait_p50_ms":0.313,"wait_p99_ms":13.6,"workers":8}
{"commands_per_cycle":10.012,"cycles_per_s":18103.0,"floor_cycles_per_s":36510.0,"floor_ratio_to_bound":1.197,"floor_redis_cpu_us_per_cycle":24.44,"ratio_to_bound":0.593,"redis_cpu_us_per_cycle":39.94,"redis_ping_c64_per_s":61017.0,"scenario":"many","tasks":64}
"#;

    #[test]
    fn text_and_json_lines_are_unchanged() {
        let report = report();
        assert_eq!(report.render(Format::Text), TEXT);
        assert_eq!(report.render(Format::JsonLines), JSON);
    }

    #[test]
    fn rendering_record_by_record_gives_the_whole_report() {
        let whole = report();
        for format in [Format::Text, Format::JsonLines] {
            let mut renderer = Renderer::new(format);
            let mut grown = Report::new(whole.header.clone());
            let mut shown = renderer.update(&grown);
            for record in &whole.records {
                grown.records.push(record.clone());
                shown += &renderer.update(&grown);
            }
            shown += &renderer.finish(&grown);
            assert_eq!(shown, whole.render(format), "{format:?}");
        }
    }

    #[test]
    fn the_plot_note_is_text_only() {
        let path = Path::new("/tmp/waits.svg");
        assert_eq!(
            Renderer::new(Format::Text).plot_written(path),
            "\nplot written to /tmp/waits.svg\n"
        );
        assert_eq!(Renderer::new(Format::JsonLines).plot_written(path), "");
    }
}
