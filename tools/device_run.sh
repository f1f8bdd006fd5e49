#!/usr/bin/env bash
# On a GPU machine without nvidia-cutlass-dsl: build _C from ahead-of-time objects made
# elsewhere (KIMI_ROUTER_OPS_AOT_DIR, default build/aot; built with KIMI_ROUTER_OPS_LAB=1 for
# the lab rows the benchmarks and tests compare), then run the given steps.
#   tools/device_run.sh [test] [main] [example] [bench] [bench-quick] [bench-decode] [chain]
#                       [router] [router-decode] [example-tf] [sanitize] [sweep] [ksweep]
#                       [precisions] [precisions-candidates] [test-some] [front]
# Logs and results go to $OUT (or ./device-out).
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export KIMI_ROUTER_OPS_AOT_DIR=${KIMI_ROUTER_OPS_AOT_DIR:-$PWD/build/aot}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} PYTHONUNBUFFERED=1
# _C must share torch's libstdc++: a compiler that links libstdc++ statically (seen: a
# custom gcc named by $CXX on a GPU image) gives _C its own iostreams, which crash.
export CXX=${KIMI_CXX:-/usr/bin/c++} CC=${KIMI_CC:-/usr/bin/cc}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$out/gpu.txt"
echo "commit ${KIMI_COMMIT:-unknown}" | tee -a "$out/gpu.txt"  # the tree travels without .git
python3 -m pip install --no-build-isolation --no-deps -e . >/tmp/kimi-build.log 2>&1 \
  || { tail -50 /tmp/kimi-build.log; exit 1; }
status=0
for step in "$@"; do
  case $step in
    test) python3 -m pytest tests -q -rs -p no:cacheprovider >"$out/pytest.log" 2>&1 || status=1
          grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$out/pytest.log" | tail -30 ;;
    test-some) python3 -m pytest ${KIMI_TESTS:-tests} -q -rs -p no:cacheprovider >"$out/pytest.log" 2>&1 || status=1
          grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$out/pytest.log" | tail -30 ;;
    main) python3 -m kimi_router_ops || status=1 ;;
    precisions) python3 -m kimi_router_ops.bench.precisions --out "$out" --sweep 2>&1 | tail -60 || status=1 ;;
    precisions-candidates) python3 -m kimi_router_ops.bench.precisions --out "$out" --candidates 2>&1 | tail -80 || status=1 ;;
    example) { python3 examples/moe_router.py && python3 examples/moe_router.py --model kimi-k2 --tokens 4; } 2>&1 | tee "$out/example.log" || status=1 ;;
    bench) python3 -m kimi_router_ops.bench --out "$out" 2>&1 | tail -80 || status=1 ;;
    bench-quick) python3 -m kimi_router_ops.bench --out "$out" --m 1 2 4 8 16 64 2>&1 | tail -60 || status=1 ;;
    front) python3 -m kimi_router_ops.bench.front --out "$out" 2>&1 | tail -40 || status=1 ;;
    chain) python3 -m kimi_router_ops.bench.chain --out "$out" 2>&1 | tail -20 || status=1 ;;
    router) python3 -m kimi_router_ops.bench.router --out "$out" 2>&1 | tail -20 || status=1 ;;
    router-decode) python3 -m kimi_router_ops.bench.router --out "$out" --m 1 2 4 8 16 2>&1 | tail -40 || status=1 ;;
    example-tf) for model in deepseek-v3 qwen3-moe; do
                  python3 examples/transformers_decode.py --model $model 2>&1 | tee -a "$out/example-tf.log"
                  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
                done ;;
    sweep) python3 -m kimi_router_ops.bench --sweep --out "$out" --m 16 17 24 32 48 64 96 128 192 256 2>&1 | tail -60 || status=1 ;;
    ksweep)  # the hidden-size range: K x N at the decode M (docs/benchmarks.md)
      nk=(); for k in 2048 2880 3072 4096 5120 6144 7168 8192; do for n in 64 128 256 512 1024; do nk+=("$n,$k"); done; done
      python3 -m kimi_router_ops.bench --out "$out/ksweep" --shapes --nk "${nk[@]}" --m 1 2 4 8 16 2>&1 | tail -5 || status=1 ;;
    bench-decode) python3 -m kimi_router_ops.bench --out "$out" --m 1 2 3 4 6 8 2>&1 | tail -60 || status=1 ;;
    sanitize)  # the four tools at once: each is bound by its own CPU-side instrumentation
      # racecheck instruments every shared-memory access: on the full shape list it runs for
      # over 7 minutes, so it takes one shape per tail kind (K tail, N tail, odd K, real).
      for tool in memcheck racecheck synccheck initcheck; do
        shapes=(); [ $tool = racecheck ] && shapes=(--shapes 17,40 895,1000 3,7169 896,7168)
        [ -n "${KIMI_SANITIZE_ONLY:-}" ] && shapes+=(--only "$KIMI_SANITIZE_ONLY")
        # Each tool's whole log comes back in $out: a failure is read there, not guessed.
        log="$out/sanitize-$tool.log"
        ( compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize.py "${shapes[@]}" >"$log" 2>&1
          echo "compute-sanitizer $tool: exit $? ($(grep -c 'ERROR SUMMARY: 0 errors\|RACECHECK SUMMARY: 0 hazards' "$log") clean summaries): $(grep -E 'SUMMARY|kernel calls' "$log" | tr '\n' ' ')" ) &
      done > "$out/sanitize.txt"
      wait
      cat "$out/sanitize.txt"
      grep -q "exit 0" "$out/sanitize.txt" && ! grep -qv "exit 0" "$out/sanitize.txt" || status=1 ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status
