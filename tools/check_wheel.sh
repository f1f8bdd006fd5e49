#!/usr/bin/env bash
# One wheel for every supported torch: build the wheel of the current tree once (with the
# active environment's torch), then install that same file into a fresh virtual environment
# per torch version below, next to nothing of ours (no nvidia-cutlass-dsl, no compiler
# needed), and run the CPU tests of every op from there. Run it where the package's own
# build works (after the README's install command); CI does.
#   KIMI_WHEEL_TORCH="2.14.0 2.10.0" tools/check_wheel.sh    # other versions
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# vLLM 0.33's pin, the build's own, the H200 machine's, the oldest supported (setup.py's
# MIN_TORCH) and the newest release.
read -r -a versions <<<"${KIMI_WHEEL_TORCH:-2.14.0 2.14.1 2.11.0 2.10.0 2.15.0}"
tests=(test_op.py test_router.py test_moe_routing.py test_rms_norm.py test_errors.py
       test_layouts.py test_stable_abi.py)

rm -rf dist
python3 -m pip wheel --no-build-isolation --no-deps -w dist . >/tmp/kimi-wheel.log 2>&1 \
  || { tail -40 /tmp/kimi-wheel.log; exit 1; }
wheel=$(ls "$repo"/dist/kimi_router_ops-*.whl)
echo "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"

# torch's CUDA 13 libraries (gigabytes of nvidia packages) are the same files for every cu13
# torch: the venvs link the building environment's copy instead of installing their own. A
# torch built for CUDA 12 (2.10) installs its own. Triton is left out (CPU tests).
nvidia=$(python3 -c 'import pathlib, torch; print(pathlib.Path(torch.__file__).parent.parent / "nvidia")')
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT  # a venv with torch is gigabytes: never leave one behind
for version in "${versions[@]}"; do
  start=$SECONDS
  venv=$scratch/torch-$version
  python3 -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # The machine's pip configuration caps torch below the newest release; lift it here only.
  export PIP_CONSTRAINT=/dev/null
  # --no-compile: byte-compiling torch's thousands of modules at install is most of its time.
  "$venv/bin/pip" install -q --no-compile --no-deps "torch==$version"
  requirements=$("$venv/bin/python" - <<'PY'
import importlib.metadata as metadata
import re

reqs = [r.split(";")[0].strip() for r in metadata.requires("torch") if "extra ==" not in r]
cuda12 = any("cu12" in r for r in reqs)
print(" ".join(r for r in reqs if not r.startswith("triton")
               and (cuda12 or not re.match(r"(nvidia-|cuda-)", r))))
PY
)
  # shellcheck disable=SC2086  # one word per requirement
  "$venv/bin/pip" install -q --no-compile $requirements pytest hypothesis numpy "$wheel"
  [ -e "$site/nvidia" ] || ln -s "$nvidia" "$site/nvidia"
  unset PIP_CONSTRAINT
  (cd "$venv" && "$venv/bin/python" - <<'PY'
import importlib.util

import torch

import kimi_router_ops

assert importlib.util.find_spec("cutlass") is None, "nvidia-cutlass-dsl must not be needed"
assert "site-packages" in kimi_router_ops.__file__, kimi_router_ops.__file__
print(f"torch {torch.__version__}: {len(kimi_router_ops.compiled_kernels())} CUDA kernels linked",
      end="; ")
PY
  )
  # From the venv's directory, so that the installed package is the one imported.
  (cd "$venv" && "$venv/bin/python" -m pytest -q -rfE -p no:cacheprovider \
     "${tests[@]/#/$repo/tests/}" >"$scratch/pytest.log" 2>&1) \
    || { grep -E "^(FAILED|ERROR)|^E  " "$scratch/pytest.log" | head -60; tail -1 "$scratch/pytest.log"; exit 1; }
  tail -1 "$scratch/pytest.log"
  rm -rf "$venv"
  echo "  (torch $version: $((SECONDS - start)) s)"
done
