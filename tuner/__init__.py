"""vllm-tuner: search vLLM deployment configs against recorded traffic with Ray Tune, Optuna and MLflow."""

__version__ = "0.1.0"
