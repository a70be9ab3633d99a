//! The physical floors the scenarios are compared with, measured in the same
//! run on the same Redis:
//!
//! - the *fenced floor*: acquire + release cycles of the least Redis work any
//!   lock with clock-floored fences must do (grant: read the last fence, read
//!   the server clock, set the lock if absent, store the fence; release:
//!   compare and delete), as two bare scripts on a plain connection, without
//!   wake-ups, queues or a client library. No fenced lock on this Redis can
//!   be faster, so a target above this floor is out of reach;
//! - the *handoff floor*: after a hold, the time from sending a script that
//!   publishes (as a release does when it hands the lock over) until another
//!   connection receives the message. No hand-over can be quicker, which
//!   bounds the utilization of a contended lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{PushKind, Script, Value};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::measure::{ServerCounters, connection, quantile};
use crate::url::RedisUrl;

const GRANT: &str = r"
local last = redis.call('GET', KEYS[2])
local t = redis.call('TIME')
local f = math.max((tonumber(last) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
local v = ARGV[1] .. ':' .. string.format('%d', f)
if redis.call('SET', KEYS[1], v, 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[2], string.format('%d', f), 'PX', ARGV[3])
  return v
end
return false
";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// The fenced floor: acquire + release cycles of the least Redis work a
/// clock-fenced lock must do, as two bare scripts on a plain connection. No
/// fenced lock on the same Redis can be faster.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// Cycles per second, all tasks together.
    pub cycles_per_s: f64,
    /// Redis CPU µs per cycle.
    pub redis_cpu_us_per_cycle: f64,
}

/// Runs `tasks` tasks, each cycling the floor scripts on its own name, all
/// sharing one multiplexed connection (as a lock client's tasks do), for
/// `duration`. Keys live under `prefix`.
pub(crate) async fn fenced(
    url: &RedisUrl,
    prefix: &str,
    tasks: usize,
    duration: Duration,
) -> Result<Floor> {
    let conn = connection(url).await?;
    let (grant, release) = (Arc::new(Script::new(GRANT)), Arc::new(Script::new(RELEASE)));
    let stop = Arc::new(AtomicBool::new(false));
    let before = ServerCounters::read(url).await?;
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (mut conn, grant, release, stop) =
                (conn.clone(), grant.clone(), release.clone(), stop.clone());
            let (lock, fence) = (format!("{prefix}{{{i}}}"), format!("{prefix}{{{i}}}:fence"));
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let token = uuid::Uuid::new_v4().to_string();
                    let value: Option<String> = grant
                        .key(&lock)
                        .key(&fence)
                        .arg(&token)
                        .arg(30_000)
                        .arg(86_400_000)
                        .invoke_async(&mut conn)
                        .await?;
                    let value = value.ok_or_else(|| Error::failed("a floor grant was refused"))?;
                    let released: i64 = release
                        .key(&lock)
                        .arg(&value)
                        .invoke_async(&mut conn)
                        .await?;
                    if released != 1 {
                        return Err(Error::failed("a floor release found the lock gone"));
                    }
                    n += 1;
                }
                Ok::<_, Error>(n)
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0u64;
    for h in handles {
        total += h.await??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (_, cpu_s) = before.delta(ServerCounters::read(url).await?);
    Ok(Floor {
        cycles_per_s: total as f64 / elapsed,
        redis_cpu_us_per_cycle: cpu_s * 1e6 / total.max(1) as f64,
    })
}

/// The median handoff floor in ms over `samples` hand-overs, each after a
/// hold of `hold` (so both ends are idle, as a waiter and Redis are while a
/// lock is held). The publisher and the subscriber are threads with their
/// own runtimes, like the workers of the contended scenario.
pub(crate) async fn handoff_ms(
    url: &RedisUrl,
    channel: &str,
    hold: Duration,
    samples: usize,
) -> Result<f64> {
    let (url, channel) = (url.clone(), channel.to_string());
    tokio::task::spawn_blocking(move || handoff_on_threads(&url, &channel, hold, samples)).await?
}

fn handoff_on_threads(
    url: &RedisUrl,
    channel: &str,
    hold: Duration,
    samples: usize,
) -> Result<f64> {
    let (received_tx, received) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let (ready_tx, ready) = std::sync::mpsc::channel::<Result<()>>();
    let done = Arc::new(tokio::sync::Notify::new());
    let subscriber = {
        let (url, channel, done) = (url.clone(), channel.to_string(), done.clone());
        std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            runtime.block_on(async move {
                let finished = done.notified();
                // Stamped where the message arrives, in the connection's
                // reader, before any task is woken.
                let sender = move |push: redis::PushInfo| -> Result<(), std::convert::Infallible> {
                    if let (PushKind::Message, Some(Value::BulkString(b))) =
                        (push.kind, push.data.get(1))
                    {
                        let _ = received_tx.send((Instant::now(), b.clone()));
                    }
                    Ok(())
                };
                match subscribe(&url, &channel, sender).await {
                    Ok(_connection) => {
                        let _ = ready_tx.send(Ok(()));
                        finished.await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })
    };
    let measured = ready
        .recv()
        .map_err(|_| Error::failed("the floor subscriber thread ended"))
        .and_then(|r| r)
        .and_then(|()| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(publish_samples(url, channel, hold, samples, &received))
        });
    done.notify_one();
    let _ = subscriber.join();
    let mut floors = measured?;
    floors.sort_by(f64::total_cmp);
    Ok(quantile(&floors, 0.5))
}

async fn subscribe(
    url: &RedisUrl,
    channel: &str,
    sender: impl redis::aio::AsyncPushSender,
) -> Result<redis::aio::MultiplexedConnection> {
    let info = redis::IntoConnectionInfo::into_connection_info(url.raw())
        .map_err(|e| Error::connecting(url, e))?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    let client = redis::Client::open(info.set_redis_settings(settings))
        .map_err(|e| Error::connecting(url, e))?;
    let config = redis::AsyncConnectionConfig::new().set_push_sender(sender);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| Error::connecting(url, e))?;
    conn.subscribe(channel).await?;
    Ok(conn)
}

async fn publish_samples(
    url: &RedisUrl,
    channel: &str,
    hold: Duration,
    samples: usize,
    received: &std::sync::mpsc::Receiver<(Instant, Vec<u8>)>,
) -> Result<Vec<f64>> {
    let mut publisher = connection(url).await?;
    let publish = Script::new("return redis.call('PUBLISH', KEYS[1], ARGV[1])");
    let mut floors = Vec::with_capacity(samples);
    for i in 0..samples {
        std::thread::sleep(hold);
        let sent = Instant::now();
        let receivers: i64 = publish
            .key(channel)
            .arg(i)
            .invoke_async(&mut publisher)
            .await?;
        if receivers != 1 {
            return Err(Error::failed("the floor subscriber is not subscribed"));
        }
        let expected = i.to_string().into_bytes();
        loop {
            let (at, payload) = received
                .recv_timeout(Duration::from_secs(5))
                .map_err(|_| Error::failed("the floor subscriber received nothing within 5 s"))?;
            if payload == expected {
                floors.push(at.saturating_duration_since(sent).as_secs_f64() * 1e3);
                break;
            }
        }
    }
    Ok(floors)
}
