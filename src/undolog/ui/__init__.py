"""The dashboard: one HTML page, its ES modules and one CSS file, served at `/ui` by the proxy.

No build step and no CDN: the files ship inside the package (`static/`; the modules are
listed in `app.js` and docs/dashboard.md). The page talks to
the REST API with `fetch` and follows `GET /events`; it signs in through `/ui/login`
(`undolog.proxy.ui_auth`), which sets the session cookie the edge accepts.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.staticfiles import StaticFiles

__all__ = ["STATIC_DIR", "mount_ui"]

STATIC_DIR = Path(__file__).parent / "static"

# Everything the page loads comes from this origin; nothing may frame it.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def mount_ui(app: FastAPI) -> None:
    """Serve the dashboard at `/ui/` (page) and `/ui/static/` (its script and style)."""

    async def page(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS)

    async def to_page(request: Request) -> Response:
        return RedirectResponse("/ui/", status_code=307)

    app.add_route("/ui", to_page, methods=["GET"], include_in_schema=False)
    app.add_route("/ui/", page, methods=["GET"], include_in_schema=False)
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
