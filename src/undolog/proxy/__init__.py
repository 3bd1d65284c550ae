"""The HTTP proxy: the REST API of the reference over the engine, as one ASGI app."""

from undolog.proxy.app import Runtime, create_app

__all__ = ["Runtime", "create_app"]
