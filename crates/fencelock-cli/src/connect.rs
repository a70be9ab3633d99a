//! Turning the global options into a connected client and lock options.

use fencelock::{FenceMode, LockClient, LockOptions};

use crate::cli::Global;

/// The Redis URL used when neither `--redis` nor `FENCELOCK_REDIS_URL` is set.
pub(crate) const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The Redis URL these options name, password included: pass it to
/// clients, never print it (print [`crate::redact::url`] of it).
pub(crate) fn url(global: &Global) -> String {
    global
        .redis
        .clone()
        .unwrap_or_else(|| DEFAULT_URL.to_string())
}

/// Connects to the Redis these options name.
pub(crate) async fn client(global: &Global) -> anyhow::Result<LockClient> {
    let mut builder = LockClient::builder(url(global)).prefix(&global.prefix);
    if let Some(ca) = &global.tls_ca {
        builder = builder.tls_ca(ca);
    }
    match (&global.tls_cert, &global.tls_key) {
        (Some(cert), Some(key)) => builder = builder.tls_client_cert(cert, key),
        (None, None) => {}
        _ => {
            return Err(crate::exit::fail(
                crate::exit::USAGE,
                "--tls-cert and --tls-key go together (a client certificate and its key)",
            ));
        }
    }
    Ok(builder.connect().await?)
}

/// Lock options from the global flags (layout, fence mode).
pub(crate) fn options(global: &Global, client: &LockClient) -> LockOptions {
    client
        .options()
        .layout(global.layout.into())
        .fence_mode(global.fence_mode.map_or(FenceMode::Clock, Into::into))
}
