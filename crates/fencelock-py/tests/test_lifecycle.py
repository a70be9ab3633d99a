"""Lifecycle of clients, leases and the futures between asyncio and the
extension's runtime: closing, cancellation at loop shutdown, futures
dropped while their Rust side runs, a release cancelled mid-way, and the
interpreter's exit with a lease held or a wait pending.

"Nothing left" is checked in Redis: the lock key is gone (or, where said,
held by the expected holder) and the name's wait queue is empty. Every wait
for something to happen is a poll against a deadline.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import textwrap
import warnings
from typing import Any, Iterator, Literal

import pytest

import fencelock
from _procs import default_keys, poll, run_python
from servers import RedisServer, async_wait_until

#: A ttl long enough that expiry never explains a key's disappearance
#: within a test: a lock that is gone was released.
LONG_TTL = 60.0


def lock_held(redis_py: Any, name: str) -> bool:
    return bool(redis_py.exists(default_keys(name)["lock"]) == 1)


def queue_len(redis_py: Any, name: str) -> int:
    return int(redis_py.zcard(default_keys(name)["queue"]))


def script_calls(redis_py: Any) -> int:
    """Scripts the server has run so far (EVALSHA and EVAL)."""
    stats = redis_py.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def nothing_left(redis_py: Any, name: str) -> bool:
    return not lock_held(redis_py, name) and queue_len(redis_py, name) == 0


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own, which it may pause (SIGSTOP)."""
    server = RedisServer.start()
    try:
        yield server
    finally:
        server.process.resume()
        server.stop()


@pytest.fixture
def own_redis_py(own_redis: RedisServer) -> Iterator[Any]:
    import redis

    r = redis.Redis(host="127.0.0.1", port=own_redis.port, decode_responses=True)
    try:
        yield r
    finally:
        r.close()


# --- close --------------------------------------------------------------------


async def test_close_then_use_raises_client_closed(redis_url: str, lock_name: str) -> None:
    client = await fencelock.connect(redis_url)
    assert not client.closed
    await client.close()
    assert client.closed
    with pytest.raises(fencelock.ClientClosed):
        await client.acquire(lock_name, wait=0)
    with pytest.raises(fencelock.ClientClosed):
        async with client.lock(lock_name, wait=0):
            pytest.fail("entered a lock of a closed client")
    with pytest.raises(fencelock.ClientClosed):
        await client.fenced_hash(f"data:{lock_name}").read()
    await client.close()  # idempotent
    assert client.closed


def test_blocking_close_then_use_raises_client_closed(redis_url: str, lock_name: str) -> None:
    client = fencelock.connect_blocking(redis_url)
    client.close()
    assert client.closed
    with pytest.raises(fencelock.ClientClosed):
        client.acquire(lock_name, wait=0)
    with pytest.raises(fencelock.ClientClosed):
        with client.lock(lock_name, wait=0):
            pytest.fail("entered a lock of a closed client")
    with pytest.raises(fencelock.ClientClosed):
        client.fenced_hash(f"data:{lock_name}").read()
    client.close()
    assert client.closed


async def test_async_with_client_closes(redis_url: str, lock_name: str) -> None:
    async with await fencelock.connect(redis_url) as client:
        async with client.lock(lock_name, wait=0):
            pass
    assert client.closed
    async with fencelock.connect(redis_url) as client2:
        assert not client2.closed
    assert client2.closed
    with pytest.raises(fencelock.ClientClosed):
        await client2.acquire(lock_name, wait=0)


async def test_close_releases_held_leases(redis_url: str, redis_py: Any, client2: Any, lock_name: str) -> None:
    """Leases still held at ``close()`` are released by it (the pyi: "Releases
    every lease still held through this client"). The control: a lease of
    another, open client on another name is still held, so the check sees
    held locks."""
    names = [f"{lock_name}-{i}" for i in range(3)]
    client = await fencelock.connect(redis_url)
    leases = [await client.acquire(n, ttl=LONG_TTL, wait=0) for n in names]
    control = await client2.acquire(f"{lock_name}-control", ttl=LONG_TTL, wait=0)
    assert all(lock_held(redis_py, n) for n in names)
    await client.close()
    assert [lock_held(redis_py, n) for n in names] == [False] * 3, "close() left locks held"
    for lease in leases:
        assert lease.released or lease.lost
        assert lease.remaining() == 0.0
    # Free for anyone at once.
    for n in names:
        got = await client2.acquire(n, wait=0)
        assert await got.release() is True
    assert lock_held(redis_py, control.name)
    assert await control.release() is True


def test_blocking_close_releases_held_leases(redis_url: str, redis_py: Any, lock_name: str) -> None:
    client = fencelock.connect_blocking(redis_url)
    lease = client.acquire(lock_name, ttl=LONG_TTL, wait=0)
    assert lock_held(redis_py, lock_name)
    client.close()
    assert not lock_held(redis_py, lock_name)
    assert lease.released or lease.lost


# --- a wait cancelled as asyncio.run() ends -------------------------------------------


def _loop_runner(loop: str) -> Any:
    """``asyncio.run`` on the standard loop or on uvloop's."""
    factory = None
    if loop == "uvloop":
        factory = pytest.importorskip("uvloop").new_event_loop

    def run(main: Any) -> Any:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)

    return run


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("wait_mode", ["notify", "fair", "poll"])
def test_wait_cancelled_when_asyncio_run_ends(
    redis_url: str,
    redis_py: Any,
    blocking_client: Any,
    lock_name: str,
    loop: str,
    wait_mode: Literal["notify", "fair", "poll"],
) -> None:
    """``main`` starts an acquire of a held lock (``wait=None``) as a task
    and returns while it waits: ``asyncio.run`` cancels it and closes the
    loop. No crash; the waiter leaves no queue entry, and it never gets the
    lock (the holder's release leaves the key absent); the interpreter goes
    on and a new loop can lock the name."""
    holder = blocking_client.acquire(lock_name, ttl=LONG_TTL, wait=0)
    run = _loop_runner(loop)
    state: dict[str, Any] = {}

    async def main() -> None:
        client = await fencelock.connect(redis_url)
        state["client"] = client
        task = asyncio.ensure_future(client.acquire(lock_name, wait=None, wait_mode=wait_mode))
        state["task"] = task
        if wait_mode == "poll":
            # A polling waiter has no queue entry: wait until it has tried
            # (script calls on the server) twice more.
            before = script_calls(redis_py)
            await async_wait_until(lambda: script_calls(redis_py) >= before + 2, 10, "retried")
        else:
            await async_wait_until(lambda: queue_len(redis_py, lock_name) > 0, 10, "queued")
        assert not task.done()
        # return with the task pending

    run(main())
    assert state["task"].cancelled()
    poll(lambda: queue_len(redis_py, lock_name) == 0, 5, "the cancelled waiter left the queue")
    assert holder.release() is True
    assert not lock_held(redis_py, lock_name), "the lock went to the cancelled waiter"

    async def again() -> int:
        client = state["client"]  # the same client, in a new loop
        async with client.lock(lock_name, wait=0) as lease:
            fence = int(lease.fence)
        await client.close()
        return fence

    assert run(again()) > holder.fence
    assert nothing_left(redis_py, lock_name)


def test_native_future_outlives_its_loop(
    redis_url: str, redis_py: Any, blocking_client: Any, lock_name: str
) -> None:
    """The extension's own acquire future (not a task: ``asyncio.run`` does
    not cancel it) is still waiting when the loop closes. When the holder
    releases, the wait is granted to a future whose loop is gone: no crash,
    and the lock does not stay with that ghost (released, not left to its
    60 s ttl)."""
    holder = blocking_client.acquire(lock_name, ttl=LONG_TTL, wait=0)
    state: dict[str, Any] = {}

    async def main() -> None:
        client = await fencelock.connect(redis_url)
        state["client"] = client
        fut: Any = client._native.acquire(lock_name, {"wait": None, "ttl": LONG_TTL})
        await async_wait_until(lambda: queue_len(redis_py, lock_name) > 0, 10, "queued")
        assert not fut.done()

    asyncio.run(main())
    assert holder.release() is True

    def settled() -> bool:
        gc.collect()
        return nothing_left(redis_py, lock_name)

    try:
        try:
            poll(settled, 10, "the lock granted to a closed loop's future was released")
        except TimeoutError as e:
            # Where a ghost lease could live: a delivery queued for the
            # closed loop, or a delivery's failure printed and kept in
            # sys.last_value (whose traceback would hold its frame).
            raise AssertionError(
                f"{e}; lock value {redis_py.get(default_keys(lock_name)['lock'])!r}, "
                f"sys.last_value={getattr(sys, 'last_value', None)!r}"
            ) from None
        # The interpreter goes on: the name can be locked again.
        again = blocking_client.acquire(lock_name, wait=0)
        assert again.release() is True
    finally:
        # Let go of a ghost lease kept alive there, so it stops renewing.
        sys.last_type = sys.last_value = sys.last_traceback = None
        gc.collect()
        asyncio.run(state["client"].close())


# --- futures dropped while the Rust side runs -------------------------------------------


async def test_unawaited_acquire_coroutine_dropped(client: Any, redis_py: Any, lock_name: str) -> None:
    """``client.acquire(...)`` never awaited, dropped and collected: nothing
    was started, nothing is held."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "never awaited"
        aw = client.acquire(lock_name, ttl=LONG_TTL, wait=None)
        del aw
        gc.collect()
    assert nothing_left(redis_py, lock_name)
    async with client.lock(lock_name, wait=0):
        pass


@pytest.mark.parametrize("form", ["task", "native"])
async def test_dropped_future_while_waiting(
    client: Any, blocking_client: Any, redis_py: Any, lock_name: str, form: str
) -> None:
    """An acquire started on a held lock (``wait=None``) whose Python side is
    dropped at once (a task nobody keeps, or the extension's future itself),
    then ``gc.collect()``. The holder releases; the wait may be granted, but
    nothing may stay held: within a bounded wait (far below the 60 s ttl)
    the lock is free again and no queue entry is left; no crash."""
    holder = blocking_client.acquire(lock_name, ttl=LONG_TTL, wait=0)
    if form == "task":
        asyncio.ensure_future(client.acquire(lock_name, ttl=LONG_TTL, wait=None))
    else:
        client._native.acquire(lock_name, {"ttl": LONG_TTL, "wait": None})
    gc.collect()
    await async_wait_until(lambda: queue_len(redis_py, lock_name) > 0, 10, "queued")
    gc.collect()
    assert holder.release() is True

    def settled() -> bool:
        gc.collect()
        return nothing_left(redis_py, lock_name)

    await async_wait_until(settled, 10, "the dropped waiter's lock was released")
    async with client.lock(lock_name, wait=0) as lease:
        assert lease.fence > holder.fence


# --- a release cancelled mid-way ------------------------------------------------------------


async def _task_in_release(own_redis: RedisServer, client: Any, name: str) -> tuple[asyncio.Task[Any], dict[str, Any]]:
    """A task holding ``name`` in ``async with``; returns once the body has
    ended and the task is suspended in ``__aexit__``'s release, with Redis
    paused (the release cannot complete before the test acts)."""
    entered, proceed = asyncio.Event(), asyncio.Event()
    seen: dict[str, Any] = {"left_body": False}

    async def holder() -> None:
        async with client.lock(name, ttl=LONG_TTL, wait=0) as lease:
            seen["lease"] = lease
            entered.set()
            await proceed.wait()
            seen["left_body"] = True
        seen["exited"] = True

    task = asyncio.ensure_future(holder())
    await asyncio.wait_for(entered.wait(), 10)
    own_redis.process.pause()
    proceed.set()
    # The body's last statement ran and the task yielded: the only await
    # after the body is the release in __aexit__.
    for _ in range(1000):
        if seen["left_body"]:
            break
        await asyncio.sleep(0)
    assert seen["left_body"] and not task.done()
    where = _awaiting(task)
    assert any(w.endswith("_aio.py:_release") for w in where), where
    assert "exited" not in seen
    return task, seen


def _awaiting(task: "asyncio.Task[Any]") -> list[str]:
    """``FILE:FUNCTION`` of each coroutine the task is suspended in, outermost
    first (``Task.get_stack`` shows the outermost only)."""
    out = []
    coro: Any = task.get_coro()
    while coro is not None and getattr(coro, "cr_frame", None) is not None:
        out.append(f"{coro.cr_frame.f_code.co_filename}:{coro.cr_frame.f_code.co_name}")
        coro = coro.cr_await
    return out


async def test_release_shielded_from_cancellation(own_redis: RedisServer, own_redis_py: Any, lock_name: str) -> None:
    """The task is cancelled while ``__aexit__`` waits for the release
    (Redis paused, so the release is in flight): the cancellation propagates
    (never turned into ``LockLost``), and the lock is released anyway, by the
    time the task has ended."""
    client = await fencelock.connect(own_redis.url)
    try:
        assert own_redis_py.ping()
        task, seen = await _task_in_release(own_redis, client, lock_name)
        task.cancel()
        for _ in range(20):
            await asyncio.sleep(0)
        assert not task.done(), "the exit did not wait for the shielded release"
        own_redis.process.resume()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        assert "exited" not in seen
        assert seen["lease"].released
        assert not lock_held(own_redis_py, lock_name), "the cancelled release left the lock held"
    finally:
        own_redis.process.resume()
        await client.close()


async def test_second_cancellation_ends_the_exit_release_completes(
    own_redis: RedisServer, own_redis_py: Any, lock_name: str
) -> None:
    """Cancelled twice while releasing: the task ends at once (Redis still
    paused), and the extension completes the release once Redis answers."""
    client = await fencelock.connect(own_redis.url)
    try:
        task, _ = await _task_in_release(own_redis, client, lock_name)
        task.cancel()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
        own_redis.process.resume()
        await async_wait_until(lambda: not lock_held(own_redis_py, lock_name), 10, "released")
    finally:
        own_redis.process.resume()
        await client.close()


async def test_timeout_expiring_during_release(own_redis: RedisServer, own_redis_py: Any, lock_name: str) -> None:
    """An ``asyncio.timeout`` around the lock expires while the exit
    releases: ``TimeoutError`` comes out (not ``LockLost``), and the lock is
    released."""
    client = await fencelock.connect(own_redis.url)
    seen: dict[str, Any] = {"left_body": False}
    try:
        entered, proceed = asyncio.Event(), asyncio.Event()
        scope: dict[str, Any] = {}

        async def holder() -> None:
            async with asyncio.timeout(None) as cm:
                scope["cm"] = cm
                async with client.lock(lock_name, ttl=LONG_TTL, wait=0) as lease:
                    seen["lease"] = lease
                    entered.set()
                    await proceed.wait()
                    seen["left_body"] = True

        task = asyncio.ensure_future(holder())
        await asyncio.wait_for(entered.wait(), 10)
        own_redis.process.pause()
        proceed.set()
        for _ in range(1000):
            if seen["left_body"]:
                break
            await asyncio.sleep(0)
        assert seen["left_body"] and not task.done()
        scope["cm"].reschedule(asyncio.get_running_loop().time())
        for _ in range(20):
            await asyncio.sleep(0)
        own_redis.process.resume()
        with pytest.raises(TimeoutError) as info:
            await asyncio.wait_for(task, 10)
        assert not isinstance(info.value, fencelock.LockLost)
        assert seen["lease"].released
        assert not lock_held(own_redis_py, lock_name)
    finally:
        own_redis.process.resume()
        await client.close()


async def test_cancel_right_after_the_body(client: Any, redis_py: Any, lock_name: str) -> None:
    """Cancelled at the first suspension after the body (Redis running):
    the release still completes before the task ends."""
    proceed = asyncio.Event()
    seen: dict[str, Any] = {"left_body": False}

    async def holder() -> None:
        async with client.lock(lock_name, ttl=LONG_TTL, wait=0) as lease:
            seen["lease"] = lease
            await proceed.wait()
            seen["left_body"] = True

    task = asyncio.ensure_future(holder())
    await async_wait_until(lambda: "lease" in seen, 10, "entered")
    proceed.set()
    while not seen["left_body"]:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen["lease"].released
    assert not lock_held(redis_py, lock_name)


async def test_negative_control_an_abandoned_lease_stays_held(client: Any, redis_py: Any, lock_name: str) -> None:
    """The "released" checks can fail: a lease nobody releases (and that is
    still referenced) stays held."""
    lease = await client.acquire(lock_name, ttl=LONG_TTL, wait=0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert lock_held(redis_py, lock_name)
    assert await lease.release() is True


# --- interpreter exit -------------------------------------------------------------------------

_PRELUDE = textwrap.dedent(
    """
    import asyncio, os, sys, threading, time
    import redis
    import fencelock
    URL, NAME = sys.argv[1], sys.argv[2]

    def wait_queued():
        # Until a waiter of NAME is in its wait queue (10 s at most).
        r = redis.Redis.from_url(URL)
        end = time.monotonic() + 10
        while not r.zcard("lock:{" + NAME + "}:queue"):
            assert time.monotonic() < end, "no waiter queued"
            time.sleep(0.01)
        r.close()
    """
)

EXIT_HOLDING = {
    # A lease acquired in asyncio.run() and kept in a global: main returns,
    # the interpreter exits, nothing released it.
    "async_global": """
        async def main():
            global client, lease
            client = await fencelock.connect(URL)
            lease = await client.acquire(NAME, ttl=30.0, wait=0)
            print("fence", lease.fence, flush=True)
        asyncio.run(main())
    """,
    # The same with the lease only in main's frame (garbage at return).
    "async_local": """
        async def main():
            client = await fencelock.connect(URL)
            lease = await client.acquire(NAME, ttl=30.0, wait=0)
            print("fence", lease.fence, flush=True)
        asyncio.run(main())
    """,
    # The blocking twin, lease in a module global at the end of the script.
    "blocking_global": """
        client = fencelock.connect_blocking(URL)
        lease = client.acquire(NAME, ttl=30.0, wait=0)
        print("fence", lease.fence, flush=True)
    """,
    # sys.exit inside `with client.lock()`: the with's exit runs.
    "blocking_with_sys_exit": """
        client = fencelock.connect_blocking(URL)
        with client.lock(NAME, ttl=30.0, wait=0) as lease:
            print("fence", lease.fence, flush=True)
            sys.exit(0)
    """,
    # os._exit: nothing runs at exit; the lock must expire by its ttl.
    "os_exit": """
        client = fencelock.connect_blocking(URL)
        lease = client.acquire(NAME, ttl=30.0, wait=0)
        print("fence", lease.fence, flush=True)
        os._exit(0)
    """,
}


@pytest.mark.parametrize("variant", list(EXIT_HOLDING))
def test_interpreter_exit_with_a_held_lease(redis_url: str, redis_py: Any, lock_name: str, variant: str) -> None:
    """A process exits holding a lease (30 s ttl). It must exit promptly and
    cleanly. The package's README ("At interpreter exit"): a lease still held
    at exit is released best-effort as it is dropped, else it expires by its
    ttl. So the lock is either gone or held with at most its ttl left (no
    process renews it); which one is printed. The variants whose outcome is
    certain assert it: ``with`` + ``sys.exit`` releases; ``os._exit`` leaves
    it held (the negative control: the check sees a held lock)."""
    ran = run_python(_PRELUDE + textwrap.dedent(EXIT_HOLDING[variant]), redis_url, lock_name, deadline=20)
    assert ran.code == 0, ran
    assert "panicked" not in ran.stderr and "Traceback" not in ran.stderr, ran
    assert ran.lines()[0].startswith("fence "), ran
    key = default_keys(lock_name)["lock"]
    pttl = redis_py.pttl(key)
    outcome = "released" if pttl == -2 else f"held, expires in {pttl} ms"
    print(f"{variant}: exit after {ran.seconds:.2f}s; lock {outcome}")
    if variant == "blocking_with_sys_exit":
        assert pttl == -2, outcome
    elif variant == "os_exit":
        assert 0 < pttl <= 30_000, outcome
    else:
        assert pttl == -2 or 0 < pttl <= 30_000, outcome
    redis_py.delete(key)


EXIT_WAITING = {
    # The extension's acquire future pending when asyncio.run() returns.
    "async_native_future": """
        async def main():
            global client, fut
            client = await fencelock.connect(URL)
            fut = client._native.acquire(NAME, {"wait": None})
            await asyncio.to_thread(wait_queued)
            print("waiting", flush=True)
        asyncio.run(main())
    """,
    # A task pending in a loop that is never closed.
    "async_task_loop_left_open": """
        loop = asyncio.new_event_loop()
        async def main():
            global client, task
            client = await fencelock.connect(URL)
            task = asyncio.ensure_future(client.acquire(NAME, wait=None))
            await asyncio.to_thread(wait_queued)
            print("waiting", flush=True)
        loop.run_until_complete(main())
    """,
    # A daemon thread blocked in the blocking acquire.
    "blocking_daemon_thread": """
        client = fencelock.connect_blocking(URL)
        t = threading.Thread(target=lambda: client.acquire(NAME, wait=None), daemon=True)
        t.start()
        wait_queued()
        print("waiting", flush=True)
    """,
    # A coroutine created and never awaited.
    "coroutine_never_awaited": """
        async def main():
            global client, aw
            client = await fencelock.connect(URL)
            aw = client.acquire(NAME, wait=None)
            print("waiting", flush=True)
        asyncio.run(main())
    """,
}


@pytest.mark.parametrize("variant", list(EXIT_WAITING))
def test_interpreter_exit_with_a_pending_wait(
    redis_url: str, redis_py: Any, blocking_client: Any, lock_name: str, variant: str
) -> None:
    """A process exits while an acquire of a held lock waits (``wait=None``):
    it must not hang at exit (bounded: killed and failed after 20 s) nor
    crash, and once the holder releases, the name is free (nothing left by
    the dead waiter, within its 1 s waiter lease)."""
    holder = blocking_client.acquire(lock_name, ttl=LONG_TTL, wait=0)
    ran = run_python(_PRELUDE + textwrap.dedent(EXIT_WAITING[variant]), redis_url, lock_name, deadline=20)
    print(f"{variant}: exit {ran.code} after {ran.seconds:.2f}s; stderr: {ran.stderr.strip()[:500]!r}")
    assert ran.code == 0, ran
    assert ran.lines() == ["waiting"], ran
    assert "panicked" not in ran.stderr and "Fatal Python error" not in ran.stderr, ran
    assert holder.release() is True
    poll(lambda: nothing_left(redis_py, lock_name), 5, "the dead waiter left nothing")
    again = blocking_client.acquire(lock_name, wait=0)
    assert again.release() is True



CLEAN_SCRIPTS = {
    # Everything released and closed before asyncio.run() returns.
    "asyncio": """
        async def main():
            async with await fencelock.connect(URL) as client:
                async with client.lock(NAME, ttl=5.0, wait=0):
                    pass
        asyncio.run(main())
    """,
    # The same on uvloop (its add_reader is its own).
    "uvloop": """
        import uvloop
        async def main():
            async with await fencelock.connect(URL) as client:
                async with client.lock(NAME, ttl=5.0, wait=0):
                    pass
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    """,
    # The blocking twin (the control: no foreign thread completes a future).
    "blocking": """
        with fencelock.connect_blocking(URL) as client:
            with client.lock(NAME, ttl=5.0, wait=0):
                pass
    """,
}


@pytest.mark.parametrize("api", list(CLEAN_SCRIPTS))
def test_interpreter_exit_after_clean_use_never_crashes(redis_url: str, lock_name: str, api: str) -> None:
    """A script that locks, releases and closes, then exits: exit code 0,
    every time. A thread still inside Python when the main thread finalizes
    is forced out with ``pthread_exit``, which aborts a Rust thread: the
    extension's threads never attach to Python to hand a result over (they
    queue it for the loop), and the script is run many times to show it."""
    runs = 30
    failures = []
    for i in range(runs):
        ran = run_python(_PRELUDE + textwrap.dedent(CLEAN_SCRIPTS[api]), redis_url, f"{lock_name}-{i}", deadline=20)
        if ran.code != 0:
            failures.append(f"run {i}: exit {ran.code}; stderr: {ran.stderr.strip()[:300]!r}")
    assert not failures, f"{len(failures)} of {runs} runs crashed at exit:\n" + "\n".join(failures)


# --- the event loops that receive results ------------------------------------------------


def test_a_loop_that_cannot_watch_a_descriptor_is_refused_naming_what_is_needed(redis_url: str) -> None:
    """Results reach an event loop through a descriptor it watches
    (``loop.add_reader``). A loop without it gets an error that says so,
    at the first call, rather than a call that never completes."""

    class NoReaders(asyncio.SelectorEventLoop):
        def add_reader(self, *args: Any) -> None:  # type: ignore[override]
            raise NotImplementedError

    async def main() -> None:
        with pytest.raises(NotImplementedError, match=r"add_reader.*uvloop"):
            await fencelock.connect(redis_url)

    with asyncio.Runner(loop_factory=NoReaders) as runner:
        runner.run(main())


def test_loops_on_two_threads_share_a_client_and_each_gets_its_own_results(
    redis_url: str, lock_name: str
) -> None:
    """One client, two threads each running its own event loop, locking one
    name and a name of its own in turns: every call completes on the loop
    that made it (a result settled from another loop's reader would never
    wake its own loop: the call would hang until the deadline), and the
    shared name is never held twice."""
    async def connect() -> Any:
        return await fencelock.connect(redis_url)

    client = asyncio.run(connect())
    inside, most, done = [0], [0], []
    guard = threading.Lock()

    async def worker(me: int) -> None:
        for i in range(25):
            async with client.lock(lock_name, ttl=10.0, wait=10.0):
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                await asyncio.sleep(0.001)
                with guard:
                    inside[0] -= 1
            async with client.lock(f"{lock_name}-{me}", ttl=10.0, wait=0) as own:
                assert own.fence > 0
        done.append(me)

    def run(me: int) -> None:
        asyncio.run(asyncio.wait_for(worker(me), 20))

    # Daemons, joined with a deadline: a call whose result went astray
    # never completes, and its thread must not keep the test (or pytest's
    # exit) waiting.
    threads = [threading.Thread(target=run, args=(me,), daemon=True) for me in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert sorted(done) == [0, 1], "a thread's calls did not all complete"
        assert most[0] == 1, "two holders of one name at once"
    finally:
        asyncio.run(asyncio.wait_for(client.close(), 10))


def test_short_lived_loops_leave_no_descriptor_behind(redis_url: str, lock_name: str) -> None:
    """Each event loop gets a socket pair for its results; a loop that is
    closed lets go of it. 150 ``asyncio.run`` calls, each one lock cycle on
    one client: the process's open descriptors do not grow with them."""
    import os

    async def connect() -> Any:
        return await fencelock.connect(redis_url)

    client = asyncio.run(connect())

    async def cycle() -> None:
        async with client.lock(lock_name, ttl=10.0, wait=5.0):
            pass

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    try:
        asyncio.run(cycle())
        before = open_fds()
        for _ in range(150):
            asyncio.run(cycle())
        gc.collect()
        # A loop's own descriptors (selector, self-pipe) go with it too;
        # a leak of ours would be 2 per loop, 300 in all.
        assert open_fds() - before < 10, (before, open_fds())
    finally:
        asyncio.run(client.close())


# --- an acquisition cancelled with its grant in flight -------------------------------------


async def test_an_acquire_cancelled_with_its_grant_in_flight_leaves_no_lock(
    own_redis: RedisServer, own_redis_py: Any, lock_name: str
) -> None:
    """The redis-py #3847 shape, at its narrowest: the grant has reached Redis
    (held there by ``CLIENT PAUSE WRITE``) when the acquisition is cancelled,
    so it runs with nobody to take the lease. The cancelled call's release
    for its token runs after it: the lock is free again at once, not held
    by nobody for its 60 s ttl, and the fence key shows the grant did run.
    Both a single try (``wait=0``) and a waiting acquire."""
    client = await fencelock.connect(own_redis.url)
    try:
        async with client.lock(f"{lock_name}-warm-up", wait=0):
            pass  # loads the scripts: a first EVALSHA would be sent twice
        names = [f"{lock_name}-try", f"{lock_name}-wait"]
        own_redis_py.execute_command("CLIENT", "PAUSE", "600", "WRITE")
        tasks = [
            asyncio.ensure_future(client.acquire(names[0], ttl=LONG_TTL, wait=0)),
            asyncio.ensure_future(client.acquire(names[1], ttl=LONG_TTL, wait=30)),
        ]
        await asyncio.sleep(0.15)
        assert not any(t.done() for t in tasks), "a grant was answered during the pause"
        for t in tasks:
            t.cancel()
        for name in names:
            keys = default_keys(name)

            def released(keys: dict[str, str] = keys) -> bool:
                return own_redis_py.get(keys["lock"]) is None and own_redis_py.get(keys["fence"]) is not None

            await async_wait_until(released, 5, f"{name}: granted, then released")
        assert all(t.cancelled() for t in tasks)
    finally:
        await client.close()
