//! Locks and fenced resources on etcd keep to key spaces of their own:
//! a resource key shaped like a holder's key is refused, and so is a URL
//! namespace and lock prefix pair that could give another pair's keys.
//! Every test name contains `etcd` (nextest runs them one at a time).

use fencelock_testkit::EtcdCluster;

use crate::support::{fencelock, output};

/// `write 'lock:victim/1'` would put a lease-less key in lock `victim`'s
/// range, a holder that never expires: refused (64) naming why, nothing
/// written, the lock still free. A key outside the lock prefix, `/`
/// included, is written as before.
#[test]
fn etcd_a_resource_key_shaped_like_a_holder_key_is_refused() {
    let cluster = EtcdCluster::single();
    let url = cluster.url();
    for key in ["lock:victim/1", "lock:victim/"] {
        let (code, out, err) = output(&mut fencelock(&[
            "--url", &url, "write", key, "x", "--fence", "5", "--holder", "t",
        ]));
        assert_eq!(code, Some(64), "{key}: {out}{err}");
        assert!(
            err.contains("lock prefix") && err.contains("holder"),
            "{key}: {err}"
        );
    }
    let stored = cluster
        .etcdctl(&["get", "--prefix", "lock:"])
        .expect("etcdctl get");
    assert!(stored.trim().is_empty(), "nothing written: {stored}");
    let (code, out, err) = output(&mut fencelock(&["--url", &url, "status", "victim"]));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("victim: free"), "{out}");
    let (code, _, err) = output(&mut fencelock(&[
        "--url",
        &url,
        "run",
        "--no-wait",
        "victim",
        "--",
        "true",
    ]));
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = output(&mut fencelock(&[
        "--url",
        &url,
        "write",
        "invoices/42",
        "x",
        "--fence",
        "5",
        "--holder",
        "t",
    ]));
    assert_eq!(code, Some(0), "{out}{err}");
}

/// `?prefix=t` with `--prefix 1lock:` and `?prefix=t1` with `--prefix
/// lock:` would be the same keys: a namespace without a closing `/` and a
/// lock prefix with a `/` are refused (64) naming why; `?prefix=t/` works.
#[test]
fn etcd_a_namespace_and_prefix_that_can_collide_are_refused() {
    let cluster = EtcdCluster::single();
    let base = cluster.url();
    let with_ns = |ns: &str| format!("{base}?prefix={ns}");
    for (url, prefix, says) in [
        (with_ns("t"), "1lock:", "must end with '/'"),
        (with_ns("t1"), "lock:", "must end with '/'"),
        (base.clone(), "a/lock:", "contains '/'"),
    ] {
        let (code, out, err) = output(&mut fencelock(&[
            "--url", &url, "--prefix", prefix, "status", "job",
        ]));
        assert_eq!(code, Some(64), "{url} {prefix}: {out}{err}");
        assert!(err.contains(says), "{url} {prefix}: {err}");
    }
    let (code, _, err) = output(&mut fencelock(&[
        "--url",
        &with_ns("t/"),
        "--prefix",
        "1lock:",
        "run",
        "job",
        "--",
        "true",
    ]));
    assert_eq!(code, Some(0), "{err}");
}
