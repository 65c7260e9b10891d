"""Optional dependencies (pyproject extras), imported only where they are needed.

The core install trains, generates, checkpoints and logs without them; a command
that needs one fails in one line naming the extra to install. The packages registered beside jaxlm
(jaxlm.core.plugins) declare the extras of their own modules.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from types import ModuleType

from jaxlm.core import plugins
from jaxlm.core.errors import MissingExtra

# top-level module the library imports -> the extra that installs it
EXTRAS = {"xprof": "profile", "safetensors": "hf", "tokenizers": "hf", "huggingface_hub": "hf"}


@functools.cache
def known() -> dict[str, str]:
    """Every module whose extra is known: the library's (EXTRAS), then those of the registered packages."""
    return {**EXTRAS, **{m: e for r in plugins.registries() for m, e in getattr(r, "EXTRAS", {}).items()}}


def missing_message(module: str) -> str:
    extra = known()[module.split(".")[0]]
    cpu = " (CPU-only torch: see the README)" if extra == "torch" else ""
    return f"{module} is not installed; it comes with the '{extra}' extra: pip install -e '.[{extra}]'{cpu}"


def require(module: str) -> ModuleType:
    """`importlib.import_module(module)`, or MissingExtra naming the extra when it is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module.split(".")[0]:
            raise
        raise MissingExtra(missing_message(module)) from None


def exit_unless_installed(module: str) -> None:
    """For a command whose module needs `module` at import time: exit in one line instead of a traceback."""
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"error: {missing_message(module)}")


def not_installed(e: BaseException) -> MissingExtra | None:
    """A module missing from this Python (a shell without the venv, an install that failed) as one line saying how
    to get it; None for anything else, a module that exists but failed to import included."""
    top = (getattr(e, "name", None) or "").split(".")[0] if isinstance(e, ModuleNotFoundError) else ""
    if not top or top == "jaxlm" or importlib.util.find_spec(top) is not None:
        return None
    if top in known():
        return MissingExtra(missing_message(top))
    return MissingExtra(f"{top} is not installed in this Python ({sys.executable}): activate the environment jaxlm "
                        "was installed into (e.g. `. .venv/bin/activate`), or install jaxlm here: pip install -e .")
