"""gpushare: turn a ``gpu-fraction`` annotation into what the cluster's GPU-sharing scheme needs.

The package is a pure core (``request``, ``policy``, ``placement``, ``modes``, ``frameworks``,
``planning``, ``render``, ``patch``, ``mutation``) with thin edges (``cli``, ``server``,
``node``) that only decode input, call the core and encode its answer.
"""

__version__ = "0.1.0"
