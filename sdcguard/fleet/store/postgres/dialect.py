"""The store's SQL as PostgreSQL reads it: the few places where SQLite's dialect and PostgreSQL's differ in spelling,
rewritten mechanically, so the store keeps one SQL text for both backends.

The store's SQL is written in the subset both dialects share wherever one exists (``ON CONFLICT ... DO UPDATE``,
``CASE`` instead of arithmetic on booleans, an alias on every subquery in ``FROM``, ``RETURNING id``); what has no
common spelling is rewritten here, statement by statement (cached), outside string literals:

1. placeholders: ``?`` becomes ``%s``, ``:name`` becomes ``%(name)s``, a literal ``%`` becomes ``%%`` (psycopg's
   format);
2. ``INSERT OR IGNORE INTO ...`` becomes ``INSERT INTO ... ON CONFLICT DO NOTHING`` (the same: any unique key);
3. the scalar ``MIN(a, b, ...)`` and ``MAX(a, b, ...)`` (two or more arguments) become ``LEAST`` and ``GREATEST``
   (where the store uses them no argument is NULL, where the two differ);
4. ``CAST(x AS INTEGER)`` truncates toward zero in SQLite and rounds in PostgreSQL: it becomes
   ``CAST(trunc(CAST(x AS DOUBLE PRECISION)) AS BIGINT)`` (``x`` may be a text); the types ``INTEGER`` and
   ``REAL`` become ``BIGINT`` and ``DOUBLE PRECISION`` (PostgreSQL's ``REAL`` has 24 bits of mantissa);
5. ``INDEXED BY name`` and ``CROSS JOIN ... ON`` (SQLite's planner hints: that index, that join order) become
   nothing and ``JOIN ... ON``; ``WITHOUT ROWID`` (a SQLite table layout) goes;
6. schema names: ``main.t`` is the store's ``t``, ``temp.t`` the connection's ``pg_temp.t``, and ``src.t`` (a merge
   input, ATTACHed in SQLite) the temporary copy ``pg_temp.src_t`` that :mod:`.transfer` fills;
7. ``json_each(?)`` becomes :data:`~.schema.JSON_EACH`, a function of the store's schema that yields ``key`` and
   ``value`` (as text) of a JSON array or object, and ``lower(hex(randomblob(16)))`` a random 32-digit hex id.

``TOTAL(x)`` needs no rewriting: the PostgreSQL schema defines the aggregate (:mod:`.schema`).
"""

from __future__ import annotations

import functools
import re

__all__ = ["to_postgres"]

_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_SCHEMAS = {"main": "", "temp": "pg_temp.", "src": "pg_temp.src_"}
_TYPES = {"INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION"}
_RANDOM_HEX = "lower(hex(randomblob(16)))"


def _close_paren(sql: str, open_at: int) -> int:
    """The index of the parenthesis closing the one at ``open_at`` (string literals skipped)."""
    depth, i = 0, open_at
    while i < len(sql):
        c = sql[i]
        if c == "'":
            i = sql.index("'", i + 1)
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unbalanced parentheses in SQL: {sql[:80]!r}")


def _top_level_commas(inner: str) -> int:
    depth = n = 0
    in_str = False
    for c in inner:
        if c == "'":
            in_str = not in_str
        elif in_str:
            continue
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            n += 1
    return n


def _rewrite_calls(sql: str) -> str:
    """Rules 3 and 4: the scalar MIN/MAX and CAST(... AS INTEGER), innermost first (they nest)."""
    out: list[str] = []
    i = 0
    while i < len(sql):
        c = sql[i]
        if c == "'":
            j = sql.index("'", i + 1)
            out.append(sql[i : j + 1])
            i = j + 1
            continue
        m = _WORD.match(sql, i)
        if m is None or (i and (sql[i - 1].isalnum() or sql[i - 1] in "_.")):
            out.append(c)
            i += 1
            continue
        word = m.group(0)
        after = m.end()
        upper = word.upper()
        if upper in ("MIN", "MAX", "CAST") and after < len(sql) and sql[after] == "(":
            close = _close_paren(sql, after)
            inner = _rewrite_calls(sql[after + 1 : close])
            if upper == "CAST" and re.search(r"\s+AS\s+INTEGER\s*$", inner, re.IGNORECASE):
                expr = re.sub(r"\s+AS\s+INTEGER\s*$", "", inner, flags=re.IGNORECASE)
                out.append(f"CAST(trunc(CAST({expr} AS DOUBLE PRECISION)) AS BIGINT)")
            elif upper in ("MIN", "MAX") and _top_level_commas(inner):
                out.append(("LEAST(" if upper == "MIN" else "GREATEST(") + inner + ")")
            else:
                out.append(f"{word}({inner})")
            i = close + 1
            continue
        out.append(word)
        i = after
    return "".join(out)


def _rewrite_words(sql: str) -> str:
    """Rules 1, 5, 6 and the type names of rule 4, outside string literals."""
    out: list[str] = []
    i = 0
    n = len(sql)
    while i < n:
        c = sql[i]
        if c == "'":
            j = sql.index("'", i + 1)
            out.append(sql[i : j + 1].replace("%", "%%"))
            i = j + 1
        elif c == "?":
            out.append("%s")
            i += 1
        elif c == "%":
            out.append("%%")
            i += 1
        elif c == ":" and i + 1 < n and (sql[i + 1].isalpha() or sql[i + 1] == "_") and sql[i - 1 : i] != ":":
            m = _WORD.match(sql, i + 1)
            assert m is not None
            out.append(f"%({m.group(0)})s")
            i = m.end()
        elif (m := _WORD.match(sql, i)) is not None and not (i and (sql[i - 1].isalnum() or sql[i - 1] in "_.")):
            word, end = m.group(0), m.end()
            upper = word.upper()
            if word.lower() in _SCHEMAS and end < n and sql[end] == ".":
                out.append(_SCHEMAS[word.lower()])
                i = end + 1
            elif upper == "INDEXED" and (hint := re.match(r"\s+BY\s+\w+", sql[end:], re.IGNORECASE)):
                i = end + hint.end()
            elif upper == "CROSS" and (join := re.match(r"\s+JOIN\b", sql[end:], re.IGNORECASE)):
                out.append("JOIN")
                i = end + join.end()
            elif upper == "WITHOUT" and (rowid := re.match(r"\s+ROWID\b", sql[end:], re.IGNORECASE)):
                i = end + rowid.end()
            else:
                out.append(_TYPES.get(upper, word))
                i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def to_postgres(sql: str) -> str:
    """One statement of the store's SQL, as PostgreSQL (through psycopg) reads it."""
    text = sql.replace(_RANDOM_HEX, "replace(CAST(gen_random_uuid() AS TEXT), '-', '')")
    text = re.sub(r"\bjson_each\(", "sdcguard_json_each(", text)
    ignore = re.match(r"\s*INSERT\s+OR\s+IGNORE\s+INTO\b", text, re.IGNORECASE)
    if ignore:
        text = "INSERT INTO" + text[ignore.end() :]
        returning = re.search(r"\bRETURNING\b", text, re.IGNORECASE)
        if returning:
            text = f"{text[: returning.start()]} ON CONFLICT DO NOTHING {text[returning.start() :]}"
        else:
            text = text.rstrip().rstrip(";") + " ON CONFLICT DO NOTHING"
    if re.search(r"\bINSERT\s+OR\s+REPLACE\b", text, re.IGNORECASE):
        raise ValueError("INSERT OR REPLACE has no PostgreSQL spelling: write ON CONFLICT (...) DO UPDATE")
    return _rewrite_words(_rewrite_calls(text))
