"""The image's HEALTHCHECK: exit 0 when this container's `undolog serve` answers GET /health.

Standard library only (the final image has no curl). It asks the port UNDOLOG_PORT names, over
HTTPS when UNDOLOG_SSL_CERTFILE is set (the certificate is not checked: it is our own process).
"""

import os
import ssl
import sys
import urllib.request

scheme = "https" if os.environ.get("UNDOLOG_SSL_CERTFILE") else "http"
url = f"{scheme}://127.0.0.1:{os.environ.get('UNDOLOG_PORT', '8080')}/health"
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
try:
    with urllib.request.urlopen(url, timeout=3, context=context) as answer:  # noqa: S310
        sys.exit(0 if answer.status == 200 else 1)
except OSError:
    sys.exit(1)
