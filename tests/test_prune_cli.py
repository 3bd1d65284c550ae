"""`undolog prune` run for real (`python -m undolog prune ...`) on both stores."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest

from tests.store.contract_helpers import NOW
from tests.support.retention import add_org, seed, still_there
from tests.test_cli import run
from undolog.store import Store


def new_org() -> str:
    return f"org-{uuid.uuid4().hex[:12]}"


async def test_a_dry_run_counts_then_a_prune_deletes(store: Store, store_url: str) -> None:
    org = new_org()
    await add_org(store, org, 30)
    old = [await seed(store, org, effects=("committed", "failed"), at=NOW) for _ in range(3)]
    active = await seed(store, org, state="active", at=NOW)

    dry = run("prune", "--database-url", store_url, "--org", org, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    counts = "3 sessions, 6 effects, 0 undo_entries, 0 approvals, 6 events"
    assert dry.stdout == f"{org}: would prune {counts}\n"
    assert all([await still_there(store, org, s) for s in old])

    real = run("prune", "--database-url", store_url, "--org", org, "--batch-size", "2", "--json")
    assert real.returncode == 0, real.stderr
    body = orjson.loads(real.stdout)
    assert body == {
        "dry_run": False,
        "orgs": {
            org: {"sessions": 3, "effects": 6, "undo_entries": 0, "approvals": 0, "events": 6}
        },
    }
    assert not any([await still_there(store, org, s) for s in old])
    assert await still_there(store, org, active)


async def test_org_limits_the_prune_to_one_org(store: Store, store_url: str) -> None:
    mine, other = new_org(), new_org()
    for org in (mine, other):
        await add_org(store, org, 30)
    theirs = await seed(store, other, at=NOW)
    await seed(store, mine, at=NOW)
    result = run("prune", "--database-url", store_url, "--org", mine, "--json")
    assert result.returncode == 0, result.stderr
    assert list(orjson.loads(result.stdout)["orgs"]) == [mine]
    assert await still_there(store, other, theirs)


async def test_an_org_without_retention_keeps_everything_unless_the_config_sets_it(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    org = new_org()
    await add_org(store, org, None)
    old = await seed(store, org, at=NOW)
    kept = run("prune", "--database-url", store_url, "--org", org)
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout == f"nothing to prune: org {org!r} keeps everything (no retention_days)\n"
    assert await still_there(store, org, old)

    config = tmp_path / "undolog.toml"
    config.write_text(f'[[orgs]]\nid = "{org}"\nretention_days = 7\n', encoding="utf-8")
    pruned = run("prune", "--database-url", store_url, "--config", str(config), "--org", org)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith(f"{org}: pruned 1 sessions, 1 effects")
    assert not await still_there(store, org, old)


@pytest.mark.parametrize("size", ["0", "10001", "many"])
def test_a_batch_size_out_of_bounds_is_refused(tmp_path: Path, size: str) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    result = run("prune", "--database-url", url, "--batch-size", size)
    assert result.returncode == 2
    assert "--batch-size" in result.stderr
    assert "Traceback" not in result.stderr
