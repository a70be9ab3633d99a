"""fencelock's Python locks against redis-py's and python-redis-lock's, on
one redis-server, in one run.

    .venv/bin/python crates/fencelock-py/bench/bench.py [--duration 2] [--rounds 5]
        [--url URL] [--workers 8] [--hold 0.001] [--poll 0.001]
        [--blocking-workers threads|processes] [--loop asyncio|uvloop]
        [--pin [--client-cpu same|other]] [--json] [--save PATH]

Without ``--url`` it starts its own redis-server on a free loopback port
(killed at exit, and by the kernel if the bench dies: ``PR_SET_PDEATHSIG``).

What it measures, each contestant for ``--duration`` seconds per round, the
rounds interleaved (round 1 of everything, then round 2, ...; the order of
the contestants within a group rotates each round) and the medians of
``--rounds`` rounds reported, with the range:

- Redis's own round trip: redis-py's ``PING`` loop, asyncio and blocking
  (fencelock has no ``PING`` of its own). Lock rates are also given per
  ``PING`` of the same kind, so figures from different machines compare.
- The bound of fencelock's asyncio bridge: ``await fencelock._native._hop()``
  (a hidden, bench-only call that does nothing on the extension's runtime
  but cross there and back: spawned on it, handed back through the loop's
  inbox, a queue whose socket the loop watches), hops/s and hops per asyncio ``PING``. Every
  asyncio call makes one such hop; an ``async with client.lock()`` cycle
  makes two (acquire and release; its loss watch is a callback started on
  the runtime with the grant, which makes none unless the lease is lost).
- Uncontended, one worker: acquire+release cycles/s of

  - asyncio: fencelock ``async with client.lock(name, ttl=10, wait=30)``
    (fenced) and redis-py ``redis.asyncio`` ``Lock`` (unfenced);
  - blocking: fencelock ``connect_blocking``'s ``with client.lock(...)``,
    redis-py ``redis.Lock`` and python-redis-lock ``redis_lock.Lock``.

- Contended: ``--workers`` workers (asyncio tasks on one event loop for the
  asyncio contestants; threads of this process, or with
  ``--blocking-workers processes`` one process each, for the blocking ones)
  loop on one name, each holding the lock for ``--hold`` seconds (a sleep:
  work that waits, as I/O does). From each holder's own timestamps (the
  grant's reply received; the release called):

  - acquisitions/s;
  - utilization: the share of the wall time during which some worker held
    the lock (the union of the hold intervals, clipped to the round);
  - hand-over p50/p99: from one holder calling release to the next holder's
    acquire returning;
  - Jain's fairness index over the workers' acquisition counts (1.0: all
    equal; 1/workers: one worker took every acquisition);
  - overlaps: hold intervals that overlap (a lock that let two holders in);
    any overlap fails the run (exit 1).

How each competitor is used (its fastest correct use):

- fencelock: one client per process (asyncio or blocking), shared by the
  workers; a ``client.lock(...)`` context per acquisition (a new holder
  token each time), default options (``wait_mode="notify"``: a release
  wakes the next waiter). ``--wait-mode`` changes that.
- redis-py: one ``Lock`` object per worker, reused (its ``acquire`` mints a
  new token each time), ``timeout=10`` (a lease, like the others),
  ``blocking=True`` and ``blocking_timeout=30``. A waiter polls: ``sleep``
  is ``--poll`` (default 1 ms, not redis-py's 100 ms default, which would
  leave the lock idle for most of each 1 ms hold); shorter would spin on
  the server the others share.
- python-redis-lock: a ``redis_lock.Lock(conn, name, expire=30)`` per
  acquisition (its id is fixed per object, so one per acquisition gives
  each its own, as its README's ``with Lock(...)`` does); waiters block on
  its signal list (``BLPOP``), which its release pushes to. It has no
  asyncio form.

A tiny run for a test: ``--duration 0.2 --rounds 1`` (a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import math
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

now = time.monotonic  # CLOCK_MONOTONIC: one clock for every process here

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """The kernel sends SIGKILL to this process when its parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


# --------------------------------------------------------------------------
# The redis-server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server on a free loopback port, no persistence."""

    def __init__(self, binary: str, cpu: Optional[int]) -> None:
        self.process: Optional[subprocess.Popen[bytes]] = None
        parent = os.getpid()

        def preexec() -> None:
            die_with_parent()
            if os.getppid() != parent:  # the parent died before prctl
                os._exit(1)
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})

        last = ""
        for _ in range(5):
            self.port = free_port()
            proc = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--daemonize", "no",
                 "--loglevel", "warning"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                preexec_fn=preexec,
            )
            if self._ready(proc):
                self.process = proc
                return
            proc.kill()
            out, _ = proc.communicate()
            last = out.decode(errors="replace")[-500:]
        raise RuntimeError(f"redis-server did not start: {last}")

    def _ready(self, proc: "subprocess.Popen[bytes]") -> bool:
        end = now() + 10
        while now() < end:
            if proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------
# Contestants

# Names: one random run id, then contestant and round, so reruns and other
# runs on the same server never share a lock.
RUN = uuid.uuid4().hex[:8]


@dataclass
class Setup:
    url: str
    ttl: float = 10.0
    wait: float = 30.0
    poll: float = 0.001
    wait_mode: Optional[str] = None

    def fl_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"ttl": self.ttl, "wait": self.wait}
        if self.wait_mode:
            opts["wait_mode"] = self.wait_mode
        return opts


class AsyncContestant:
    """An asyncio lock: ``new_worker()`` gives a worker's ``hold(name)``, an
    async context manager factory."""

    key: str
    library: str
    fenced: bool
    how: str

    async def open(self, s: Setup) -> None: ...

    def new_worker(self, name: str) -> Callable[[], Any]:
        raise NotImplementedError

    async def close(self) -> None: ...


class FencelockAsync(AsyncContestant):
    key, library, fenced = "fencelock-asyncio", "fencelock", True
    how = "async with client.lock(name, ttl=10, wait=30)"

    async def open(self, s: Setup) -> None:
        import fencelock

        self.client = await fencelock.connect(s.url)
        self.opts = s.fl_options()

    def new_worker(self, name: str) -> Callable[[], Any]:
        client, opts = self.client, self.opts
        return lambda: client.lock(name, **opts)

    async def close(self) -> None:
        await self.client.close()


class RedisPyAsync(AsyncContestant):
    key, library, fenced = "redis-py-asyncio", "redis-py", False
    how = ("async with r.lock(name, timeout=10, blocking_timeout=30) "
           "(redis.asyncio; one Lock per worker)")

    async def open(self, s: Setup) -> None:
        import redis.asyncio

        self.r = redis.asyncio.Redis.from_url(s.url)
        self.s = s

    def new_worker(self, name: str) -> Callable[[], Any]:
        lock = self.r.lock(name, timeout=self.s.ttl, sleep=self.s.poll, blocking=True,
                           blocking_timeout=self.s.wait)
        return lambda: lock

    async def close(self) -> None:
        await self.r.aclose()


class BlockingContestant:
    key: str
    library: str
    fenced: bool
    how: str

    def open(self, s: Setup) -> None: ...

    def new_worker(self, name: str) -> Callable[[], Any]:
        raise NotImplementedError

    def close(self) -> None: ...


class FencelockBlocking(BlockingContestant):
    key, library, fenced = "fencelock-blocking", "fencelock", True
    how = "with client.lock(name, ttl=10, wait=30) (connect_blocking)"

    def open(self, s: Setup) -> None:
        import fencelock

        self.client = fencelock.connect_blocking(s.url)
        self.opts = s.fl_options()

    def new_worker(self, name: str) -> Callable[[], Any]:
        client, opts = self.client, self.opts
        return lambda: client.lock(name, **opts)

    def close(self) -> None:
        self.client.close()


class RedisPyBlocking(BlockingContestant):
    key, library, fenced = "redis-py-blocking", "redis-py", False
    how = ("with r.lock(name, timeout=10, blocking_timeout=30) "
           "(redis.Redis; one Lock per worker)")

    def open(self, s: Setup) -> None:
        import redis

        self.r = redis.Redis.from_url(s.url)
        self.s = s

    def new_worker(self, name: str) -> Callable[[], Any]:
        lock = self.r.lock(name, timeout=self.s.ttl, sleep=self.s.poll, blocking=True,
                           blocking_timeout=self.s.wait)
        return lambda: lock

    def close(self) -> None:
        self.r.close()


class RedisLockBlocking(BlockingContestant):
    key, library, fenced = "python-redis-lock", "python-redis-lock", False
    how = "with redis_lock.Lock(r, name, expire=30) (one per acquisition)"

    def open(self, s: Setup) -> None:
        import redis

        self.r = redis.Redis.from_url(s.url)
        self.expire = max(1, math.ceil(s.wait))

    def new_worker(self, name: str) -> Callable[[], Any]:
        import redis_lock

        r, expire = self.r, self.expire
        return lambda: redis_lock.Lock(r, name, expire=expire)

    def close(self) -> None:
        self.r.close()


ASYNC = [FencelockAsync, RedisPyAsync]
BLOCKING = [FencelockBlocking, RedisPyBlocking, RedisLockBlocking]
BLOCKING_BY_KEY = {c.key: c for c in BLOCKING}


# --------------------------------------------------------------------------
# Loops

Record = tuple[int, float, float]  # worker, grant received, release called


async def async_cycles(make: Callable[[], Any], duration: float) -> float:
    n = 0
    start = now()
    end = start + duration
    while now() < end:
        async with make():
            pass
        n += 1
    return n / (now() - start)


def blocking_cycles(make: Callable[[], Any], duration: float) -> float:
    n = 0
    start = now()
    end = start + duration
    while now() < end:
        with make():
            pass
        n += 1
    return n / (now() - start)


async def async_pings(r: Any, duration: float) -> float:
    n = 0
    start = now()
    end = start + duration
    while now() < end:
        await r.ping()
        n += 1
    return n / (now() - start)


async def async_hops(duration: float) -> float:
    from fencelock import _native

    hop = _native._hop
    n = 0
    start = now()
    end = start + duration
    while now() < end:
        await hop()
        n += 1
    return n / (now() - start)


def blocking_pings(r: Any, duration: float) -> float:
    n = 0
    start = now()
    end = start + duration
    while now() < end:
        r.ping()
        n += 1
    return n / (now() - start)


async def async_contended(c: AsyncContestant, name: str, workers: int, hold: float,
                          duration: float) -> tuple[float, float, list[Record]]:
    records: list[Record] = []
    makes = [c.new_worker(name) for _ in range(workers)]
    start = now()
    end = start + duration

    async def worker(i: int) -> None:
        make = makes[i]
        while now() < end:
            async with make():
                got = now()
                await asyncio.sleep(hold)
                records.append((i, got, now()))

    await asyncio.gather(*(worker(i) for i in range(workers)))
    return start, end, records


def thread_contended(c: BlockingContestant, name: str, workers: int, hold: float,
                     duration: float) -> tuple[float, float, list[Record]]:
    records: list[Record] = []
    errors: list[BaseException] = []
    makes = [c.new_worker(name) for _ in range(workers)]
    window: list[float] = []
    barrier = threading.Barrier(workers, action=lambda: window.append(now()))

    def worker(i: int) -> None:
        make = makes[i]
        try:
            barrier.wait()
            end = window[0] + duration
            while now() < end:
                with make():
                    got = now()
                    time.sleep(hold)
                    records.append((i, got, now()))
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return window[0], window[0] + duration, records


def _process_worker(key: str, setup: Setup, name: str, i: int, hold: float, duration: float,
                    barrier: Any, window: Any, out: Any) -> None:
    """One blocking worker in its own process (``--blocking-workers
    processes``)."""
    die_with_parent()
    records: list[Record] = []
    error = None
    try:
        c = BLOCKING_BY_KEY[key]()
        c.open(setup)
        make = c.new_worker(name)
        with make():  # a warm connection and loaded scripts
            pass
        barrier.wait(60)  # everyone connected
        barrier.wait(60)  # the parent has set the window
        end = window.value + duration
        while now() < end:
            with make():
                got = now()
                time.sleep(hold)
                records.append((i, got, now()))
        c.close()
    except BaseException as e:
        error = f"{type(e).__name__}: {e}"
    out.put((records, error))


def process_contended(c: BlockingContestant, setup: Setup, name: str, workers: int, hold: float,
                      duration: float) -> tuple[float, float, list[Record]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    window = ctx.Value("d", 0.0)
    out = ctx.Queue()
    procs = [ctx.Process(target=_process_worker, daemon=True,
                         args=(c.key, setup, name, i, hold, duration, barrier, window, out))
             for i in range(workers)]
    for p in procs:
        p.start()
    try:
        barrier.wait(60)
        window.value = now()
        barrier.wait(60)
        records: list[Record] = []
        for _ in procs:
            recs, error = out.get(timeout=duration + 60)
            if error:
                raise RuntimeError(f"a worker process failed: {error}")
            records.extend(recs)
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    return window.value, window.value + duration, records


def contention_figures(start: float, end: float, records: list[Record],
                       workers: int) -> dict[str, Any]:
    """Acquisitions/s, utilization, hand-over p50/p99, Jain's index and
    overlaps, from the hold intervals granted within [start, end)."""
    duration = end - start
    recs = sorted((r for r in records if start <= r[1] < end), key=lambda r: r[1])
    counts = [0] * workers
    for w, _, _ in recs:
        counts[w] += 1
    held = 0.0
    cur_s = cur_e = None
    overlaps = 0
    gaps: list[float] = []
    prev_release = None
    for _, got, rel in recs:
        if prev_release is not None:
            gap = got - prev_release
            if gap < 0:
                overlaps += 1
            gaps.append(gap)
        prev_release = rel if prev_release is None else max(prev_release, rel)
        s, e = got, min(rel, end)
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                held += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        held += cur_e - cur_s
    total = sum(counts)
    squares = sum(c * c for c in counts)
    return {
        "acquisitions_per_s": total / duration,
        "utilization": held / duration,
        "handover_p50_ms": percentile(gaps, 50) * 1e3 if gaps else None,
        "handover_p99_ms": percentile(gaps, 99) * 1e3 if gaps else None,
        "jain": (total * total) / (workers * squares) if squares else None,
        "acquisitions": total,
        "per_worker": counts,
        "overlaps": overlaps,
    }


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


# --------------------------------------------------------------------------
# The run


@dataclass
class Row:
    group: str  # ping | hop | uncontended | contended
    mode: str  # asyncio | blocking
    key: str
    library: str
    fenced: Optional[bool]
    how: str
    rounds: list[dict[str, Any]] = field(default_factory=list)
    error: Optional[str] = None

    def median(self, metric: str) -> Optional[float]:
        values = [r[metric] for r in self.rounds if r.get(metric) is not None]
        return statistics.median(values) if values else None

    def span(self, metric: str) -> tuple[Optional[float], Optional[float]]:
        values = [r[metric] for r in self.rounds if r.get(metric) is not None]
        return (min(values), max(values)) if values else (None, None)


def rotated(items: list[Any], k: int) -> list[Any]:
    k %= len(items)
    return items[k:] + items[:k]


def run(args: argparse.Namespace, url: str) -> dict[str, Row]:
    import redis
    import redis.asyncio

    if args.loop == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    setup = Setup(url=url, poll=args.poll, wait_mode=args.wait_mode)

    rows: dict[str, Row] = {}

    def row(group: str, mode: str, c: Any) -> Row:
        k = f"{group}/{c.key}"
        if k not in rows:
            rows[k] = Row(group, mode, c.key, c.library, c.fenced, c.how)
        return rows[k]

    aping = redis.asyncio.Redis.from_url(url)
    sping = redis.Redis.from_url(url)
    rows["ping/asyncio"] = Row("ping", "asyncio", "redis-py-asyncio-ping", "redis-py", None,
                               "await r.ping() (redis.asyncio)")
    rows["ping/blocking"] = Row("ping", "blocking", "redis-py-blocking-ping", "redis-py", None,
                                "r.ping() (redis.Redis)")
    rows["hop/asyncio"] = Row("hop", "asyncio", "fencelock-asyncio-hop", "fencelock", None,
                              "await _native._hop() (the bridge alone)")

    acs = [cls() for cls in ASYNC]
    bcs = [cls() for cls in BLOCKING]
    for c in acs:
        loop.run_until_complete(c.open(setup))
    for c in bcs:
        c.open(setup)

    # Warm-up: connections opened, scripts loaded, code paths taken once.
    loop.run_until_complete(async_pings(aping, 0.05))
    loop.run_until_complete(async_hops(0.05))
    blocking_pings(sping, 0.05)
    for c in acs:
        loop.run_until_complete(async_cycles(c.new_worker(f"bench:{RUN}:{c.key}:warm"), 0.05))
    for c in bcs:
        blocking_cycles(c.new_worker(f"bench:{RUN}:{c.key}:warm"), 0.05)

    d, w, hold = args.duration, args.workers, args.hold
    for rnd in range(args.rounds):
        rows["ping/asyncio"].rounds.append({"per_s": loop.run_until_complete(async_pings(aping, d))})
        rows["ping/blocking"].rounds.append({"per_s": blocking_pings(sping, d)})
        hops = loop.run_until_complete(async_hops(d))
        rows["hop/asyncio"].rounds.append(
            {"per_s": hops, "per_ping": hops / rows["ping/asyncio"].rounds[-1]["per_s"]})
        for c in rotated(acs, rnd):
            r = row("uncontended", "asyncio", c)
            name = f"bench:{RUN}:{c.key}:u{rnd}"
            try:
                r.rounds.append({"per_s": loop.run_until_complete(async_cycles(c.new_worker(name), d))})
            except Exception as e:
                r.error = f"{type(e).__name__}: {e}"
        for c in rotated(bcs, rnd):
            r = row("uncontended", "blocking", c)
            name = f"bench:{RUN}:{c.key}:u{rnd}"
            try:
                r.rounds.append({"per_s": blocking_cycles(c.new_worker(name), d)})
            except Exception as e:
                r.error = f"{type(e).__name__}: {e}"
        for c in rotated(acs, rnd):
            r = row("contended", "asyncio", c)
            name = f"bench:{RUN}:{c.key}:c{rnd}"
            try:
                start, end, recs = loop.run_until_complete(async_contended(c, name, w, hold, d))
                r.rounds.append(contention_figures(start, end, recs, w))
            except Exception as e:
                r.error = f"{type(e).__name__}: {e}"
        # Each uncontended rate per PING of its own kind in the same round:
        # a load that comes and goes on the machine moves both alike.
        for r in rows.values():
            if r.group == "uncontended" and len(r.rounds) == rnd + 1:
                r.rounds[-1]["per_ping"] = (r.rounds[-1]["per_s"]
                                            / rows[f"ping/{r.mode}"].rounds[-1]["per_s"])
        for c in rotated(bcs, rnd):
            r = row("contended", "blocking", c)
            name = f"bench:{RUN}:{c.key}:c{rnd}"
            try:
                if args.blocking_workers == "processes":
                    start, end, recs = process_contended(c, setup, name, w, hold, d)
                else:
                    start, end, recs = thread_contended(c, name, w, hold, d)
                r.rounds.append(contention_figures(start, end, recs, w))
            except Exception as e:
                r.error = f"{type(e).__name__}: {e}"

    for c in acs:
        loop.run_until_complete(c.close())
    for c in bcs:
        c.close()
    loop.run_until_complete(aping.aclose())
    sping.close()
    loop.close()
    return rows


# --------------------------------------------------------------------------
# Placement and output


def extension_build() -> str:
    """``"debug"`` when fencelock's extension carries DWARF debug info (a
    dev-profile build, as ``maturin develop`` without ``--release`` makes:
    its figures are not the package's), else ``"release"``."""
    import struct

    from fencelock import _native

    try:
        with open(_native.__file__, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # ELF64 only
                return "unknown"
            shoff, = struct.unpack_from("<Q", head, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
            f.seek(shoff)
            table = f.read(shentsize * shnum)
            names_off, names_size = struct.unpack_from("<QQ", table, shstrndx * shentsize + 0x18)
            f.seek(names_off)
            names = f.read(names_size)
    except (OSError, struct.error):
        return "unknown"
    return "debug" if b".debug_info\x00" in names else "release"


def cpus_text(cpus: Optional[list[int]]) -> str:
    return "?" if cpus is None else "{" + ",".join(map(str, cpus)) + "}"


def pin_process(cpu: int) -> None:
    """Pins every thread of this process (there is one so far) to ``cpu``;
    threads started later inherit it."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {cpu})


def report(args: argparse.Namespace, rows: dict[str, Row], meta: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {**meta, "ping": {}, "hop": {}, "uncontended": [], "contended": []}
    for r in rows.values():
        entry: dict[str, Any] = {
            "mode": r.mode, "library": r.library, "how": r.how, "rounds": r.rounds,
        }
        if r.fenced is not None:
            entry["fenced"] = r.fenced
        if r.error:
            entry["error"] = r.error
        if r.group == "ping":
            entry["per_s"] = r.median("per_s")
            out["ping"][r.mode] = entry
        elif r.group == "hop":
            entry["per_s"] = r.median("per_s")
            entry["per_ping"] = r.median("per_ping")
            out["hop"][r.mode] = entry
        elif r.group == "uncontended":
            entry["cycles_per_s"] = r.median("per_s")
            entry["cycles_per_ping"] = r.median("per_ping")
            out["uncontended"].append(entry)
        else:
            for m in ("acquisitions_per_s", "utilization", "handover_p50_ms", "handover_p99_ms",
                      "jain"):
                entry[m] = r.median(m)
            entry["overlaps"] = sum(x["overlaps"] for x in r.rounds)
            out["contended"].append(entry)
    return out


def fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: dict[str, Row], res: dict[str, Any], args: argparse.Namespace) -> None:
    p = print
    p(f"fencelock bench: {args.rounds} round(s) x {args.duration:g} s per contestant, "
      "interleaved; medians (min..max over rounds)")
    p(f"redis-server {res['server']['version']} at {res['server']['url']}"
      f" ({'private' if res['server']['private'] else 'given by --url'})")
    pl = res["placement"]
    p(f"CPUs: bench on {cpus_text(pl['bench_cpus'])}, redis-server on "
      f"{cpus_text(pl['redis_cpus'])} of {pl['online_cpus']} online: "
      f"{pl['description']}")
    p(f"Python {res['python']} ({args.loop} event loop); fencelock {res['versions']['fencelock']}"
      f" ({res['extension_build']} build), redis-py {res['versions']['redis']}, "
      f"python-redis-lock {res['versions']['redis_lock']}")
    p("")
    p("Redis round trip (redis-py PING)                          PING/s  range")
    for m in ("asyncio", "blocking"):
        r = rows[f"ping/{m}"]
        lo, hi = r.span("per_s")
        p(f"  {m:<9} {r.how:<44} {fmt(r.median('per_s'), '7,.0f')}  "
          f"{fmt(lo, ',.0f')}..{fmt(hi, ',.0f')}")
    p("")
    p("fencelock's asyncio bridge alone (no Redis)                hops/s  range"
      "            per PING (same round)")
    r = rows["hop/asyncio"]
    lo, hi = r.span("per_s")
    p(f"  {'asyncio':<9} {r.how:<44} {fmt(r.median('per_s'), '7,.0f')}  "
      f"{fmt(lo, ',.0f'):>6}..{fmt(hi, ',.0f'):<7}  {fmt(r.median('per_ping'), '.2f')}")
    p("")
    p("Uncontended: 1 worker, acquire+release              fenced  cycles/s  range"
      "            per PING (same round)")
    for e, r in zip(res["uncontended"], [r for r in rows.values() if r.group == "uncontended"]):
        lo, hi = r.span("per_s")
        fenced = "yes" if r.fenced else "no"
        label = f"{r.mode:<9} {r.library:<17}"
        if r.error:
            p(f"  {label:<50} {fenced:<6}  FAILED: {r.error}")
            continue
        p(f"  {label:<50} {fenced:<6} {fmt(e['cycles_per_s'], '8,.0f')}  "
          f"{fmt(lo, ',.0f'):>6}..{fmt(hi, ',.0f'):<7}  {fmt(e['cycles_per_ping'], '.2f')}")
    p("")
    p(f"Contended: {args.workers} workers on one name, each holding {args.hold * 1e3:g} ms "
      f"(asyncio: {args.workers} tasks on one loop; blocking: {args.workers} "
      f"{args.blocking_workers})")
    p("                                       acq/s  utilization  hand-over p50   p99 ms  Jain"
      "   overlaps")
    for e, r in zip(res["contended"], [r for r in rows.values() if r.group == "contended"]):
        label = f"{r.mode:<9} {r.library:<17}"
        if r.error:
            p(f"  {label:<34} FAILED: {r.error}")
            continue
        p(f"  {label:<34} {fmt(e['acquisitions_per_s'], '6,.0f')}  "
          f"{fmt(None if e['utilization'] is None else e['utilization'] * 100, '9.1f')} %  "
          f"{fmt(e['handover_p50_ms'], '9.3f')} {fmt(e['handover_p99_ms'], '9.3f')}  "
          f"{fmt(e['jain'], '5.3f')}  {e['overlaps']}")
    p("")
    p("How each is used:")
    for r in rows.values():
        if r.group == "uncontended":
            p(f"  {r.mode:<9} {r.library:<17} {r.how}")
    p(f"  (contended: redis-py's Lock polls every {args.poll * 1e3:g} ms; fencelock wait_mode "
      f"{args.wait_mode or 'notify (default)'}; python-redis-lock waits on BLPOP)")
    p("")
    p("hand-over: from one holder calling release to the next holder's acquire returning")
    p("utilization: share of wall time some worker held the lock (grant received .. release "
      "called)")
    p("Jain: fairness of the workers' acquisition counts (1 = equal, 1/workers = one took all)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=2.0,
                    help="seconds per contestant per round (default 2)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default 5); medians reported")
    ap.add_argument("--url", help="a Redis URL to use instead of a private redis-server")
    ap.add_argument("--workers", type=int, default=8, help="contended workers (default 8)")
    ap.add_argument("--hold", type=float, default=0.001,
                    help="seconds each contended holder holds the lock (default 0.001)")
    ap.add_argument("--poll", type=float, default=0.001,
                    help="redis-py Lock's sleep between tries when contended (default 0.001)")
    ap.add_argument("--wait-mode", choices=["poll", "notify", "fair"],
                    help="fencelock's wait_mode (default: the library's, notify)")
    ap.add_argument("--blocking-workers", choices=["threads", "processes"], default="threads",
                    help="contended blocking workers as threads of this process (default) or "
                         "one process each")
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                    help="the event loop (default asyncio's own)")
    ap.add_argument("--pin", action="store_true",
                    help="pin redis-server to one CPU and the bench to --client-cpu")
    ap.add_argument("--client-cpu", choices=["same", "other"], default="other",
                    help="with --pin: the bench on the same CPU as redis-server or another "
                         "(default other)")
    ap.add_argument("--redis-server", default="redis-server", help="the redis-server binary")
    ap.add_argument("--json", action="store_true", help="print the results as JSON, not the table")
    ap.add_argument("--save", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args()
    if args.duration <= 0 or args.rounds < 1 or args.workers < 1 or args.hold < 0 or args.poll < 0:
        ap.error("--duration > 0; --hold, --poll >= 0; --rounds, --workers >= 1")

    # Placement first: before any thread (fencelock's runtime, redis-py's)
    # exists, so every later thread inherits it.
    allowed = sorted(os.sched_getaffinity(0))
    server_cpu = client_cpu = None
    if args.pin:
        server_cpu = allowed[-1]
        if args.client_cpu == "same":
            client_cpu = server_cpu
        else:
            others = [c for c in allowed if c != server_cpu]
            if not others:
                ap.error(f"--client-cpu other needs two CPUs; this process may use {allowed}")
            client_cpu = others[0]
        pin_process(client_cpu)

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    server = None
    try:
        if args.url:
            url = args.url
        else:
            server = RedisServer(args.redis_server, server_cpu)
            url = server.url
        import fencelock
        import redis
        import redis_lock

        info = redis.Redis.from_url(url).info("server")
        rows = run(args, url)
        redis_cpus = (sorted(os.sched_getaffinity(server.process.pid))
                      if server and server.process else None)
        bench_cpus = sorted(os.sched_getaffinity(0))
        if args.pin and server is None:
            description = "the bench pinned; redis-server's placement is not known here"
        elif args.pin:
            where = "same CPU" if args.client_cpu == "same" else "different CPUs"
            description = f"pinned ({where})"
        else:
            description = "unpinned (the scheduler places both)"
        meta = {
            "config": {
                "duration_s": args.duration, "rounds": args.rounds, "workers": args.workers,
                "hold_s": args.hold, "redis_py_poll_s": args.poll,
                "fencelock_wait_mode": args.wait_mode or "notify (default)",
                "blocking_workers": args.blocking_workers, "loop": args.loop,
            },
            "server": {"url": redact(url),
                       "private": server is not None,
                       "version": info.get("redis_version", "?")},
            "placement": {
                "bench_cpus": bench_cpus, "redis_cpus": redis_cpus,
                "online_cpus": os.cpu_count(), "pinned": args.pin,
                "client_cpu": args.client_cpu if args.pin else None,
                "description": description,
            },
            "python": sys.version.split()[0],
            "extension_build": extension_build(),
            "versions": {"fencelock": fencelock.__version__, "redis": redis.__version__,
                         "redis_lock": redis_lock.__version__},
        }
        res = report(args, rows, meta)
        if res["extension_build"] == "debug":
            print("bench: fencelock's extension is a debug build (maturin develop without "
                  "--release): its figures are not the package's", file=sys.stderr)
        if args.save:
            with open(args.save, "w") as f:
                json.dump(res, f, indent=2)
        if args.json:
            json.dump(res, sys.stdout, indent=2)
            print()
        else:
            print_table(rows, res, args)
        failed = [r for r in rows.values() if r.error]
        overlapping = [r for r in rows.values()
                       if any(x.get("overlaps") for x in r.rounds)]
        for r in failed:
            print(f"bench: {r.group} {r.key} failed: {r.error}", file=sys.stderr)
        for r in overlapping:
            print(f"bench: {r.group} {r.key}: two holders at once", file=sys.stderr)
        return 1 if failed or overlapping else 0
    finally:
        if server is not None:
            server.stop()


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))


if __name__ == "__main__":
    sys.exit(main())
