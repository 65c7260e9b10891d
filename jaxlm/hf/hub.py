"""Where a checkpoint comes from: a local directory in the Hugging Face layout, or a Hub id downloaded with
`huggingface_hub` (its cache, then the network). Without network a download stops in one line naming the id."""

from __future__ import annotations

import re
from pathlib import Path

from jaxlm.core.errors import CheckpointError
from jaxlm.core.extras import require

# What an import reads: the config, the weights (safetensors only) and the tokenizer's files.
PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
            "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve(source: str, revision: str | None = None) -> Path:
    """The local directory holding `source`: itself, or the Hub snapshot of the id `source`."""
    path = Path(source)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{source}: no config.json, so not a Hugging Face checkpoint directory")
        return path
    if path.exists() or not HUB_ID.match(source):
        raise CheckpointError(f"{source}: neither a checkpoint directory (config.json, *.safetensors) nor a Hub id "
                              "such as HuggingFaceTB/SmolLM2-135M")
    hub = require("huggingface_hub")
    try:
        return Path(hub.snapshot_download(source, revision=revision, allow_patterns=PATTERNS))
    except Exception as e:  # offline, unknown repository, gated model: each its own exception type
        first = next((l.strip() for l in str(e).splitlines() if l.strip()), type(e).__name__)[:200]
        raise CheckpointError(f"{source}: not a local directory, and its download from the Hugging Face Hub "
                              f"(config.json, *.safetensors and tokenizer files of https://huggingface.co/{source}) "
                              f"failed ({type(e).__name__}: {first}); it needs the network (and a token for a gated "
                              "model), or download the files elsewhere and pass their directory") from None
