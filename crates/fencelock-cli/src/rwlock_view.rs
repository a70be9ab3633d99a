//! How `status` and `top` show a read-write lock's holders
//! ([`fencelock::LockState::RwLock`]): the writer, or the readers, each as
//! one JSON object or one line.

use fencelock::RwHolder;
use serde_json::json;

/// The value of the `kind` field of a read-write lock's JSON object.
pub(crate) const KIND: &str = "rwlock";

/// One holder as JSON: `holder`, `fence` (a reader's: its write epoch) and
/// `ttl_ms`, as a lock's `holder`, `fence` and `ttl_ms`.
pub(crate) fn holder_json(h: &RwHolder) -> serde_json::Value {
    json!({
        "holder": h.holder, "fence": h.fence.map(|f| f.get()),
        "ttl_ms": h.remaining.as_millis() as u64,
    })
}

/// The fields a read-write lock adds to its JSON object: `kind`, `writer`
/// (an object, or null) and `readers` (an array of objects).
pub(crate) fn add_json(
    object: &mut serde_json::Value,
    writer: Option<&RwHolder>,
    readers: &[RwHolder],
) {
    object["kind"] = KIND.into();
    object["writer"] = writer.map_or(serde_json::Value::Null, holder_json);
    object["readers"] = readers.iter().map(holder_json).collect();
}

/// One line of text per holder: `  writer: held by ID, fence F, N ms left`
/// or `  reader: held by ID, write epoch E, N ms left`.
pub(crate) fn holder_lines(writer: Option<&RwHolder>, readers: &[RwHolder]) -> Vec<String> {
    let line = |side: &str, fence: &str, h: &RwHolder| {
        format!(
            "  {side}: held by {}, {fence} {}, {} ms left",
            h.holder,
            h.fence.map_or("unknown".into(), |f| f.to_string()),
            h.remaining.as_millis()
        )
    };
    writer
        .map(|h| line("writer", "fence", h))
        .into_iter()
        .chain(readers.iter().map(|h| line("reader", "write epoch", h)))
        .collect()
}

/// Who holds it, for the first line: `the writer` or `N reader(s)`.
pub(crate) fn summary(writer: Option<&RwHolder>, readers: &[RwHolder]) -> String {
    match (writer, readers.len()) {
        (Some(_), _) => "held by the writer".to_owned(),
        (None, 0) => "no holder".to_owned(),
        (None, 1) => "held by 1 reader".to_owned(),
        (None, n) => format!("held by {n} readers"),
    }
}
