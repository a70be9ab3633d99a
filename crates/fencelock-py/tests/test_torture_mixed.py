"""Mixed torture runs: ``fencelock torture --python-workers N``, half of a
run's workers the Python package's (``python -m fencelock.torture_worker``,
this interpreter), half the Rust binary's, on one lock name and one audited
resource, judged by the same checkers.

- A mixed run finds no violation, and both kinds of workers ran whole
  cycles that the resource accepted.
- Its negative control: the Python workers write without the fence check
  (``FENCELOCK_TORTURE_UNSAFE=no-fence-check``) and a paused Python holder's
  late write is caught (C1), written by a Python worker.
- What the Python worker cannot run (negative controls, a read-write lock,
  etcd) is refused by it, and the coordinator voids the run, saying why.
- The worker refuses a spec without the audited write script, and its unsafe variant of that script skips the fence check.

The ``fencelock`` binary is ``$FENCELOCK_BIN``, else the newest of
``${CARGO_TARGET_DIR:-target}/{debug,release}/fencelock`` (the Rust suite
builds it before this one runs); without it these tests fail, saying how to
build it. The run starts its own private redis-servers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from fencelock import torture_worker

#: The repository's root (``crates/fencelock-py/tests/`` is three below it).
ROOT = Path(__file__).resolve().parents[3]

#: How long one run may take, beyond its --duration, before the test gives
#: up on it (starting the servers, stopping the workers, checking).
SLACK = 30.0


def fencelock_bin() -> Path:
    """The ``fencelock`` binary under test; fails the test without one."""
    given = os.environ.get("FENCELOCK_BIN")
    if given:
        path = Path(given)
        if not path.is_file():
            pytest.fail(f"FENCELOCK_BIN={given} is not a file")
        return path
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    if not target.is_absolute():
        target = ROOT / target
    found = [p for p in (target / "debug" / "fencelock", target / "release" / "fencelock") if p.is_file()]
    if not found:
        pytest.fail(
            f"no fencelock binary under {target}/debug or {target}/release: build it first "
            f"(cargo build -p fencelock-cli), or name one with FENCELOCK_BIN"
        )
    return max(found, key=lambda p: p.stat().st_mtime)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any ``FENCELOCK_*`` variable (a
    ``FENCELOCK_URL`` would point the run at someone's server), plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCELOCK_")}
    env.update(extra)
    return env


def torture(
    args: list[str], duration: float, history: Optional[Path] = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``fencelock torture ARGS --python THIS_INTERPRETER``."""
    cmd = [str(fencelock_bin()), "torture", *args, "--duration", f"{duration}s", "--python", sys.executable]
    if history is not None:
        cmd += ["--history", str(history)]
    return subprocess.run(
        cmd,
        env=clean_env(**env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=duration + SLACK,
    )


def report_of(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        report: dict[str, Any] = json.loads(out.stdout)
    except ValueError:
        pytest.fail(f"exit {out.returncode}, no JSON report:\n{out.stdout}\nstderr:\n{out.stderr}")
    return report


def events_of(history: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in history.read_text().splitlines() if line.strip()]


#: Every event of a whole writer's cycle, in order.
CYCLE = [
    "acquire",
    "granted",
    "register",
    "registered",
    "read",
    "write",
    "written",
    "release",
    "release_done",
]


def test_a_mixed_run_finds_no_violation_and_both_kinds_write(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    out = torture(
        ["--workers", "4", "--python-workers", "2", "--names", "1", "--seed", "11", "--json"],
        5,
        history,
    )
    report = report_of(out)
    shown = json.dumps(report, indent=1)
    assert out.returncode == 0, f"{shown}\nstderr:\n{out.stderr}"
    assert report["violations"] == 0, shown
    assert report["inconclusive"] is None, shown
    kinds = report["worker_kinds"]
    assert kinds["python"]["workers"] == 2 and kinds["rust"]["workers"] == 2, shown
    for kind in ("python", "rust"):
        assert kinds[kind]["ops_acknowledged"] > 0, f"no {kind} write accepted: {shown}"

    events = events_of(history)
    header = next(e for e in events if e["ev"] == "header")
    assert header["worker_kinds"] == ["rust", "python", "rust", "python"]
    end = next(e for e in events if e["ev"] == "end")
    # Each Python worker ran whole cycles (every event the coordinator
    # parsed: a malformed line would be dropped), stamped on the run's clock.
    for p in ("w1", "w3"):
        mine = [e for e in events if e["p"] == p]
        assert mine, f"no history line from the Python worker {p}"
        assert all(0 <= e["t"] <= end["t"] for e in mine), f"{p}'s times are off the run's clock"
        by_op: dict[str, list[str]] = {}
        for e in mine:
            by_op.setdefault(e["op"], []).append(e["ev"])
        whole = [op for op, evs in by_op.items() if [ev for ev in evs if ev != "lost"] == CYCLE]
        assert whole, f"{p} ran no whole cycle: {list(by_op.items())[:3]}"
        assert any(
            e["ev"] == "written" and e["outcome"] == "accepted" for e in mine
        ), f"{p} had no write accepted"
    # The audit holds both kinds' accepted writes.
    writers = {e["worker"] for e in events if e["ev"] == "audit"}
    assert {"w1", "w3"} <= writers and writers & {"w0", "w2"}, writers


def first_stale_write(events: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The first audited write whose fence is lower than an earlier one's."""
    highest = 0
    for e in sorted((e for e in events if e["ev"] == "audit"), key=lambda e: e["seq"]):
        if e["fence"] < highest:
            return e
        highest = max(highest, e["fence"])
    return None


def test_python_workers_without_the_fence_check_are_caught(tmp_path: Path) -> None:
    # Which holder pause-worker freezes depends on timing (the one between
    # its read and its write), so 3 of the 4 workers are Python and a run
    # that froze no Python holder long enough is run again (at most twice).
    for attempt in range(3):
        history = tmp_path / f"history{attempt}.jsonl"
        out = torture(
            [
                "--workers",
                "4",
                "--python-workers",
                "3",
                "--names",
                "1",
                "--nemesis",
                "pause-worker",
                "--nemesis-interval",
                "200ms",
                "--json",
            ],
            5,
            history,
            FENCELOCK_TORTURE_UNSAFE="no-fence-check",
        )
        report = report_of(out)
        if report["violations"] > 0:
            break
    shown = json.dumps(report, indent=1)
    assert out.returncode == 1, f"{shown}\nstderr:\n{out.stderr}"
    assert "C1" in report["caught_by"], shown
    events = events_of(history)
    kinds = next(e for e in events if e["ev"] == "header")["worker_kinds"]
    assert kinds == ["python", "python", "rust", "python"]
    stale = first_stale_write(events)
    assert stale is not None, shown
    index = int(stale["worker"].lstrip("w"))
    assert kinds[index] == "python", f"a Rust worker's stale write was accepted: {stale}"


@pytest.mark.parametrize(
    "args, said",
    [
        (["--unsafe", "ge-check"], "does not run negative controls (--unsafe ge-check)"),
        (["--primitive", "rwlock"], "does not run --primitive rwlock"),
    ],
    ids=["unsafe", "rwlock"],
)
def test_what_the_python_worker_cannot_run_voids_the_run(args: list[str], said: str) -> None:
    out = torture(["--workers", "2", "--python-workers", "1", *args], 20)
    assert out.returncode == 70, f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert "torture worker w1 (python) exited before the run ended (exit status: 64)" in out.stderr
    assert said in out.stderr, out.stderr


def test_the_python_worker_refuses_an_etcd_spec_itself() -> None:
    spec = {
        "index": 1,
        "origin": 0,
        "lock_url": "etcd://127.0.0.1:1",
        "resource": {"Redis": {"url": "redis://127.0.0.1:1", "prefix": "p:", "replicas": 0}},
        "prefix": "p:",
        "names": ["t0"],
        "ttl_ms": 1000,
        "wait_ms": 10000,
        "hold_ms": 50,
        "mode": "notify",
        "fence_mode": "clock",
        "variant": None,
        "seed": 1,
        "audited_write": "-- a script",
    }
    out = subprocess.run(
        [sys.executable, "-m", "fencelock.torture_worker"],
        input=json.dumps(spec) + "\n",
        capture_output=True,
        text=True,
        timeout=30,
        env=clean_env(),
    )
    assert out.returncode == 64, out.stderr
    assert "runs on Redis only, not etcd" in out.stderr
    assert out.stdout == ""


def test_the_unsafe_variant_of_the_rust_resources_script_skips_the_check() -> None:
    script = (ROOT / "crates/fencelock-torture/src/scripts/audited_write.lua").read_text()
    unsafe = torture_worker.unsafe_script(script)
    assert "if false then" in unsafe and "if not ok then" not in unsafe


def test_a_spec_without_the_audited_write_is_refused() -> None:
    why = torture_worker.refusal({"lock_url": "redis://127.0.0.1:1", "resource": {}})
    assert why is not None and "audited write" in why
