"""Hugging Face Llama-family checkpoints in and out (`python -m jaxlm.hf import|export`, docs/hf.md).

`config` maps config.json to `model.*` keys and back, `weights` the tensors (names, the rotary layout, writing
safetensors files), `files` reads a checkpoint directory (config.json, the shard index, safetensors headers and
tensors, each malformed file named), `tokenizer` writes jaxlm's own BPE as a tokenizer.json, `hub` finds a
checkpoint (a local directory, or a download from the Hub), `importer` imports one as a run, `convert` exports a
run. The hf extra (safetensors, tokenizers, huggingface_hub) is imported only where it is used.
"""
