"""A model-based test: hypothesis drives acquire, release, extend, write,
register and read by three blocking clients on one name and one fenced
hash, against a small Python model of what must happen:

- the lock: who holds it (one lease or nobody) and the last fence issued;
  an acquire with ``wait=0`` succeeds iff the model says the lock is free,
  and its fence is above every earlier one; a release returns True iff the
  lease still holds the lock; an extend succeeds iff it does (else
  ``LockLost``);
- the fenced hash: the stored value, fence and holder id; a write (or
  registration) is accepted iff its fence is greater than the stored one,
  or equal and from the same holder (README "Fenced Redis hash").

Leases are long (60 s), so time plays no part; a rule deletes the lock key
through redis-py (an expiry or loss the holder has not noticed): the old
holder's writes are then still accepted until a newer holder writes or
registers. An invariant checks the lock key itself after every step.

The negative control runs the same machine with a model that believes a
lease no longer holding the lock cannot write, and hypothesis finds the
sequence (acquire, expiry, write) that shows it wrong.
"""

from __future__ import annotations

import traceback
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

import fencelock
from _procs import default_keys

TTL = 60.0
ACTORS = 3


@dataclass(eq=False)
class Rec:
    """A lease the machine got, with what the model knows of it."""

    actor: int
    lease: Any
    released: bool = False

    @property
    def fence(self) -> int:
        return int(self.lease.fence)

    @property
    def holder_id(self) -> str:
        return str(self.lease.holder_id)


class LockMachine(RuleBasedStateMachine):
    #: Set by the test before the machine runs: the clients and redis-py.
    clients: ClassVar[list[Any]] = []
    redis_py: ClassVar[Any] = None
    #: The negative control's broken belief.
    lost_lease_cannot_write: ClassVar[bool] = False

    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.name = f"sm-{uuid.uuid4()}"
        self.keys = default_keys(self.name)
        self.holder: Optional[Rec] = None
        self.last_fence = 0
        self.stored: tuple[Optional[str], Optional[int], Optional[str]] = (None, None, None)
        self.all: list[Rec] = []

    @initialize()
    def start(self) -> None:
        self.hashes = [c.fenced_hash(f"data:{self.name}") for c in self.clients]

    # --- the lock ---------------------------------------------------------

    @rule(target=leases, actor=st.integers(0, ACTORS - 1))
    def acquire(self, actor: int) -> Any:
        client = self.clients[actor]
        if self.holder is None:
            lease = client.acquire(self.name, ttl=TTL, wait=0)
            assert lease.fence > self.last_fence, (lease.fence, self.last_fence)
            assert not lease.lost
            self.last_fence = lease.fence
            rec = Rec(actor, lease)
            self.holder = rec
            self.all.append(rec)
            return rec
        with pytest.raises(fencelock.Contended):
            client.acquire(self.name, ttl=TTL, wait=0)
        return multiple()

    @rule(rec=leases)
    def release(self, rec: Rec) -> None:
        expected = self.holder is rec
        assert rec.lease.release() is expected, (expected, rec)
        if expected:
            self.holder = None
        rec.released = True

    @rule(rec=leases)
    def extend(self, rec: Rec) -> None:
        if self.holder is rec:
            rec.lease.extend()
            assert not rec.lease.lost
        else:
            with pytest.raises(fencelock.LockLost):
                rec.lease.extend()

    @precondition(lambda self: self.holder is not None)
    @rule()
    def expire(self) -> None:
        """The lock key vanishes (an expiry, an eviction) while its holder
        does not know yet."""
        assert self.redis_py.delete(self.keys["lock"]) == 1
        self.holder = None

    # --- the fenced hash ---------------------------------------------------

    def _accepts(self, rec: Rec) -> bool:
        if self.lost_lease_cannot_write and self.holder is not rec:
            return False  # the broken belief of the negative control
        _, fence, holder = self.stored
        return fence is None or rec.fence > fence or (rec.fence == fence and rec.holder_id == holder)

    @rule(rec=leases, via=st.integers(0, ACTORS - 1), value=st.sampled_from(["a", "b", "c", "d"]))
    def write(self, rec: Rec, via: int, value: str) -> None:
        """Any client's hash may carry the write: the lease decides."""
        expected = self._accepts(rec)
        assert self.hashes[via].write(rec.lease, value) is expected, (expected, rec.fence, self.stored)
        if expected:
            self.stored = (value, rec.fence, rec.holder_id)

    @rule(rec=leases)
    def register(self, rec: Rec) -> None:
        expected = self._accepts(rec)
        assert self.hashes[rec.actor].register(rec.lease) is expected, (expected, rec.fence, self.stored)
        if expected:
            self.stored = (self.stored[0], rec.fence, rec.holder_id)

    @rule(via=st.integers(0, ACTORS - 1))
    def read(self, via: int) -> None:
        assert tuple(self.hashes[via].read()) == self.stored

    # --- invariants ------------------------------------------------------------

    @invariant()
    def lock_key_matches_the_model(self) -> None:
        if not hasattr(self, "hashes"):
            return
        value = self.redis_py.get(self.keys["lock"])
        if self.holder is None:
            assert value is None, value
        else:
            assert value == f"{self.holder.lease.token}:{self.holder.fence}", value
            assert not self.holder.lease.lost

    @invariant()
    def fence_counter_at_least_the_last_fence(self) -> None:
        if self.last_fence:
            assert int(self.redis_py.get(self.keys["fence"])) >= self.last_fence

    def teardown(self) -> None:
        for rec in self.all:
            if not rec.released:
                rec.lease.release()
        self.redis_py.delete(*self.keys.values(), f"data:{self.name}")


@pytest.fixture
def machine_clients(redis_server: Any, redis_py: Any) -> Any:
    clients = [fencelock.connect_blocking(redis_server.url) for _ in range(ACTORS)]
    try:
        yield clients
    finally:
        for c in clients:
            c.close()


def _run(machine: type[LockMachine], clients: list[Any], redis_py: Any, **overrides: Any) -> None:
    machine.clients = clients
    machine.redis_py = redis_py
    base: dict[str, Any] = dict(
        max_examples=100,
        stateful_step_count=30,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    base.update(overrides)
    run_state_machine_as_test(machine, settings=settings(**base))


def test_lock_state_machine(machine_clients: list[Any], redis_py: Any) -> None:
    _run(LockMachine, machine_clients, redis_py)


class BrokenBeliefMachine(LockMachine):
    lost_lease_cannot_write = True


def test_negative_control_state_machine_finds_a_wrong_model(machine_clients: list[Any], redis_py: Any) -> None:
    """The machine can fail: with the model's write rule replaced by "a
    lease that no longer holds the lock is refused", hypothesis finds a
    sequence where the real hash accepts such a write (no newer holder had
    written)."""
    with pytest.raises(AssertionError) as info:
        _run(
            BrokenBeliefMachine,
            machine_clients,
            redis_py,
            max_examples=200,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
        )
    # It is the write rule that failed: the real hash accepted the write.
    assert "write" in "".join(traceback.format_tb(info.value.__traceback__)), info.value
    assert str(info.value).startswith("(False,"), info.value
