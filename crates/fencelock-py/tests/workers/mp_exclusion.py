"""The target of the ``multiprocessing`` exclusion tests (importable by a
``spawn`` child: ``workers.mp_exclusion``).

Each child connects in the child (never a client of its parent), waits at
the start event, then runs rounds of acquire, log ``enter PID FENCE`` to
a Redis list, hold, log ``exit PID FENCE``, release.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis

import fencelock
from _procs import set_pdeathsig


def run(url: str, name: str, list_key: str, rounds: int, hold: float, ready: Any, go: Any) -> None:
    set_pdeathsig()
    pid = os.getpid()
    r = redis.Redis.from_url(url, decode_responses=True)
    with fencelock.connect_blocking(url) as client:
        r.ping()
        ready.release()
        if not go.wait(30):
            raise SystemExit(4)
        for _ in range(rounds):
            with client.lock(name, ttl=10.0, wait=30.0) as lease:
                r.rpush(list_key, f"enter {pid} {lease.fence}")
                time.sleep(hold)
                r.rpush(list_key, f"exit {pid} {lease.fence}")
    r.close()
