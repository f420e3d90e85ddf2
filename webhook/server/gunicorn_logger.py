"""gunicorn's logging: the ``logconfig_dict`` the webhook serves with, and a logger class
without the access-log work no line comes out of.

The webhook logs each admission itself (``admission_log``), and ``gunicorn.access`` stays at
WARNING (``logging_config``). gunicorn still builds every request's access
atoms when a ``logconfig_dict`` is set, whatever that logger's level: a dict of the
request's headers and environ per request, about 5% of a worker's time per admission in a
py-spy profile of the loop-answered path. Here the line is built only if it would be
written.
"""

from __future__ import annotations

import logging
from typing import Any

from gunicorn.glogging import Logger

from webhook.json_logging import JsonFormatter
from webhook.server.batched_log import ADMISSION_LOGGER


def logging_config(level: str) -> dict[str, Any]:
    """JSON lines to stderr for the webhook's loggers and gunicorn's (``logconfig_dict``)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            },
            # One line per admission: written in batches (see batched_log).
            "admissions": {
                "class": "webhook.server.batched_log.BatchedLineHandler",
                "formatter": "json",
            },
        },
        "root": {"level": level.upper(), "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {"level": level.upper(), "handlers": ["stderr"], "propagate": False},
            # The webhook logs each admission itself, with its decision; gunicorn's access
            # lines would only repeat them.
            "gunicorn.access": {"level": "WARNING", "handlers": ["stderr"], "propagate": False},
            ADMISSION_LOGGER: {
                "level": level.upper(),
                "handlers": ["admissions"],
                "propagate": False,
            },
        },
    }


class QuietAccessLogger(Logger):  # type: ignore[misc]
    """``gunicorn.glogging.Logger`` that skips access lines its logger would drop."""

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        if self.access_log.isEnabledFor(logging.INFO):
            super().access(resp, req, environ, request_time)
