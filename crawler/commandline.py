"""What every command line of the engine shares: its commands declared as one table (`Command`, read by the
parser, the checks and the dispatch alike), one-line argument errors, argument types for user-given names and
times, and the one place a `UserError` becomes a line on stderr and exit 2 (`crawler/errors.py`)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NoReturn, TypeVar

from crawler import config as config_mod
from crawler import layout
from crawler.errors import EXIT_BACKPRESSURE, EXIT_USER_ERROR, Backpressure, UserError


class Parser(argparse.ArgumentParser):
    """argparse, with a mistake on the command line reported as one line (argparse prints the usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: {message} (see {self.prog} --help)\n")


@dataclass(frozen=True)
class Argument:
    """One option of a command: argparse's flags and settings, and an optional check of its value that runs before
    the command does (a UserError naming the mistake, e.g. a seeds file that is not there)."""

    flags: tuple[str, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[Any], object] | None = None

    @property
    def dest(self) -> str:
        """The name the value is handed to the command's handler under (argparse's own rule for a long option)."""
        return self.settings.get("dest") or self.flags[0].lstrip("-").replace("-", "_")


def option(*flags: str, check: Callable[[Any], object] | None = None, **settings: Any) -> Argument:
    """An `Argument`, written the way `add_argument` is called."""
    return Argument(flags, settings, check)


@dataclass(frozen=True)
class Command:
    """One command of a command line, bound to its handler where it is declared. The handler is named as
    "module:function" and imported only when the command runs, so a light command never pays for the imports of a
    heavy one; it receives the value of each of `arguments` as a keyword named after its `dest`."""

    name: str
    help: str
    handler: str
    arguments: tuple[Argument, ...] = ()

    def options(self, args: argparse.Namespace) -> dict[str, Any]:
        """The command's own argument values, by the names its handler takes them under."""
        return {argument.dest: getattr(args, argument.dest) for argument in self.arguments}

    def check_arguments(self, args: argparse.Namespace) -> None:
        """Run the check of every argument given a value (UserError on the first mistake)."""
        for argument in self.arguments:
            value = getattr(args, argument.dest)
            if argument.check is not None and value:
                argument.check(value)


def resolve(reference: str) -> Callable[..., Any]:
    """The function a "module:function" reference names, importing its module."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def parser(prog: str, description: str, commands: Sequence[Command]) -> Parser:
    """The parser of a command line made of `commands`, in their order; every command also takes the config options
    (--root, --config, --set, -v), and the chosen command's name is `args.command`."""
    common = argparse.ArgumentParser(add_help=False)
    config_mod.add_arguments(common)
    top = Parser(prog=prog, description=description)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        command_parser = sub.add_parser(command.name, parents=[common], help=command.help)
        for argument in command.arguments:
            command_parser.add_argument(*argument.flags, **argument.settings)
    return top


CommandT = TypeVar("CommandT", bound=Command)


def chosen(commands: Sequence[CommandT], args: argparse.Namespace) -> CommandT:
    """The command of `commands` that `args` was parsed for."""
    return next(command for command in commands if command.name == args.command)


def segment_id(text: str) -> str:
    """A --segment value: a checked segment id (`crawler/layout.py::check_segment_id`)."""
    try:
        return layout.check_segment_id(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def iso_time(text: str) -> datetime:
    """A --now value: an ISO-8601 time, UTC when it names no zone."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time such as 2026-01-31T12:00:00Z: {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def positive_int(text: str) -> int:
    """A count that must be at least 1 (--cycles)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
        command: Callable[[argparse.Namespace], int]) -> int:
    """Parse `argv` and run `command` on it; a UserError it raises is one line on stderr and exit 2 (Backpressure:
    exit 75). Any other exception is a bug and keeps its traceback."""
    args = parser.parse_args(argv)
    try:
        return command(args)
    except (UserError, Backpressure) as exc:
        name = " ".join(filter(None, (parser.prog, getattr(args, "command", None))))
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_BACKPRESSURE if isinstance(exc, Backpressure) else EXIT_USER_ERROR
