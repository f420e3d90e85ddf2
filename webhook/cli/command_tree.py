"""The ``gpushare`` command tree as the command modules build it, kept so that it can be walked.

argparse keeps a parser's arguments and subcommands in private lists. The command modules
add theirs through ``Command`` and ``Arguments`` instead, which pass each call on to argparse
unchanged and keep what it returns: every subcommand (``Command.subcommands``) with its line
in its parent's command list (``Command.help``), and the action of every argument
(``Command.arguments``; argparse's own ``-h`` aside). The tests walk the tree: a help for
every command and flag, one meaning per flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any, Protocol


class SubCommands(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns, as far as the CLI uses it (argparse
    names its class privately)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


class ArgumentContainer(Protocol):
    """A parser or one of its argument groups (argparse names the groups' classes privately)."""

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action: ...

    def add_argument_group(self, *args: Any, **kwargs: Any) -> ArgumentContainer: ...

    def add_mutually_exclusive_group(self, *, required: bool = False) -> ArgumentContainer: ...


class Arguments:
    """Where a command's arguments go: its parser, or a group of its arguments. The methods
    are argparse's; each action ``add_argument`` makes is also kept in ``arguments``, the
    command's list."""

    def __init__(self, container: ArgumentContainer, arguments: list[argparse.Action]) -> None:
        self._container = container
        self.arguments = arguments

    def add_argument(self, *name_or_flags: str, **kwargs: Any) -> argparse.Action:
        action = self._container.add_argument(*name_or_flags, **kwargs)
        self.arguments.append(action)
        return action

    def add_argument_group(
        self, title: str | None = None, description: str | None = None
    ) -> Arguments:
        return Arguments(self._container.add_argument_group(title, description), self.arguments)

    def add_mutually_exclusive_group(self, *, required: bool = False) -> Arguments:
        group = self._container.add_mutually_exclusive_group(required=required)
        return Arguments(group, self.arguments)


class Command(Arguments):
    """One command of the tree: its ``parser``, the ``arguments`` added to it, the
    ``subcommands`` under it by name, and ``help``, its line in its parent's command list
    (None: none given)."""

    def __init__(self, parser: argparse.ArgumentParser, help: str | None = None) -> None:
        super().__init__(parser, [])
        self.parser = parser
        self.help = help
        self.subcommands: dict[str, Command] = {}

    def set_defaults(self, **defaults: Any) -> None:
        self.parser.set_defaults(**defaults)

    def add_subcommands(self, **kwargs: Any) -> Commands:
        """``add_subparsers`` with argparse's keywords; what it adds is kept here."""
        return Commands(self, self.parser.add_subparsers(**kwargs))

    def walk(self) -> Iterator[Command]:
        """This command and every command under it, each parent before its subcommands."""
        yield self
        for subcommand in self.subcommands.values():
            yield from subcommand.walk()


class Commands:
    """The subcommands of one command: ``add_parser`` as argparse's, each command it makes
    also kept in the parent's ``subcommands``."""

    def __init__(self, parent: Command, subparsers: SubCommands) -> None:
        self._parent = parent
        self._subparsers = subparsers

    def add_parser(self, name: str, **kwargs: Any) -> Command:
        command = Command(self._subparsers.add_parser(name, **kwargs), kwargs.get("help"))
        self._parent.subcommands[name] = command
        return command
