"""Fresh ids: `new_id` is `str(uuid.uuid4())` in format and randomness, built without the
UUID object."""

from __future__ import annotations

import os
import re
import uuid

from undolog.engine.model import new_id, uuid4_text

_V4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def test_uuid4_text_is_the_text_of_uuid4_for_the_same_bytes() -> None:
    samples = [bytes(16), b"\xff" * 16, bytes(range(16))] + [os.urandom(16) for _ in range(2000)]
    for random16 in samples:
        assert uuid4_text(random16) == str(uuid.UUID(bytes=random16, version=4))


def test_new_id_is_a_fresh_version_4_uuid_each_time() -> None:
    ids = [new_id() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        assert _V4.fullmatch(text), text
        assert str(uuid.UUID(text)) == text
