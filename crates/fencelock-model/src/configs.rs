//! The larger configurations of the opt-in run (`scripts/model-large`,
//! `cargo run --release -p fencelock-model --example large`): more clients,
//! more cycles and every fault at once, minutes where the default run in
//! `tests/model.rs` takes seconds. The test suite checks the first states
//! of each (so a configuration that breaks is noticed), the opt-in run all
//! of them.

use crate::model::{Faults, LockModel, Replicated};
use crate::store::{FenceMode, WaitMode};

/// Every fault but the failover (whose excuse would cover the others).
fn every_fault_but_failover() -> Faults {
    Faults {
        lost_reply: true,
        lose_data: true,
        failover: false,
        clock_back: true,
        clock_forward: true,
        revoke: true,
    }
}

/// The opt-in configurations, by name.
pub fn large() -> Vec<(&'static str, LockModel)> {
    let base = LockModel::default();
    vec![
        (
            "every fault but the failover, clock fences",
            LockModel {
                faults: every_fault_but_failover(),
                ..base.clone()
            },
        ),
        (
            "a lost reply, a data loss, a failover and a revoke, counter fences",
            LockModel {
                fence_mode: FenceMode::Counter,
                faults: Faults {
                    lost_reply: true,
                    lose_data: true,
                    failover: true,
                    revoke: true,
                    ..Faults::default()
                },
                ..base.clone()
            },
        ),
        (
            "two cycles each, a failover, grants and renewals waiting for the replica",
            LockModel {
                cycles: 2,
                max_ticks: 6,
                faults: Faults {
                    failover: true,
                    ..Faults::default()
                },
                replicas: Replicated::GrantsAndRenewals,
                ..base.clone()
            },
        ),
        (
            "three clients, a revoke",
            LockModel {
                clients: 3,
                faults: Faults {
                    revoke: true,
                    ..Faults::default()
                },
                ..base.clone()
            },
        ),
        (
            "three clients, two cycles each",
            LockModel {
                clients: 3,
                cycles: 2,
                max_ticks: 6,
                ..base.clone()
            },
        ),
        (
            "three clients, fair, a revoke",
            LockModel {
                clients: 3,
                wait_mode: WaitMode::Fair,
                faults: Faults {
                    revoke: true,
                    ..Faults::default()
                },
                ..base.clone()
            },
        ),
        (
            "three clients, every fault but the failover",
            LockModel {
                clients: 3,
                faults: every_fault_but_failover(),
                ..base.clone()
            },
        ),
        (
            "two cycles each, every fault but the failover",
            LockModel {
                cycles: 2,
                max_ticks: 6,
                faults: every_fault_but_failover(),
                ..base.clone()
            },
        ),
        (
            "four clients",
            LockModel {
                clients: 4,
                ..base.clone()
            },
        ),
    ]
}
