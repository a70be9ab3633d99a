"""The blocking twin against a private redis-server: the core cases of
``test_async.py`` with threads instead of tasks, and Ctrl-C while waiting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any, Callable, ContextManager

import pytest

import fencelock
from conftest import PASSWORD, lock_keys
from servers import RedisServer, wait_until


class Overlap:
    """Counts how many threads are inside a critical section at once."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.inside = 0
        self.most = 0
        self.entries = 0

    @contextlib.contextmanager
    def section(self) -> Any:
        with self._mutex:
            self.inside += 1
            self.entries += 1
            self.most = max(self.most, self.inside)
        try:
            yield
        finally:
            with self._mutex:
                self.inside -= 1


def run_threads(
    guard: Callable[[int], ContextManager[Any]], workers: int = 3, rounds: int = 4
) -> Overlap:
    overlap = Overlap()
    errors: list[BaseException] = []
    start = threading.Barrier(workers)

    def worker(i: int) -> None:
        try:
            start.wait(10)
            for _ in range(rounds):
                with guard(i):
                    with overlap.section():
                        time.sleep(0.01)
        except BaseException as e:  # reported below, not lost in a thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert overlap.entries == workers * rounds
    return overlap


def test_acquire_and_release(blocking_client: Any, redis_py: Any, lock_name: str) -> None:
    keys = lock_keys(lock_name)
    with blocking_client.lock(lock_name, ttl=5.0, wait=1.0) as lease:
        assert isinstance(lease, fencelock.BlockingLease)
        assert lease.name == lock_name and lease.fence > 0
        assert lease.holder_id == fencelock.holder_id(lease.token)
        assert redis_py.exists(keys.lock)
        lease.extend()
        lease.check()
    assert lease.released
    assert not redis_py.exists(keys.lock)
    manual = blocking_client.acquire(lock_name)
    assert manual.fence > lease.fence
    assert manual.release() is True
    assert manual.release() is False


def test_threads_exclude_each_other(
    blocking_client: Any, blocking_client2: Any, lock_name: str
) -> None:
    clients = [blocking_client, blocking_client2]
    overlap = run_threads(lambda i: clients[i % 2].lock(lock_name, wait=10.0), workers=4)
    assert overlap.most == 1


def test_negative_control_without_the_lock_threads_overlap() -> None:
    overlap = run_threads(lambda i: contextlib.nullcontext(), workers=4)
    assert overlap.most > 1


def test_wait_zero_raises_contended_and_changes_nothing(
    blocking_client: Any, blocking_client2: Any, redis_py: Any, lock_name: str
) -> None:
    keys = lock_keys(lock_name)
    with blocking_client.lock(lock_name):
        before = {k: redis_py.dump(k) for k in keys.all()}
        with pytest.raises(fencelock.Contended):
            with blocking_client2.lock(lock_name, wait=0):
                pytest.fail("the body ran without the lock")
        assert {k: redis_py.dump(k) for k in keys.all()} == before


def test_timeout_raises_lock_timeout(
    blocking_client: Any, blocking_client2: Any, lock_name: str
) -> None:
    with blocking_client.lock(lock_name):
        started = time.monotonic()
        with pytest.raises(fencelock.LockTimeout) as info:
            blocking_client2.acquire(lock_name, wait=0.3)
        elapsed = time.monotonic() - started
    assert isinstance(info.value, TimeoutError)
    assert 0.25 <= elapsed < 3.0


def test_exception_in_body_releases_and_propagates(
    blocking_client: Any, blocking_client2: Any, lock_name: str
) -> None:
    with pytest.raises(ZeroDivisionError):
        with blocking_client.lock(lock_name):
            1 / 0
    blocking_client2.acquire(lock_name, wait=0).release()
    # Negative control: an unreleased lease does block wait=0.
    held = blocking_client.acquire(lock_name)
    with pytest.raises(fencelock.Contended):
        blocking_client2.acquire(lock_name, wait=0)
    held.release()


def test_loss_surfaces_at_the_next_call_and_at_exit(
    blocking_client: Any, redis_py: Any, lock_name: str
) -> None:
    h = blocking_client.fenced_hash(f"res-{lock_name}")
    with pytest.raises(fencelock.LockLost) as info:
        with blocking_client.lock(lock_name, ttl=0.6) as lease:
            assert redis_py.delete(lock_keys(lock_name).lock) == 1
            wait_until(lambda: lease.lost, 5.0, "the keeper to notice the loss")
            assert lease.loss_reason in ("expired", "taken_over")
            with pytest.raises(fencelock.LockLost):
                lease.check()
            with pytest.raises(fencelock.LockLost):
                lease.extend()
            # Writes still go to the resource, which decides: nobody newer
            # has written, so this one is accepted.
            assert h.write(lease, "late but unopposed") is True
    assert info.value.fence == lease.fence
    assert info.value.name == lock_name


def test_negative_control_renewal_keeps_a_short_lease(blocking_client: Any, lock_name: str) -> None:
    with blocking_client.lock(lock_name, ttl=0.6) as lease:
        time.sleep(1.5)
        lease.check()
    assert not lease.lost


def test_paused_holder_write_is_refused(
    blocking_client: Any, blocking_client2: Any, lock_name: str
) -> None:
    h = blocking_client.fenced_hash(f"res-{lock_name}")
    a = blocking_client.acquire(lock_name, ttl=0.4, renewal=False)
    assert h.write(a, "a") is True
    wait_until(lambda: a.lost, 5.0, "lease A to run out")
    with blocking_client2.lock(lock_name, wait=5.0) as b:
        assert h.write(b, "b") is True
        assert h.write(a, "a-late") is False
        assert h.read() == ("b", b.fence, b.holder_id)
        assert h.update(b, lambda v: v + "+") is True
        assert h.update(a, lambda v: "never") is False
        assert h.read_validated(b).clean
        assert not h.read_validated(a).clean
    assert h.read().value == "b+"


def test_semaphore_and_rwlock(blocking_client: Any, blocking_client2: Any, lock_name: str) -> None:
    with blocking_client.semaphore(lock_name, 2) as a, blocking_client2.semaphore(lock_name, 2) as b:
        assert {a.slot, b.slot} == {0, 1}
        with pytest.raises(fencelock.Contended):
            blocking_client.acquire(lock_name, permits=2, wait=0)
    rw_name = f"{lock_name}-rw"
    rw, rw2 = blocking_client.rwlock(rw_name), blocking_client2.rwlock(rw_name)
    with rw.read() as r1, rw2.read() as r2:
        assert r1.access == r2.access == "read"
        with pytest.raises(fencelock.Contended):
            rw.acquire_write(wait=0)
    with rw.write():
        with pytest.raises(fencelock.Contended):
            rw2.acquire_read(wait=0)


def test_revoke(blocking_client: Any, blocking_client2: Any, lock_name: str) -> None:
    key = f"res-{lock_name}"
    lease = blocking_client.acquire(lock_name, ttl=0.6)
    result = blocking_client2.revoke(lock_name, [blocking_client2.fenced_hash(key)])
    assert result.deposed_fence == lease.fence
    assert result.sealed[0].sealed
    wait_until(lambda: lease.lost, 5.0, "the holder to notice the revoke")
    assert blocking_client.fenced_hash(key).write(lease, "late") is False


def test_passwords_and_tokens_stay_hidden(redis_password_server: RedisServer, lock_name: str) -> None:
    with pytest.raises(fencelock.Error) as info:
        c = fencelock.connect_blocking(redis_password_server.url_with_password("wr0ng-pw"))
        try:
            c.acquire(lock_name)
        finally:
            c.close()
    text = repr(info.value) + str(info.value)
    assert "wr0ng-pw" not in text and PASSWORD not in text
    with fencelock.connect_blocking(redis_password_server.url) as c:
        assert PASSWORD not in repr(c) and PASSWORD not in c.url
        with c.lock(lock_name) as lease:
            assert lease.token not in repr(lease)
    assert c.closed


@pytest.mark.parametrize("name", ["", "x" * 100_000])
def test_bad_names_are_refused(blocking_client: Any, name: str) -> None:
    with pytest.raises(fencelock.InvalidInput):
        blocking_client.acquire(name)


def test_bad_options_are_refused(blocking_client: Any, lock_name: str) -> None:
    with pytest.raises(fencelock.InvalidInput, match="ttl"):
        blocking_client.acquire(lock_name, ttl=float("nan"))
    with pytest.raises(fencelock.InvalidInput, match="tll"):
        blocking_client.acquire(lock_name, tll=1.0)


@pytest.mark.parametrize("wait_mode", ["notify", "fair"])
def test_ctrl_c_interrupts_a_waiting_acquire_promptly(
    blocking_client: Any, blocking_client2: Any, redis_py: Any, lock_name: str, wait_mode: str
) -> None:
    """SIGINT while the main thread waits forever for a held lock:
    ``KeyboardInterrupt`` within a second, and nothing left behind (no
    queue entry — the waiter lease is long, so only cleanup removes it — and
    no lock granted afterwards)."""
    # A shell that starts the suite in the background (nohup, `&`) leaves
    # SIGINT ignored; Python's own handler is what a user at a terminal has.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_case(blocking_client, blocking_client2, redis_py, lock_name, wait_mode)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_case(
    blocking_client: Any, blocking_client2: Any, redis_py: Any, lock_name: str, wait_mode: str
) -> None:
    keys = lock_keys(lock_name)
    holder = blocking_client.acquire(lock_name, wait_mode=wait_mode)
    sent: list[float] = []
    queued: list[bool] = []

    def interrupt() -> None:
        # Once the waiter is queued (so the check below can fail); sent in
        # any case, so a waiter that never queued cannot hang the suite.
        try:
            wait_until(lambda: redis_py.zcard(keys.queue) == 1, 5.0, "the waiter to queue")
            queued.append(True)
        except TimeoutError:
            pass
        finally:
            sent.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Timer(0.1, interrupt)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            blocking_client2.acquire(lock_name, wait=None, wait_mode=wait_mode, waiter_lease=60.0)
        interrupted = time.monotonic()
    finally:
        timer.join(10)
    assert sent, "the signal was never sent"
    assert queued, "the waiter never queued"
    assert interrupted - sent[0] < 1.0
    wait_until(
        lambda: redis_py.zcard(keys.queue) == 0 and redis_py.zcard(keys.waiters) == 0,
        2.0,
        "the interrupted waiter's queue entry to go",
    )
    assert holder.release()
    assert not redis_py.exists(keys.lock)
    blocking_client.acquire(lock_name, wait=0, wait_mode=wait_mode).release()
