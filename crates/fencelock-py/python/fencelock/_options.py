"""Options: from Python keyword arguments to the dict ``_native`` validates.

The extension validates every option and names the bad key (unknown keys,
wrong types, negative, NaN or overflowing durations, values out of range), so
this module does not duplicate its rules. It only does what the extension
cannot see from the value alone:

- a ``datetime.timedelta`` is a duration, sent as float seconds;
- ``True``/``False`` are ``int`` subclasses in Python and would pass as ``1``
  and ``0`` where a number is expected (``ttl=True`` is a bug, never a
  one-second lease), so they are refused here, naming the key;
- a path (``os.PathLike``) is sent as ``str``.

Keys the caller did not give are left out, so the client's defaults (the
options given to ``connect``) apply to them.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from typing import Any, Literal, Mapping, Optional, TypedDict, Union

from ._errors import InvalidInput

__all__ = [
    "Duration",
    "LockOptions",
    "ConnectOptions",
    "lock_options",
    "connect_options",
    "AcquireOptions",
    "check_name",
    "revoke_options",
]

#: A duration: seconds as ``int``/``float``, or a ``timedelta``.
Duration = Union[float, int, timedelta]

WaitMode = Literal["poll", "notify", "fair"]
FenceMode = Literal["clock", "counter"]
Layout = Literal["default", "guide"]
Access = Literal["read", "write"]


class LockOptions(TypedDict, total=False):
    """Options of one acquisition (every key optional; unset keys take the
    client's defaults)."""

    #: Lease length; renewed in the background every third of it.
    ttl: Duration
    #: How long to wait for a held lock: ``None`` forever, ``0`` tries once
    #: (``Contended`` when held), else ``LockTimeout`` after it.
    wait: Optional[Duration]
    wait_mode: WaitMode
    fence_mode: FenceMode
    #: 0..=65535 (see the Rust ``LockOptions::fence_epoch``).
    fence_epoch: int
    layout: Layout
    #: Replicas that must acknowledge a grant, renewal or revoke (Redis WAIT).
    replicas: int
    replica_timeout: Duration
    #: ``False``: no background renewal, the lease ends after its ttl.
    renewal: bool
    #: How long a queued waiter keeps its place without renewing it.
    waiter_lease: Duration
    metrics_family: str


class _AcquireOnly(TypedDict, total=False):
    permits: int
    access: Access


class AcquireOptions(LockOptions, _AcquireOnly, total=False):
    """``LockOptions`` plus the kind of lock: ``permits`` (a semaphore) or
    ``access`` (a side of a read-write lock)."""


class ConnectOptions(LockOptions, total=False):
    """``connect``'s options: the client's lock defaults, and the
    connection's own settings."""

    prefix: str
    connect_timeout: Duration
    response_timeout: Duration
    #: Paths of PEM files; ``tls_cert`` and ``tls_key`` go together.
    tls_ca: Union[str, "os.PathLike[str]"]
    tls_cert: Union[str, "os.PathLike[str]"]
    tls_key: Union[str, "os.PathLike[str]"]


#: Keys whose value is a duration (seconds or ``timedelta``).
DURATION_KEYS = frozenset(
    {"ttl", "wait", "replica_timeout", "waiter_lease", "connect_timeout", "response_timeout"}
)
#: Keys whose value is an integer (``bool`` refused).
INTEGER_KEYS = frozenset({"fence_epoch", "replicas", "permits"})
#: Keys whose value is a file path.
PATH_KEYS = frozenset({"tls_ca", "tls_cert", "tls_key"})
#: Keys whose value must be a real ``bool`` (``1`` is refused: a typo for a
#: number somewhere else is likelier than a meant ``True``).
BOOL_KEYS = frozenset({"renewal"})


def _invalid(key: str, problem: str) -> InvalidInput:
    err = InvalidInput(f"invalid option {key}: {problem}")
    err.retryable = False
    return err


def _duration(key: str, value: Any) -> Any:
    if value is None:
        # Only ``wait`` means something by None (wait forever); the extension
        # names the key for any other.
        return None
    if isinstance(value, bool):
        raise _invalid(key, f"expected seconds (a number or a timedelta), got the bool {value}")
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, float) and math.isnan(value):
        raise _invalid(key, "NaN is not a duration")
    # int, float and anything else go as given: the extension checks range
    # and type and names the key.
    return value


def _integer(key: str, value: Any) -> Any:
    if isinstance(value, bool):
        raise _invalid(key, f"expected an integer, got the bool {value}")
    return value


def _boolean(key: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise _invalid(key, f"expected True or False, got {type(value).__name__}")
    return value


def _path(key: str, value: Any) -> Any:
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    return value


def _convert(options: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key in DURATION_KEYS:
            out[key] = _duration(key, value)
        elif key in INTEGER_KEYS:
            out[key] = _integer(key, value)
        elif key in BOOL_KEYS:
            out[key] = _boolean(key, value)
        elif key in PATH_KEYS:
            out[key] = _path(key, value)
        else:
            # Unknown keys too: the extension refuses them, naming the key,
            # so there is one list of valid keys (the Rust one).
            out[key] = value
    return out


def lock_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options dict of one acquisition, as ``_native`` takes it."""
    return _convert(options)


def connect_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options dict of ``connect``, as ``_native`` takes it."""
    return _convert(options)


def check_name(name: object, what: str = "name") -> str:
    """``name`` if it is a ``str``; ``InvalidInput`` otherwise (bytes and
    other types would reach the extension as a ``TypeError``). Emptiness,
    length and characters are checked by the extension."""
    if not isinstance(name, str):
        err = InvalidInput(f"the {what} must be a str, got {type(name).__name__}")
        err.retryable = False
        raise err
    return name


def revoke_options(
    replicas: Optional[int], replica_timeout: Optional[Duration], options: Mapping[str, Any]
) -> dict[str, Any]:
    """The options dict of ``revoke``: its keyword arguments, and any lock
    option (e.g. ``layout``) that changes which keys the name maps to."""
    given = dict(options)
    if replicas is not None:
        given["replicas"] = replicas
    if replica_timeout is not None:
        given["replica_timeout"] = replica_timeout
    return _convert(given)
