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
over the whole context, so it never turns away a candidate vLLM would start. Anything else (sliding
windows, MLA, hybrid or unknown architectures, a Hub id not on disk) is left to vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Decoder-only model types whose KV cache is 2 (K and V) x layers x KV heads x head_dim per token.
FULL_ATTENTION_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# The fewest bytes a KV element can take in each dtype vLLM accepts; "auto" follows the model's dtype,
# which vLLM on CPU may run in bfloat16 even for a float32 model: 2 bytes is the bound.
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "auto": 2}
_KV_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4}  # fp8*: 1
CPU_BLOCK_TOKENS = 128  # vLLM's CPU platform's block size for these models when `block_size` is not set


def tokens_needed(args: Mapping[str, Any]) -> int | None:
    """The KV-cache slots, in tokens, that vLLM on CPU needs before it starts: max_model_len in whole blocks,
    and the null block its block pool holds back (vllm/v1/core/kv_cache_utils.py); None without
    max_model_len."""
    max_len = args.get("max_model_len")
    if max_len is None:
        return None
    block = int(args.get("block_size") or CPU_BLOCK_TOKENS)
    return (-(-int(max_len) // block) + 1) * block


def kv_bytes_per_token(model_dir: str | Path | None, args: Mapping[str, Any]) -> float | None:
    """A lower bound of the KV-cache bytes one token takes in each engine worker, from the model's
    config.json and the engine arguments (dtype, kv_cache_dtype, tensor/pipeline parallel size); None when
    the model is not a local directory, not a full-attention type, or its config says too little."""
    if not model_dir:
        return None
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("model_type") not in FULL_ATTENTION_TYPES:
        return None
    windowed = config.get("sliding_window") is not None and config.get("use_sliding_window", True)
    if windowed or any(kind != "full_attention" for kind in config.get("layer_types") or ()):
        return None
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        tp = max(1, int(args.get("tensor_parallel_size", 1)))
        pp = max(1, int(args.get("pipeline_parallel_size", 1)))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    kv_dtype = str(args.get("kv_cache_dtype", "auto"))
    element = 1 if kv_dtype.startswith("fp8") else _KV_DTYPE_BYTES.get(kv_dtype)
    if element is None:
        element = _DTYPE_BYTES.get(str(args.get("dtype", "auto")))
    if element is None or min(layers, kv_heads, head_dim) <= 0:
        return None
    # Tensor parallelism splits the KV heads (a head is never split), pipeline parallelism the layers.
    return 2 * (layers / pp) * max(1.0, kv_heads / tp) * head_dim * element


def kv_shortfall(model_dir: str | Path | None, args: Mapping[str, Any]) -> str | None:
    """Why vLLM on CPU would refuse to start an engine with these arguments for want of KV cache, or None
    when it would not (or the model is one the check leaves to vLLM). Reads kv_cache_memory_bytes,
    max_model_len and block_size from `args`; without the first two, None."""
    kv_bytes, tokens = args.get("kv_cache_memory_bytes"), tokens_needed(args)
    if kv_bytes is None or tokens is None:
        return None
    per_token = kv_bytes_per_token(model_dir, args)
    if per_token is None or tokens * per_token <= int(kv_bytes):
        return None
    return (
        f"a KV cache of {int(kv_bytes) / (1 << 20):.3g} MiB holds at most {int(int(kv_bytes) // per_token)} "
        f"tokens ({per_token / 1024:.3g} KiB per token by the model's config), fewer than vLLM needs for one "
        f"request of max_model_len {int(args['max_model_len'])} ({tokens} tokens: whole blocks and the one it "
        f"holds back, {tokens * per_token / (1 << 20):.3g} MiB): vLLM refuses to start such an engine, so none "
        "was started"
    )


def min_memory_fraction(model_dir: str | Path | None, args: Mapping[str, Any], budget_bytes: int) -> float | None:
    """The `gpu_memory_utilization` below which a CPU engine (fraction x `budget_bytes` of KV cache) cannot
    hold one request of max_model_len by kv_shortfall's bound; None when the check does not apply."""
    per_token, tokens = kv_bytes_per_token(model_dir, args), tokens_needed(args)
    if per_token is None or tokens is None or budget_bytes <= 0:
        return None
    return tokens * per_token / budget_bytes
