"""A ``fencelock torture`` worker in Python: ``python -m fencelock.torture_worker``.

``fencelock torture --python-workers N`` starts N of a run's workers with
this module instead of the Rust worker (``fencelock torture-worker``), so
that one run's checkers judge Python and Rust holders of the same names
together. It speaks the Rust worker's protocol exactly
(``crates/fencelock-torture/src/worker.rs``):

- stdin, first line: the ``WorkerSpec`` (JSON). Later lines: ``stop`` (or
  the end of stdin) ends the run after the current cycle.
- stdout: one history event per line (JSON, flushed at once), stamped on
  the run's clock: ``CLOCK_MONOTONIC`` in µs minus the spec's ``origin``
  (``clock.rs``), the clock every process of the run shares.
- Each cycle: acquire a random name (``acquire`` → ``granted`` /
  ``acquire_failed``), register the fence at the resource (``register`` →
  ``registered``), read the counter (``read``), work for up to ``hold``,
  write read + 1 with the fence (``write`` → ``written``), release
  (``release`` → ``release_done``). A semaphore's permit (``permits``) does
  the same on its slot's view of the resource.
- A loss signal is recorded (``lost``) but not obeyed: the worker goes on
  writing, so every stale write reaches the resource and the fence has to
  stop it.

The lock, the registration and the read go through the package (the Rust
engine underneath); the write is the torture resource's audited write (the
fenced write and its audit entry in one script, which the coordinator sends
in the spec (``audited_write``: the Rust resource's own
``scripts/audited_write.lua``, so both kinds of worker run one text) sent
with redis-py, once, never retried.

What it cannot run it refuses at start, on stderr, with exit code 64: an
etcd lock URL, the Postgres resource, a read-write lock, the negative
controls (``--unsafe``), a resource that waits for replicas. A server that
cannot be reached at start exits 69. The coordinator stops the run and
reports a worker that exits early.

``FENCELOCK_TORTURE_UNSAFE=no-fence-check`` (a test's negative control, never
set by ``fencelock torture``): the audited write applies every write
without comparing fences, so a stale holder's late write is accepted and
the checkers must report it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
from typing import Any, Callable, Optional


#: The environment variable of the Python worker's own negative control.
UNSAFE_ENV = "FENCELOCK_TORTURE_UNSAFE"
#: Its one value: writes accepted without the fence check.
NO_FENCE_CHECK = "no-fence-check"

#: How long the resource's keys live without a refresh, in ms (the Rust
#: resource's ``KEY_TTL``).
KEY_TTL_MS = 60_000

#: Exit codes (as the CLI's): a spec this worker cannot run, a server it
#: cannot reach at start.
EXIT_USAGE = 64
EXIT_UNAVAILABLE = 69

#: The Rust ``LossReason``'s text for each reason the package reports.
LOSS_REASONS = {
    "expired": "the lock expired in the store",
    "taken_over": "another holder took the lock",
    "deadline_passed": "the lease deadline passed before renewal succeeded",
}


class Refused(Exception):
    """A spec this worker cannot run (exit 64)."""


class Unreachable(Exception):
    """A server that cannot be reached at start (exit 69)."""


def unsafe_script(script: str) -> str:
    """The audited write ``script`` with its fence check switched off (the
    negative control): every write is applied and audited."""
    anchor = "if not ok then"
    if script.count(anchor) != 1:
        raise RuntimeError("the audited write script changed: cannot derive its unsafe variant")
    return script.replace(anchor, "if false then")


def mono_us() -> int:
    """``CLOCK_MONOTONIC`` now, in µs (``clock.rs``'s ``mono_us``)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Emitter:
    """Writes history lines to stdout, stamped on the run's clock."""

    def __init__(self, origin: int, p: str, out: Any = None) -> None:
        self.origin = origin
        self.p = p
        self.out = out if out is not None else sys.stdout

    def now(self) -> int:
        """µs since the start of the run."""
        return mono_us() - self.origin

    def emit(self, ev: str, **fields: Any) -> None:
        line = {"t": self.now(), "p": self.p, "ev": ev}
        # ``None`` fields are left out, as the Rust worker leaves out a
        # mutex's ``slot``.
        line.update((k, v) for k, v in fields.items() if v is not None)
        self.out.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.out.flush()

    def valid_until(self, lease: Any) -> int:
        """Until when ``lease`` is valid, on the run's axis: the clock
        first, then the time left, so a pause in between can only make it
        earlier (a lower bound of the lease's deadline); 1 µs less for the
        float's rounding."""
        now = self.now()
        left = int(lease.remaining() * 1_000_000) - 1
        return now + max(left, 0)


def refusal(spec: dict[str, Any]) -> Optional[str]:
    """Why this worker cannot run ``spec``, or ``None``."""
    if not spec.get("audited_write"):
        return (
            "the spec carries no audited write script: the fencelock binary that "
            "started this worker is older than the Python package; use one built "
            "from the same checkout"
        )
    lock_url = str(spec.get("lock_url", ""))
    if lock_url.startswith(("etcd://", "etcds://")):
        return (
            "the Python torture worker runs on Redis only, not etcd: run the etcd "
            "topology (or --url etcd://...) without --python-workers"
        )
    if spec.get("variant"):
        return (
            f"the Python torture worker does not run negative controls (--unsafe "
            f"{spec['variant']}): run them without --python-workers"
        )
    if spec.get("rwlock_reads") is not None:
        return (
            "the Python torture worker does not run --primitive rwlock: "
            "a mutex or a semaphore only"
        )
    resource = spec.get("resource")
    if not isinstance(resource, dict) or "Redis" not in resource:
        kind = next(iter(resource), "?") if isinstance(resource, dict) else "?"
        return (
            f"the Python torture worker writes the Redis resource only, not "
            f"{kind.lower()} (--resource postgres): run it without --python-workers"
        )
    redis_spec = resource["Redis"]
    if int(redis_spec.get("replicas") or 0) > 0:
        return (
            "the Python torture worker cannot wait for the resource's replicas "
            "(a resource on a replicated --redis deployment): use --replicas 0 "
            "or a started topology"
        )
    url = str(redis_spec.get("url", ""))
    if not url.startswith(("redis://", "rediss://", "unix://")):
        scheme = url.split("://", 1)[0]
        return (
            f"the Python torture worker reaches the resource with redis-py, which "
            f"takes redis://, rediss:// and unix:// URLs, not {scheme}://"
        )
    if not spec.get("names"):
        return "the spec names no lock"
    return None


def tls_connect_options(tls: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The spec's TLS files as ``fencelock.connect`` options."""
    out: dict[str, Any] = {}
    if not tls:
        return out
    if tls.get("ca"):
        out["tls_ca"] = tls["ca"]
    if tls.get("client_cert"):
        cert, key = tls["client_cert"]
        out["tls_cert"] = cert
        out["tls_key"] = key
    return out


def tls_redis_options(url: str, tls: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The spec's TLS files as redis-py options (only for ``rediss://``)."""
    out: dict[str, Any] = {}
    if not tls or not url.startswith("rediss://"):
        return out
    if tls.get("ca"):
        out["ssl_ca_certs"] = tls["ca"]
    if tls.get("client_cert"):
        cert, key = tls["client_cert"]
        out["ssl_certfile"] = cert
        out["ssl_keyfile"] = key
    return out


def short(e: BaseException) -> str:
    """An acquisition's error in a few words, as the Rust worker says it."""
    from . import _errors

    if isinstance(e, _errors.LockTimeout):
        return "timed out waiting"
    if isinstance(e, _errors.GrantTooLate):
        return "granted too late"
    if isinstance(e, _errors.ConnectionFailed):
        return "unreachable"
    if isinstance(e, _errors.Error):
        return str(e)
    return f"{type(e).__name__}: {e}"


class Worker:
    """One worker's connections and its cycles."""

    def __init__(self, spec: dict[str, Any], emitter: Emitter) -> None:
        self.spec = spec
        self.em = emitter
        self.me = f"w{spec['index']}"
        redis_spec = spec["resource"]["Redis"]
        self.resource_url: str = redis_spec["url"]
        self.resource_tls = redis_spec.get("tls")
        self.resource_prefix: str = redis_spec["prefix"]
        self.names: list[str] = list(spec["names"])
        self.hold_ms = int(spec["hold_ms"])
        self.permits: Optional[int] = spec.get("permits")
        seed = int(spec["seed"]) ^ ((int(spec["index"]) * 0x9E37_79B9) & (2**64 - 1))
        self.rng = random.Random(seed)
        self.unsafe = os.environ.get(UNSAFE_ENV, "") == NO_FENCE_CHECK
        self.lock: Any = None
        self.resource: Any = None
        self.redis: Any = None
        self.script: Any = None

    async def connect(self) -> None:
        import fencelock

        try:
            from redis.asyncio import Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
        except ImportError as e:
            raise Refused(
                f"the Python torture worker writes the resource with redis-py, which "
                f"{sys.executable} cannot import ({e}): pip install redis (or the package with its torture extra: fencelock[torture])"
            ) from e

        spec = self.spec
        options: dict[str, Any] = {
            "prefix": spec["prefix"],
            "response_timeout": 2.0,
            "ttl": int(spec["ttl_ms"]) / 1000,
            "wait": int(spec["wait_ms"]) / 1000,
            "fence_mode": spec["fence_mode"],
            "wait_mode": spec["mode"],
        }
        if int(spec.get("replicas") or 0) > 0:
            # A grant not yet on every replica can be lost by a failover.
            options["replicas"] = int(spec["replicas"])
            options["replica_timeout"] = max(int(spec.get("replica_timeout_ms") or 0), 1) / 1000
        options.update(tls_connect_options(spec.get("tls")))
        try:
            self.lock = await fencelock.connect(spec["lock_url"], **options)
        except fencelock.Error as e:
            raise Unreachable(f"the lock server: {e}") from e
        resource_options: dict[str, Any] = {"connect_timeout": 5.0, "response_timeout": 2.0}
        resource_options.update(tls_connect_options(self.resource_tls))
        try:
            self.resource = await fencelock.connect(self.resource_url, **resource_options)
        except fencelock.Error as e:
            raise Unreachable(f"the resource server: {e}") from e
        # Sent once: a write is never repeated behind the run's back (redis-py
        # retries 3 times by default). NOSCRIPT alone is answered by loading
        # the script and sending it again: then nothing had run.
        self.redis = Redis.from_url(
            self.resource_url,
            socket_timeout=2.0,
            socket_connect_timeout=5.0,
            retry=Retry(NoBackoff(), 0),
            **tls_redis_options(self.resource_url, self.resource_tls),
        )
        try:
            await self.redis.ping()
        except Exception as e:
            raise Unreachable(f"the resource server (redis-py): {e}") from e
        source: str = self.spec["audited_write"]
        self.script = self.redis.register_script(unsafe_script(source) if self.unsafe else source)

    async def close(self) -> None:
        for client in (self.lock, self.resource):
            if client is not None:
                try:
                    await client.close()
                except Exception:
                    pass
        if self.redis is not None:
            try:
                await self.redis.aclose()
            except Exception:
                pass

    def hash_key(self, name: str) -> str:
        return f"{self.resource_prefix}res:{{{name}}}"

    def audit_key(self, name: str) -> str:
        return f"{self.resource_prefix}res:{{{name}}}:audit"

    def view(self, name: str, slot: Optional[int]) -> Any:
        """The fenced hash of ``name``, or its slot's view for a permit."""
        h = self.resource.fenced_hash(self.hash_key(name))
        return h if slot is None else h.slot(slot)

    async def run(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            op = f"{self.me}.{n}"
            name = self.names[self.rng.randrange(len(self.names))]
            hold = self.rng.randint(0, self.hold_ms) / 1000
            await self.cycle(op, name, hold)
            if n % 64 == 0:
                await asyncio.sleep(0)

    async def cycle(self, op: str, name: str, hold: float) -> None:
        em = self.em
        em.emit("acquire", op=op, name=name)
        try:
            if self.permits is not None:
                lease = await self.lock.acquire(name, permits=int(self.permits))
            else:
                lease = await self.lock.acquire(name)
        except Exception as e:
            em.emit("acquire_failed", op=op, name=name, error=short(e))
            # The server may be down: do not spin.
            await asyncio.sleep(0.02)
            return
        em.emit(
            "granted",
            op=op,
            name=name,
            fence=lease.fence,
            holder=lease.holder_id,
            valid_until=em.valid_until(lease),
            slot=lease.slot,
        )
        watcher = asyncio.ensure_future(self.watch(op, lease))
        try:
            await self.work(op, name, lease, hold)
        finally:
            em.emit("release", op=op, valid_until=em.valid_until(lease))
            try:
                outcome = "released" if await lease.release() else "not_ours"
            except Exception:
                outcome = "unknown"
            # A loss signal that fired before the release's reply is
            # recorded; none can fire after a release.
            await asyncio.sleep(0)
            watcher.cancel()
            em.emit("release_done", op=op, outcome=outcome)

    async def watch(self, op: str, lease: Any) -> None:
        """Records the loss signal (``lost``), without obeying it."""
        try:
            await lease.wait_lost()
        except asyncio.CancelledError:
            raise
        except Exception:
            return
        reason = lease.loss_reason
        self.em.emit("lost", op=op, reason=LOSS_REASONS.get(reason, reason or "lost"))

    async def work(self, op: str, name: str, lease: Any, hold: float) -> None:
        em = self.em
        fence, slot = lease.fence, lease.slot
        view = self.view(name, slot)
        em.emit("register", op=op, fence=fence, valid_until=em.valid_until(lease))
        try:
            outcome = "accepted" if await view.register(lease) else "stale"
        except Exception:
            outcome = "unknown"
        em.emit("registered", op=op, outcome=outcome)
        if outcome != "accepted":
            return
        try:
            state = await view.read()
        except Exception:
            return
        try:
            read = int(state.value) if state.value is not None else 0
        except ValueError:
            read = 0
        em.emit("read", op=op, value=read, valid_until=em.valid_until(lease))
        await asyncio.sleep(hold)
        em.emit(
            "write",
            op=op,
            fence=fence,
            read=read,
            value=read + 1,
            valid_until=em.valid_until(lease),
        )
        em.emit("written", op=op, outcome=await self.write(op, name, lease, read))

    async def write(self, op: str, name: str, lease: Any, read: int) -> str:
        """The audited write of ``read + 1`` with the lease's fence."""
        slot = lease.slot
        args = [
            str(lease.fence),
            lease.token,
            op,
            self.me,
            str(read),
            str(read + 1),
            str(KEY_TTL_MS),
            "",
            "" if slot is None else str(slot),
        ]
        try:
            reply = await self.script(keys=[self.hash_key(name), self.audit_key(name)], args=args)
        except Exception:
            return "unknown"
        return "accepted" if int(reply[0]) == 1 else "stale"


def watch_stdin(on_stop: Callable[[], None]) -> None:
    """Calls ``on_stop`` on a ``stop`` line or at the end of stdin (the
    coordinator is gone); runs on its own thread."""
    try:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
    except Exception:
        pass
    on_stop()


async def run(spec: dict[str, Any]) -> None:
    emitter = Emitter(int(spec["origin"]), f"w{spec['index']}")
    worker = Worker(spec, emitter)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def stopped() -> None:
        try:
            loop.call_soon_threadsafe(stop.set)
        except RuntimeError:
            pass  # the loop already ended

    threading.Thread(target=watch_stdin, args=(stopped,), daemon=True).start()
    try:
        await worker.connect()
        await worker.run(stop)
    finally:
        await worker.close()


def main(argv: Optional[list[str]] = None) -> int:
    del argv
    first = sys.stdin.readline()
    if not first.strip():
        print(
            "fencelock.torture_worker: no spec on stdin: this worker is started by "
            "`fencelock torture --python-workers N`",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        spec = json.loads(first)
    except ValueError as e:
        print(f"fencelock.torture_worker: bad spec: {e}", file=sys.stderr)
        return EXIT_USAGE
    why = refusal(spec) if isinstance(spec, dict) else "the spec is not a JSON object"
    if why is not None:
        print(f"fencelock.torture_worker: {why}", file=sys.stderr)
        return EXIT_USAGE
    try:
        asyncio.run(run(spec))
    except Refused as e:
        print(f"fencelock.torture_worker: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as e:
        print(f"fencelock.torture_worker: cannot reach {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except BrokenPipeError:
        # The coordinator is gone: nobody reads the history any more.
        return 0
    return 0


if __name__ == "__main__":
    status = main()
    # Straight out: no interpreter shutdown, which could wait on (or abort
    # over) the thread still blocked reading stdin when the run could not
    # start, or on the extension's runtime.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status)
