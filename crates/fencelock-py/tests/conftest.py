"""Fixtures of the fencelock Python suite.

Servers (session-scoped, started on first use, private, on free loopback
ports, killed at teardown and with the test process; see ``servers.py``):

- ``redis_server``: a ``redis-server`` without a password
  (:class:`servers.RedisServer`: ``.url``, ``.port``, ``.process``).
- ``redis_password_server``: one with ``--requirepass`` :data:`PASSWORD`
  (its ``.url`` holds the password; ``.url_with_password(pw)`` any other).
- ``etcd_server``: a single-member ``etcd`` (``.url`` is ``etcd://...``);
  tests using it fail when etcd cannot start (``scripts/setup.sh``
  installs it).
- ``postgres_server``: a Postgres cluster (``.dsn``), run as the
  ``postgres`` OS user when the suite runs as root; tests using it fail
  without Postgres binaries (``scripts/setup.sh`` installs them).

Per test:

- ``lock_name``: a fresh lock name (``test-<uuid>``); tests are isolated by
  names, not by servers, so they share the session's servers.
- ``redis_url``, ``etcd_url``; ``backend_url``: parametrized over Redis and
  etcd (ids ``redis``/``etcd``) for tests meant for both.
- ``redis_py``: a synchronous ``redis.Redis`` (``decode_responses=True``) on
  ``redis_server`` to inspect or break keys (``lock_keys(name)`` gives the
  key names of the default layout).
- ``client`` / ``client2``: ``fencelock.Client`` on ``redis_server`` (two
  separate connections, for two "processes"), closed at teardown.
- ``blocking_client`` / ``blocking_client2``: the same, blocking.

Helpers importable from ``servers``: ``wait_until`` and
``async_wait_until`` (poll a predicate against a deadline: the suite never
sleeps hoping something happened).

pytest-asyncio runs in auto mode (``pytest.ini``): ``async def`` tests and
fixtures need no marker. Each test has its own event loop; a ``Client`` is
not tied to a loop, but its futures are, so async client fixtures are
function-scoped.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

import pytest

from servers import EtcdServer, PostgresServer, RedisServer, ServerError, postgres_bin_dir

#: The password of ``redis_password_server``: the redaction tests assert it
#: appears in no text the package produces.
PASSWORD = "s3cret-pw"

#: The default key prefix of the Rust library (``DEFAULT_PREFIX``).
PREFIX = "lock:"


@dataclass(frozen=True)
class LockKeys:
    """The Redis keys of a name in the default (hash-tagged) layout, as
    ``crates/fencelock/src/keys.rs`` builds them."""

    lock: str
    fence: str
    queue: str
    waiters: str

    def all(self) -> tuple[str, ...]:
        return (self.lock, self.fence, self.queue, self.waiters)


def lock_keys(name: str, prefix: str = PREFIX) -> LockKeys:
    """The keys of ``name`` under ``prefix`` (default layout)."""
    lock = f"{prefix}{{{name}}}"
    return LockKeys(lock, f"{lock}:fence", f"{lock}:queue", f"{lock}:waiters")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "etcd: needs the etcd server")
    config.addinivalue_line("markers", "postgres: needs the Postgres server")


# --- servers ---------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_password_server() -> Iterator[RedisServer]:
    server = RedisServer.start(password=PASSWORD)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    try:
        server = EtcdServer.start()
    except (ServerError, FileNotFoundError) as e:
        pytest.fail(f"etcd could not start (scripts/setup.sh installs etcd-server): {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    if postgres_bin_dir() is None:
        pytest.fail("no Postgres binaries (initdb) found: scripts/setup.sh installs postgresql")
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    return etcd_server.url


@pytest.fixture(params=["redis", "etcd"])
def backend_url(request: pytest.FixtureRequest) -> str:
    """The URL of each backend in turn (tests for both Redis and etcd)."""
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    return request.getfixturevalue("etcd_server").url


# --- per test -------------------------------------------------------------


@pytest.fixture
def lock_name() -> str:
    """A lock name no other test uses."""
    return f"test-{uuid.uuid4()}"


@pytest.fixture
def redis_py(redis_server: RedisServer) -> Iterator["object"]:
    """A redis-py client on ``redis_server`` for inspecting and breaking
    keys (``decode_responses=True``)."""
    import redis

    r = redis.Redis(host="127.0.0.1", port=redis_server.port, decode_responses=True)
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator["object"]:
    import fencelock

    c = await fencelock.connect(redis_server.url)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def client2(redis_server: RedisServer) -> AsyncIterator["object"]:
    """A second client (its own connection) on the same server."""
    import fencelock

    c = await fencelock.connect(redis_server.url)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
def blocking_client(redis_server: RedisServer) -> Iterator["object"]:
    import fencelock

    c = fencelock.connect_blocking(redis_server.url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def blocking_client2(redis_server: RedisServer) -> Iterator["object"]:
    import fencelock

    c = fencelock.connect_blocking(redis_server.url)
    try:
        yield c
    finally:
        c.close()
