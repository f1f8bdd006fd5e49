"""Adapters that route other libraries' models through the ops; each is imported on its own
(`import kimi_router_ops.integrations.transformers`; vLLM loads `.vllm` and SGLang `.sglang`
as plugins), never by `import kimi_router_ops`."""
