//! Clean-ups sent in the background: what a dropped acquisition or a
//! dropped lease leaves to do (delete a waiter's etcd key, release a
//! held lock) runs as a task of its own, since `Drop` cannot wait.
//!
//! A process that ends its runtime right after such a drop (a Ctrl-C
//! handler that returns from `main`) would cancel those tasks before they
//! reach the store; [`Cleanups::finished`] lets it wait for them first
//! (`LockClient::flush`).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

/// The clean-up tasks of one client still running. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Cleanups {
    /// How many are running.
    running: Arc<watch::Sender<usize>>,
}

impl Default for Cleanups {
    fn default() -> Self {
        Cleanups {
            running: Arc::new(watch::Sender::new(0)),
        }
    }
}

/// Counts one clean-up as finished when dropped: when it completes, and
/// also when the runtime cancels it.
struct Running(Arc<watch::Sender<usize>>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Cleanups {
    /// Runs `cleanup` as a task of its own on the current tokio runtime;
    /// without one (a drop outside any runtime) it is not run, and what it
    /// would have removed expires by its ttl.
    pub(crate) fn spawn<F>(&self, cleanup: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.running.send_modify(|n| *n += 1);
        let running = Running(self.running.clone());
        runtime.spawn(async move {
            let _running = running;
            cleanup.await;
        });
    }

    /// Completes once no clean-up is running.
    pub(crate) async fn finished(&self) {
        let mut count = self.running.subscribe();
        // The sender lives in `self`: the wait cannot fail.
        let _ = count.wait_for(|n| *n == 0).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn finished_waits_for_every_spawned_cleanup() {
        let cleanups = Cleanups::default();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..3u64 {
            let done = done_tx.clone();
            cleanups.spawn(async move {
                tokio::time::sleep(Duration::from_millis(10 * i)).await;
                let _ = done.send(i);
            });
        }
        cleanups.finished().await;
        let mut seen = Vec::new();
        while let Ok(i) = done_rx.try_recv() {
            seen.push(i);
        }
        assert_eq!(seen, [0, 1, 2]);
        // Nothing running: at once.
        cleanups.finished().await;
    }
}
