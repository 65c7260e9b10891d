"""A Hugging Face checkpoint of SmolLM2-135M's shape with random weights and GPT-2's tokenizer, nothing downloaded
(docs/hf.md, "Without network: a random-weight checkpoint")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from jaxlm import cli

# SmolLM2-135M's config.json, but for the vocabulary: GPT-2's 50,257 tokens instead of its own 49,152.
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                    max_position_embeddings=2048)


def build(out: Path, layers: int) -> int:
    """Write the checkpoint to `out`; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from jaxlm.data.tokenizer import load_tokenizer
    from jaxlm.hf.tokenizer import to_tokenizer_json

    tok = load_tokenizer("gpt2")
    torch.manual_seed(0)
    config = LlamaConfig(**{**SMOLLM2_135M, "num_hidden_layers": layers}, vocab_size=tok.vocab_size,
                         bos_token_id=None, eos_token_id=tok.eot_id)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    (out / "tokenizer.json").write_text(to_tokenizer_json(tok), encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": tok.eot_id}, indent=2) + "\n")
    return model.num_parameters()


def main(argv: list[str]) -> int:
    ap = cli.ArgumentParser(command="deliverables.hf_random", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the checkpoint directory to write")
    ap.add_argument("--layers", type=int, default=SMOLLM2_135M["num_hidden_layers"], help="fewer for a smoke test")
    args = ap.parse_args(argv)
    n = build(Path(args.out), args.layers)
    print(f"{args.out}: LlamaForCausalLM of SmolLM2-135M's shape ({args.layers} layers), random weights, "
          f"{n:,} parameters, GPT-2's tokenizer")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
