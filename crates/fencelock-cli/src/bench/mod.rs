//! `fencelock bench`: the benchmark of DESIGN.md §6 against a real Redis,
//! every figure next to that Redis's own round-trip rate from the same run.
//!
//! | module | concern |
//! |---|---|
//! | `measure` | PING rates, INFO counters, statistics |
//! | `floor` | the fenced floor and the handoff floor: the bounds of the targets |
//! | `scenarios` | uncontended, contended (per wait mode), many |
//! | `plot` | the `--plot` SVG |

mod floor;
mod measure;
mod plot;
mod scenarios;

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::cli::{BenchArgs, Global, ScenarioArg};
use crate::exit;
use crate::private_redis::PrivateRedis;
use scenarios::{Setup, mode_name};

pub(crate) async fn run(global: &Global, args: &BenchArgs) -> anyhow::Result<u8> {
    if args.workers == 0 || args.tasks == 0 {
        return Err(exit::fail(
            exit::USAGE,
            "--workers and --tasks must be at least 1",
        ));
    }
    if args.plot.is_some() && !args.scenario.contains(&ScenarioArg::Contended) {
        return Err(exit::fail(
            exit::USAGE,
            "--plot needs the contended scenario: add --scenario contended",
        ));
    }
    // An unwritable plot path is reported now, not after the whole run (an
    // existing plot is kept until the new one is written).
    if let Some(path) = &args.plot {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| {
                exit::fail(
                    exit::USAGE,
                    format!("--plot {}: cannot create it: {e}", path.display()),
                )
            })?;
    }
    let (url, private) = PrivateRedis::unless_given(global.redis.as_deref()).await?;
    let result = run_on(global, args, &url).await;
    if let Some(p) = private {
        p.stop().await;
    }
    result
}

async fn run_on(global: &Global, args: &BenchArgs, url: &str) -> anyhow::Result<u8> {
    let options = fencelock::LockOptions::default()
        .layout(global.layout.into())
        .fence_mode(
            global
                .fence_mode
                .map_or(fencelock::FenceMode::Clock, Into::into),
        );
    let setup = Setup {
        url: url.to_string(),
        prefix: global.prefix.clone(),
        duration: args.duration,
        options,
    };
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    if !args.json {
        println!(
            "fencelock bench on {url}: {} s per scenario, loopback round trips measured in the same run",
            args.duration.as_secs_f64()
        );
    }
    let mut contended_runs = Vec::new();
    for scenario in &args.scenario {
        match scenario {
            ScenarioArg::Uncontended => {
                let r = with_progress(
                    "uncontended",
                    args.duration * 3 / 2,
                    scenarios::uncontended(&setup, &run_id),
                )
                .await?;
                if args.json {
                    println!(
                        "{}",
                        json!({
                            "scenario": "uncontended", "mode": mode_name(r.mode),
                            "cycles_per_s": round(r.cycles_per_s), "redis_ping_per_s": round(r.redis_ping_per_s),
                            "ratio_to_bound": round3(r.ratio_to_bound),
                            "floor_cycles_per_s": round(r.floor_cycles_per_s),
                            "floor_ratio_to_bound": round3(r.floor_cycles_per_s / (r.redis_ping_per_s / 2.0)),
                            "ratio_to_floor": round3(r.cycles_per_s / r.floor_cycles_per_s),
                        })
                    );
                } else {
                    println!();
                    println!(
                        "uncontended: one connection, acquire + release of one name ({} mode)",
                        mode_name(r.mode)
                    );
                    println!(
                        "  cycles/s {:>10.0}   Redis PING/s {:>10.0}   ratio to the 2-round-trip bound {:.2}",
                        r.cycles_per_s, r.redis_ping_per_s, r.ratio_to_bound
                    );
                    println!(
                        "  fenced floor {:>6.0} cycles/s (ratio to the bound {:.2}); fencelock reaches {:.2} of it",
                        r.floor_cycles_per_s,
                        r.floor_cycles_per_s / (r.redis_ping_per_s / 2.0),
                        r.cycles_per_s / r.floor_cycles_per_s
                    );
                }
            }
            ScenarioArg::Contended => {
                let handoff_floor = with_progress(
                    "handoff floor",
                    args.hold * 200,
                    floor::handoff_ms(
                        url,
                        &format!("{}bench:{run_id}:floor", global.prefix),
                        args.hold,
                        200,
                    ),
                )
                .await?;
                if !args.json {
                    println!();
                    println!(
                        "contended: {} workers (threads with their own runtime and connections), one name, hold {} ms",
                        args.workers,
                        args.hold.as_secs_f64() * 1e3
                    );
                    println!(
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
                for mode in &args.mode {
                    let mode = (*mode).into();
                    let label = format!("contended {}", mode_name(mode));
                    let r = with_progress(
                        &label,
                        args.duration,
                        scenarios::contended(&setup, &run_id, mode, args.workers, args.hold),
                    )
                    .await?;
                    if args.json {
                        println!(
                            "{}",
                            json!({
                                "scenario": "contended", "mode": mode_name(mode), "workers": r.workers,
                                "hold_ms": r.hold_ms, "real_hold_ms": round3(r.real_hold_ms),
                                "completions": r.completions,
                                "completions_per_s": round(r.completions_per_s), "utilization": round3(r.utilization),
                                "wait_p50_ms": round3(r.wait_ms(0.5)), "wait_p99_ms": round3(r.wait_ms(0.99)),
                                "wait_max_ms": round3(r.wait_ms(1.0)),
                                "handoff_p50_ms": round3(r.handoff_ms(0.5)), "handoff_p99_ms": round3(r.handoff_ms(0.99)),
                                "handoffs": r.handoffs_ms.len(), "same_worker_share": round3(r.same_worker_share),
                                "jain_fairness": round3(r.jain_fairness),
                                "commands_per_completion": round3(r.commands_per_completion),
                                "redis_cpu_ms_per_1k": round3(r.redis_cpu_ms_per_1k), "overlaps": r.overlaps,
                                "handoff_floor_ms": round3(handoff_floor),
                                "utilization_bound": round3(r.utilization_bound(handoff_floor)),
                            })
                        );
                    } else {
                        println!(
                            "  {:<7} {:>9.0} {:>6.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>6.3} {:>8.2} {:>8.1} {:>7.1}% {:>5}",
                            mode_name(mode),
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
                    contended_runs.push(r);
                }
                if !args.json {
                    let holds: Vec<String> = contended_runs
                        .iter()
                        .map(|r| format!("{} {:.3} ms", mode_name(r.mode), r.real_hold_ms))
                        .collect();
                    println!("  measured hold per completion: {}", holds.join(", "));
                    let bounds: Vec<String> = contended_runs
                        .iter()
                        .map(|r| {
                            format!(
                                "{} {:.3}",
                                mode_name(r.mode),
                                r.utilization_bound(handoff_floor)
                            )
                        })
                        .collect();
                    println!(
                        "  handoff floor (a publishing script after a hold -> another connection receives it) p50 {handoff_floor:.3} ms: utilization bound {}",
                        bounds.join(", ")
                    );
                    println!(
                        "  (times in ms; hand = release -> grant to a different worker; same % = grants back to the releasing worker; cpu/1k = Redis CPU ms per 1,000 completions; ovl = overlapping holders, must be 0)"
                    );
                }
            }
            ScenarioArg::Many => {
                let r = with_progress(
                    "many",
                    args.duration * 3 / 2,
                    scenarios::many(&setup, &run_id, args.tasks),
                )
                .await?;
                if args.json {
                    println!(
                        "{}",
                        json!({
                            "scenario": "many", "tasks": r.tasks, "cycles_per_s": round(r.cycles_per_s),
                            "redis_ping_c64_per_s": round(r.redis_ping_c64_per_s), "ratio_to_bound": round3(r.ratio_to_bound),
                            "redis_cpu_us_per_cycle": round3(r.redis_cpu_us_per_cycle),
                            "commands_per_cycle": round3(r.commands_per_cycle),
                            "floor_cycles_per_s": round(r.floor.cycles_per_s),
                            "floor_ratio_to_bound": round3(r.floor.cycles_per_s / (r.redis_ping_c64_per_s / 2.0)),
                            "floor_redis_cpu_us_per_cycle": round3(r.floor.redis_cpu_us_per_cycle),
                        })
                    );
                } else {
                    println!();
                    println!(
                        "many: {} tasks on {} names sharing one client",
                        r.tasks, r.tasks
                    );
                    println!(
                        "  cycles/s {:>10.0}   Redis PING/s with {} connections {:>10.0}   ratio to bound {:.2}   Redis CPU {:.1} µs/cycle",
                        r.cycles_per_s,
                        r.tasks,
                        r.redis_ping_c64_per_s,
                        r.ratio_to_bound,
                        r.redis_cpu_us_per_cycle
                    );
                    println!(
                        "  fenced floor {:>6.0} cycles/s (ratio to the bound {:.2}, Redis CPU {:.1} µs/cycle); fencelock reaches {:.2} of it",
                        r.floor.cycles_per_s,
                        r.floor.cycles_per_s / (r.redis_ping_c64_per_s / 2.0),
                        r.floor.redis_cpu_us_per_cycle,
                        r.cycles_per_s / r.floor.cycles_per_s
                    );
                }
            }
        }
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::render(&contended_runs))
            .with_context(|| format!("cannot write {}", path.display()))?;
        if !args.json {
            println!();
            println!("plot written to {}", path.display());
        }
    }
    let overlaps: u64 = contended_runs.iter().map(|r| r.overlaps).sum();
    Ok(if overlaps == 0 {
        exit::OK
    } else {
        exit::FAILED
    })
}

/// Runs `work`, showing "scenario… elapsed/expected" on stderr when it is a
/// terminal (never on stdout, so `--json` output stays clean).
async fn with_progress<T>(label: &str, expected: Duration, work: impl Future<Output = T>) -> T {
    if !std::io::stderr().is_terminal() {
        return work.await;
    }
    let done = Arc::new(AtomicBool::new(false));
    let ticker = {
        let (done, label) = (done.clone(), label.to_string());
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            while !done.load(Ordering::Relaxed) {
                eprint!(
                    "\r\x1b[2K  running {label}… {:.0}/{:.0} s",
                    started.elapsed().as_secs_f64(),
                    expected.as_secs_f64()
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            eprint!("\r\x1b[2K");
        })
    };
    let out = work.await;
    done.store(true, Ordering::Relaxed);
    let _ = ticker.await;
    out
}

fn round(v: f64) -> f64 {
    v.round()
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}
