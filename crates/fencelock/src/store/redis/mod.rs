//! The Redis store: I/O only — typed script calls and replies, the scripts,
//! the data kept in Redis, and the connection to every kind of deployment.
//! What to call and when (waiting, retries, hand-over trust, renewal
//! timing) is the engine's (`engine::redis`).
//!
//! | module | concern |
//! |---|---|
//! | `ops` | the operations as typed calls and replies, one file per operation (`ops/grant.rs`, `ops/release.rs`, `ops/extend.rs`, `ops/leave.rs`, `ops/inspect.rs`, `ops/fenced_write.rs`): the one place where a script's arguments are encoded and its reply decoded |
//! | `scripts` | the Lua scripts, one per operation (`scripts/*.lua`), and how they are put together (the fast paths that run first, the shared helpers) |
//! | `wire` | the data kept in Redis: lock value, queue member, wake-up payload |
//! | `conn` | [`RedisConn`]: the connection seam, one variant per kind of deployment (one server, Sentinel, Cluster), error mapping |
//! | `connect` | connecting, and the connect-time checks |
//! | `invoke` | script calls by SHA with `NOSCRIPT` reload; a call with its `WAIT` for replicas |
//! | `command` | plain commands, pipelines, the masters, `SCAN`; raw calls sent once, never repeated (feature `testing`: `testing::RawConnection`) |
//! | `coalesce` | the concurrent grants and releases of one client (of one Cluster slot) sent as one batch call while `IN_FLIGHT` others are in flight; a call with room goes alone at once |
//! | `target` | the one URL for every topology (`redis://`, `rediss://`, `unix://`, `redis+sentinel://`, `redis+cluster://`), parsed |
//! | `sentinel` | the master found through Sentinel, followed across failovers |
//! | `replicas` | the replicas a failover could promote, and a connection of its own to one of them |
//! | `pubsub` | [`PubSub`], the pub/sub connection behind wake-ups |
//! | `info` | what the deployment reports about itself (`INFO` fields, the memory policy) |
//! | `errors` | redis-rs errors as fencelock's, and server errors as typed errors that name the one key, command or setting in the way |

use std::time::Duration;

use ::redis::aio::ConnectionManagerConfig;

use crate::store::ConnSettings;

mod coalesce;
mod command;
mod conn;
mod connect;
mod errors;
mod info;
mod invoke;
pub(crate) mod ops;
mod pubsub;
mod replicas;
pub(crate) mod scripts;
mod sentinel;
mod target;
pub(crate) mod wire;

#[cfg(feature = "testing")]
pub use coalesce::BatchGate;
pub(crate) use coalesce::Coalescer;
#[cfg(feature = "testing")]
pub(crate) use coalesce::IN_FLIGHT;
pub(crate) use conn::{Node, RedisConn, Topology};
pub(crate) use info::{info_field, memory_policy};
#[cfg(feature = "testing")]
pub(crate) use invoke::{invocation, invocation_of};
pub(crate) use pubsub::{Event, PubSub};
pub(crate) use replicas::{Replica, ReplicaConn};
#[cfg(feature = "testing")]
pub use scripts::BatchFault;
#[cfg(feature = "testing")]
pub use scripts::ScriptMutation;

/// How the connection managers of a client (its calls, its pub/sub, each
/// master behind Sentinel) connect and reconnect.
pub(super) fn manager_config(settings: &ConnSettings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout))
        // Reconnects happen in the background after a failed command; keep
        // them quick so a restarted Redis is found again promptly.
        .set_number_of_retries(2)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(500))
}

/// Which calls may run together in one script: keys with the same group
/// share a Cluster slot (`None`: every key does, on one server).
pub(crate) type BatchGroup = Option<::redis::cluster_routing::Slot>;

#[cfg(test)]
mod tests;
