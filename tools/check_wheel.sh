#!/usr/bin/env bash
# One wheel for every supported torch: build the wheel of the current tree once (with the
# active environment's torch), then install that same file into a fresh virtual environment
# per torch version below, next to nothing of ours (no nvidia-cutlass-dsl, no compiler
# needed), and run the CPU tests of every op from there; with vLLM's torch pin, vLLM itself
# and the plugin's tests against it (and of the op files only test_op and test_stable_abi);
# with SGLang's (the build's own), SGLang and its plugin's tests, the same way. Run it where
# the package's own build works (after the README's install command); CI does.
#   KIMI_WHEEL_TORCH="2.14.0 2.10.0" tools/check_wheel.sh    # other versions
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
# The build's own (with SGLang), vLLM 0.33's pin (with vLLM), the newest release, the oldest
# supported (setup.py's MIN_TORCH) and the H200 machine's; the 1st, 3rd and 5th run in one
# queue, the others beside them in a second.
read -r -a versions <<<"${KIMI_WHEEL_TORCH:-2.14.1 2.14.0 2.15.0 2.10.0 2.11.0}"
oldest=2.10.0  # also built from source against it
vllm_torch=2.14.0 vllm=0.33.0  # that venv gets vLLM (pyproject's vllm extra) and its tests
sglang_torch=2.14.1 sglang=0.5.23  # and that one SGLang (the sglang extra)
tests=(test_op.py test_router.py test_moe_routing.py test_softmax_routing.py test_rms_norm.py test_attn_res.py
       test_errors.py test_layouts.py test_stable_abi.py)
engine_tests=(test_op.py test_stable_abi.py)

rm -rf dist
python3 -m pip wheel --no-build-isolation --no-deps -w dist . >/tmp/kimi-wheel.log 2>&1 \
  || { tail -40 /tmp/kimi-wheel.log; exit 1; }
wheel=$(ls "$repo"/dist/kimi_router_ops-*.whl)
echo "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"

# The venvs are made by uv: it installs a torch with its gigabytes of CUDA libraries in
# seconds, and it reads no pip configuration (this machine's caps torch below the newest
# release).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT  # a venv with torch is gigabytes: never leave one behind
python3 -m venv "$scratch/uv"
"$scratch/uv/bin/pip" install -q uv
uv=$scratch/uv/bin/uv
export UV_NATIVE_TLS=1
# One leg: a fresh venv with that torch (and vLLM or SGLang where pinned), the tests from it.
leg() {
  local version=$1 start=$SECONDS venv=$scratch/torch-$1 log=$scratch/pytest-$1.log
  export UV_CACHE_DIR=$scratch/uv-cache-$version  # a leg's own: it is removed with the leg
  "$uv" venv -q --python "$(command -v python3)" "$venv"
  # setuptools: torch 2.10's inductor (the compile tests) needs it and does not require it.
  local extra=() venv_tests=("${tests[@]}")
  # Beside an engine (its torch pin), the wheel's load check and the engine's plugin tests:
  # the op files run under the build's own torch already (the README's test command).
  [ "$version" = "$vllm_torch" ] && extra=("vllm==$vllm") && venv_tests=("${engine_tests[@]}" test_vllm_integration.py)
  [ "$version" = "$sglang_torch" ] && extra=("sglang==$sglang") && venv_tests=("${engine_tests[@]}" test_sglang_integration.py)
  "$uv" pip install -q --python "$venv/bin/python" "torch==$version" "${extra[@]}" setuptools pytest \
    hypothesis numpy "$wheel"
  # Installed beside vLLM's dependencies, cuda.bindings was seen with 12.6 files over
  # cuda-bindings 13 (the unpack order decides), which breaks torch.compile: reinstall it.
  [ -z "${extra[*]}" ] || "$uv" pip install -q --python "$venv/bin/python" --reinstall-package cuda-bindings \
    cuda-bindings
  (cd "$venv" && KIMI_WITH_VLLM=${extra[*]} "$venv/bin/python" - <<'PY'
import importlib.util
import os

import torch

import kimi_router_ops

# (vLLM and SGLang depend on nvidia-cutlass-dsl; everywhere else it must be absent.)
if not os.environ["KIMI_WITH_VLLM"]:
    assert importlib.util.find_spec("cutlass") is None, "nvidia-cutlass-dsl must not be needed"
assert "site-packages" in kimi_router_ops.__file__, kimi_router_ops.__file__
print(f"torch {torch.__version__}: {len(kimi_router_ops.compiled_kernels())} CUDA kernels linked",
      end="; ")
PY
  )
  # From the venv's directory, so that the installed package is the one imported.
  (cd "$venv" && "$venv/bin/python" -m pytest -q -rfEs -p no:cacheprovider \
     "${venv_tests[@]/#/$repo/tests/}" >"$log" 2>&1) \
    || { grep -E "^(FAILED|ERROR)" "$log" | head -30; grep -E "^E  " "$log" | head -30
         tail -1 "$log"; exit 1; }
  grep -E "[0-9]+ passed" "$log" | tail -1  # (SGLang prints a warning after pytest's summary)
  grep -q "test_vllm_integration.*SKIPPED\|vLLM is not installed" "$log" \
    && { echo "the vLLM tests skipped in the vLLM venv"; exit 1; }
  grep -q "SKIPPED.*test_sglang_integration\|SGLang is not installed\|not installed with its entry points" \
    "$log" && { echo "SGLang tests skipped in the SGLang venv"; exit 1; }
  if [ "$version" = "$oldest" ] && [ -e build/aot/kimi_kernels.h ]; then
    # Building from source works with the oldest torch too (its headers have less of the
    # stable API): _C from a copy of the sources, with this build's kernel objects.
    local src=$scratch/src
    mkdir "$src" && cp -r csrc kimi_router_ops setup.py pyproject.toml README.md "$src"
    rm -f "$src"/kimi_router_ops/*.so
    "$uv" pip install -q --python "$venv/bin/python" pip ninja wheel
    (cd "$src" && KIMI_ROUTER_OPS_AOT_DIR=$repo/build/aot "$venv/bin/python" -m pip install -q \
       --no-build-isolation --no-deps --force-reinstall . >"$scratch/build.log" 2>&1) \
      || { tail -30 "$scratch/build.log"; exit 1; }
    (cd "$venv" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$repo/tests/test_stable_abi.py" \
       "$repo/tests/test_op.py" 2>&1 | tail -1 | sed "s/^/  built from source with torch $version: /")
    rm -rf "$src"
  fi
  # A venv and its downloads are gigabytes each (vLLM's over 10): removed with the leg.
  rm -rf "$venv" "$UV_CACHE_DIR"
  echo "  (torch $version: $((SECONDS - start)) s)"
}

# Two queues at once (a leg's pytest keeps one core busy, its downloads none), the engines'
# legs first: each queue stops at its first failure; both logs are printed in order.
queues=("" "")
for i in "${!versions[@]}"; do queues[$((i % 2))]+="${versions[$i]} "; done
pids=()
for q in 0 1; do
  ( set -e; for version in ${queues[$q]}; do leg "$version"; done ) >"$scratch/queue-$q.log" 2>&1 &
  pids+=($!)
done
status=0
for q in 0 1; do
  wait "${pids[$q]}" || status=1
  cat "$scratch/queue-$q.log"
done
exit $status
