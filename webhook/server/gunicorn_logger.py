"""gunicorn's logger, without the access-log work no line comes out of.

The webhook logs each admission itself (``instrument``), and ``gunicorn.access`` stays at
WARNING (``gunicorn_conf.logging_config``). gunicorn still builds every request's access
atoms when a ``logconfig_dict`` is set, whatever that logger's level: a dict of the
request's headers and environ per request, about 5% of a worker's time per admission in a
py-spy profile of the loop-answered path. Here the line is built only if it would be
written.
"""

from __future__ import annotations

import logging
from typing import Any

from gunicorn.glogging import Logger


class QuietAccessLogger(Logger):  # type: ignore[misc]
    """``gunicorn.glogging.Logger`` that skips access lines its logger would drop."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.access_log.isEnabledFor(logging.INFO):
            super().access(resp, req, environ, request_time)
