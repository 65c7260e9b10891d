"""Run many command lines in one Python process, each through its module's real `__main__`.

    python tests/system/cli_harness.py ROWS.json OUT.json

ROWS.json is a list of ``[module, [arg, ...], cwd]``; OUT.json gets one ``{"code", "stderr"}``
per row: the exit status and what the command wrote to stderr, with an escaping exception
printed the way the interpreter would. One process for a whole table of bad invocations
(`tests/system/test_bad_invocations.py`) saves a JAX/torch start-up per row.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import signal
import sys
import traceback
import warnings


def run_one(module: str, args: list[str], cwd: str) -> dict:
    """`python -m module *args` in `cwd`, in this process: its exit status and stderr (the working directory,
    sys.argv and the SIGINT/SIGTERM handlers are restored afterwards, so a test calling this leaves its process
    as it found it)."""
    here, argv = os.getcwd(), sys.argv
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # an ended command ignores both
    os.chdir(cwd)
    sys.argv = [module, *args]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        except BaseException:  # what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        finally:
            os.chdir(here)
            sys.argv = argv
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    return {"code": code, "stderr": err.getvalue()}


def main(rows_path: str, out_path: str) -> None:
    # runpy warns that the package imported the module it is about to run as __main__.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
    rows = json.loads(open(rows_path).read())
    results = [run_one(module, args, cwd) for module, args, cwd in rows]
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main(*sys.argv[1:3])
