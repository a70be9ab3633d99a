//! Grants against a real redis-server.

use fencelock_testkit::RedisServer;

use super::*;
use crate::error::LossReason;
use crate::keys::KeyLayout;
use crate::options::{FenceMode, Renewal};
use crate::store::ConnSettings;

async fn engine(server: &RedisServer) -> Result<RedisEngine> {
    let settings = ConnSettings::default();
    Ok(RedisEngine::new(
        RedisConn::connect(&server.url(), &settings).await?,
    ))
}

/// A retried grant with the same token (its first reply lost) returns the
/// same fence, mints nothing new and restarts the lease; a different token
/// is refused.
#[tokio::test]
async fn a_retried_grant_returns_the_same_fence() -> Result<()> {
    let server = RedisServer::start();
    let engine = engine(&server).await?;
    for (layout, mode) in [
        (KeyLayout::HashTagged, FenceMode::Clock),
        (KeyLayout::HashTagged, FenceMode::Counter),
        (KeyLayout::Guide, FenceMode::Counter),
        (KeyLayout::Guide, FenceMode::Clock),
    ] {
        let name = format!("retry-{layout:?}-{mode:?}");
        let opts = LockOptions::default()
            .ttl(Duration::from_secs(5))
            .renewal(Renewal::Off)
            .layout(layout)
            .fence_mode(mode);
        let keys = LockKeys::new("lock:", layout, &name)?;
        let token = new_token();
        let first = engine
            .grant(&name, &keys, &token, &opts, Standing::default(), &mut None)
            .await?;
        let fence_key_before: Option<String> = server.query(&["GET", &keys.fence()]);
        server.cmd(&["PEXPIRE", keys.lock(), "1000"]);
        let again = engine
            .grant(&name, &keys, &token, &opts, Standing::default(), &mut None)
            .await?;
        assert_eq!(
            first.granted.fence, again.granted.fence,
            "{layout:?} {mode:?}"
        );
        let fence_key_after: Option<String> = server.query(&["GET", &keys.fence()]);
        assert_eq!(fence_key_before, fence_key_after, "no new fence minted");
        let pttl: i64 = server.query(&["PTTL", keys.lock()]);
        assert!(pttl > 4000, "the retry restarted the lease (pttl {pttl})");
        let other = engine
            .grant(
                &name,
                &keys,
                &new_token(),
                &opts,
                Standing::default(),
                &mut None,
            )
            .await;
        assert!(matches!(other, Err(Error::Contended { .. })), "{other:?}");
        // Both name the same grant: the first release deletes it.
        assert_eq!(engine.release(&again.granted).await?, Checked::Done);
        assert_eq!(
            engine.release(&first.granted).await?,
            Checked::NotOurs(LossReason::Expired)
        );
    }
    Ok(())
}
