"""The SQL both stores share, written with `?` placeholders, on three dialect primitives.

`SqlQueries` is the stores' `Queries` (store/protocol.py) for a dialect that
supplies `_fetchrow`, `_fetch` and `_execute` (PostgreSQL numbers the placeholders with
`_columns.numbered`). Column lists, values and row mapping come from the record dataclasses
(`_columns.columns`); states are bound as parameters, never written into the SQL. The store
checks no state machine: it only reads and writes rows.
"""

from __future__ import annotations

from undolog.store._sql.calls import SqlQueries
from undolog.store._sql.rows import EFFECT

__all__ = ["EFFECT", "SqlQueries"]
