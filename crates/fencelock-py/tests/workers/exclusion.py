"""A worker of the mutual-exclusion tests: rounds of acquire, log
``enter PID FENCE`` to a Redis list, hold, log ``exit PID FENCE``, release.

    exclusion.py URL NAME LIST ROUNDS HOLD_SECONDS MODE API [LOG_URL]

URL is the lock's server (Redis or etcd); LOG_URL the Redis of the list
(default URL). MODE ``lock`` takes the fencelock lock around each round; ``none`` takes no
lock at all (the negative control). API ``async`` or ``blocking``.

Protocol on stdout/stdin: prints ``ready`` once connected, waits for a line
``go``, runs its rounds, prints ``done ROUNDS`` and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import redis
import redis.asyncio

import fencelock
from _procs import emit, set_pdeathsig


def main() -> None:
    set_pdeathsig()
    url, name, list_key, rounds, hold, mode, api = sys.argv[1:8]
    log_url = sys.argv[8] if len(sys.argv) > 8 else url
    if api == "async":
        asyncio.run(run_async(url, log_url, name, list_key, int(rounds), float(hold), mode))
    else:
        run_blocking(url, log_url, name, list_key, int(rounds), float(hold), mode)


async def run_async(
    url: str, log_url: str, name: str, list_key: str, rounds: int, hold: float, mode: str
) -> None:
    pid = os.getpid()
    r = redis.asyncio.Redis.from_url(log_url, decode_responses=True)
    async with await fencelock.connect(url) as client:
        await r.ping()
        emit("ready")
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        for _ in range(rounds):
            if mode == "lock":
                async with client.lock(name, ttl=10.0, wait=30.0) as lease:
                    await r.rpush(list_key, f"enter {pid} {lease.fence}")
                    await asyncio.sleep(hold)
                    await r.rpush(list_key, f"exit {pid} {lease.fence}")
            else:
                await r.rpush(list_key, f"enter {pid} 0")
                await asyncio.sleep(hold)
                await r.rpush(list_key, f"exit {pid} 0")
    await r.aclose()
    emit("done", rounds)


def run_blocking(
    url: str, log_url: str, name: str, list_key: str, rounds: int, hold: float, mode: str
) -> None:
    pid = os.getpid()
    r = redis.Redis.from_url(log_url, decode_responses=True)
    with fencelock.connect_blocking(url) as client:
        r.ping()
        emit("ready")
        sys.stdin.readline()
        for _ in range(rounds):
            if mode == "lock":
                with client.lock(name, ttl=10.0, wait=30.0) as lease:
                    r.rpush(list_key, f"enter {pid} {lease.fence}")
                    time.sleep(hold)
                    r.rpush(list_key, f"exit {pid} {lease.fence}")
            else:
                r.rpush(list_key, f"enter {pid} 0")
                time.sleep(hold)
                r.rpush(list_key, f"exit {pid} 0")
    r.close()
    emit("done", rounds)


if __name__ == "__main__":
    main()
