"""``python -m webhook.cli``: the ``gpushare`` command from a checkout, without installing it."""

import sys

from webhook.cli import main

sys.exit(main())
