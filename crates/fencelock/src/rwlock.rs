//! The fenced read-write lock's façade: [`LockClient::rwlock`] and
//! [`RwLock`], shorthand for acquisitions with [`LockOptions::access`].

use std::future::Future;

use crate::client::LockClient;
use crate::error::Result;
use crate::keys::KeyLayout;
use crate::lease::{Lease, LeaseHandle};
use crate::options::{Access, LockOptions};

/// A fenced read-write lock on one name ([`LockClient::rwlock`]): readers
/// share it, a writer holds it alone. Cheap to clone.
///
/// A writer's lease is fenced exactly like a mutex's: pass its
/// [`fence`](LeaseHandle::fence) and [`token`](LeaseHandle::token) to
/// every write. A reader's fence is the **write epoch** it saw (the last
/// fence issued for the name): every writer granted after the reader has a
/// greater fence, so a read validated against the epoch
/// ([`FencedHash::read_validated`](crate::FencedHash::read_validated)) is
/// [`ValidatedRead::Torn`](crate::ValidatedRead::Torn) when such a writer
/// had written, for example because the reader paused past its lease.
/// Readers never write with their epoch.
///
/// ```no_run
/// # async fn demo(client: fencelock::LockClient) -> Result<(), fencelock::Error> {
/// let config = client.fenced_hash("config:data")?;
/// let lock = client.rwlock("config")?;
/// let opts = client.options();
///
/// let writer = lock.write(&opts).await?;
/// config.write(writer.fence(), writer.token(), "v2").await?;
/// writer.release().await?;
///
/// let reader = lock.read(&opts).await?;
/// let read = config.read_validated(reader.fence()).await?;
/// assert!(read.is_clean());
/// reader.release().await?;
/// # Ok(()) }
/// ```
///
/// Fair mode ([`WaitMode::Fair`](crate::WaitMode::Fair)) queues readers and
/// writers in one order: a writer waits for the readers ahead of it, and
/// readers that come later wait for the writer. Notify and poll promise no
/// order: a steady stream of readers can keep a writer out.
#[derive(Debug, Clone)]
pub struct RwLock {
    client: LockClient,
    name: String,
}

impl LockClient {
    /// The fenced read-write lock `name` (no call is made). One name is one
    /// kind of lock while it has holders: a mutex or a semaphore on it gets
    /// [`Error::KindConflict`](crate::Error::KindConflict), and so does a
    /// read-write lock on theirs.
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name.
    pub fn rwlock(&self, name: &str) -> Result<RwLock> {
        self.keys(name, KeyLayout::HashTagged)?;
        Ok(RwLock {
            client: self.clone(),
            name: name.to_owned(),
        })
    }
}

impl RwLock {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Takes the lock as a reader, waiting as [`LockClient::acquire`] does.
    ///
    /// # Errors
    /// As [`LockClient::acquire`]; [`Error::InvalidOption`](crate::Error::InvalidOption)
    /// for options with permits or the guide layout.
    pub async fn read(&self, opts: &LockOptions) -> Result<Lease> {
        self.client
            .acquire(&self.name, &side(opts, Access::Read))
            .await
    }

    /// Takes the lock as the writer, waiting as [`LockClient::acquire`] does.
    ///
    /// # Errors
    /// As [`RwLock::read`].
    pub async fn write(&self, opts: &LockOptions) -> Result<Lease> {
        self.client
            .acquire(&self.name, &side(opts, Access::Write))
            .await
    }

    /// Tries once to take the lock as a reader.
    ///
    /// # Errors
    /// As [`LockClient::try_acquire`].
    pub async fn try_read(&self, opts: &LockOptions) -> Result<Lease> {
        self.client
            .try_acquire(&self.name, &side(opts, Access::Read))
            .await
    }

    /// Tries once to take the lock as the writer.
    ///
    /// # Errors
    /// As [`LockClient::try_acquire`].
    pub async fn try_write(&self, opts: &LockOptions) -> Result<Lease> {
        self.client
            .try_acquire(&self.name, &side(opts, Access::Write))
            .await
    }

    /// Runs `work` as a reader, then releases, as [`LockClient::with_lock`]
    /// does (a lost lease cancels `work`).
    ///
    /// # Errors
    /// As [`LockClient::with_lock`].
    pub async fn with_read<T, F, Fut>(&self, opts: &LockOptions, work: F) -> Result<T>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        self.client
            .with_lock(&self.name, &side(opts, Access::Read), work)
            .await
    }

    /// Runs `work` as the writer, then releases, as
    /// [`LockClient::with_lock`] does.
    ///
    /// # Errors
    /// As [`LockClient::with_lock`].
    pub async fn with_write<T, F, Fut>(&self, opts: &LockOptions, work: F) -> Result<T>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        self.client
            .with_lock(&self.name, &side(opts, Access::Write), work)
            .await
    }
}

/// `opts` taking `access`.
fn side(opts: &LockOptions, access: Access) -> LockOptions {
    opts.clone().access(access)
}
