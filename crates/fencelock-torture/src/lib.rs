//! # fencelock-torture
//!
//! The engine of `fencelock torture`: a Jepsen-style safety harness for
//! fencelock on one machine. Worker processes take leases and do fenced
//! read-modify-writes on a resource that audits every accepted write in the
//! same script or transaction; nemeses pause, kill, stall and cut the
//! servers and the workers on a seeded schedule; an observer records the
//! lock keys as Redis holds them; and at the end the checkers C1–C7 read
//! the whole history and say whether anything unsafe happened. Negative
//! controls (`--unsafe`) run deliberately broken variants, which the same
//! checkers must catch.
//!
//! A run takes a mutex by default; with [`Config::permits`]
//! (`--primitive semaphore --permits N`) the workers take permits of a
//! fenced semaphore instead, each writing its slot's partition of the
//! resource through the slot's own (fence, holder) pair, and the checkers
//! judge C1–C7 per slot and, across the slots of a name, C8 (never more
//! valid holders than permits) and C9 (no valid permit refused); the
//! `one-fence` control fences every permit with one pair.
//!
//! With [`Config::rwlock_reads`] (`--primitive rwlock`) each cycle takes
//! one side of a fenced read-write lock: writers do the mutex's audited
//! read-modify-write, readers one validated read of the resource against
//! their write epoch (`FencedHash::read_validated`), recording what they
//! read, the stored fence and their verdict; the checkers judge C1–C3 on
//! the writers' writes, C4 and C6 among the writers, C5 and C7 per holder,
//! and C10 (no writer with a valid reader), C11 (no torn read reported
//! clean, judged against the audit's order; none torn while its lease was
//! valid) and C12 (epochs in order with the writers' fences); the
//! `unvalidated-read` control reports every read clean without looking.
//!
//! [`run`] carries out a [`Config`] on a [`Topology`] and returns a
//! [`Report`]; [`Report::from_history`] checks a saved [`History`] the same
//! way; a report renders as text or one JSON object ([`Report::to_text`],
//! [`Report::to_json`]). [`replay::replay`] replays a saved history
//! through the protocol's model and names the first operation it cannot
//! explain. [`worker::main`] is the worker process's entry
//! point (the CLI's hidden `torture-worker` command).
//!
//! | module | concern |
//! |---|---|
//! | `config` | [`Config`], [`Variant`], [`ResourceKind`] |
//! | `nemesis` | [`NemesisKind`]: the faults a run injects (`revoke` among them: `LockClient::revoke` with the resource's seal) |
//! | `topology` | [`Topology`], the seam to the servers; [`Shape`], [`refusal`]; [`Remote`] for `--redis URL` and `--url etcd://…` |
//! | `run` | the coordinator: setup, workers (any program that speaks the worker protocol, per worker: [`Launcher::worker_at`]), nemeses (the revoke nemesis's own lock client), shutdown, [`Launcher`], [`Progress`] |
//! | `schedule` | the seeded nemesis plan ([`schedule::plan`]) |
//! | `worker` | the worker process: lease cycles, history lines on stdout |
//! | `resource` | the audited resource (Redis hash + list, Postgres row + audit table), its audited seal (`fencelock::Sealable`) |
//! | `controls` | the negative controls' lock and resource scripts (never on the safe path) |
//! | `conn` | every connection of a run, through fencelock's own client (its URL forms, [`Tls`] files, Sentinel, Cluster); raw calls sent once |
//! | `proxy` | the fault-injecting TCP proxy (delay, blackhole, swallowed reply, reset) |
//! | `sockets` | a worker's connections to a node, from `/proc` (`client-kill` without the proxy) |
//! | `observer` | polls the lock keys: Redis's own view of the holders |
//! | `history` | [`Event`], [`Entry`], [`History`]: the JSON-lines history |
//! | `check` | C1–C7, for a semaphore C1–C7 per slot with C8 and C9, for a read-write lock C1–C7 on writers and holders with C10–C12 ([`check::check`], [`CheckResult`]) |
//! | `replay` | `--check FILE --model`: a saved history replayed through the model's store transitions ([`replay::replay`], [`replay::ModelCheck`], its text and JSON) |
//! | `report` | [`Report`] and its [`Figures`] |
//! | `render` | text and JSON, the only place either is written |
//! | `clock` | the shared monotonic clock ([`clock::RunClock`]) |
//! | `error` | [`Error`], [`ErrorKind`] |

pub mod check;
pub mod clock;
mod config;
mod conn;
mod controls;
mod error;
pub mod history;
mod nemesis;
mod observer;
mod proxy;
mod render;
pub mod replay;
mod report;
mod resource;
mod run;
pub mod schedule;
mod sockets;
mod topology;
pub mod worker;

pub use check::{CheckResult, Violation};
pub use config::{Config, ResourceKind, Variant};
pub use conn::Tls;
pub use error::{Error, ErrorKind, Result};
pub use history::{Entry, Event, History};
pub use nemesis::NemesisKind;
pub use render::Format;
pub use report::{
    Figures, KindFigures, MIN_ACKNOWLEDGED_PER_NAME, MIN_GRANTS_PER_NAME, MIN_READS_PER_NAME,
    Report,
};
pub use run::{DEFAULT_WORKER_KIND, Launcher, Progress, Status, run};
pub use topology::{Remote, Shape, Topology, is_etcd_url, refusal};
