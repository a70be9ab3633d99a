"""The asyncio API against a private redis-server (and etcd where marked).

Every safety property has a test that could fail: exclusion is measured
by an overlap counter, with the same workload run unlocked as a negative
control; a loss is made real by deleting the lock key on the server; the
absence of leftovers is checked on the server's keys, after first seeing
that the check does see the entry while it exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import traceback
from datetime import timedelta
from typing import Any, AsyncContextManager, Callable

import pytest

import fencelock
from conftest import PASSWORD, lock_keys
from servers import RedisServer, async_wait_until, wait_until


class Overlap:
    """Counts how many workers are inside a critical section at once."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.entries = 0

    @contextlib.contextmanager
    def section(self) -> Any:
        self.inside += 1
        self.entries += 1
        self.most = max(self.most, self.inside)
        try:
            yield
        finally:
            self.inside -= 1


async def run_workers(
    guard: Callable[[int], AsyncContextManager[Any]], workers: int = 3, rounds: int = 4
) -> Overlap:
    """``workers`` tasks, each entering ``guard(worker)`` ``rounds`` times
    and awaiting inside it (so an unguarded run overlaps)."""
    overlap = Overlap()

    async def worker(i: int) -> None:
        for _ in range(rounds):
            async with guard(i):
                with overlap.section():
                    await asyncio.sleep(0.01)
                    await asyncio.sleep(0)

    await asyncio.gather(*(worker(i) for i in range(workers)))
    assert overlap.entries == workers * rounds
    return overlap


def secret_free(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a secret leaked into: {text[:300]!r}"


def full_text(err: BaseException) -> str:
    """Everything a log would show of ``err``: its str, repr, traceback and
    chained exceptions, and its notes."""
    return repr(err) + str(err) + "".join(traceback.format_exception(err))


# --- acquire and release ----------------------------------------------------


async def test_acquire_and_release(client: Any, redis_py: Any, lock_name: str) -> None:
    keys = lock_keys(lock_name)
    async with client.lock(lock_name, ttl=5.0, wait=1.0) as lease:
        assert isinstance(lease, fencelock.Lease)
        assert lease.name == lock_name
        assert lease.fence > 0
        assert len(lease.holder_id) == 16  # the first 16 hex digits of SHA-1(token)
        assert lease.holder_id == fencelock.holder_id(lease.token)
        assert lease.slot is None and lease.access is None
        assert 0 < lease.remaining() <= 5.0
        assert not lease.lost and lease.loss_reason is None and not lease.released
        assert redis_py.exists(keys.lock)
        lease.check()
        await lease.extend()
    assert lease.released
    assert lease.remaining() == 0.0
    assert not redis_py.exists(keys.lock)


async def test_manual_acquire_release_and_fences_increase(client: Any, lock_name: str) -> None:
    first = await client.acquire(lock_name)
    assert await first.release() is True
    assert await first.release() is False  # a second release
    second = await client.acquire(lock_name)
    assert second.fence > first.fence
    assert await second.release()


async def test_connect_as_context_manager_closes(redis_server: RedisServer, lock_name: str) -> None:
    async with fencelock.connect(redis_server.url, ttl=3.0) as c:
        assert not c.closed and c.backend == "redis"
        lease = await c.acquire(lock_name)
        assert lease.ttl == 3.0  # the client's default
    assert c.closed
    assert lease.released or lease.lost
    with pytest.raises(fencelock.ClientClosed):
        await c.acquire(lock_name)


async def test_close_releases_held_leases(redis_server: RedisServer, redis_py: Any, lock_name: str) -> None:
    c = await fencelock.connect(redis_server.url)
    await c.acquire(lock_name)
    assert redis_py.exists(lock_keys(lock_name).lock)
    await c.close()
    await c.close()  # idempotent
    assert not redis_py.exists(lock_keys(lock_name).lock)


# --- exclusion ---------------------------------------------------------------


async def test_two_clients_exclude_each_other(client: Any, client2: Any, lock_name: str) -> None:
    clients = [client, client2]
    overlap = await run_workers(lambda i: clients[i % 2].lock(lock_name, wait=10.0), workers=4)
    assert overlap.most == 1


async def test_negative_control_without_the_lock_workers_overlap() -> None:
    overlap = await run_workers(lambda i: contextlib.nullcontext(), workers=4)  # type: ignore[arg-type,return-value]
    assert overlap.most > 1


def test_exclusion_under_uvloop(redis_server: RedisServer, lock_name: str) -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[int, int]:
        assert "uvloop" in type(asyncio.get_running_loop()).__module__
        async with fencelock.connect(redis_server.url) as a, fencelock.connect(redis_server.url) as b:
            clients = [a, b]
            locked = await run_workers(lambda i: clients[i % 2].lock(lock_name, wait=10.0), workers=4)
            unlocked = await run_workers(lambda i: contextlib.nullcontext(), workers=4)  # type: ignore[arg-type,return-value]
            return locked.most, unlocked.most

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        locked, unlocked = runner.run(main())
    assert locked == 1
    assert unlocked > 1  # the negative control, under uvloop too


# --- waiting -----------------------------------------------------------------


async def test_wait_zero_raises_contended_and_changes_nothing(
    client: Any, client2: Any, redis_py: Any, lock_name: str
) -> None:
    keys = lock_keys(lock_name)
    async with client.lock(lock_name) as holder:
        before = {k: redis_py.dump(k) for k in keys.all()}
        started = time.monotonic()
        with pytest.raises(fencelock.Contended) as info:
            async with client2.lock(lock_name, wait=0):
                pytest.fail("the body ran without the lock")
        assert time.monotonic() - started < 1.0
        assert info.value.retryable
        assert {k: redis_py.dump(k) for k in keys.all()} == before
        assert not holder.lost


async def test_timeout_raises_lock_timeout_a_timeout_error(
    client: Any, client2: Any, lock_name: str
) -> None:
    async with client.lock(lock_name):
        started = time.monotonic()
        with pytest.raises(fencelock.LockTimeout) as info:
            await client2.acquire(lock_name, wait=0.3)
        elapsed = time.monotonic() - started
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, fencelock.Error)
    assert info.value.retryable
    assert 0.25 <= elapsed < 3.0


async def test_wait_none_waits_for_the_release(client: Any, client2: Any, lock_name: str) -> None:
    holder = await client.acquire(lock_name)
    waiter = asyncio.create_task(client2.acquire(lock_name, wait=None))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await holder.release()
    lease = await asyncio.wait_for(waiter, 5.0)
    assert lease.fence > holder.fence
    await lease.release()


@pytest.mark.parametrize("wait_mode", ["notify", "fair"])
async def test_cancelled_waiter_leaves_no_lock_and_no_queue_entry(
    client: Any, client2: Any, redis_py: Any, lock_name: str, wait_mode: str
) -> None:
    """redis-py #3847's shape: a task waiting for a held lock is cancelled.
    Its queue entry must go at once (the waiter lease is long, so expiry
    cannot clean it up within the deadline) and it must never be granted
    the lock afterwards."""
    keys = lock_keys(lock_name)
    holder = await client.acquire(lock_name, wait_mode=wait_mode)
    waiter = asyncio.create_task(
        client2.acquire(lock_name, wait=None, wait_mode=wait_mode, waiter_lease=60.0)
    )
    # The check sees the entry while it exists (so it can fail below).
    await async_wait_until(lambda: redis_py.zcard(keys.queue) == 1, 5.0, "the waiter to queue")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await async_wait_until(
        lambda: redis_py.zcard(keys.queue) == 0 and redis_py.zcard(keys.waiters) == 0,
        2.0,
        "the cancelled waiter's queue entry to go",
    )
    assert await holder.release()
    # Nobody holds it, and nobody queues ahead (fair mode would refuse).
    assert not redis_py.exists(keys.lock)
    lease = await client.acquire(lock_name, wait=0, wait_mode=wait_mode)
    await lease.release()
    assert not redis_py.exists(keys.lock)


# --- exit paths ----------------------------------------------------------------


async def test_exception_in_body_releases_and_propagates(
    client: Any, redis_py: Any, lock_name: str
) -> None:
    with pytest.raises(ZeroDivisionError):
        async with client.lock(lock_name) as lease:
            1 / 0
    assert lease.released
    again = await client.acquire(lock_name, wait=0)
    await again.release()


async def test_negative_control_an_unreleased_lease_blocks_wait_zero(
    client: Any, client2: Any, lock_name: str
) -> None:
    lease = await client.acquire(lock_name)
    with pytest.raises(fencelock.Contended):
        await client2.acquire(lock_name, wait=0)
    await lease.release()


async def test_outer_timeout_propagates_and_releases(
    client: Any, redis_py: Any, lock_name: str
) -> None:
    reached_end = False
    with pytest.raises(TimeoutError) as info:
        async with asyncio.timeout(0.3):
            async with client.lock(lock_name) as lease:
                await asyncio.sleep(30)
                reached_end = True
    assert type(info.value) is TimeoutError  # asyncio's, neither LockLost nor LockTimeout
    assert not reached_end
    assert lease.released and not lease.lost
    assert not redis_py.exists(lock_keys(lock_name).lock)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_task_cancel_propagates_and_releases(
    client: Any, redis_py: Any, lock_name: str
) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with client.lock(lock_name):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), 5.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not redis_py.exists(lock_keys(lock_name).lock)


async def test_cancellation_while_releasing_waits_for_the_release(lock_name: str) -> None:
    """An outer cancellation that arrives while the exit is releasing (the
    server paused) does not cut the exit short: the task ends once the
    release is done, then raises the CancelledError."""
    import redis

    server = RedisServer.start()
    try:
        inspect = redis.Redis(port=server.port, decode_responses=True)
        async with fencelock.connect(server.url, response_timeout=10.0) as c:

            async def body() -> None:
                async with c.lock(lock_name, ttl=10.0):
                    server.process.pause()

            task = asyncio.create_task(body())
            await asyncio.sleep(0.2)  # the exit's release is in flight
            assert not task.done()
            task.cancel()
            await asyncio.sleep(0.2)
            assert not task.done(), "the exit gave up on the release"
            server.process.resume()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10.0)
            assert not inspect.exists(lock_keys(lock_name).lock)
        inspect.close()
    finally:
        server.process.resume()
        server.stop()


# --- loss is cancellation --------------------------------------------------------


async def test_loss_cancels_the_body_and_raises_lock_lost(
    client: Any, redis_py: Any, lock_name: str
) -> None:
    keys = lock_keys(lock_name)
    reached_end = False
    started = time.monotonic()
    with pytest.raises(fencelock.LockLost) as info:
        async with asyncio.timeout(15):  # a broken watcher fails, never hangs
            async with client.lock(lock_name, ttl=0.6) as lease:
                fence = lease.fence
                assert redis_py.delete(keys.lock) == 1  # the lock is gone
                await asyncio.sleep(30)
                reached_end = True
    assert not reached_end
    assert time.monotonic() - started < 5.0
    err = info.value
    assert err.fence == fence and err.name == lock_name
    assert err.reason in ("expired", "taken_over")
    assert not err.retryable
    assert lease.lost and lease.loss_reason == err.reason
    secret_free(full_text(err), lease.token)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_negative_control_renewal_keeps_a_short_lease(client: Any, lock_name: str) -> None:
    """The same body without the deletion outlives several ttls: the loss
    above is the deletion, not the short ttl."""
    async with client.lock(lock_name, ttl=0.6) as lease:
        await asyncio.sleep(1.5)
    assert not lease.lost


async def test_loss_after_the_body_finished_still_raises(
    client: Any, redis_py: Any, lock_name: str
) -> None:
    """The body never awaits after the deletion (it polls the flag,
    blocking the loop), so no cancellation reaches it; the exit still
    reports the loss: the work may have overlapped."""
    with pytest.raises(fencelock.LockLost) as info:
        async with client.lock(lock_name, ttl=0.6) as lease:
            redis_py.delete(lock_keys(lock_name).lock)
            wait_until(lambda: lease.lost, 5.0, "the keeper to notice the loss")
    assert info.value.fence == lease.fence


async def test_body_swallowing_the_cancellation_still_gets_lock_lost(
    client: Any, redis_py: Any, lock_name: str
) -> None:
    with pytest.raises(fencelock.LockLost):
        async with client.lock(lock_name, ttl=0.6):
            redis_py.delete(lock_keys(lock_name).lock)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                pass
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_loss_with_another_cancellation_is_not_swallowed(
    client: Any, redis_py: Any, lock_name: str
) -> None:
    """Lost *and* cancelled by someone else: the CancelledError propagates
    (the other canceller must see it), not LockLost."""

    async def body() -> str:
        async with client.lock(lock_name, ttl=0.6) as lease:
            redis_py.delete(lock_keys(lock_name).lock)
            wait_until(lambda: lease.lost, 5.0, "the keeper to notice the loss")
            me = asyncio.current_task()
            assert me is not None
            me.cancel()  # someone else's cancellation, before ours is delivered
            await asyncio.sleep(30)
        return "not reached"

    task = asyncio.create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not redis_py.exists(lock_keys(lock_name).lock)


async def test_manual_lease_reports_loss_by_flag_check_and_extend(
    client: Any, redis_py: Any, lock_name: str
) -> None:
    lease = await client.acquire(lock_name, ttl=0.6)
    redis_py.delete(lock_keys(lock_name).lock)
    await asyncio.wait_for(lease.wait_lost(), 5.0)
    assert lease.lost
    with pytest.raises(fencelock.LockLost):
        lease.check()
    with pytest.raises(fencelock.LockLost):
        await lease.extend()
    assert await lease.release() is False


# --- fenced resources -----------------------------------------------------------


async def test_fenced_hash_write_and_read(client: Any, lock_name: str) -> None:
    h = client.fenced_hash(f"res-{lock_name}")
    assert await h.read() == fencelock.HashState(None, None, None)
    async with client.lock(lock_name) as lease:
        assert await h.write(lease, "v1") is True
        value, fence, holder = await h.read()
    assert (value, fence, holder) == ("v1", lease.fence, lease.holder_id)
    assert lease.token != holder


async def test_paused_holder_write_is_refused_as_stale(client: Any, client2: Any, lock_name: str) -> None:
    h = client.fenced_hash(f"res-{lock_name}")
    a = await client.acquire(lock_name, ttl=0.4, renewal=False)
    # Negative control: while A is the newest holder, its writes go through.
    assert await h.write(a, "a-fresh") is True
    await async_wait_until(lambda: a.lost, 5.0, "lease A to run out")
    b = await client2.acquire(lock_name, wait=5.0)
    assert b.fence > a.fence
    assert await client2.fenced_hash(f"res-{lock_name}").write(b, "b") is True
    assert await h.write(a, "a-late") is False  # A woke up: refused
    assert await h.read() == ("b", b.fence, b.holder_id)
    await b.release()


async def test_update_is_a_fenced_read_modify_write(client: Any, client2: Any, lock_name: str) -> None:
    h = client.fenced_hash(f"res-{lock_name}")
    async with client.lock(lock_name) as lease:
        assert await h.update(lease, lambda v: str(int(v or 0) + 1)) is True

        async def plus_ten(v: Any) -> str:
            await asyncio.sleep(0)
            return str(int(v) + 10)

        assert await h.update(lease, plus_ten) is True
    assert (await h.read()).value == "11"

    stale = await client.acquire(lock_name, ttl=0.4, renewal=False)
    await async_wait_until(lambda: stale.lost, 5.0, "the stale lease to run out")
    async with client2.lock(lock_name) as newer:
        assert await h.update(newer, lambda v: str(int(v) + 1)) is True
    calls: list[Any] = []

    def record(v: Any) -> str:
        calls.append(v)
        return "0"

    assert await h.update(stale, record) is False
    assert calls == []  # refused at registration: fn never ran
    assert (await h.read()).value == "12"


async def test_register_refuses_older_holders(client: Any, lock_name: str) -> None:
    h = client.fenced_hash(f"res-{lock_name}")
    old = await client.acquire(lock_name, ttl=0.4, renewal=False)
    await async_wait_until(lambda: old.lost, 5.0, "the old lease to run out")
    new = await client.acquire(lock_name)
    assert await h.register(new) is True
    assert await h.write(old, "late") is False
    assert await h.read() == (None, new.fence, new.holder_id)
    await new.release()


async def test_read_validated(client: Any, lock_name: str) -> None:
    h = client.fenced_hash(f"res-{lock_name}")
    async with client.lock(lock_name) as first:
        assert await h.write(first, "one")
        assert await h.read_validated(first) == fencelock.ValidatedRead(True, "one", first.fence)
    async with client.lock(lock_name) as second:
        assert await h.write(second, "two")
    clean, value, fence = await h.read_validated(first)
    assert not clean and value == "two" and fence == second.fence


# --- semaphores and read-write locks ----------------------------------------------


async def test_semaphore_permits(client: Any, client2: Any, lock_name: str) -> None:
    async with client.semaphore(lock_name, 2) as a, client2.semaphore(lock_name, 2) as b:
        assert {a.slot, b.slot} == {0, 1}
        with pytest.raises(fencelock.Contended):
            await client.acquire(lock_name, permits=2, wait=0)
        h = client.fenced_hash(f"res-{lock_name}")
        assert h.slot(a.slot).slot_number == a.slot
        assert await h.slot(a.slot).write(a, "a") is True
    c = await client.acquire(lock_name, permits=2, wait=0)
    await c.release()


async def test_semaphore_excludes_beyond_its_permits(client: Any, client2: Any, lock_name: str) -> None:
    clients = [client, client2]
    overlap = await run_workers(
        lambda i: clients[i % 2].semaphore(lock_name, 2, wait=10.0), workers=5, rounds=3
    )
    assert overlap.most == 2  # shared by two, never three


async def test_rwlock_readers_share_writers_exclude(client: Any, client2: Any, lock_name: str) -> None:
    rw, rw2 = client.rwlock(lock_name), client2.rwlock(lock_name)
    async with rw.read() as r1, rw2.read() as r2:
        assert r1.access == r2.access == "read"
        with pytest.raises(fencelock.Contended):
            await rw.acquire_write(wait=0)
    async with rw.write() as w:
        assert w.access == "write"
        with pytest.raises(fencelock.Contended):
            await rw2.acquire_read(wait=0)
    assert w.released


# --- revoke ------------------------------------------------------------------------


async def test_revoke_deposes_the_holder_and_seals_resources(
    client: Any, client2: Any, lock_name: str
) -> None:
    key = f"res-{lock_name}"
    h = client.fenced_hash(key)
    held = asyncio.Event()
    box: dict[str, Any] = {}

    async def holder() -> None:
        async with client.lock(lock_name, ttl=0.6) as lease:
            box["lease"] = lease
            assert await h.write(lease, "before")
            held.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(holder())
    await asyncio.wait_for(held.wait(), 5.0)
    result = await client2.revoke(lock_name, resources=[client2.fenced_hash(key)])
    lease = box["lease"]
    assert isinstance(result, fencelock.Revoked)
    assert result.name == lock_name
    assert result.deposed_fence == lease.fence
    assert result.deposed_holder == lease.holder_id
    assert result.fence > lease.fence
    assert [s.sealed for s in result.sealed] == [True]
    with pytest.raises(fencelock.LockLost) as info:
        await asyncio.wait_for(task, 5.0)
    assert info.value.fence == lease.fence
    assert await h.write(lease, "after") is False  # sealed


# --- secrets ------------------------------------------------------------------------


async def test_wrong_password_errors_show_no_password(redis_password_server: RedisServer, lock_name: str) -> None:
    for url in (
        redis_password_server.url_with_password("wr0ng-pw"),
        f"redis://127.0.0.1:{redis_password_server.port}",
    ):
        with pytest.raises(fencelock.Error) as info:
            c = await fencelock.connect(url, connect_timeout=5.0)
            try:
                await c.acquire(lock_name)
            finally:
                await c.close()
        secret_free(full_text(info.value), "wr0ng-pw", PASSWORD)
        assert isinstance(info.value, (fencelock.ConfigError, fencelock.ConnectionFailed))


async def test_right_password_shows_nowhere(
    redis_password_server: RedisServer, lock_name: str
) -> None:
    connecting = fencelock.connect(redis_password_server.url)
    secret_free(repr(connecting), PASSWORD)
    c = await connecting
    try:
        for text in (repr(c), str(c), c.url):
            secret_free(text, PASSWORD)
        assert "***" in c.url
        async with c.lock(lock_name) as lease:
            for text in (repr(lease), str(lease)):
                secret_free(text, PASSWORD, lease.token)
            with pytest.raises(fencelock.Contended) as info:
                await c.acquire(lock_name, wait=0)
            secret_free(full_text(info.value), PASSWORD, lease.token)
        secret_free(repr(lease), PASSWORD, lease.token)
    finally:
        await c.close()
    secret_free(repr(c), PASSWORD)


# --- hostile input -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", "x" * 100_000, "a\nb", "tab\there", "zero\u200bwidth", b"bytes"],
    ids=["empty", "100KB", "newline", "tab", "zero-width", "bytes"],
)
async def test_bad_names_are_refused(client: Any, redis_py: Any, name: Any) -> None:
    before = redis_py.dbsize()
    with pytest.raises(fencelock.InvalidInput) as info:
        await client.acquire(name, wait=0)
    assert len(str(info.value)) < 1000
    assert isinstance(info.value, ValueError)
    with pytest.raises(fencelock.InvalidInput):
        async with client.lock(name, wait=0):
            pytest.fail("entered")
    assert redis_py.dbsize() == before


async def test_unicode_name_works(client: Any, redis_py: Any, lock_name: str) -> None:
    name = f"ключ-🔒-名前-{lock_name}"
    async with client.lock(name) as lease:
        assert lease.name == name
        assert redis_py.exists(lock_keys(name).lock)
    assert not redis_py.exists(lock_keys(name).lock)


@pytest.mark.parametrize(
    "options, key",
    [
        ({"ttl": math.nan}, "ttl"),
        ({"ttl": -1.0}, "ttl"),
        ({"ttl": 1e300}, "ttl"),
        ({"ttl": math.inf}, "ttl"),
        ({"ttl": True}, "ttl"),
        ({"ttl": "10"}, "ttl"),
        ({"wait": -1}, "wait"),
        ({"wait": math.nan}, "wait"),
        ({"wait": False}, "wait"),
        ({"renewal": 1}, "renewal"),
        ({"permits": True}, "permits"),
        ({"wait_mode": "sometimes"}, "wait_mode"),
        ({"tll": 1.0}, "tll"),
    ],
    ids=lambda v: repr(v),
)
async def test_bad_options_are_refused_naming_the_key(
    client: Any, redis_py: Any, lock_name: str, options: dict[str, Any], key: str
) -> None:
    before = redis_py.dbsize()
    with pytest.raises(fencelock.InvalidInput, match=key):
        await client.acquire(lock_name, **options)
    assert redis_py.dbsize() == before


async def test_bad_connect_options_are_refused(redis_server: RedisServer) -> None:
    with pytest.raises(fencelock.InvalidInput, match="bogus"):
        await fencelock.connect(redis_server.url, bogus=1)  # type: ignore[call-arg]
    with pytest.raises(fencelock.InvalidInput, match="ttl"):
        await fencelock.connect(redis_server.url, ttl=True)


async def test_timedelta_durations(client: Any, lock_name: str) -> None:
    async with client.lock(lock_name, ttl=timedelta(seconds=1.5), wait=timedelta(0)) as lease:
        assert lease.ttl == pytest.approx(1.5)


# --- etcd ------------------------------------------------------------------------------


def resource(c: Any, key: str) -> Any:
    return c.fenced_hash(key) if c.backend == "redis" else c.fenced_key(key)


@pytest.mark.etcd
async def test_both_backends_acquire_exclude_and_fence(backend_url: str, lock_name: str) -> None:
    async with fencelock.connect(backend_url) as a, fencelock.connect(backend_url) as b:
        async with a.lock(lock_name) as first:
            with pytest.raises(fencelock.Contended):
                await b.acquire(lock_name, wait=0)
        async with b.lock(lock_name) as second:
            assert second.fence > first.fence
        clients = [a, b]
        overlap = await run_workers(lambda i: clients[i % 2].lock(lock_name, wait=10.0), workers=3)
        assert overlap.most == 1


@pytest.mark.etcd
async def test_both_backends_refuse_a_stale_write(backend_url: str, lock_name: str) -> None:
    async with fencelock.connect(backend_url) as c:
        r = resource(c, f"res-{lock_name}")
        a = await c.acquire(lock_name, ttl=0.5, renewal=False)
        assert await r.write(a, "a") is True
        await async_wait_until(lambda: a.lost, 10.0, "lease A to run out")
        b = await c.acquire(lock_name, wait=10.0)
        assert await r.write(b, "b") is True
        assert await r.write(a, "late") is False
        assert (await r.read()).value == "b"
        await b.release()


@pytest.mark.etcd
async def test_wrong_resource_kind_is_refused(etcd_url: str, client: Any) -> None:
    with pytest.raises(fencelock.InvalidInput, match="fenced_hash"):
        client.fenced_key("k")
    async with fencelock.connect(etcd_url) as e:
        with pytest.raises(fencelock.InvalidInput, match="fenced_key"):
            e.fenced_hash("k")


@pytest.mark.etcd
async def test_both_backends_loss_by_revoke_cancels_the_body(backend_url: str, lock_name: str) -> None:
    """Loss on either backend: another client revokes the name; the holder's
    body is cancelled and ``LockLost`` carries its fence."""
    async with fencelock.connect(backend_url) as a, fencelock.connect(backend_url) as b:
        key = f"res-{lock_name}"
        held = asyncio.Event()
        box: dict[str, Any] = {}

        async def holder() -> None:
            async with a.lock(lock_name, ttl=0.9) as lease:
                box["lease"] = lease
                held.set()
                await asyncio.sleep(30)
                box["reached_end"] = True

        task = asyncio.create_task(holder())
        await asyncio.wait_for(held.wait(), 10.0)
        result = await b.revoke(lock_name, resources=[resource(b, key)])
        with pytest.raises(fencelock.LockLost) as info:
            await asyncio.wait_for(task, 10.0)
        lease = box["lease"]
        assert "reached_end" not in box
        assert info.value.fence == lease.fence == result.deposed_fence
        assert await resource(a, key).write(lease, "late") is False


@pytest.mark.parametrize("key", ["connect_timeout", "response_timeout"])
@pytest.mark.parametrize("value", [0, 0.0, 86_401.0, 1e9, 1e300, -1.0, float("nan")])
async def test_out_of_range_connection_timeouts_are_refused(
    redis_url: str, key: str, value: float
) -> None:
    """Zero, beyond a day, or not a duration at all: refused before anything
    is sent, naming the timeout (the library's own range check)."""
    with pytest.raises(fencelock.InvalidInput, match=key.replace("_", ".")):
        await fencelock.connect(redis_url, **{key: value})
