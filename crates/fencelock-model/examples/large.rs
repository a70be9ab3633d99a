//! The opt-in run of the model's larger configurations
//! ([`fencelock_model::configs::large`]): each checked to the end (with
//! symmetry reduction: states that differ only by which client is which are
//! explored once), its unique states and time printed; exits non-zero if a property fails or a
//! `sometimes` property is never reached.
//!
//! `cargo run --release -p fencelock-model --example large [NAME-SUBSTRING]`

use std::process::ExitCode;

use fencelock_model::configs;
use stateright::{Checker, Model};

fn main() -> ExitCode {
    let only = std::env::args().nth(1).unwrap_or_default();
    let mut failed = false;
    for (name, model) in configs::large() {
        if !name.contains(&only) {
            continue;
        }
        let started = std::time::Instant::now();
        let properties = model.properties();
        // Clients are interchangeable: each orbit of states is explored
        // once (symmetry reduction, a depth-first search).
        let checker = model.checker().threads(2).symmetry().spawn_dfs().join();
        let states = checker.unique_state_count();
        let mut verdict = Vec::new();
        for p in &properties {
            let found = checker.discovery(p.name).is_some();
            let sometimes = matches!(p.expectation, stateright::Expectation::Sometimes);
            if found != sometimes {
                failed = true;
                verdict.push(if sometimes {
                    format!("never reached: {}", p.name)
                } else {
                    format!("FAILS: {}", p.name)
                });
                if let Some(path) = checker.discovery(p.name).filter(|_| !sometimes) {
                    eprintln!("{name}: {} fails:\n{path}", p.name);
                }
            }
        }
        let verdict = if verdict.is_empty() {
            "every property holds".to_owned()
        } else {
            verdict.join("; ")
        };
        eprintln!(
            "{name}: {states} unique states in {:.1?}: {verdict}",
            started.elapsed()
        );
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
