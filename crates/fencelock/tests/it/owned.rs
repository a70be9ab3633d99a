//! The owned entry points (`try_acquire_owned`, `acquire_owned`,
//! `extend_owned`, `release`) are futures that are `Send + 'static`: they
//! run on a spawned task, away from the client and the lease they came
//! from, and behave as the borrowed calls do. (`tokio::spawn` takes only
//! `Send + 'static` futures: a future that borrowed its client would not
//! compile here.)

use std::time::Duration;

use anyhow::{Result, ensure};
use fencelock::{Error, ReleaseOutcome};

use crate::support::fixture::{Fixture, holder_opts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_calls_run_on_spawned_tasks() -> Result<()> {
    let fixture = Fixture::start().await?;
    let opts = holder_opts(Duration::from_secs(5));
    let name = fixture.name.clone();

    let lease = tokio::spawn(fixture.holder.acquire_owned(name.clone(), opts.clone())).await??;
    // The waiter's attempt, spawned too, is refused while the lock is held.
    let refused =
        tokio::spawn(fixture.waiter.try_acquire_owned(name.clone(), opts.clone())).await?;
    ensure!(
        matches!(refused, Err(Error::Contended { .. })),
        "{refused:?}"
    );

    tokio::spawn(lease.extend_owned()).await??;
    ensure!(lease.remaining() > Duration::from_secs(4), "extended");
    let fence = lease.fence();
    let released = tokio::spawn(lease.release()).await??;
    ensure!(released == ReleaseOutcome::Released, "{released:?}");

    let next = tokio::spawn(fixture.waiter.try_acquire_owned(name, opts)).await??;
    ensure!(next.fence() > fence, "{} after {fence}", next.fence());
    next.release().await?;
    Ok(())
}
