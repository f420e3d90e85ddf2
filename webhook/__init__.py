"""gpushare: turn a ``gpu-fraction`` annotation into what the cluster's GPU-sharing scheme needs.

Layout: docs/architecture.md.
"""

__version__ = "0.1.0"
