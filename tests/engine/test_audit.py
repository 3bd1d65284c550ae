"""The audit chain's pure parts: records chained by hash, and `verify_lines` naming the first
line that was changed (docs/audit.md). The export over a real proxy's database, on both
stores, is tests/proxy/test_audit.py."""

from __future__ import annotations

import orjson
import pytest

from undolog.engine.audit import (
    GENESIS,
    Anchor,
    anchor_line,
    anchors_of,
    chain_record,
    record_hash,
    verify_lines,
)
from undolog.store import EventRecord
from undolog_sdk import canonical_json


def chain(count: int, prev: str = GENESIS, start: int = 1) -> list[str]:
    lines = []
    for n in range(start, start + count):
        event = EventRecord(n, "org", "effect_committed", "s", None, f'{{"k": {n}}}', n * 10)
        record = chain_record(event, n, prev, None)
        prev = record["hash"]
        lines.append(canonical_json(record))
    return lines


def test_a_chain_verifies_and_reports_its_head() -> None:
    lines = chain(5)
    verdict = verify_lines(lines, head=orjson.loads(lines[-1])["hash"])
    assert (verdict.ok, verdict.records, verdict.head) == (True, 5, orjson.loads(lines[-1])["hash"])


def test_the_hash_covers_every_field_but_itself() -> None:
    record = orjson.loads(chain(1)[0])
    assert record_hash(record) == record["hash"]
    assert record_hash({**record, "at": "2000-01-01T00:00:00.000000Z"}) != record["hash"]


def test_an_empty_file_is_a_chain_of_nothing_at_its_start() -> None:
    assert verify_lines([]).ok
    assert not verify_lines([], head="f" * 64).ok


def test_a_continuation_verifies_only_on_the_head_it_chains_on() -> None:
    first = chain(3)
    head = orjson.loads(first[-1])["hash"]
    second = chain(2, head, 4)
    assert verify_lines(second, prev=head).ok
    assert verify_lines(second).line == 1
    assert verify_lines(first + second).ok


@pytest.mark.parametrize(
    ("change", "line"),
    [
        (lambda ls: [ls[0], ls[1].replace('"k":2', '"k":3'), *ls[2:]], 2),
        (lambda ls: [ls[0], *ls[2:]], 2),
        (lambda ls: [ls[1], ls[0], *ls[2:]], 1),
        (lambda ls: [*ls[:3], ls[1], *ls[3:]], 4),
        (lambda ls: [*ls[:2], "{not json", *ls[2:]], 3),
        (lambda ls: [*ls[:2], "[1, 2]", *ls[2:]], 3),
        (lambda ls: ls[:-1], 5),  # cut off the end: found by the head
    ],
)
def test_any_changed_line_is_found(change: object, line: int) -> None:
    lines = chain(5)
    head = orjson.loads(lines[-1])["hash"]
    verdict = verify_lines(change(lines), head=head)  # type: ignore[operator]
    assert (verdict.ok, verdict.line) == (False, line)


def test_an_anchor_is_n_colon_hash_and_anything_else_is_refused() -> None:
    anchor = Anchor.parse(f" 7:{'a' * 64}\n")
    assert (anchor.n, anchor.head, str(anchor)) == (7, "a" * 64, f"7:{'a' * 64}")
    for bad in ("7", f"0:{'a' * 64}", f"x:{'a' * 64}", "7:abc", f"7:{'A' * 64}"):
        with pytest.raises(ValueError, match="not an anchor"):
            Anchor.parse(bad)


def test_an_anchor_file_keeps_each_org_s_anchors() -> None:
    lines = [
        anchor_line("acme", Anchor(3, "a" * 64), 0).rstrip("\n"),
        "# a comment",
        "",
        f"globex 5:{'b' * 64} 2026-12-01T00:00:00.000000Z",
        f"acme 9:{'c' * 64}",
    ]
    assert anchors_of(lines, "acme") == [Anchor(3, "a" * 64), Anchor(9, "c" * 64)]
    with pytest.raises(ValueError, match="line 2"):
        anchors_of(["acme 1:" + "a" * 64, "acme"], "acme")


@pytest.mark.security
def test_a_file_must_match_every_anchor_it_reaches_and_reach_every_anchor() -> None:
    lines = chain(5)
    third = Anchor(3, orjson.loads(lines[2])["hash"])
    assert verify_lines(lines, anchors=[third]).ok
    forged = chain(5, prev=GENESIS, start=1)
    forged[2] = canonical_json({**orjson.loads(forged[2]), "type": "x"})
    rebuilt = [orjson.loads(line) for line in forged]
    prev = GENESIS
    for record in rebuilt:  # a forger who rebuilds the whole chain from the genesis
        record["prev"] = prev
        record["hash"] = prev = record_hash(record)
    rewritten = [canonical_json(r) for r in rebuilt]
    assert verify_lines(rewritten).ok
    verdict = verify_lines(rewritten, anchors=[third])
    assert (verdict.ok, verdict.line) == (False, 3)
    cut = verify_lines(lines[:2], anchors=[third])
    assert (cut.ok, cut.line) == (False, 3)
