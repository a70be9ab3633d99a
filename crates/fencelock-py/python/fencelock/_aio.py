"""The asyncio API: ``connect``, ``Client``, ``Lease``, the lock context
managers and the fenced resources.

Two rules shape this module:

**The lock is released on every exit path.** ``async with client.lock(...)``
releases whether the body returns, raises or is cancelled. The extension runs
a release to completion on its own runtime even when the awaiting task is
cancelled; on top of that the release is awaited through ``asyncio.shield``,
so an outer cancellation that arrives while releasing still lets the exit
learn the outcome (once), and is re-raised afterwards.

**Loss is cancellation.** Like ``asyncio.timeout()``, a lock context watches
its lease and cancels the body's task when the lease is lost (expired, taken
over, revoked): the body is interrupted at its next ``await`` instead of
going on writing under a lock it no longer holds. The exit turns that
cancellation into :class:`~fencelock.LockLost` only when it was the sole
cancellation of the task (``Task.uncancel()`` returns 0); a cancellation from
anyone else (``task.cancel()``, an outer ``asyncio.timeout``) propagates
unchanged. A loss noticed after the body finished still raises ``LockLost``:
the work may have overlapped another holder's.

The watcher is a callback handed to the acquisition (``on_lost``): the
extension starts the watch on its own runtime with the grant, ends it with the
release, and calls the callback on the loop only when the loss happens. No
future, no extra task, nothing scheduled on the loop until the loss.
"""

from __future__ import annotations

import asyncio
import inspect
from functools import partial
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Optional,
    Union,
)

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
    "connect",
    "Client",
    "Lease",
    "LockContext",
    "RwLock",
    "FencedHash",
    "FencedKey",
]

# Futures whose outcome nobody awaits any more (a release that outlived its
# awaiter): kept referenced until done, and their outcome consumed so asyncio
# does not log "exception was never retrieved".
_background: set["asyncio.Future[Any]"] = set()


def _consume(fut: "asyncio.Future[Any]") -> None:
    _background.discard(fut)
    if not fut.cancelled():
        fut.exception()


def _retrieve(fut: "asyncio.Future[Any]") -> None:
    if not fut.cancelled():
        fut.exception()


def _in_background(fut: "asyncio.Future[Any]") -> None:
    _background.add(fut)
    fut.add_done_callback(_consume)


async def _release(native: _native.Lease) -> bool:
    """Releases ``native``, shielded from cancellation.

    If the awaiting task is cancelled while the release is in flight, the
    release goes on and is awaited once more, so the caller's exit path
    still completes; the ``CancelledError`` is raised after it. A second
    cancellation ends the wait at once (the extension still completes the
    release on its own runtime)."""
    inner: asyncio.Future[bool] = asyncio.ensure_future(native.release())
    # Whatever path below stops awaiting it, its outcome counts as seen.
    inner.add_done_callback(_retrieve)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError as cancel:
        if not inner.done():
            try:
                await asyncio.shield(inner)
            except asyncio.CancelledError:
                _in_background(inner)
                raise
            except Exception:
                pass  # the cancellation is what the caller must see
        raise cancel


async def _acquire(client: _native.Client, name: str, options: dict[str, Any],
                   on_lost: Optional[Callable[[], None]] = None) -> _native.Lease:
    """Acquires through the extension (``on_lost``: called on the loop if
    the lease is lost before its release). Cancelling the wait leaves
    nothing behind (the extension's promise); and a grant that completed in
    the same loop iteration as the cancellation, whose lease the cancelled
    task will never see, is released here."""
    fut: asyncio.Future[_native.Lease] = asyncio.ensure_future(
        client.acquire(name, options, on_lost))
    try:
        return await fut
    except asyncio.CancelledError:
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            _in_background(asyncio.ensure_future(fut.result().release()))
        raise


class Lease(LeaseBase):
    """A held lock (or permit, or side of a read-write lock), asyncio form.

    ``fence`` is what resources compare: a write carrying a lower fence than
    one they have seen is refused. ``holder_id`` is the lease's public id
    (resources record it); the secret ``token`` never appears in a ``repr``.
    """

    __slots__ = ()

    async def extend(self) -> None:
        """Renews the lease now; raises ``LockLost`` if it is gone."""
        await self._native.extend()

    async def release(self) -> bool:
        """Releases: True when deleted, False when it was no longer ours (or
        already released). Runs to completion even if the caller is
        cancelled."""
        return await _release(self._native)

    async def wait_lost(self) -> None:
        """Completes when the lease is lost; never after a normal release."""
        await self._native.lost()


class LockContext:
    """``async with client.lock(...) as lease:`` — acquires at entry, and at
    exit releases and reports a loss as :class:`~fencelock.LockLost`.

    The object can be entered again after it was exited (each entry is a new
    acquisition), but not while it is entered.
    """

    __slots__ = (
        "_client",
        "_name",
        "_options",
        "_lease",
        "_task",
        "_watch",
        "_cancel_sent",
        "_exiting",
    )

    def __init__(self, client: _native.Client, name: str, options: dict[str, Any]) -> None:
        self._client = client
        self._name = name
        self._options = options
        self._lease: Optional[Lease] = None
        self._task: Optional[asyncio.Task[Any]] = None
        # The current entry's watch: the loss callback carries it, and a
        # callback that carries another (an earlier entry's) is stale.
        self._watch: Optional[object] = None
        self._cancel_sent = False
        self._exiting = False

    async def __aenter__(self) -> Lease:
        if self._lease is not None:
            raise RuntimeError(f"the lock context of {shown(self._name)} is already entered")
        watch = object()
        native = await _acquire(self._client, self._name, self._options,
                                partial(self._on_lost, watch))
        lease = Lease(native)
        self._lease = lease
        self._task = asyncio.current_task()
        self._cancel_sent = False
        self._exiting = False
        self._watch = watch
        if native.is_lost():
            # Lost before this entry was recorded: the callback that said
            # so was stale when it ran, so it is run again here.
            asyncio.get_running_loop().call_soon(self._on_lost, watch)
        return lease

    def _on_lost(self, watch: object) -> None:
        # Runs on the loop's thread, between steps of the body's task. A
        # callback already scheduled when the exit began (or one from an
        # earlier entry of this object) is stale: only the current watch
        # of a running body may cancel it.
        if watch is not self._watch or self._exiting:
            return
        task = self._task
        if task is not None and not task.done():
            self._cancel_sent = True
            task.cancel(f"fencelock: lock {shown(self._name)} was lost")

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        lease, task = self._lease, self._task
        assert lease is not None, "__aexit__ without __aenter__"
        native = lease._native
        # The extension ends the watch with the release; until then a
        # loss's callback finds the exit begun, or another watch, and
        # does nothing.
        self._exiting = True
        we_cancelled = self._cancel_sent
        self._lease, self._task, self._watch = None, None, None
        self._cancel_sent = False

        released: Optional[bool] = None
        release_error: Optional[Exception] = None
        if not native.is_released():  # the body may have released it itself
            try:
                released = await _release(native)
            except asyncio.CancelledError:
                # Someone else cancelled us while releasing: that propagates.
                if we_cancelled and task is not None:
                    task.uncancel()
                raise
            except Exception as e:
                release_error = e

        remaining = task.uncancel() if (we_cancelled and task is not None) else 0
        lost = we_cancelled or native.is_lost() or released is False
        if lost:
            if exc is None:
                raise _lost(native, we_cancelled, release_error) from None
            if isinstance(exc, asyncio.CancelledError):
                if we_cancelled and remaining == 0:
                    raise _lost(native, True, release_error) from None
                return None  # also cancelled by someone else: not ours to swallow
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
        return f"<fencelock.LockContext name={shown(self._name)} {state}>"


def _lost(native: _native.Lease, interrupted: bool, release_error: Optional[Exception]) -> LockLost:
    note = "the body was cancelled" if interrupted else "noticed when the body ended"
    err = lost_error(native, note)
    if release_error is not None:
        err.add_note(f"releasing failed too: {release_error}")
    return err


class RwLock:
    """A fenced read-write lock: ``async with rw.read() as lease`` shares the
    lock with other readers; ``async with rw.write() as lease`` excludes
    everyone. A reader's ``fence`` is the write epoch it saw, for
    ``read_validated``."""

    __slots__ = ("_client", "_name", "_options")

    def __init__(self, client: _native.Client, name: str, options: dict[str, Any]) -> None:
        self._client = client
        self._name = name
        self._options = options

    @property
    def name(self) -> str:
        return self._name

    def _with(self, access: str, options: "dict[str, Any]") -> dict[str, Any]:
        merged = {**self._options, **lock_options(options)}
        merged["access"] = access
        return merged

    def read(self, **options: "Unpack[LockOptions]") -> LockContext:
        """A reader's context manager."""
        return LockContext(self._client, self._name, self._with("read", dict(options)))

    def write(self, **options: "Unpack[LockOptions]") -> LockContext:
        """A writer's context manager."""
        return LockContext(self._client, self._name, self._with("write", dict(options)))

    async def acquire_read(self, **options: "Unpack[LockOptions]") -> Lease:
        """A reader's lease, released by ``await lease.release()``."""
        return Lease(await _acquire(self._client, self._name, self._with("read", dict(options))))

    async def acquire_write(self, **options: "Unpack[LockOptions]") -> Lease:
        """A writer's lease, released by ``await lease.release()``."""
        return Lease(await _acquire(self._client, self._name, self._with("write", dict(options))))

    def __repr__(self) -> str:
        return f"<fencelock.RwLock name={shown(self._name)}>"


#: Either API's lease, or the extension's own.
AnyLease = Union[LeaseBase, _native.Lease]
#: ``update``'s function: old value to new value, plain or async.
UpdateFn = Callable[[Optional[str]], Union[str, Awaitable[str]]]


class _Fenced(FencedBase):
    """What a fenced hash and a fenced key share (see :class:`FencedHash`)."""

    __slots__ = ()

    async def write(self, lease: AnyLease, value: str) -> bool:
        """Writes ``value`` under ``lease``'s fence: True accepted, False
        refused as stale (a newer fence, or the same fence from another
        holder, was seen). Sent even when the lease is known lost: the
        resource decides."""
        return await self._native.write(native_lease(lease), value)

    async def register(self, lease: AnyLease) -> bool:
        """Records ``lease``'s fence without changing the value, so every
        older holder is refused from now on. False if already stale."""
        return await self._native.register(native_lease(lease))

    async def read(self) -> HashState:
        """The value with the fence and holder of the write that set it."""
        return hash_state(await self._native.read())

    async def read_validated(self, lease: AnyLease) -> ValidatedRead:
        """Reads, and says whether the value is still valid for ``lease``
        (no newer fence has written)."""
        return validated_read(await self._native.read_validated(native_lease(lease)))

    async def update(self, lease: AnyLease, fn: UpdateFn) -> bool:
        """Read-modify-write that a stale holder cannot interleave with.

        Registers the lease's fence first, so from then on every older
        holder's write is refused; reads; computes ``fn(old_value)`` (a plain
        or an async function); writes. A newer holder that comes in between
        makes the final write refused. Returns True when the write was
        accepted, False when the lease was stale (``fn`` is not called if the
        registration was refused)."""
        native = native_lease(lease)
        if not await self._native.register(native):
            return False
        state = await self._native.read()
        new = fn(state.value)
        if inspect.isawaitable(new):
            new = await new
        if not isinstance(new, str):
            raise TypeError(f"update's function must return a str, got {type(new).__name__}")
        return await self._native.write(native, new)


class FencedHash(_Fenced):
    """A Redis hash whose writes carry a fence: a write from a holder whose
    fence is older than one the hash has seen is refused, so a paused or
    partitioned former holder cannot overwrite its successor's work."""

    __slots__ = ()


class FencedKey(_Fenced):
    """An etcd key with the same fenced operations as :class:`FencedHash`."""

    __slots__ = ()


class Client:
    """A connection to Redis or etcd, and the locks taken through it.

    Get one with ``await fencelock.connect(url, **defaults)``; close it with
    ``await client.close()`` or by ``async with client:``. Closing releases
    every lease still held through it.
    """

    __slots__ = ("_native", "__weakref__")

    def __init__(self, native: _native.Client) -> None:
        self._native = native

    @property
    def url(self) -> str:
        """The URL, any password replaced by ``***``."""
        return self._native.url

    @property
    def backend(self) -> str:
        """``"redis"`` or ``"etcd"``."""
        return self._native.backend

    @property
    def closed(self) -> bool:
        return self._native.closed

    def lock(self, name: str, **options: "Unpack[LockOptions]") -> LockContext:
        """``async with client.lock(name, ttl=10.0, wait=5.0) as lease:``.

        Waits as ``wait`` says (``None`` forever, ``0`` once, raising
        ``Contended``; ``LockTimeout`` after it). While the body runs, a loss
        of the lease cancels it and the ``async with`` raises ``LockLost``."""
        return LockContext(self._native, check_name(name), lock_options(options))

    async def acquire(self, name: str, **options: "Unpack[AcquireOptions]") -> Lease:
        """The manual form: a lease to release with ``await
        lease.release()``. No loss watching: check ``lease.lost`` or call
        ``lease.check()``."""
        return Lease(await _acquire(self._native, check_name(name), lock_options(options)))

    def semaphore(self, name: str, permits: int, **options: "Unpack[LockOptions]") -> LockContext:
        """``async with client.semaphore(name, 4) as lease:`` holds one of
        ``permits`` permits (``lease.slot``). Every holder of a name must
        use the same count."""
        opts = lock_options({**options, "permits": permits})
        return LockContext(self._native, check_name(name), opts)

    def rwlock(self, name: str, **options: "Unpack[LockOptions]") -> RwLock:
        """A read-write lock; ``rw.read()`` and ``rw.write()`` are its
        context managers (options given here apply to both)."""
        return RwLock(self._native, check_name(name), lock_options(options))

    def fenced_hash(self, key: str) -> FencedHash:
        """A fenced Redis hash (``InvalidInput`` on etcd: use
        ``fenced_key``)."""
        return FencedHash(self._native.fenced_hash(check_name(key, "key")))

    def fenced_key(self, key: str) -> FencedKey:
        """A fenced etcd key (``InvalidInput`` on Redis: use
        ``fenced_hash``)."""
        return FencedKey(self._native.fenced_key(check_name(key, "key")))

    async def revoke(
        self,
        name: str,
        resources: Iterable[Union[FencedHash, FencedKey]] = (),
        *,
        replicas: Optional[int] = None,
        replica_timeout: "Optional[Duration]" = None,
        **options: Any,
    ) -> Revoked:
        """Takes ``name`` away from its holder (whose lease is then lost) and
        seals ``resources`` at the revoke's fence, so the deposed holder's
        writes are refused there even before it notices."""
        natives = [native_resource(r) for r in resources]
        opts = revoke_options(replicas, replica_timeout, options)
        return revoked(await self._native.revoke(check_name(name), opts, natives))

    async def close(self) -> None:
        """Releases every lease still held through this client and closes
        it. Idempotent; later calls raise ``ClientClosed``."""
        await self._native.close()

    async def __aenter__(self) -> "Self":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._native.closed else "open"
        return f"<fencelock.Client {self._native.url} backend={self._native.backend} {state}>"


class Connecting:
    """What ``connect()`` returns: await it for a :class:`Client`, or use
    it as ``async with fencelock.connect(url) as client:`` to close the
    client at exit."""

    __slots__ = ("_url", "_options", "_client")

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self._url = url
        self._options = options
        self._client: Optional[Client] = None

    async def _connect(self) -> Client:
        return Client(await _native.connect(self._url, self._options))

    def __await__(self) -> Generator[Any, None, Client]:
        return self._connect().__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._connect()
        return self._client

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def __repr__(self) -> str:
        # The URL may hold a password: never shown from here.
        return "<fencelock.Connecting>"


def connect(url: str, **defaults: "Unpack[ConnectOptions]") -> Connecting:
    """Connects to ``redis://``, ``rediss://``, ``etcd://`` or ``etcds://``
    ``url``. ``defaults`` are the client's lock options (``ttl``, ``wait``,
    ...) plus ``prefix``, ``connect_timeout``, ``response_timeout`` and the
    ``tls_*`` paths.

    ``client = await fencelock.connect(url)``, or ``async with
    fencelock.connect(url) as client:``."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    return Connecting(url, connect_options(defaults))
