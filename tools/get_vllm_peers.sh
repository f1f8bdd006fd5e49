#!/usr/bin/env bash
# Copy vLLM 0.33.0's files that kimi_router_ops.bench.peers runs beside our ops into
# $PEERS_DIR/third_party (git-ignored, never committed), verbatim from the vLLM wheel, each checked
# against the sha256 in the wheel's RECORD:
#   vllm_dsv4/dsv4_topk.py     its Triton DeepSeek-V4 router (sqrt(softplus) + bias, top-6, renormalized,
#                              scaled: what its fused_topk_bias runs for 256 or 384 experts)
#   vllm_k3/attn_res.py        its Kimi-K3 AttnRes (the Triton kernel it runs on Hopper)
#   vllm_k3/low_latency_gemm.py  Kimi-K3's decode GEMM table (tools/build_vllm_skinny.py reads the
#                              down-projection's SM90 entry from it, without importing it)
#   vllm_k3/skinny_gemm.py, vllm_k3/_skinny_gemm.py  its CuTe-DSL skinny GEMM (K3's down-projection
#                              on SM90 at M = 1..3), built ahead of time by tools/build_vllm_skinny.py
# The ll_bf16 router GEMM peer is ../shared/peers/vllm_ll (its own script).
# Usage: tools/get_vllm_peers.sh [vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl]
set -eu
mkdir -p "${PEERS_DIR:=$PWD/build/peers}"
tp=$(cd "$PEERS_DIR" && pwd)/third_party
name=vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
whl=${1:-${VLLM_WHEEL:-/tmp/vllm-whl/$name}}
if [ ! -f "$whl" ]; then
  mkdir -p /tmp/vllm-whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d /tmp/vllm-whl vllm==0.33.0
  whl=/tmp/vllm-whl/$name
fi
record=$(unzip -p "$whl" vllm-0.33.0.dist-info/RECORD)
take() {  # take <file in the wheel> <folder under third_party>
  local dst="$tp/$2/$(basename "$1")" want got
  mkdir -p "$tp/$2"
  unzip -p "$whl" "$1" > "$dst"
  unzip -p "$whl" vllm-0.33.0.dist-info/licenses/LICENSE > "$tp/$2/LICENSE-vllm"
  want=$(printf '%s\n' "$record" | grep "^$1," | cut -d, -f2 | sed 's/^sha256=//')
  got=$(python3 -c "import base64,hashlib,sys; print(base64.urlsafe_b64encode(hashlib.sha256(open(sys.argv[1],'rb').read()).digest()).rstrip(b'=').decode())" "$dst")
  [ -n "$want" ] && [ "$want" = "$got" ] || { echo "$1: sha256 $got, the wheel's RECORD says '$want'"; exit 1; }
}
rm -rf "$tp/vllm_dsv4" "$tp/vllm_k3"
take vllm/model_executor/layers/fused_moe/router/dsv4_topk.py vllm_dsv4
take vllm/models/kimi_k3/nvidia/ops/attn_res.py vllm_k3
take vllm/models/kimi_k3/nvidia/low_latency_gemm.py vllm_k3
take vllm/model_executor/kernels/linear/cute_dsl/skinny_gemm.py vllm_k3
take vllm/model_executor/kernels/linear/cute_dsl/_skinny_gemm.py vllm_k3
echo "vLLM 0.33.0's peer files in $tp/vllm_dsv4 and $tp/vllm_k3 (sha256 checked)"
