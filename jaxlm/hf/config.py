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
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _refuse(where: str, key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"{where}: {key} = {value!r}: {why}; jaxlm's model cannot represent it")


def rope_settings(hf: dict, where: str) -> tuple[dict, str]:
    """The rotary settings in transformers 5's form (rope_theta, rope_type and the type's parameters), and the
    key its type was read from as config.json spells it (`rope_parameters.rope_type`, `rope_scaling.type`)."""
    section = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    params = hf.get(section) or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: {section} = {params!r}: expected an object of RoPE settings")
    if section == "rope_scaling":
        params = {**params, "rope_theta": hf.get("rope_theta", 10000.0)}
    spelled = "type" if "type" in params and "rope_type" not in params else "rope_type"
    params = {**params, "rope_type": params.get("rope_type", params.get("type", "default"))}
    params.pop("type", None)
    return params, f"{section}.{spelled}"


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
    rope, key = rope_settings(hf, where)
    if rope["rope_type"] not in ("default", "llama3"):
        raise _refuse(where, key, rope["rope_type"], 'RoPE is "default" or "llama3" here')
    missing = [k for k in LLAMA3_KEYS if rope["rope_type"] == "llama3" and not _number(rope.get(k))]
    if missing:
        raise ConfigError(f"{where}: {key.split('.')[0]}.{missing[0]}: missing or not a number, which Llama 3's "
                          "RoPE scaling needs")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise _refuse(where, "partial_rotary_factor", rope["partial_rotary_factor"], "RoPE rotates the whole head")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _size(hf: dict, key: str, where: str, default=None) -> int:
    """config.json's `key`: a positive integer (`default` when absent, if given)."""
    if key not in hf and default is not None:
        return default
    if key not in hf:
        raise ConfigError(f"{where}: no {key}, which a Llama config.json has; the checkpoint's config is incomplete")
    value = hf[key]
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise ConfigError(f"{where}: {key} = {value!r}: must be a positive integer")
    return value


def model_keys(hf: dict, where: str) -> dict:
    """`model.*` values of the checkpoint described by config.json `hf` (only what differs from jaxlm's
    derived defaults: num_kv_heads when grouped, head_size when not d_model / num_heads)."""
    check_representable(hf, where)
    d, heads = _size(hf, "hidden_size", where), _size(hf, "num_attention_heads", where)
    rope, _ = rope_settings(hf, where)
    for key, value in (("rope_theta", rope["rope_theta"]), ("rms_norm_eps", hf.get("rms_norm_eps", 1e-6))):
        if not (_number(value) and value > 0):
            raise ConfigError(f"{where}: {key} = {value!r}: must be a number > 0")
    keys = dict(vocab_size=_size(hf, "vocab_size", where), d_model=d, num_heads=heads,
                context_length=_size(hf, "max_position_embeddings", where, 2048),
                num_layers=_size(hf, "num_hidden_layers", where), d_ff=_size(hf, "intermediate_size", where),
                rope_theta=float(rope["rope_theta"]), eps=float(hf.get("rms_norm_eps", 1e-6)),
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    if _size(hf, "num_key_value_heads", where, heads) != heads:
        keys["num_kv_heads"] = hf["num_key_value_heads"]
    if hf.get("head_dim") is not None and (d % heads or _size(hf, "head_dim", where) != d // heads):
        keys["head_size"] = hf["head_dim"]
    if rope["rope_type"] == "llama3":
        keys["rope_scaling"] = [float(rope[k]) for k in LLAMA3_KEYS]
    return keys


# The model.* keys config.json fixes, by the config.json key they come from: the tensors' shapes follow them
FIXED = {"vocab_size": "vocab_size", "d_model": "hidden_size", "num_layers": "num_hidden_layers",
         "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads", "d_ff": "intermediate_size",
         "head_size": "head_dim", "tie_embeddings": "tie_word_embeddings"}


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
