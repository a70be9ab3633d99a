//! How `status` and `top` show a semaphore's holders
//! ([`fencelock::LockState::Semaphore`]): one JSON object per held slot.

use fencelock::PermitHolder;
use serde_json::json;

/// A semaphore's holders as JSON, by slot: `slot`, `holder`, `fence` and
/// `ttl_ms`, the last two as a lock's `fence` and `ttl_ms`.
pub(crate) fn holders_json(holders: &[PermitHolder]) -> serde_json::Value {
    holders
        .iter()
        .map(|h| {
            json!({
                "slot": h.slot, "holder": h.holder, "fence": h.fence.map(|f| f.get()),
                "ttl_ms": h.remaining.as_millis() as u64,
            })
        })
        .collect()
}
