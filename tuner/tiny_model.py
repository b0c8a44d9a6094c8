"""Builds (once) and caches the embedded default model: a tiny random-weight Llama with a real tokenizer.

Nothing can be downloaded at run time, so the default model is made locally: 4 layers, hidden size 256,
vocabulary 4096, random weights from a fixed seed, and a byte-level BPE tokenizer trained on Python's own
module docstrings. Speeds measured on it are real vLLM speeds for that model on that machine.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError

TINY_MODEL_NAME = "tiny-llama-v1"
VOCAB_SIZE = 4096
MAX_MODEL_LEN = 4096
# Modules whose docstrings make the tokenizer corpus: fixed, so the tokenizer is the same everywhere.
_CORPUS_MODULES = (
    "argparse",
    "asyncio",
    "collections",
    "csv",
    "datetime",
    "email",
    "functools",
    "http.client",
    "json",
    "logging",
    "pathlib",
    "re",
    "statistics",
    "string",
    "subprocess",
    "textwrap",
    "typing",
    "unittest",
    "urllib.parse",
    "zipfile",
)


def engine_defaults(model: str | None, on_cpu: bool) -> dict[str, Any]:
    """vLLM engine args the tiny model runs with unless the config sets them: float32 on CPU.

    Its weights are bfloat16, which vLLM keeps on CPU, and a CPU without native bfloat16 (x86 without
    AVX512-BF16 or AMX) emulates it: on a 2-core AVX2 EPYC, a matmul of the model's shapes took 27x as long
    as in float32, and a token at 16 concurrent requests 2.7x as long (59 against 22 ms, one run each).
    Float32 is native on every CPU, so the demo measures the same engine everywhere. Trials, exports and
    every engine the tool starts use this (trainables.vllm_engine.EngineSpec.args, tuner.export)."""
    if on_cpu and model and Path(model).name == TINY_MODEL_NAME:
        return {"dtype": "float32"}
    return {}


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bfloat16 natively (x86: AVX512-BF16 or AMX-BF16; Arm: BF16). Unknown
    platforms count as native, so that nothing is said about them."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags.update(value.split())
    if not flags:
        return True
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def cache_root() -> Path:
    """Where built models live: `$VLLM_TUNER_CACHE`, else `~/.cache/vllm-tuner`."""
    return Path(os.environ.get("VLLM_TUNER_CACHE", Path.home() / ".cache" / "vllm-tuner"))


def ensure_tiny_model(root: Path | None = None) -> Path:
    """Return the directory of the tiny model, building it first if it is not cached yet.

    Safe to call from several processes at once: one builds, the others wait and reuse it. Raises
    ConfigError (one line) when it cannot be built: a library it needs is missing, or the cache is not
    writable.
    """
    models = (root or cache_root()) / "models"
    target = models / TINY_MODEL_NAME
    if (target / "config.json").exists():
        return target
    what = "model.path: not set, and the default tiny model"
    try:
        _build_once(models, target)
    except ImportError as error:
        missing = error.name or "the missing package"
        raise ConfigError(f"{what} cannot be built: {error} (install {missing}, or set model.path)") from error
    except OSError as error:
        raise ConfigError(
            f"{what} cannot be written: {error.filename or models}: {error.strerror or error} "
            "(set $VLLM_TUNER_CACHE to a writable folder, or set model.path)"
        ) from error
    return target


def _build_once(models: Path, target: Path) -> None:
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f".{TINY_MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            staging = Path(tempfile.mkdtemp(prefix=f".{TINY_MODEL_NAME}-", dir=models))
            try:
                _build(staging)
                staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)


def _corpus() -> list[str]:
    import importlib
    import inspect

    texts: list[str] = []
    for name in _CORPUS_MODULES:
        module = importlib.import_module(name)
        for _, obj in sorted(vars(module).items()):
            doc = inspect.getdoc(obj) if callable(obj) else None
            if doc:
                texts.append(doc)
        if module.__doc__:
            texts.append(module.__doc__)
    return texts


def _build(directory: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    special = ["<unk>", "<s>", "</s>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", model_max_length=MAX_MODEL_LEN
    )
    fast.chat_template = (
        "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(directory)

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]  # transformers stubs
    model.save_pretrained(directory, safe_serialization=True)
