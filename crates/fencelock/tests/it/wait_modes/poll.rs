//! Poll mode: a waiter retries with backoff, costing Redis a script call
//! each time, and notices a release at most one capped backoff late.

use std::time::Duration;

use anyhow::{Result, ensure};
use fencelock::WaitMode;

use super::SLACK;
use super::common::wait_behind_a_two_second_holder;

/// The negative control of notify's silent wait
/// (`notify::heavy_notify_waiter_sends_nothing_while_waiting_and_wakes_at_the_release`):
/// the same wait in poll mode costs Redis many script calls (backoff from
/// 4 ms up to 200 ms: at least 8 in 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heavy_poll_waiter_retries_many_times_while_the_lock_is_held() -> Result<()> {
    let waited = wait_behind_a_two_second_holder(WaitMode::Poll).await?;
    eprintln!("poll: {waited:?}");
    ensure!(
        waited.scripts >= 8,
        "a poll waiter made only {} script calls in 2 s of waiting",
        waited.scripts
    );
    // A poller notices a release at most one capped backoff (200 ms) late.
    ensure!(
        waited.release_to_grant <= Duration::from_millis(200) + SLACK,
        "the poller took {:?} after the release",
        waited.release_to_grant
    );
    Ok(())
}
