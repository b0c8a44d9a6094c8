"""vLLM engine arguments as `vllm serve` options: the one translation the exporter and the trial's servers share.

Python names become the long CLI names (`max_num_seqs` -> `max-num-seqs`); a false boolean becomes
`no-KEY: true` (vLLM's config loader skips `KEY: false`, and its flags are BooleanOptionalAction);
a dict becomes a JSON string, as vLLM's CLI expects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def cli_name(name: str) -> str:
    return name.replace("_", "-")


def serve_options(engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """`vllm serve --config` keys for `engine_args` (None values left out)."""
    options: dict[str, Any] = {}
    for name, value in engine_args.items():
        if isinstance(value, bool):
            options[cli_name(name) if value else f"no-{cli_name(name)}"] = True
        elif isinstance(value, dict):
            options[cli_name(name)] = json.dumps(value)
        elif value is not None:
            options[cli_name(name)] = value
    return options


def serve_argv(engine_args: Mapping[str, Any]) -> list[str]:
    """The same options as command-line arguments (`--max-num-seqs 16 --no-enable-prefix-caching ...`)."""
    argv: list[str] = []
    for key, value in serve_options(engine_args).items():
        if value is True:
            argv.append(f"--{key}")
        elif isinstance(value, list):
            argv += [f"--{key}", *(str(v) for v in value)]
        else:
            argv += [f"--{key}", str(value)]
    return argv
