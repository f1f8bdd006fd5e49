#!/usr/bin/env bash
# Re-create $PEERS_DIR/third_party/vllm_dsv4/dsv4_topk.py (git-ignored, never committed): vLLM 0.33.0's
# Triton router for DeepSeek-V4 (sqrt(softplus) + bias, top-6, renormalized, scaled; what its
# fused_topk_bias runs for 256 or 384 experts outside hash-routed layers), verbatim from the vLLM
# wheel and checked against the sha256 in the wheel's RECORD. kimi_router_ops.bench.peers loads it
# beside the ll_bf16 peer of ../shared/peers/vllm_ll (the same wheel).
# Usage: tools/get_vllm_dsv4_topk.sh [vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl]
set -eu
mkdir -p "${PEERS_DIR:=$PWD/build/peers}"
dst=$(cd "$PEERS_DIR" && pwd)/third_party/vllm_dsv4
name=vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
whl=${1:-${VLLM_WHEEL:-/tmp/vllm-whl/$name}}
if [ ! -f "$whl" ]; then
  mkdir -p /tmp/vllm-whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d /tmp/vllm-whl vllm==0.33.0
  whl=/tmp/vllm-whl/$name
fi
file=vllm/model_executor/layers/fused_moe/router/dsv4_topk.py
rm -rf "$dst"; mkdir -p "$dst"
unzip -p "$whl" "$file" > "$dst/dsv4_topk.py"
unzip -p "$whl" vllm-0.33.0.dist-info/licenses/LICENSE > "$dst/LICENSE-vllm"
want=$(unzip -p "$whl" vllm-0.33.0.dist-info/RECORD | grep "^$file," | cut -d, -f2 | sed 's/^sha256=//')
got=$(python3 -c "import base64,hashlib,sys; print(base64.urlsafe_b64encode(hashlib.sha256(open(sys.argv[1],'rb').read()).digest()).rstrip(b'=').decode())" "$dst/dsv4_topk.py")
[ "$want" = "$got" ] || { echo "dsv4_topk.py: sha256 $got, the wheel's RECORD says $want"; exit 1; }
echo "vLLM 0.33.0's dsv4_topk.py in $dst (sha256 checked)"
