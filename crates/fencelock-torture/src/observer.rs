//! The observer: polls the lock keys every 2 ms on a connection of its own
//! (straight to the lock server, never through the proxy) and records every
//! change of holder as an `observed` event: Redis's own view of who holds
//! each name, in Redis's order. The checkers use it for the grant order
//! (C6), resurrected keys (C7) and the moment a loss became visible (C5).
//!
//! It runs on a thread of its own so that the coordinator's work does not
//! delay its polls; it stops when told, or when the run's channel closes.

use std::time::Duration;

use fencelock::{KeyLayout, LockKeys, holder_id};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::clock::RunClock;
use crate::error::{Error, Result};
use crate::history::{Entry, Event};

/// How often the lock keys are read.
pub(crate) const POLL: Duration = Duration::from_millis(2);

/// A running observer.
#[derive(Debug)]
pub(crate) struct Observer {
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What one poll found for a name: holder id and fence, or absent.
type Seen = Option<(String, Option<u64>)>;

impl Observer {
    pub(crate) fn start(
        url: &str,
        prefix: &str,
        layout: KeyLayout,
        names: &[String],
        clock: RunClock,
        events: UnboundedSender<Event>,
    ) -> Result<Self> {
        let keys: Vec<String> = names
            .iter()
            .map(|n| LockKeys::new(prefix, layout, n).map(|k| k.lock))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| Error::usage(e.to_string()))?;
        let client = redis::Client::open(url).map_err(|e| Error::redis(url, &e))?;
        let names = names.to_vec();
        let stop = CancellationToken::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("torture-observer".into())
                .spawn(move || {
                    runtime.block_on(observe(client, keys, names, layout, clock, events, stop));
                })
                .map_err(|e| Error::failed(format!("cannot start the observer thread: {e}")))?
        };
        Ok(Observer {
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.halt();
    }
}

fn parse(value: Option<String>, layout: KeyLayout) -> Seen {
    let value = value?;
    let (token, fence) = fencelock::testing::parse_lock_value(&value, layout);
    Some((holder_id(token), fence.map(|f| f.get())))
}

async fn observe(
    client: redis::Client,
    keys: Vec<String>,
    names: Vec<String>,
    layout: KeyLayout,
    clock: RunClock,
    events: UnboundedSender<Event>,
    stop: CancellationToken,
) {
    let mut last: Vec<Option<Seen>> = vec![None; keys.len()];
    let mut conn = None;
    while !stop.is_cancelled() {
        if conn.is_none() {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_millis(500)))
                .set_response_timeout(Some(Duration::from_secs(5)));
            let connect = client.get_multiplexed_async_connection_with_config(&config);
            conn = tokio::select! {
                () = stop.cancelled() => return,
                c = connect => c.ok(),
            };
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let sent = clock.now();
        let mut mget = redis::cmd("MGET");
        mget.arg(&keys);
        let reply: redis::RedisResult<Vec<Option<String>>> = tokio::select! {
            () = stop.cancelled() => return,
            r = mget.query_async(c) => r,
        };
        let t = clock.now();
        match reply {
            Ok(values) => {
                for (i, value) in values.into_iter().enumerate() {
                    let seen = parse(value, layout);
                    if last[i].as_ref() != Some(&seen) {
                        let (holder, fence) = match &seen {
                            Some((h, f)) => (Some(h.clone()), *f),
                            None => (None, None),
                        };
                        let event = Event {
                            t,
                            p: "observer".into(),
                            e: Entry::Observed {
                                name: names[i].clone(),
                                holder,
                                fence,
                                sent,
                            },
                        };
                        if events.send(event).is_err() {
                            return;
                        }
                        last[i] = Some(seen);
                    }
                }
            }
            Err(_) => conn = None,
        }
        tokio::time::sleep(POLL).await;
    }
}
