"""Fixtures of the fault suite: the counting upstream, clusters of proxies, trials, the report.

A *case* is one fault (a crash point, an outage, a full disk...) on one store. Every test that
reports counts (`fault_report`) is a case and runs once per trial: `--faults-seeds N`
(declared in tests/conftest.py) runs N trials of every case, each with its own seed; the
default is small so that CI runs the bounded suite in a few minutes. Each trial reports one
line, "faults: store=S point=P calls=N duplicates=D lost=L stuck=K [recovery_s=R]" (the calls
the trial made, and what became of them); the terminal summary (no `-s` needed) gives every
line and then one line per case and store: its trials, and the counts summed over them (the
highest recovery time). The lines are also written to
`faults-summary.txt` under pytest's base temporary directory, as JSON to `--faults-report
PATH` when given, and attached to the test as a JUnit property.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import fresh_pg_database
from tests.faults.harness import Cluster
from tests.faults.upstream import ExecutionLog, create_counting_app
from tests.proxy.conftest import write_org_config
from tests.support.servers import ThreadServer

DEFAULT_SEEDS = 1


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # `fault_report` asks for `seed`, so every reporting test is parametrized: N trials a case.
    if "seed" in metafunc.fixturenames:
        seeds = metafunc.config.getoption("faults_seeds", None) or DEFAULT_SEEDS
        metafunc.parametrize("seed", range(int(seeds)), ids=lambda s: f"seed{s}")


@pytest.fixture
def fault_report(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, seed: int
) -> Callable[..., str]:
    """Record a trial's counts (before it asserts them, so a failing trial reports too)."""

    def report(*, store: str, point: str, trials: int, duplicates: int, lost: int,
               stuck: int, recovery: float | None = None) -> str:  # fmt: skip
        line = (
            f"faults: store={store} point={point} calls={trials} duplicates={duplicates} "
            f"lost={lost} stuck={stuck}"
        )
        if recovery is not None:
            line += f" recovery_s={recovery:.2f}"
        # Carried by the test's reports to the summary (tests/faults/report.py), also from
        # pytest-xdist's workers to the controller.
        request.node.user_properties.append(("faults", line))
        summary = tmp_path_factory.getbasetemp() / "faults-summary.txt"
        with summary.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
        return line

    return report


@pytest.fixture(scope="session")
def execution_log(tmp_path_factory: pytest.TempPathFactory) -> ExecutionLog:
    return ExecutionLog(tmp_path_factory.mktemp("faults") / "executions.jsonl")


@pytest.fixture(scope="session")
def counting_upstream(execution_log: ExecutionLog) -> Iterator[ThreadServer]:
    """One counting tool server for the run; tests tell their calls apart by session id."""
    server = ThreadServer(create_counting_app(execution_log.path)).start()
    try:
        yield server
    finally:
        server.stop()


def _make_cluster(
    store_url: str, upstream: ThreadServer, log: ExecutionLog, directory: Path
) -> Cluster:
    org_id, key = f"org-{secrets.token_hex(6)}", "ul_test_" + secrets.token_urlsafe(18)
    config = write_org_config(directory / f"{org_id}.toml", org_id, key)
    return Cluster(store_url, upstream.url, config, org_id, key, directory, log)


def _stop(clusters: list[Cluster]) -> None:
    for cluster in clusters:
        for server in cluster.started:
            server.kill()


@pytest.fixture(scope="session")
def faults_pg_url() -> Iterator[str]:
    """The long-lived cluster's own PostgreSQL database: its proxy lives for the whole run, and
    its sweepers (approvals, leases) work across orgs, so on the run's shared database it would
    sweep other tests' approvals and run them on the counting upstream."""
    with fresh_pg_database("faults") as url:
        yield url


@pytest.fixture(scope="session")
def _clusters(
    counting_upstream: ThreadServer,
    execution_log: ExecutionLog,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Cluster]]:
    """One cluster per store for the whole run, so its clean proxy starts once (a python
    start-up costs seconds on a busy 2-core machine). Made on first use."""
    made: dict[str, Cluster] = {}
    yield made
    _stop(list(made.values()))


@pytest.fixture(params=["sqlite", "postgres"])
def cluster(
    request: pytest.FixtureRequest,
    _clusters: dict[str, Cluster],
    counting_upstream: ThreadServer,
    execution_log: ExecutionLog,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Cluster]:
    """The run's cluster on each store in turn; proxies a test spawns die with the test."""
    store: str = request.param
    if store not in _clusters:
        directory = tmp_path_factory.mktemp(f"faults-{store}")
        url = (
            str(request.getfixturevalue("faults_pg_url"))
            if store == "postgres"
            else f"sqlite:///{directory / 'undolog.db'}"
        )
        _clusters[store] = _make_cluster(url, counting_upstream, execution_log, directory)
    cluster = _clusters[store]
    cluster.clean  # noqa: B018 - started (or restarted) before the test begins
    yield cluster
    clean = cluster.clean_or_none
    for server in cluster.started:
        if server is not clean:
            server.kill()
    cluster.started[:] = [clean] if clean else []


@pytest.fixture
def cluster_on(
    counting_upstream: ThreadServer, execution_log: ExecutionLog, tmp_path: Path
) -> Iterator[Callable[[str], Cluster]]:
    """Clusters of a test's own on a given store URL, fresh org; stopped at the end."""
    made: list[Cluster] = []

    def make(store_url: str) -> Cluster:
        made.append(_make_cluster(store_url, counting_upstream, execution_log, tmp_path))
        return made[-1]

    try:
        yield make
    finally:
        _stop(made)
