"""The bench (``bench/bench.py``) runs end to end on a tiny budget: every
contestant on its private redis-server, no overlap seen, results as JSON.
Figures are not judged here (they are the bench's job, not a timed test)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench.py"


def test_the_bench_runs_on_a_tiny_budget() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--duration", "0.2", "--rounds", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["server"]["private"] is True
    assert report["placement"]["pinned"] is False
    assert report["ping"]["asyncio"]["per_s"] > 0
    assert report["ping"]["blocking"]["per_s"] > 0
    text = json.dumps(report)
    for library in ("fencelock", "redis-py", "python-redis-lock"):
        assert f'"library": "{library}"' in text, library
