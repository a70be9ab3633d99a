"""``os.fork()`` with a connected client and a held lease.

In the child the inherited lease is lost (reason ``"forked"``): ``extend()``
raises ``LockLost``, a release deletes nothing, the inherited client raises
``ClientClosed``; a client connected in the child works. In the parent the
lease is still held, renewed and releasable, and nothing the child did or
its exit released it.

The negative controls show the "still held" check can fail: a child that
sends the release script with the inherited token (what a fork-unaware
library would do at exit) does free the parent's lock, and a release in the
parent is seen as one.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any, Callable

import pytest

import fencelock
from _procs import default_keys, fork_and_report, poll, set_pdeathsig

#: The compare-and-delete of the default layout (value ``TOKEN:FENCE``).
RAW_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


def held_by(redis_py: Any, lease: Any) -> bool:
    """Whether Redis holds ``lease``'s lock for it (the default layout's
    value is ``TOKEN:FENCE``)."""
    return bool(redis_py.get(default_keys(lease.name)["lock"]) == f"{lease.token}:{lease.fence}")


def _raises(exc: type[BaseException], fn: Callable[[], Any]) -> str:
    """``"raised"`` if ``fn()`` raises ``exc``, else what happened."""
    try:
        result = fn()
    except exc as e:
        return "raised" if not isinstance(e, fencelock.LockLost) else f"raised {e.reason} {e.fence}"
    except BaseException as e:  # reported, not hidden
        return f"other {type(e).__name__}: {e}"
    return f"returned {result!r}"


# --- blocking ---------------------------------------------------------------


def test_fork_blocking_child_sees_lost_lease_and_closed_client(
    redis_url: str, redis_py: Any, lock_name: str
) -> None:
    parent = fencelock.connect_blocking(redis_url)
    try:
        lease = parent.acquire(lock_name, ttl=1.0, wait=0)
        hkey = f"data:{lock_name}"
        other = f"{lock_name}-child"

        def child() -> dict[str, Any]:
            out: dict[str, Any] = {
                "lost": lease.lost,
                "reason": lease.loss_reason,
                "remaining": lease.remaining(),
                "check": _raises(fencelock.LockLost, lease.check),
                "extend": _raises(fencelock.LockLost, lease.extend),
                "acquire": _raises(fencelock.ClientClosed, lambda: parent.acquire(other, wait=0)),
                "read": _raises(fencelock.ClientClosed, lambda: parent.fenced_hash(hkey).read()),
                "closed": parent.closed,
            }
            # A release of the inherited lease: False (or LockLost), and
            # it must send nothing (checked in the parent).
            try:
                out["release"] = repr(lease.release())
            except fencelock.LockLost:
                out["release"] = "LockLost"
            # Closing the inherited client releases nothing of the parent's.
            try:
                parent.close()
                out["close"] = "ok"
            except fencelock.ClientClosed:
                out["close"] = "ClientClosed"
            # A client of the child's own works, and sees the parent's lock held.
            with fencelock.connect_blocking(redis_url) as mine:
                out["contended"] = _raises(
                    fencelock.Contended, lambda: mine.acquire(lock_name, ttl=5.0, wait=0)
                )
                with mine.lock(other, ttl=5.0, wait=5.0) as l2:
                    out["own_fence"] = l2.fence
                    out["own_write"] = mine.fenced_hash(hkey).write(l2, "from-child")
            # Finalizers of the inherited objects must not release either.
            gc.collect()
            return out

        code, out = fork_and_report(child)
        assert code == 0
        assert out["lost"] is True and out["reason"] == "forked", out
        assert out["remaining"] == 0.0, out
        assert out["check"].startswith("raised forked"), out
        assert out["extend"].startswith("raised forked"), out
        assert out["extend"].endswith(str(lease.fence)), out
        assert out["acquire"] == "raised", out
        assert out["read"] == "raised", out
        assert out["release"] in {"False", "LockLost"}, out
        assert out["close"] in {"ok", "ClientClosed"}, out
        assert out["contended"] == "raised", out
        assert out["own_fence"] > lease.fence and out["own_write"] is True, out

        # The parent's lease: still held, valid, renewed past its 1 s ttl.
        assert held_by(redis_py, lease), "the child's exit released the parent's lock"
        assert not lease.lost and lease.loss_reason is None
        renewed_past = time.monotonic() + 1.5
        poll(lambda: time.monotonic() > renewed_past, 3.0, "1.5 s")
        assert held_by(redis_py, lease) and not lease.lost, "renewal stopped after the fork"
        lease.extend()
        assert lease.release() is True
        assert redis_py.get(default_keys(lock_name)["lock"]) is None
        assert parent.fenced_hash(hkey).read().value == "from-child"
    finally:
        parent.close()


def test_fork_inside_a_lock_context(blocking_client: Any, redis_py: Any, lock_name: str) -> None:
    """A fork inside ``with client.lock()``: the child carries on with the
    parent's code and leaves the ``with`` (its exit raises ``LockLost``,
    reason ``forked``), then exits; the parent's lock stays held until the
    parent's own exit releases it."""
    r, w = os.pipe()
    pid = -1
    try:
        with blocking_client.lock(lock_name, ttl=5.0, wait=0) as lease:
            pid = os.fork()
            if pid == 0:
                set_pdeathsig()
            else:
                os.close(w)
                report = _read_all(r, 20.0)
                assert _exit_code(pid, 20.0) == 0
                assert report == "LockLost forked", report
                assert held_by(redis_py, lease), "the child's exit released the parent's lock"
    except BaseException as e:
        if pid == 0:
            _child_report(w, f"{type(e).__name__} {getattr(e, 'reason', None)}")
        raise
    finally:
        if pid == 0:
            _child_report(w, "no error")
    assert not held_by(redis_py, lease)
    assert redis_py.get(default_keys(lock_name)["lock"]) is None


def _child_report(w: int, text: str) -> None:
    """The child's last act: ``text`` to the pipe, then ``os._exit(0)``."""
    try:
        os.write(w, text.encode())
    finally:
        os._exit(0)


def _read_all(r: int, deadline: float) -> str:
    import select

    chunks: list[bytes] = []
    end = time.monotonic() + deadline
    try:
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError("the child did not report")
            chunk = os.read(r, 4096)
            if not chunk:
                return b"".join(chunks).decode()
            chunks.append(chunk)
    finally:
        os.close(r)


def _exit_code(pid: int, deadline: float) -> int:
    end = time.monotonic() + deadline
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > end:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise TimeoutError(f"child {pid} did not exit")
        time.sleep(0.01)


# --- asyncio ------------------------------------------------------------------


def test_fork_asyncio_child_sees_lost_lease_and_closed_client(
    redis_url: str, redis_py: Any, lock_name: str
) -> None:
    """The asyncio API: the parent connects and acquires in one event loop
    (``asyncio.run``), forks outside it; the child runs its own loop."""
    other = f"{lock_name}-child"

    async def setup() -> tuple[Any, Any]:
        client = await fencelock.connect(redis_url)
        return client, await client.acquire(lock_name, ttl=1.0, wait=0)

    client, lease = asyncio.run(setup())
    try:

        async def in_child() -> dict[str, Any]:
            out: dict[str, Any] = {"lost": lease.lost, "reason": lease.loss_reason}
            try:
                await lease.extend()
                out["extend"] = "ok"
            except fencelock.LockLost as e:
                out["extend"] = f"LockLost {e.reason} {e.fence}"
            try:
                await client.acquire(other, wait=0)
                out["acquire"] = "ok"
            except fencelock.ClientClosed:
                out["acquire"] = "ClientClosed"
            try:
                out["release"] = repr(await lease.release())
            except fencelock.LockLost:
                out["release"] = "LockLost"
            async with await fencelock.connect(redis_url) as mine:
                async with mine.lock(other, ttl=5.0, wait=5.0) as l2:
                    out["own_fence"] = l2.fence
            return out

        code, out = fork_and_report(lambda: asyncio.run(in_child()))
        assert code == 0
        assert out["lost"] is True and out["reason"] == "forked", out
        assert out["extend"] == f"LockLost forked {lease.fence}", out
        assert out["acquire"] == "ClientClosed", out
        assert out["release"] in {"False", "LockLost"}, out
        assert out["own_fence"] > lease.fence, out

        assert held_by(redis_py, lease)
        renewed_past = time.monotonic() + 1.5
        poll(lambda: time.monotonic() > renewed_past, 3.0, "1.5 s")

        async def after() -> bool:
            assert held_by(redis_py, lease) and not lease.lost
            await lease.extend()
            return bool(await lease.release())

        assert asyncio.run(after()) is True
        assert redis_py.get(default_keys(lock_name)["lock"]) is None
    finally:
        asyncio.run(client.close())


# --- negative controls ----------------------------------------------------------


def test_negative_control_a_child_that_releases_the_token_frees_the_lock(
    blocking_client: Any, redis_py: Any, lock_name: str
) -> None:
    """What the "still held" check would see if a child released the
    parent's lease: the child sends the release script with the inherited
    token through a connection of its own; the parent's lock is gone and its
    release returns False."""
    import redis

    lease = blocking_client.acquire(lock_name, ttl=5.0, wait=0)
    port = redis_py.connection_pool.connection_kwargs["port"]

    def child() -> int:
        r = redis.Redis(host="127.0.0.1", port=port)
        try:
            return int(r.eval(RAW_RELEASE, 1, default_keys(lock_name)["lock"], f"{lease.token}:{lease.fence}"))
        finally:
            r.close()

    code, deleted = fork_and_report(child)
    assert code == 0 and deleted == 1
    assert not held_by(redis_py, lease)
    assert lease.release() is False


def test_negative_control_a_release_in_the_parent_is_seen(
    blocking_client: Any, redis_py: Any, lock_name: str
) -> None:
    lease = blocking_client.acquire(lock_name, ttl=5.0, wait=0)
    assert held_by(redis_py, lease)
    assert lease.release() is True
    assert not held_by(redis_py, lease)


@pytest.mark.parametrize("api", ["async", "blocking"])
def test_fork_child_can_take_the_lock_once_the_parent_releases(
    redis_url: str, redis_py: Any, lock_name: str, api: str
) -> None:
    """A child waits on the name its parent holds (with its own client);
    the parent releases; the child gets the lock with a higher fence."""
    parent = fencelock.connect_blocking(redis_url)
    try:
        lease = parent.acquire(lock_name, ttl=5.0, wait=0)
        key = default_keys(lock_name)["lock"]

        def child() -> int:
            if api == "blocking":
                with fencelock.connect_blocking(redis_url) as mine:
                    with mine.lock(lock_name, ttl=5.0, wait=20.0) as l2:
                        return l2.fence

            async def go() -> int:
                async with await fencelock.connect(redis_url) as mine:
                    async with mine.lock(lock_name, ttl=5.0, wait=20.0) as l2:
                        return l2.fence

            return asyncio.run(go())

        import threading

        result: dict[str, Any] = {}
        t = threading.Thread(target=lambda: result.update(r=fork_and_report(child)))
        t.start()
        try:
            # The child is waiting once it is queued (notify mode) or has tried.
            poll(lambda: redis_py.zcard(default_keys(lock_name)["queue"]) > 0, 10, "the child queued")
            assert held_by(redis_py, lease)
            assert lease.release() is True
        finally:
            t.join(30)
        code, fence = result["r"]
        assert code == 0 and fence > lease.fence
        assert redis_py.get(key) is None
    finally:
        parent.close()


@pytest.mark.etcd
def test_fork_on_etcd(etcd_url: str, lock_name: str) -> None:
    """The same rules on etcd: the child's inherited lease is lost
    (``forked``) and its release deletes nothing; the inherited client is
    closed; the child's own client sees the parent's lock held. The parent's
    lease outlives the child (another client is refused) and releases."""
    parent = fencelock.connect_blocking(etcd_url)
    other = fencelock.connect_blocking(etcd_url)
    try:
        lease = parent.acquire(lock_name, ttl=5.0, wait=0)

        def child() -> dict[str, Any]:
            out: dict[str, Any] = {"lost": lease.lost, "reason": lease.loss_reason}
            out["extend"] = _raises(fencelock.LockLost, lease.extend)
            out["acquire"] = _raises(fencelock.ClientClosed, lambda: parent.acquire(f"{lock_name}-x", wait=0))
            try:
                out["release"] = repr(lease.release())
            except fencelock.LockLost:
                out["release"] = "LockLost"
            with fencelock.connect_blocking(etcd_url) as mine:
                out["contended"] = _raises(fencelock.Contended, lambda: mine.acquire(lock_name, wait=0))
                with mine.lock(f"{lock_name}-x", ttl=5.0, wait=5.0) as l2:
                    out["own_fence"] = l2.fence
            gc.collect()
            return out

        code, out = fork_and_report(child)
        assert code == 0
        assert out["lost"] is True and out["reason"] == "forked", out
        assert out["extend"].startswith("raised forked"), out
        assert out["acquire"] == "raised", out
        assert out["release"] in {"False", "LockLost"}, out
        assert out["contended"] == "raised", out
        assert out["own_fence"] > 0, out

        with pytest.raises(fencelock.Contended):
            other.acquire(lock_name, wait=0)
        assert not lease.lost
        lease.extend()
        assert lease.release() is True
        assert other.acquire(lock_name, wait=0).release() is True
    finally:
        other.close()
        parent.close()


FORK_THEN_EXIT = """
import asyncio, os, sys
import fencelock
URL, NAME = sys.argv[1], sys.argv[2]

async def use(tag):
    async with await fencelock.connect(URL) as client:
        async with client.lock(f"{NAME}-{tag}", ttl=5.0, wait=5.0):
            pass

async def hold():
    client = await fencelock.connect(URL)
    return client, await client.acquire(NAME, ttl=5.0, wait=0)

asyncio.run(use("parent"))
client, lease = asyncio.run(hold())
for i in range(10):
    pid = os.fork()
    if pid == 0:
        # The child uses the asyncio API, then leaves by the normal exit
        # path (atexit hooks, finalization), holding the parent's lease.
        asyncio.run(use(f"child-{i}"))
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    print("child", i, os.waitstatus_to_exitcode(status), flush=True)
print("parent-lost", lease.lost, flush=True)
print("released", asyncio.run(lease.release()), flush=True)
asyncio.run(client.close())
"""


def test_forked_children_exit_normally(redis_url: str, redis_py: Any, lock_name: str) -> None:
    """Children forked from a process that used the asyncio API (and holds a
    lease) use it themselves and exit by the normal path (``sys.exit``: the
    extension's exit hook and finalization run in the child). Each exits 0,
    promptly; the parent's lease survives them all and is released by the
    parent; the parent itself then exits 0."""
    from _procs import run_python

    ran = run_python(FORK_THEN_EXIT, redis_url, lock_name, deadline=60)
    assert ran.code == 0, ran
    lines = ran.lines()
    assert lines[:10] == [f"child {i} 0" for i in range(10)], ran
    assert lines[10:] == ["parent-lost False", "released True"], ran
    assert redis_py.get(default_keys(lock_name)["lock"]) is None
