"""The demo tools' argument checks: a bad argument is a 400 ToolResult, never a crash."""

from __future__ import annotations

from undolog.demo.state import Args, ToolFailure

__all__ = ["count_arg", "forward_ref", "number_arg", "str_arg"]


def str_arg(args: Args, name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value:
        raise ToolFailure(400, f"argument '{name}' must be a non-empty string")
    return value


def number_arg(args: Args, name: str) -> float:
    value = args.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolFailure(400, f"argument '{name}' must be a number")
    return value


def count_arg(args: Args, name: str) -> int:
    value = args.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ToolFailure(400, f"argument '{name}' must be a non-negative integer")
    return value


def forward_ref(args: Args, name: str) -> str:
    """The id a compensation undoes: its own argument, or dug out of `original_result`.

    The proxy calls a compensation with the captured args plus the forward call's
    `original_args` and `original_result`; the result may be the whole ToolResult
    (`{"output": {name: …}}`) or just its output (`{name: …}`).
    """
    value = args.get(name)
    result = args.get("original_result")
    if value is None and isinstance(result, dict):
        output = result.get("output")
        value = output.get(name) if isinstance(output, dict) else None
        if value is None:
            value = result.get(name)
    if not isinstance(value, str) or not value:
        raise ToolFailure(400, f"argument '{name}' (or an original_result carrying it) is required")
    return value
