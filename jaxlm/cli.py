"""What every command shares: the `--config/--preset/--set` flags and the error boundary.

    parser = argparse.ArgumentParser(...); cli.add_config_args(parser)
    cfg = cli.load_config_from_args(parser.parse_args(argv))
    sys.exit(cli.run(main))

`run` turns a `UserError` into one line, ``error: <what>`` on stderr, and its
exit code (2: bad input, 1: runtime failure); ``--debug`` or ``JAXLM_DEBUG=1``
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from jaxlm.config import PRESETS, Config, help_config, load_config
from jaxlm.errors import UserError


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """`--help` keeps the description's line breaks and shows every option's default, except where there
    is none to show (None, False, []) or the help text names it already (what stands in for None)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == [] or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _HelpConfig(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(help_config())
        parser.exit()


def add_config_args(parser: argparse.ArgumentParser, base: str = "none") -> None:
    """--config FILE, --preset NAME, --set SECTION.KEY=VALUE (repeatable), --help-config; `base` says which
    config stands in when --config is absent."""
    g = parser.add_argument_group("configuration (the same flags on every command)")
    g.add_argument("--config", metavar="FILE",
                   help=f"TOML config (see --help-config); defaults fill missing keys (default: {base})")
    g.add_argument("--preset", metavar="NAME",
                   help=f"a named model size over the config: {', '.join(PRESETS)} (default: none)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one key, the value read as TOML (3, 1e-3, true, [1, 2], \"text\"); repeatable")
    g.add_argument("--help-config", action=_HelpConfig, help="list every config key with its type, default and doc")


def load_config_from_args(args: argparse.Namespace, extra: list[str] = (), path: str | Path | None = None) -> Config:
    """The config the flags describe; `path` (e.g. a run's config.toml) stands in when --config is absent."""
    return load_config(args.config or path, [*extra, *args.overrides], preset=args.preset)


def run(main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Call `main(argv)`; a UserError becomes one stderr line and its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("JAXLM_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    try:
        return main(argv)
    except UserError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


def check_option(ok: bool, flag: str, value, rule: str) -> None:
    """Stop with one line naming the option unless `ok` (argparse's own errors print the usage first)."""
    if not ok:
        raise UserError(f"{flag} {value}: {rule}")
