//! The connection against a real server: what only a live Redis shows.

use std::time::Duration;

use fencelock_testkit::RedisServer;

use super::conn::RedisConn;
use super::errors::driver_error;
use super::ops::Publish;
use super::ops::{Grant, GrantReply, Mint, PassOn, Release};
use super::wire::{QueueMember, Wake, wake_channel};
use crate::error::{Error, Result};
use crate::keys::{KeyLayout, LockKeys};
use crate::options::{LockOptions, WaitMode};
use crate::store::Checked;
use crate::store::ConnSettings;

/// The release script wakes a waiter with whichever publish command it is
/// given: `SPUBLISH` (sharded pub/sub, for Cluster) reaches a connection
/// subscribed with `SSUBSCRIBE` to the waiter's channel, which shares the
/// lock's hash slot.
#[tokio::test]
async fn the_release_script_wakes_over_sharded_pub_sub() -> Result<()> {
    let server = RedisServer::start();
    let settings = ConnSettings::default();
    let conn = RedisConn::connect(&server.url(), &settings).await?;
    let keys = LockKeys::new("lock:", KeyLayout::HashTagged, "job")?;
    let channel = wake_channel(&keys, "ghostclient");
    let mut sub = redis::Client::open(server.url())
        .and_then(|c| c.get_connection())
        .map_err(|e| Error::Redis(driver_error(e)))?;
    sub.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| Error::Redis(driver_error(e)))?;
    sub.send_packed_command(&redis::cmd("SSUBSCRIBE").arg(&channel).get_packed_command())
        .map_err(|e| Error::Redis(driver_error(e)))?;
    let confirmed = sub
        .recv_response()
        .map_err(|e| Error::Redis(driver_error(e)))?;
    assert!(
        format!("{confirmed:?}").contains("ssubscribe"),
        "{confirmed:?}"
    );

    let opts = LockOptions::default();
    let mint = Mint::new(&opts);
    let granted = conn
        .run(&Grant {
            keys: &keys,
            mint,
            token: "holder",
            ttl: opts.ttl_value(),
            wait_mode: WaitMode::Notify,
            member: None,
            waiter_lease: opts.waiter_lease_value(),
            queued: false,
        })
        .await?;
    let GrantReply::Granted(fence) = granted else {
        panic!("the first grant was refused: {granted:?}");
    };
    // A young notify waiter (arrival far in the future): woken, not handed.
    let member = QueueMember {
        client: "ghostclient".into(),
        waiter: 7,
        mode: WaitMode::Notify,
        ttl: Duration::from_secs(10),
        handover: Duration::from_millis(100),
        token: "0b5e7a9c-0000-4000-8000-000000000001".into(),
        access: None,
    }
    .to_string();
    server.cmd(&["ZADD", &keys.queue(), "99999999999999999", &member]);
    server.cmd(&["ZADD", &keys.waiters(), "99999999999999", &member]);
    let value = super::wire::lock_value("holder", fence, KeyLayout::HashTagged);
    let released = conn
        .run(&Release {
            lock: keys.lock(),
            mint,
            pass_on: PassOn {
                publish: Publish::SPublish,
            },
            value: &value,
            // Sent behind a PING: the reply taken is the script's.
            wake_first: true,
        })
        .await?;
    assert_eq!(released, Checked::Done);
    let message = sub
        .recv_response()
        .map_err(|e| Error::Redis(driver_error(e)))?;
    let text = format!("{message:?}");
    assert!(
        text.contains("smessage")
            && text.contains(&channel)
            && text.contains(&format!("{:?}", Wake::Retry { waiter: 7 }.to_string())),
        "{text}"
    );
    Ok(())
}
