//! What every server type of the testkit shares: pausing it for a scope
//! ([`PausedGuard`] over [`Pausable`]), and the panic message of a server
//! that failed (`panic_message`).
//!
//! Every server type ([`crate::RedisServer`], [`crate::PgServer`]) hands
//! out a `PausedGuard` from its `pause_guard` method.

/// A server that can be frozen and resumed in place (SIGSTOP/SIGCONT), so
/// that [`PausedGuard`] can resume it when the guard goes out of scope.
pub trait Pausable {
    /// Freezes the server; returns once it is stopped.
    fn pause(&self);
    /// Resumes a server frozen by [`Pausable::pause`].
    fn resume(&self);
}

/// Keeps a server paused (SIGSTOP) until dropped, then resumes it.
/// Created by [`crate::RedisServer::pause_guard`] and
/// [`crate::PgServer::pause_guard`].
#[derive(Debug)]
#[must_use = "the server is resumed as soon as the guard is dropped"]
pub struct PausedGuard<'a, S: Pausable + ?Sized> {
    server: &'a S,
}

impl<'a, S: Pausable + ?Sized> PausedGuard<'a, S> {
    /// Pauses `server` and returns the guard that resumes it.
    pub fn new(server: &'a S) -> Self {
        server.pause();
        PausedGuard { server }
    }
}

impl<S: Pausable + ?Sized> Drop for PausedGuard<'_, S> {
    fn drop(&mut self) {
        self.server.resume();
    }
}

/// `error`, followed by the tail of the failed server's logs, if any.
pub(crate) fn panic_message(error: &fencelock_servers::Error) -> String {
    match error.log() {
        Some(log) if !log.trim().is_empty() => format!("{error}\n{log}"),
        _ => error.to_string(),
    }
}
