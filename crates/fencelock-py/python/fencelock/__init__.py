"""fencelock: distributed locks with fencing tokens, on Redis and etcd.

A lease's ``fence`` increases with every grant of a name; fenced resources
(``client.fenced_hash`` on Redis, ``client.fenced_key`` on etcd, a Postgres
row through :func:`fenced_update_sql`) refuse a write whose fence is older
than one they have seen, so a holder that was paused past its lease cannot
overwrite its successor's work::

    import fencelock

    async with fencelock.connect("redis://127.0.0.1:6379") as client:
        async with client.lock("invoice-42", ttl=10.0, wait=5.0) as lease:
            await client.fenced_hash("invoice:42").write(lease, "paid")

A lost lease cancels the body of its ``async with`` and raises
:class:`LockLost` out of it. :func:`connect_blocking` is the same API without
``await``.

Forks: the extension detects a fork by its process id (a child's leases are
lost with reason ``"forked"``, its clients raise ``ClientClosed``), so no
``os.register_at_fork`` hook is installed here: there is nothing left for
one to do.
"""

from __future__ import annotations

from ._aio import (
    Client,
    Connecting,
    FencedHash,
    FencedKey,
    Lease,
    LockContext,
    RwLock,
    connect,
)
from ._common import HashState, LeaseLike, Revoked, Sealed, ValidatedRead
from ._errors import (
    ClientClosed,
    ConfigError,
    ConnectionFailed,
    Contended,
    Error,
    GrantTooLate,
    InvalidInput,
    KindConflict,
    LockLost,
    LockTimeout,
    NotReplicated,
    RevokeIncomplete,
    WrongType,
)
from ._native import holder_id
from ._options import AcquireOptions, ConnectOptions, Duration, LockOptions
from ._sql import fenced_update_sql
from ._sync import (
    BlockingClient,
    BlockingFencedHash,
    BlockingFencedKey,
    BlockingLease,
    BlockingLockContext,
    BlockingRwLock,
    connect_blocking,
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fencelock")
    except PackageNotFoundError:  # imported from a source tree, not installed
        return "0+unknown"


__version__: str = _version()

__all__ = [
    "__version__",
    # asyncio
    "connect",
    "Connecting",
    "Client",
    "Lease",
    "LockContext",
    "RwLock",
    "FencedHash",
    "FencedKey",
    # blocking
    "connect_blocking",
    "BlockingClient",
    "BlockingLease",
    "BlockingLockContext",
    "BlockingRwLock",
    "BlockingFencedHash",
    "BlockingFencedKey",
    # results and helpers
    "HashState",
    "ValidatedRead",
    "Revoked",
    "Sealed",
    "LeaseLike",
    "holder_id",
    "fenced_update_sql",
    # options (types)
    "LockOptions",
    "AcquireOptions",
    "ConnectOptions",
    "Duration",
    # errors
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
