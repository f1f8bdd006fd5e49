"""_C reaches torch only through its stable ABI, and Python not at all: the promise behind one
wheel for every torch >= 2.10 and every CPython >= 3.10 (docs/building.md)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import kimi_router_ops

LIBRARY = Path(kimi_router_ops.__file__).with_name("_C.abi3.so")
pytestmark = pytest.mark.skipif(
    shutil.which("nm") is None or shutil.which("readelf") is None,
    reason="needs binutils (nm, readelf)",
)


def undefined_symbols() -> list[str]:
    out = subprocess.run(["nm", "-D", "-C", "--undefined-only", str(LIBRARY)],
                         capture_output=True, text=True, check=True).stdout
    return [line.split()[-1] if "(" not in line else line.split(maxsplit=1)[1]
            for line in out.splitlines() if line.strip()]


def test_no_libtorch_cxx_symbol():
    symbols = undefined_symbols()
    assert "torch_call_dispatcher" in symbols  # reads the right table: the stable C shim
    cxx = [s for s in symbols if re.search(r"\b(at|c10|torch|caffe2|pybind11)::", s)]
    assert not cxx, f"libtorch C++ ABI symbols in _C: {cxx[:10]}"


def test_no_python_symbol():
    python = [s for s in undefined_symbols() if re.match(r"_?Py", s)]
    assert not python, f"Python C API symbols in _C: {python[:10]}"


def test_needs_only_torch_c_libraries():
    out = subprocess.run(["readelf", "-d", str(LIBRARY)], capture_output=True, text=True,
                         check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))
    torch_libs = {lib for lib in needed if "torch" in lib or "c10" in lib or "python" in lib}
    assert torch_libs <= {"libtorch_cpu.so", "libtorch_cuda.so"}, torch_libs
    assert not any("cudart" in lib for lib in needed), needed  # static: any torch CUDA build
