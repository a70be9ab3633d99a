"""What the asyncio API (``_aio``) and the blocking twin (``_sync``) share:
result types, the ``LockLost`` built in Python, and safe ``repr`` text.

Results are plain ``NamedTuple``s copied from the extension's objects: they
unpack (``value, fence, holder = await h.read()``), compare by value, pickle,
and print without calling into the extension.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Optional, Protocol, Union

from ._errors import LockLost

if TYPE_CHECKING:
    from typing_extensions import Self

    from . import _native

__all__ = [
    "HashState",
    "ValidatedRead",
    "Sealed",
    "Revoked",
    "LeaseLike",
    "lost_error",
    "shown",
    "lease_state",
    "LeaseBase",
]

#: Longest part of a name shown in a ``repr`` (names may be 512 bytes; a
#: ``repr`` is for a log line).
_SHOWN = 64


class HashState(NamedTuple):
    """What a fenced hash (or etcd key) holds: the value of the last
    accepted write, and the fence and public holder id that wrote it (all
    ``None`` before the first write)."""

    value: Optional[str]
    fence: Optional[int]
    holder: Optional[str]


class ValidatedRead(NamedTuple):
    """A read checked against a lease: ``clean`` is True when no write newer
    than the lease's fence (a reader's write epoch) was accepted, so the value
    is one the lease may act on."""

    clean: bool
    value: Optional[str]
    fence: Optional[int]


class Sealed(NamedTuple):
    """One resource of a revoke: whether it now refuses the revoked holder's
    fence (``sealed``), and the fence it records."""

    resource: str
    sealed: bool
    current_fence: Optional[int]


class Revoked(NamedTuple):
    """The result of ``revoke``: the fence the revoke was issued at, the
    holder it deposed (public id and fence, ``None`` if the lock was free),
    and each resource's seal."""

    name: str
    fence: int
    deposed_holder: Optional[str]
    deposed_fence: Optional[int]
    sealed: tuple[Sealed, ...]


class LeaseLike(Protocol):
    """Anything that has a fence and a public holder id: a ``Lease``, a
    ``BlockingLease`` or the extension's own lease."""

    @property
    def fence(self) -> int: ...

    @property
    def holder_id(self) -> str: ...


def hash_state(raw: "_native.HashState") -> HashState:
    return HashState(raw.value, raw.fence, raw.holder)


def validated_read(raw: "_native.ValidatedRead") -> ValidatedRead:
    return ValidatedRead(bool(raw.clean), raw.value, raw.fence)


def revoked(raw: "_native.Revoked") -> Revoked:
    return Revoked(
        raw.name,
        raw.fence,
        raw.deposed_holder,
        raw.deposed_fence,
        tuple(Sealed(s.resource, bool(s.sealed), s.current_fence) for s in raw.sealed),
    )


def shown(text: str) -> str:
    """``repr(text)``, cut to a log line's worth."""
    if len(text) > _SHOWN:
        return repr(text[:_SHOWN]) + f"...({len(text)} chars)"
    return repr(text)


def lease_state(native: "_native.Lease") -> str:
    """``held``, ``released`` or ``lost (REASON)``, for a ``repr``."""
    if native.is_lost():
        return f"lost ({native.loss_reason() or 'unknown'})"
    if native.is_released():
        return "released"
    return "held"


def lost_error(native: "_native.Lease", note: str = "") -> LockLost:
    """The ``LockLost`` of a lease, with ``name``, ``fence`` and ``reason``
    set as the extension sets them on its own. Never mentions the token."""
    reason = native.loss_reason() or "expired"
    text = f"lock {shown(native.name)} was lost ({reason}); fence {native.fence}"
    if note:
        text = f"{text}: {note}"
    err = LockLost(text)
    err.retryable = False
    err.name = native.name
    err.fence = native.fence
    err.reason = reason
    return err


class LeaseBase:
    """The state of a lease, read without a call to the server: what the
    asyncio ``Lease`` and the ``BlockingLease`` share."""

    __slots__ = ("_native", "__weakref__")

    def __init__(self, native: "_native.Lease") -> None:
        self._native = native

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._native.name

    @property
    def fence(self) -> int:
        """The fencing token: a writer's fence (a reader's write epoch)."""
        return self._native.fence

    @property
    def holder_id(self) -> str:
        """The public holder id (the first 16 hex digits of SHA-1 of the
        token), as resources store it."""
        return self._native.holder_id

    @property
    def token(self) -> str:
        """The secret holder token. Anyone holding it can release or extend
        this lease: never log it (``repr`` never shows it)."""
        return self._native.token

    @property
    def slot(self) -> Optional[int]:
        """A semaphore permit's slot (``None`` for a mutex)."""
        return self._native.slot

    @property
    def access(self) -> Optional[str]:
        """``"read"`` or ``"write"`` for a read-write lock, else ``None``."""
        return self._native.access

    @property
    def ttl(self) -> float:
        """The lease length in seconds."""
        return self._native.ttl

    def remaining(self) -> float:
        """Seconds of validity left by the local clock (0.0 once lost or
        released)."""
        return self._native.remaining()

    @property
    def lost(self) -> bool:
        """True once the lease is lost (it cannot come back)."""
        return self._native.is_lost()

    @property
    def loss_reason(self) -> Optional[str]:
        """``"expired"``, ``"taken_over"``, ``"deadline_passed"``,
        ``"forked"``, or ``None`` while not lost."""
        return self._native.loss_reason()

    @property
    def released(self) -> bool:
        """True once released."""
        return self._native.is_released()

    def check(self) -> None:
        """Raises :class:`~fencelock.LockLost` if the lease is lost; a cheap
        local check (no server call) to put between steps of long work."""
        if self._native.is_lost():
            raise lost_error(self._native)

    def __repr__(self) -> str:
        n = self._native
        extra = ""
        if n.slot is not None:
            extra += f" slot={n.slot}"
        if n.access is not None:
            extra += f" access={n.access}"
        return (
            f"<fencelock.{type(self).__name__} name={shown(n.name)} fence={n.fence} "
            f"holder_id={n.holder_id!r}{extra} {lease_state(n)}>"
        )


class FencedBase:
    """What the fenced resources of both APIs share: their identity."""

    __slots__ = ("_native",)

    def __init__(self, native: "Union[_native.FencedHash, _native.FencedKey]") -> None:
        self._native = native

    @property
    def key(self) -> str:
        """The resource's key."""
        return self._native.key

    @property
    def slot_number(self) -> Optional[int]:
        """The semaphore slot this view is for, or ``None``."""
        return self._native.slot_number

    def slot(self, slot: int) -> "Self":
        """The same resource for a semaphore's permit ``slot`` (each permit
        holder writes its own fenced slot)."""
        return type(self)(self._native.slot(slot))

    def __repr__(self) -> str:
        slot = "" if self.slot_number is None else f" slot={self.slot_number}"
        return f"<fencelock.{type(self).__name__} key={shown(self.key)}{slot}>"


def native_lease(lease: object) -> "_native.Lease":
    """The extension's lease behind ``lease`` (either API's, or its own)."""
    from . import _native

    if isinstance(lease, LeaseBase):
        return lease._native
    if isinstance(lease, _native.Lease):
        return lease
    raise TypeError(f"expected a fencelock lease, got {type(lease).__name__}")


def native_resource(resource: object) -> "Union[_native.FencedHash, _native.FencedKey]":
    """The extension's resource behind ``resource``."""
    from . import _native

    if isinstance(resource, FencedBase):
        return resource._native
    if isinstance(resource, (_native.FencedHash, _native.FencedKey)):
        return resource
    raise TypeError(f"expected a fenced hash or key, got {type(resource).__name__}")
