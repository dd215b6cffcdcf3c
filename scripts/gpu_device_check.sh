#!/usr/bin/env bash
# Issue 48 item 5: the GPU device checks from the built wheel, as one prepared script (docs/gpu.md).
#
#   bash scripts/gpu_device_check.sh prepare   # here (pip works): the wheel + the pure-Python wheels a GPU box lacks
#   bash scripts/gpu_device_check.sh run       # there: install them into /tmp/site, then from a folder outside the
#                                              # checkout: `stare-agents gpu-smoke --tier all` and the learner
#                                              # benchmark on Qwen2.5 shapes, packed vs padded, with the memory plan
#
# The project's device tool runs it as: run(command="bash scripts/gpu_device_check.sh run", carry=[".whl"],
# timeout_s=590); a part cut short leaves what it wrote. Everything it measures lands in $OUT (default
# /tmp/gpu-check-out): gpu_smoke.json, one bench-*.json per shape and check.log. The GPU machines this project can use have torch and transformers but no
# vLLM, Ray, Docker or network: the node and cluster tiers are skipped there, each with its reason.
set -uo pipefail
py="${PY:-python3}"  # the interpreter that has torch (python3 on the GPU machines)
here="$(cd "$(dirname "$0")/.." && pwd)"
wheels="$here/.whl"

prepare() {
    grep -qxF "/.whl/" "$(git -C "$here" rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
        || echo "/.whl/" >>"$(git -C "$here" rev-parse --git-common-dir)/info/exclude"
    rm -rf "$wheels" && mkdir -p "$wheels"
    rm -rf "$here/build"  # setuptools keeps old files there (a renamed recipe would ride along)
    "$py" -m pip wheel --no-deps --quiet -w "$wheels" "$here" || exit 1
    # what the package imports on the device tier's paths that the GPU image lacks (gymnasium, math-verify and
    # their own needs); versions as this project's venv has them
    "$py" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$wheels" \
        gymnasium==1.4.0 farama-notifications==0.0.6 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
        antlr4-python3-runtime==4.13.2 || exit 1
    ls -la "$wheels"
}

run() {
    out="${OUT:-/tmp/gpu-check-out}"
    mkdir -p "$out"
    exec > >(tee "$out/check.log") 2>&1
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$wheels"/*.whl || exit 1
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
    work="$(mktemp -d)" && cd "$work" || exit 1  # outside the checkout: only the wheel is importable
    "$py" -c "import stare_agents, stare_agents.train.trainer, torch, transformers; \
print('package', stare_agents.__file__, 'torch', torch.__version__, 'transformers', transformers.__version__)" \
        || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    # 1. the smoke tiers (device: <= 8 min of deadlines; node and cluster: skipped with their reasons here)
    timeout 300 "$py" -m stare_agents.cli gpu-smoke --tier all --out "$out/gpu_smoke.json" >/dev/null
    echo "gpu-smoke exit $?"
    # 2. the learner on Qwen2.5 shapes (random weights): 32 rows x (256 + 480..768), micro-batches of 16384,
    #    rows packed and padded, the plan's estimate beside torch's peak; the STARE/GRPO-ds ratio on 0.5B and 1.5B
    bench=("$py" "$here/benchmarks/bench_learner.py" --device cuda --rows 32 --prompt 256 --response 480:768
        --micro-batch-tokens 16384 --precisions bf16 --rounds 3)
    timeout 100 "${bench[@]}" --shape qwen2.5-0.5b --ratio-rounds 5 --json "$out/bench-0.5b.json"
    timeout 120 "${bench[@]}" --shape qwen2.5-1.5b --ratio-rounds 5 --json "$out/bench-1.5b.json"
    timeout 150 "${bench[@]}" --shape qwen2.5-3b --ratio-rounds 0 --json "$out/bench-3b.json"
    # 1.5B on 8 rows of 16,900 tokens with checkpointing, and 7B on one GPU: the plan refuses it before loading
    timeout 100 "$py" "$here/benchmarks/bench_learner.py" --device cuda --shape qwen2.5-1.5b --rows 8 \
        --prompt 256 --response 16644 --micro-batch-tokens 16384 --precisions bf16 --rounds 2 --ratio-rounds 0 \
        --pack on --gradient-checkpointing --json "$out/bench-1.5b-long.json"
    timeout 60 "${bench[@]}" --shape qwen2.5-7b --ratio-rounds 0 --json "$out/bench-7b.json"
    echo "done"
}

case "${1:-}" in
prepare) prepare ;;
run) run ;;
*)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
