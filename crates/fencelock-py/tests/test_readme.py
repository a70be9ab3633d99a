"""Every ``python`` block of the repository's README and of the package's
README, run as written against private servers: the one literal URL
``redis://127.0.0.1:6379`` is replaced by the private redis-server's. A
block that defines ``close_invoice`` is then called on invoice 42 of a
private Postgres (``main(dsn)`` where the block has one), and the row must
be closed with the lease's fence: a README whose example breaks fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servers import PostgresServer, RedisServer

ROOT = Path(__file__).resolve().parents[3]
READMES = [ROOT / "README.md", ROOT / "crates" / "fencelock-py" / "README.md"]
SHOWN_URL = "redis://127.0.0.1:6379"

# Runs after a block: calls what it defined but did not run itself.
DRIVER = '''
import asyncio as _asyncio, inspect as _inspect, os as _os
_dsn = _os.environ["README_PG_DSN"]
if "close_invoice" in globals():
    if "main" in globals() and len(_inspect.signature(main).parameters) == 1:
        _asyncio.run(main(_dsn))
    else:
        import asyncpg as _asyncpg, fencelock as _fencelock
        async def _drive():
            async with _fencelock.connect(_os.environ["README_REDIS_URL"]) as client:
                async with _asyncpg.create_pool(_dsn) as db:
                    assert await close_invoice(client, db, 42) is True
        _asyncio.run(_drive())
    print("README-DRIVER: close_invoice ran")
'''


def python_blocks() -> list[tuple[str, int, str]]:
    """(file, first line, code) of every ```python block."""
    found = []
    for path in READMES:
        text = path.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, m.start()) + 1
            found.append((path.relative_to(ROOT).as_posix(), line, m.group(1)))
    return found


BLOCKS = python_blocks()


def test_both_readmes_have_python_examples() -> None:
    files = {f for f, _, _ in BLOCKS}
    assert files == {"README.md", "crates/fencelock-py/README.md"}, files
    assert any("close_invoice" in code for f, _, code in BLOCKS if f == "README.md")


def _reset_invoices(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS invoices")
        conn.execute(
            "CREATE TABLE invoices (id int PRIMARY KEY, status text NOT NULL, "
            "lock_fence bigint, lock_holder text)"
        )
        conn.execute("INSERT INTO invoices VALUES (42, 'open', NULL, NULL)")


def _invoice(dsn: str) -> tuple[str, int | None]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT status, lock_fence FROM invoices WHERE id = 42").fetchone()
        assert row is not None
        return row[0], row[1]


@pytest.mark.parametrize("where,line,code", BLOCKS, ids=[f"{f}:{n}" for f, n, _ in BLOCKS])
def test_readme_python_block_runs(
    where: str,
    line: int,
    code: str,
    redis_server: RedisServer,
    postgres_server: PostgresServer,
) -> None:
    _reset_invoices(postgres_server.dsn)
    source = code.replace(SHOWN_URL, redis_server.url) + DRIVER
    env = dict(os.environ, README_PG_DSN=postgres_server.dsn, README_REDIS_URL=redis_server.url)
    done = subprocess.run(
        [sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{where}:{line} failed:\n{done.stdout}\n{done.stderr}"
    if "close_invoice" in code:
        assert "README-DRIVER: close_invoice ran" in done.stdout
        status, fence = _invoice(postgres_server.dsn)
        assert status == "closed" and fence is not None and fence > 0, (status, fence)
    else:
        # Control for the driver's check: the row is untouched by blocks
        # that do not close an invoice.
        assert _invoice(postgres_server.dsn) == ("open", None)
