"""``fenced_update_sql`` against a real Postgres, with asyncpg and psycopg.

The rule (design §2.4, the Rust ``rule_of``): a row is updated when its
stored fence is NULL or lower, or equal *and* written by the same holder.
Each case executes the statement and checks the row, and the negative
control runs the unfenced ``UPDATE`` a worker without fencelock would send,
showing the stale write the rule refuses does go through without it.
"""

from __future__ import annotations

import uuid
from typing import Any, AsyncIterator, Optional

import pytest

import fencelock
from fencelock import InvalidInput, fenced_update_sql

pytestmark = pytest.mark.postgres

H1 = "a" * 16  # public holder ids: 16 hex digits of SHA-1(token)
H2 = "b" * 16


class Db:
    """One driver's way of running a statement, as the suite needs it:
    ``update`` returns the number of rows updated."""

    style: str

    async def execute(self, sql: str, *params: Any) -> None:
        raise NotImplementedError

    async def update(self, sql: str, params: list[Any]) -> int:
        raise NotImplementedError

    async def row(self, sql: str, *params: Any) -> Optional[tuple[Any, ...]]:
        raise NotImplementedError


class AsyncpgDb(Db):
    style = "asyncpg"

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def execute(self, sql: str, *params: Any) -> None:
        await self.conn.execute(sql, *params)

    async def update(self, sql: str, params: list[Any]) -> int:
        status = await self.conn.execute(sql, *params)
        assert status.startswith("UPDATE "), status
        return int(status.split()[1])

    async def row(self, sql: str, *params: Any) -> Optional[tuple[Any, ...]]:
        record = await self.conn.fetchrow(sql, *params)
        return None if record is None else tuple(record)


class PsycopgDb(Db):
    style = "psycopg"

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @staticmethod
    def _numbered_to_psycopg(sql: str) -> str:
        # The suite's own setup statements are written with $N; psycopg
        # wants %s (the setup never repeats a parameter).
        import re

        return re.sub(r"\$\d+", "%s", sql)

    async def execute(self, sql: str, *params: Any) -> None:
        await self.conn.execute(self._numbered_to_psycopg(sql), params or None)

    async def update(self, sql: str, params: list[Any]) -> int:
        cur = await self.conn.execute(sql, params)
        return cur.rowcount

    async def row(self, sql: str, *params: Any) -> Optional[tuple[Any, ...]]:
        cur = await self.conn.execute(self._numbered_to_psycopg(sql), params or None)
        return await cur.fetchone()


@pytest.fixture(params=["asyncpg", "psycopg"])
async def db(request: pytest.FixtureRequest, postgres_server: Any) -> AsyncIterator[Db]:
    """A connection to the test Postgres through each driver (autocommit)."""
    if request.param == "asyncpg":
        import asyncpg

        conn = await asyncpg.connect(postgres_server.dsn)
        try:
            yield AsyncpgDb(conn)
        finally:
            await conn.close()
    else:
        import psycopg

        conn = await psycopg.AsyncConnection.connect(postgres_server.dsn, autocommit=True)
        try:
            yield PsycopgDb(conn)
        finally:
            await conn.close()


@pytest.fixture
async def table(db: Db) -> AsyncIterator[str]:
    """A fresh table ``invoices_<uuid>(id int primary key, status text,
    lock_fence bigint, lock_holder text)`` with row ``id = 1``."""
    name = f"invoices_{uuid.uuid4().hex[:12]}"
    await db.execute(
        f'CREATE TABLE "{name}" (id int PRIMARY KEY, status text, '
        "lock_fence bigint, lock_holder text)"
    )
    await db.execute(f"INSERT INTO \"{name}\" (id, status) VALUES (1, 'open')")
    try:
        yield name
    finally:
        await db.execute(f'DROP TABLE IF EXISTS "{name}"')


async def stored(db: Db, table: str) -> tuple[Any, ...]:
    row = await db.row(f'SELECT status, lock_fence, lock_holder FROM "{table}" WHERE id = 1')
    assert row is not None
    return row


async def write(db: Db, table: str, status: str, fence: int, holder: str) -> int:
    sql, params = fenced_update_sql(
        table, {"status": status}, {"id": 1}, fence, holder, style=db.style  # type: ignore[arg-type]
    )
    return await db.update(sql, params)


async def test_accepted_write_records_fence_and_holder(db: Db, table: str) -> None:
    assert await write(db, table, "paid", 5, H1) == 1
    assert await stored(db, table) == ("paid", 5, H1)


async def test_stale_write_is_refused(db: Db, table: str) -> None:
    assert await write(db, table, "paid", 10, H2) == 1
    assert await write(db, table, "stale", 5, H1) == 0
    assert await stored(db, table) == ("paid", 10, H2)


async def test_equal_fence_same_holder_is_accepted(db: Db, table: str) -> None:
    assert await write(db, table, "first", 7, H1) == 1
    assert await write(db, table, "second", 7, H1) == 1
    assert await stored(db, table) == ("second", 7, H1)


async def test_equal_fence_other_holder_is_refused(db: Db, table: str) -> None:
    assert await write(db, table, "first", 7, H1) == 1
    assert await write(db, table, "other", 7, H2) == 0
    assert await stored(db, table) == ("first", 7, H1)


async def test_higher_fence_is_accepted(db: Db, table: str) -> None:
    assert await write(db, table, "first", 7, H1) == 1
    assert await write(db, table, "newer", 8, H2) == 1
    assert await stored(db, table) == ("newer", 8, H2)


async def test_negative_control_unfenced_update_lets_the_stale_write_through(
    db: Db, table: str
) -> None:
    """What the rule prevents: the same stale write without the fence
    condition overwrites the newer holder's work."""
    assert await write(db, table, "paid", 10, H2) == 1
    sql = f"UPDATE \"{table}\" SET status = $1 WHERE id = $2"
    if db.style == "psycopg":
        sql = sql.replace("$1", "%s").replace("$2", "%s")
    assert await db.update(sql, ["stale", 1]) == 1
    assert (await stored(db, table))[0] == "stale"


async def test_missing_row_updates_nothing(db: Db, table: str) -> None:
    sql, params = fenced_update_sql(table, {"status": "x"}, {"id": 99}, 1, H1, style=db.style)  # type: ignore[arg-type]
    assert await db.update(sql, params) == 0


async def test_a_real_lease_writes_its_public_holder_id_never_its_token(
    db: Db, table: str, redis_server: Any, lock_name: str
) -> None:
    async with fencelock.connect(redis_server.url) as client:
        async with client.lock(lock_name) as lease:
            sql, params = fenced_update_sql(
                table, {"status": "paid"}, {"id": 1}, lease, style=db.style  # type: ignore[arg-type]
            )
            assert lease.token not in params
            assert await db.update(sql, params) == 1
            assert await stored(db, table) == ("paid", lease.fence, lease.holder_id)
            assert fencelock.holder_id(lease.token) == lease.holder_id


async def test_an_expired_lease_is_refused_after_its_successor_wrote(
    db: Db, table: str, redis_server: Any, lock_name: str
) -> None:
    """The guide's paused holder, end to end: A's lease runs out (no
    renewal), B takes the lock and writes, A's late write is refused."""
    from servers import async_wait_until

    async with fencelock.connect(redis_server.url) as client:
        a = await client.acquire(lock_name, ttl=0.3, renewal=False)
        await async_wait_until(lambda: a.lost, 5.0, "lease A to run out")
        b = await client.acquire(lock_name, wait=5.0)
        assert b.fence > a.fence
        sql_b, params_b = fenced_update_sql(table, {"status": "b"}, {"id": 1}, b, style=db.style)  # type: ignore[arg-type]
        assert await db.update(sql_b, params_b) == 1
        sql_a, params_a = fenced_update_sql(table, {"status": "a"}, {"id": 1}, a, style=db.style)  # type: ignore[arg-type]
        assert await db.update(sql_a, params_a) == 0
        assert await stored(db, table) == ("b", b.fence, b.holder_id)
        await b.release()


async def test_schema_qualified_mixed_case_table(db: Db) -> None:
    schema, name = f"billing_{uuid.uuid4().hex[:8]}", "Invoices"
    await db.execute(f'CREATE SCHEMA "{schema}"')
    try:
        await db.execute(
            f'CREATE TABLE "{schema}"."{name}" (id int PRIMARY KEY, "Status" text, '
            "lock_fence bigint, lock_holder text)"
        )
        await db.execute(f'INSERT INTO "{schema}"."{name}" (id) VALUES (1)')
        sql, params = fenced_update_sql(
            f"{schema}.{name}", {"Status": "ok"}, {"id": 1}, 3, H1, style=db.style  # type: ignore[arg-type]
        )
        assert f'"{schema}"."{name}"' in sql
        assert await db.update(sql, params) == 1
    finally:
        await db.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def test_percent_in_a_column_name_is_not_a_placeholder(db: Db) -> None:
    name = f"pct_{uuid.uuid4().hex[:8]}"
    await db.execute(
        f'CREATE TABLE "{name}" (id int PRIMARY KEY, "share%" text, lock_fence bigint, lock_holder text)'
    )
    try:
        await db.execute(f'INSERT INTO "{name}" (id) VALUES (1)')
        sql, params = fenced_update_sql(name, {"share%": "10"}, {"id": 1}, 1, H1, style=db.style)  # type: ignore[arg-type]
        assert await db.update(sql, params) == 1
        assert await db.row(f'SELECT "share%" FROM "{name}"') == ("10",)
    finally:
        await db.execute(f'DROP TABLE "{name}"')


async def test_a_semicolon_name_is_quoted_and_cannot_inject(db: Db, table: str) -> None:
    """``x; drop table y`` is a legal quoted identifier under the Rust
    library's rules (ident.rs): it is sent as one quoted name, so executing
    it fails on a missing table, and the table the text names survives."""
    sql, params = fenced_update_sql(
        f"x; drop table {table}", {"status": "x"}, {"id": 1}, 1, H1, style=db.style  # type: ignore[arg-type]
    )
    assert sql.startswith(f'UPDATE "x; drop table {table}" SET')
    with pytest.raises(Exception, match="does not exist"):
        await db.update(sql, params)
    assert (await stored(db, table))[0] == "open"


# --- statement text and validation (no server needed) ---------------------


def test_rule_text_is_the_rust_rule_of() -> None:
    """Byte for byte the condition ``rule_sql`` renders for parameters 2
    and 3 (the Rust test ``the_rule_renders_as_documented``)."""
    sql, params = fenced_update_sql("invoices", {"status": "closed"}, {"id": 42}, 7, "h")
    assert sql == (
        'UPDATE "invoices" SET "status" = $1, lock_fence = $2, lock_holder = $3 '
        'WHERE "id" = $4 AND '
        "(lock_fence IS NULL OR lock_fence < $2 OR (lock_fence = $2 AND lock_holder = $3))"
    )
    assert params == ["closed", 7, "h", 42]


def test_psycopg_style_binds_each_use() -> None:
    sql, params = fenced_update_sql(
        "invoices", {"status": "closed"}, {"id": 42}, 7, "h", style="psycopg"
    )
    assert sql == (
        'UPDATE "invoices" SET "status" = %s, lock_fence = %s, lock_holder = %s '
        'WHERE "id" = %s AND '
        "(lock_fence IS NULL OR lock_fence < %s OR (lock_fence = %s AND lock_holder = %s))"
    )
    assert params == ["closed", 7, "h", 42, 7, 7, "h"]


def test_custom_fence_columns_are_quoted() -> None:
    sql, _ = fenced_update_sql(
        "t", {}, {"k": 1}, 1, "h", fence_column="Fence", holder_column="Holder"
    )
    assert sql == (
        'UPDATE "t" SET "Fence" = $1, "Holder" = $2 WHERE "k" = $3 AND '
        '("Fence" IS NULL OR "Fence" < $1 OR ("Fence" = $1 AND "Holder" = $2))'
    )


def test_none_in_where_matches_null() -> None:
    sql, params = fenced_update_sql("t", {"a": 1}, {"k": 1, "deleted_at": None}, 1, "h")
    assert '"deleted_at" IS NULL' in sql
    assert params == [1, 1, "h", 1]


HOSTILE = [
    'x"; drop table y; --',
    'a"b',
    "",
    "a.b.c",
    ".t",
    "t\n",
    "t\x00",
    "x" * 64,
    "é" * 32,  # 64 bytes
]


@pytest.mark.parametrize("bad", HOSTILE, ids=repr)
def test_hostile_table_names_are_refused(bad: str) -> None:
    with pytest.raises(InvalidInput) as info:
        fenced_update_sql(bad, {"a": 1}, {"k": 1}, 1, "h")
    assert "SQL identifier" in str(info.value)


@pytest.mark.parametrize("bad", [b for b in HOSTILE if b not in ("a.b.c", ".t")], ids=repr)
@pytest.mark.parametrize("where", ["set", "where", "fence_column", "holder_column"])
def test_hostile_column_names_are_refused(bad: str, where: str) -> None:
    kwargs: dict[str, Any] = {"set": {"a": 1}, "where": {"k": 1}}
    if where in ("set", "where"):
        kwargs[where] = {bad: 1}
    else:
        kwargs[where] = bad
    with pytest.raises(InvalidInput):
        fenced_update_sql("t", lease_or_fence=1, holder_id="h", **kwargs)


def test_a_column_name_with_a_dot_is_one_identifier() -> None:
    sql, _ = fenced_update_sql("t", {"a.b": 1}, {"k": 1}, 1, "h")
    assert '"a.b" = $1' in sql


def test_the_longest_identifier_is_accepted() -> None:
    sql, _ = fenced_update_sql("x" * 63, {"a": 1}, {"k": 1}, 1, "h")
    assert f'"{"x" * 63}"' in sql


@pytest.mark.parametrize("column", ["lock_fence", "lock_holder"])
def test_fence_columns_cannot_be_set_or_matched(column: str) -> None:
    with pytest.raises(InvalidInput, match=column):
        fenced_update_sql("t", {column: 1}, {"k": 1}, 1, "h")
    with pytest.raises(InvalidInput, match=column):
        fenced_update_sql("t", {"a": 1}, {column: 1}, 1, "h")


@pytest.mark.parametrize(
    "fence, holder, match",
    [
        (1, None, "holder_id"),
        (1, "", "holder_id"),
        (True, "h", "bool"),
        (-1, "h", "fence"),
        (2**63, "h", "bigint"),
        ("7", "h", "fence"),
    ],
)
def test_bad_fences_and_holders_are_refused(fence: Any, holder: Any, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        fenced_update_sql("t", {"a": 1}, {"k": 1}, fence, holder)


def test_empty_where_is_refused() -> None:
    with pytest.raises(InvalidInput, match="where"):
        fenced_update_sql("t", {"a": 1}, {}, 1, "h")


def test_unknown_style_is_refused() -> None:
    with pytest.raises(InvalidInput, match="style"):
        fenced_update_sql("t", {"a": 1}, {"k": 1}, 1, "h", style="sqlite")  # type: ignore[arg-type]


def test_a_lease_like_object_gives_fence_and_holder() -> None:
    class Worker:
        fence = 9
        holder_id = "w"

    sql, params = fenced_update_sql("t", {"a": 1}, {"k": 2}, Worker())
    assert params == [1, 9, "w", 2]
    with pytest.raises(InvalidInput, match="differs"):
        fenced_update_sql("t", {"a": 1}, {"k": 2}, Worker(), "someone-else")
