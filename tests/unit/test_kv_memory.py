"""tuner.kv_memory: whether a KV cache can hold one request of max_model_len, before any engine starts."""

from __future__ import annotations

import json

import pytest

from tuner.kv_memory import kv_bytes_per_token, kv_shortfall, min_memory_fraction, tokens_needed

# The tiny default model's shape (tuner.tiny_model): 4 layers, 4 KV heads of 64, no sliding window.
TINY = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_size": 256,
}
MIB = 1 << 20


def _model(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps({**TINY, **config}))
    return tmp_path


def test_bytes_per_token_follow_the_models_shape_and_dtype(tmp_path):
    model = _model(tmp_path)
    assert kv_bytes_per_token(model, {"dtype": "float32"}) == 2 * 4 * 4 * 64 * 4 == 8192
    assert kv_bytes_per_token(model, {"dtype": "bfloat16"}) == 4096
    assert kv_bytes_per_token(model, {}) == 4096, "auto: the fewest bytes vLLM may run it in"
    assert kv_bytes_per_token(model, {"dtype": "float32", "kv_cache_dtype": "fp8_e4m3"}) == 2048
    assert kv_bytes_per_token(model, {"dtype": "float32", "tensor_parallel_size": 2}) == 4096
    assert kv_bytes_per_token(model, {"dtype": "float32", "pipeline_parallel_size": 2}) == 4096


def test_grouped_query_attention_and_a_head_dim_from_the_hidden_size(tmp_path):
    model = _model(tmp_path, num_key_value_heads=1, head_dim=None)
    assert kv_bytes_per_token(model, {"dtype": "float32"}) == 2 * 4 * 1 * 64 * 4
    assert kv_bytes_per_token(model, {"dtype": "float32", "tensor_parallel_size": 4}) == 2 * 4 * 1 * 64 * 4


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "gemma3"},  # not a type whose every layer attends to the whole context
        {"sliding_window": 4096},  # a window: vLLM needs less than the formula says
        {"model_type": "qwen2", "sliding_window": 32768},  # use_sliding_window not stated: left to vLLM
        {"model_type": "mistral"},  # no sliding_window key: transformers' Mistral default is a 4096 window
        {"model_type": "qwen3", "head_dim": None},  # transformers' Qwen3 default head_dim is 128, not 256/4
        {"quantization_config": {"quant_method": "modelopt"}},  # may set the KV dtype
        {"layer_types": ["full_attention", "sliding_attention"] * 2},
        {"num_hidden_layers": None},
    ],
)
def test_models_the_check_cannot_bound_are_left_to_vllm(tmp_path, config):
    model = _model(tmp_path, **config)
    assert kv_bytes_per_token(model, {"dtype": "float32"}) is None
    assert kv_shortfall(model, {"dtype": "float32", "max_model_len": 2048, "kv_cache_memory_bytes": 1}) is None


def test_a_key_whose_transformers_default_differs_must_be_stated(tmp_path):
    config = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    assert kv_bytes_per_token(tmp_path, {"dtype": "float32"}) is None  # Qwen2's default: 32 KV heads
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert kv_bytes_per_token(tmp_path, {"dtype": "float32"}) == 8192  # Llama's default: the attention heads


@pytest.mark.parametrize(
    "extra",
    [
        {"hf_overrides": {"num_hidden_layers": 2}},
        {"hf_config_path": "/elsewhere"},
        {"num_gpu_blocks_override": 64},
        {"decode_context_parallel_size": 2},
        {"kv_cache_dtype": "int8_per_token_head"},
        {"max_model_len": "auto"},
        {"kv_cache_memory_bytes": "1G"},
    ],
)
def test_arguments_that_change_the_need_behind_the_configs_back_are_left_to_vllm(tmp_path, extra):
    args = {"dtype": "float32", "max_model_len": 2048, "kv_cache_memory_bytes": 1 << 20}
    assert kv_shortfall(_model(tmp_path), args) is not None  # 1 MiB: far short, without the argument
    assert kv_shortfall(_model(tmp_path), {**args, **extra}) is None


def test_a_kv_size_from_the_environment_replaces_the_tools(tmp_path, monkeypatch):
    args = {"dtype": "float32", "max_model_len": 2048, "kv_cache_memory_bytes": 1 << 20}
    assert kv_shortfall(_model(tmp_path), args) is not None
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB: vLLM on CPU takes it over the argument
    assert kv_shortfall(_model(tmp_path), args) is None
    assert min_memory_fraction(_model(tmp_path), args, 64 * MIB) is None


def test_a_window_that_is_switched_off_is_full_attention(tmp_path):
    model = _model(tmp_path, model_type="qwen2", sliding_window=32768, use_sliding_window=False)
    assert kv_bytes_per_token(model, {"dtype": "float32"}) == 8192


def test_no_local_config_is_no_check(tmp_path):
    assert kv_bytes_per_token(tmp_path, {}) is None  # no config.json
    assert kv_bytes_per_token("org/some-hub-model", {}) is None
    assert kv_bytes_per_token(None, {}) is None


def test_a_cache_below_one_request_is_refused_with_the_reason_and_one_at_the_line_is_not(tmp_path):
    model = _model(tmp_path)
    args = {"dtype": "float32", "max_model_len": 2048}
    # vLLM 0.32 on CPU: 2048 tokens in blocks of 128, and the null block its pool holds back: 17 x 1 MiB.
    # Its own message for 16 MiB: "the estimated maximum model length is 1920" (15 usable blocks); for 0.2 x
    # 64 MiB: 1408 (11 usable blocks).
    assert tokens_needed(args) == 17 * 128
    reason = kv_shortfall(model, {**args, "kv_cache_memory_bytes": int(0.2 * 64 * MIB)})
    assert reason is not None
    assert "12.8 MiB" in reason and "1638 tokens" in reason and "max_model_len 2048 (2176 tokens" in reason
    assert "17 MiB" in reason and "none was started" in reason
    assert kv_shortfall(model, {**args, "kv_cache_memory_bytes": 17 * MIB}) is None  # exactly one request fits
    assert kv_shortfall(model, {**args, "kv_cache_memory_bytes": 17 * MIB - 1}) is not None
    assert kv_shortfall(model, {**args, "kv_cache_memory_bytes": 16 * MIB}) is not None, "vLLM refused it"
    assert kv_shortfall(model, args) is None, "no explicit KV size: vLLM sizes it"
    assert min_memory_fraction(model, args, 64 * MIB) == 17 / 64
    assert min_memory_fraction(model, {"dtype": "float32"}, 64 * MIB) is None


def test_a_set_block_size_is_the_unit_of_the_need():
    assert tokens_needed({"max_model_len": 2048, "block_size": 16}) == 2048 + 16
    assert tokens_needed({"max_model_len": 2000, "block_size": 16}) == 2000 + 16
    assert tokens_needed({"max_model_len": 2000}) == 2048 + 128
    assert tokens_needed({}) is None
