//! Fenced resources on Redis keep out of the locks' keys: `write`,
//! `update` and `read --register` refuse one of a lock's own keys (a hash
//! there would break that lock's next grant), under the prefix in use.

use fencelock_testkit::RedisServer;

use crate::support::{on, output};

/// Each of lock `victim`'s keys is refused (64) naming why, nothing is
/// written, and the lock still works; under `--prefix jobs:` the keys of
/// that prefix are the ones refused, and a key beside a lock's keys is a
/// resource like any other.
#[test]
fn a_locks_own_keys_are_refused_as_resources() {
    let server = RedisServer::start();
    let writer = ["--fence", "5", "--holder", "t"];
    for key in [
        "lock:{victim}",
        "lock:{victim}:fence",
        "lock:{victim}:queue",
    ] {
        for args in [
            vec!["write", key, "x"],
            vec!["update", key],
            vec!["read", "--register", key],
        ] {
            let mut args = [&args[..], &writer[..]].concat();
            if args[0] == "update" {
                args.extend(["--", "cat"]);
            }
            let (code, out, err) = output(&mut on(&server, &args));
            assert_eq!(code, Some(64), "{args:?}: {out}{err}");
            assert!(err.contains("a lock's own keys"), "{args:?}: {err}");
        }
    }
    let (code, out, err) = output(&mut on(
        &server,
        &[
            "--prefix",
            "jobs:",
            "write",
            "jobs:{victim}:waiters",
            "x",
            "--fence",
            "5",
            "--holder",
            "t",
        ],
    ));
    assert_eq!(code, Some(64), "{out}{err}");
    let keys: i64 = server.query(&["DBSIZE"]);
    assert_eq!(keys, 0, "a refused key was written");
    let (code, _, err) = output(&mut on(
        &server,
        &["run", "--no-wait", "victim", "--", "true"],
    ));
    assert_eq!(code, Some(0), "{err}");
    for (prefix, key) in [("lock:", "lock:{victim}:data"), ("jobs:", "lock:{victim}")] {
        let (code, out, err) = output(&mut on(
            &server,
            &[
                "--prefix", prefix, "write", key, "x", "--fence", "5", "--holder", "t",
            ],
        ));
        assert_eq!(code, Some(0), "{prefix} {key}: {out}{err}");
    }
}
