"""Trees of frozen dataclasses from nested dicts and TOML: typed coercion, unknown keys named with a
close match, dotted `key=value` overrides, TOML out (tomli-w) and a `--help-config` listing.

Generic on purpose: `jaxlm/core/config.py` declares the tree; this module knows nothing of its sections.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from jaxlm.core.errors import ConfigError

MAX_DIGITS = 300  # no key takes a longer integer; beyond about 308 float() overflows, beyond 4300 repr() refuses


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, converting only where lossless (int -> float)."""
    origin = typing.get_origin(tp)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_DIGITS:
        digits = int(value.bit_length() * math.log10(2)) + 1
        raise ConfigError(f"{key}: an integer of about {digits:,} digits; no key takes one of over {MAX_DIGITS}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table of settings, got {value!r}")
        return from_dict(tp, value, prefix=key + ".")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {tp}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key} = {value!r}: not one of {', '.join(map(repr, choices))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} = {value!r}: expected a list")
        (item,) = typing.get_args(tp)[:1] or (Any,)
        return origin(_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if tp in (int, float) and isinstance(value, bool) or not isinstance(value, tp):
        raise ConfigError(f"{key} = {value!r}: expected {tp.__name__}, got {type(value).__name__}")
    if tp is float and not math.isfinite(value):  # TOML reads inf, nan and 1e400 (inf): no key means them
        raise ConfigError(f"{key} = {value!r}: must be a finite number")
    if tp is str and "\0" in value:  # no file name, prompt or tokenizer name holds one; the OS refuses it late
        raise ConfigError(f"{key} = {value!r}: holds a NUL character")
    return value


def _unknown_key(key: str, names: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key.rsplit(".", 1)[-1], names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return ConfigError(f"unknown key '{key}'; {hint}valid keys here: {', '.join(names)}")


@functools.cache
def _hints(cls) -> dict[str, Any]:
    """`cls`'s field types, resolved once per class: each resolution compiles every string annotation, and listing
    the plans checks some 30,000 overrides (5 s of 7 s went there)."""
    return typing.get_type_hints(cls)


def from_dict(cls, data: dict, prefix: str = ""):
    """Build dataclass `cls` from a (nested) dict, rejecting unknown keys by name."""
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in names:
            raise _unknown_key(prefix + k, names)
    kwargs = {k: _coerce(hints[k], v, prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(prefix) else prefix + msg) from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` -> (['a', 'b'], value); the value is read as TOML, else taken as a string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected SECTION.KEY=VALUE")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except ValueError:  # Python's limit on an integer's digits (4300)
        raise ConfigError(f"{key.strip()}: a number of {len(raw.strip()):,} characters, too long to read; no key "
                          "takes one that large") from None
    return key.strip().split("."), value


def check_override(cls, path: list[str], value: Any) -> None:
    """Raise ConfigError if `path` is not a key of `cls` or `value` has the wrong type for it."""
    hints, prefix = _hints(cls), ""
    for i, part in enumerate(path):
        names = list(hints)
        if part not in hints:
            raise _unknown_key(prefix + part, names)
        tp = hints[part]
        if i < len(path) - 1:
            if not dataclasses.is_dataclass(tp):
                raise ConfigError(f"'{prefix + part}' is a value, not a section")
            hints, prefix = _hints(tp), prefix + part + "."
        elif dataclasses.is_dataclass(tp) and not isinstance(value, dict):  # a whole table is checked later
            raise ConfigError(f"'{prefix + part}' is a section, not a value; set one of its keys "
                              f"({prefix + part}.KEY=VALUE), e.g. {prefix + part}.{dataclasses.fields(tp)[0].name}")
        else:
            _coerce(tp, value, prefix + part)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = copy_tree(data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        old = node.get(path[-1])  # an inline table (`train={steps=3}`) sets its keys, not the whole section
        node[path[-1]] = merge_trees(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return data


def copy_tree(d):
    return {k: copy_tree(v) if isinstance(v, dict) else v for k, v in d.items()}


def merge_trees(base: dict, top: dict) -> dict:
    """Deep merge into a copy of `base`: tables merge key by key, anything else in `top` replaces."""
    out = copy_tree(base)
    for k, v in top.items():
        out[k] = merge_trees(out[k] if isinstance(out.get(k), dict) else {}, v) if isinstance(v, dict) else v
    return out


def flatten_tree(tree: dict, prefix: str = "") -> dict:
    """Dotted keys: {"optim": {"lr": 1}} and {"optim.lr": 1} both become {"optim.lr": 1}."""
    out = {}
    for k, v in tree.items():
        out.update(flatten_tree(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


def read_toml(path: str | Path) -> dict:
    """The TOML file as a dict; a UTF-8 byte-order mark (what some Windows editors write first) is skipped."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}); a TOML config "
                          "is a text file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except ValueError:  # Python's limit on an integer's digits (4300)
        raise ConfigError(f"{path}: {_long_number(path.read_bytes().decode('utf-8-sig'))}: a number too long to read; "
                          "no key takes one that large") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None


def _long_number(text: str) -> str:
    """Where a TOML text holds a number of over 4300 digits: "line N (KEY = ...)"."""
    for n, line in enumerate(text.splitlines(), 1):
        if re.search(r"\d[\d_]{4299}", line):
            return f"line {n} ({line.split('=', 1)[0].strip()[:100]} = ...)"
    return "a value"


def to_dict(cfg) -> dict:
    """The config as nested dicts, without unset (None) values: what config.toml holds."""

    def clean(d):
        return {k: clean(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}

    return clean(dataclasses.asdict(cfg))


def dumps_toml(data: dict) -> str:
    import tomli_w

    return tomli_w.dumps(data)


def toml_value(value: Any) -> str:
    """One value as TOML text (what `--set key=VALUE` reads back to the same value); lists on one line."""
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return dumps_toml({"v": value})[len("v = "):].strip()


def help_config(cls, prefix: str = "") -> str:
    """Every key of the tree with its type, default and doc, one line each."""
    lines = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.append(f"\n[{prefix}{f.name}]  {(tp.__doc__ or '').strip().splitlines()[0]}")
            lines.append(help_config(tp, prefix + f.name + "."))
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        shown = "unset" if default is None else toml_value(default)
        lines.append(f"  {prefix}{f.name} = {shown}  ({_type_name(tp)})  {f.metadata.get('doc', '')}")
    return "\n".join(lines).lstrip("\n")


def _type_name(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(map(repr, args))
    if origin in (typing.Union, types.UnionType):
        return " | ".join("unset" if a is type(None) else _type_name(a) for a in args)
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    return getattr(tp, "__name__", str(tp))


def blame(message: str, path, overrides: list[str]) -> str:
    """The --set flag that set the failing key, else the file (with the flags of the same section)."""
    keys = [t.split("=", 1)[0].strip() for t in overrides]
    exact = [t for t, k in zip(overrides, keys) if message.startswith(k + " ")]
    if exact:
        return f"--set {exact[-1]}"
    section = message.split(".", 1)[0]
    near = [t for t, k in zip(overrides, keys) if k.split(".", 1)[0] == section]
    where = str(path) if path is not None else "defaults"
    return where + "".join(f" with --set {t}" for t in near)
