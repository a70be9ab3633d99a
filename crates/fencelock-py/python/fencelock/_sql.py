"""``fenced_update_sql``: the guide's fenced Postgres ``UPDATE``, with
fencelock's fence rule, for a driver the caller already uses (asyncpg or
psycopg).

The statement is the one the Rust library's ``FencedTable`` checks
(``crates/fencelock/src/resource/postgres/sql.rs``, ``rule_of``)::

    UPDATE "t" SET "a" = $1, lock_fence = $2, lock_holder = $3
    WHERE "k" = $4
      AND (lock_fence IS NULL OR lock_fence < $2
           OR (lock_fence = $2 AND lock_holder = $3))

A row is updated only when no newer fence has written it, or the same lease
(same fence *and* holder) wrote it last; an equal fence from another holder
is refused (a counter-mode fence re-issued after a lost counter). The holder
stored is the lease's **public holder id**, never its token, so rows written
from Python and from Rust agree. Executing it: one row updated means
accepted; none means refused as stale (or no such row).

Identifiers are checked as the Rust library checks them (``ident.rs``) and
always sent quoted, so a name is taken exactly as given and can never carry
SQL: non-empty, at most 63 bytes (Postgres would silently truncate longer
ones), no double quote, no control character; a table may be
``schema.table``. Everything else is a bound parameter.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Literal, Mapping, Optional, Union

from ._common import LeaseLike
from ._errors import InvalidInput

__all__ = ["fenced_update_sql", "FENCE_COLUMN", "HOLDER_COLUMN", "quote_ident", "quote_table"]

#: The Rust library's fence column (``bigint``).
FENCE_COLUMN = "lock_fence"
#: The Rust library's holder column (``text``, the public holder id).
HOLDER_COLUMN = "lock_holder"

#: Longest identifier Postgres keeps (``NAMEDATALEN - 1``, in bytes).
MAX_IDENT_LEN = 63
#: Largest fence a ``bigint`` column holds.
MAX_FENCE = 2**63 - 1

Style = Literal["asyncpg", "psycopg"]


def _invalid(name: str, reason: str) -> InvalidInput:
    err = InvalidInput(f"invalid SQL identifier {name[:64]!r}: {reason}")
    err.retryable = False
    err.name = name[:64]
    return err


def _is_control(c: str) -> bool:
    # Rust's char::is_control is the Unicode general category Cc.
    return unicodedata.category(c) == "Cc"


def quote_ident(name: str) -> str:
    """``"name"`` after checking it; ``InvalidInput`` naming it otherwise."""
    if not isinstance(name, str):
        raise _invalid(repr(name), f"an SQL identifier must be a str, got {type(name).__name__}")
    if not name:
        raise _invalid(name, "an SQL identifier is empty")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise _invalid(name, "an SQL identifier is not valid Unicode (a lone surrogate)") from None
    if size > MAX_IDENT_LEN:
        raise _invalid(
            name, "an SQL identifier is longer than 63 bytes (Postgres would truncate it)"
        )
    if '"' in name:
        raise _invalid(name, "an SQL identifier contains a double quote")
    if any(_is_control(c) for c in name):
        raise _invalid(name, "an SQL identifier contains a control character")
    return f'"{name}"'


def quote_table(table: str) -> str:
    """``"table"`` or ``"schema"."table"``, each part checked."""
    if not isinstance(table, str):
        raise _invalid(repr(table), f"a table name must be a str, got {type(table).__name__}")
    parts = table.split(".")
    if len(parts) > 2:
        raise _invalid(table, "a table name has at most two parts: schema.table")
    return ".".join(quote_ident(p) for p in parts)


def _fence_column(name: str, default: str) -> str:
    # The Rust library writes its own columns bare (lock_fence, lock_holder);
    # the defaults are written the same way, so the statement is the Rust one
    # byte for byte. Any other name is checked and quoted.
    return default if name == default else quote_ident(name)


class _Params:
    """Placeholders in one driver's style, and the values they bind."""

    def __init__(self, style: str) -> None:
        if style not in ("asyncpg", "psycopg"):
            err = InvalidInput(f"invalid option style: {style!r} (expected 'asyncpg' or 'psycopg')")
            err.retryable = False
            raise err
        self.numbered = style == "asyncpg"
        self.values: list[Any] = []

    def add(self, value: Any) -> str:
        """A placeholder for a new value."""
        self.values.append(value)
        return f"${len(self.values)}" if self.numbered else "%s"

    def again(self, placeholder: str, value: Any) -> str:
        """A placeholder for a value used before: asyncpg refers to it by
        number; psycopg's ``%s`` are positional, so the value is bound
        again."""
        if self.numbered:
            return placeholder
        self.values.append(value)
        return "%s"


def _ident_for(style: str, quoted: str) -> str:
    # psycopg reads % in the query text as a placeholder, inside quotes too.
    return quoted.replace("%", "%%") if style == "psycopg" else quoted


def _fence_and_holder(
    lease_or_fence: Union[LeaseLike, int], holder_id: Optional[str]
) -> tuple[int, str]:
    if isinstance(lease_or_fence, bool):
        raise _bad_fence(f"expected a lease or an int fence, got the bool {lease_or_fence}")
    if isinstance(lease_or_fence, int):
        fence = lease_or_fence
        if holder_id is None:
            err = InvalidInput(
                "invalid option holder_id: a bare fence needs the writer's holder_id "
                "(a fencelock lease's is lease.holder_id)"
            )
            err.retryable = False
            raise err
        holder = holder_id
    else:
        try:
            fence = lease_or_fence.fence
            holder = lease_or_fence.holder_id
        except AttributeError:
            raise _bad_fence(
                f"expected a lease or an int fence, got {type(lease_or_fence).__name__}"
            ) from None
        if holder_id is not None and holder_id != holder:
            err = InvalidInput(
                "invalid option holder_id: it differs from the lease's own holder_id"
            )
            err.retryable = False
            raise err
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise _bad_fence(f"a fence is an int, got {type(fence).__name__}")
    if not 0 <= fence <= MAX_FENCE:
        raise _bad_fence(f"fence {fence} does not fit the bigint fence column (0..={MAX_FENCE})")
    if not isinstance(holder, str) or not holder:
        err = InvalidInput("invalid option holder_id: expected a non-empty str")
        err.retryable = False
        raise err
    return fence, holder


def _bad_fence(reason: str) -> InvalidInput:
    err = InvalidInput(f"invalid option fence: {reason}")
    err.retryable = False
    return err


def fenced_update_sql(
    table: str,
    set: Mapping[str, object],
    where: Mapping[str, object],
    lease_or_fence: Union[LeaseLike, int],
    holder_id: Optional[str] = None,
    *,
    style: Style = "asyncpg",
    fence_column: str = FENCE_COLUMN,
    holder_column: str = HOLDER_COLUMN,
) -> tuple[str, list[Any]]:
    """The fenced ``UPDATE`` of ``table``: ``(sql, params)`` to execute.

    ``set`` maps columns to new values, ``where`` maps columns to the values
    that find the row (joined by ``AND``; ``None`` matches ``IS NULL``).
    ``lease_or_fence`` is a fencelock lease (its ``fence`` and
    ``holder_id``), or a plain ``int`` fence with ``holder_id`` for a worker
    that is not a fencelock lease. ``style="asyncpg"`` gives ``$1, $2, ...``
    (``await conn.execute(sql, *params)`` returns ``"UPDATE 1"`` when
    accepted); ``style="psycopg"`` gives ``%s`` (``cur.execute(sql,
    params)``, ``cur.rowcount == 1`` when accepted).

    ``InvalidInput`` for a bad identifier (naming it), a ``set`` or ``where``
    that names the fence or holder column (fencelock sets and checks those),
    an empty ``where`` (a fenced write targets rows, never the whole table),
    a fence outside ``bigint``, or a missing holder.
    """
    fence, holder = _fence_and_holder(lease_or_fence, holder_id)
    params = _Params(style)
    quoted_table = _ident_for(style, quote_table(table))
    f_col = _ident_for(style, _fence_column(fence_column, FENCE_COLUMN))
    h_col = _ident_for(style, _fence_column(holder_column, HOLDER_COLUMN))
    reserved = {fence_column, holder_column}

    def column(name: object, clause: str) -> str:
        if not isinstance(name, str):
            raise _invalid(repr(name), f"a column name must be a str, got {type(name).__name__}")
        if name in reserved:
            err = InvalidInput(
                f"invalid option {clause}: column {name} is set and checked by fencelock "
                "from the fence and holder"
            )
            err.retryable = False
            raise err
        return _ident_for(style, quote_ident(name))

    if not isinstance(where, Mapping) or not where:
        err = InvalidInput("invalid option where: name at least one column to find the row by")
        err.retryable = False
        raise err
    if not isinstance(set, Mapping):
        err = InvalidInput("invalid option set: expected a mapping of column to value")
        err.retryable = False
        raise err

    assignments = [f"{column(c, 'set')} = {params.add(v)}" for c, v in set.items()]
    p_fence = params.add(fence)
    p_holder = params.add(holder)
    assignments += [f"{f_col} = {p_fence}", f"{h_col} = {p_holder}"]
    conditions = []
    for c, v in where.items():
        name = column(c, "where")
        conditions.append(f"{name} IS NULL" if v is None else f"{name} = {params.add(v)}")
    # The rule, as rule_of renders it: fence, fence, holder (asyncpg refers
    # to the SET clause's numbers, psycopg binds them again, in this order).
    rule = (
        f"({f_col} IS NULL OR {f_col} < {params.again(p_fence, fence)} "
        f"OR ({f_col} = {params.again(p_fence, fence)} AND {h_col} = {params.again(p_holder, holder)}))"
    )
    sql = (
        f"UPDATE {quoted_table} SET {', '.join(assignments)} "
        f"WHERE {' AND '.join(conditions)} AND {rule}"
    )
    return sql, params.values
