"""Hugging Face Llama-family checkpoints in and out (`python -m jaxlm.hf import|export`, docs/hf.md).

`config` maps config.json to `model.*` keys and back, `weights` the tensors (names, the rotary layout,
safetensors files), `tokenizer` writes jaxlm's own BPE as a tokenizer.json, `hub` finds a checkpoint
(a local directory, or a download from the Hub), `convert` imports and exports whole runs. The hf extra
(safetensors, tokenizers, huggingface_hub) is imported only where it is used.
"""
