"""Locks between real processes: workers that exclude each other, a holder
frozen by SIGSTOP past its lease, and ``multiprocessing`` children started
with ``fork`` and with ``spawn``.

Workers log ``enter PID FENCE`` / ``exit PID FENCE`` to one Redis list (RPUSH
is atomic, so the list's order is the order the sections began and ended);
an ``enter`` while another worker's section is open is an overlap. The
negative control runs the same workers without the lock and sees overlaps,
so the check can fail.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest

import fencelock
from _procs import Worker, default_keys, overlaps

ROUNDS = 25
HOLD = 0.003


@pytest.fixture(params=["redis", pytest.param("etcd", marks=pytest.mark.etcd)])
def lock_url(request: pytest.FixtureRequest) -> str:
    """The lock's server: Redis, then etcd (logs and fenced data stay on
    ``redis_server``)."""
    return str(request.getfixturevalue(f"{request.param}_server").url)


def _is_redis(url: str) -> bool:
    return url.startswith("redis")


def _fences_in_order(events: list[str]) -> list[int]:
    return [int(e.split()[2]) for e in events if e.startswith("enter ")]


def _run_workers(
    url: str, log_url: str, name: str, list_key: str, mode: str, api: str, n: int = 2
) -> list[str]:
    workers = [
        Worker("exclusion.py", url, name, list_key, str(ROUNDS), str(HOLD), mode, api, log_url)
        for _ in range(n)
    ]
    try:
        for w in workers:
            w.expect("ready")
        for w in workers:
            w.send("go")
        for w in workers:
            w.expect("done", deadline=60)
            assert w.wait() == 0, w.describe()
    finally:
        for w in workers:
            w.kill()
    return [w.describe() for w in workers]


@pytest.mark.parametrize("api", ["async", "blocking"])
def test_two_processes_exclude_each_other(
    lock_url: str, redis_server: Any, redis_py: Any, lock_name: str, api: str
) -> None:
    list_key = f"log:{lock_name}"
    _run_workers(lock_url, redis_server.url, lock_name, list_key, "lock", api)
    events = redis_py.lrange(list_key, 0, -1)
    assert len(events) == 2 * 2 * ROUNDS
    assert len({e.split()[1] for e in events}) == 2, "both workers ran"
    assert overlaps(events) == 0, f"sections interleaved: {events}"
    fences = _fences_in_order(events)
    assert all(a < b for a, b in zip(fences, fences[1:])), f"fences not increasing: {fences}"
    # No lock left behind: free for anyone at once.
    with fencelock.connect_blocking(lock_url) as c:
        assert c.acquire(lock_name, wait=0).release() is True


@pytest.mark.parametrize("api", ["async", "blocking"])
def test_negative_control_workers_without_the_lock_interleave(
    redis_server: Any, redis_py: Any, lock_name: str, api: str
) -> None:
    """The same workers with the lock replaced by nothing: the overlap check
    sees their sections interleave."""
    list_key = f"log:{lock_name}"
    _run_workers(redis_server.url, redis_server.url, lock_name, list_key, "none", api)
    events = redis_py.lrange(list_key, 0, -1)
    assert len(events) == 2 * 2 * ROUNDS
    assert overlaps(events) > 0, f"the unlocked workers never overlapped: {events}"


# --- a holder frozen past its lease ------------------------------------------


@pytest.mark.parametrize("api", ["async", "blocking"])
def test_paused_holder_loses_and_its_stale_write_is_refused(
    lock_url: str, redis_server: Any, redis_py: Any, blocking_client: Any, lock_name: str, api: str
) -> None:
    """A holder (1 s lease on Redis, 2 s on etcd, whose leases are whole
    seconds) frozen by SIGSTOP; another client takes the lock (higher fence)
    and writes; the holder resumes: it learns the loss (``LockLost``), and
    its write sent after waking is refused at the fenced hash, which keeps
    the newer value. The plain HSET it sends next to it (the control) does
    overwrite the newer value: the stale write really came after the new
    holder's."""
    hkey, ukey = f"data:{lock_name}", f"plain:{lock_name}"
    ttl = "1.0" if _is_redis(lock_url) else "2.0"
    locks = fencelock.connect_blocking(lock_url)
    data = blocking_client  # the fenced hash's Redis
    try:
        with Worker("paused_holder.py", lock_url, lock_name, hkey, ukey, ttl, api, redis_server.url) as a:
            _, fence_text, a_ok = a.expect("holding").split()
            a_fence = int(fence_text)
            assert a_ok == "True"
            assert redis_py.hget(hkey, "fence") == str(a_fence)

            a.stop()
            try:
                # B waits (the library polls/queues) until A's lease is gone.
                b = locks.acquire(lock_name, ttl=30.0, wait=15.0)
                assert b.fence > a_fence
                assert data.fenced_hash(hkey).write(b, "B") is True
                assert redis_py.hget(ukey, "value") == "A"
                redis_py.hset(ukey, "value", "B")
            finally:
                a.cont()

            if api == "async":
                # The body may see the clock jump before the loss cancels it.
                late = float(a.expect("body-cancelled", skip=["woke"]).split()[1])
                assert late < 1.0, f"the body ran on {late}s after waking before its loss cancelled it"
                _, fence, reason = a.expect("lost").split()
                assert int(fence) == a_fence
                assert reason in {"expired", "taken_over", "deadline_passed"}, reason
                assert a.expect("stale-write").split()[1] == "False"
            else:
                a.send("wake")
                assert a.expect("stale-write").split()[1] == "False"
                _, fence, _reason = a.expect("extend-lost").split()
                assert int(fence) == a_fence
                _, fence, _reason = a.expect("lost").split()
                assert int(fence) == a_fence
            assert a.expect("lease-lost").split()[1] == "True"
            assert a.expect("release").split()[1] == "False", "a lost lease releases nothing"
            a.expect("end")
            assert a.wait() == 0, a.describe()

        state = data.fenced_hash(hkey).read()
        assert state == fencelock.HashState("B", b.fence, b.holder_id), state
        # The control: without fencing, the stale write overwrote B's value.
        assert redis_py.hget(ukey, "value") == "stale-A"
        # B still holds its lock: A's loss and release touched nothing of B's.
        if _is_redis(lock_url):
            assert redis_py.get(default_keys(lock_name)["lock"]) == f"{b.token}:{b.fence}"
        with pytest.raises(fencelock.Contended):
            locks.acquire(lock_name, wait=0)
        b.extend()
        assert b.release() is True
        assert locks.acquire(lock_name, wait=0).release() is True
    finally:
        locks.close()


# --- multiprocessing ------------------------------------------------------------


def _mp_exclusion(method: str, url: str, redis_py: Any, name: str) -> None:
    from workers.mp_exclusion import run

    ctx: Any = multiprocessing.get_context(method)
    list_key = f"log:{name}"
    ready, go = ctx.Semaphore(0), ctx.Event()
    procs = [
        ctx.Process(target=run, args=(url, name, list_key, ROUNDS, HOLD, ready, go), daemon=True)
        for _ in range(3)
    ]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            assert ready.acquire(timeout=30), "a child did not connect"
        go.set()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0, f"child {p.pid} exited with {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    events = redis_py.lrange(list_key, 0, -1)
    assert len(events) == 3 * 2 * ROUNDS
    assert len({e.split()[1] for e in events}) == 3
    assert overlaps(events) == 0, f"sections interleaved: {events}"
    fences = _fences_in_order(events)
    assert all(a < b for a, b in zip(fences, fences[1:])), f"fences not increasing: {fences}"


def test_multiprocessing_fork_excludes(
    redis_server: Any, redis_py: Any, blocking_client: Any, lock_name: str
) -> None:
    """``fork`` children of a parent that has a connected client and a
    running runtime (and holds a lease on another name meanwhile) connect
    in the child and exclude each other; the parent's lease is untouched."""
    other = f"{lock_name}-parent"
    held = blocking_client.acquire(other, ttl=10.0, wait=0)
    _mp_exclusion("fork", redis_server.url, redis_py, lock_name)
    assert not held.lost
    assert held.release() is True


def test_multiprocessing_spawn_excludes(redis_server: Any, redis_py: Any, lock_name: str) -> None:
    _mp_exclusion("spawn", redis_server.url, redis_py, lock_name)
