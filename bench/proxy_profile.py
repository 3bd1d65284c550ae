"""Where the proxy's CPU goes, from a py-spy recording (`bench/run.py --py-spy DIR`).

py-spy's raw format is one line per distinct stack, `frame;frame;...;leaf count`, each
frame `function (path:line)`. A sample is charged to the part of the proxy that its leaf
frame (the code running when it was taken) belongs to, by the file's top-level package:
UndoLog's own code, the store's driver, the HTTP server, the upstream client, metrics,
logging, and the rest (the standard library and the event loop itself, where uvloop's C
code, socket calls included, is charged to the frame that entered it). Recorded with
`--gil`, the samples are Python at work, not waiting. py-spy names most files by module
path (`asyncpg/pool.py`), some by their full path.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

__all__ = ["PARTS", "part_of", "profile_parts"]

PARTS: dict[str, tuple[str, ...]] = {
    "undolog": ("undolog", "undolog_sdk"),
    "store driver": ("asyncpg", "aiosqlite", "sqlite3"),
    "HTTP server": ("uvicorn", "starlette", "fastapi", "httptools", "h11"),
    "upstream client": ("aiohttp", "yarl", "multidict", "aiohappyeyeballs"),
    "metrics": ("prometheus_client",),
    "logging": ("structlog",),
}
OTHER = "stdlib and event loop"
_FRAME = re.compile(r"^.*? \((?P<path>.+):\d+\)$")


def part_of(frame: str) -> str:
    """The part a frame's file belongs to (see the module docstring)."""
    found = _FRAME.match(frame)
    if found is None:
        return OTHER
    path = found["path"].rsplit("site-packages/", 1)[-1]
    parts = Path(path).parts
    if parts and not Path(path).is_absolute():  # as py-spy names a module: its package first
        top = {parts[0]}
    else:  # a file of a source checkout: UndoLog's own, or the standard library
        top = set(parts[:-1]) & set(PARTS["undolog"])
    for name, packages in PARTS.items():
        if top & set(packages):
            return name
    return OTHER


def profile_parts(recording: Path) -> dict[str, float]:
    """Each part's share of the recording's samples (0-1), largest first; empty if none."""
    counts: Counter[str] = Counter()
    for line in recording.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        counts[part_of(stack.rsplit(";", 1)[-1])] += int(count)
    total = sum(counts.values())
    return {name: n / total for name, n in counts.most_common()} if total else {}
