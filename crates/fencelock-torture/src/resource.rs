//! The protected resource: a counter per lock name that workers increment
//! by read-modify-write under the lock, with an audit log written in the
//! same script (Redis) or transaction (Postgres) as every accepted write.
//!
//! The safe path registers the fence with fencelock's own resource code
//! ([`fencelock::FencedHash::register`], [`fencelock::FencedTable::register`])
//! before reading, and writes under fencelock's rule. The `ge-check` control
//! replaces both with `crate::controls`' scripts.

use std::sync::LazyLock;
use std::time::Duration;

use fencelock::testing::RawConnection;
use fencelock::{
    Fence, FencedHash, FencedTable, LockClient, SetClause, ValidatedRead, WriteOutcome, holder_id,
};
use serde::Deserialize;

use crate::conn::Tls;
use crate::error::{Error, Result};
use crate::history::{Entry, Event, Outcome};

static AUDITED_WRITE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(AUDITED_WRITE_SOURCE));

/// The audited write's Lua source, also sent to every worker in its spec.
pub(crate) const AUDITED_WRITE_SOURCE: &str = include_str!("scripts/audited_write.lua");
static SNAPSHOT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/snapshot.lua")));

/// Where a run's resource lives, as workers and the coordinator reach it.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub(crate) enum ResourceSpec {
    /// Hashes `PREFIX res:{NAME}` and lists `PREFIX res:{NAME}:audit` (one
    /// hash tag: the audited write's two keys share a Cluster slot).
    Redis {
        url: String,
        prefix: String,
        /// Replicas that must acknowledge each accepted write or
        /// registration (0: no wait): on a replicated deployment a write
        /// not yet on every replica can be lost by a failover, and C3 would
        /// then judge the resource's replication instead of the lock.
        #[serde(default)]
        replicas: u32,
        /// How long a write waits for them, in ms.
        #[serde(default)]
        replica_timeout_ms: u64,
        /// The TLS files of the lock store when the resource lives there
        /// (none on a private resource server: it speaks plain TCP).
        #[serde(default)]
        tls: Tls,
    },
    /// Table `TABLE` (name, value, lock_fence, lock_holder) and
    /// `TABLE_audit`.
    Postgres { url: String, table: String },
}

impl ResourceSpec {
    pub(crate) fn hash_key(prefix: &str, name: &str) -> String {
        format!("{prefix}res:{{{name}}}")
    }

    pub(crate) fn audit_key(prefix: &str, name: &str) -> String {
        format!("{prefix}res:{{{name}}}:audit")
    }
}

/// A worker's handle on the resource.
#[derive(Debug)]
pub(crate) enum Resource {
    Redis {
        client: LockClient,
        conn: RawConnection,
        prefix: String,
        /// Replicas each accepted write waits for, and for how long.
        replicas: u32,
        replica_timeout: Duration,
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
    /// The semaphore slot whose partition and (fence, holder) pair it
    /// writes; `None` for a mutex.
    pub(crate) slot: Option<u32>,
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
            ResourceSpec::Redis {
                url,
                prefix,
                replicas,
                replica_timeout_ms,
                tls,
            } => {
                let (client, conn) = crate::conn::raw(url, tls).await?;
                Ok(Resource::Redis {
                    client,
                    conn,
                    prefix: prefix.clone(),
                    replicas: *replicas,
                    replica_timeout: Duration::from_millis((*replica_timeout_ms).max(1)),
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
            Resource::Redis {
                client,
                prefix,
                replicas,
                replica_timeout,
                ..
            } => client
                .fenced_hash(&ResourceSpec::hash_key(prefix, name))
                .map(|hash| match replicas {
                    0 => hash,
                    n => hash.wait_for_replicas(*n, *replica_timeout),
                })
                .map_err(|e| Error::failed(e.to_string())),
            Resource::Postgres { .. } => Err(Error::failed("not a Redis resource")),
        }
    }

    /// The fenced hash of `name`, or its slot view
    /// ([`FencedHash::slot`]) for a semaphore's permit.
    fn view(&self, name: &str, slot: Option<u32>) -> Result<FencedHash> {
        let hash = self.hash(name)?;
        Ok(match slot {
            Some(s) => hash.slot(s),
            None => hash,
        })
    }

    /// fencelock's registration of the fence before a read (a permit's:
    /// at its slot's pair).
    pub(crate) async fn register(
        &self,
        name: &str,
        slot: Option<u32>,
        fence: Fence,
        token: &str,
    ) -> Outcome {
        let reply = match self {
            Resource::Redis { .. } => match self.view(name, slot) {
                Ok(hash) => hash.register(fence, token).await,
                Err(_) => return Outcome::Unknown,
            },
            Resource::Postgres { table, .. } => {
                table.register(table.pool(), name, fence, token).await
            }
        };
        reply.map_or(Outcome::Unknown, |o| outcome(&o))
    }

    /// The counter (a permit's: its slot's partition).
    pub(crate) async fn read(&self, name: &str, slot: Option<u32>) -> Result<i64> {
        match self {
            Resource::Redis { .. } => {
                let state = self
                    .view(name, slot)?
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

    /// A read-write lock reader's validated read of `name`'s counter
    /// against its write epoch: (value, the stored fence, clean). Redis:
    /// `FencedHash::read_validated` (one atomic read of value and fence).
    /// Postgres: the value, then `FencedTable::read_validated` of the row
    /// in the same transaction (after the read: fences only grow, so a
    /// writer that wrote before the value was read is still seen).
    pub(crate) async fn read_validated(
        &self,
        name: &str,
        epoch: Fence,
    ) -> Result<(i64, Option<u64>, bool)> {
        let failed = |e: &dyn std::fmt::Display| Error::failed(e.to_string());
        match self {
            Resource::Redis { .. } => {
                let read = self
                    .view(name, None)?
                    .read_validated(epoch)
                    .await
                    .map_err(|e| failed(&e))?;
                let clean = read.is_clean();
                let fence = match &read {
                    ValidatedRead::Torn { fence, .. } => Some(fence.get()),
                    _ => read.value().fence.map(Fence::get),
                };
                let state = read.into_value();
                let value = state.value.and_then(|v| v.parse().ok()).unwrap_or(0);
                Ok((value, fence, clean))
            }
            Resource::Postgres { table, .. } => {
                let mut tx = table.pool().begin().await.map_err(|e| failed(&e))?;
                let sql = format!("SELECT value FROM \"{}\" WHERE name = $1", table.table());
                let value: i64 = fencelock::sqlx::query_scalar(fencelock::sqlx::AssertSqlSafe(sql))
                    .bind(name)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| failed(&e))?;
                let read = table
                    .read_validated(&mut *tx, name, epoch)
                    .await
                    .map_err(|e| failed(&e))?;
                tx.commit().await.map_err(|e| failed(&e))?;
                let clean = read.is_clean();
                let fence = match &read {
                    ValidatedRead::Torn { fence, .. } => Some(fence.get()),
                    _ => read.value().as_ref().and_then(|r| r.fence).map(Fence::get),
                };
                Ok((value, fence, clean))
            }
        }
    }

    /// The fenced write of `w.value`, audited atomically with it.
    pub(crate) async fn write(&self, w: Write<'_>) -> Outcome {
        match self {
            Resource::Redis {
                conn,
                prefix,
                replicas,
                replica_timeout,
                ..
            } => {
                let keys = [
                    ResourceSpec::hash_key(prefix, w.name),
                    ResourceSpec::audit_key(prefix, w.name),
                ];
                let args = [
                    w.fence.get().to_string(),
                    w.token.to_string(),
                    w.op.to_string(),
                    w.worker.to_string(),
                    w.read.to_string(),
                    w.value.to_string(),
                    KEY_TTL.as_millis().to_string(),
                    String::new(),
                    w.slot.map_or(String::new(), |s| s.to_string()),
                ];
                match audited_write(conn, &keys, &args, *replicas, *replica_timeout).await {
                    // Applied, but not yet on the replicas a failover may
                    // promote: not acknowledged.
                    Ok((1, acked)) if acked < *replicas => Outcome::Unknown,
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
    pub(crate) fn redis(&self) -> Option<(&RawConnection, &str)> {
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

/// The audited write: one script (`audited_write.lua`), sent once, and
/// with `replicas` > 0 followed by `WAIT replicas timeout` in the same
/// pipeline on the same connection, so the `WAIT` covers exactly its
/// writes. Returns the script's first reply field (1 accepted, 0 stale) and
/// how many replicas acknowledged.
async fn audited_write(
    conn: &RawConnection,
    keys: &[String; 2],
    args: &[String],
    replicas: u32,
    timeout: Duration,
) -> redis::RedisResult<(i64, u32)> {
    if replicas == 0 {
        let mut call = AUDITED_WRITE.prepare_invoke();
        call.key(&keys[0]).key(&keys[1]).arg(args);
        let (ok, _): (i64, redis::Value) = call.invoke_async(&mut conn.clone()).await?;
        return Ok((ok, 0));
    }
    let mut pipe = redis::pipe();
    pipe.cmd("EVALSHA")
        .arg(AUDITED_WRITE.get_hash())
        .arg(2)
        .arg(keys)
        .arg(args);
    // WAIT 0 would wait forever: at least 1 ms.
    pipe.cmd("WAIT")
        .arg(replicas)
        .arg(timeout.as_millis().max(1) as u64);
    type Reply = ((i64, redis::Value), i64);
    let reply: Reply = match pipe.query_async(&mut conn.clone()).await {
        // The server does not have the script (a restart, a failover, a
        // flush): nothing ran; load it and send the pipeline again.
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            AUDITED_WRITE.load_async(&mut conn.clone()).await?;
            pipe.query_async(&mut conn.clone()).await?
        }
        reply => reply?,
    };
    let ((ok, _), acked) = reply;
    Ok((ok, u32::try_from(acked).unwrap_or(0)))
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
    /// The client (kept: its connection is `RawConnection`'s) and its
    /// connection.
    redis: Option<(LockClient, RawConnection)>,
    pg: Option<fencelock::sqlx::PgPool>,
    /// A semaphore's permit count: the final state is read per slot.
    slots: Option<u32>,
}

/// How long the Redis resource's keys live without a refresh: a run
/// refreshes them every [`KEY_TTL_REFRESH`] while it lives, so a run killed
/// with SIGKILL leaves nothing in the user's Redis for longer than this.
pub(crate) const KEY_TTL: Duration = Duration::from_secs(60);

/// How often a live run refreshes the TTL of its resource keys.
pub(crate) const KEY_TTL_REFRESH: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
struct AuditJson {
    op: String,
    worker: String,
    fence: String,
    holder: String,
    read: String,
    before: String,
    after: String,
    /// A semaphore slot's write.
    #[serde(default)]
    slot: Option<String>,
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
            slots: None,
        };
        match &store.spec {
            ResourceSpec::Redis {
                url, prefix, tls, ..
            } => {
                let (client, conn) = crate::conn::raw(url, tls).await?;
                for name in &store.names {
                    let hash = ResourceSpec::hash_key(prefix, name);
                    let audit = ResourceSpec::audit_key(prefix, name);
                    // Created with its TTL, so that no moment exists in
                    // which a killed run leaves it without one (the audit
                    // list gets its TTL from the write that creates it).
                    let mut pipe = redis::pipe();
                    pipe.cmd("DEL")
                        .arg(&hash)
                        .arg(&audit)
                        .ignore()
                        .cmd("HSET")
                        .arg(&hash)
                        .arg("value")
                        .arg(0)
                        .ignore()
                        .cmd("PEXPIRE")
                        .arg(&hash)
                        .arg(KEY_TTL.as_millis() as u64)
                        .ignore();
                    // A deployment that refuses writes (a replica, a
                    // master short of replicas) refuses the workers' too:
                    // the run goes on and ends inconclusive.
                    let created: redis::RedisResult<()> = pipe.query_async(&mut conn.clone()).await;
                    if let Err(e) = created {
                        tracing::warn!(
                            "cannot create the resource {hash}: {}",
                            fencelock::redact_url_in(&e.to_string(), url)
                        );
                    }
                }
                store.redis = Some((client, conn));
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

    /// A store whose final state is read per slot of a semaphore of
    /// `permits` (`None`: a mutex's resource, as opened).
    pub(crate) fn slotted(mut self, permits: Option<u32>) -> Self {
        self.slots = permits;
        self
    }

    /// The audit and the final state of every name, as events stamped `t`
    /// (a semaphore's: one final state per slot).
    pub(crate) async fn snapshot(&self, t: i64) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        for name in &self.names {
            match (&self.spec, &self.redis, &self.pg) {
                (ResourceSpec::Redis { url, prefix, .. }, Some((_, conn)), _) => {
                    let (value, fence, holder, audit, slots) =
                        snapshot_of(conn, prefix, name, self.slots.unwrap_or(0))
                            .await
                            .map_err(|e| Error::redis(url, &e))?;
                    for (i, entry) in audit.iter().enumerate() {
                        let a: AuditJson = serde_json::from_str(entry).map_err(|e| {
                            Error::failed(format!("an audit entry of {name} is not readable: {e}"))
                        })?;
                        out.push(audit_event(t, name, i as u64 + 1, a));
                    }
                    if self.slots.is_some() {
                        for (slot, state) in (0u32..).zip(slots.chunks(3)) {
                            let field = |i: usize| state.get(i).cloned().flatten();
                            out.push(Event {
                                t,
                                p: "resource".into(),
                                e: Entry::Final {
                                    name: name.clone(),
                                    value: field(0).as_deref().map_or(0, num),
                                    fence: field(1).and_then(|f| f.parse().ok()),
                                    holder: field(2),
                                    slot: Some(slot),
                                },
                            });
                        }
                        continue;
                    }
                    out.push(Event {
                        t,
                        p: "resource".into(),
                        e: Entry::Final {
                            name: name.clone(),
                            value: value.as_deref().map_or(0, num),
                            fence: fence.and_then(|f| f.parse().ok()),
                            holder,
                            slot: None,
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
                                slot: None,
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
                            slot: None,
                        },
                    });
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// A task that refreshes the TTL of the Redis resource's keys every
    /// [`KEY_TTL_REFRESH`] for as long as it runs (`None` for Postgres).
    pub(crate) fn ttl_keeper(&self) -> Option<impl Future<Output = ()> + Send + 'static> {
        let (ResourceSpec::Redis { prefix, .. }, Some((_, conn))) = (&self.spec, &self.redis)
        else {
            return None;
        };
        let keys: Vec<[String; 2]> = self
            .names
            .iter()
            .map(|n| {
                [
                    ResourceSpec::hash_key(prefix, n),
                    ResourceSpec::audit_key(prefix, n),
                ]
            })
            .collect();
        let conn = conn.clone();
        Some(async move {
            loop {
                tokio::time::sleep(KEY_TTL_REFRESH).await;
                for pair in &keys {
                    let mut pipe = redis::pipe();
                    for key in pair {
                        pipe.cmd("PEXPIRE")
                            .arg(key)
                            .arg(KEY_TTL.as_millis() as u64)
                            .ignore();
                    }
                    let _: redis::RedisResult<()> = pipe.query_async(&mut conn.clone()).await;
                }
            }
        })
    }

    /// Removes what the run created.
    pub(crate) async fn remove(&self) {
        match (&self.spec, &self.redis, &self.pg) {
            (ResourceSpec::Redis { prefix, .. }, Some((_, conn)), _) => {
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

/// The worker a seal is audited as (its operation is the revoke's).
pub(crate) const SEAL_WORKER: &str = "nemesis";

impl Store {
    /// The resource of `name` as a revoke seals it: [`fencelock::Sealable`]
    /// for [`LockClient::revoke`], audited as operation `op`.
    pub(crate) fn sealable<'a>(&'a self, name: &str, op: &str) -> AuditedSeal<'a> {
        AuditedSeal {
            store: self,
            name: name.to_string(),
            op: op.to_string(),
        }
    }

    /// Seals `name`'s resource at `fence` with its audit entry, atomically:
    /// the Redis hash and list in the audited script (its `seal` mode), the
    /// Postgres row and audit row in one transaction with fencelock's own
    /// `FencedTable::seal`. The audit entry's holder is
    /// [`fencelock::REVOKED_HOLDER`]: that is how the checkers tell a seal
    /// from a write.
    async fn seal(&self, name: &str, op: &str, fence: Fence) -> fencelock::Result<WriteOutcome> {
        match (&self.spec, &self.redis, &self.pg) {
            (
                ResourceSpec::Redis {
                    prefix,
                    replicas,
                    replica_timeout_ms,
                    ..
                },
                Some((_, conn)),
                _,
            ) => {
                let hash = ResourceSpec::hash_key(prefix, name);
                let mut eval = redis::cmd("EVAL");
                // The script's text every time (a seal is rare): no
                // NOSCRIPT after a restart or a flush. Sent again only
                // where a failover explains a failure, and a seal sent
                // twice seals the same (its audit entry is then doubled,
                // which no checker minds).
                eval.arg(AUDITED_WRITE_SOURCE)
                    .arg(2)
                    .arg(&hash)
                    .arg(ResourceSpec::audit_key(prefix, name))
                    .arg(fence.get().to_string())
                    .arg("")
                    .arg(op)
                    .arg(SEAL_WORKER)
                    .arg(0)
                    .arg(0)
                    .arg(KEY_TTL.as_millis().to_string())
                    .arg("seal");
                let (ok, current, holder): (i64, Option<String>, Option<String>) =
                    conn.query(&hash, &eval).await?;
                if ok != 1 {
                    return Ok(WriteOutcome::Rejected {
                        current_fence: current.and_then(|f| f.parse::<u64>().ok()).map(Fence::new),
                        current_holder: holder,
                    });
                }
                if *replicas > 0 {
                    let acked: u32 = conn
                        .query(
                            &hash,
                            redis::cmd("WAIT")
                                .arg(*replicas)
                                .arg((*replica_timeout_ms).max(1)),
                        )
                        .await?;
                    if acked < *replicas {
                        return Err(fencelock::Error::WriteNotReplicated {
                            resource: hash,
                            acked,
                            wanted: *replicas,
                        });
                    }
                }
                Ok(WriteOutcome::Accepted)
            }
            (ResourceSpec::Postgres { table, .. }, _, Some(pool)) => {
                let fenced = FencedTable::new(pool.clone(), table)
                    .and_then(|t| t.with_key_column("name"))
                    .map_err(|e| fencelock::Error::InvalidOption(e.to_string()))?;
                let mut tx = pool.begin().await?;
                let before_sql =
                    format!("SELECT value FROM \"{table}\" WHERE name = $1 FOR UPDATE");
                let before: i64 =
                    fencelock::sqlx::query_scalar(fencelock::sqlx::AssertSqlSafe(before_sql))
                        .bind(name)
                        .fetch_one(&mut *tx)
                        .await?;
                let sealed = fenced.seal(&mut *tx, name, fence).await?;
                if sealed.is_accepted() {
                    let sql = format!(
                        "INSERT INTO \"{table}_audit\" (name, op, worker, fence, holder, read, before, after) VALUES ($1, $2, $3, $4, $5, $6, $6, $6)"
                    );
                    fencelock::sqlx::query(fencelock::sqlx::AssertSqlSafe(sql))
                        .bind(name)
                        .bind(op)
                        .bind(SEAL_WORKER)
                        .bind(i64::try_from(fence.get()).unwrap_or(i64::MAX))
                        .bind(fencelock::REVOKED_HOLDER)
                        .bind(before)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(sealed)
            }
            _ => Err(fencelock::Error::InvalidOption(
                "the run's resource is not open".into(),
            )),
        }
    }
}

/// One name's audited resource, as [`LockClient::revoke`] seals it.
#[derive(Debug)]
pub(crate) struct AuditedSeal<'a> {
    store: &'a Store,
    name: String,
    op: String,
}

impl fencelock::Sealable for AuditedSeal<'_> {
    fn resource(&self) -> String {
        match &self.store.spec {
            ResourceSpec::Redis { prefix, .. } => ResourceSpec::hash_key(prefix, &self.name),
            ResourceSpec::Postgres { table, .. } => format!("{table} row name = {:?}", self.name),
        }
    }

    fn seal(&self, fence: Fence) -> fencelock::SealFuture<'_> {
        Box::pin(self.store.seal(&self.name, &self.op, fence))
    }
}

/// A name's hash fields and its whole audit, read in one script; a read
/// is safe to send again, so a failed one is, twice.
async fn snapshot_of(
    conn: &RawConnection,
    prefix: &str,
    name: &str,
    slots: u32,
) -> redis::RedisResult<Snapshot> {
    let mut call = SNAPSHOT.prepare_invoke();
    call.key(ResourceSpec::hash_key(prefix, name))
        .key(ResourceSpec::audit_key(prefix, name))
        .arg(slots);
    let mut reply = call.invoke_async(&mut conn.clone()).await;
    for _ in 0..2 {
        if reply.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        reply = call.invoke_async(&mut conn.clone()).await;
    }
    reply
}

/// What `snapshot.lua` returns: value, fence, holder, the audit, and
/// value, fence, holder of each slot in turn.
type Snapshot = (
    Option<String>,
    Option<String>,
    Option<String>,
    Vec<String>,
    Vec<Option<String>>,
);

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
            slot: a.slot.and_then(|s| s.parse().ok()),
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
        let (_client, mut conn) = crate::conn::raw(&server.url(), &Tls::new()).await?;
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
                .arg(60_000)
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

    /// The audited seal (the script's `seal` mode, through
    /// [`fencelock::Sealable`]) applies fencelock's seal rule: over an equal
    /// fence from any holder, never over a greater one; after it every
    /// fence up to it is refused and a greater one accepted; and it is in
    /// the audit with the holder `revoked`, value unchanged.
    #[tokio::test]
    async fn the_audited_seal_applies_fencelocks_seal_rule() -> Result<()> {
        use fencelock::Sealable;
        let server = RedisServer::start();
        let prefix = "p:".to_string();
        let spec = ResourceSpec::Redis {
            url: server.url(),
            prefix: prefix.clone(),
            replicas: 0,
            replica_timeout_ms: 0,
            tls: Tls::new(),
        };
        let store = Store::open(spec.clone(), vec!["t0".into()]).await?;
        let worker = Resource::connect(&spec).await?;
        let write = |fence: u64, token: &'static str| {
            let worker = &worker;
            async move {
                worker
                    .write(Write {
                        name: "t0",
                        fence: Fence::new(fence),
                        token,
                        op: "op",
                        worker: "w0",
                        read: 0,
                        value: 1,
                        slot: None,
                    })
                    .await
            }
        };
        let seal = |fence: u64| {
            let store = &store;
            async move {
                store
                    .sealable("t0", "revoke.1")
                    .seal(Fence::new(fence))
                    .await
            }
        };
        assert_eq!(write(5, "a").await, Outcome::Accepted);
        // An equal fence is sealed over, whoever holds it.
        assert_eq!(seal(5).await.ok(), Some(WriteOutcome::Accepted));
        assert_eq!(write(5, "a").await, Outcome::Stale);
        assert_eq!(write(4, "b").await, Outcome::Stale);
        // A lower seal is refused, naming what is stored.
        assert_eq!(
            seal(4).await.ok(),
            Some(WriteOutcome::Rejected {
                current_fence: Some(Fence::new(5)),
                current_holder: Some(fencelock::REVOKED_HOLDER.into()),
            })
        );
        assert_eq!(write(6, "b").await, Outcome::Accepted);
        let audit: Vec<Event> = store.snapshot(0).await?;
        let rows: Vec<(u64, String, i64, i64)> = audit
            .iter()
            .filter_map(|e| match &e.e {
                Entry::Audit {
                    fence,
                    holder,
                    before,
                    after,
                    ..
                } => Some((*fence, holder.clone(), *before, *after)),
                _ => None,
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (5, holder_id("a"), 0, 1),
                (5, fencelock::REVOKED_HOLDER.to_string(), 1, 1),
                (6, holder_id("b"), 1, 1),
            ]
        );
        store.remove().await;
        Ok(())
    }
}
