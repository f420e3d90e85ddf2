"""gpushare: turn a ``gpu-fraction`` annotation into what the cluster's GPU-sharing scheme needs.

``core`` decides (policies, placement, sharing modes, framework env, planning, patch) and is
used through its public face only; ``server`` (the HTTPS admission service), ``cli`` and
``node`` (MPS daemon launcher, device-plugin configs) are thin edges that decode input, call
the core and encode its answer; ``install`` holds certificates and webhook configurations;
``constants`` owns every name shared with the cluster. docs/architecture.md draws the whole.
"""

__version__ = "0.1.0"
