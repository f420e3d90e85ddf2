"""The exit codes of every ``gpushare`` command: a contract scripts and CI rely on.

0: done (every document admitted); 1: a failure while running (the cluster refused, a
daemon stopped); 2: a usage error, unreadable or invalid input, invalid policies; 3: a
document denied (``mutate``, ``explain``).
"""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DENIED = 3
# 128 + SIGPIPE, what a shell reports for a tool its reader stopped reading.
EXIT_BROKEN_PIPE = 141
