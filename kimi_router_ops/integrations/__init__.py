"""Adapters that route other libraries' models through the ops. Each is imported on first
use, never by `import kimi_router_ops`: `kimi_router_ops.integrations.transformers.patch(model)`
(or `from kimi_router_ops.integrations.transformers import patch`); vLLM loads `.vllm` and
SGLang `.sglang` as plugins."""

import importlib as _importlib

_ADAPTERS = ("transformers", "vllm", "sglang")


def __getattr__(name):
    if name in _ADAPTERS:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
