"""Type stubs of ``fencelock._native``, the Rust extension module.

The extension is an implementation detail: users import ``fencelock``, whose
Python layer (``_aio.py``, ``_sync.py``) wraps these classes. Every
``Awaitable`` below is an asyncio future driven by the extension's own tokio
runtime (one per process: a child after ``os.fork()`` gets a new one and never
touches the parent's); every ``*_blocking`` method releases the GIL while it
waits and checks for signals (Ctrl-C) every 50 ms.

Errors: every method raises instances of the classes in ``fencelock._errors``
(``Error`` and its subclasses), constructed as ``cls(message)`` with the
attributes ``retryable: bool`` and, where the error has them, ``name: str``,
``fence: int`` and ``reason: str`` set on the instance. The message is the
Rust error's text, passwords already redacted.

Options (``options: dict``), every key optional; unknown keys, wrong types,
negative, NaN or overflowing durations raise ``InvalidInput`` naming the key:

- ``ttl: float`` seconds; ``wait: float | None`` seconds (``None`` waits
  forever, ``0`` tries once); ``wait_mode: "poll" | "notify" | "fair"``;
  ``fence_mode: "clock" | "counter"``; ``fence_epoch: int`` (0..=65535);
  ``layout: "default" | "guide"``; ``replicas: int`` with
  ``replica_timeout: float``; ``renewal: bool`` (False: no background
  renewal); ``waiter_lease: float``; ``permits: int`` (a semaphore);
  ``access: "read" | "write"`` (a read-write lock);
  ``metrics_family: str``.
- ``connect`` also takes ``prefix: str``, ``connect_timeout: float``,
  ``response_timeout: float``, ``tls_ca: str`` (a path),
  ``tls_cert: str`` and ``tls_key: str`` (paths, given together); the lock
  options given to ``connect`` become the client's defaults.
"""

from typing import Any, Awaitable, Callable, Optional

def connect(url: str, options: dict[str, Any]) -> Awaitable[Client]: ...
def connect_blocking(url: str, options: dict[str, Any]) -> Client: ...
def _hop() -> Awaitable[None]:
    """Bench-only: completes with ``None`` through the same asyncio bridge as
    every call (a task on the extension's runtime, handed back through the
    loop's inbox), doing nothing else. Not part of the API."""

def holder_id(token: str) -> str:
    """The public id of a holder token (the first 16 hex digits of its SHA-1),
    as resources store it."""

class Client:
    @property
    def url(self) -> str:
        """The URL with any password replaced by ``***``."""
    @property
    def backend(self) -> str:
        """``"redis"`` or ``"etcd"``."""
    def acquire(
        self,
        name: str,
        options: dict[str, Any],
        on_lost: Optional[Callable[[], object]] = None,
    ) -> Awaitable[Lease]:
        """Acquires ``name``, waiting as ``options["wait"]`` says. Cancelling
        the awaiting task cancels the wait and leaves no queue entry and no
        lock behind. ``on_lost`` is called with no arguments on the running
        event loop if the lease is lost before it is released (or dropped),
        and never otherwise: ``lost()`` without a future."""
    def acquire_blocking(self, name: str, options: dict[str, Any]) -> Lease: ...
    def fenced_hash(self, key: str) -> FencedHash:
        """A fenced Redis hash (``InvalidInput`` on etcd, naming
        ``fenced_key``)."""
    def fenced_key(self, key: str) -> FencedKey:
        """A fenced etcd key (``InvalidInput`` on Redis, naming
        ``fenced_hash``)."""
    def revoke(
        self, name: str, options: dict[str, Any], resources: list[FencedHash | FencedKey]
    ) -> Awaitable[Revoked]: ...
    def revoke_blocking(
        self, name: str, options: dict[str, Any], resources: list[FencedHash | FencedKey]
    ) -> Revoked: ...
    def close(self) -> Awaitable[None]:
        """Releases every lease still held through this client, then closes
        it. Later calls raise ``ClientClosed``. Idempotent."""
    def close_blocking(self) -> None: ...
    @property
    def closed(self) -> bool: ...

class Lease:
    @property
    def name(self) -> str: ...
    @property
    def fence(self) -> int:
        """The writer's fence (a reader's write epoch)."""
    @property
    def holder_id(self) -> str: ...
    @property
    def token(self) -> str:
        """The secret holder token; never in ``repr``."""
    @property
    def slot(self) -> Optional[int]: ...
    @property
    def access(self) -> Optional[str]: ...
    @property
    def ttl(self) -> float: ...
    def remaining(self) -> float:
        """Seconds of validity left (0.0 once lost or released)."""
    def is_lost(self) -> bool:
        """True once the lease is lost (also in a child after ``fork()``)."""
    def loss_reason(self) -> Optional[str]:
        """``"expired"``, ``"taken_over"``, ``"deadline_passed"``,
        ``"forked"``, or None."""
    def is_released(self) -> bool: ...
    def lost(self) -> Awaitable[None]:
        """Completes when the lease is lost; never completes after a normal
        release. Cancelling it is safe."""
    def extend(self) -> Awaitable[None]:
        """Renews now; raises ``LockLost`` if the lease is gone."""
    def extend_blocking(self) -> None: ...
    def release(self) -> Awaitable[bool]:
        """Releases: True when deleted, False when it was no longer ours.
        The release runs to completion on the extension's runtime even if
        the awaiting task is cancelled. A second release returns False."""
    def release_blocking(self) -> bool: ...

class HashState:
    value: Optional[str]
    fence: Optional[int]
    holder: Optional[str]

class ValidatedRead:
    clean: bool
    value: Optional[str]
    fence: Optional[int]

class FencedHash:
    @property
    def key(self) -> str: ...
    @property
    def slot_number(self) -> Optional[int]: ...
    def slot(self, slot: int) -> FencedHash: ...
    def write(self, lease: Lease, value: str) -> Awaitable[bool]:
        """True accepted, False refused as stale. Sent even when the lease
        is known lost: the resource decides."""
    def write_blocking(self, lease: Lease, value: str) -> bool: ...
    def register(self, lease: Lease) -> Awaitable[bool]: ...
    def register_blocking(self, lease: Lease) -> bool: ...
    def read(self) -> Awaitable[HashState]: ...
    def read_blocking(self) -> HashState: ...
    def read_validated(self, lease: Lease) -> Awaitable[ValidatedRead]: ...
    def read_validated_blocking(self, lease: Lease) -> ValidatedRead: ...

class FencedKey:
    """The same methods as ``FencedHash``, on an etcd key."""
    @property
    def key(self) -> str: ...
    @property
    def slot_number(self) -> Optional[int]: ...
    def slot(self, slot: int) -> FencedKey: ...
    def write(self, lease: Lease, value: str) -> Awaitable[bool]: ...
    def write_blocking(self, lease: Lease, value: str) -> bool: ...
    def register(self, lease: Lease) -> Awaitable[bool]: ...
    def register_blocking(self, lease: Lease) -> bool: ...
    def read(self) -> Awaitable[HashState]: ...
    def read_blocking(self) -> HashState: ...
    def read_validated(self, lease: Lease) -> Awaitable[ValidatedRead]: ...
    def read_validated_blocking(self, lease: Lease) -> ValidatedRead: ...

class Sealed:
    resource: str
    sealed: bool
    current_fence: Optional[int]

class Revoked:
    name: str
    fence: int
    deposed_holder: Optional[str]
    deposed_fence: Optional[int]
    sealed: list[Sealed]
