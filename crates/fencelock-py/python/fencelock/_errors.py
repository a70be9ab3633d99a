"""fencelock's exceptions.

Every error the package raises is a :class:`Error`. The extension module
(``fencelock._native``) raises these classes with the Rust error's message
(passwords redacted) and sets ``retryable`` (and ``name``, ``fence``,
``reason`` where the error has them) on the instance.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "Error",
    "InvalidInput",
    "LockTimeout",
    "Contended",
    "LockLost",
    "GrantTooLate",
    "ConnectionFailed",
    "ConfigError",
    "KindConflict",
    "WrongType",
    "NotReplicated",
    "RevokeIncomplete",
    "ClientClosed",
]


class Error(Exception):
    """The base class of every fencelock error."""

    #: True when the same call may succeed if tried again (a timeout, a
    #: contended lock, a connection that broke); False for bad input,
    #: configuration and permission errors.
    retryable: bool = False
    #: The lock's name, where the error concerns one lock.
    name: Optional[str] = None
    #: The fence of the lease the error concerns (``LockLost``), if any.
    fence: Optional[int] = None
    #: Why a lease was lost (``"expired"``, ``"taken_over"``,
    #: ``"deadline_passed"``, ``"forked"``), for ``LockLost``.
    reason: Optional[str] = None


class InvalidInput(Error, ValueError):
    """A name, key, option or value was refused before anything was sent."""


class LockTimeout(Error, TimeoutError):
    """The lock stayed held by someone else for the whole ``wait``."""

    retryable = True


class Contended(Error):
    """``wait=0``: the lock was held by someone else; nothing was changed."""

    retryable = True


class LockLost(Error):
    """The lease ended before its holder was done: it expired, was taken over
    or revoked, or belongs to the parent of a forked process. ``fence`` is the
    lost lease's fence. Raised out of ``async with client.lock(...)`` after the
    body was cancelled, and by calls into a lost lease."""


class GrantTooLate(Error):
    """The grant's reply arrived after the lease it granted had run out; the
    lock was released again."""

    retryable = True


class ConnectionFailed(Error, ConnectionError):
    """The server could not be reached, or the connection broke."""

    retryable = True


class ConfigError(Error):
    """The deployment or its credentials refuse the call: TLS, authentication,
    ACL permissions, or a server setting."""


class KindConflict(Error):
    """The name is held as another kind (a mutex, a semaphore with another
    permit count, a read-write lock); nothing was changed."""


class WrongType(Error):
    """A key holds data of another type than fencelock expects there."""


class NotReplicated(Error):
    """A write was applied but fewer replicas than asked confirmed it."""

    retryable = True


class RevokeIncomplete(Error):
    """The lock was revoked, but a resource could not be sealed."""


class ClientClosed(Error):
    """The client was closed, or was connected in another process (a parent
    before ``os.fork()``): connect again in this process."""
