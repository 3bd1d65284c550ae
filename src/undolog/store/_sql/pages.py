"""Shared SQL, part 3: the searched, filtered and paged lists of the API and the dashboard
(docs/dashboard.md), and the names of the keys behind rows.

Pages are keysets: a page after `(sort value, id)` of the last row of the previous one,
newest first, the id breaking ties, so a page never repeats or skips a row that stays where
it was. Every statement is scoped by `org_id` first; an owner, when given, narrows further.
"""

from __future__ import annotations

from collections.abc import Sequence

from undolog.store._sql.accounts import AccountSql
from undolog.store._sql.rows import APPROVAL, EFFECT, EVENT, SESSION
from undolog.store.records import ApprovalRecord, EffectRecord, EventRecord, SessionRecord

__all__ = ["PageSql", "like_pattern"]

# `LIKE ... ESCAPE '!'`: '!' rather than a backslash, which dialects quote differently.
_ESCAPE = "!"


def like_pattern(text: str) -> str:
    """A case-folded `LIKE` pattern matching `text` anywhere, its wildcards taken literally."""
    escaped = text.lower()
    for ch in (_ESCAPE, "%", "_"):
        escaped = escaped.replace(ch, _ESCAPE + ch)
    return f"%{escaped}%"


class PageSql(AccountSql):
    """The listing statements (mixed into `SqlQueries`)."""

    async def page_sessions(
        self,
        org_id: str,
        limit: int,
        *,
        after: tuple[int, str] | None = None,
        owner: str | None = None,
        state: str | None = None,
        text: str | None = None,
    ) -> list[tuple[SessionRecord, str | None]]:
        """Sessions, latest update first (`session_id` ascending on ties), after the keyset
        `after` = (updated_us, session_id); each with the name of the key that created it.

        `owner`: only that key id's sessions; `state`: only that state; `text`: the session
        id, the creating key's name or a tool the session called contains it (any case).
        """
        where = ["s.org_id = ?"]
        args: list[object] = [org_id]
        if owner is not None:
            where.append("s.owner_key_id = ?")
            args.append(owner)
        if state is not None:
            where.append("s.state = ?")
            args.append(state)
        if text:
            pattern = like_pattern(text)
            where.append(
                "(LOWER(s.session_id) LIKE ? ESCAPE '!' OR LOWER(k.name) LIKE ? ESCAPE '!' "
                "OR EXISTS (SELECT 1 FROM effects e WHERE e.org_id = s.org_id "
                "AND e.session_id = s.session_id AND LOWER(e.tool_name) LIKE ? ESCAPE '!'))"
            )
            args += [pattern, pattern, pattern]
        if after is not None:
            # The first bound lets the index range start at the cursor.
            where.append("s.updated_us <= ? AND (s.updated_us < ? OR s.session_id > ?)")
            args += [after[0], after[0], after[1]]
        rows = await self._fetch(
            f"SELECT {SESSION.select('s')}, k.name FROM sessions s "
            "LEFT JOIN api_keys k ON k.key_id = s.owner_key_id AND k.org_id = s.org_id "
            f"WHERE {' AND '.join(where)} ORDER BY s.updated_us DESC, s.session_id LIMIT ?",
            *args,
            limit,
        )
        return [(SESSION.row(r[:-1]), r[-1]) for r in rows]

    async def page_approvals(
        self,
        org_id: str,
        limit: int,
        *,
        after: tuple[int, str] | None = None,
        status: str | None = None,
        tool: str | None = None,
        approval_id: str | None = None,
    ) -> list[tuple[ApprovalRecord, str | None]]:
        """Approvals newest first (`approval_id` descending on ties), after the keyset
        `after` = (created_us, approval_id); each with the name of the key that asked.

        `status`, `tool`, `approval_id`: only those (any of them may be None: all).
        """
        where = ["a.org_id = ?"]
        args: list[object] = [org_id]
        filters = (("status", status), ("tool_name", tool), ("approval_id", approval_id))
        for column, value in filters:
            if value is not None:
                where.append(f"a.{column} = ?")
                args.append(value)
        if after is not None:
            where.append("a.created_us <= ? AND (a.created_us < ? OR a.approval_id < ?)")
            args += [after[0], after[0], after[1]]
        rows = await self._fetch(
            f"SELECT {APPROVAL.select('a')}, k.name FROM approvals a "
            "LEFT JOIN api_keys k ON k.key_id = a.requested_by_key_id AND k.org_id = a.org_id "
            f"WHERE {' AND '.join(where)} "
            "ORDER BY a.created_us DESC, a.approval_id DESC LIMIT ?",
            *args,
            limit,
        )
        return [(APPROVAL.row(r[:-1]), r[-1]) for r in rows]

    async def effect_modes(self, org_id: str, effect_ids: Sequence[str]) -> dict[str, str]:
        """Who runs each of these effects (`proxy` or `sdk`), by effect id."""
        if not effect_ids:
            return {}
        marks = ", ".join("?" for _ in effect_ids)
        rows = await self._fetch(
            f"SELECT effect_id, mode FROM effects WHERE org_id = ? AND effect_id IN ({marks})",
            org_id,
            *effect_ids,
        )
        return {str(r[0]): str(r[1]) for r in rows}

    async def recent_effects(
        self, org_id: str, session_ids: Sequence[str], per_session: int
    ) -> dict[str, list[EffectRecord]]:
        """The last `per_session` effects (highest step first) of each of these sessions."""
        if not session_ids or per_session < 1:
            return {}
        marks = ", ".join("?" for _ in session_ids)
        rows = await self._fetch(
            f"SELECT {EFFECT.select()} FROM (SELECT {EFFECT.select('e')}, ROW_NUMBER() OVER "
            "(PARTITION BY e.session_id ORDER BY e.step_index DESC, e.created_us DESC) AS n "
            f"FROM effects e WHERE e.org_id = ? AND e.session_id IN ({marks})) recent "
            "WHERE n <= ? ORDER BY session_id, step_index DESC, created_us DESC",
            org_id,
            *session_ids,
            per_session,
        )
        found: dict[str, list[EffectRecord]] = {}
        for row in rows:
            effect = EFFECT.row(row)
            found.setdefault(effect.session_id, []).append(effect)
        return found

    async def recent_events(
        self,
        org_id: str,
        limit: int,
        *,
        owner: str | None = None,
        session_id: str | None = None,
    ) -> list[EventRecord]:
        """The org's last `limit` events, newest first; `owner`: only those of that key id's
        sessions (none without a session); `session_id`: only that session's."""
        where = ["e.org_id = ?"]
        args: list[object] = [org_id]
        if session_id is not None:
            where.append("e.session_id = ?")
            args.append(session_id)
        if owner is not None:
            # Per event, newest first, until the page is full: a probe of the sessions' key.
            where.append(
                "EXISTS (SELECT 1 FROM sessions s WHERE s.org_id = e.org_id "
                "AND s.session_id = e.session_id AND s.owner_key_id = ?)"
            )
            args.append(owner)
        rows = await self._fetch(
            f"SELECT {EVENT.select('e')} FROM events e WHERE {' AND '.join(where)} "
            "ORDER BY e.event_id DESC LIMIT ?",
            *args,
            limit,
        )
        return [EVENT.row(r) for r in rows]
