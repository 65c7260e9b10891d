"""What every command shares: the `--config/--preset/--set` flags and the error boundary.

    parser = cli.ArgumentParser(...); cli.add_config_args(parser)
    cfg = cli.load_config_from_args(parser.parse_args(argv))
    sys.exit(cli.run(main))

`run` turns a `UserError` into one line, ``error: <culprit>: <what>; <what to do>``
on stderr, and its exit code (2: bad input, 1: runtime failure); running out of memory
into one line naming the limits set on the process (exit 1); a module missing from this Python into one line
saying how to install it (exit 1); any other exception into one
line saying where its full traceback was written (exit 1); Ctrl-C or SIGTERM (jaxlm.core.stop) into one
`interrupted:` line and exit 130 or 143; a reader that closed the pipe (`... | head`) into a quiet exit 141,
as a Unix tool killed by SIGPIPE. An error line's words are cut to WORD_LIMIT characters (a 100 kB value
is named, not echoed).
``--debug`` or ``JAXLM_DEBUG=1`` shows tracebacks instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Iterator

from jaxlm.cli import registry
from jaxlm.core import extras, limits, platform, stop
from jaxlm.core.config import PRESETS, Config, load_config
from jaxlm.core.errors import InternalError, OutOfMemory, UsageError, UserError, write_traceback
from jaxlm.core.typedconfig import help_config

platform.prepare()  # before any command imports JAX: CPU and a quiet start where a CUDA plugin has no GPU


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one `error:` line (through `run`) instead of usage + message; `needs` (what must be
    installed: "the core install", "the 'torch' extra") ends the --help text. A registered command's parser is made
    with `command=MODULE`: its prog (`python -m MODULE`) and its needs are the registry's (jaxlm.cli.registry)."""

    def __init__(self, *args, command: str | None = None, needs: str | None = None, **kwargs):
        if command is not None:
            entry = registry.find(command)
            kwargs.setdefault("prog", f"python -m {command}")
            needs = entry.needs if entry else needs
        if needs:
            kwargs["epilog"] = "\n\n".join(filter(None, [kwargs.get("epilog"), f"Needs {needs}."]))
        super().__init__(*args, **kwargs)
        # Read (and removed from argv) by `run`; listed here so that --help shows it.
        self.add_argument("--debug", action="store_true", help="print tracebacks instead of one-line errors "
                          "(also JAXLM_DEBUG=1)")

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}; see --help")

    def _print_message(self, message: str, file=None) -> None:
        """As argparse's (--help, --version), without swallowing a write error: a closed pipe reaches `run`."""
        if message:
            (file or sys.stderr).write(message)


def bounded(kind: type = int, low=None, high=None, open_low: bool = False, open_high: bool = False):
    """An argparse `type=` for `kind` values in [low, high] (open ends with open_low / open_high)."""
    rule = " and ".join(([f"{'>' if open_low else '>='} {low}"] if low is not None else [])
                        + ([f"{'<' if open_high else '<='} {high}"] if high is not None else []))

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        too_low = low is not None and (value <= low if open_low else value < low)
        too_high = high is not None and (value >= high if open_high else value > high)
        if too_low or too_high or value != value:  # NaN fails every comparison
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    return convert


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """`--help` keeps the description's line breaks and shows every option's default, except where there
    is none to show (None, False, []) or the help text names it already (what stands in for None)."""

    def _get_help_string(self, action):
        nothing = action.default is None or action.default is False or action.default == []
        if nothing or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class _HelpConfig(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(help_config(Config))
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


WORD_LIMIT, LINE_LIMIT = 200, 2000  # characters of one word (a value, a path) and of a whole error line


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _clipped(line: str) -> str:
    """`line` with each word over WORD_LIMIT characters cut to its start and its length, and its middle cut when
    still over LINE_LIMIT (the culprit comes first, what to do last): a 100 kB config value or a path past
    PATH_MAX is named by its key or flag and its first characters, not echoed whole."""
    def cut(word: str) -> str:
        if len(word) <= WORD_LIMIT:
            return word
        end = len(word) - len(word.rstrip("'\":;,)"))  # the word's closing quote and punctuation stay
        return f"{word[:WORD_LIMIT // 2]}... ({len(word):,} characters){word[len(word) - end:]}"

    line = " ".join(map(cut, line.split(" ")))
    if len(line) <= LINE_LIMIT:
        return line
    head, tail = LINE_LIMIT // 2, LINE_LIMIT // 4
    return f"{line[:head]} ... ({len(line) - head - tail:,} characters cut) ... {line[-tail:]}"


def _unexpected(e: BaseException, run_dir: str | Path | None = None) -> str:
    """The one line for an exception that is not a UserError, after saving its traceback."""
    path = write_traceback(run_dir)
    where = f"full traceback in {path}" if path else "no traceback file could be written"
    first = _one_line(e)[:300] or "(no message)"
    return f"unexpected {type(e).__name__}: {first}; {where} (rerun with --debug to print it)"


def out_of_memory(e: BaseException) -> OutOfMemory | None:
    """A failed allocation as the machine's limit, not a bug: its line names the limits set on the process."""
    if not limits.is_out_of_memory(e):
        return None
    first = _one_line(e)[:200] or type(e).__name__
    where = limits.describe_limits() or "no limit is set on this process: the host or the device is full"
    return OutOfMemory(f"out of memory ({first}); {where}; use a smaller batch or model, or raise the limit")


@contextlib.contextmanager
def traceback_in(run_dir: str | Path) -> Iterator[None]:
    """Inside the block, an unexpected exception's traceback goes to RUN/error.log (when RUN exists)
    and it leaves as an InternalError whose one line says so; UserErrors, running out of memory and a
    closed stdout pass through as what they are."""
    try:
        yield
    except (UserError, BrokenPipeError):
        raise
    except Exception as e:  # with --debug, `run` re-raises this and Python prints both tracebacks
        if _interrupt_of(e) is not None:
            raise
        raise (extras.not_installed(e) or out_of_memory(e) or InternalError(_unexpected(e, run_dir))) from e


def _interrupt_of(e: BaseException | None) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt behind `e`: itself, or the cause of the error it became (a C extension whose import
    Ctrl-C stopped raises ImportError "initialization failed" from it)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _stdout_closed() -> int:
    """The reader of stdout went away (`... | head`): nothing more to say, and nothing at exit either
    (the interpreter's final flush would complain), so stdout points at /dev/null from here on."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file descriptor (a test's StringIO)
        pass
    return 128 + signal.SIGPIPE


def run(main: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Call `main(argv)` behind the error boundary (see the module docstring); returns the exit code. As the
    process's own command (argv None), the ended command ignores SIGINT/SIGTERM while the interpreter exits, so its
    exit code stands: Python gives SIGINT its default action (death) before it tears the modules down, and a second
    Ctrl-C while a checkpoint writer is joined would kill it mid-way."""
    own_command = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("JAXLM_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    try:
        try:
            held = stop.arm() if own_command else None
            if held:
                raise stop.Interrupted(f"{held} during start-up, before the command began; nothing was done", held)
            return main(argv)
        finally:
            if own_command:  # a closed pipe shows here, where it can still be handled, not at exit
                sys.stdout.flush()
    except BrokenPipeError:
        return _stdout_closed()
    except UserError as e:
        if debug:
            raise
        print(f"error: {_clipped(_one_line(e))}", file=sys.stderr)
        return e.exit_code
    except (KeyboardInterrupt, Exception) as e:
        if debug:
            raise
        stopped = _interrupt_of(e)
        if stopped is not None:
            return _interrupted(stopped, own_command)
        known = extras.not_installed(e) or out_of_memory(e)
        print(f"error: {_clipped(_one_line(known) if known else _unexpected(e))}", file=sys.stderr)
        return 1
    finally:
        if own_command:
            stop.arm(False)
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_IGN)


def _interrupted(e: KeyboardInterrupt, own_command: bool) -> int:
    """Exit 130 (SIGINT) or 143 (SIGTERM) with one line (an Interrupted stop says what was and was not done); as
    the process's own command, without the interpreter's exit, which can crash after JAX was stopped mid-call."""
    code = stop.exit_code(e)
    if str(e) or own_command:
        print(f"interrupted: {_clipped(_one_line(e)) or stop.signal_name(e) + ', stopped'}", file=sys.stderr)
    if own_command:
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """Leave without the interpreter's exit (everything the command held was released while unwinding)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def check_option(ok: bool, flag: str, value, rule: str) -> None:
    """Stop with one line naming the option unless `ok` (for rules that span options; single ranges: `bounded`)."""
    if not ok:
        raise UsageError(f"{flag} {value}: {rule}")
