"""Benchmarks on this GPU (docs/benchmarks.md): `python -m kimi_router_ops.bench` (the GEMM),
`.bench.router` (the whole router), `.bench.chain` (producer -> router, as a model runs it),
`.bench.precisions` (fp32 gates and gate biases). Each writes a JSON report and a table."""

from .gemm import SHAPES

__all__ = ["SHAPES"]
