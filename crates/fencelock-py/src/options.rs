//! Options dicts (the docstring of `_native.pyi` lists the keys) to the
//! library's [`LockOptions`] and [`LockClientBuilder`].
//!
//! Every refusal is `InvalidInput` naming the key: an unknown key, a
//! wrong type, a duration that is negative, NaN, infinite or too large
//! for a `Duration`, an integer out of range. Whether the values make
//! sense together (a ttl in range, a renewal shorter than the ttl) is the
//! library's `LockOptions::validate`, run by every acquisition and by
//! `connect` for the defaults.

use std::time::Duration;

use fencelock::{
    Access, FenceMode, KeyLayout, LockClient, LockClientBuilder, LockOptions, Renewal, WaitMode,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

use crate::args::{self, shown, type_name};
use crate::errors::{Failure, invalid_option};

/// The keys of an acquisition's options (and of `connect`'s lock defaults).
const LOCK_KEYS: &[&str] = &[
    "ttl",
    "wait",
    "wait_mode",
    "fence_mode",
    "fence_epoch",
    "layout",
    "replicas",
    "replica_timeout",
    "renewal",
    "waiter_lease",
    "permits",
    "access",
    "metrics_family",
];

/// The keys only `connect` takes: the connection's own settings.
const CONNECT_KEYS: &[&str] = &[
    "prefix",
    "connect_timeout",
    "response_timeout",
    "tls_ca",
    "tls_cert",
    "tls_key",
];

/// `base` (the client's defaults) with the options of one call applied.
///
/// # Errors
/// [`Failure::Invalid`] naming the first bad key.
pub(crate) fn lock_options(
    base: LockOptions,
    options: &Bound<'_, PyAny>,
) -> Result<LockOptions, Failure> {
    let mut draft = Draft::new(base);
    for (key, value) in entries(options)? {
        if !draft.take(&key, &value)? {
            return Err(unknown(&key, false));
        }
    }
    draft.finish()
}

/// A builder for `url` with `connect`'s options: the connection's own
/// settings, and the lock options as the client's defaults.
///
/// # Errors
/// [`Failure::Invalid`] naming the first bad key.
pub(crate) fn client_builder(
    url: &str,
    options: &Bound<'_, PyAny>,
) -> Result<LockClientBuilder, Failure> {
    let mut draft = Draft::new(LockOptions::default());
    let mut builder = LockClient::builder(url);
    let (mut tls_cert, mut tls_key) = (None, None);
    for (key, value) in entries(options)? {
        if draft.take(&key, &value)? {
            continue;
        }
        builder = match key.as_str() {
            "prefix" => builder.prefix(string(&key, &value)?),
            "connect_timeout" => builder.connect_timeout(seconds(&key, &value)?),
            "response_timeout" => builder.response_timeout(seconds(&key, &value)?),
            "tls_ca" => builder.tls_ca(string(&key, &value)?),
            "tls_cert" => {
                tls_cert = Some(string(&key, &value)?);
                builder
            }
            "tls_key" => {
                tls_key = Some(string(&key, &value)?);
                builder
            }
            _ => return Err(unknown(&key, true)),
        };
    }
    builder = match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => builder.tls_client_cert(cert, key),
        (None, None) => builder,
        (Some(_), None) => {
            return Err(invalid_option(
                "tls_key",
                "missing: tls_cert needs its key (give both)",
            ));
        }
        (None, Some(_)) => {
            return Err(invalid_option(
                "tls_cert",
                "missing: tls_key needs its certificate (give both)",
            ));
        }
    };
    Ok(builder.defaults(draft.finish()?))
}

/// The `(key, value)` pairs of an options dict (`None`: no options).
fn entries<'py>(options: &Bound<'py, PyAny>) -> Result<Vec<(String, Bound<'py, PyAny>)>, Failure> {
    if options.is_none() {
        return Ok(Vec::new());
    }
    let Ok(dict) = options.cast::<PyDict>() else {
        return Err(Failure::Invalid(format!(
            "options must be a dict, not {}",
            type_name(options)
        )));
    };
    dict.iter()
        .map(|(key, value)| Ok((args::text(&key, "option name")?, value)))
        .collect()
}

/// The error of a key no call takes.
fn unknown(key: &str, connect: bool) -> Failure {
    let known = if connect {
        [LOCK_KEYS, CONNECT_KEYS].concat().join(", ")
    } else {
        LOCK_KEYS.join(", ")
    };
    let key = shown(key);
    Failure::Invalid(format!(
        "invalid option {key}: unknown option (known: {known})"
    ))
}

/// Lock options being read: the options so far, and the two halves of
/// the replication setting, which go to the library together.
struct Draft {
    opts: LockOptions,
    replicas: Option<u32>,
    replica_timeout: Option<Duration>,
}

impl Draft {
    fn new(base: LockOptions) -> Self {
        Draft {
            opts: base,
            replicas: None,
            replica_timeout: None,
        }
    }

    /// Applies `key` if it is a lock option; false if it is not one.
    fn take(&mut self, key: &str, value: &Bound<'_, PyAny>) -> Result<bool, Failure> {
        let opts = std::mem::take(&mut self.opts);
        self.opts = match key {
            "ttl" => opts.ttl(seconds(key, value)?),
            "wait" if value.is_none() => opts.wait_forever(),
            "wait" => opts.wait(seconds(key, value)?),
            "wait_mode" => {
                opts.wait_mode(choice(key, value, WaitMode::parse, "poll, notify, fair")?)
            }
            "fence_mode" => {
                opts.fence_mode(choice(key, value, FenceMode::parse, "clock, counter")?)
            }
            "fence_epoch" => opts.fence_epoch(integer(key, value)?),
            "layout" => opts.layout(choice(key, value, KeyLayout::parse, "default, guide")?),
            "replicas" => {
                self.replicas = Some(integer(key, value)?);
                opts
            }
            "replica_timeout" => {
                self.replica_timeout = Some(seconds(key, value)?);
                opts
            }
            "renewal" => opts.renewal(if boolean(key, value)? {
                Renewal::Auto
            } else {
                Renewal::Off
            }),
            "waiter_lease" => opts.waiter_lease(seconds(key, value)?),
            "permits" => opts.permits(integer(key, value)?),
            "access" => opts.access(choice(key, value, access, "read, write")?),
            "metrics_family" => opts.metrics_family(string(key, value)?),
            _ => {
                self.opts = opts;
                return Ok(false);
            }
        };
        Ok(true)
    }

    /// The options, with replication set from both halves (one half
    /// alone completes the one the base options have).
    fn finish(self) -> Result<LockOptions, Failure> {
        let base = self.opts.replication_value();
        let (replicas, timeout) = match (self.replicas, self.replica_timeout, base) {
            (None, None, _) => return Ok(self.opts),
            (Some(replicas), Some(timeout), _) => (replicas, timeout),
            (Some(replicas), None, Some(base)) => (replicas, base.timeout),
            (None, Some(timeout), Some(base)) => (base.replicas, timeout),
            (Some(_), None, None) => {
                return Err(invalid_option(
                    "replica_timeout",
                    "missing: replicas needs replica_timeout (how long to wait for them)",
                ));
            }
            (None, Some(_), None) => {
                return Err(invalid_option(
                    "replicas",
                    "missing: replica_timeout needs replicas (how many to wait for)",
                ));
            }
        };
        Ok(self.opts.wait_for_replicas(replicas, timeout))
    }
}

/// A duration in seconds (an `int` or a `float`; not a `bool`).
fn seconds(key: &str, value: &Bound<'_, PyAny>) -> Result<Duration, Failure> {
    if value.is_instance_of::<PyBool>() {
        return Err(invalid_option(key, "expected seconds, got a bool"));
    }
    let secs: f64 = value.extract().map_err(|_| {
        if value.is_instance_of::<PyInt>() {
            // An int beyond a float's range.
            invalid_option(key, "too many seconds to be a duration")
        } else {
            invalid_option(
                key,
                format!("expected seconds (a number), got {}", type_name(value)),
            )
        }
    })?;
    // `{:?}`: `1e300`, not three hundred digits.
    Duration::try_from_secs_f64(secs).map_err(|_| {
        invalid_option(
            key,
            format!("{secs:?} seconds is not a duration (negative, NaN, infinite or too large)"),
        )
    })
}

/// An integer in the range of `T`.
fn integer<T>(key: &str, value: &Bound<'_, PyAny>) -> Result<T, Failure>
where
    T: TryFrom<u64> + std::fmt::Display + args::Bounded,
{
    args::integer(value, |problem| invalid_option(key, problem))
}

/// A `bool` (not an `int`: `1` is likelier a mistake than a meant `True`).
fn boolean(key: &str, value: &Bound<'_, PyAny>) -> Result<bool, Failure> {
    match value.cast::<PyBool>() {
        Ok(flag) => Ok(flag.is_true()),
        Err(_) => Err(invalid_option(
            key,
            format!("expected True or False, got {}", type_name(value)),
        )),
    }
}

/// A `str`.
fn string(key: &str, value: &Bound<'_, PyAny>) -> Result<String, Failure> {
    if !value.is_instance_of::<PyString>() {
        return Err(invalid_option(
            key,
            format!("expected a str, got {}", type_name(value)),
        ));
    }
    args::text(value, &format!("value of option {key}"))
}

/// One of a few words, parsed by `parse`; `words` lists them.
fn choice<T>(
    key: &str,
    value: &Bound<'_, PyAny>,
    parse: fn(&str) -> Option<T>,
    words: &str,
) -> Result<T, Failure> {
    let word = string(key, value)?;
    parse(&word).ok_or_else(|| {
        invalid_option(
            key,
            format!("expected one of {words}, got {}", shown(&word)),
        )
    })
}

/// `read` or `write`.
fn access(word: &str) -> Option<Access> {
    match word {
        "read" => Some(Access::Read),
        "write" => Some(Access::Write),
        _ => None,
    }
}
