//! # fencelock-model
//!
//! An exhaustively checked model of fencelock's lock protocol on Redis: the
//! scripts as atomic transitions of one name's keys, clients that follow
//! the engine's rules, time in ticks, faults, and the torture checkers as
//! properties over every reachable state ([stateright]).
//!
//! | module | concern |
//! |---|---|
//! | `store` | the keys of one lock name and a fenced resource; each script (grant, release with hand-over, extend, leave, revoke, fenced write, register, seal) as one transition, and the broken rules of the negative controls ([`store::Broken`]) |
//! | `model` | [`model::LockModel`]: clients, time, faults ([`model::Faults`]), the properties C1–C4, C6, C7, the revoke rule and bounded liveness |
//! | `configs` | the larger configurations of the opt-in run (`scripts/model-large`) |
//! | `etcd` | [`etcd::EtcdLockModel`]: the etcd recipe (a key per acquisition under the name's prefix on the client's session lease, created if absent in one transaction that a resend finds again; the first key by create revision holds, each waiter watches the key ahead; the fence its create revision), a fenced etcd key, faults ([`etcd::Faults`]), the same properties with bounded liveness, and the broken rules of its controls ([`etcd::Broken`]) |
//! | `semaphore` | a fenced semaphore ahead of its scripts, as their specification: a slot per permit, fences from the name's one counter, a `(fence, holder)` pair per slot at the resource; never more valid holders than permits, C1–C3 per slot, C6 |
//! | `rwlock` | the fenced read-write lock: its hash as the scripts see it ([`rwlock::RwStore`]: `rw_grant.lua`, and `sem_release.lua`/`sem_extend.lua` for its holders, the fair queue included) and [`rwlock::RwModel`]: no two valid writers, no valid writer with a valid reader, writers' fences above every earlier grant, readers' epochs at least every earlier writer's fence, a validated read `Clean` only when no write above its epoch (or of a later writer) came before it, fair order; the broken rules of its controls ([`rwlock::RwBroken`]) |
//! | `trace` | a recorded history replayed through the store's transitions (a bounded linearizability search, per name): the first operation no order explains, or why the search could not decide ([`trace::explain`]) |

pub mod configs;
pub mod etcd;
pub mod model;
pub mod rwlock;
pub mod semaphore;
pub mod store;
pub mod trace;
