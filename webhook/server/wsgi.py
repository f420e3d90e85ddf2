"""The WSGI entry point gunicorn loads in each worker: ``webhook.server.wsgi:app``.

Built from the ``GPUSHARE_*`` settings (see ``settings``). gunicorn imports this module in
each worker after forking (the config does not preload the app), so every worker gets its
own policy poller thread and its own view of the certificate.
"""

from __future__ import annotations

from webhook.server.app import create_app_from_settings
from webhook.server.settings import ServeSettings

app = create_app_from_settings(ServeSettings.from_environ())
