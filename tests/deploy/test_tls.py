"""TLS by uvicorn itself (`--ssl-certfile`, `--ssl-keyfile`): a self-signed certificate made
here, a real server on a socket, a client that trusts only that certificate."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.servers import free_port, wait_until
from undolog.config import Settings, load_settings
from undolog.preflight import tls_problem
from undolog.proxy import create_app
from undolog.proxy.server import build_server


def _self_signed(folder: Path, name: str = "undolog") -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = folder / f"{name}.crt", folder / f"{name}.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return certfile, keyfile


def test_serve_answers_https_with_its_certificate_and_refuses_plain_http(tmp_path: Path) -> None:
    certfile, keyfile = _self_signed(tmp_path)
    settings = load_settings(
        {
            "database_url": f"sqlite:///{tmp_path / 'undolog.db'}",
            "spool_dir": str(tmp_path / "spool"),
            "ssl_certfile": str(certfile),
            "ssl_keyfile": str(keyfile),
        },
        env={},
    )
    port = free_port()
    server = build_server(create_app(settings), settings, port=port, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="uvicorn start")
        trusted = ssl.create_default_context(cafile=str(certfile))
        with httpx.Client(verify=trusted, timeout=10) as client:
            assert client.get(f"https://127.0.0.1:{port}/health").status_code == 200
            assert client.get(f"https://127.0.0.1:{port}/ready").status_code == 200
        with pytest.raises(httpx.ConnectError):  # a client that does not trust it
            httpx.get(f"https://127.0.0.1:{port}/health", timeout=10)
        with pytest.raises(httpx.TransportError):  # plain HTTP gets no answer
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_key_that_is_not_the_certificates_is_named_without_its_content(tmp_path: Path) -> None:
    certfile, _ = _self_signed(tmp_path, "one")
    _, other_key = _self_signed(tmp_path, "two")
    problem = tls_problem(str(certfile), str(other_key))
    assert problem is not None
    assert str(certfile) in problem and str(other_key) in problem
    assert "PRIVATE KEY" not in problem
    assert tls_problem(str(certfile), str(tmp_path / "missing.key")) is not None
    assert tls_problem(None, None) is None


def test_a_key_without_a_certificate_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="ssl_keyfile"):
        load_settings({"ssl_keyfile": "/etc/undolog/tls.key"}, env={})
    assert load_settings(env={"UNDOLOG_SSL_CERTFILE": "/c.pem"}).ssl_certfile == "/c.pem"
    assert Settings().ssl_certfile is None
