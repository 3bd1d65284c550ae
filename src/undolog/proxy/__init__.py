"""The HTTP proxy: the REST API of the reference over the engine, as one ASGI app."""

from undolog.proxy.app import create_app
from undolog.runtime import Runtime

__all__ = ["Runtime", "create_app"]
