"""Compatibility with the guide's Python lock (redis-py asyncio, the guide's
commands and scripts verbatim, below as :class:`GuideLock`).

fencelock with ``layout="guide"`` and counter fences uses the guide's keys
(``lock:NAME`` holding the bare token, ``lock:NAME:fence`` a plain counter;
``KeyLayout::Guide`` in ``crates/fencelock/src/keys.rs``, README "Key
layouts"), so guide workers and fencelock workers on the same names exclude
each other and draw their fences from one counter. The negative control:
fencelock's default layout (``lock:{NAME}``) does not exclude guide workers.

The guide's acquire is its two commands, ``INCR`` then ``SET NX PX`` (the
guide's known race: a fence drawn before a failed or late ``SET`` is not
ordered with other grants), so the tests check what holds even so: no two
holders at once, each worker's fences strictly increasing, and no fence
issued twice (one counter).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Optional
from uuid import uuid4

import pytest
import redis.asyncio

import fencelock
from _procs import default_keys, guide_keys

# --- the guide's lock ---------------------------------------------------------

RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
EXTEND = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
#: The guide's fenced write: a hash with ``value`` and ``fence``, refused
#: only below the stored fence (the guide's ``>=``).
FENCED_WRITE = """
local current = tonumber(redis.call('hget', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < current then return 0 end
redis.call('hset', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1
"""


class GuideLock:
    """The guide's lock on ``lock:NAME``, as its Python code writes it."""

    def __init__(self, r: "redis.asyncio.Redis", name: str, ttl_ms: int = 10_000) -> None:
        self.r = r
        self.key = f"lock:{name}"
        self.ttl_ms = ttl_ms
        self.token: Optional[str] = None
        self.fence: Optional[int] = None

    async def try_acquire(self) -> bool:
        token = uuid4().hex
        fence = await self.r.incr(f"{self.key}:fence")
        ok = await self.r.set(self.key, token, nx=True, px=self.ttl_ms)
        if ok:
            self.token, self.fence = token, int(fence)
        return bool(ok)

    async def acquire(self, deadline: float = 30.0) -> int:
        end = time.monotonic() + deadline
        while not await self.try_acquire():
            if time.monotonic() > end:
                raise TimeoutError(f"guide lock {self.key} not acquired")
            await asyncio.sleep(random.uniform(0.002, 0.02))
        assert self.fence is not None
        return self.fence

    async def release(self) -> bool:
        assert self.token is not None
        return int(await self.r.eval(RELEASE, 1, self.key, self.token)) == 1

    async def extend(self) -> bool:
        assert self.token is not None
        return int(await self.r.eval(EXTEND, 1, self.key, self.token, self.ttl_ms)) == 1

    async def fenced_write(self, hkey: str, value: str) -> bool:
        assert self.fence is not None
        return int(await self.r.eval(FENCED_WRITE, 1, hkey, self.fence, value)) == 1


@pytest.fixture
async def r(redis_server: Any) -> AsyncIterator["redis.asyncio.Redis"]:
    conn = redis.asyncio.Redis(host="127.0.0.1", port=redis_server.port, decode_responses=True)
    try:
        yield conn
    finally:
        await conn.aclose()


GUIDE = dict(layout="guide", fence_mode="counter")


# --- step by step -------------------------------------------------------------


async def test_guide_layout_keys_and_mutual_exclusion_step_by_step(
    client: Any, r: Any, lock_name: str
) -> None:
    keys = guide_keys(lock_name)
    assert keys["lock"] == f"lock:{lock_name}" and keys["fence"] == f"lock:{lock_name}:fence"
    guide = GuideLock(r, lock_name)

    # A guide worker holds: fencelock (guide layout) is refused.
    assert await guide.try_acquire()
    assert guide.fence == 1
    with pytest.raises(fencelock.Contended):
        await client.acquire(lock_name, wait=0, **GUIDE)
    assert await guide.release()

    # fencelock holds: the guide's SET NX fails; the key is the guide's key
    # holding the bare token; the fence is the counter's next value.
    lease = await client.acquire(lock_name, ttl=10.0, wait=0, **GUIDE)
    assert lease.fence == 2
    assert await r.get(keys["lock"]) == lease.token
    assert await r.get(keys["fence"]) == "2"
    assert 0 < await r.pttl(keys["lock"]) <= 10_000
    assert await r.exists(default_keys(lock_name)["lock"]) == 0, "nothing in the default layout"
    assert not await guide.try_acquire()  # (its INCR drew fence 3 anyway)
    # The guide's release and extend with another token touch nothing.
    assert not await guide.release()
    assert not await guide.extend()
    assert await r.get(keys["lock"]) == lease.token
    # fencelock's extend keeps the guide's value.
    await lease.extend()
    assert await r.get(keys["lock"]) == lease.token
    assert await lease.release() is True
    assert await r.exists(keys["lock"]) == 0

    # The guide worker again: the counter went on (2, then the failed 3).
    assert await guide.try_acquire()
    assert guide.fence == 4
    hkey = f"data:{lock_name}"
    assert await guide.fenced_write(hkey, "by-guide")
    assert await guide.release()

    # fencelock on the guide's hash: its next fence writes over the guide
    # worker's, whose fence is then refused by the guide's own script.
    lease = await client.acquire(lock_name, ttl=10.0, wait=0, **GUIDE)
    assert lease.fence == 5
    h = client.fenced_hash(hkey)
    assert await h.write(lease, "by-fencelock") is True
    state = await h.read()
    assert state == fencelock.HashState("by-fencelock", 5, lease.holder_id)
    assert not await guide.fenced_write(hkey, "stale-guide")
    assert await lease.release() is True


async def test_negative_control_default_layout_ignores_guide_workers(
    client: Any, r: Any, lock_name: str
) -> None:
    """fencelock's default layout uses ``lock:{NAME}``: it takes a name a
    guide worker holds, and the guide worker takes a name it holds."""
    guide = GuideLock(r, lock_name)
    assert await guide.try_acquire()
    lease = await client.acquire(lock_name, ttl=10.0, wait=0, fence_mode="counter")
    assert await r.get(default_keys(lock_name)["lock"]) == f"{lease.token}:{lease.fence}"
    assert lease.fence == 1 == guide.fence, "two counters: the same fence twice"
    assert await guide.release()
    assert await guide.try_acquire(), "the guide took a name fencelock holds"
    assert await guide.release()
    assert await lease.release() is True


# --- mixed workers ----------------------------------------------------------------


@dataclass
class Run:
    inside: int = 0
    overlaps: int = 0
    grants: list[tuple[str, int]] = field(default_factory=list)  # (worker, fence) in grant order
    stop_on_overlap: bool = False


async def _section(run: Run, who: str, fence: int, hold: float) -> None:
    run.inside += 1
    if run.inside > 1:
        run.overlaps += 1
    run.grants.append((who, fence))
    try:
        await asyncio.sleep(hold)
    finally:
        run.inside -= 1


async def _guide_worker(run: Run, r: Any, name: str, who: str, rounds: int, hold: float) -> None:
    g = GuideLock(r, name)
    for _ in range(rounds):
        if run.stop_on_overlap and run.overlaps:
            return
        fence = await g.acquire()
        try:
            await _section(run, who, fence, hold)
        finally:
            assert await g.release(), f"{who}: the guide's release found another token"
        await asyncio.sleep(random.uniform(0.005, 0.02))  # other work


async def _fencelock_worker(
    run: Run, client: Any, name: str, who: str, rounds: int, hold: float, opts: dict[str, Any]
) -> None:
    for _ in range(rounds):
        if run.stop_on_overlap and run.overlaps:
            return
        async with client.lock(name, ttl=10.0, wait=30.0, **opts) as lease:
            await _section(run, who, lease.fence, hold)
        await asyncio.sleep(random.uniform(0.005, 0.02))  # other work


async def _mixed(
    redis_url: str, r: Any, name: str, opts: dict[str, Any], rounds: int, stop_on_overlap: bool = False
) -> Run:
    run = Run(stop_on_overlap=stop_on_overlap)
    clients = [await fencelock.connect(redis_url) for _ in range(3)]
    try:
        tasks = [_guide_worker(run, r, name, f"guide-{i}", rounds, 0.002) for i in range(3)]
        tasks += [
            _fencelock_worker(run, c, name, f"fencelock-{i}", rounds, 0.002, opts)
            for i, c in enumerate(clients)
        ]
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    finally:
        for c in clients:
            await c.close()
    return run


@pytest.mark.parametrize("wait_mode", ["poll", "notify"])
async def test_guide_and_fencelock_workers_exclude_each_other(
    redis_url: str, r: Any, lock_name: str, wait_mode: str
) -> None:
    rounds = 15
    run = await _mixed(redis_url, r, lock_name, dict(GUIDE, wait_mode=wait_mode), rounds)
    assert run.overlaps == 0, f"guide and fencelock holders overlapped: {run.grants}"
    assert len(run.grants) == 6 * rounds

    # Both sides held the lock. Polling, they take turns: the side that held
    # first holds again after the other. Queued (notify) waiters are not
    # woken by the guide's bare DEL (they look again every third of their
    # waiter lease) and fencelock hands the lock over among its own
    # waiters, so there one side may run through all its rounds while the
    # other waits, refused: exclusion is still what is checked.
    sides = [who.split("-")[0] for who, _ in run.grants]
    switches = sum(1 for a, b in zip(sides, sides[1:]) if a != b)
    assert switches >= (4 if wait_mode == "poll" else 1), f"the sides did not interleave: {sides}"

    # Each worker's fences strictly increase.
    for who in {w for w, _ in run.grants}:
        own = [f for w, f in run.grants if w == who]
        assert all(a < b for a, b in zip(own, own[1:])), f"{who}: {own}"
    # One counter: no fence issued twice, all within the counter's range,
    # and the fencelock side's fences are interleaved with the guide's.
    fences = [f for _, f in run.grants]
    assert len(set(fences)) == len(fences), f"a fence was granted twice: {run.grants}"
    counter = int(await r.get(guide_keys(lock_name)["fence"]))
    assert max(fences) <= counter
    fl = sorted(f for w, f in run.grants if w.startswith("fencelock"))
    gd = sorted(f for w, f in run.grants if w.startswith("guide"))
    if wait_mode == "poll":
        assert fl[0] < gd[-1] and gd[0] < fl[-1], (fl, gd)
    # A fencelock grant draws its fence from the counter in the same script
    # that takes the lock, so it is above every fence granted before it,
    # the guide workers' included (a guide grant may not be: its INCR can
    # come long before its SET, the guide's race).
    for i, (who, fence) in enumerate(run.grants):
        if who.startswith("fencelock") and i:
            assert fence > max(f for _, f in run.grants[:i]), (i, run.grants)
    assert await r.exists(guide_keys(lock_name)["lock"]) == 0


async def test_negative_control_default_layout_workers_overlap_guide_workers(
    redis_url: str, r: Any, lock_name: str
) -> None:
    """The same mixed run with fencelock's default layout: the overlap check
    sees guide and fencelock holders at once (run until the first overlap,
    within a bounded number of rounds)."""
    run = await _mixed(redis_url, r, lock_name, dict(fence_mode="counter"), 40, stop_on_overlap=True)
    assert run.overlaps > 0, "the default layout excluded guide workers?"
