"""A Hugging Face Llama `config.json` to jaxlm's `model.*` keys and back.

jaxlm's model is the Llama recipe (pre-norm RMSNorm, RoPE, SwiGLU, no biases), so a Llama-family
checkpoint maps key by key; what jaxlm cannot compute (biases, mixtures of experts, another
activation or RoPE variant) is refused in one line naming the config key, never imported half-way.
Both spellings of the rotary settings are read: transformers 5's ``rope_parameters`` and the older
``rope_theta`` + ``rope_scaling``; both are written, so older and newer transformers load an export.
"""

from __future__ import annotations

from typing import Any

from jaxlm.core.config import ModelConfig
from jaxlm.core.errors import ConfigError

ARCHITECTURE = "LlamaForCausalLM"
# Keys that mean a mixture of experts in the families close to Llama (Mixtral, Qwen-MoE, DeepSeek).
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def _refuse(where: str, key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{where}: {key} = {value!r}: {why}; jaxlm's model cannot represent it")


def rope_settings(hf: dict) -> dict:
    """The rotary settings in transformers 5's form: rope_theta, rope_type and the type's parameters."""
    params = hf.get("rope_parameters")
    if not params:
        params = {**(hf.get("rope_scaling") or {}), "rope_theta": hf.get("rope_theta", 10000.0)}
    params = dict(params)
    params.setdefault("rope_type", params.pop("type", "default"))
    return params


def check_representable(hf: dict, where: str) -> None:
    """One ConfigError naming the first key of `hf` that jaxlm's model cannot compute."""
    if hf.get("model_type") != "llama":
        raise _refuse(where, "model_type", hf.get("model_type"), 'only Llama-family checkpoints ("llama") import')
    if hf.get("hidden_act", "silu") != "silu":
        raise _refuse(where, "hidden_act", hf["hidden_act"], "the feed-forward is SwiGLU (silu)")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key):
            raise _refuse(where, key, hf[key], "jaxlm's projections have no biases")
    for key in MOE_KEYS:
        if hf.get(key):
            raise _refuse(where, key, hf[key], "a mixture of experts")
    rope = rope_settings(hf)
    if rope["rope_type"] not in ("default", "llama3"):
        raise _refuse(where, "rope_parameters.rope_type", rope["rope_type"], 'RoPE is "default" or "llama3" here')
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise _refuse(where, "partial_rotary_factor", rope["partial_rotary_factor"], "RoPE rotates the whole head")


def model_keys(hf: dict, where: str) -> dict:
    """`model.*` values of the checkpoint described by config.json `hf` (only what differs from jaxlm's
    derived defaults: num_kv_heads when grouped, head_size when not d_model / num_heads)."""
    check_representable(hf, where)
    d, heads = hf["hidden_size"], hf["num_attention_heads"]
    rope = rope_settings(hf)
    keys = dict(vocab_size=hf["vocab_size"], context_length=hf.get("max_position_embeddings", 2048), d_model=d,
                num_layers=hf["num_hidden_layers"], num_heads=heads, d_ff=hf["intermediate_size"],
                rope_theta=float(rope["rope_theta"]), eps=float(hf.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    if hf.get("num_key_value_heads", heads) != heads:
        keys["num_kv_heads"] = hf["num_key_value_heads"]
    if hf.get("head_dim") and (d % heads or hf["head_dim"] != d // heads):
        keys["head_size"] = hf["head_dim"]
    if rope["rope_type"] == "llama3":
        keys["rope_scaling"] = [float(rope["factor"]), float(rope["low_freq_factor"]),
                                float(rope["high_freq_factor"]), float(rope["original_max_position_embeddings"])]
    return keys


def check_exportable(m: ModelConfig) -> None:
    """One ConfigError naming the first model.* key a Llama config.json cannot say."""
    for key, value, ok, why in (("norm", m.norm, m.norm == "pre", "Llama is pre-norm"),
                                ("ffn", m.ffn, m.ffn == "swiglu", "Llama's feed-forward is SwiGLU"),
                                ("rope", m.rope, m.rope, "Llama rotates queries and keys"),
                                ("window", m.window, m.window is None, "Llama attends to the whole context")):
        if not ok:
            raise ConfigError(f"model.{key} = {value!r}: {why}, so the run has no Hugging Face Llama equivalent")


def hf_config(m: ModelConfig, generation: dict, dtype: str) -> dict:
    """config.json of a LlamaForCausalLM computing what `m` computes; `generation`: bos/eos ids."""
    check_exportable(m)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": m.rope_theta}
    if m.rope_scaling:
        factor, low, high, context = m.rope_scaling
        rope = {"rope_type": "llama3", "rope_theta": m.rope_theta, "factor": factor, "low_freq_factor": low,
                "high_freq_factor": high, "original_max_position_embeddings": int(context)}
    legacy = {k: v for k, v in rope.items() if k != "rope_theta"} if m.rope_scaling else None
    return {"architectures": [ARCHITECTURE], "model_type": "llama", "vocab_size": m.vocab_size,
            "max_position_embeddings": m.context_length, "hidden_size": m.d_model, "intermediate_size": m.d_ff,
            "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
            "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim, "hidden_act": "silu",
            "rms_norm_eps": m.eps, "tie_word_embeddings": m.tie_embeddings, "attention_bias": False,
            "mlp_bias": False, "attention_dropout": 0.0, "rope_parameters": rope, "rope_theta": m.rope_theta,
            "rope_scaling": legacy, "bos_token_id": generation.get("bos_token_id"),
            "eos_token_id": generation.get("eos_token_id"), "torch_dtype": dtype, "dtype": dtype}
