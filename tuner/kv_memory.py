"""Whether a KV cache of a given size can hold one request of `max_model_len`, known before an engine starts.

vLLM refuses to start an engine whose KV cache cannot hold one request of the model's max_model_len ("To
serve at least one request with the model's max seq len ..."), after about 30 s of start-up here. On CPU the
tool itself turns a candidate's `gpu_memory_utilization` into `kv_cache_memory_bytes`, so it can tell such a
candidate up front: the trial is recorded infeasible with the reason, without starting anything
(trainables.trial.TrialRunner.start), and the dry run warns when the space reaches below the line.

vLLM 0.32's need on CPU is max_model_len rounded up to whole blocks (128 tokens unless `block_size` is set)
plus the one block its block pool always holds back, at the KV bytes per token: for the tiny model at 2048
tokens, 17 blocks of 1 MiB. The check is one-sided: the bytes per token are a lower bound (the fewest a
dtype can take; vLLM may pad), and it applies only to model types whose every layer keeps full attention
over the whole context, so it never turns away a candidate vLLM would start. Anything it cannot bound from
below is left to vLLM: sliding windows, MLA, hybrid, quantized or unknown architectures, a Hub id not on
disk, a config missing a key whose transformers default differs, `hf_overrides`, other KV dtypes, decode
context parallelism, `num_gpu_blocks_override`, and `VLLM_CPU_KVCACHE_SPACE` (which replaces the size).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Decoder-only model types whose KV cache is 2 (K and V) x layers x KV heads x head_dim per token.
FULL_ATTENTION_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# Keys a config of these types must state (transformers' defaults differ from the llama-like fallbacks
# below: Mistral 8 KV heads and a 4096-token window, Qwen2/3 32 KV heads, Qwen3 head_dim 128).
_REQUIRED_KEYS = {
    "mistral": ("num_key_value_heads", "sliding_window"),
    "qwen2": ("num_key_value_heads",),
    "qwen3": ("num_key_value_heads", "head_dim"),
}
# The fewest bytes a KV element can take in each dtype vLLM accepts; "auto" follows the model's dtype,
# which vLLM on CPU may run in bfloat16 even for a float32 model: 2 bytes is the bound.
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "auto": 2}
_KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4}  # fp8*: 1; other kinds: no check
CPU_BLOCK_TOKENS = 128  # vLLM's CPU platform's block size for these models when `block_size` is not set
# Engine arguments that change the KV cache's size or shape behind the config's back: left to vLLM.
_LEFT_TO_VLLM = ("hf_overrides", "hf_config_path", "num_gpu_blocks_override")
# vLLM on CPU takes the KV cache's size from this variable instead of kv_cache_memory_bytes when it is set.
CPU_KV_SPACE_VAR = "VLLM_CPU_KVCACHE_SPACE"


def _count(value: Any) -> int | None:
    """A whole number from an engine argument, or None for anything else ("auto", "4k", "1G", a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def applies(args: Mapping[str, Any]) -> bool:
    """Whether the check can bound vLLM's need for these engine arguments in this environment at all."""
    if os.environ.get(CPU_KV_SPACE_VAR) or any(args.get(key) is not None for key in _LEFT_TO_VLLM):
        return False
    return (_count(args.get("decode_context_parallel_size", 1)) or 0) == 1


def tokens_needed(args: Mapping[str, Any]) -> int | None:
    """The KV-cache slots, in tokens, that vLLM on CPU needs before it starts: max_model_len in whole blocks,
    and the null block its block pool holds back (vllm/v1/core/kv_cache_utils.py); None without a numeric
    max_model_len."""
    max_len = _count(args.get("max_model_len"))
    block = _count(args.get("block_size") or CPU_BLOCK_TOKENS)
    if not max_len or not block:
        return None
    return (-(-max_len // block) + 1) * block


def kv_bytes_per_token(model_dir: str | Path | None, args: Mapping[str, Any]) -> float | None:
    """A lower bound of the KV-cache bytes one token takes in each engine worker, from the model's
    config.json and the engine arguments (dtype, kv_cache_dtype, tensor/pipeline parallel size); None when
    the model is not a local directory, not a full-attention type, quantized, or its config says too
    little."""
    if not model_dir:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("model_type") not in FULL_ATTENTION_TYPES:
        return None
    # stated: present, and a number where a number is meant (a null window is "no window")
    stated = [
        key in config and (key == "sliding_window" or config[key] is not None)
        for key in _REQUIRED_KEYS.get(config["model_type"], ())
    ]
    if "quantization_config" in config or not all(stated):
        return None
    windowed = config.get("sliding_window") is not None and config.get("use_sliding_window", True)
    if windowed or any(kind != "full_attention" for kind in config.get("layer_types") or ()):
        return None
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    tp, pp = _count(args.get("tensor_parallel_size", 1)), _count(args.get("pipeline_parallel_size", 1))
    kv_dtype = str(args.get("kv_cache_dtype", "auto"))
    if kv_dtype == "auto":
        element = _DTYPE_BYTES.get(str(args.get("dtype", "auto")))
    else:
        element = 1 if kv_dtype.startswith("fp8") else _KV_DTYPE_BYTES.get(kv_dtype)
    if element is None or not tp or not pp or min(layers, kv_heads, head_dim, tp, pp) <= 0:
        return None
    # Tensor parallelism splits the KV heads (a head is never split), pipeline parallelism the layers.
    return 2 * (layers / pp) * max(1.0, kv_heads / tp) * head_dim * element


def kv_shortfall(model_dir: str | Path | None, args: Mapping[str, Any]) -> str | None:
    """Why vLLM on CPU would refuse to start an engine with these arguments for want of KV cache, or None
    when it would not (or the case is one the check leaves to vLLM). Reads kv_cache_memory_bytes,
    max_model_len and block_size from `args`; without the first two (as numbers), None."""
    kv_bytes, tokens = _count(args.get("kv_cache_memory_bytes")), tokens_needed(args)
    if kv_bytes is None or tokens is None or not applies(args):
        return None
    per_token = kv_bytes_per_token(model_dir, args)
    if per_token is None or tokens * per_token <= kv_bytes:
        return None
    return (
        f"a KV cache of {kv_bytes / (1 << 20):.3g} MiB holds at most {int(kv_bytes // per_token)} tokens "
        f"({per_token / 1024:.3g} KiB per token by the model's config), fewer than vLLM needs for one request "
        f"of max_model_len {args['max_model_len']} ({tokens} tokens: whole blocks and the one it holds back, "
        f"{tokens * per_token / (1 << 20):.3g} MiB): vLLM refuses to start such an engine, so none was started"
    )


def min_memory_fraction(model_dir: str | Path | None, args: Mapping[str, Any], budget_bytes: int) -> float | None:
    """The `gpu_memory_utilization` below which a CPU engine (fraction x `budget_bytes` of KV cache) cannot
    hold one request of max_model_len by kv_shortfall's bound; None when the check does not apply."""
    per_token, tokens = kv_bytes_per_token(model_dir, args), tokens_needed(args)
    if per_token is None or tokens is None or budget_bytes <= 0 or not applies(args):
        return None
    return tokens * per_token / budget_bytes
