//! Turning the global options into a connected client and lock options.

use fencelock::{FenceMode, LockClient, LockClientBuilder, LockOptions};

use crate::global_options::GlobalOptions;

/// The URL used when neither `--url` (`--redis`), `FENCELOCK_URL` nor
/// `FENCELOCK_REDIS_URL` is set.
pub(crate) const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// The old name of `FENCELOCK_URL`, still read when it is unset.
pub(crate) const LEGACY_URL_ENV: &str = "FENCELOCK_REDIS_URL";

/// The URL given, if any: `--url`/`--redis`, `FENCELOCK_URL` (both through
/// clap), then `FENCELOCK_REDIS_URL`.
pub(crate) fn given_url(global: &GlobalOptions) -> Option<String> {
    global
        .url
        .clone()
        .or_else(|| std::env::var(LEGACY_URL_ENV).ok().filter(|u| !u.is_empty()))
}

/// The URL these options name, password included: pass it to clients,
/// never print it (print [`crate::redact::url`] of it).
pub(crate) fn url(global: &GlobalOptions) -> String {
    given_url(global).unwrap_or_else(|| DEFAULT_URL.to_string())
}

/// The TLS files of these options as the environment variables that give
/// them (`FENCELOCK_TLS_CA`, `FENCELOCK_TLS_CERT`, `FENCELOCK_TLS_KEY`), for
/// `run` to pass to its command as it passes the URL. The paths are made
/// absolute, so a command that changes directory still finds the files.
pub(crate) fn tls_env(global: &GlobalOptions) -> Vec<(&'static str, std::path::PathBuf)> {
    [
        ("FENCELOCK_TLS_CA", &global.tls_ca),
        ("FENCELOCK_TLS_CERT", &global.tls_cert),
        ("FENCELOCK_TLS_KEY", &global.tls_key),
    ]
    .into_iter()
    .filter_map(|(name, path)| {
        let path = path.as_ref()?;
        Some((
            name,
            std::path::absolute(path).unwrap_or_else(|_| path.clone()),
        ))
    })
    .collect()
}

/// Whether these options name an etcd cluster.
pub(crate) fn is_etcd(global: &GlobalOptions) -> bool {
    let url = url(global);
    let lower = url.get(..8).unwrap_or(&url).to_ascii_lowercase();
    lower.starts_with("etcd://") || lower.starts_with("etcds://")
}

/// Connects to the store these options name.
pub(crate) async fn client(global: &GlobalOptions) -> anyhow::Result<LockClient> {
    Ok(builder(global, url(global))?.connect().await?)
}

/// A client builder for `url` with the prefix and TLS settings of `global`.
pub(crate) fn builder(global: &GlobalOptions, url: String) -> anyhow::Result<LockClientBuilder> {
    let mut builder = LockClient::builder(url).prefix(&global.prefix);
    if let Some(epoch) = global.fence_epoch {
        builder = builder.defaults(LockOptions::default().fence_epoch(epoch));
    }
    if let Some(ca) = &global.tls_ca {
        builder = builder.tls_ca(ca);
    }
    if let Some((cert, key)) = client_cert(global)? {
        builder = builder.tls_client_cert(cert, key);
    }
    Ok(builder)
}

/// The client certificate and its key, if given (`--tls-cert`,
/// `--tls-key`): both or neither.
pub(crate) fn client_cert(
    global: &GlobalOptions,
) -> anyhow::Result<Option<(&std::path::Path, &std::path::Path)>> {
    match (&global.tls_cert, &global.tls_key) {
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
        (None, None) => Ok(None),
        _ => Err(crate::exit::fail(
            crate::exit::USAGE,
            "--tls-cert and --tls-key go together (a client certificate and its key)",
        )),
    }
}

/// Lock options from the global flags (layout, fence mode).
pub(crate) fn options(global: &GlobalOptions, client: &LockClient) -> LockOptions {
    client
        .options()
        .layout(global.layout.into())
        .fence_mode(global.fence_mode.map_or(FenceMode::Clock, Into::into))
}
