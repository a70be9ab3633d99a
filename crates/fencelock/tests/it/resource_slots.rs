//! Per-slot fencing at the resources (a semaphore's permits each hold a
//! slot and a fence of their own, minted from the name's one counter, so
//! live permits' fences interleave): one (fence, holder) pair per slot, the
//! rule of `fence_accepts` applied to each pair alone, on a Redis hash
//! (`FencedHash::slot`), an etcd key (`FencedKey::slot`) and Postgres rows
//! keyed by slot. Each resource shows: two live permits of different slots
//! with interleaved fences both accepted; a stale permit of the same slot
//! refused; an equal fence from another holder refused; and, as the
//! negative control, the unslotted resource (one pair for all) refusing the
//! live permit whose fence is lower — the reason slots exist. Hostile
//! input: slots 1 and 11 (and 0, 111, `u32::MAX`) never share a pair.

use fencelock::{Fence, WriteOutcome, holder_id};

fn rejected(fence: u64, holder: &str) -> WriteOutcome {
    WriteOutcome::Rejected {
        current_fence: Some(Fence::new(fence)),
        current_holder: Some(holder_id(holder)),
    }
}

/// The fences of the scenario: slot 1's permit was granted at 200, slot 0's
/// at 150 (interleaved), and slot 1's previous permit, now stale, at 180.
const LIVE_1: u64 = 200;
const LIVE_0: u64 = 150;
const STALE_1: u64 = 180;

mod redis_hash {
    use std::collections::HashMap;

    use fencelock::{Error, Fence, HashState, WriteOutcome, holder_id};

    use super::{LIVE_0, LIVE_1, STALE_1, rejected};
    use crate::support::{Keys, TestRedis, connect};

    /// Live permits of slots 1 (fence 200) and 0 (fence 150) are both
    /// accepted; slot 1's stale permit (180) and an equal fence from
    /// another holder are refused and change nothing; each view reads its
    /// own triple; the fields are `value:N`, `fence:N`, `holder:N`, and the
    /// hash's own fields stay absent.
    #[tokio::test]
    async fn slot_views_fence_each_slot_with_its_own_pair() -> anyhow::Result<()> {
        let TestRedis { server, client } = TestRedis::start().await?;
        let hash = client.fenced_hash("parts")?;
        let (s0, s1) = (hash.slot(0), hash.slot(1));
        assert_eq!((s0.slot_number(), hash.slot_number()), (Some(0), None));
        assert_eq!(s1.key(), "parts");

        assert!(
            s1.write(Fence::new(LIVE_1), "p1", "one")
                .await?
                .is_accepted()
        );
        assert!(
            s0.write(Fence::new(LIVE_0), "p0", "zero")
                .await?
                .is_accepted()
        );
        let snapshot = server.hgetall("parts");
        assert_eq!(
            snapshot,
            HashMap::from([
                ("value:1".to_owned(), "one".to_owned()),
                ("fence:1".to_owned(), LIVE_1.to_string()),
                ("holder:1".to_owned(), holder_id("p1")),
                ("value:0".to_owned(), "zero".to_owned()),
                ("fence:0".to_owned(), LIVE_0.to_string()),
                ("holder:0".to_owned(), holder_id("p0")),
            ])
        );

        // The stale permit of slot 1 is refused, although its fence is
        // above slot 0's: only slot 1's pair counts.
        assert_eq!(
            s1.write(Fence::new(STALE_1), "old1", "stale").await?,
            rejected(LIVE_1, "p1")
        );
        assert_eq!(
            s1.register(Fence::new(STALE_1), "old1").await?,
            rejected(LIVE_1, "p1")
        );
        // Equal fence, other holder: refused, on either slot.
        assert_eq!(
            s0.write(Fence::new(LIVE_0), "other", "x").await?,
            rejected(LIVE_0, "p0")
        );
        assert_eq!(
            s1.write(Fence::new(LIVE_1), "other", "x").await?,
            rejected(LIVE_1, "p1")
        );
        assert_eq!(server.hgetall("parts"), snapshot, "refusals change nothing");

        // Equal fence, same holder: accepted (a permit writes many times).
        assert!(
            s0.write(Fence::new(LIVE_0), "p0", "zero again")
                .await?
                .is_accepted()
        );
        let mut expected = HashState::default();
        expected.value = Some("zero again".into());
        expected.fence = Some(Fence::new(LIVE_0));
        expected.holder = Some(holder_id("p0"));
        assert_eq!(s0.read().await?, expected);
        assert_eq!(s1.read().await?.value.as_deref(), Some("one"));
        // The unslotted hash has no pair yet: its fields were never written.
        assert_eq!(hash.read().await?, HashState::default());
        Ok(())
    }

    /// The negative control: on the unslotted hash (one pair for every
    /// permit), the live permit of slot 0, whose fence (150) is below the
    /// live permit of slot 1's (200), is refused, although it holds a valid
    /// permit. This is why a semaphore's resources keep a pair per slot.
    #[tokio::test]
    async fn one_pair_for_all_slots_refuses_a_live_permit_of_another_slot() -> anyhow::Result<()> {
        let TestRedis {
            server: _server,
            client,
        } = TestRedis::start().await?;
        let shared = client.fenced_hash("shared")?;
        assert!(
            shared
                .write(Fence::new(LIVE_1), "p1", "one")
                .await?
                .is_accepted()
        );
        assert_eq!(
            shared.write(Fence::new(LIVE_0), "p0", "zero").await?,
            rejected(LIVE_1, "p1")
        );
        Ok(())
    }

    /// register, update and seal act on the view's slot only: a seal of
    /// slot 0 refuses slot 0's fences up to it and leaves slot 1 and the
    /// hash's own pair alone; an update is a read-modify-write of the
    /// slot's value.
    #[tokio::test]
    async fn register_update_and_seal_stay_in_their_slot() -> anyhow::Result<()> {
        let TestRedis { server, client } = TestRedis::start().await?;
        let hash = client.fenced_hash("ops")?;
        let (s0, s1) = (hash.slot(0), hash.slot(1));
        assert!(
            hash.write(Fence::new(500), "mutex", "m")
                .await?
                .is_accepted()
        );
        assert!(s1.register(Fence::new(LIVE_1), "p1").await?.is_accepted());
        assert!(
            s1.update(Fence::new(LIVE_1), "p1", |v| format!(
                "{}+1",
                v.unwrap_or("0")
            ))
            .await?
            .is_accepted()
        );
        assert_eq!(s1.read().await?.value.as_deref(), Some("0+1"));

        assert!(
            s0.write(Fence::new(LIVE_0), "p0", "zero")
                .await?
                .is_accepted()
        );
        assert!(s0.seal(Fence::new(LIVE_0)).await?.is_accepted());
        assert_eq!(
            s0.write(Fence::new(LIVE_0), "p0", "after seal").await?,
            WriteOutcome::Rejected {
                current_fence: Some(Fence::new(LIVE_0)),
                current_holder: Some(fencelock::REVOKED_HOLDER.to_owned()),
            }
        );
        assert!(
            s0.write(Fence::new(LIVE_0 + 1), "p0b", "next")
                .await?
                .is_accepted()
        );
        // Slot 1 and the hash's own pair are untouched by slot 0's seal.
        assert!(
            s1.write(Fence::new(LIVE_1), "p1", "two")
                .await?
                .is_accepted()
        );
        let own = hash.read().await?;
        assert_eq!(
            (own.value.as_deref(), own.fence),
            (Some("m"), Some(Fence::new(500)))
        );
        // A seal refused by a greater fence in its slot reports that slot's pair.
        assert_eq!(s1.seal(Fence::new(LIVE_0)).await?, rejected(LIVE_1, "p1"));
        assert_eq!(server.hgetall("ops").len(), 3 * 3, "three triples");
        Ok(())
    }

    /// Slots 1, 11, 111, 0 and `u32::MAX` never share a pair (exact field
    /// names, no prefixes); a view of a view is the view of the new slot
    /// (`slot(1).slot(11)` is slot 11, not `1:11`); a slot's field holding
    /// garbage is a typed error naming the key.
    #[tokio::test]
    async fn slot_views_are_never_confused_on_redis() -> anyhow::Result<()> {
        let TestRedis { server, client } = TestRedis::start().await?;
        let hash = client.fenced_hash("hostile")?;
        // A high fence in slot 11 first: it must not shadow slot 1 or 111.
        assert!(
            hash.slot(11)
                .write(Fence::new(900), "p11", "eleven")
                .await?
                .is_accepted()
        );
        for (slot, holder) in [(1, "p1"), (111, "p111"), (0, "p0"), (u32::MAX, "pmax")] {
            assert!(
                hash.slot(slot)
                    .write(Fence::new(100), holder, holder)
                    .await?
                    .is_accepted(),
                "slot {slot} is not slot 11"
            );
        }
        assert_eq!(
            hash.slot(1)
                .slot(11)
                .write(Fence::new(100), "p1", "x")
                .await?,
            rejected(900, "p11"),
            "a view of a view names the new slot only"
        );
        assert_eq!(hash.slot(1).slot(11).slot_number(), Some(11));
        let fields = server.hgetall("hostile");
        assert_eq!(
            fields.get("fence:4294967295").map(String::as_str),
            Some("100")
        );
        assert_eq!(
            fields.get("value:4294967295").map(String::as_str),
            Some("pmax")
        );
        assert_eq!(fields.get("fence:11").map(String::as_str), Some("900"));
        assert_eq!(fields.len(), 5 * 3);
        assert_eq!(
            hash.slot(u32::MAX).read().await?.value.as_deref(),
            Some("pmax")
        );

        let _: i64 = server.query(&["HSET", "hostile", "fence:7", "not a fence"]);
        assert!(matches!(
            hash.slot(7).write(Fence::new(1), "p7", "v").await,
            Err(Error::WrongType { .. })
        ));
        assert!(matches!(
            hash.slot(7).read().await,
            Err(Error::UnexpectedReply(_))
        ));
        Ok(())
    }

    /// The script itself, called raw (as a client in another language
    /// would): a slot not in canonical decimal is refused, so one slot never
    /// names two pairs (`01` beside `1`) and no field can be forged (`1:x`);
    /// the canonical slot is the same pair the Rust view writes.
    #[tokio::test]
    async fn the_script_refuses_slots_not_in_canonical_decimal() -> anyhow::Result<()> {
        let TestRedis { server, client } = TestRedis::start().await?;
        let script = redis::Script::new(concat!(
            include_str!("../../src/store/redis/scripts/common.lua"),
            include_str!("../../src/store/redis/scripts/fenced_write.lua"),
        ));
        let mut con = connect(&server).await?;
        for bad in ["01", "-1", "1:x", "", " 1", "1.0"] {
            let reply: redis::RedisResult<redis::Value> = script
                .key("raw")
                .arg(5)
                .arg("tok")
                .arg("write")
                .arg("v")
                .arg(bad)
                .invoke_async(&mut con)
                .await;
            assert!(reply.is_err(), "slot {bad:?} must be refused");
        }
        assert!(!server.exists("raw"), "a refused slot writes nothing");
        let (accepted, _, _): (i64, Option<String>, Option<String>) = script
            .key("raw")
            .arg(5)
            .arg("tok")
            .arg("write")
            .arg("v")
            .arg("1")
            .invoke_async(&mut con)
            .await?;
        assert_eq!(accepted, 1);
        let view = client.fenced_hash("raw")?.slot(1);
        assert_eq!(view.read().await?.value.as_deref(), Some("v"));
        assert_eq!(
            view.write(Fence::new(4), "other", "w").await?,
            super::rejected(5, "tok")
        );
        Ok(())
    }
}

#[cfg(feature = "etcd")]
mod etcd_key {
    use fencelock::{Fence, KeyState, holder_id};

    use super::{LIVE_0, LIVE_1, STALE_1, rejected};
    use crate::support::etcd::{TestEtcd, keys_under};

    /// The scenario on etcd: live permits of slots 1 (200) and 0 (150) both
    /// accepted, slot 1's stale permit (180) and an equal fence from
    /// another holder refused, held writes and reads per slot.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_slot_views_fence_each_slot_with_its_own_key() -> anyhow::Result<()> {
        let t = TestEtcd::single().await?;
        let key = t.client.fenced_key("parts")?;
        let (s0, s1) = (key.slot(0), key.slot(1));
        assert_eq!(
            (s1.slot_number(), key.slot_number(), s1.key()),
            (Some(1), None, "parts")
        );

        assert!(
            s1.write(Fence::new(LIVE_1), "p1", "one")
                .await?
                .is_accepted()
        );
        assert!(
            s0.write(Fence::new(LIVE_0), "p0", "zero")
                .await?
                .is_accepted()
        );
        assert_eq!(
            s1.write(Fence::new(STALE_1), "old1", "stale").await?,
            rejected(LIVE_1, "p1")
        );
        assert_eq!(
            s1.register(Fence::new(STALE_1), "old1").await?,
            rejected(LIVE_1, "p1")
        );
        assert_eq!(
            s0.write(Fence::new(LIVE_0), "other", "x").await?,
            rejected(LIVE_0, "p0")
        );
        assert!(
            s0.write(Fence::new(LIVE_0), "p0", "zero again")
                .await?
                .is_accepted()
        );
        let state = s0.read().await?;
        assert_eq!(
            (state.value.as_deref(), state.fence, state.holder),
            (
                Some("zero again"),
                Some(Fence::new(LIVE_0)),
                Some(holder_id("p0"))
            )
        );
        assert_eq!(s1.read().await?.value.as_deref(), Some("one"));
        assert_eq!(
            key.read().await?,
            KeyState::default(),
            "the key itself is untouched"
        );

        // Each slot is its own etcd key: KEY, U+001F, slot:N.
        let mut admin = t.admin().await?;
        let keys: Vec<String> = keys_under(&mut admin, "parts")
            .await?
            .into_iter()
            .map(|(k, _, _)| k)
            .collect();
        assert_eq!(keys, ["parts\u{1f}slot:1", "parts\u{1f}slot:0"]);

        // update and seal per slot.
        assert!(
            s1.update(Fence::new(LIVE_1), "p1", |v| format!(
                "{}+",
                v.unwrap_or_default()
            ))
            .await?
            .is_accepted()
        );
        assert_eq!(s1.read().await?.value.as_deref(), Some("one+"));
        assert!(s0.seal(Fence::new(LIVE_0)).await?.is_accepted());
        assert!(
            !s0.write(Fence::new(LIVE_0), "p0", "sealed")
                .await?
                .is_accepted()
        );
        assert!(
            s1.write(Fence::new(LIVE_1), "p1", "slot 1 unsealed")
                .await?
                .is_accepted()
        );
        Ok(())
    }

    /// The negative control on etcd: one key for every permit refuses the
    /// live permit of slot 0, whose fence is below slot 1's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_one_key_for_all_slots_refuses_a_live_permit_of_another_slot() -> anyhow::Result<()>
    {
        let t = TestEtcd::single().await?;
        let shared = t.client.fenced_key("shared")?;
        assert!(
            shared
                .write(Fence::new(LIVE_1), "p1", "one")
                .await?
                .is_accepted()
        );
        assert_eq!(
            shared.write(Fence::new(LIVE_0), "p0", "zero").await?,
            rejected(LIVE_1, "p1")
        );
        Ok(())
    }

    /// Slots 1, 11 and `u32::MAX` are distinct keys; a user key spelled
    /// like a slot key in print (`parts/slot/1`, `parts:slot:1`) is another
    /// resource, and one with the separator itself is refused; a key just
    /// below the lock prefix keeps its slots outside the lock space.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn etcd_slot_views_are_never_confused() -> anyhow::Result<()> {
        let t = TestEtcd::single().await?;
        let key = t.client.fenced_key("h")?;
        assert!(
            key.slot(11)
                .write(Fence::new(900), "p11", "eleven")
                .await?
                .is_accepted()
        );
        assert!(
            key.slot(1)
                .write(Fence::new(100), "p1", "one")
                .await?
                .is_accepted()
        );
        assert!(
            key.slot(u32::MAX)
                .write(Fence::new(100), "pm", "max")
                .await?
                .is_accepted()
        );
        assert_eq!(
            key.slot(1).slot(11).read().await?.fence,
            Some(Fence::new(900))
        );
        for lookalike in ["h/slot/1", "h:slot:1", "hslot:1"] {
            let other = t.client.fenced_key(lookalike)?;
            assert!(
                other.write(Fence::new(1), "u", "user").await?.is_accepted(),
                "{lookalike} is a resource of its own"
            );
        }
        assert_eq!(key.slot(1).read().await?.value.as_deref(), Some("one"));
        assert!(matches!(
            t.client.fenced_key("h\u{1f}slot:1"),
            Err(fencelock::Error::InvalidName { .. })
        ));
        let mut admin = t.admin().await?;
        let max = keys_under(&mut admin, "h\u{1f}slot:4294967295").await?;
        assert_eq!(max.len(), 1);

        // "lock:job" is a valid fenced key (no '/' after the lock prefix);
        // its slots add none, so no lock recipe takes them for a holder.
        let near_locks = t.client.fenced_key("lock:job")?;
        assert!(
            near_locks
                .slot(2)
                .write(Fence::new(5), "p2", "v")
                .await?
                .is_accepted()
        );
        // The lock is free: the slot key is no holder of it.
        let lease = t.client.try_acquire("job", &t.client.options()).await?;
        lease.release().await?;
        Ok(())
    }
}

#[cfg(feature = "postgres")]
mod postgres_rows {
    use fencelock::sqlx::{AssertSqlSafe, Executor};
    use fencelock::{Fence, FencedTable, RowFence, SetClause, WriteOutcome, holder_id};

    use super::{LIVE_0, LIVE_1, STALE_1, rejected};
    use crate::support::postgres::{pool, start_server};

    fn owner(o: &'static str) -> SetClause {
        SetClause::new().set("owner", o)
    }

    /// A row per slot, keyed by the slot (`bigint`): the live permits of
    /// slots 1 (200) and 0 (150) both accepted, slot 1's stale permit (180)
    /// and an equal fence from another holder refused; the negative
    /// control: one row for every permit refuses slot 0's live permit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_rows_keyed_by_slot_fence_each_slot() -> anyhow::Result<()> {
        let pg = start_server().await;
        let pool = pool(&pg.url(), 2).await?;
        pool.execute("CREATE TABLE partitions (slot bigint PRIMARY KEY, owner text)")
            .await?;
        let parts = FencedTable::new(pool.clone(), "partitions")?.with_key_column("slot")?;
        parts.add_fence_columns().await?;

        let (f1, f0, stale) = (Fence::new(LIVE_1), Fence::new(LIVE_0), Fence::new(STALE_1));
        assert!(
            parts
                .upsert(&pool, 1_i64, f1, "p1", &owner("p1"))
                .await?
                .is_accepted()
        );
        assert!(
            parts
                .upsert(&pool, 0_i64, f0, "p0", &owner("p0"))
                .await?
                .is_accepted()
        );
        assert_eq!(
            parts
                .update(&pool, 1_i64, stale, "old1", &owner("old1"))
                .await?,
            rejected(LIVE_1, "p1")
        );
        assert_eq!(
            parts.register(&pool, 1_i64, stale, "old1").await?,
            rejected(LIVE_1, "p1")
        );
        assert_eq!(
            parts
                .update(&pool, 0_i64, f0, "other", &owner("other"))
                .await?,
            rejected(LIVE_0, "p0")
        );
        assert!(
            parts
                .update(&pool, 0_i64, f0, "p0", &owner("p0 again"))
                .await?
                .is_accepted()
        );
        let mut expected = RowFence::default();
        expected.fence = Some(f0);
        expected.holder = Some(holder_id("p0"));
        assert_eq!(parts.read_fence(&pool, 0_i64).await?, expected);

        // u32::MAX fits the bigint slot column.
        let max = i64::from(u32::MAX);
        assert!(
            parts
                .upsert(&pool, max, f0, "pm", &owner("pm"))
                .await?
                .is_accepted()
        );
        assert!(
            !parts
                .update(&pool, max, Fence::new(1), "old", &owner("x"))
                .await?
                .is_accepted()
        );

        // Negative control: one row (one pair) for every permit.
        pool.execute("CREATE TABLE shared (id bigint PRIMARY KEY, owner text)")
            .await?;
        let shared = FencedTable::new(pool.clone(), "shared")?;
        shared.add_fence_columns().await?;
        assert!(
            shared
                .upsert(&pool, 1_i64, f1, "p1", &owner("p1"))
                .await?
                .is_accepted()
        );
        assert_eq!(
            shared.upsert(&pool, 1_i64, f0, "p0", &owner("p0")).await?,
            rejected(LIVE_1, "p1")
        );
        Ok(())
    }

    /// Many resources in one table: a text key `RESOURCE/SLOT`, the slot
    /// last, so slots 1 and 11 (and resource `a/1` slot 1 vs resource `a`
    /// slot 11) are different rows; `u32::MAX` works.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_text_keys_with_the_slot_last_are_never_confused() -> anyhow::Result<()> {
        let pg = start_server().await;
        let pool = pool(&pg.url(), 2).await?;
        pool.execute("CREATE TABLE slot_state (id text PRIMARY KEY, owner text)")
            .await?;
        let rows = FencedTable::new(pool.clone(), "slot_state")?;
        rows.add_fence_columns().await?;
        let key = |resource: &str, slot: u32| format!("{resource}/{slot}");

        assert!(
            rows.upsert(
                &pool,
                key("orders", 11),
                Fence::new(900),
                "p11",
                &owner("p11")
            )
            .await?
            .is_accepted()
        );
        for (resource, slot) in [
            ("orders", 1),
            ("orders", 111),
            ("orders", u32::MAX),
            ("orders/1", 1),
        ] {
            assert!(
                rows.upsert(
                    &pool,
                    key(resource, slot),
                    Fence::new(100),
                    "p",
                    &owner("p")
                )
                .await?
                .is_accepted(),
                "{resource} slot {slot} is a row of its own"
            );
        }
        assert_eq!(
            rows.update(&pool, key("orders", 11), Fence::new(100), "p1", &owner("x"))
                .await?,
            rejected(900, "p11")
        );
        let count: i64 =
            fencelock::sqlx::query_scalar(AssertSqlSafe("SELECT count(*) FROM slot_state"))
                .fetch_one(&pool)
                .await?;
        assert_eq!(count, 5);
        assert!(matches!(
            rows.update(&pool, key("orders", 2), Fence::new(1), "p2", &owner("x"))
                .await,
            Err(fencelock::Error::RowNotFound { .. })
        ));
        let _: WriteOutcome = rows
            .register(&pool, key("orders", 1), Fence::new(100), "p")
            .await?;
        Ok(())
    }
}
