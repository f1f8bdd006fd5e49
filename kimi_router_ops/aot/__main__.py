"""python -m kimi_router_ops.aot: see the package's docstring."""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .. import tables
from . import cpp
from .families import FAMILIES, fake_arguments

RUNTIME_LIB = "libcuda_dialect_runtime_static.a"


def write_if_changed(path: Path, text: str) -> None:
    """Leaves an unchanged file alone, so ninja recompiles nothing for it."""
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def export(fam, kernel, out_dir: Path) -> None:
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    compiled = cute.compile(fam.compile(kernel), *fake_arguments(fam, kernel), cuda.CUstream(0),
                            options="--keep-ptx")
    arch_dir = out_dir / kernel.arch
    arch_dir.mkdir(parents=True, exist_ok=True)
    compiled.export_to_c(str(arch_dir), kernel.symbol, kernel.symbol)
    # With --keep-ptx, __ptx__ is the PTX text (or, if the dump was not written, its intended
    # path in CUTE_DSL_DUMP_DIR, a name shared by all kernels: never trust a stale one).
    ptx = compiled.__ptx__
    if not ptx or ".entry" not in ptx:
        raise RuntimeError(f"no PTX for {kernel.symbol} (CUTE_DSL_DUMP_DIR must exist)")
    (arch_dir / f"{kernel.symbol}.ptx").write_text(ptx)


def build_arch(out_dir: Path, arch: str, sm: int) -> None:
    """One architecture's kernels (CuTe DSL reads the target from CUTE_DSL_ARCH)."""
    shutil.rmtree(out_dir / arch, ignore_errors=True)  # no objects of since-removed kernels
    Path(os.environ["CUTE_DSL_DUMP_DIR"]).mkdir(parents=True, exist_ok=True)  # PTX lands here
    jobs = [(fam, fam.kernels(arch, sm)) for fam in FAMILIES]
    counts = ", ".join(f"{len(kernels)} {fam.name}" for fam, kernels in jobs)
    print(f"[aot {arch}] compiling {sum(len(k) for _, k in jobs)} kernels ({counts})", flush=True)
    start = last = time.time()
    total, done = sum(len(k) for _, k in jobs), 0
    for fam, kernels in jobs:
        for kernel in kernels:
            export(fam, kernel, out_dir)
            done += 1
            if time.time() - last >= 15:  # a sign of life at least every ~20 s (pip -v shows it)
                last = time.time()
                print(f"[aot {arch}] {done}/{total} kernels, {last - start:.0f} s", flush=True)
        print(f"[aot {arch}] {len(kernels)} {fam.name} kernels done, {time.time() - start:.0f} s", flush=True)


def runtime_library() -> Path:
    import nvidia_cutlass_dsl

    for root in nvidia_cutlass_dsl.__path__:
        lib = Path(root) / "cu13" / "lib" / RUNTIME_LIB
        if lib.exists():
            return lib
    raise FileNotFoundError(
        f"{RUNTIME_LIB} not found: install the CUDA 13 libraries, pip install 'nvidia-cutlass-dsl[cu13]'"
    )


def build(out_dir: Path) -> None:
    """All architectures, one child process each (in parallel), then kimi_kernels.h."""
    out_dir.mkdir(parents=True, exist_ok=True)
    children = []
    for arch, _ in tables.ARCHS:
        # No compile cache: a cache hit skips writing the PTX that the static check reads.
        env = dict(os.environ, CUTE_DSL_ARCH=arch, CUTE_DSL_DUMP_DIR=str(out_dir / "dump" / arch),
                   CUTE_DSL_NO_CACHE="1", KIMI_ROUTER_OPS_BUILD="1")
        cmd = [sys.executable, "-m", "kimi_router_ops.aot", "--out", str(out_dir), "--arch", arch]
        children.append((arch, subprocess.Popen(cmd, env=env)))
    failed = [arch for arch, child in children if child.wait() != 0]
    if failed:
        raise SystemExit(f"ahead-of-time compilation failed for {', '.join(failed)}")
    write_if_changed(out_dir / "kimi_kernels.h", cpp.kernels_header())
    shutil.copy2(runtime_library(), out_dir / RUNTIME_LIB)
    shutil.rmtree(out_dir / "dump", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kimi_router_ops.aot", description=__doc__)
    parser.add_argument("--tables", type=Path, help="write kimi_tables.h into this directory")
    parser.add_argument("--out", type=Path, help="compile every kernel into this directory")
    parser.add_argument("--arch", help="compile only this architecture (internal)")
    args = parser.parse_args()
    if args.tables:
        args.tables.mkdir(parents=True, exist_ok=True)
        write_if_changed(args.tables / "kimi_tables.h", cpp.tables_header())
    if args.out and args.arch:
        build_arch(args.out.resolve(), args.arch, dict(tables.ARCHS)[args.arch])
    elif args.out:
        build(args.out.resolve())


if __name__ == "__main__":
    main()
