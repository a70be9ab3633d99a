//! The protected resource: a counter per lock name that workers increment
//! by read-modify-write under the lock, with an audit log written in the
//! same script (Redis) or transaction (Postgres) as every accepted write.
//!
//! The safe path registers the fence with fencelock's own resource code
//! ([`fencelock::FencedHash::register`], [`fencelock::FencedTable::register`])
//! before reading, and writes under fencelock's rule. The `ge-check` control
//! replaces both with `crate::controls`' scripts.

use std::sync::LazyLock;

use fencelock::{Fence, FencedHash, FencedTable, LockClient, SetClause, WriteOutcome, holder_id};
use redis::aio::ConnectionManager;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::history::{Entry, Event, Outcome};

static AUDITED_WRITE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/audited_write.lua")));
static SNAPSHOT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/snapshot.lua")));

/// Where a run's resource lives, as workers and the coordinator reach it.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub(crate) enum ResourceSpec {
    /// Hashes `PREFIX res:NAME` and lists `PREFIX res:NAME:audit`.
    Redis { url: String, prefix: String },
    /// Table `TABLE` (name, value, lock_fence, lock_holder) and
    /// `TABLE_audit`.
    Postgres { url: String, table: String },
}

impl ResourceSpec {
    pub(crate) fn hash_key(prefix: &str, name: &str) -> String {
        format!("{prefix}res:{name}")
    }

    pub(crate) fn audit_key(prefix: &str, name: &str) -> String {
        format!("{prefix}res:{name}:audit")
    }
}

/// A worker's handle on the resource.
#[derive(Debug)]
pub(crate) enum Resource {
    Redis {
        client: LockClient,
        conn: ConnectionManager,
        prefix: String,
    },
    Postgres {
        table: FencedTable,
        audit: String,
    },
}

/// What a worker writes: who, with which fence and token, what it read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Write<'a> {
    pub(crate) name: &'a str,
    pub(crate) fence: Fence,
    pub(crate) token: &'a str,
    pub(crate) op: &'a str,
    pub(crate) worker: &'a str,
    pub(crate) read: i64,
    pub(crate) value: i64,
}

fn outcome(o: &WriteOutcome) -> Outcome {
    if o.is_accepted() {
        Outcome::Accepted
    } else {
        Outcome::Stale
    }
}

impl Resource {
    pub(crate) async fn connect(spec: &ResourceSpec) -> Result<Self> {
        match spec {
            ResourceSpec::Redis { url, prefix } => {
                let client = LockClient::builder(url.clone())
                    .response_timeout(std::time::Duration::from_secs(2))
                    .connect()
                    .await
                    .map_err(|e| Error::new(crate::ErrorKind::Unreachable, e.to_string()))?;
                let conn = redis_manager(url).await?;
                Ok(Resource::Redis {
                    client,
                    conn,
                    prefix: prefix.clone(),
                })
            }
            ResourceSpec::Postgres { url, table } => {
                let pool = pg_pool(url).await?;
                let fenced = FencedTable::new(pool, table)
                    .and_then(|t| t.with_key_column("name"))
                    .map_err(|e| Error::failed(e.to_string()))?;
                Ok(Resource::Postgres {
                    table: fenced,
                    audit: format!("{table}_audit"),
                })
            }
        }
    }

    fn hash(&self, name: &str) -> Result<FencedHash> {
        match self {
            Resource::Redis { client, prefix, .. } => client
                .fenced_hash(&ResourceSpec::hash_key(prefix, name))
                .map_err(|e| Error::failed(e.to_string())),
            Resource::Postgres { .. } => Err(Error::failed("not a Redis resource")),
        }
    }

    /// fencelock's registration of the fence before a read.
    pub(crate) async fn register(&self, name: &str, fence: Fence, token: &str) -> Outcome {
        let reply = match self {
            Resource::Redis { .. } => match self.hash(name) {
                Ok(hash) => hash.register(fence, token).await,
                Err(_) => return Outcome::Unknown,
            },
            Resource::Postgres { table, .. } => {
                table.register(table.pool(), name, fence, token).await
            }
        };
        reply.map_or(Outcome::Unknown, |o| outcome(&o))
    }

    /// The counter.
    pub(crate) async fn read(&self, name: &str) -> Result<i64> {
        match self {
            Resource::Redis { .. } => {
                let state = self
                    .hash(name)?
                    .read()
                    .await
                    .map_err(|e| Error::failed(e.to_string()))?;
                Ok(state.value.and_then(|v| v.parse().ok()).unwrap_or(0))
            }
            Resource::Postgres { table, .. } => {
                let sql = format!("SELECT value FROM \"{}\" WHERE name = $1", table.table());
                let value: i64 = fencelock::sqlx::query_scalar(fencelock::sqlx::AssertSqlSafe(sql))
                    .bind(name)
                    .fetch_one(table.pool())
                    .await
                    .map_err(|e| Error::failed(e.to_string()))?;
                Ok(value)
            }
        }
    }

    /// The fenced write of `w.value`, audited atomically with it.
    pub(crate) async fn write(&self, w: Write<'_>) -> Outcome {
        match self {
            Resource::Redis { conn, prefix, .. } => {
                let reply: redis::RedisResult<(i64, redis::Value)> = AUDITED_WRITE
                    .key(ResourceSpec::hash_key(prefix, w.name))
                    .key(ResourceSpec::audit_key(prefix, w.name))
                    .arg(w.fence.get().to_string())
                    .arg(w.token)
                    .arg(w.op)
                    .arg(w.worker)
                    .arg(w.read)
                    .arg(w.value)
                    .invoke_async(&mut conn.clone())
                    .await;
                match reply {
                    Ok((1, _)) => Outcome::Accepted,
                    Ok(_) => Outcome::Stale,
                    Err(_) => Outcome::Unknown,
                }
            }
            Resource::Postgres { table, audit } => {
                pg_write(table, audit, w).await.unwrap_or(Outcome::Unknown)
            }
        }
    }

    /// The Redis connection of the resource (for the controls' scripts).
    pub(crate) fn redis(&self) -> Option<(&ConnectionManager, &str)> {
        match self {
            Resource::Redis { conn, prefix, .. } => Some((conn, prefix)),
            Resource::Postgres { .. } => None,
        }
    }

    /// The Postgres table (for the controls' statements).
    pub(crate) fn postgres(&self) -> Option<(&FencedTable, &str)> {
        match self {
            Resource::Postgres { table, audit } => Some((table, audit)),
            Resource::Redis { .. } => None,
        }
    }
}

/// One transaction: lock the row, fencelock's fenced `UPDATE` (the rule in
/// SQL), and the audit row if it was accepted.
async fn pg_write(table: &FencedTable, audit: &str, w: Write<'_>) -> Result<Outcome> {
    let failed = |e: fencelock::sqlx::Error| Error::failed(e.to_string());
    let mut tx = table.pool().begin().await.map_err(failed)?;
    let before_sql = format!(
        "SELECT value FROM \"{}\" WHERE name = $1 FOR UPDATE",
        table.table()
    );
    let before: i64 = fencelock::sqlx::query_scalar(fencelock::sqlx::AssertSqlSafe(before_sql))
        .bind(w.name)
        .fetch_one(&mut *tx)
        .await
        .map_err(failed)?;
    let written = table
        .update(
            &mut *tx,
            w.name,
            w.fence,
            w.token,
            &SetClause::new().set("value", w.value),
        )
        .await
        .map_err(|e| Error::failed(e.to_string()))?;
    if written.is_accepted() {
        insert_audit(&mut tx, audit, &w, before).await?;
    }
    tx.commit().await.map_err(failed)?;
    Ok(outcome(&written))
}

pub(crate) async fn insert_audit(
    tx: &mut fencelock::sqlx::Transaction<'_, fencelock::sqlx::Postgres>,
    audit: &str,
    w: &Write<'_>,
    before: i64,
) -> Result<()> {
    let sql = format!(
        "INSERT INTO \"{audit}\" (name, op, worker, fence, holder, read, before, after) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    );
    fencelock::sqlx::query(fencelock::sqlx::AssertSqlSafe(sql))
        .bind(w.name)
        .bind(w.op)
        .bind(w.worker)
        .bind(i64::try_from(w.fence.get()).unwrap_or(i64::MAX))
        .bind(holder_id(w.token))
        .bind(w.read)
        .bind(before)
        .bind(w.value)
        .execute(&mut **tx)
        .await
        .map_err(|e| Error::failed(e.to_string()))?;
    Ok(())
}

pub(crate) async fn redis_manager(url: &str) -> Result<ConnectionManager> {
    let client = redis::Client::open(url).map_err(|e| Error::redis(url, &e))?;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(std::time::Duration::from_secs(2)))
        .set_response_timeout(Some(std::time::Duration::from_secs(2)))
        .set_number_of_retries(2)
        .set_min_delay(std::time::Duration::from_millis(20))
        .set_max_delay(std::time::Duration::from_millis(200));
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| Error::redis(url, &e))
}

pub(crate) async fn pg_pool(url: &str) -> Result<fencelock::sqlx::PgPool> {
    fencelock::sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(std::time::Duration::from_secs(5))
        .connect(url)
        .await
        .map_err(|e| {
            Error::new(
                crate::ErrorKind::Unreachable,
                format!(
                    "Postgres at {}: {}",
                    fencelock::redact_url(url),
                    fencelock::redact_url_in(&e.to_string(), url)
                ),
            )
        })
}

/// The coordinator's side: prepares the resource, reads its audit and final
/// state, removes it.
#[derive(Debug)]
pub(crate) struct Store {
    spec: ResourceSpec,
    names: Vec<String>,
    redis: Option<ConnectionManager>,
    pg: Option<fencelock::sqlx::PgPool>,
}

#[derive(Debug, Deserialize)]
struct AuditJson {
    op: String,
    worker: String,
    fence: String,
    holder: String,
    read: String,
    before: String,
    after: String,
}

fn num(s: &str) -> i64 {
    s.parse().unwrap_or(i64::MIN)
}

impl Store {
    pub(crate) async fn open(spec: ResourceSpec, names: Vec<String>) -> Result<Self> {
        let mut store = Store {
            spec,
            names,
            redis: None,
            pg: None,
        };
        match &store.spec {
            ResourceSpec::Redis { url, prefix } => {
                let mut conn = redis_manager(url).await?;
                for name in &store.names {
                    let _: redis::RedisResult<()> = redis::cmd("DEL")
                        .arg(ResourceSpec::hash_key(prefix, name))
                        .arg(ResourceSpec::audit_key(prefix, name))
                        .query_async(&mut conn)
                        .await;
                }
                store.redis = Some(conn);
            }
            ResourceSpec::Postgres { url, table } => {
                let pool = pg_pool(url).await?;
                let setup = [
                    format!(
                        "CREATE TABLE \"{table}\" (name text PRIMARY KEY, value bigint NOT NULL DEFAULT 0, lock_fence bigint, lock_holder text)"
                    ),
                    format!(
                        "CREATE TABLE \"{table}_audit\" (seq bigserial PRIMARY KEY, name text NOT NULL, op text NOT NULL, worker text NOT NULL, fence bigint NOT NULL, holder text NOT NULL, read bigint NOT NULL, before bigint NOT NULL, after bigint NOT NULL)"
                    ),
                ];
                for sql in setup {
                    fencelock::sqlx::query(fencelock::sqlx::AssertSqlSafe(sql))
                        .execute(&pool)
                        .await
                        .map_err(|e| {
                            Error::failed(format!("cannot create the resource tables: {e}"))
                        })?;
                }
                for name in &store.names {
                    let sql = format!("INSERT INTO \"{table}\" (name) VALUES ($1)");
                    fencelock::sqlx::query(fencelock::sqlx::AssertSqlSafe(sql))
                        .bind(name)
                        .execute(&pool)
                        .await
                        .map_err(|e| Error::failed(e.to_string()))?;
                }
                store.pg = Some(pool);
            }
        }
        Ok(store)
    }

    /// The audit and the final state of every name, as events stamped `t`.
    pub(crate) async fn snapshot(&self, t: i64) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        for name in &self.names {
            match (&self.spec, &self.redis, &self.pg) {
                (ResourceSpec::Redis { url, prefix }, Some(conn), _) => {
                    type Snap = (Option<String>, Option<String>, Option<String>, Vec<String>);
                    let (value, fence, holder, audit): Snap = SNAPSHOT
                        .key(ResourceSpec::hash_key(prefix, name))
                        .key(ResourceSpec::audit_key(prefix, name))
                        .invoke_async(&mut conn.clone())
                        .await
                        .map_err(|e| Error::redis(url, &e))?;
                    for (i, entry) in audit.iter().enumerate() {
                        let a: AuditJson = serde_json::from_str(entry).map_err(|e| {
                            Error::failed(format!("an audit entry of {name} is not readable: {e}"))
                        })?;
                        out.push(audit_event(t, name, i as u64 + 1, a));
                    }
                    out.push(Event {
                        t,
                        p: "resource".into(),
                        e: Entry::Final {
                            name: name.clone(),
                            value: value.as_deref().map_or(0, num),
                            fence: fence.and_then(|f| f.parse().ok()),
                            holder,
                        },
                    });
                }
                (ResourceSpec::Postgres { table, .. }, _, Some(pool)) => {
                    let sql = format!(
                        "SELECT seq, op, worker, fence, holder, read, before, after FROM \"{table}_audit\" WHERE name = $1 ORDER BY seq"
                    );
                    type Row = (i64, String, String, i64, String, i64, i64, i64);
                    let rows: Vec<Row> =
                        fencelock::sqlx::query_as(fencelock::sqlx::AssertSqlSafe(sql))
                            .bind(name)
                            .fetch_all(pool)
                            .await
                            .map_err(|e| Error::failed(e.to_string()))?;
                    for (i, (_, op, worker, fence, holder, read, before, after)) in
                        rows.into_iter().enumerate()
                    {
                        out.push(Event {
                            t,
                            p: "resource".into(),
                            e: Entry::Audit {
                                name: name.clone(),
                                seq: i as u64 + 1,
                                op,
                                worker,
                                fence: u64::try_from(fence).unwrap_or(0),
                                holder,
                                read,
                                before,
                                after,
                            },
                        });
                    }
                    let sql = format!(
                        "SELECT value, lock_fence, lock_holder FROM \"{table}\" WHERE name = $1"
                    );
                    let (value, fence, holder): (i64, Option<i64>, Option<String>) =
                        fencelock::sqlx::query_as(fencelock::sqlx::AssertSqlSafe(sql))
                            .bind(name)
                            .fetch_one(pool)
                            .await
                            .map_err(|e| Error::failed(e.to_string()))?;
                    out.push(Event {
                        t,
                        p: "resource".into(),
                        e: Entry::Final {
                            name: name.clone(),
                            value,
                            fence: fence.and_then(|f| u64::try_from(f).ok()),
                            holder,
                        },
                    });
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Removes what the run created.
    pub(crate) async fn remove(&self) {
        match (&self.spec, &self.redis, &self.pg) {
            (ResourceSpec::Redis { prefix, .. }, Some(conn), _) => {
                for name in &self.names {
                    let _: redis::RedisResult<()> = redis::cmd("DEL")
                        .arg(ResourceSpec::hash_key(prefix, name))
                        .arg(ResourceSpec::audit_key(prefix, name))
                        .query_async(&mut conn.clone())
                        .await;
                }
            }
            (ResourceSpec::Postgres { table, .. }, _, Some(pool)) => {
                for t in [format!("{table}_audit"), table.clone()] {
                    let sql = format!("DROP TABLE IF EXISTS \"{t}\"");
                    let _ = fencelock::sqlx::query(fencelock::sqlx::AssertSqlSafe(sql))
                        .execute(pool)
                        .await;
                }
            }
            _ => {}
        }
    }
}

fn audit_event(t: i64, name: &str, seq: u64, a: AuditJson) -> Event {
    Event {
        t,
        p: "resource".into(),
        e: Entry::Audit {
            name: name.to_string(),
            seq,
            op: a.op,
            worker: a.worker,
            fence: a.fence.parse().unwrap_or(0),
            holder: a.holder,
            read: num(&a.read),
            before: num(&a.before),
            after: num(&a.after),
        },
    }
}

#[cfg(test)]
mod tests {
    use fencelock::{Fence, fence_accepts, holder_id};
    use fencelock_testkit::RedisServer;

    use super::*;

    /// The torture resource's script applies fencelock's rule exactly, and
    /// audits exactly what it accepted.
    #[tokio::test]
    async fn the_audited_write_applies_fencelocks_rule() -> Result<()> {
        let server = RedisServer::start();
        let mut conn = redis_manager(&server.url()).await?;
        let (hash, audit) = ("r", "r:audit");
        let mut stored: Option<(Fence, String)> = None;
        let mut accepted = 0;
        for (fence, token) in [(5, "a"), (6, "b"), (5, "a"), (6, "b"), (6, "c"), (7, "c")] {
            let fence = Fence::new(fence);
            let expected = fence_accepts(
                stored.as_ref().map(|s| s.0),
                stored.as_ref().map(|s| s.1.as_str()),
                fence,
                &holder_id(token),
            );
            let (ok, _): (i64, redis::Value) = AUDITED_WRITE
                .key(hash)
                .key(audit)
                .arg(fence.get().to_string())
                .arg(token)
                .arg("op")
                .arg("w0")
                .arg(0)
                .arg(1)
                .invoke_async(&mut conn)
                .await
                .map_err(|e| Error::failed(e.to_string()))?;
            assert_eq!(ok == 1, expected, "fence {fence} from {token}");
            if expected {
                stored = Some((fence, holder_id(token)));
                accepted += 1;
            }
        }
        let logged: i64 = redis::cmd("LLEN")
            .arg(audit)
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::failed(e.to_string()))?;
        assert_eq!(logged, accepted);
        Ok(())
    }
}
