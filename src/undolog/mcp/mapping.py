"""Argument mappings for MCP compensations: build the undo call's arguments from the forward call.

A mapping is a JSON value whose strings starting with `$` are paths into the compensation
payload `{"original_args": ..., "original_result": ...}`:

- `$.original_args.path` — a key; `$.a[0]` — an index; `$.a[*].name` — every item's `name`;
- any other value (including strings without `$`) is copied as is.

`original_result` is the forward call's recorded ToolResult: `{"success", "output", "error"}`
where `output` is the upstream's `CallToolResult` (`content`, `structuredContent`, ...).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MappingError", "resolve_mapping"]

_SEGMENT = re.compile(r"\.([A-Za-z_][A-Za-z0-9_\-]*)|\[(\*|\d+)\]")


class MappingError(ValueError):
    """A path does not match the payload (a missing key, an index out of range, a non-list)."""


def _parse(path: str) -> list[str | int | None]:
    """`$.a[0][*].b` → ["a", 0, None, "b"] (None stands for `[*]`)."""
    rest = path[1:]
    segments: list[str | int | None] = []
    while rest:
        match = _SEGMENT.match(rest)
        if match is None:
            raise MappingError(f"cannot parse path {path!r} at {rest!r}")
        key, index = match.groups()
        if key is not None:
            segments.append(key)
        else:
            segments.append(None if index == "*" else int(index))
        rest = rest[match.end() :]
    return segments


def _walk(value: Any, segments: list[str | int | None], path: str) -> Any:
    for n, segment in enumerate(segments):
        if segment is None:
            if not isinstance(value, list):
                raise MappingError(f"{path}: [*] applied to a non-list")
            return [_walk(item, segments[n + 1 :], path) for item in value]
        if isinstance(segment, int):
            if not isinstance(value, list) or segment >= len(value):
                raise MappingError(f"{path}: index {segment} out of range")
            value = value[segment]
        else:
            if not isinstance(value, dict) or segment not in value:
                raise MappingError(f"{path}: no key {segment!r}")
            value = value[segment]
    return value


def resolve_mapping(template: Any, payload: dict[str, Any]) -> Any:
    """The template with every `$` path replaced by what it points at in `payload`."""
    if isinstance(template, str) and template.startswith("$"):
        return _walk(payload, _parse(template), template)
    if isinstance(template, dict):
        return {k: resolve_mapping(v, payload) for k, v in template.items()}
    if isinstance(template, list):
        return [resolve_mapping(v, payload) for v in template]
    return template
