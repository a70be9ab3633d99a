"""The blocking twin of the asyncio API: ``connect_blocking`` and the
``Blocking*`` classes, the same methods without ``await``.

A blocking body cannot be interrupted the way an asyncio task is cancelled,
so a loss surfaces at the next call into the lease: ``lease.extend()``,
``lease.check()`` (a local check, no server call) and the ``with`` exit raise
:class:`~fencelock.LockLost`; ``lease.lost`` tells without raising. Writes to
fenced resources are still sent by a lost lease: the resource decides, and
refuses them once a newer holder has written.

Every waiting call releases the GIL and checks for signals every 50 ms in
the extension, so Ctrl-C interrupts a wait promptly with
``KeyboardInterrupt`` and the extension cleans up the abandoned wait.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

from . import _native
from ._common import (
    FencedBase,
    HashState,
    LeaseBase,
    Revoked,
    ValidatedRead,
    hash_state,
    lost_error,
    native_lease,
    native_resource,
    revoked,
    shown,
    validated_read,
)
from ._errors import LockLost
from ._options import check_name, connect_options, lock_options, revoke_options

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

    from ._options import AcquireOptions, ConnectOptions, Duration, LockOptions

__all__ = [
    "connect_blocking",
    "BlockingClient",
    "BlockingLease",
    "BlockingLockContext",
    "BlockingRwLock",
    "BlockingFencedHash",
    "BlockingFencedKey",
]

#: Either API's lease, or the extension's own.
AnyLease = Union[LeaseBase, _native.Lease]


class BlockingLease(LeaseBase):
    """A held lock, blocking form (see :class:`fencelock.Lease` for the
    attributes)."""

    __slots__ = ()

    def extend(self) -> None:
        """Renews the lease now; raises ``LockLost`` if it is gone."""
        self._native.extend_blocking()

    def release(self) -> bool:
        """Releases: True when deleted, False when it was no longer ours (or
        already released)."""
        return self._native.release_blocking()


class BlockingLockContext:
    """``with client.lock(...) as lease:`` — acquires at entry; at exit
    releases, and raises :class:`~fencelock.LockLost` if the lease was lost
    while the body ran (the work may have overlapped another holder's).

    It can be entered again after exiting, not while entered."""

    __slots__ = ("_client", "_name", "_options", "_lease")

    def __init__(self, client: _native.Client, name: str, options: dict[str, Any]) -> None:
        self._client = client
        self._name = name
        self._options = options
        self._lease: Optional[BlockingLease] = None

    def __enter__(self) -> BlockingLease:
        if self._lease is not None:
            raise RuntimeError(f"the lock context of {shown(self._name)} is already entered")
        self._lease = BlockingLease(self._client.acquire_blocking(self._name, self._options))
        return self._lease

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        lease, self._lease = self._lease, None
        assert lease is not None, "__exit__ without __enter__"
        native = lease._native
        released: Optional[bool] = None
        release_error: Optional[Exception] = None
        if not native.is_released():  # the body may have released it itself
            try:
                released = native.release_blocking()
            except Exception as e:
                release_error = e
        if native.is_lost() or released is False:
            if exc is None:
                err = lost_error(native, "lost while the body ran")
                if release_error is not None:
                    err.add_note(f"releasing failed too: {release_error}")
                raise err from None
            if not isinstance(exc, LockLost):
                exc.add_note(f"fencelock: {lost_error(native)}")
            return None
        if release_error is not None:
            if exc is None:
                raise release_error
            exc.add_note(f"fencelock: releasing lock {shown(self._name)} failed too: {release_error}")
        return None

    def __repr__(self) -> str:
        state = "entered" if self._lease is not None else "not entered"
        return f"<fencelock.BlockingLockContext name={shown(self._name)} {state}>"


class BlockingRwLock:
    """A fenced read-write lock, blocking form: ``with rw.read() as lease``
    and ``with rw.write() as lease``."""

    __slots__ = ("_client", "_name", "_options")

    def __init__(self, client: _native.Client, name: str, options: dict[str, Any]) -> None:
        self._client = client
        self._name = name
        self._options = options

    @property
    def name(self) -> str:
        return self._name

    def _with(self, access: str, options: dict[str, Any]) -> dict[str, Any]:
        merged = {**self._options, **lock_options(options)}
        merged["access"] = access
        return merged

    def read(self, **options: "Unpack[LockOptions]") -> BlockingLockContext:
        """A reader's context manager."""
        return BlockingLockContext(self._client, self._name, self._with("read", dict(options)))

    def write(self, **options: "Unpack[LockOptions]") -> BlockingLockContext:
        """A writer's context manager."""
        return BlockingLockContext(self._client, self._name, self._with("write", dict(options)))

    def acquire_read(self, **options: "Unpack[LockOptions]") -> BlockingLease:
        """A reader's lease, released by ``lease.release()``."""
        opts = self._with("read", dict(options))
        return BlockingLease(self._client.acquire_blocking(self._name, opts))

    def acquire_write(self, **options: "Unpack[LockOptions]") -> BlockingLease:
        """A writer's lease, released by ``lease.release()``."""
        opts = self._with("write", dict(options))
        return BlockingLease(self._client.acquire_blocking(self._name, opts))

    def __repr__(self) -> str:
        return f"<fencelock.BlockingRwLock name={shown(self._name)}>"


class _BlockingFenced(FencedBase):
    """The fenced operations, blocking form (see :class:`fencelock.FencedHash`)."""

    __slots__ = ()

    def write(self, lease: AnyLease, value: str) -> bool:
        """True accepted, False refused as stale; sent even when the lease is
        known lost (the resource decides)."""
        return self._native.write_blocking(native_lease(lease), value)

    def register(self, lease: AnyLease) -> bool:
        """Records the lease's fence so every older holder is refused."""
        return self._native.register_blocking(native_lease(lease))

    def read(self) -> HashState:
        return hash_state(self._native.read_blocking())

    def read_validated(self, lease: AnyLease) -> ValidatedRead:
        return validated_read(self._native.read_validated_blocking(native_lease(lease)))

    def update(self, lease: AnyLease, fn: Callable[[Optional[str]], str]) -> bool:
        """Register, read, ``fn(old value)``, write: the read-modify-write a
        stale holder cannot interleave with (see
        :meth:`fencelock.FencedHash.update`)."""
        native = native_lease(lease)
        if not self._native.register_blocking(native):
            return False
        new = fn(self._native.read_blocking().value)
        if not isinstance(new, str):
            raise TypeError(f"update's function must return a str, got {type(new).__name__}")
        return self._native.write_blocking(native, new)


class BlockingFencedHash(_BlockingFenced):
    """A fenced Redis hash, blocking form."""

    __slots__ = ()


class BlockingFencedKey(_BlockingFenced):
    """A fenced etcd key, blocking form."""

    __slots__ = ()


class BlockingClient:
    """The blocking client: ``fencelock.connect_blocking(url, **defaults)``;
    ``with client:`` closes it at exit."""

    __slots__ = ("_native", "__weakref__")

    def __init__(self, native: _native.Client) -> None:
        self._native = native

    @property
    def url(self) -> str:
        """The URL, any password replaced by ``***``."""
        return self._native.url

    @property
    def backend(self) -> str:
        return self._native.backend

    @property
    def closed(self) -> bool:
        return self._native.closed

    def lock(self, name: str, **options: "Unpack[LockOptions]") -> BlockingLockContext:
        """``with client.lock(name, ttl=10.0, wait=5.0) as lease:``."""
        return BlockingLockContext(self._native, check_name(name), lock_options(options))

    def acquire(self, name: str, **options: "Unpack[AcquireOptions]") -> BlockingLease:
        """The manual form: release with ``lease.release()``."""
        opts = lock_options(options)
        return BlockingLease(self._native.acquire_blocking(check_name(name), opts))

    def semaphore(
        self, name: str, permits: int, **options: "Unpack[LockOptions]"
    ) -> BlockingLockContext:
        """One of ``permits`` permits (``lease.slot``)."""
        opts = lock_options({**options, "permits": permits})
        return BlockingLockContext(self._native, check_name(name), opts)

    def rwlock(self, name: str, **options: "Unpack[LockOptions]") -> BlockingRwLock:
        return BlockingRwLock(self._native, check_name(name), lock_options(options))

    def fenced_hash(self, key: str) -> BlockingFencedHash:
        return BlockingFencedHash(self._native.fenced_hash(check_name(key, "key")))

    def fenced_key(self, key: str) -> BlockingFencedKey:
        return BlockingFencedKey(self._native.fenced_key(check_name(key, "key")))

    def revoke(
        self,
        name: str,
        resources: Iterable[FencedBase] = (),
        *,
        replicas: Optional[int] = None,
        replica_timeout: "Optional[Duration]" = None,
        **options: Any,
    ) -> Revoked:
        """Takes ``name`` from its holder and seals ``resources`` (see
        :meth:`fencelock.Client.revoke`)."""
        natives = [native_resource(r) for r in resources]
        opts = revoke_options(replicas, replica_timeout, options)
        return revoked(self._native.revoke_blocking(check_name(name), opts, natives))

    def close(self) -> None:
        """Releases every lease still held through this client and closes
        it. Idempotent."""
        self._native.close_blocking()

    def __enter__(self) -> "Self":
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._native.closed else "open"
        return (
            f"<fencelock.BlockingClient {self._native.url} "
            f"backend={self._native.backend} {state}>"
        )


def connect_blocking(url: str, **defaults: "Unpack[ConnectOptions]") -> BlockingClient:
    """The blocking ``connect``: same URL and options."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    return BlockingClient(_native.connect_blocking(url, connect_options(defaults)))
