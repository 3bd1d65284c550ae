"""The webhook sender over both stores and a real local receiver, without a proxy: a
compensation that exhausted its retries (it needs a person) is announced; backoff and
signatures as pure functions; the config's `[[orgs.webhooks]]` checks."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
import structlog

from tests.support.receiver import Receiver, verify_signature
from tests.support.servers import await_until
from undolog.config import load_settings
from undolog.engine import Engine
from undolog.engine.saga import Claim, Saga
from undolog.services.webhook_messages import sign
from undolog.services.webhooks import WebhookSender, backoff_seconds, subscriptions
from undolog.store import Store
from undolog.webhook_config import WEBHOOK_EVENTS, WebhookConfig
from undolog_sdk.errors import CompensationFailed

SECRET = "whsec_" + "k" * 32
UNDO = {"fn_name": "undo_send_email", "args": {}, "max_retries": 0, "retry_backoff_ms": 1}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver().start()
    try:
        yield hook
    finally:
        hook.stop()


async def sender_for(store: Store, org_id: str, hook: WebhookConfig) -> WebhookSender:
    sender = WebhookSender(
        store,
        {(org_id, hook.name): hook},
        dashboard_url="https://undolog.example.com",
        log=structlog.get_logger("test"),
        backoff_seconds=0.05,
    )
    return sender


@pytest.fixture
async def escalated(store: Store, org_id: str) -> AsyncIterator[str]:
    """A session whose one compensation failed for good, announced to the webhooks `ops`
    and `chat`; its id."""
    hooks = [WebhookConfig(name, "http://unused", None, "slack") for name in ("ops", "chat")]
    async with store.transaction() as q:
        await q.replace_webhook_subscriptions(subscriptions([(org_id, hooks)]))
    engine = Engine(store, lease_seconds=30)
    await engine.ensure_org(org_id)
    await engine.register_tool(org_id, "send_email", tier="compensable", compensation=UNDO)
    session = str(uuid.uuid4())
    decision = await engine.intercept(org_id, session, "send_email", {"to": "a@b.c"},
                                      step_index=1)  # fmt: skip
    await engine.commit(org_id, decision.effect_id, '{"message_id":"m-1"}')
    saga = Saga(store, lease_seconds=30)
    await saga.begin(org_id, session)
    claimed = await saga.claim(org_id, session, "proxy")
    assert isinstance(claimed, Claim)
    with pytest.raises(CompensationFailed):
        await saga.fail_attempt(org_id, claimed.entry.entry_id, "smtp down", claimed.token)
    yield session


async def test_an_escalated_compensation_is_announced(
    store: Store, org_id: str, receiver: Receiver, escalated: str
) -> None:
    sender = await sender_for(store, org_id, WebhookConfig("ops", receiver.url, SECRET))
    await sender.start()
    try:
        sender._wake.set()  # events were written before it started
        await await_until(lambda: receiver.at(), what="the compensation_failed webhook")
    finally:
        await sender.stop()
    (request,) = receiver.at()
    assert verify_signature(SECRET, request.headers["x-undolog-signature"], request.body)
    body = request.json()
    assert (body["type"], body["session_id"]) == ("compensation_failed", escalated)
    assert body["data"]["fn_name"] == "undo_send_email"
    assert body["data"]["error"] == "smtp down"
    assert "approval" not in body
    assert body["links"] == {"session": f"https://undolog.example.com/ui/#/sessions/{escalated}"}


async def test_the_slack_message_of_an_escalation_links_to_the_session(
    store: Store, org_id: str, receiver: Receiver, escalated: str
) -> None:
    hook = WebhookConfig("chat", receiver.url, None, "slack")
    sender = await sender_for(store, org_id, hook)
    await sender.start()
    try:
        sender._wake.set()
        await await_until(lambda: receiver.at(), what="the slack message")
    finally:
        await sender.stop()
    (request,) = receiver.at()
    assert "x-undolog-signature" not in request.headers  # no secret: not signed
    message = request.json()
    assert "Compensation needs a person" in message["text"]
    assert "smtp down" in message["blocks"][0]["text"]["text"]
    (button,) = message["blocks"][1]["elements"]
    assert button["url"] == f"https://undolog.example.com/ui/#/sessions/{escalated}"


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_seconds(n, 1.0, 10.0) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert backoff_seconds(10_000, 1.0, 300.0) == 300.0


def test_a_signature_covers_the_timestamp_and_the_body() -> None:
    body = orjson.dumps({"id": "evt_1"})
    header = sign(SECRET, 1_800_000_000, body)
    assert header.startswith("t=1800000000,v1=")
    assert verify_signature(SECRET, header, body, now=1_800_000_000 + 299)
    assert not verify_signature(SECRET, header, body, now=1_800_000_000 + 301)  # too old
    replayed_later = header.replace("t=1800000000", "t=1800000600")
    assert not verify_signature(SECRET, replayed_later, body, now=1_800_000_600)


def _settings(tmp_path: Path, webhook: str, env: dict[str, str] | None = None) -> object:
    path = tmp_path / "undolog.toml"
    path.write_text(f'[[orgs]]\nid = "acme"\n[[orgs.webhooks]]\n{webhook}', encoding="utf-8")
    return load_settings({"config": str(path)}, env or {})


def test_the_config_reads_webhooks(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        'name = "ops"\nurl = "https://hooks.example.com/x?token=1"\nsecret_env = "HOOK"\n'
        'events = ["approval_required"]\n',
        {"HOOK": SECRET},
    )
    (hook,) = settings.orgs[0].webhooks  # type: ignore[attr-defined]
    assert hook == WebhookConfig(
        "ops", "https://hooks.example.com/x?token=1", SECRET, "json", ("approval_required",)
    )
    assert SECRET not in repr(hook)
    slack = _settings(tmp_path, 'name = "s"\nurl = "https://hooks.slack.com/services/T/B/X"\n'
                      'kind = "slack"\n')  # fmt: skip
    assert slack.orgs[0].webhooks[0].events == WEBHOOK_EVENTS  # type: ignore[attr-defined]


@pytest.mark.security
@pytest.mark.parametrize(
    ("webhook", "problem"),
    [
        ('name = "a"\nurl = "https://h.example.com/"\n', "needs secret"),
        ('name = "a"\nurl = "ftp://h.example.com/"\nsecret = "s"\n', "http:// or https://"),
        ('name = "a"\nurl = "https://u:p@h.example.com/"\nsecret = "s"\n', "user or password"),
        ('name = "a"\nurl = "https://h.example.com/"\nsecret = "s"\nkind = "x"\n', "kind"),
        ('name = "a"\nurl = "https://h.example.com/"\nsecret = "s"\nevents = ["x"]\n', "events"),
        (
            'name = "a"\nurl = "https://h.example.com/"\nsecret = "s"\nheaders = {}\n',
            "unknown keys",
        ),
    ],
)
def test_a_bad_webhook_is_refused_at_start(tmp_path: Path, webhook: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as raised:
        _settings(tmp_path, webhook)
    assert "u:p@" not in str(raised.value)  # a URL's credentials are never echoed


async def test_two_senders_on_one_database_deliver_each_row_once(
    store: Store, store_url: str, org_id: str, receiver: Receiver
) -> None:
    """Two processes' senders (two stores on one database) claiming at once: every event
    reaches the receiver exactly once (PostgreSQL: SKIP LOCKED; SQLite: one writer)."""
    from undolog.store import open_store

    hook = WebhookConfig("ops", receiver.url, SECRET)
    async with store.transaction() as q:
        await q.replace_webhook_subscriptions(subscriptions([(org_id, [hook])]))
        for n in range(40):
            await q.insert_event(org_id, "approval_required", None, None, f'{{"n":{n}}}', n)
    other = await open_store(store_url)
    senders = [await sender_for(s, org_id, hook) for s in (store, other)]
    try:
        for sender in senders:  # not started: driven by hand below
            sender._http = aiohttp.ClientSession()

        async def drain(sender: WebhookSender) -> None:
            while await sender.run_once():
                pass

        await asyncio.gather(*(drain(s) for s in senders))
    finally:
        for sender in senders:
            await sender.stop()
        await other.close()
    ids = [r.headers["x-undolog-event-id"] for r in receiver.at()]
    assert len(ids) == 40 and len(set(ids)) == 40
