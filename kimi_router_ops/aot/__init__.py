"""The ahead-of-time build: every kernel of the tables (kimi_router_ops/tables/) compiled on fake tensors
and exported to C, and the C++ the dispatch includes. No GPU is needed.

    python -m kimi_router_ops.aot --tables build/generated   # kimi_tables.h (every build)
    python -m kimi_router_ops.aot --out build/aot             # the kernels (nvidia-cutlass-dsl)

For each kernel of each family (families.py) --out writes <out>/<arch>/<symbol>.{o,h,ptx}:
the host launch shim with its embedded cubin, its C interface and the PTX (for the static
checks of tests/test_dispatch.py); then <out>/kimi_kernels.h (cpp.py) and the CuTe DSL static
runtime. The lab rows (tables.gemm.LAB_VARIANTS) are compiled only with
KIMI_ROUTER_OPS_LAB=1 (setup.py then builds into build/aot_lab). setup.py runs both with KIMI_ROUTER_OPS_BUILD=1, which lets the package import
before _C exists; a GPU machine without nvidia-cutlass-dsl builds from a copied <out>
(KIMI_ROUTER_OPS_AOT_DIR).
"""

from .families import FAMILIES, LAB_ENV, Family, Kernel, compiled_kernels, gemm_object, lab_build, router_object

__all__ = ["FAMILIES", "LAB_ENV", "Family", "Kernel", "compiled_kernels", "gemm_object", "lab_build", "router_object"]
