//! The scenarios of docs/design.md §6 on etcd (feature `etcd`): `uncontended`,
//! `contended` and `many`, each next to the cluster's own rates measured in
//! the same run, and the *etcd floor* — the least etcd work a fenced lock
//! on a session lease does (create the key in a transaction on a lease
//! granted once; release: delete it), as bare calls without fencelock. The
//! recipe with a lease per acquisition (grant a lease, create the key;
//! delete and revoke, sent together), which fencelock used before its
//! sessions, is measured beside it as bare calls too.
//!
//! On etcd every wait mode waits the same way (in the queue, watching the
//! key ahead), so `contended` is measured once.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use fencelock::LockClient;
use serde_json::json;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};
use crate::measure::{jain, quantile};
use crate::render::Format;
use crate::scenarios::{Counters, Section, contend};
use crate::{Config, Observer, Scenario};

/// What one run on etcd measured.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdReport {
    /// The etcd URL, its password replaced by `***`.
    pub url: String,
    /// Measuring time of each scenario.
    pub duration: Duration,
    /// `uncontended`, if measured.
    pub uncontended: Option<EtcdUncontended>,
    /// `contended`, if measured.
    pub contended: Option<EtcdContended>,
    /// `many`, if measured.
    pub many: Option<EtcdMany>,
}

/// `uncontended` on etcd: one client, acquire + release of one name in
/// sequence.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct EtcdUncontended {
    /// Acquire + release cycles per second.
    pub cycles_per_s: f64,
    /// Sequential linearizable reads per second on one client (the round
    /// trip through a quorum).
    pub get_per_s: f64,
    /// Sequential writes per second on one client (one Raft commit each).
    pub put_per_s: f64,
    /// The etcd floor, sequential.
    pub floor_cycles_per_s: f64,
    /// The recipe with a lease per acquisition, as bare calls, sequential.
    pub lease_per_acquisition_cycles_per_s: f64,
}

/// `contended` on etcd: workers (threads with their own runtime and
/// client) contending for one name.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdContended {
    /// Workers contending.
    pub workers: usize,
    /// The hold asked for, in ms.
    pub hold_ms: f64,
    /// Critical sections completed.
    pub completions: u64,
    /// Completions per second.
    pub completions_per_s: f64,
    /// Acquire waits in ms, sorted.
    pub waits_ms: Vec<f64>,
    /// Hand-overs (release → grant to a different worker) in ms, sorted.
    pub handoffs_ms: Vec<f64>,
    /// Jain's fairness index over the completions per worker.
    pub jain_fairness: f64,
    /// Times a worker was granted the lock while another held it: must be 0.
    pub overlaps: u64,
}

/// `many` on etcd: tasks on as many names sharing one client.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct EtcdMany {
    /// Tasks, each on a name of its own.
    pub tasks: usize,
    /// Acquire + release cycles per second, all tasks together.
    pub cycles_per_s: f64,
    /// Writes per second from as many tasks on one client.
    pub put_per_s: f64,
    /// The etcd floor with as many tasks on one client.
    pub floor_cycles_per_s: f64,
    /// The recipe with a lease per acquisition, as bare calls, from as many
    /// tasks on one client.
    pub lease_per_acquisition_cycles_per_s: f64,
}

impl EtcdReport {
    /// Grants that overlapped another holder's (must be 0).
    pub fn overlaps(&self) -> u64 {
        self.contended.as_ref().map_or(0, |c| c.overlaps)
    }

    /// The report as the human table or as JSON lines (one object per
    /// scenario, snake_case keys with their unit).
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Text => self.text(),
            Format::JsonLines => self.json_lines(),
        }
    }

    fn text(&self) -> String {
        let mut out = format!(
            "fencelock bench on etcd {} ({} per scenario; every wait mode waits in etcd's queue)\n",
            self.url,
            humantime::format_duration(self.duration)
        );
        if let Some(u) = &self.uncontended {
            let _ = writeln!(
                out,
                "uncontended  {:>8.0} cycles/s   etcd floor {:>7.0}/s ({:.0} %)   a lease per acquisition {:.0}/s (×{:.2})   etcd: {:.0} reads/s, {:.0} writes/s on one client",
                u.cycles_per_s,
                u.floor_cycles_per_s,
                100.0 * u.cycles_per_s / u.floor_cycles_per_s,
                u.lease_per_acquisition_cycles_per_s,
                u.cycles_per_s / u.lease_per_acquisition_cycles_per_s,
                u.get_per_s,
                u.put_per_s
            );
        }
        if let Some(c) = &self.contended {
            let _ = writeln!(
                out,
                "contended    {:>8.0} completions/s ({} workers, hold {} ms)   wait p50 {:.1} ms p99 {:.1} ms   handoff p50 {:.1} ms p99 {:.1} ms   jain {:.3}   overlaps {}",
                c.completions_per_s,
                c.workers,
                c.hold_ms,
                quantile(&c.waits_ms, 0.5),
                quantile(&c.waits_ms, 0.99),
                quantile(&c.handoffs_ms, 0.5),
                quantile(&c.handoffs_ms, 0.99),
                c.jain_fairness,
                c.overlaps
            );
        }
        if let Some(m) = &self.many {
            let _ = writeln!(
                out,
                "many         {:>8.0} cycles/s ({} tasks)   etcd floor {:>7.0}/s ({:.0} %)   a lease per acquisition {:.0}/s (×{:.2})   etcd: {:.0} writes/s from {} tasks",
                m.cycles_per_s,
                m.tasks,
                m.floor_cycles_per_s,
                100.0 * m.cycles_per_s / m.floor_cycles_per_s,
                m.lease_per_acquisition_cycles_per_s,
                m.cycles_per_s / m.lease_per_acquisition_cycles_per_s,
                m.put_per_s,
                m.tasks
            );
        }
        out
    }

    fn json_lines(&self) -> String {
        let mut out = String::new();
        let base = |scenario: &str| {
            json!({"backend": "etcd", "url": self.url, "scenario": scenario,
                   "duration_ms": self.duration.as_millis() as u64})
        };
        if let Some(u) = &self.uncontended {
            let mut v = base("uncontended");
            v["cycles_per_s"] = u.cycles_per_s.into();
            v["etcd_get_per_s"] = u.get_per_s.into();
            v["etcd_put_per_s"] = u.put_per_s.into();
            v["etcd_floor_cycles_per_s"] = u.floor_cycles_per_s.into();
            v["etcd_lease_per_acquisition_cycles_per_s"] =
                u.lease_per_acquisition_cycles_per_s.into();
            let _ = writeln!(out, "{v}");
        }
        if let Some(c) = &self.contended {
            let mut v = base("contended");
            v["mode"] = "queue".into();
            v["workers"] = c.workers.into();
            v["hold_ms"] = c.hold_ms.into();
            v["completions"] = c.completions.into();
            v["completions_per_s"] = c.completions_per_s.into();
            v["wait_p50_ms"] = quantile(&c.waits_ms, 0.5).into();
            v["wait_p99_ms"] = quantile(&c.waits_ms, 0.99).into();
            v["handoff_p50_ms"] = quantile(&c.handoffs_ms, 0.5).into();
            v["handoff_p99_ms"] = quantile(&c.handoffs_ms, 0.99).into();
            v["jain_fairness"] = c.jain_fairness.into();
            v["overlaps"] = c.overlaps.into();
            let _ = writeln!(out, "{v}");
        }
        if let Some(m) = &self.many {
            let mut v = base("many");
            v["tasks"] = m.tasks.into();
            v["cycles_per_s"] = m.cycles_per_s.into();
            v["etcd_put_per_s"] = m.put_per_s.into();
            v["etcd_floor_cycles_per_s"] = m.floor_cycles_per_s.into();
            v["etcd_lease_per_acquisition_cycles_per_s"] =
                m.lease_per_acquisition_cycles_per_s.into();
            let _ = writeln!(out, "{v}");
        }
        out
    }
}

/// Runs the scenarios of `config` on the etcd cluster its URL names.
///
/// # Errors
/// The first failure; the message names the cluster without its password.
pub async fn run_etcd(config: &Config, observer: &mut impl Observer) -> Result<EtcdReport> {
    run_scenarios(config, observer)
        .await
        .map_err(|e| e.shown_for(&config.url))
}

async fn run_scenarios(config: &Config, observer: &mut impl Observer) -> Result<EtcdReport> {
    config.check()?;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let client = connect(config).await?;
    let reference = reference(config.url.raw())?;
    let mut report = EtcdReport {
        url: config.url.shown().to_owned(),
        duration: config.duration,
        uncontended: None,
        contended: None,
        many: None,
    };
    for scenario in &config.scenarios {
        match scenario {
            Scenario::Uncontended => {
                observer.measuring("uncontended", config.duration * 3);
                let name = format!("bench:{run_id}:uncontended");
                let half = config.duration / 2;
                let get_per_s = etcd_rate(&reference, 1, half, Op::Get).await?;
                let put_per_s = etcd_rate(&reference, 1, half, Op::Put).await?;
                let floor = etcd_rate(&reference, 1, half, Op::Floor).await?;
                let per_acquisition =
                    etcd_rate(&reference, 1, half, Op::LeasePerAcquisition).await?;
                let cycles_per_s = cycles(&client, config, &[name], config.duration).await?;
                observer.measured();
                report.uncontended = Some(EtcdUncontended {
                    cycles_per_s,
                    get_per_s,
                    put_per_s,
                    floor_cycles_per_s: floor,
                    lease_per_acquisition_cycles_per_s: per_acquisition,
                });
            }
            Scenario::Contended => {
                observer.measuring("contended", config.duration);
                let name = format!("bench:{run_id}:contended");
                report.contended = Some(contended(config, &name).await?);
                observer.measured();
            }
            Scenario::Many => {
                observer.measuring("many", config.duration * 5 / 2);
                let half = config.duration / 2;
                let put_per_s = etcd_rate(&reference, config.tasks, half, Op::Put).await?;
                let floor = etcd_rate(&reference, config.tasks, half, Op::Floor).await?;
                let per_acquisition =
                    etcd_rate(&reference, config.tasks, half, Op::LeasePerAcquisition).await?;
                let names: Vec<String> = (0..config.tasks)
                    .map(|i| format!("bench:{run_id}:many:{i}"))
                    .collect();
                let cycles_per_s = cycles(&client, config, &names, config.duration).await?;
                observer.measured();
                report.many = Some(EtcdMany {
                    tasks: config.tasks,
                    cycles_per_s,
                    put_per_s,
                    floor_cycles_per_s: floor,
                    lease_per_acquisition_cycles_per_s: per_acquisition,
                });
            }
            Scenario::Held => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "the held scenario is measured on Redis only (on etcd every lease is a server-side lease of its own)",
                ));
            }
            Scenario::Semaphore => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "the semaphore scenario is measured on Redis only",
                ));
            }
            Scenario::RwLock => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "the rwlock scenario is measured on Redis only (its references are Redis's round trip and handoff floor)",
                ));
            }
        }
    }
    Ok(report)
}

async fn connect(config: &Config) -> Result<LockClient> {
    Ok(LockClient::builder(config.url.raw())
        .prefix(&config.prefix)
        .defaults(config.options.clone())
        .connect()
        .await?)
}

/// How the reference measurements reach etcd directly: the client
/// endpoints and the URL's credentials.
struct Reference {
    endpoints: Vec<String>,
    /// `USER:PASSWORD@` of the URL, percent-decoded.
    user: Option<(String, String)>,
}

impl Reference {
    /// A plain client of etcd itself, authenticated as the URL's user.
    async fn client(&self) -> Result<etcd_client::Client> {
        let options = self.user.as_ref().map(|(user, password)| {
            etcd_client::ConnectOptions::new().with_user(user.clone(), password.clone())
        });
        etcd_client::Client::connect(&self.endpoints, options)
            .await
            .map_err(|e| Error::new(ErrorKind::Unreachable, format!("etcd: {e}")))
    }
}

/// The reference client of an `etcd://[USER:PASSWORD@]HOST:PORT[,…]` URL
/// (the library has connected with the same URL already, so only what the
/// references need is read here).
fn reference(url: &str) -> Result<Reference> {
    let bad = || {
        Error::new(
            ErrorKind::InvalidInput,
            "the etcd references need an etcd://[USER:PASSWORD@]HOST:PORT[,…] URL (no TLS)",
        )
    };
    let rest = url.strip_prefix("etcd://").ok_or_else(bad)?;
    let (user, rest) = match rest.rsplit_once('@') {
        Some((userinfo, location)) => {
            let (user, password) = userinfo.split_once(':').ok_or_else(bad)?;
            (
                Some((percent_decoded(user), percent_decoded(password))),
                location,
            )
        }
        None => (None, rest),
    };
    let hosts = rest.split(['?', '/']).next().unwrap_or_default();
    Ok(Reference {
        endpoints: hosts.split(',').map(|h| format!("http://{h}")).collect(),
        user,
    })
}

/// `text` with `%XX` escapes decoded (an invalid escape is kept as it is).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Cycles per second of `acquire` + `release` by one task per name, all on
/// one client, for `duration`.
async fn cycles(
    client: &LockClient,
    config: &Config,
    names: &[String],
    duration: Duration,
) -> Result<f64> {
    let opts = config.options.clone();
    // Warm up: connections open.
    client.acquire(&names[0], &opts).await?.release().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = names
        .iter()
        .map(|name| {
            let (client, opts, stop, name) =
                (client.clone(), opts.clone(), stop.clone(), name.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    client.acquire(&name, &opts).await?.release().await?;
                    n += 1;
                }
                Ok::<_, Error>(n)
            })
        })
        .collect();
    per_second(duration, &stop, started, tasks).await
}

/// Lets counting `tasks` run for `duration`, stops them, and returns their
/// total count per second since `started`.
async fn per_second(
    duration: Duration,
    stop: &AtomicBool,
    started: Instant,
    tasks: Vec<tokio::task::JoinHandle<Result<u64>>>,
) -> Result<f64> {
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0u64;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// A reference operation on etcd itself.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// A linearizable read.
    Get,
    /// A write.
    Put,
    /// The etcd floor: create in a transaction on a lease granted once,
    /// then delete.
    Floor,
    /// A lease per acquisition: lease grant, create in a transaction, then
    /// delete and revoke sent together.
    LeasePerAcquisition,
}

/// Operations per second of `op` from `tasks` tasks on one plain client.
async fn etcd_rate(reference: &Reference, tasks: usize, duration: Duration, op: Op) -> Result<f64> {
    let client = reference.client().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (mut client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let key = format!("fencelock-bench-reference/{i}");
                let session = match op {
                    // Longer than any measurement; revoked after it.
                    Op::Floor => client.lease_grant(3600, None).await.map(|l| l.id()),
                    _ => Ok(0),
                }
                .map_err(|e| Error::failed(format!("etcd: {e}")))?;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let done = match op {
                        Op::Get => client.get(key.as_str(), None).await.map(drop),
                        Op::Put => client.put(key.as_str(), "x", None).await.map(drop),
                        Op::Floor => floor_cycle(&mut client, &key, session, n).await,
                        Op::LeasePerAcquisition => {
                            lease_per_acquisition_cycle(&mut client, &key).await
                        }
                    };
                    done.map_err(|e| Error::failed(format!("etcd: {e}")))?;
                    n += 1;
                }
                if session != 0 {
                    let _ = client.lease_revoke(session).await;
                }
                Ok::<_, Error>(n)
            })
        })
        .collect();
    per_second(duration, &stop, started, handles).await
}

/// A grant as bare calls: `key` created on `lease` if it does not exist.
async fn create(
    client: &mut etcd_client::Client,
    key: &str,
    lease: i64,
) -> Result<(), etcd_client::Error> {
    let put = TxnOp::put(key, "floor", Some(PutOptions::new().with_lease(lease)));
    client
        .txn(
            Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([put]),
        )
        .await
        .map(drop)
}

/// One cycle of the etcd floor on `key`: acquisition `n` on lease
/// `session`.
async fn floor_cycle(
    client: &mut etcd_client::Client,
    key: &str,
    session: i64,
    n: u64,
) -> Result<(), etcd_client::Error> {
    let own = format!("{key}/{session:x}/{n:x}");
    create(client, &own, session).await?;
    client.delete(own.as_str(), None).await?;
    Ok(())
}

/// One cycle of the recipe with a lease per acquisition on `key`.
async fn lease_per_acquisition_cycle(
    client: &mut etcd_client::Client,
    key: &str,
) -> Result<(), etcd_client::Error> {
    let lease = client.lease_grant(10, None).await?.id();
    let own = format!("{key}/{lease:x}");
    create(client, &own, lease).await?;
    let (mut kv, mut leases) = (client.clone(), client.clone());
    let (deleted, revoked) =
        tokio::join!(kv.delete(own.as_str(), None), leases.lease_revoke(lease));
    deleted?;
    revoked?;
    Ok(())
}

async fn contended(config: &Config, name: &str) -> Result<EtcdContended> {
    let workers = config.workers;
    let hold = config.hold;
    let opts = config.options.clone().wait(Duration::from_secs(60));
    let inside = Arc::new(AtomicI64::new(0));
    let overlaps = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
    let go = Arc::new(tokio::sync::Notify::new());
    let threads: Vec<_> = (0..workers)
        .map(|worker| {
            let (config, name, opts) = (config.clone(), name.to_owned(), opts.clone());
            let (inside, overlaps, stop) = (inside.clone(), overlaps.clone(), stop.clone());
            let (ready_tx, go) = (ready_tx.clone(), go.clone());
            std::thread::spawn(move || -> Result<Vec<Section>> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let started = go.notified();
                    let client = connect(&config).await;
                    let _ = ready_tx.send(());
                    let client = client?;
                    started.await;
                    // A mutex's: no writers of a read-write lock.
                    let writers = AtomicI64::new(0);
                    let counters = Counters {
                        capacity: 1,
                        writers: &writers,
                        inside: &inside,
                        overlaps: &overlaps,
                        stop: &stop,
                    };
                    contend(&client, &name, &opts, hold, worker, counters).await
                })
            })
        })
        .collect();
    drop(ready_tx);
    for _ in 0..workers {
        if ready_rx.recv().await.is_none() {
            break;
        }
    }
    let started = Instant::now();
    go.notify_waiters();
    tokio::time::sleep(config.duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut sections = Vec::new();
    for t in threads {
        let joined = tokio::task::spawn_blocking(move || t.join()).await?;
        sections.extend(joined.map_err(|_| Error::failed("a bench worker panicked"))??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    sections.sort_by_key(|s| s.granted);
    let mut waits_ms: Vec<f64> = sections
        .iter()
        .map(|s| (s.granted - s.requested).as_secs_f64() * 1e3)
        .collect();
    waits_ms.sort_by(f64::total_cmp);
    let mut handoffs_ms: Vec<f64> = sections
        .windows(2)
        .filter(|p| p[0].worker != p[1].worker)
        .map(|p| {
            p[1].granted
                .saturating_duration_since(p[0].released)
                .as_secs_f64()
                * 1e3
        })
        .collect();
    handoffs_ms.sort_by(f64::total_cmp);
    let mut counts = vec![0u64; workers];
    for s in &sections {
        counts[s.worker] += 1;
    }
    Ok(EtcdContended {
        workers,
        hold_ms: hold.as_secs_f64() * 1e3,
        completions: sections.len() as u64,
        completions_per_s: sections.len() as f64 / elapsed,
        waits_ms,
        handoffs_ms,
        jain_fairness: jain(&counts),
        overlaps: overlaps.load(Ordering::SeqCst) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_endpoints_and_credentials_come_from_the_url() -> Result<()> {
        let plain = reference("etcd://127.0.0.1:2379,10.0.0.2:2379/?prefix=x")?;
        assert_eq!(
            plain.endpoints,
            ["http://127.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert!(plain.user.is_none());
        assert!(reference("etcds://h:1").is_err());
        let user = reference("etcd://u:p%40ss@h:1")?;
        assert_eq!(user.endpoints, ["http://h:1"]);
        assert_eq!(user.user, Some(("u".to_owned(), "p@ss".to_owned())));
        assert!(reference("etcd://no-password@h:1").is_err());
        Ok(())
    }
}
