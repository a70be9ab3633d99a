"""Private servers for the test suite: ``redis-server``, ``etcd`` and
Postgres, each on a free loopback port in a temporary directory.

Every server is a child of the test process started with
``PR_SET_PDEATHSIG = SIGKILL``, so it dies with the process even when pytest
is killed (``kill -9``, a CI timeout) and never outlives a run; ``stop()``
ends it at teardown. Readiness is polled against a deadline (a real request:
``PING``, ``/health``, ``pg_isready``), never assumed after a fixed sleep.

The well-known ports (6379, 2379, 2380, 5432) are never used, so a developer's
own servers are never touched.

Usable without pytest::

    with RedisServer.start() as redis:
        print(redis.url)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

__all__ = [
    "ServerError",
    "free_port",
    "wait_until",
    "async_wait_until",
    "Process",
    "RedisServer",
    "EtcdServer",
    "PostgresServer",
    "postgres_bin_dir",
]

#: Ports the suite never uses: the default ports of a developer's own servers.
RESERVED_PORTS = frozenset({6379, 6380, 2379, 2380, 5432, 26379})
#: How long a server may take to become ready.
START_DEADLINE = 30.0

_PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """A server did not start; the message holds its log's tail."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (never a reserved one). Another process
    may take it before the server binds it: starters retry on that."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


def wait_until(
    check: Callable[[], bool], deadline: float, what: str, interval: float = 0.02
) -> None:
    """Polls ``check`` until it returns True, for at most ``deadline``
    seconds (monotonic); ``TimeoutError`` naming ``what`` after it. The
    suite's one way of waiting for something to happen."""
    end = time.monotonic() + deadline
    while True:
        if check():
            return
        if time.monotonic() >= end:
            raise TimeoutError(f"{what}: not within {deadline:.1f}s")
        time.sleep(interval)


async def async_wait_until(
    check: Callable[[], bool], deadline: float, what: str, interval: float = 0.02
) -> None:
    """``wait_until`` for a coroutine: polls without blocking the loop."""
    import asyncio

    end = time.monotonic() + deadline
    while True:
        if check():
            return
        if time.monotonic() >= end:
            raise TimeoutError(f"{what}: not within {deadline:.1f}s")
        await asyncio.sleep(interval)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _child_setup(parent: int, user: Optional[pwd.struct_passwd]) -> Callable[[], None]:
    """The ``preexec_fn`` of every server: drop to ``user`` if given, then
    ask for SIGKILL when the parent dies. The order matters: a change of
    credentials clears the parent-death signal, so it is set last; and if
    the parent died before it was set, the child exits at once."""
    libc = _libc()

    def setup() -> None:
        if user is not None:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return setup


@dataclass
class Process:
    """A server process with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def spawn(
        cls,
        name: str,
        argv: Sequence[str],
        log: Path,
        *,
        user: Optional[pwd.struct_passwd] = None,
        env: Optional[dict[str, str]] = None,
        cwd: Optional[Path] = None,
    ) -> "Process":
        out = open(log, "ab")
        try:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_child_setup(os.getpid(), user),
                env=env,
                cwd=cwd,
                # Its own process group: a Ctrl-C test sends SIGINT to this
                # process only, never to the servers.
                start_new_session=True,
            )
        finally:
            out.close()
        return cls(name, popen, log)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def check_alive(self) -> None:
        if not self.alive():
            raise ServerError(
                f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}"
            )

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; waits for the exit."""
        if self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout)

    def pause(self) -> None:
        """SIGSTOP: the server stops answering (a stall, a GC pause)."""
        self.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.popen.send_signal(signal.SIGCONT)


def _start_with_retry(start: Callable[[], "_Server"], attempts: int = 3) -> "_Server":
    # A free port can be taken between free_port() and the server's bind.
    last: Optional[Exception] = None
    for _ in range(attempts):
        try:
            return start()
        except ServerError as e:
            last = e
    assert last is not None
    raise last


class _Server:
    process: Process
    tmp: Path

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _redis_ping(port: int, password: Optional[str]) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            if password is not None:
                s.sendall(f"AUTH {password}\r\n".encode())
                if not s.recv(64).startswith(b"+OK"):
                    return False
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisServer(_Server):
    """A private ``redis-server`` without persistence."""

    port: int
    process: Process
    tmp: Path
    password: Optional[str] = None

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` (with ``:PASSWORD@`` when it has one)."""
        auth = f":{self.password}@" if self.password is not None else ""
        return f"redis://{auth}127.0.0.1:{self.port}"

    def url_with_password(self, password: str) -> str:
        return f"redis://:{password}@127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls, *, password: Optional[str] = None, extra: Sequence[str] = ()
    ) -> "RedisServer":
        def once() -> RedisServer:
            tmp = Path(tempfile.mkdtemp(prefix="fencelock-py-redis-"))
            port = free_port()
            argv = [
                shutil.which("redis-server") or "redis-server",
                "--bind", "127.0.0.1",
                "--port", str(port),
                "--dir", str(tmp),
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--protected-mode", "no",
                *(["--requirepass", password] if password is not None else []),
                *extra,
            ]  # fmt: skip
            process = Process.spawn("redis-server", argv, tmp / "redis.log")
            server = cls(port=port, process=process, tmp=tmp, password=password)
            try:
                end = time.monotonic() + START_DEADLINE
                while not _redis_ping(port, password):
                    process.check_alive()
                    if time.monotonic() > end:
                        raise ServerError(f"redis-server not ready:\n{process.log_tail()}")
                    time.sleep(0.02)
            except BaseException:
                server.stop()
                raise
            return server

        return _start_with_retry(once)  # type: ignore[return-value]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as r:
            return r.status == 200 and b"true" in r.read()
    except OSError:
        return False


@dataclass
class EtcdServer(_Server):
    """A private single-member ``etcd``."""

    port: int
    process: Process
    tmp: Path

    @property
    def url(self) -> str:
        """``etcd://127.0.0.1:PORT``, as fencelock takes it."""
        return f"etcd://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT``, as ``etcdctl --endpoints`` takes it."""
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls) -> "EtcdServer":
        def once() -> EtcdServer:
            tmp = Path(tempfile.mkdtemp(prefix="fencelock-py-etcd-"))
            port, peer = free_port(), free_port()
            client, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
            argv = [
                shutil.which("etcd") or "etcd",
                "--name=default",
                f"--data-dir={tmp / 'data'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-outputs=stderr",
                "--log-level=warn",
            ]
            process = Process.spawn("etcd", argv, tmp / "etcd.log")
            server = cls(port=port, process=process, tmp=tmp)
            try:
                end = time.monotonic() + START_DEADLINE
                while not _http_ok(f"{client}/health"):
                    process.check_alive()
                    if time.monotonic() > end:
                        raise ServerError(f"etcd not ready:\n{process.log_tail()}")
                    time.sleep(0.05)
            except BaseException:
                server.stop()
                raise
            return server

        return _start_with_retry(once)  # type: ignore[return-value]


def postgres_bin_dir() -> Optional[Path]:
    """The newest ``/usr/lib/postgresql/*/bin`` holding ``initdb``, if any."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if candidates:
        return candidates[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class PostgresServer(_Server):
    """A private Postgres cluster (``initdb`` + ``postgres``), trust
    authentication on loopback, user and database ``postgres``.

    Postgres refuses to run as root, so when the tests run as root the
    server runs as the ``postgres`` OS user (dropped to in the child, before
    the parent-death signal is set) in a temporary directory it owns."""

    port: int
    process: Process
    tmp: Path

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres`` (asyncpg and
        psycopg both take it)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    def start(cls) -> "PostgresServer":
        bindir = postgres_bin_dir()
        if bindir is None:
            raise ServerError("no Postgres binaries (initdb) found")
        user: Optional[pwd.struct_passwd] = None
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
        tmp = Path(tempfile.mkdtemp(prefix="fencelock-py-pg-"))
        data, sockets = tmp / "data", tmp / "sock"
        sockets.mkdir()
        if user is not None:
            for p in (tmp, sockets):
                os.chown(p, user.pw_uid, user.pw_gid)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        initdb = Process.spawn(
            "initdb",
            [
                str(bindir / "initdb"),
                "-D", str(data),
                "-U", "postgres",
                "--auth=trust",
                "-E", "UTF8",
                "--no-sync",
            ],  # fmt: skip
            tmp / "initdb.log",
            user=user,
            env=env,
            cwd=tmp,
        )
        try:
            code = initdb.popen.wait(120)
        except subprocess.TimeoutExpired:
            initdb.stop()
            shutil.rmtree(tmp, ignore_errors=True)
            raise ServerError("initdb took more than 120 s") from None
        if code != 0:
            tail = initdb.log_tail()
            shutil.rmtree(tmp, ignore_errors=True)
            raise ServerError(f"initdb exited with {code}:\n{tail}")

        def once() -> PostgresServer:
            port = free_port()
            argv = [
                str(bindir / "postgres"),
                "-D", str(data),
                "-p", str(port),
                "-k", str(sockets),
                "-c", "listen_addresses=127.0.0.1",
                "-c", "fsync=off",
                "-c", "synchronous_commit=off",
                "-c", "full_page_writes=off",
            ]  # fmt: skip
            process = Process.spawn("postgres", argv, tmp / "postgres.log", user=user, env=env, cwd=tmp)
            server = cls(port=port, process=process, tmp=tmp)
            isready = [str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)]
            end = time.monotonic() + START_DEADLINE
            while subprocess.run(isready, check=False, timeout=10).returncode != 0:
                if not process.alive():
                    raise ServerError(f"postgres exited:\n{process.log_tail()}")
                if time.monotonic() > end:
                    process.stop()
                    raise ServerError(f"postgres not ready:\n{process.log_tail()}")
                time.sleep(0.05)
            return server

        try:
            return _start_with_retry(once)  # type: ignore[return-value]
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


@contextlib.contextmanager
def running(server: _Server) -> Iterator[_Server]:
    """Stops ``server`` at exit."""
    try:
        yield server
    finally:
        server.stop()
