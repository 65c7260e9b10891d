"""Keys of older configs and run directories, moved or dropped with a warning so that they still load."""

from __future__ import annotations

import sys

from jaxlm.core.typedconfig import copy_tree

# Old keys, moved to their new place (None: dropped) with a warning, so older configs and run directories load.
_OLD_KEYS: dict[str, str | None] = {"train.eval_batches": None}


def _old_key_note(key: str) -> str:
    new = _OLD_KEYS[key]
    return f"{key} is deprecated; use {new}" if new else f"{key} is ignored (evaluation scores data.eval_tokens targets)"


def migrate(data: dict, where: str) -> dict:
    """The tree with every `_OLD_KEYS` key moved or dropped, a warning line for each."""
    old = [k for k in _OLD_KEYS if isinstance(data.get(k.split(".")[0]), dict) and k.split(".")[1] in data[k.split(".")[0]]]
    if not old:
        return data
    data = copy_tree(data)
    for key in old:
        section, name = key.split(".")
        value, new = data[section].pop(name), _OLD_KEYS[key]
        if new:
            data.setdefault(new.split(".")[0], {}).setdefault(new.split(".")[1], value)
        print(f"warning: {where}: {_old_key_note(key)}", file=sys.stderr)
    return data


def migrate_override(text: str) -> str | None:
    """The override with an old key moved; None for a dropped one."""
    key, _, value = text.partition("=")
    if key.strip() not in _OLD_KEYS:
        return text
    print(f"warning: --set {_old_key_note(key.strip())}", file=sys.stderr)
    return f"{_OLD_KEYS[key.strip()]}={value}" if _OLD_KEYS[key.strip()] else None
