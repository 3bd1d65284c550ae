"""bench/proxy_profile.py: a py-spy recording's samples charged to the parts of the proxy."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from proxy_profile import OTHER, part_of, profile_parts

SITE = "/work/.venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    ("frame", "part"),
    [
        ("Engine.intercept (/work/main/src/undolog/engine/core.py:158)", "undolog"),
        ("call_signature (/work/main/sdk/src/undolog_sdk/signature.py:40)", "undolog"),
        (f"tool_call ({SITE}/undolog/proxy/toolcall.py:92)", "undolog"),  # from a wheel
        (f"Connection._do_execute ({SITE}/asyncpg/connection.py:2035)", "store driver"),
        (f"Connection._execute ({SITE}/aiosqlite/core.py:132)", "store driver"),
        (f"RequestResponseCycle.send ({SITE}/uvicorn/protocols/http/h11_impl.py:1)", "HTTP server"),
        (f"ClientSession._request ({SITE}/aiohttp/client.py:500)", "upstream client"),
        (f"MetricWrapperBase.labels ({SITE}/prometheus_client/metrics.py:180)", "metrics"),
        ("Runner.run (/usr/lib/python3.11/asyncio/runners.py:118)", OTHER),
        # py-spy's usual spelling: the module's path
        ("Pool.release (asyncpg/pool.py:1055)", "store driver"),
        ("serve (undolog/cli.py:193)", "undolog"),
        ("Runner.run (asyncio/runners.py:118)", OTHER),
        ("<module> (<frozen runpy>:88)", OTHER),
        ("no location at all", OTHER),
    ],
)
def test_a_frame_is_charged_to_its_package(frame: str, part: str) -> None:
    assert part_of(frame) == part


def test_a_recording_is_summed_by_the_leaf_frame_of_each_stack(tmp_path: Path) -> None:
    root = "Runner.run (/usr/lib/python3.11/asyncio/runners.py:118)"
    ours = "Engine.intercept (/work/main/src/undolog/engine/core.py:158)"
    driver = f"Connection._do_execute ({SITE}/asyncpg/connection.py:2035)"
    recording = tmp_path / "proxy.txt"
    recording.write_text(
        f"{root};{ours} 30\n{root};{ours};{driver} 60\n{root} 10\nnot a sample line\n"
    )
    shares = profile_parts(recording)
    assert shares == {"store driver": 0.6, "undolog": 0.3, OTHER: 0.1}
    assert list(shares) == ["store driver", "undolog", OTHER]  # largest first


def test_an_empty_recording_has_no_shares(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert profile_parts(empty) == {}
