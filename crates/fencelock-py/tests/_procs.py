"""Child processes for the process-level tests: worker scripts driven line
by line, one-off Python scripts with a bounded run time, and forked
children that report through a pipe.

Every child is started with ``PR_SET_PDEATHSIG = SIGKILL`` (it dies with the
test process, even one killed with SIGKILL) and is killed in a ``finally`` by
its owner; nothing here waits without a deadline.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

__all__ = [
    "TESTS",
    "WORKERS",
    "PREFIX",
    "set_pdeathsig",
    "Worker",
    "run_python",
    "fork_and_report",
    "guide_keys",
    "default_keys",
    "overlaps",
]

TESTS = Path(__file__).resolve().parent
WORKERS = TESTS / "workers"
#: The Rust library's default key prefix.
PREFIX = "lock:"

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def set_pdeathsig() -> None:
    """Asks for SIGKILL when this process's parent dies (for a child made by
    ``fork`` or ``multiprocessing``)."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _preexec(parent: int) -> Callable[[], None]:
    def setup() -> None:
        set_pdeathsig()
        if os.getppid() != parent:
            os._exit(1)

    return setup


def _child_env(extra: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = dict(os.environ)
    # The workers import `_procs` (this module) and nothing else of the suite.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTEST_CURRENT_TEST", None)
    if extra:
        env.update(extra)
    return env


def default_keys(name: str, prefix: str = PREFIX) -> dict[str, str]:
    """The Redis keys of ``name`` in the default (hash-tagged) layout."""
    lock = f"{prefix}{{{name}}}"
    return {"lock": lock, "fence": f"{lock}:fence", "queue": f"{lock}:queue",
            "waiters": f"{lock}:waiters"}  # fmt: skip


def guide_keys(name: str, prefix: str = PREFIX) -> dict[str, str]:
    """The Redis keys of ``name`` in the guide layout (``KeyLayout::Guide``:
    ``PREFIX NAME`` and ``PREFIX NAME:fence``)."""
    lock = f"{prefix}{name}"
    return {"lock": lock, "fence": f"{lock}:fence", "queue": f"{lock}:queue",
            "waiters": f"{lock}:waiters"}  # fmt: skip


def overlaps(events: Sequence[str]) -> int:
    """Counts critical sections entered while another was open, from a log of
    ``enter ID ...`` and ``exit ID ...`` lines in the order they happened."""
    inside: set[str] = set()
    count = 0
    for line in events:
        kind, who = line.split()[:2]
        if kind == "enter":
            if inside:
                count += 1
            inside.add(who)
        elif kind == "exit":
            inside.discard(who)
        else:
            raise ValueError(f"not an enter/exit line: {line!r}")
    return count


class Worker:
    """A Python worker script in a child process, driven line by line: the
    test sends lines on its stdin and waits (against a deadline) for lines
    on its stdout; its stderr goes to a file shown when something fails."""

    def __init__(self, script: str, *args: str, env: Optional[dict[str, str]] = None) -> None:
        self.script = script
        self._stderr = tempfile.NamedTemporaryFile(prefix="fencelock-worker-", suffix=".log")
        self.popen = subprocess.Popen(
            [sys.executable, str(WORKERS / script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=_child_env(env),
            preexec_fn=_preexec(os.getpid()),
            text=True,
            bufsize=1,
        )
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stderr(self) -> str:
        try:
            return Path(self._stderr.name).read_text(errors="replace")
        except OSError:
            return "(no stderr)"

    def describe(self) -> str:
        return (
            f"worker {self.script} (pid {self.pid}, exit {self.popen.poll()})\n"
            f"stdout so far: {self.seen}\nstderr:\n{self.stderr()[-4000:]}"
        )

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def expect(self, prefix: str, deadline: float = 15.0, skip: Sequence[str] = ()) -> str:
        """The next stdout line, which must start with ``prefix`` (lines
        starting with one of ``skip`` are passed over)."""
        end = time.monotonic() + deadline
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line {prefix!r} within {deadline}s\n{self.describe()}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"worker ended before {prefix!r}\n{self.describe()}")
            self.seen.append(line)
            if skip and line.startswith(tuple(skip)) and not line.startswith(prefix):
                continue
            if not line.startswith(prefix):
                raise AssertionError(f"expected {prefix!r}, got {line!r}\n{self.describe()}")
            return line

    def wait(self, deadline: float = 15.0) -> int:
        try:
            return self.popen.wait(deadline)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"did not exit within {deadline}s\n{self.describe()}") from None

    def stop(self) -> None:
        self.popen.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.popen.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)  # a stopped child dies too
            self.popen.kill()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for stream in (self.popen.stdin, self.popen.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self._stderr.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


class Ran:
    """The outcome of :func:`run_python`."""

    def __init__(self, code: int, stdout: str, stderr: str, seconds: float) -> None:
        self.code, self.stdout, self.stderr, self.seconds = code, stdout, stderr, seconds

    def lines(self) -> list[str]:
        return self.stdout.splitlines()

    def __repr__(self) -> str:
        return (
            f"<exit {self.code} after {self.seconds:.2f}s\nstdout:\n{self.stdout}\n"
            f"stderr:\n{self.stderr[-4000:]}>"
        )


def run_python(code: str, *args: str, deadline: float = 30.0) -> Ran:
    """Runs ``python -c code args`` to its end: killed (and the test failed
    with ``TimeoutError``) if it takes longer than ``deadline``."""
    start = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_child_env(),
        preexec_fn=_preexec(os.getpid()),
        text=True,
    )
    try:
        out, err = p.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise TimeoutError(
            f"the script did not exit within {deadline}s (killed)\n"
            f"stdout:\n{out}\nstderr:\n{err[-4000:]}"
        ) from None
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return Ran(p.returncode, out, err, time.monotonic() - start)


def fork_and_report(child: Callable[[], Any], deadline: float = 30.0) -> tuple[int, Any]:
    """Forks; the child runs ``child()`` and sends its JSON-able result (or
    the traceback of what it raised) through a pipe, then leaves with
    ``os._exit`` (never returning into pytest): 0 after a result, 3 after an
    exception. The parent returns ``(exit code, result)``; an exception in
    the child fails the test with its traceback."""
    r, w = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child
        code = 70
        try:
            os.close(r)
            set_pdeathsig()
            if os.getppid() != parent:
                os._exit(1)
            try:
                payload = {"result": child()}
                code = 0
            except BaseException:
                payload = {"error": traceback.format_exc()}
                code = 3
            data = json.dumps(payload).encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(code)
    # the parent
    os.close(w)
    chunks: list[bytes] = []
    end = time.monotonic() + deadline
    try:
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the forked child did not report within {deadline}s")
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        status = _waitpid(pid, end)
    finally:
        os.close(r)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
    payload = json.loads(b"".join(chunks) or b"{}")
    if "error" in payload:
        raise AssertionError(f"the forked child raised:\n{payload['error']}")
    return status, payload.get("result")


def _waitpid(pid: int, end: float) -> int:
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= end:
            raise TimeoutError(f"the forked child {pid} did not exit")
        time.sleep(0.01)


def poll(check: Callable[[], bool], deadline: float, what: str, interval: float = 0.02) -> float:
    """Polls ``check`` until True (``TimeoutError`` naming ``what`` after
    ``deadline`` seconds); returns the seconds it took."""
    start = time.monotonic()
    end = start + deadline
    while True:
        if check():
            return time.monotonic() - start
        if time.monotonic() >= end:
            raise TimeoutError(f"{what}: not within {deadline:.1f}s")
        time.sleep(interval)


def emit(*parts: object) -> None:
    """A worker's report line on stdout (flushed at once)."""
    print(*parts, flush=True)


def read_lines(stream: Iterator[str]) -> Iterator[str]:
    for line in stream:
        yield line.rstrip("\n")
