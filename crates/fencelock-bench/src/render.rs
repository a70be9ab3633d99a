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

use crate::measure::Spread;
use crate::report::{Header, Measurement, Report};
use crate::scenarios::{Contended, Contestant, Cycles, Held, ReadWrite, Semaphore, mode_name};

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

// Here rather than in `report`, which holds the records and shows none:
// the report then needs nothing from this module.
impl Report {
    /// The whole report in `format`, as a [`Renderer`] shows it while the
    /// run goes on.
    pub fn render(&self, format: Format) -> String {
        Renderer::new(format).finish(self)
    }
}

fn header_text(out: &mut String, header: &Header) {
    let _ = writeln!(
        out,
        "fencelock bench on {}: {} round(s) of {} s per contestant, interleaved in slices; figures are medians over the rounds [min-max]",
        header.redis,
        header.rounds,
        header.duration.as_secs_f64()
    );
    if let Some(note) = &header.placement_note {
        let _ = writeln!(out, "note: {note}");
    }
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
        Measurement::Held(_) => {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "held: one client holding N auto-renewed leases (renewed every ttl/3, batched per keeper tick)"
            );
            let _ = writeln!(
                out,
                "  {:>8} {:>7} {:>9} {:>10} {:>9} {:>9} {:>10} {:>9} {:>5}",
                "leases",
                "ttl s",
                "acq/s",
                "B/lease",
                "cli cpu",
                "redis cpu",
                "redis cmd/s",
                "lag max",
                "lost"
            );
        }
        Measurement::Uncontended(_)
        | Measurement::Many(_)
        | Measurement::Semaphore(_)
        | Measurement::RwLock(_) => {}
    }
}

/// One record.
fn row_text(out: &mut String, measurement: &Measurement) {
    match measurement {
        Measurement::Uncontended(r) => cycles_text(out, "uncontended", r),
        Measurement::Contended(r) => contended_row(out, r),
        Measurement::Many(r) => cycles_text(out, "many", r),
        Measurement::Held(r) => held_row(out, r),
        Measurement::Semaphore(r) => semaphore_text(out, r),
        Measurement::RwLock(r) => rwlock_text(out, r),
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
        Measurement::Held(_) => {
            let _ = writeln!(
                out,
                "  (B/lease = client heap per lease held; cpu = share of one core while holding; lag max in ms; lost must be 0)"
            );
        }
        Measurement::Uncontended(_)
        | Measurement::Many(_)
        | Measurement::Semaphore(_)
        | Measurement::RwLock(_) => {}
    }
}

/// `0.93 [0.90-0.95]`.
fn spread_text(s: Spread) -> String {
    format!("{:.2} [{:.2}-{:.2}]", s.median, s.min, s.max)
}

fn cycles_text(out: &mut String, scenario: &str, r: &Cycles) {
    let _ = writeln!(out);
    let what = if r.tasks == 1 {
        "one task, one name, one connection".to_string()
    } else {
        format!(
            "{} tasks on {} names sharing one client (references: one shared connection)",
            r.tasks, r.tasks
        )
    };
    let _ = writeln!(
        out,
        "{scenario}: {what}, acquire + release ({} mode, {}; {})",
        mode_name(r.mode),
        r.topology.name(),
        r.placement.describe()
    );
    let _ = writeln!(
        out,
        "  {:<10} {:>10} {:>18} {:>11} {:>11} {:>11} {:>11} {:>9} {:>10} {:>7} {:>7}",
        "",
        "per s",
        "ratio to it",
        "1st p50 µs",
        "1st p99 µs",
        "2nd p50 µs",
        "2nd p99 µs",
        "cpu µs",
        "client µs",
        "cmds",
        "reads"
    );
    let row = |out: &mut String, name: &str, c: &Contestant, ratio: Option<Spread>| {
        let _ = writeln!(
            out,
            "  {:<10} {:>10.0} {:>18} {:>11.1} {:>11.1} {:>11.1} {:>11.1} {:>9.1} {:>10.1} {:>7.2} {:>7.2}",
            name,
            c.per_s.median,
            ratio.map_or("-".to_string(), spread_text),
            c.first_us(0.5),
            c.first_us(0.99),
            c.second_us(0.5),
            c.second_us(0.99),
            c.redis_cpu_us_per_cycle,
            c.client_cpu_us_per_cycle,
            c.commands_per_cycle,
            c.reads_per_cycle
        );
    };
    row(out, "fencelock", &r.fencelock, None);
    row(out, "floor", &r.floor, Some(r.ratio_to_floor));
    row(out, "unfenced", &r.unfenced, Some(r.ratio_to_unfenced));
    row(out, "PING", &r.ping, Some(r.ratio_to_bound));
    let _ = writeln!(
        out,
        "  ratio to the 2-round-trip bound (PING/2): fencelock {}, floor {}, unfenced {}",
        spread_text(r.ratio_to_bound),
        spread_text(r.floor_ratio_to_bound),
        spread_text(r.unfenced_ratio_to_bound)
    );
    match (&r.redis_benchmark_ping_per_s, &r.ratio_to_benchmark_bound) {
        (Some(ping), Some(ratio)) => {
            let _ = writeln!(
                out,
                "  redis-benchmark -c {} PING/s {:.0}: fencelock reaches {} of its bound",
                r.tasks,
                ping.median,
                spread_text(*ratio)
            );
        }
        _ => {
            let _ = writeln!(out, "  redis-benchmark: not measured");
        }
    }
    let _ = writeln!(
        out,
        "  (ratio to it = fencelock ÷ that row, per round; 1st = acquire/grant/PING, 2nd = release; cpu = Redis CPU per cycle; client = this process's CPU per cycle (one thread runs every contestant); cmds = Redis commands per cycle; reads = Redis socket reads per cycle)"
    );
}

fn semaphore_text(out: &mut String, r: &Semaphore) {
    let s = &r.semaphore;
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "semaphore: {} workers (threads with their own runtime and connections) on {} permits of one fenced semaphore, fair mode, hold {} ms; the same workers on a mutex beside it",
        s.workers, r.permits, s.hold_ms
    );
    let _ = writeln!(
        out,
        "  {:<10} {:>9} {:>6} {:>9} {:>9} {:>6} {:>8} {:>8} {:>5}",
        "", "compl/s", "util", "wait p50", "wait p99", "jain", "cmd/comp", "cpu/1k", "ovl"
    );
    for (name, c) in [("semaphore", s), ("mutex", &r.mutex)] {
        let _ = writeln!(
            out,
            "  {:<10} {:>9.0} {:>6.3} {:>9.3} {:>9.3} {:>6.3} {:>8.2} {:>8.1} {:>5}",
            name,
            c.completions_per_s,
            c.utilization,
            c.wait_ms(0.5),
            c.wait_ms(0.99),
            c.jain_fairness,
            c.commands_per_completion,
            c.redis_cpu_ms_per_1k,
            c.overlaps
        );
    }
    let _ = writeln!(
        out,
        "  semaphore / mutex completions per round: {} (at most {} while the hold dominates a cycle); semaphore jain per round: {}",
        spread_text(r.ratio_to_mutex),
        r.permits,
        spread_text(r.jain_fairness)
    );
    let _ = writeln!(
        out,
        "  handoff floor (a publishing script after a hold -> another connection receives it) p50 {:.3} ms: utilization bound {:.3}; utilization / bound per round: semaphore {}, mutex {}",
        s.handoff_floor_ms,
        s.utilization_bound(),
        spread_text(s.utilization_to_bound),
        spread_text(r.mutex.utilization_to_bound)
    );
    let _ = writeln!(
        out,
        "  (times in ms; util = held time / (elapsed x permits); cpu/1k = Redis CPU ms per 1,000 completions; ovl = more holders than permits at once, must be 0)"
    );
}

fn rwlock_text(out: &mut String, r: &ReadWrite) {
    let c = &r.rwlock;
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "rwlock: {} workers (threads with their own runtime and connections) on one fenced read-write lock, {} % read leases, fair mode, hold {} ms; the same workers on a mutex beside it",
        c.workers, r.reads_percent, c.hold_ms
    );
    let _ = writeln!(
        out,
        "  {:<7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5}",
        "",
        "compl/s",
        "reads/s",
        "writes/s",
        "holders",
        "wait p50",
        "wait p99",
        "w wait99",
        "cmd/comp",
        "cpu/1k",
        "ovl"
    );
    let _ = writeln!(
        out,
        "  {:<7} {:>9.0} {:>9.0} {:>9.0} {:>9.2} {:>9.3} {:>9.3} {:>9.3} {:>8.2} {:>8.1} {:>5}",
        "rwlock",
        c.completions_per_s,
        r.reads_per_s,
        r.writes_per_s,
        c.utilization,
        c.wait_ms(0.5),
        c.wait_ms(0.99),
        r.write_wait_ms(0.99),
        c.commands_per_completion,
        c.redis_cpu_ms_per_1k,
        c.overlaps
    );
    let m = &r.mutex;
    let _ = writeln!(
        out,
        "  {:<7} {:>9.0} {:>9} {:>9} {:>9.2} {:>9.3} {:>9.3} {:>9} {:>8.2} {:>8.1} {:>5}",
        "mutex",
        m.completions_per_s,
        "-",
        "-",
        m.utilization,
        m.wait_ms(0.5),
        m.wait_ms(0.99),
        "-",
        m.commands_per_completion,
        m.redis_cpu_ms_per_1k,
        m.overlaps
    );
    let _ = writeln!(
        out,
        "  rwlock / mutex completions per round: {}",
        spread_text(r.ratio_to_mutex)
    );
    let _ = writeln!(
        out,
        "  Redis round trip (PING p50, one connection) {:.3} ms: round-trip bound {:.0} completions/s ({} workers / (hold {:.3} ms + 2 round trips)); rwlock / bound per round {}, mutex / bound {}",
        r.round_trip_ms,
        r.round_trip_bound_per_s,
        c.workers,
        c.real_hold_ms,
        spread_text(r.ratio_to_round_trip_bound),
        spread_text(r.mutex_ratio_to_round_trip_bound)
    );
    let _ = writeln!(
        out,
        "  handoff floor (a publishing script after a hold -> another connection receives it) p50 {:.3} ms: the mutex's utilization bound {:.3}, utilization / bound per round {}",
        m.handoff_floor_ms,
        m.utilization_bound(),
        spread_text(m.utilization_to_bound)
    );
    let _ = writeln!(
        out,
        "  (times in ms; holders = mean holders at once (held time / elapsed); w wait99 = the writers' wait p99; cpu/1k = Redis CPU ms per 1,000 completions; ovl = a writer with another holder, must be 0)"
    );
}

fn held_row(out: &mut String, r: &Held) {
    let _ = writeln!(
        out,
        "  {:>8} {:>7.1} {:>9.0} {:>10.0} {:>9.3} {:>9.3} {:>10.0} {:>9.1} {:>5}",
        r.leases,
        r.ttl_ms / 1e3,
        r.acquired_per_s,
        r.client_bytes_per_lease,
        r.client_cpu_share,
        r.redis_cpu_share,
        r.redis_commands_per_s,
        r.renewal_lag_max_ms,
        r.leases_lost
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
    let to_bound: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                mode_name(r.mode),
                spread_text(r.utilization_to_bound)
            )
        })
        .collect();
    let handoff_floor = runs.first().map_or(f64::NAN, |r| r.handoff_floor_ms);
    let _ = writeln!(
        out,
        "  handoff floor (a publishing script after a hold -> another connection receives it) p50 {handoff_floor:.3} ms: utilization bound {}",
        bounds.join(", ")
    );
    let _ = writeln!(
        out,
        "  utilization / bound per round: {}",
        to_bound.join(", ")
    );
    let _ = writeln!(
        out,
        "  (times in ms; hand = release -> grant to a different worker; same % = grants back to the releasing worker; cpu/1k = Redis CPU ms per 1,000 completions; ovl = overlapping holders, must be 0)"
    );
}

/// One record as a JSON object on one line. Field names are snake_case and
/// carry their unit (docs/design.md §6); rates are rounded to integers, ratios
/// and times to 3 decimals; a quantile without samples is `null`.
fn json_line(measurement: &Measurement) -> String {
    let fields: Vec<(String, Value)> = match measurement {
        Measurement::Uncontended(r) => cycles_json("uncontended", r),
        Measurement::Many(r) => cycles_json("many", r),
        Measurement::Contended(r) => named(vec![
            ("scenario", "contended".into()),
            ("mode", mode_name(r.mode).into()),
            ("workers", r.workers.into()),
            ("rounds", r.rounds.into()),
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
        ])
        .into_iter()
        .chain(spread_json("utilization_to_bound", r.utilization_to_bound))
        .collect(),
        Measurement::Semaphore(r) => semaphore_json(r),
        Measurement::RwLock(r) => rwlock_json(r),
        Measurement::Held(r) => named(vec![
            ("scenario", "held".into()),
            ("topology", r.topology.name().into()),
            ("leases", r.leases.into()),
            ("ttl_ms", round(r.ttl_ms).into()),
            ("acquired_per_s", round(r.acquired_per_s).into()),
            ("window_s", round3(r.window_s).into()),
            (
                "client_bytes_per_lease",
                round(r.client_bytes_per_lease).into(),
            ),
            ("client_cpu_share", round3(r.client_cpu_share).into()),
            ("redis_cpu_share", round3(r.redis_cpu_share).into()),
            ("redis_commands_per_s", round(r.redis_commands_per_s).into()),
            ("renewal_lag_max_ms", round3(r.renewal_lag_max_ms).into()),
            ("leases_lost", r.leases_lost.into()),
        ]),
    };
    // Sorted here, so the order does not depend on serde_json's features.
    let sorted: BTreeMap<String, Value> = fields.into_iter().collect();
    let object: serde_json::Map<String, Value> = sorted.into_iter().collect();
    Value::Object(object).to_string()
}

/// `semaphore`'s record: the semaphore's figures, the mutex's as
/// `mutex_…`, their ratio and the semaphore's fairness per round.
fn semaphore_json(r: &Semaphore) -> Vec<(String, Value)> {
    let (s, m) = (&r.semaphore, &r.mutex);
    named(vec![
        ("scenario", "semaphore".into()),
        ("mode", mode_name(s.mode).into()),
        ("permits", r.permits.into()),
        ("workers", s.workers.into()),
        ("rounds", s.rounds.into()),
        ("hold_ms", s.hold_ms.into()),
        ("real_hold_ms", round3(s.real_hold_ms).into()),
        ("completions", s.completions.into()),
        ("completions_per_s", round(s.completions_per_s).into()),
        ("utilization", round3(s.utilization).into()),
        ("wait_p50_ms", round3(s.wait_ms(0.5)).into()),
        ("wait_p99_ms", round3(s.wait_ms(0.99)).into()),
        ("wait_max_ms", round3(s.wait_ms(1.0)).into()),
        (
            "commands_per_completion",
            round3(s.commands_per_completion).into(),
        ),
        ("redis_cpu_ms_per_1k", round3(s.redis_cpu_ms_per_1k).into()),
        ("overlaps", s.overlaps.into()),
        ("mutex_completions", m.completions.into()),
        ("mutex_completions_per_s", round(m.completions_per_s).into()),
        ("mutex_utilization", round3(m.utilization).into()),
        ("mutex_wait_p50_ms", round3(m.wait_ms(0.5)).into()),
        ("mutex_wait_p99_ms", round3(m.wait_ms(0.99)).into()),
        ("mutex_jain_fairness", round3(m.jain_fairness).into()),
        ("mutex_overlaps", m.overlaps.into()),
        ("handoff_floor_ms", round3(s.handoff_floor_ms).into()),
        ("utilization_bound", round3(s.utilization_bound()).into()),
    ])
    .into_iter()
    .chain(spread_json("ratio_to_mutex", r.ratio_to_mutex))
    .chain(spread_json("jain_fairness", r.jain_fairness))
    .chain(spread_json("utilization_to_bound", s.utilization_to_bound))
    .chain(spread_json(
        "mutex_utilization_to_bound",
        m.utilization_to_bound,
    ))
    .collect()
}

/// `rwlock`'s record: the read-write lock's figures (reads and writes
/// apart), the mutex's as `mutex_…`, their ratio, and both against Redis's
/// round trip.
fn rwlock_json(r: &ReadWrite) -> Vec<(String, Value)> {
    let (c, m) = (&r.rwlock, &r.mutex);
    named(vec![
        ("scenario", "rwlock".into()),
        ("mode", mode_name(c.mode).into()),
        ("reads_percent", r.reads_percent.into()),
        ("workers", c.workers.into()),
        ("rounds", c.rounds.into()),
        ("hold_ms", c.hold_ms.into()),
        ("real_hold_ms", round3(c.real_hold_ms).into()),
        ("completions", c.completions.into()),
        ("completions_per_s", round(c.completions_per_s).into()),
        ("reads_per_s", round(r.reads_per_s).into()),
        ("writes_per_s", round(r.writes_per_s).into()),
        ("mean_holders", round3(c.utilization).into()),
        ("wait_p50_ms", round3(c.wait_ms(0.5)).into()),
        ("wait_p99_ms", round3(c.wait_ms(0.99)).into()),
        ("read_wait_p50_ms", round3(r.read_wait_ms(0.5)).into()),
        ("read_wait_p99_ms", round3(r.read_wait_ms(0.99)).into()),
        ("write_wait_p50_ms", round3(r.write_wait_ms(0.5)).into()),
        ("write_wait_p99_ms", round3(r.write_wait_ms(0.99)).into()),
        ("write_wait_max_ms", round3(r.write_wait_ms(1.0)).into()),
        ("jain_fairness", round3(c.jain_fairness).into()),
        (
            "commands_per_completion",
            round3(c.commands_per_completion).into(),
        ),
        ("redis_cpu_ms_per_1k", round3(c.redis_cpu_ms_per_1k).into()),
        ("overlaps", c.overlaps.into()),
        ("mutex_completions", m.completions.into()),
        ("mutex_completions_per_s", round(m.completions_per_s).into()),
        ("mutex_utilization", round3(m.utilization).into()),
        ("mutex_wait_p50_ms", round3(m.wait_ms(0.5)).into()),
        ("mutex_wait_p99_ms", round3(m.wait_ms(0.99)).into()),
        ("mutex_overlaps", m.overlaps.into()),
        ("redis_round_trip_ms", round3(r.round_trip_ms).into()),
        (
            "round_trip_bound_per_s",
            round(r.round_trip_bound_per_s).into(),
        ),
        ("handoff_floor_ms", round3(m.handoff_floor_ms).into()),
        (
            "mutex_utilization_bound",
            round3(m.utilization_bound()).into(),
        ),
    ])
    .into_iter()
    .chain(spread_json("ratio_to_mutex", r.ratio_to_mutex))
    .chain(spread_json(
        "ratio_to_round_trip_bound",
        r.ratio_to_round_trip_bound,
    ))
    .chain(spread_json(
        "mutex_ratio_to_round_trip_bound",
        r.mutex_ratio_to_round_trip_bound,
    ))
    .chain(spread_json(
        "mutex_utilization_to_bound",
        m.utilization_to_bound,
    ))
    .collect()
}

fn named(fields: Vec<(&str, Value)>) -> Vec<(String, Value)> {
    fields
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// `NAME` (the median), `NAME_min` and `NAME_max`, rounded to 3 decimals.
fn spread_json(name: &str, s: Spread) -> Vec<(String, Value)> {
    vec![
        (name.to_string(), round3(s.median).into()),
        (format!("{name}_min"), round3(s.min).into()),
        (format!("{name}_max"), round3(s.max).into()),
    ]
}

fn cycles_json(scenario: &str, r: &Cycles) -> Vec<(String, Value)> {
    let mut fields = named(vec![
        ("scenario", scenario.into()),
        ("topology", r.topology.name().into()),
        ("placement", r.placement.name().into()),
        ("client_cpu", r.placement.client_cpu().into()),
        ("redis_cpu", r.placement.redis_cpu().into()),
        ("mode", mode_name(r.mode).into()),
        ("tasks", r.tasks.into()),
        ("rounds", r.rounds.into()),
        ("cycles_per_s", round(r.fencelock.per_s.median).into()),
        ("floor_cycles_per_s", round(r.floor.per_s.median).into()),
        (
            "unfenced_cycles_per_s",
            round(r.unfenced.per_s.median).into(),
        ),
        ("redis_ping_per_s", round(r.ping.per_s.median).into()),
        (
            "redis_benchmark_ping_per_s",
            r.redis_benchmark_ping_per_s
                .map_or(Value::Null, |s| round(s.median).into()),
        ),
        ("acquire_p50_us", round3(r.fencelock.first_us(0.5)).into()),
        ("acquire_p99_us", round3(r.fencelock.first_us(0.99)).into()),
        ("release_p50_us", round3(r.fencelock.second_us(0.5)).into()),
        ("release_p99_us", round3(r.fencelock.second_us(0.99)).into()),
        ("ping_p50_us", round3(r.ping.first_us(0.5)).into()),
        ("ping_p99_us", round3(r.ping.first_us(0.99)).into()),
        ("floor_grant_p50_us", round3(r.floor.first_us(0.5)).into()),
        (
            "floor_release_p50_us",
            round3(r.floor.second_us(0.5)).into(),
        ),
        (
            "unfenced_acquire_p50_us",
            round3(r.unfenced.first_us(0.5)).into(),
        ),
        (
            "unfenced_release_p50_us",
            round3(r.unfenced.second_us(0.5)).into(),
        ),
        (
            "redis_cpu_ratio_to_floor",
            round3(r.redis_cpu_ratio_to_floor()).into(),
        ),
        (
            "commands_per_cycle",
            round3(r.fencelock.commands_per_cycle).into(),
        ),
        (
            "floor_commands_per_cycle",
            round3(r.floor.commands_per_cycle).into(),
        ),
        (
            "reads_per_cycle",
            round3(r.fencelock.reads_per_cycle).into(),
        ),
        (
            "floor_reads_per_cycle",
            round3(r.floor.reads_per_cycle).into(),
        ),
    ]);
    // Redis's and this process's CPU per cycle of each contestant.
    for (prefix, c) in [
        ("", &r.fencelock),
        ("floor_", &r.floor),
        ("unfenced_", &r.unfenced),
    ] {
        for (what, us) in [
            ("redis", c.redis_cpu_us_per_cycle),
            ("client", c.client_cpu_us_per_cycle),
        ] {
            fields.push((
                format!("{prefix}{what}_cpu_us_per_cycle"),
                round3(us).into(),
            ));
        }
    }
    fields.extend(spread_json("ratio_to_floor", r.ratio_to_floor));
    fields.extend(spread_json("ratio_to_unfenced", r.ratio_to_unfenced));
    fields.extend(spread_json("ratio_to_bound", r.ratio_to_bound));
    fields.extend(spread_json("floor_ratio_to_bound", r.floor_ratio_to_bound));
    fields.extend(spread_json(
        "unfenced_ratio_to_bound",
        r.unfenced_ratio_to_bound,
    ));
    match r.ratio_to_benchmark_bound {
        Some(s) => fields.extend(spread_json("ratio_to_benchmark_bound", s)),
        None => fields.push(("ratio_to_benchmark_bound".into(), Value::Null)),
    }
    fields
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
    use crate::conn::Topology;
    use crate::placement::Placement;
    use crate::report::Record;

    fn contestant(per_s: f64, first: f64, second: f64, cpu: f64) -> Contestant {
        Contestant {
            per_s: Spread {
                median: per_s,
                min: per_s * 0.9,
                max: per_s * 1.1,
            },
            first_us: vec![first, first, first * 2.0],
            second_us: if second > 0.0 {
                vec![second, second, second * 2.0]
            } else {
                Vec::new()
            },
            redis_cpu_us_per_cycle: cpu,
            client_cpu_us_per_cycle: cpu * 2.0,
            commands_per_cycle: 9.0,
            reads_per_cycle: 2.0,
        }
    }

    fn cycles() -> Cycles {
        let s = |median: f64| Spread {
            median,
            min: median - 0.05,
            max: median + 0.05,
        };
        Cycles {
            topology: Topology::Cluster,
            placement: Placement::OtherCpu {
                cpu: 1,
                redis_cpu: 0,
            },
            mode: WaitMode::Notify,
            tasks: 1,
            rounds: 5,
            fencelock: contestant(9000.0, 60.0, 40.0, 30.0),
            floor: contestant(10000.0, 50.0, 40.0, 25.0),
            unfenced: contestant(11000.0, 45.0, 40.0, 20.0),
            ping: contestant(22000.0, 45.0, 0.0, 10.0),
            redis_benchmark_ping_per_s: None,
            ratio_to_floor: s(0.9),
            ratio_to_unfenced: s(0.8),
            ratio_to_bound: s(0.8),
            floor_ratio_to_bound: s(0.9),
            unfenced_ratio_to_bound: s(1.0),
            ratio_to_benchmark_bound: None,
        }
    }

    fn report() -> Report {
        let mut report = Report::new(Header {
            redis: "redis+cluster://:***@127.0.0.1:7000".into(),
            duration: Duration::from_millis(2000),
            rounds: 5,
            placement_note: None,
        });
        let held = Held {
            topology: Topology::Standalone,
            leases: 100_000,
            ttl_ms: 10_000.0,
            acquired_per_s: 12_345.6,
            window_s: 10.0,
            client_bytes_per_lease: 808.4,
            client_cpu_share: 0.1164,
            redis_cpu_share: 0.1312,
            redis_commands_per_s: 60_152.2,
            renewal_lag_max_ms: 10.42,
            leases_lost: 0,
        };
        for (step, measurement) in [
            (0, Measurement::Uncontended(cycles())),
            (1, Measurement::Held(held)),
        ] {
            report.records.push(Record { step, measurement });
        }
        report
    }

    #[test]
    fn cycles_show_every_reference_and_their_ratios() {
        let text = report().render(Format::Text);
        assert!(text.starts_with("fencelock bench on redis+cluster://:***@127.0.0.1:7000: 5 round(s) of 2 s per contestant"), "{text}");
        assert!(text.contains("uncontended: one task, one name, one connection, acquire + release (notify mode, cluster; client on CPU 1, Redis on CPU 0)"), "{text}");
        for row in ["fencelock", "floor", "unfenced", "PING"] {
            assert!(text.contains(&format!("\n  {row} ")), "{row}: {text}");
        }
        assert!(text.contains("0.90 [0.85-0.95]"), "{text}");
        assert!(text.contains("redis-benchmark: not measured"), "{text}");
        assert!(text.contains("    100000    10.0     12346        808     0.116     0.131      60152      10.4     0"), "{text}");
    }

    #[test]
    fn json_carries_units_medians_and_spreads() {
        let json = report().render(Format::JsonLines);
        let lines: Vec<serde_json::Value> = json
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        assert_eq!(lines.len(), 2);
        let u = &lines[0];
        assert_eq!(u["scenario"], "uncontended");
        assert_eq!(u["topology"], "cluster");
        assert_eq!(u["placement"], "other_cpu");
        assert_eq!((&u["client_cpu"], &u["redis_cpu"]), (&1.into(), &0.into()));
        assert_eq!(u["rounds"], 5);
        assert_eq!(u["cycles_per_s"], 9000.0);
        assert_eq!(u["unfenced_cycles_per_s"], 11000.0);
        assert_eq!(u["ratio_to_floor"], 0.9);
        assert_eq!(u["ratio_to_floor_min"], 0.85);
        assert_eq!(u["ratio_to_floor_max"], 0.95);
        assert_eq!(u["ratio_to_unfenced"], 0.8);
        assert_eq!(u["acquire_p50_us"], 60.0);
        assert_eq!(u["release_p99_us"], 80.0);
        assert_eq!(u["ping_p50_us"], 45.0);
        assert_eq!(u["redis_cpu_ratio_to_floor"], 1.2);
        assert_eq!(u["client_cpu_us_per_cycle"], 60.0);
        assert_eq!(u["floor_client_cpu_us_per_cycle"], 50.0);
        assert!(u["redis_benchmark_ping_per_s"].is_null());
        assert!(u["ratio_to_benchmark_bound"].is_null());
        let h = &lines[1];
        assert_eq!(h["scenario"], "held");
        assert_eq!(h["leases"], 100_000);
        assert_eq!(h["client_bytes_per_lease"], 808.0);
        assert_eq!(h["client_cpu_share"], 0.116);
        assert_eq!(h["redis_cpu_share"], 0.131);
        assert_eq!(h["redis_commands_per_s"], 60152.0);
        assert_eq!(h["renewal_lag_max_ms"], 10.42);
        assert_eq!(h["leases_lost"], 0);
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
