"""Builds kimi_router_ops._C, a shared library on torch's stable ABI (no Python in it, so
one file serves every CPython >= 3.10, and every torch >= 2.10: see MIN_TORCH).

With a CUDA build of torch: the CuTe DSL kernels are compiled ahead of time
(python -m kimi_router_ops.aot, needs nvidia-cutlass-dsl, no GPU) and linked with the CuTe DSL
static runtime and a static cudart into _C. Set KIMI_ROUTER_OPS_AOT_DIR to a directory made
by it elsewhere to skip that step (a GPU machine without nvidia-cutlass-dsl).
With a CPU-only torch (or KIMI_ROUTER_OPS_CPU_ONLY=1): the CPU kernels only.
"""

import glob
import os
import subprocess
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
BUILD = ROOT / "build"

# torch locates the CUDA toolkit when cpp_extension is imported; a `nvcc` wrapper on PATH
# can point it at the wrong place, so prefer the standard install location.
if "CUDA_HOME" not in os.environ and Path("/usr/local/cuda/bin/nvcc").exists():
    os.environ["CUDA_HOME"] = "/usr/local/cuda"
# No .cu sources are compiled, but torch asks for an arch list when no GPU is visible.
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0;10.0")

import logging  # noqa: E402

# "No CUDA runtime is found": expected on a build machine without a GPU (none is needed).
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402


def run_aot(*args: str) -> None:
    """The build layer (kimi_router_ops.aot), from this tree, before _C exists."""
    env = dict(os.environ, KIMI_ROUTER_OPS_BUILD="1")
    subprocess.run([sys.executable, "-m", "kimi_router_ops.aot", *args], cwd=ROOT, env=env, check=True)


def cuda_build_wanted() -> bool:
    if os.environ.get("KIMI_ROUTER_OPS_CPU_ONLY") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def aot_directory() -> Path:
    prebuilt = os.environ.get("KIMI_ROUTER_OPS_AOT_DIR")
    if prebuilt:
        return Path(prebuilt).resolve()
    # The lab rows' kernels too with KIMI_ROUTER_OPS_LAB=1 (kimi_router_ops/aot): a directory
    # of their own, so that switching it never links one build's objects into the other.
    out = BUILD / ("aot_lab" if os.environ.get("KIMI_ROUTER_OPS_LAB") == "1" else "aot")
    package = ROOT / "kimi_router_ops"
    inputs = [*(package / "tables").glob("*.py"), *(package / "aot").glob("*.py"), *(package / "kernels").glob("*.py")]
    table = out / "kimi_kernels.h"
    # pip runs setup.py more than once per install; compile again only when a source changed.
    if not table.exists() or table.stat().st_mtime < max(p.stat().st_mtime for p in inputs):
        run_aot("--out", str(out))
        table.touch()  # written only when changed: mark it up to date
    return out


# The oldest torch whose stable ABI has everything _C uses (string and list arguments,
# torch_call_dispatcher with versioning, the stable ops it calls): 2.10. _C is compiled
# against that version's API whatever torch builds it, and pyproject.toml requires it.
MIN_TORCH = (2, 10)
TARGET_VERSION = f"-DTORCH_TARGET_VERSION=0x{MIN_TORCH[0]:02x}{MIN_TORCH[1]:02x}000000000000"


def extension():
    generated = BUILD / "generated"
    run_aot("--tables", str(generated))
    sources = sorted(glob.glob("csrc/*.cpp", root_dir=ROOT))  # relative to setup.py
    include_dirs = [str(ROOT / "csrc"), str(generated)]
    # -g0: no debug info, _C is a third of the size. -Wno-attributes: GCC's "declared with
    # greater visibility than the type of its field" for structs holding torch's stable
    # Tensor, which the stable headers declare hidden; nothing here is exported but the ops.
    cxx_flags = ["-O2", "-g0", "-Wno-attributes", TARGET_VERSION]
    # Only libraries whose symbols _C uses become dependencies (torch's stable C shims).
    link_flags = ["-Wl,--as-needed"]
    if not cuda_build_wanted():
        return stable_only(cpp_extension.CppExtension(
            "kimi_router_ops._C", sources, include_dirs=include_dirs, py_limited_api=True,
            extra_compile_args={"cxx": cxx_flags}, extra_link_args=link_flags,
        ))
    aot = aot_directory()
    objects = sorted(glob.glob(str(aot / "sm_*" / "*.o")))
    if not objects or not (aot / "kimi_kernels.h").exists():
        raise SystemExit(f"no ahead-of-time kernels in {aot}: run python -m kimi_router_ops.aot --out {aot}")
    cuda = Path(cpp_extension.CUDA_HOME)
    return stable_only(cpp_extension.CppExtension(
        "kimi_router_ops._C",
        sources + sorted(glob.glob("csrc/cuda/*.cpp", root_dir=ROOT)),
        include_dirs=include_dirs + [str(aot), str(cuda / "include")],
        py_limited_api=True,
        # USE_CUDA declares the CUDA part of torch's C shim (the current stream).
        extra_compile_args={"cxx": cxx_flags + ["-DKIMI_WITH_CUDA", "-DUSE_CUDA"]},
        # The exported objects call the CUDA runtime through the CuTe DSL runtime library.
        # cudart is linked statically: _C then loads beside a torch built for any CUDA major
        # version (it needs a driver for CUDA 13 only when a kernel runs); no -lcuda either,
        # cudart reaches the driver itself.
        extra_objects=objects + [str(aot / "libcuda_dialect_runtime_static.a"),
                                 str(cuda / "lib64" / "libcudart_static.a")],
        libraries=["torch_cuda", "dl", "rt", "pthread"],
        extra_link_args=link_flags,
    ))


def stable_only(ext):
    # CppExtension links libc10 and libtorch too; _C needs neither (libc10 would only lend it
    # libstdc++ symbols, binding _C to one torch's build of them).
    ext.libraries = [lib for lib in ext.libraries if lib not in ("c10", "torch")]
    return ext


class BuildExt(cpp_extension.BuildExtension.with_options(use_ninja=True)):
    """Objects under build/temp instead of pip's throw-away folder: ninja then recompiles only
    the sources (and headers) that changed since the last install or wheel."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = str(BUILD / "temp")


setup(
    # The CuTe DSL kernel sources and the build layer that compiles them (kimi_router_ops.aot) are
    # build inputs, compiled into _C: not installed.
    packages=find_packages(include=["kimi_router_ops", "kimi_router_ops.*"],
                           exclude=["kimi_router_ops.kernels", "kimi_router_ops.aot"]),
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildExt},
    # No Python C API in _C: the wheel is tagged for the stable ABI of CPython 3.10 on.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
