"""qwen3090: a reproducible, loud deployment of Qwen3.8-27B on one RTX 3090 with vLLM 0.28.0."""

__version__ = "0.1.0"
