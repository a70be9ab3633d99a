//! The calls write the ARGV their scripts unpack; the replies decode every
//! code the scripts return.

use super::extend::NotExtended;
use super::grant::BatchedGrants;
use super::leave::LeaveReply;
use super::*;
use crate::fence::Fence;
use crate::keys::LockKeys;
use crate::options::WaitMode;
use crate::store::redis::scripts;
use crate::store::redis::wire::QueueMember;

fn args(call: &impl ToRedisArgs) -> Vec<String> {
    call.to_redis_args()
        .into_iter()
        .map(|a| String::from_utf8_lossy(&a).into_owned())
        .collect()
}

/// The ARGV order is the contract with the `.lua` files, which unpack
/// these positions into named locals on their first lines.
#[test]
fn calls_write_the_argv_their_scripts_unpack() -> crate::Result<()> {
    let keys = LockKeys::new("lock:", KeyLayout::HashTagged, "job")?;
    let opts = LockOptions::default().ttl(Duration::from_secs(5));
    let mint = Mint::new(&opts);
    let member = QueueMember {
        client: "c".into(),
        waiter: 1,
        mode: WaitMode::Fair,
        ttl: Duration::from_secs(5),
        handover: Duration::from_secs(1),
        token: "t".into(),
        access: None,
    };
    let grant = Grant {
        keys: &keys,
        mint,
        token: "t",
        ttl: opts.ttl,
        wait_mode: WaitMode::Fair,
        member: Some(&member),
        waiter_lease: Duration::from_secs(1),
        queued: true,
    };
    assert_eq!(
        args(&grant),
        [
            "ct86400000",
            "t",
            "5000",
            "fair",
            "c:1:fair:5000:1000:t",
            "1000",
            "1"
        ]
    );
    // An attempt that never queues sends no queue arguments.
    let unqueued = Grant {
        member: None,
        wait_mode: WaitMode::Notify,
        ..grant
    };
    assert_eq!(args(&unqueued), ["ct86400000", "t", "5000", "notify"]);
    // The lock key alone: the scripts derive the others from it.
    assert_eq!(*grant.keys(), [keys.lock()]);
    let pass_on = PassOn {
        publish: Publish::Publish,
    };
    let release = Release {
        lock: keys.lock(),
        mint,
        pass_on,
        value: "t:7",
        wake_first: false,
    };
    // The pass-on rides in the mint's argument: a release has two.
    assert_eq!(args(&release), ["ct86400000 PUBLISH 10000", "t:7"]);
    let leave = Leave {
        keys: &keys,
        mint: Mint::new(&opts.clone().fence_mode(FenceMode::Counter)),
        pass_on,
        member: &member,
    };
    assert_eq!(
        args(&leave),
        ["nt0 PUBLISH 10000", "c:1:fair:5000:1000:t", "t"]
    );
    assert_eq!(*release.keys(), [keys.lock()]);
    assert_eq!(*leave.keys(), [keys.lock()]);
    Ok(())
}

#[test]
fn replies_decode_every_code() {
    let pair = |a, b| Value::Array(vec![Value::Int(a), Value::Int(b)]);
    // Granted: the fence alone; a negative one is no fence.
    assert_eq!(
        GrantReply::from_redis_value(Value::Int(42)).ok(),
        Some(GrantReply::Granted(Fence::new(42)))
    );
    assert!(GrantReply::from_redis_value(Value::Int(-1)).is_err());
    assert_eq!(
        GrantReply::from_redis_value(pair(0, 250)).ok(),
        Some(GrantReply::Held {
            remaining: Some(Duration::from_millis(250)),
            seen: None
        })
    );
    assert_eq!(
        GrantReply::from_redis_value(pair(0, -1)).ok(),
        Some(GrantReply::Held {
            remaining: None,
            seen: None
        })
    );
    assert_eq!(
        GrantReply::from_redis_value(pair(2, 0)).ok(),
        Some(GrantReply::ReservedForHead { seen: None })
    );
    // grant.lua's refusals carry the fence stored then (nil: none).
    let triple = |a, b, last: Value| Value::Array(vec![Value::Int(a), Value::Int(b), last]);
    let held = GrantReply::from_redis_value(triple(0, 250, Value::BulkString(b"77".to_vec())));
    assert_eq!(
        held.ok(),
        Some(GrantReply::Held {
            remaining: Some(Duration::from_millis(250)),
            seen: Some(77)
        })
    );
    let reserved = GrantReply::from_redis_value(triple(2, 0, Value::BulkString(b"9".to_vec())));
    assert_eq!(
        reserved.ok(),
        Some(GrantReply::ReservedForHead { seen: Some(9) })
    );
    assert_eq!(
        GrantReply::from_redis_value(triple(0, 5, Value::Nil)).ok(),
        Some(GrantReply::Held {
            remaining: Some(Duration::from_millis(5)),
            seen: None
        })
    );
    assert!(GrantReply::from_redis_value(triple(0, 5, Value::BulkString(b"x".to_vec()))).is_err());
    assert!(GrantReply::from_redis_value(pair(1, -5)).is_err());
    assert!(GrantReply::from_redis_value(pair(9, 0)).is_err());
    assert_eq!(
        Checked::from_redis_value(Value::Int(-1)).ok(),
        Some(Checked::NotOurs(LossReason::TakenOver))
    );
    assert_eq!(
        LeaveReply::from_redis_value(Value::Int(2)).ok(),
        Some(LeaveReply::ReleasedHandOver)
    );
}

/// The batch calls write three ARGV per grant and one per release, in the
/// order `grant_many.lua` and `release_many.lua` read them, and only grants
/// the batch script can settle are batchable.
#[test]
fn batch_calls_write_their_items_in_order() -> crate::Result<()> {
    let a = LockKeys::new("lock:", KeyLayout::HashTagged, "a")?;
    let b = LockKeys::new("lock:", KeyLayout::Guide, "b")?;
    let opts = LockOptions::default().ttl(Duration::from_secs(5));
    let grant = |keys, token| Grant {
        keys,
        mint: Mint::new(&opts),
        token,
        ttl: opts.ttl,
        wait_mode: WaitMode::Notify,
        member: None,
        waiter_lease: Duration::from_secs(1),
        queued: false,
    };
    let items = [
        GrantItem::from(&grant(&a, "t1")),
        GrantItem::from(&Grant {
            mint: Mint::new(&opts.clone().layout(KeyLayout::Guide)),
            ..grant(&b, "t2")
        }),
    ];
    let many = GrantMany {
        items: &items,
        script: &scripts::GRANT_MANY,
    };
    assert_eq!(
        args(&many),
        ["ct86400000", "t1", "5000", "cb0", "t2", "5000"]
    );
    assert_eq!(*many.keys(), [a.lock(), b.lock()]);
    assert!(grant(&a, "t").batchable());
    let member = QueueMember {
        client: "c".into(),
        waiter: 1,
        mode: WaitMode::Notify,
        ttl: Duration::from_secs(5),
        handover: Duration::from_secs(1),
        token: "t".into(),
        access: None,
    };
    for not in [
        Grant {
            member: Some(&member),
            ..grant(&a, "t")
        },
        Grant {
            wait_mode: WaitMode::Fair,
            ..grant(&a, "t")
        },
        Grant {
            mint: Mint::new(&opts.clone().fence_mode(FenceMode::Counter)),
            ..grant(&a, "t")
        },
    ] {
        assert!(!not.batchable(), "{not:?}");
    }
    let pass_on = PassOn {
        publish: Publish::Publish,
    };
    let release = |lock, value| Release {
        lock,
        mint: Mint::new(&opts),
        pass_on,
        value,
        wake_first: false,
    };
    let items = [
        ReleaseItem::from(&release(a.lock(), "t1:7")),
        ReleaseItem::from(&release(b.lock(), "t2")),
    ];
    let many = ReleaseMany { items: &items };
    assert_eq!(args(&many), ["t1:7", "t2"]);
    assert_eq!(*many.keys(), [a.lock(), b.lock()]);
    Ok(())
}

#[test]
fn batch_replies_decode_every_code() {
    // One item: a flat array of its code and value.
    let item = |code, n: Value| Value::Array(vec![Value::Int(code), n]);
    let grant = |v| {
        BatchedGrants::from_redis_value(v)
            .ok()
            .and_then(|mut r| (r.0.len() == 1).then(|| r.0.remove(0)))
    };
    assert_eq!(
        grant(item(1, Value::Int(42))),
        Some(Batched::Done(GrantReply::Granted(Fence::new(42))))
    );
    assert_eq!(
        grant(item(0, Value::Int(-1))),
        Some(Batched::Done(GrantReply::Held {
            remaining: None,
            seen: None
        }))
    );
    assert_eq!(grant(item(3, Value::Int(0))), Some(Batched::Alone));
    assert_eq!(
        grant(item(4, Value::SimpleString("FLNOPERM SET".into()))),
        Some(Batched::Failed("FLNOPERM SET".into()))
    );
    assert_eq!(grant(item(2, Value::Int(0))), None);
    assert_eq!(grant(item(1, Value::Int(-3))), None);
    // Items follow each other in one flat array, in order; a value without
    // its code is refused, not paired with the next item's code.
    let pairs = |v: &[i64]| Value::Array(v.iter().map(|&n| Value::Int(n)).collect());
    assert_eq!(
        BatchedGrants::from_redis_value(pairs(&[1, 7, 3, 0, 0, 250]))
            .ok()
            .map(|r| r.0),
        Some(vec![
            Batched::Done(GrantReply::Granted(Fence::new(7))),
            Batched::Alone,
            Batched::Done(GrantReply::Held {
                remaining: Some(Duration::from_millis(250)),
                seen: None
            }),
        ])
    );
    assert!(BatchedGrants::from_redis_value(pairs(&[1, 7, 3])).is_err());
    let release = |code| Batched::<Checked>::from_redis_value(Value::Int(code)).ok();
    assert_eq!(release(1), Some(Batched::Done(Checked::Done)));
    assert_eq!(
        release(0),
        Some(Batched::Done(Checked::NotOurs(LossReason::Expired)))
    );
    assert_eq!(
        release(-1),
        Some(Batched::Done(Checked::NotOurs(LossReason::TakenOver)))
    );
    assert_eq!(release(2), Some(Batched::Alone));
    assert_eq!(release(5), None);
}

#[test]
fn a_batched_renewal_lists_only_the_leases_it_did_not_extend() {
    let flat = |v: &[i64]| Value::Array(v.iter().map(|&n| Value::Int(n)).collect());
    let parse = |v: &[i64]| NotExtended::from_redis_value(flat(v));
    let expired = Checked::NotOurs(LossReason::Expired);
    let taken = Checked::NotOurs(LossReason::TakenOver);
    assert_eq!(
        parse(&[]).ok().and_then(|r| r.per_lease(3).ok()),
        Some(vec![Checked::Done; 3])
    );
    assert_eq!(
        parse(&[2, 0, 3, -1]).ok().and_then(|r| r.per_lease(3).ok()),
        Some(vec![Checked::Done, expired, taken])
    );
    // A lease outside the call, a listed success, a half pair: refused.
    assert!(parse(&[4, 0]).is_ok_and(|r| r.per_lease(3).is_err()));
    assert!(parse(&[0, 0]).is_ok_and(|r| r.per_lease(3).is_err()));
    assert!(parse(&[1, 1]).is_err());
    assert!(parse(&[1]).is_err());
    assert!(parse(&[-1, 0]).is_err());
}
