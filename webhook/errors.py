"""The project's error hierarchy: every error a user can cause says what is wrong and how to fix it.

Policy violations of a *pod* are not exceptions: they are ``Denied`` decisions (see
``webhook.core.planning``). Exceptions here are for bad configuration and bad input files.
"""

from __future__ import annotations


class GpushareError(Exception):
    """Base of every error gpushare raises on purpose."""


class PolicyError(GpushareError):
    """One or more policy documents are invalid.

    ``problems`` holds one line per problem, each ``file: yaml.path: what is wrong``.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ManifestError(GpushareError):
    """An input manifest (a Pod given to the CLI) cannot be read or is not a Pod."""
