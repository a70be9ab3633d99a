//! The transactions of a fenced etcd key (`FencedKey`): the fence rule of
//! docs/design.md §2.4 checked by etcd itself, and optionally the writer still
//! holding its lock.
//!
//! The key's value is `FENCE:HOLDER:VALUE`: the fence as 20 decimal digits
//! (zero-padded, so that etcd's byte-wise comparison of values orders
//! fences numerically, every u64 included), the writer's 16-hex-digit public
//! holder id, and the value. A write of fence `F` by holder `H` is accepted
//! iff one of three branches holds, tried in one transaction (nested
//! transactions, etcd 3.3+):
//!
//! 1. the key does not exist (`create_revision == 0`);
//! 2. the stored value sorts below `F:` — the stored fence is lower (equal
//!    fences are followed by the holder, so they sort above `F:`);
//! 3. the stored value sorts strictly between `F:H` and `F:H;` — the same
//!    fence and the same holder (`;` follows `:`; every stored value of
//!    fence `F` and holder `H` starts with `F:H:`, and holder ids have a
//!    fixed length, so nothing else lies in between).
//!
//! A held write puts that transaction inside one more, which first compares
//! the writer's lock key: it must still exist with the create revision the
//! writer was granted at (etcd's `IsOwner` check). A stale holder is then
//! refused even by a resource that has never seen a newer fence.

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use super::conn::EtcdConn;
use crate::error::{Error, Result};
use crate::fence::Fence;

/// What a fenced key holds, decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) value: Option<String>,
    pub(crate) fence: Option<Fence>,
    pub(crate) holder: Option<String>,
    /// The key's mod revision (0 when absent).
    pub(crate) mod_revision: i64,
}

/// How a fenced write came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyWrite {
    Accepted,
    /// Refused by the fence rule; what the key held.
    Stale(Stored),
    /// Refused: the writer's lock key is gone or was re-created; what the
    /// resource held.
    NotHolder(Stored),
    /// Refused: the key changed since `expect_mod` was read.
    Changed,
}

/// `FENCE:` with the fence as 20 digits.
fn fence_text(fence: Fence) -> String {
    format!("{:020}:", fence.get())
}

/// The stored form of `value` written with `fence` by `holder`.
pub(crate) fn encode(fence: Fence, holder: &str, value: &str) -> String {
    format!("{}{holder}:{value}", fence_text(fence))
}

/// Decodes a stored value; a value that fencelock did not write has no
/// fence or holder, and is returned whole.
pub(crate) fn decode(kv: Option<&KeyValue>) -> Stored {
    let Some(kv) = kv else {
        return Stored::default();
    };
    let raw = String::from_utf8_lossy(kv.value()).into_owned();
    let parsed = raw.split_once(':').and_then(|(fence, rest)| {
        let (holder, value) = rest.split_once(':')?;
        let fence_ok = fence.len() == 20 && fence.bytes().all(|b| b.is_ascii_digit());
        let holder_ok = (holder.len() == 16 && holder.bytes().all(|b| b.is_ascii_hexdigit()))
            || holder == crate::holder::REVOKED_HOLDER;
        (fence_ok && holder_ok).then(|| {
            (
                fence.parse::<u64>().ok().map(Fence::new),
                holder.to_owned(),
                value.to_owned(),
            )
        })
    });
    match parsed {
        Some((fence, holder, value)) => Stored {
            value: Some(value),
            fence,
            holder: Some(holder),
            mod_revision: kv.mod_revision(),
        },
        None => Stored {
            value: Some(raw),
            fence: None,
            holder: None,
            mod_revision: kv.mod_revision(),
        },
    }
}

/// The fence rule as nested transactions: put `stored` into `key` if the
/// rule accepts, else read the key.
fn rule_txn(key: &str, fence: Fence, holder: &str, stored: &str) -> Txn {
    let put = || TxnOp::put(key, stored, Some(PutOptions::new()));
    let read = TxnOp::get(key, None);
    let f = fence_text(fence);
    let same_holder = Txn::new()
        .when([
            Compare::value(key, CompareOp::Greater, format!("{f}{holder}")),
            Compare::value(key, CompareOp::Less, format!("{f}{holder};")),
        ])
        .and_then([put()])
        .or_else([read]);
    let older = Txn::new()
        .when([Compare::value(key, CompareOp::Less, f)])
        .and_then([put()])
        .or_else([TxnOp::txn(same_holder)]);
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([put()])
        .or_else([TxnOp::txn(older)])
}

/// Writes `value` to `key` with `fence` by `holder` (a public holder id)
/// under the fence rule; if `owner` is given (a lock key and its create
/// revision), only while that key exists with that revision; if
/// `expect_mod` is given, only if the key's mod revision is still that (0:
/// absent), for a read-modify-write.
pub(crate) async fn write_key(
    conn: &EtcdConn,
    key: &str,
    fence: Fence,
    holder: &str,
    value: &str,
    owner: Option<(&str, i64)>,
    expect_mod: Option<i64>,
) -> Result<KeyWrite> {
    // Boxed: etcd's request futures are large.
    Box::pin(write_now(
        conn, key, fence, holder, value, owner, expect_mod,
    ))
    .await
}

async fn write_now(
    conn: &EtcdConn,
    key: &str,
    fence: Fence,
    holder: &str,
    value: &str,
    owner: Option<(&str, i64)>,
    expect_mod: Option<i64>,
) -> Result<KeyWrite> {
    let stored = encode(fence, holder, value);
    let mut txn = rule_txn(key, fence, holder, &stored);
    if let Some(expected) = expect_mod {
        txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
            .and_then([TxnOp::txn(txn)])
            .or_else([TxnOp::get(key, Some(GetOptions::new().with_keys_only()))]);
    }
    if let Some((lock_key, revision)) = owner {
        txn = Txn::new()
            .when([Compare::create_revision(
                lock_key,
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::txn(txn)])
            .or_else([TxnOp::get(key, None)]);
    }
    // Not sent twice: with a mod revision to compare, a write applied by a
    // slow member and sent again would be refused as a change, and the
    // read-modify-write would apply its change a second time.
    let reply = conn
        .txn_once(txn)
        .await
        .map_err(|e| conn.error(e, "writing a fenced key"))?;
    let mut level = reply;
    // Unwrap the ownership and mod-revision levels, then the rule's.
    if owner.is_some() {
        if !level.succeeded() {
            return Ok(KeyWrite::NotHolder(first_read(&level)));
        }
        level = nested(&level)?;
    }
    if expect_mod.is_some() {
        if !level.succeeded() {
            return Ok(KeyWrite::Changed);
        }
        level = nested(&level)?;
    }
    loop {
        if level.succeeded() {
            return Ok(KeyWrite::Accepted);
        }
        match level.op_responses().into_iter().next() {
            Some(TxnOpResponse::Txn(inner)) => level = inner,
            Some(TxnOpResponse::Get(get)) => return Ok(KeyWrite::Stale(decode(get.kvs().first()))),
            _ => {
                return Err(Error::UnexpectedReply(
                    "etcd fenced write: unexpected transaction reply".into(),
                ));
            }
        }
    }
}

/// Seals `key` at `fence` (a revoke): records `fence` with the holder
/// [`REVOKED_HOLDER`](crate::holder::REVOKED_HOLDER), keeping the value, if the key
/// still has mod revision `expect_mod` (0: absent) — the caller read it and
/// checked that no greater fence is stored. `Ok(false)`: it changed since.
pub(crate) async fn seal_key(
    conn: &EtcdConn,
    key: &str,
    fence: Fence,
    value: &str,
    expect_mod: i64,
) -> Result<bool> {
    let stored = encode(fence, crate::holder::REVOKED_HOLDER, value);
    let txn = Txn::new()
        .when([Compare::mod_revision(key, CompareOp::Equal, expect_mod)])
        .and_then([TxnOp::put(key, stored, Some(PutOptions::new()))]);
    // Sent again after a transient failure: a seal applied twice is the
    // same seal, and one applied once is then refused as a change (the
    // caller reads again and finds it).
    let reply = conn
        .txn(txn)
        .await
        .map_err(|e| conn.error(e, "sealing a fenced key"))?;
    Ok(reply.succeeded())
}

/// Reads a fenced key.
pub(crate) async fn read_key(conn: &EtcdConn, key: &str) -> Result<Stored> {
    let reply = conn
        .get(key, None)
        .await
        .map_err(|e| conn.error(e, "reading a fenced key"))?;
    Ok(decode(reply.kvs().first()))
}

/// The key the first (range) response of `reply` read, decoded.
fn first_read(reply: &TxnResponse) -> Stored {
    match reply.op_responses().into_iter().next() {
        Some(TxnOpResponse::Get(get)) => decode(get.kvs().first()),
        _ => Stored::default(),
    }
}

fn nested(reply: &TxnResponse) -> Result<TxnResponse> {
    match reply.op_responses().into_iter().next() {
        Some(TxnOpResponse::Txn(inner)) => Ok(inner),
        _ => Err(Error::UnexpectedReply(
            "etcd fenced write: expected a nested transaction".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_values_sort_by_fence_then_holder() {
        let h = "0123456789abcdef";
        let a = encode(Fence::new(9), h, "x");
        let b = encode(Fence::new(10), h, "");
        assert!(a < b, "padding orders 9 before 10");
        assert!(a < fence_text(Fence::new(10)));
        assert!(encode(Fence::new(10), h, "") > fence_text(Fence::new(10)));
        let same = encode(Fence::new(10), h, "any value: with colons");
        assert!(same.as_str() > format!("{}{h}", fence_text(Fence::new(10))).as_str());
        assert!(same.as_str() < format!("{}{h};", fence_text(Fence::new(10))).as_str());
        let max = encode(Fence::new(u64::MAX), h, "");
        assert!(max.starts_with("18446744073709551615:"));
    }
}
