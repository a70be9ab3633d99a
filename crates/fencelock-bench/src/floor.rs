//! The references the scenarios are compared with, measured in the same
//! run on the same Redis, each on a plain connection of the lock client's
//! type (see `crate::conn`):
//!
//! - the *fenced floor*: acquire + release cycles of the least Redis work any
//!   lock with clock-floored fences must do (grant: read the last fence, read
//!   the server clock, set the lock if absent, store the fence; release:
//!   compare and delete), as two bare scripts, without wake-ups, queues or a
//!   client library. No fenced lock on this Redis can be faster;
//! - the *unfenced reference*: what locks without fences do (`SET NX PX`,
//!   then a compare-and-delete script), the speed a user compares with;
//! - `PING`: the round trip itself;
//! - the *handoff floor*: after a hold, the time from sending a script that
//!   publishes (as a release does when it hands the lock over) until another
//!   connection receives the message. No hand-over can be quicker, which
//!   bounds the utilization of a contended lock.
//!
//! The cycles of the floor and the unfenced reference run on the same
//! runtime, in the same kind of task and on the same kind of connection as
//! fencelock's in the same scenario: the calling task itself for one
//! connection (no task spawned), one task per name for many names.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{PushKind, Script, Value};
use tokio::time::Instant;

use crate::conn::{Opener, RefConn};
use crate::error::{Error, Result};
use crate::measure::quantile;
use crate::url::RedisUrl;

static GRANT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local last = redis.call('GET', KEYS[2])
local t = redis.call('TIME')
local f = math.max((tonumber(last) or 0) + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
local v = ARGV[1] .. ':' .. string.format('%d', f)
if redis.call('SET', KEYS[1], v, 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[2], string.format('%d', f), 'PX', ARGV[3])
  return v
end
return false
",
    )
});

static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
",
    )
});

/// One cycler: something that takes and releases a lock (or pings) in a
/// loop, with the two halves of a cycle timed.
#[derive(Clone)]
pub(crate) enum Cycler {
    /// fencelock itself: `acquire` then `release`.
    Fencelock {
        client: fencelock::LockClient,
        opts: fencelock::LockOptions,
        name: String,
    },
    /// The fenced floor's two scripts.
    Floor {
        conn: RefConn,
        lock: String,
        fence: String,
    },
    /// `SET NX PX`, then compare-and-delete.
    Unfenced { conn: RefConn, lock: String },
    /// `PING` to the server of `key`.
    Ping { conn: RefConn, key: String },
}

impl Cycler {
    /// One cycle: how long its first half (grant, PING) and its second
    /// half (release) took.
    pub(crate) async fn cycle(&mut self) -> Result<(Duration, Duration)> {
        let started = Instant::now();
        match self {
            Cycler::Fencelock { client, opts, name } => {
                let lease = client.acquire(name, opts).await?;
                let granted = Instant::now();
                lease.release().await?;
                Ok((granted - started, granted.elapsed()))
            }
            Cycler::Floor { conn, lock, fence } => {
                let token = uuid::Uuid::new_v4().to_string();
                let value: Option<String> = conn
                    .invoke(
                        GRANT
                            .key(&*lock)
                            .key(&*fence)
                            .arg(&token)
                            .arg(30_000)
                            .arg(86_400_000),
                    )
                    .await?;
                let granted = Instant::now();
                let value = value.ok_or_else(|| Error::failed("a floor grant was refused"))?;
                let released: i64 = conn.invoke(RELEASE.key(&*lock).arg(&value)).await?;
                if released != 1 {
                    return Err(Error::failed("a floor release found the lock gone"));
                }
                Ok((granted - started, granted.elapsed()))
            }
            Cycler::Unfenced { conn, lock } => {
                let token = uuid::Uuid::new_v4().to_string();
                let set: Option<String> = conn
                    .query(
                        redis::cmd("SET")
                            .arg(&*lock)
                            .arg(&token)
                            .arg("NX")
                            .arg("PX")
                            .arg(30_000),
                        lock,
                    )
                    .await?;
                let granted = Instant::now();
                if set.is_none() {
                    return Err(Error::failed("an unfenced grant was refused"));
                }
                let released: i64 = conn.invoke(RELEASE.key(&*lock).arg(&token)).await?;
                if released != 1 {
                    return Err(Error::failed("an unfenced release found the lock gone"));
                }
                Ok((granted - started, granted.elapsed()))
            }
            Cycler::Ping { conn, key } => {
                let _: String = conn.query(&redis::cmd("PING"), key).await?;
                Ok((started.elapsed(), Duration::ZERO))
            }
        }
    }
}

/// The floor's, the unfenced reference's and PING's cyclers for the
/// fencelock lock key `lock_key`: their keys share its hash tag, so on a
/// Cluster they live on the node that serves it.
pub(crate) async fn references(opener: &Opener, lock_key: &str) -> Result<[Cycler; 3]> {
    let conn = opener.open().await?;
    Ok([
        Cycler::Floor {
            conn: conn.clone(),
            lock: format!("{lock_key}:floor"),
            fence: format!("{lock_key}:floor:fence"),
        },
        Cycler::Unfenced {
            conn: conn.clone(),
            lock: format!("{lock_key}:unfenced"),
        },
        Cycler::Ping {
            conn,
            key: lock_key.to_string(),
        },
    ])
}

/// The same references sharing `conn` (for many tasks on one connection).
pub(crate) fn references_on(conn: &RefConn, lock_key: &str) -> [Cycler; 3] {
    [
        Cycler::Floor {
            conn: conn.clone(),
            lock: format!("{lock_key}:floor"),
            fence: format!("{lock_key}:floor:fence"),
        },
        Cycler::Unfenced {
            conn: conn.clone(),
            lock: format!("{lock_key}:unfenced"),
        },
        Cycler::Ping {
            conn: conn.clone(),
            key: lock_key.to_string(),
        },
    ]
}

/// The median handoff floor in ms over `samples` hand-overs, each after a
/// hold of `hold` (so both ends are idle, as a waiter and Redis are while a
/// lock is held). The publisher and the subscriber are threads with their
/// own runtimes, like the workers of the contended scenario.
pub(crate) async fn handoff_ms(
    url: &RedisUrl,
    opener: &Opener,
    channel: &str,
    hold: Duration,
    samples: usize,
) -> Result<f64> {
    let (url, opener, channel) = (url.clone(), opener.clone(), channel.to_string());
    tokio::task::spawn_blocking(move || handoff_on_threads(&url, &opener, &channel, hold, samples))
        .await?
}

fn handoff_on_threads(
    url: &RedisUrl,
    opener: &Opener,
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
                .block_on(publish_samples(opener, channel, hold, samples, &received))
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
    opener: &Opener,
    channel: &str,
    hold: Duration,
    samples: usize,
    received: &std::sync::mpsc::Receiver<(Instant, Vec<u8>)>,
) -> Result<Vec<f64>> {
    let mut publisher = opener.open().await?;
    let publish = Script::new("return redis.call('PUBLISH', KEYS[1], ARGV[1])");
    let mut floors = Vec::with_capacity(samples);
    for i in 0..samples {
        std::thread::sleep(hold);
        let sent = Instant::now();
        let receivers: i64 = publisher.invoke(publish.key(channel).arg(i)).await?;
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
