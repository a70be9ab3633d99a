"""A holder that the test freezes with SIGSTOP past its lease.

    paused_holder.py URL NAME HASH_KEY UNFENCED_KEY TTL API [DATA_URL]

URL is the lock's server (Redis or etcd), DATA_URL the Redis of both hashes
(default URL; a fenced hash takes a lease of either backend). Takes NAME with a TTL-second lease, writes ``A`` to the fenced hash
HASH_KEY with its fence (and, as the control, to the plain hash
UNFENCED_KEY with HSET: what a worker without fencing would do), prints
``holding FENCE ACCEPTED``, then idles in the lock's body in 10 ms steps.
The test stops it, lets another holder take the lock and write, and
resumes it. Once awake it writes ``stale-A`` once more, to both hashes,
whatever it knows about its lease, and reports:

- ``async``: the loss cancels the body (``body-cancelled SECONDS``, how
  long it ran on after seeing the clock jump, ``woke``) and
  ``async with`` raises ``LockLost`` (``lost FENCE REASON``); the stale
  writes are sent after that (``stale-write ACCEPTED``).
- ``blocking``: the body idles until the test, once it resumed the
  process, sends the line ``wake``; it writes at once
  (``stale-write ACCEPTED``), then ``lease.extend()`` raises ``LockLost``
  (``extend-lost FENCE REASON``) and the ``with`` exit raises it too
  (``lost FENCE REASON``).

Last lines: ``release RESULT`` (a release of the lost lease) and ``end``.
"""

from __future__ import annotations

import asyncio
import select
import sys
import time

import redis
import redis.asyncio

import fencelock
from _procs import emit, set_pdeathsig

#: A 10 ms sleep that took longer than this was a pause (SIGSTOP).
WOKE = 0.5


async def run_async(url: str, data_url: str, name: str, hkey: str, ukey: str, ttl: float) -> None:
    r = redis.asyncio.Redis.from_url(data_url, decode_responses=True)
    client = await fencelock.connect(url)
    data = client if data_url == url else await fencelock.connect(data_url)
    h = data.fenced_hash(hkey)
    held = None
    try:
        async with client.lock(name, ttl=ttl, wait=10.0) as lease:
            held = lease
            ok = await h.write(lease, "A")
            await r.hset(ukey, "value", "A")
            emit("holding", lease.fence, ok)
            woke_at = None
            try:
                while True:
                    t = time.monotonic()
                    await asyncio.sleep(0.01)
                    if time.monotonic() - t > WOKE:
                        woke_at = time.monotonic()
                        emit("woke")
            except asyncio.CancelledError:
                # How long the body ran on after it saw that it had slept.
                late = 0.0 if woke_at is None else time.monotonic() - woke_at
                emit("body-cancelled", f"{late:.3f}")
                raise
        emit("body-ended-without-loss")
    except fencelock.LockLost as e:
        emit("lost", e.fence, e.reason)
    assert held is not None
    ok = await h.write(held, "stale-A")
    await r.hset(ukey, "value", "stale-A")
    emit("stale-write", ok)
    emit("lease-lost", held.lost, held.loss_reason)
    emit("release", await held.release())
    await client.close()
    await data.close()
    await r.aclose()
    emit("end")


def run_blocking(url: str, data_url: str, name: str, hkey: str, ukey: str, ttl: float) -> None:
    r = redis.Redis.from_url(data_url, decode_responses=True)
    client = fencelock.connect_blocking(url)
    data = client if data_url == url else fencelock.connect_blocking(data_url)
    h = data.fenced_hash(hkey)
    held = None
    try:
        with client.lock(name, ttl=ttl, wait=10.0) as lease:
            held = lease
            ok = h.write(lease, "A")
            r.hset(ukey, "value", "A")
            emit("holding", lease.fence, ok)
            # Idle until the test, having resumed this process, says "wake".
            while not select.select([sys.stdin], [], [], 0.01)[0]:
                pass
            sys.stdin.readline()
            # Awake: write at once, before asking anything about the lease.
            ok = h.write(lease, "stale-A")
            r.hset(ukey, "value", "stale-A")
            emit("stale-write", ok)
            try:
                lease.extend()
                emit("extend-ok")
            except fencelock.LockLost as e:
                emit("extend-lost", e.fence, e.reason)
        emit("body-ended-without-loss")
    except fencelock.LockLost as e:
        emit("lost", e.fence, e.reason)
    assert held is not None
    emit("lease-lost", held.lost, held.loss_reason)
    emit("release", held.release())
    client.close()
    data.close()
    r.close()
    emit("end")


def main() -> None:
    set_pdeathsig()
    url, name, hkey, ukey, ttl, api = sys.argv[1:7]
    data_url = sys.argv[7] if len(sys.argv) > 7 else url
    if api == "async":
        asyncio.run(run_async(url, data_url, name, hkey, ukey, float(ttl)))
    else:
        run_blocking(url, data_url, name, hkey, ukey, float(ttl))


if __name__ == "__main__":
    main()
