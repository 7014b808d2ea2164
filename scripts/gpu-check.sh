#!/usr/bin/env bash
# Order: what proves the kernels launch comes first (probe, the CUDA C++ build, verify of
# every op), then the benchmarks of what costs most (linear cross-entropy, attention, the
# GEMMs, the model step), then the rest (CUDA C++ beside Triton, fp8, tune, every op's bench
# suite); each step has its own time budget inside the run's (--total-s), and one out of
# time is recorded in the summary, so a short machine still returns the most important numbers.
# speedlight on a GPU machine, in one go and under 8 minutes on an H100/H200:
#   the machine (nvidia-smi, versions), `speedlight probe` (ceilings), `verify --suite quick` of every op (one process each),
#   `bench --suite model` for every op against PyTorch eager, torch.compile and Liger-Kernel,
#   plots, linear_cross_entropy's time and memory at Llama 3's size against eager and its
#   peers (scripts/lce_check.py), and a summary table printed last. Everything lands in one
#   folder: $OUT when set, else ./gpu-check-<time>. The GEMMs (matmul, gated_matmul) have a section of their own
#   (their model suite alone would take the whole budget): verify --suite quick, then bf16
#   bench at Llama-3-8B's projections at 4096 tokens, forward, against cuBLAS (torch-eager)
#   and torch.compile max-autotune of the eager chain. Targets (not asserted): plain GEMM
#   >= 0.95x cuBLAS, gated MLP >= 1.15x cuBLAS + eager SwiGLU. The model step: `speedlight
#   bench model`, a training step (forward, backward, AdamW) of Llama-3-8B's widths at 4
#   layers, bf16, batch 4 x 4096 tokens, for HF eager (SDPA), HF + torch.compile, Liger,
#   speedlight.patch (all kinds), patch + torch.compile, and speedlight (planned): patch with
#   the kinds the plan step kept (plan/plan.json), in model-step/. Targets (not asserted):
#   speedlight >= 1.3x HF eager tokens/s at <= 0.6x its peak memory, >= 1.1x HF compiled.
#
# The machine needs python3 with torch and triton (no internet; nothing is pip-installed
# from a registry): speedlight runs from this checkout (PYTHONPATH). Peer baselines and
# missing pure-Python packages (liger-kernel, rich, ...) are installed from wheels carried in
# .whl/ when present; fill it on a machine that has the internet, for the GPU's python, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#     liger-kernel==0.8.5 rich markdown-it-py mdurl pygments
# (add scipy and matplotlib with their dependencies for compare and plots). After a run on
# a GPU, commit $OUT/bench.jsonl under benchmarks/results/<sku>/ (the summary names the
# folder) and regenerate the README table:
#   speedlight bench table benchmarks/results --readme README.md
#
# Options (each also an environment variable):
#   --out DIR           OUT               results folder
#   --device D          SPEEDLIGHT_DEVICE auto (default) | cuda | cpu
#   --ops a,b           SPEEDLIGHT_OPS    ops to check (default: all)
#   --verify-suite S    VERIFY_SUITE      default quick
#   --bench-suite S     BENCH_SUITE       default model
#   --verify-s N        VERIFY_TIMEOUT_S  verify is stopped after N s (default 120; rows of
#                                         finished cases are kept)
#   VERIFY_JOBS                           ops verified at once, one process each (default 8)
#   --bench-s N         BENCH_BUDGET_S    bench's time budget (default 60; cases not started
#                                         in time are recorded as skipped)
#   --gemm-s N          GEMM_BENCH_S      the GEMM section's bench budget (default 45; 0 skips
#                                         the section, as does --ops)
#   GEMM_BASELINES                        the GEMM section's baselines (default
#                                         torch-eager,torch-compile; compile's max-autotune
#                                         takes about half a minute of the budget)
#   GEMM_CASES                            regex of the GEMM cases benched (default: Llama-3-8B's
#                                         up and down projections and its gated MLP at 4096
#                                         tokens)
#   --fp8-s N           FP8_BENCH_S       the fp8 section's bench budget (default 25; 0 skips
#                                         it, as does --ops): after the GEMM section, verify
#                                         --suite quick of matmul in fp8, then fp8 matmul at
#                                         Llama-3-8B's qkv, o, up and down projections at 4096
#                                         tokens, forward, per-tensor scales, against
#                                         torch._scaled_mm (torch-scaled-mm), the same GEMM in
#                                         bf16 on cuBLAS (cublas-bf16) and the eager reference,
#                                         in fp8/. Targets (not asserted): >= 1.3x cublas-bf16,
#                                         >= 1.0x torch-scaled-mm
#   FP8_CASES                             regex of the fp8 cases benched (default: those four)
#   GROUPED_BENCH_S     (env)             the grouped GEMM section's bench budget (default 40;
#                                         0 skips it, as does --ops): grouped_matmul in bf16
#                                         at Qwen3-30B-A3B's expert shapes, 32768 routed
#                                         tokens (GROUPED_CASES), fwd and fwd+bwd,
#                                         against torch-grouped-mm and the per-expert loop
#                                         (torch-eager), in grouped/
#   MOE_BENCH_S         (env)             the MoE block section's bench budget (default 60; 0
#                                         skips it, as does --ops unless it names moe_experts):
#                                         moe_experts in bf16 at Mixtral-8x7B's and
#                                         Qwen3-30B-A3B's shapes, uniform and skewed routing,
#                                         fwd and fwd+bwd, against the per-expert loop
#                                         (torch-eager), its chain on torch-grouped-mm,
#                                         torch-compile of the loop and liger (MOE_BASELINES), in
#                                         moe/: 4096 tokens verified first, then 32768 tokens
#                                         with --no-verify (no float64 at that size). Targets
#                                         (not asserted): fwd+bwd >= 1.5x torch-eager, peak
#                                         memory <= torch-eager's. MOE_SUITE, MOE_CASES_4K,
#                                         MOE_CASES_32K: its suite and case regexes (a CPU
#                                         smoke test: MOE_SUITE=quick MOE_CASES_4K=tokens6
#                                         MOE_CASES_32K=tokens8 with --device cpu --ops
#                                         moe_experts)
#   --tune-s N          TUNE_S            the tune section's time limit (default 60; 0 skips it,
#                                         as does --ops): `speedlight tune` of matmul at
#                                         Llama-3-8B's projections at 4096 tokens (TUNE_CASES)
#                                         and of rms_norm at hidden 4096, a few compiles each;
#                                         the table lands in $OUT/tune/tuned/<sku>.json, to
#                                         commit as speedlight/tuned/<sku>.json
#   PLAN_S              (env)             `speedlight plan` of one Llama-3-8B layer (default 90 s;
#                                         0 skips it, as does --ops), in plan/
#   --attention-s N     ATTN_BUDGET_S     the attention section's bench budget (default 45): its
#                                         headline cases (bf16, head dim 128, 8K tokens, causal
#                                         and not, forward and backward) against SDPA's flash,
#                                         efficient and cuDNN backends, FlexAttention and
#                                         flash-attn when installed, in attention/; skipped
#                                         when --ops names other ops only
#   --cuda-s N          CUDA_BENCH_S      the CUDA C++ section's bench budget (default 30; 0
#                                         skips the section): the rms_norm extension built
#                                         first (its build time is a step of its own, in
#                                         cuda-build.json, never in a timing), then rms_norm
#                                         and add_rms_norm at hidden 4096 and 8192 in bf16,
#                                         Triton and CUDA C++ side by side, in cuda/;
#                                         skipped when --ops names neither
#   --model-s N         MODEL_STEP_S      the model step's budget (default 75; variants not
#                                         started in time are recorded as skipped; 0 skips
#                                         the section, as does --ops)
#   --total-s N         TOTAL_S           the whole run's seconds (default 450): a step that
#                                         would start with under 15 s left is recorded as
#                                         skipped (no time), a running one is stopped
#   --verify-args "..." VERIFY_ARGS       extra verify arguments (default "--seeds 1")
#   --bench-args "..."  BENCH_ARGS        extra bench arguments (default "--time-cap 0.3
#                                         --max-gib 32": cases needing more are skipped,
#                                         with the reason, to keep the run in 8 minutes)
#   PYTHON (python3), WHEEL_DIR (.whl), WHEEL_SITE (/tmp/speedlight-site): the interpreter,
#   where the wheels are, where they are installed.
# A CPU smoke test (what tests/bench/test_gpu_check.py runs):
#   scripts/gpu-check.sh --device cpu --ops softmax --verify-suite quick --bench-suite quick \
#     --verify-args "--dtypes fp32 --seeds 1" --bench-args "--dtypes fp32 --limit 2"
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-}"
DEVICE="${SPEEDLIGHT_DEVICE:-auto}"
OPS="${SPEEDLIGHT_OPS:-}"
VERIFY_SUITE="${VERIFY_SUITE:-quick}"
BENCH_SUITE="${BENCH_SUITE:-model}"
VERIFY_TIMEOUT_S="${VERIFY_TIMEOUT_S:-120}"
VERIFY_JOBS="${VERIFY_JOBS:-8}"
BENCH_BUDGET_S="${BENCH_BUDGET_S:-60}"
GEMM_BENCH_S="${GEMM_BENCH_S:-45}"
GEMM_OPS="matmul,gated_matmul"
GEMM_BASELINES="${GEMM_BASELINES:-torch-eager,torch-compile}"
GEMM_CASES="${GEMM_CASES:-^(matmul-m4096-n(14336-k4096|4096-k14336)-bf16-linear-proj(up|down)|gated_matmul-m4096-n14336-k4096-bf16)\$}"
FP8_BENCH_S="${FP8_BENCH_S:-25}"
GROUPED_BENCH_S="${GROUPED_BENCH_S:-40}"
GROUPED_CASES="${GROUPED_CASES:-groups128-bf16-proj(gate_up|down)-tokens32768-routing(uniform|skewed)\$}"
MOE_BENCH_S="${MOE_BENCH_S:-60}"
MOE_SUITE="${MOE_SUITE:-model}"
MOE_CASES_4K="${MOE_CASES_4K:-tokens4096-}"
MOE_CASES_32K="${MOE_CASES_32K:-tokens32768-}"
MOE_BASELINES="${MOE_BASELINES:-torch-eager,torch-grouped-mm,liger,torch-compile}"
FP8_CASES="${FP8_CASES:-^matmul-m4096-n(6144-k4096|4096-k4096|14336-k4096|4096-k14336)-fp8-linear-proj(qkv|o|up|down)\$}"
ATTN_BUDGET_S="${ATTN_BUDGET_S:-45}"
TUNE_S="${TUNE_S:-60}"
TUNE_CASES="${TUNE_CASES:-m4096-n6144-k4096,m4096-n14336-k4096,m4096-n4096-k14336}"
MODEL_STEP_S="${MODEL_STEP_S:-75}"
PLAN_S="${PLAN_S:-90}"
CUDA_BENCH_S="${CUDA_BENCH_S:-30}"
TOTAL_S="${TOTAL_S:-450}"
VERIFY_ARGS="${VERIFY_ARGS:---seeds 1}"
BENCH_ARGS="${BENCH_ARGS:---time-cap 0.3 --max-gib 32}"
PYTHON="${PYTHON:-python3}"
WHEEL_SITE="${WHEEL_SITE:-/tmp/speedlight-site}"
WHEEL_DIR="${WHEEL_DIR:-$REPO/.whl}"

while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --ops) OPS="$2"; shift 2 ;;
    --verify-suite) VERIFY_SUITE="$2"; shift 2 ;;
    --bench-suite) BENCH_SUITE="$2"; shift 2 ;;
    --verify-s) VERIFY_TIMEOUT_S="$2"; shift 2 ;;
    --bench-s) BENCH_BUDGET_S="$2"; shift 2 ;;
    --gemm-s) GEMM_BENCH_S="$2"; shift 2 ;;
    --fp8-s) FP8_BENCH_S="$2"; shift 2 ;;
    --attention-s) ATTN_BUDGET_S="$2"; shift 2 ;;
    --tune-s) TUNE_S="$2"; shift 2 ;;
    --model-s) MODEL_STEP_S="$2"; shift 2 ;;
    --cuda-s) CUDA_BENCH_S="$2"; shift 2 ;;
    --total-s) TOTAL_S="$2"; shift 2 ;;
    --verify-args) VERIFY_ARGS="$2"; shift 2 ;;
    --bench-args) BENCH_ARGS="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

OUT="${OUT:-$PWD/gpu-check-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
OPS_ARG=()
if [ -n "$OPS" ]; then
  OPS_ARG=(--ops "$OPS")
  GEMM_BENCH_S=0  # the ops asked for, through the general steps only
  FP8_BENCH_S=0
  GROUPED_BENCH_S=0
  case ",$OPS," in *,moe_experts,*) ;; *) MOE_BENCH_S=0 ;; esac
  MODEL_STEP_S=0
  PLAN_S=0
  TUNE_S=0
  VERIFY_OPS="$OPS"
else
  VERIFY_OPS="$("$PYTHON" -c "
from speedlight import registry
print(','.join(s.name for s in registry.builtin_specs()))" 2>/dev/null)"
  # every registered op but the GEMMs, which the GEMM section covers
  GENERAL_OPS="$("$PYTHON" -c "
from speedlight import registry
print(','.join(s.name for s in registry.builtin_specs() if s.name not in '$GEMM_OPS,grouped_matmul,moe_experts'.split(',')))" 2>/dev/null)"
  [ -n "$GENERAL_OPS" ] && OPS_ARG=(--ops "$GENERAL_OPS")
fi
STEPS=()
START=$SECONDS

# step NAME LOG COMMAND...: run, log to $OUT/LOG, remember the exit status and seconds
# within the whole run's TOTAL_S: a step that would start with less than 15 s left is
# recorded as skipped (out of time), and a running one is stopped when the run's time is up
step() {
  local name="$1" log="$2"; shift 2
  local t0=$SECONDS rc left=$((TOTAL_S - (SECONDS - START)))
  if [ "$left" -lt 15 ]; then
    echo "== gpu-check: $name: skipped, the run's $TOTAL_S s are spent" | tee -a "$OUT/$log"
    STEPS+=("$name|out-of-time|0|$log")
    return 0
  fi
  echo "== gpu-check: $name: $*" | tee -a "$OUT/$log"
  timeout "$left" "$@" 2>&1 | tee -a "$OUT/$log"
  rc=${PIPESTATUS[0]}
  STEPS+=("$name|$rc|$((SECONDS - t0))|$log")
  return 0
}

# --- the machine --------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
  nvidia-smi -q >> "$OUT/nvidia-smi.txt" 2>&1
else
  echo "nvidia-smi not found on this machine" > "$OUT/nvidia-smi.txt"
fi

shopt -s nullglob
WHEELS=("$WHEEL_DIR"/*.whl)
shopt -u nullglob
if [ ${#WHEELS[@]} -gt 0 ]; then
  step wheels wheels.log "$PYTHON" -m pip install -q --no-index --no-deps --target "$WHEEL_SITE" "${WHEELS[@]}"
  export PYTHONPATH="$PYTHONPATH:$WHEEL_SITE"
else
  echo "no wheels in $WHEEL_DIR/: baselines are used only if already installed" > "$OUT/wheels.log"
  STEPS+=("wheels|none|0|wheels.log")
fi

"$PYTHON" - "$DEVICE" > "$OUT/versions.json" 2> "$OUT/versions.err" <<'EOF'
import importlib.metadata as md, json, sys
import torch
from speedlight import results
device = sys.argv[1] if sys.argv[1] != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
env = results.environment(device)
for pkg in ("liger-kernel", "rich", "scipy", "matplotlib", "numpy", "transformers"):
    try:
        env[pkg] = md.version(pkg)
    except md.PackageNotFoundError:
        env[pkg] = None
print(json.dumps(env, indent=1))
EOF
STEPS+=("versions|$?|0|versions.json")

# --- probe, verify, bench, plots -------------------------------------------------------------------
step probe probe.log "$PYTHON" -m speedlight probe --device "$DEVICE"
# The CUDA C++ extensions, built before verify so that no verify or bench time includes a
# build: the seconds are their own step's (cuda-build.json: build_s, or the reason it
# cannot build here, e.g. no GPU or a CPU build of torch)
CUDA_OPS_ASKED=0
if [ -z "$OPS" ] || [[ ",$OPS," == *",rms_norm,"* ]] || [[ ",$OPS," == *",add_rms_norm,"* ]]; then
  CUDA_OPS_ASKED=1
fi
if [ "$CUDA_BENCH_S" != 0 ] && [ "$CUDA_OPS_ASKED" = 1 ]; then
  step cuda-build cuda-build.log timeout 180 "$PYTHON" - "$DEVICE" "$OUT/cuda-build.json" <<'EOF'
import json, sys
import torch
from speedlight.csrc import loader
device = sys.argv[1] if sys.argv[1] != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
reason = loader.unavailable(device)
if reason:
    doc = {"status": "skip", "reason": reason}
else:
    loader.extension("rms_norm")
    doc = {"status": "ok", "build_s": loader.build_seconds(),
           "directory": str(loader.BUILDS["rms_norm"].directory)}
print(json.dumps(doc))
open(sys.argv[2], "w").write(json.dumps(doc, indent=1) + "\n")
EOF
fi
# verify: one process per op, VERIFY_JOBS at a time. On a GPU the cases check faster than
# one process compiles their kernels (the first H200 run, op after op, reached 4 of 10 ops
# in 120 s); the compiles are CPU work, and rows of concurrent processes append safely to
# one verify.jsonl. Each op's output is in verify-<op>.log.
verify_each_op() {
  local op rc=0 pids=() names=()
  for op in ${VERIFY_OPS//,/ }; do
    while [ "$(jobs -rp | wc -l)" -ge "$VERIFY_JOBS" ]; do wait -n || true; done
    # shellcheck disable=SC2086
    "$PYTHON" -m speedlight verify --device "$DEVICE" --suite "$VERIFY_SUITE" --ops "$op" \
      --out "$OUT" $VERIFY_ARGS > "$OUT/verify-$op.log" 2>&1 &
    pids+=($!); names+=("$op")
  done
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then echo "verify ${names[$i]}: ok"
    else echo "verify ${names[$i]}: exit $?"; rc=1; fi
  done
  return $rc
}
export -f verify_each_op
export PYTHON DEVICE VERIFY_SUITE VERIFY_OPS VERIFY_JOBS OUT VERIFY_ARGS
step verify verify.log timeout "$VERIFY_TIMEOUT_S" bash -c verify_each_op
# linear_cross_entropy at Llama 3's size (16K tokens, hidden 4096, vocab 128256, bf16):
# fwd+bwd time and peak memory beyond inputs and gradients, against every baseline present
case ",$OPS," in
  ,, | *,linear_cross_entropy,*)
    step lce lce.log "$PYTHON" "$REPO/scripts/lce_check.py" --out "$OUT/lce.json" ;;
esac
# the attention targets of issue 14, as ratios measured in this run: forward bf16 head dim 128
# at 8K tokens >= 1.3x SDPA flash, >= cuDNN, >= 0.9x FlashAttention-3; backward >= 1.2x SDPA
# flash (benchmark targets, read from the table, not asserted)
if [ -z "$OPS" ] || [[ ",$OPS," == *",attention,"* ]]; then
  # shellcheck disable=SC2086
  step attention attention.log timeout "$((ATTN_BUDGET_S + 120))" "$PYTHON" -m speedlight bench \
    --device "$DEVICE" --ops attention --suite model --cases 'seq_q8192-seq_k8192-dim128-bf16' \
    --baselines sdpa-flash,sdpa-efficient,sdpa-cudnn,flex-attention,flash-attn \
    --out "$OUT/attention" --budget-s "$ATTN_BUDGET_S" $BENCH_ARGS
fi
# --- the GEMM section ---------------------------------------------------------------------
if [ "$GEMM_BENCH_S" != 0 ]; then
  # (the GEMMs were verified with every op above)
  step gemm-bench gemm.log timeout "$((GEMM_BENCH_S + 90))" "$PYTHON" -m speedlight bench \
    --device "$DEVICE" --suite model --ops "$GEMM_OPS" --cases "$GEMM_CASES" --modes fwd \
    --baselines "$GEMM_BASELINES" --out "$OUT" --budget-s "$GEMM_BENCH_S" \
    --time-cap 0.3 --max-gib 32
else
  echo "GEMM section skipped (--ops given or GEMM_BENCH_S=0)" > "$OUT/gemm.log"
  STEPS+=("gemm|none|0|gemm.log")
fi
# --- the grouped GEMM of mixture-of-experts layers (issue 30) ---------------------------------
# bf16 at 32768 routed tokens, Qwen3-30B-A3B's expert projections (128 experts; Mixtral's
# 8 x 28672 x 4096 weights take seconds to draw per case), uniform and skewed routing,
# forward and forward+backward, against torch._grouped_mm and the per-expert
# loop, in grouped/. Target (not asserted): >= 1.0x torch-grouped-mm.
if [ "$GROUPED_BENCH_S" != 0 ]; then
  step grouped-bench grouped.log timeout "$((GROUPED_BENCH_S + 90))" "$PYTHON" -m speedlight \
    bench --device "$DEVICE" --suite model --ops grouped_matmul --dtypes bf16 --modes fwd,fwd+bwd \
    --cases "$GROUPED_CASES" --baselines torch-eager,torch-grouped-mm --out "$OUT/grouped" \
    --budget-s "$GROUPED_BENCH_S" --time-cap 0.3 --max-gib 48
else
  echo "grouped GEMM section skipped (--ops given or GROUPED_BENCH_S=0)" > "$OUT/grouped.log"
  STEPS+=("grouped|none|0|grouped.log")
fi
# --- the MoE block whole (issue 31): moe_experts at Mixtral-8x7B and Qwen3-30B-A3B ----------
# bf16, fwd and fwd+bwd, TFLOP/s and peak memory per row, in moe/. 4096 tokens are verified
# (float64 reference) before timing; 32768 tokens are timed with --no-verify, so that no
# float64 loop at that size spends the budget (their speedups are withheld as unverified).
if [ "$MOE_BENCH_S" != 0 ]; then
  step moe-bench moe.log timeout "$((MOE_BENCH_S + 120))" "$PYTHON" -m speedlight bench \
    --device "$DEVICE" --suite "$MOE_SUITE" --ops moe_experts --dtypes bf16 \
    --modes fwd,fwd+bwd --cases "$MOE_CASES_4K" --baselines "$MOE_BASELINES" \
    --out "$OUT/moe" --budget-s "$((MOE_BENCH_S * 2 / 3))" --time-cap 0.3 --max-gib 64
  step moe-bench-32k moe.log timeout "$((MOE_BENCH_S / 3 + 90))" "$PYTHON" -m speedlight \
    bench --device "$DEVICE" --suite "$MOE_SUITE" --ops moe_experts --dtypes bf16 \
    --modes fwd,fwd+bwd --cases "$MOE_CASES_32K" --baselines torch-eager,torch-grouped-mm \
    --no-verify --out "$OUT/moe" --budget-s "$((MOE_BENCH_S / 3))" --time-cap 0.3 --max-gib 96
else
  echo "MoE block section skipped (--ops without moe_experts, or MOE_BENCH_S=0)" > "$OUT/moe.log"
  STEPS+=("moe|none|0|moe.log")
fi
# --- speedlight plan (issue 33): each kind of patch timed on one Llama-3-8B layer (bf16,
# 4 x 4096 tokens) against what it replaces, kept only when faster with confidence; the
# plan in plan/plan.json (a cache of its own in plan/cache). Target: under a minute. ------------
if [ "$PLAN_S" != 0 ]; then
  step plan plan.log timeout "$PLAN_S" env SPEEDLIGHT_CACHE="$OUT/plan/cache" "$PYTHON" -m \
    speedlight plan llama-3-8b --device "$DEVICE" --layers 1 --batch 4 --seq 4096 --dtype bf16 \
    --out "$OUT/plan/plan.json"
else
  echo "plan skipped (--ops given or PLAN_S=0)" > "$OUT/plan.log"
  STEPS+=("plan|none|0|plan.log")
fi
# --- the model step --------------------------------------------------------------------------
# Llama-3-8B widths, 4 layers, bf16, 4 x 4096 tokens (bench model's GPU defaults, spelled out);
# "speedlight (planned)" (run last, so the budget cuts it first) applies the plan above, and
# is left out when there is none rather than measuring one again
PLANNED_ARGS=(--variants hf,speedlight,hf-compile,speedlight-compile,liger)
if [ -f "$OUT/plan/plan.json" ]; then
  PLANNED_ARGS=(--plan "$OUT/plan/plan.json")
fi
if [ "$MODEL_STEP_S" != 0 ]; then
  step model-step model-step.log timeout "$((MODEL_STEP_S + 120))" "$PYTHON" -m speedlight bench \
    model --device "$DEVICE" --model llama-3-8b --layers 4 --batch 4 --seq 4096 --dtype bf16 \
    --out "$OUT/model-step" --budget-s "$MODEL_STEP_S" "${PLANNED_ARGS[@]}"
else
  echo "model step skipped (--ops given or MODEL_STEP_S=0)" > "$OUT/model-step.log"
  STEPS+=("model-step|none|0|model-step.log")
fi
# --- the patched model under CUDA graphs (issue 28): torch.compile(mode="reduce-overhead",
# fullgraph=True) of a 4-layer Llama with a padded batch, its loss against eager -----------
if [ "$MODEL_STEP_S" != 0 ]; then
  step compile compile.log timeout 240 "$PYTHON" "$REPO/scripts/compile_check.py" \
    --out "$OUT/compile.json"
else
  echo "compile check skipped (--ops given or MODEL_STEP_S=0)" > "$OUT/compile.log"
  STEPS+=("compile|none|0|compile.log")
fi
# --- CUDA C++ beside Triton -------------------------------------------------------------------
# rms_norm and add_rms_norm at Llama's widths (4096, 8192) in bf16: each implementation's
# GB/s and % of the measured copy bandwidth, and CUDA's speedup over Triton (the
# "x speedlight" column). Target (not asserted): CUDA forward >= 0.92x copy bandwidth and
# no slower than Triton.
if [ "$CUDA_BENCH_S" != 0 ] && [ "$CUDA_OPS_ASKED" = 1 ]; then
  # shellcheck disable=SC2086
  step cuda-bench cuda.log timeout "$((CUDA_BENCH_S + 120))" "$PYTHON" -m speedlight bench \
    --device "$DEVICE" --ops rms_norm,add_rms_norm --suite model --cases 'hidden(4096|8192)-bf16$' \
    --baselines torch-eager --out "$OUT/cuda" --budget-s "$CUDA_BENCH_S" $BENCH_ARGS --dtypes bf16
else
  echo "CUDA C++ section skipped (CUDA_BENCH_S=0, or --ops names neither rms_norm nor add_rms_norm)" \
    > "$OUT/cuda.log"
  STEPS+=("cuda|none|0|cuda.log")
fi
# --- the fp8 section: fp8 matmul against _scaled_mm and bf16 cuBLAS (issue 19) ---------------
if [ "$FP8_BENCH_S" != 0 ]; then
  step fp8-verify fp8.log timeout 30 "$PYTHON" -m speedlight verify --device "$DEVICE" \
    --suite quick --ops matmul --dtypes fp8 --seeds 1 --out "$OUT/fp8"
  step fp8-bench fp8.log timeout "$((FP8_BENCH_S + 90))" "$PYTHON" -m speedlight bench \
    --device "$DEVICE" --suite model --ops matmul --dtypes fp8 --cases "$FP8_CASES" \
    --modes fwd --baselines torch-eager,torch-scaled-mm,cublas-bf16 --out "$OUT/fp8" \
    --budget-s "$FP8_BENCH_S" --time-cap 0.3 --max-gib 32
else
  echo "fp8 section skipped (--ops given or FP8_BENCH_S=0)" > "$OUT/fp8.log"
  STEPS+=("fp8|none|0|fp8.log")
fi
# --- tune: a handful of shapes, their winners into a table to commit --------------------------
if [ "$TUNE_S" != 0 ]; then
  step tune-matmul tune.log timeout "$TUNE_S" "$PYTHON" -m speedlight tune matmul --device "$DEVICE" \
    --suite model --cases "$TUNE_CASES" --max-compiles 18 --no-install --out "$OUT/tune"
  step tune-rms_norm tune.log timeout 60 "$PYTHON" -m speedlight tune rms_norm --device "$DEVICE" \
    --suite model --cases rows4096-hidden4096 --max-compiles 16 --no-install --out "$OUT/tune"
else
  echo "tune section skipped (--ops given or TUNE_S=0)" > "$OUT/tune.log"
  STEPS+=("tune|none|0|tune.log")
fi
# --- the rest: every op's suite, after what costs most (attention, linear cross-entropy,
# GEMM, the model step) had its turn ---------------------------------------------------------
# shellcheck disable=SC2086
step bench bench.log timeout "$((BENCH_BUDGET_S + 120))" "$PYTHON" -m speedlight bench --device "$DEVICE" \
  --suite "$BENCH_SUITE" "${OPS_ARG[@]}" --out "$OUT" --budget-s "$BENCH_BUDGET_S" $BENCH_ARGS
if ! "$PYTHON" -c "import matplotlib" 2>/dev/null; then
  echo "matplotlib is not installed: no plots (carry its wheel in .whl/)" > "$OUT/plots.log"
  STEPS+=("plots|none|0|plots.log")
elif [ -f "$OUT/bench.jsonl" ]; then
  step plots plots.log "$PYTHON" -m speedlight bench plot "$OUT/bench.jsonl" --out "$OUT/plots"
fi
if command -v nvidia-smi >/dev/null 2>&1; then  # clocks and throttle reasons after the work
  nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,TEMPERATURE > "$OUT/nvidia-smi-after.txt" 2>&1
fi
SKU="$("$PYTHON" -c "
from speedlight import hardware
s = hardware.current_device_spec()
print(s.key if s else 'unknown-device')" 2>/dev/null || echo unknown-device)"

# --- summary, last ----------------------------------------------------------------------------
{
  echo
  echo "== speedlight gpu-check summary: $OUT ($((SECONDS - START)) s) =="
  printf '%-11s %-8s %8s  %s\n' step status seconds log
  for s in "${STEPS[@]}"; do
    IFS='|' read -r name rc secs log <<< "$s"
    case "$rc" in
      0) status=ok ;; none) status=skipped ;; out-of-time) status="no time" ;; 124) status=timeout ;;
      2) [ "$name" = probe ] && status="no GPU" || status="exit 2" ;;
      *) status="exit $rc" ;;
    esac
    printf '%-11s %-8s %8s  %s\n' "$name" "$status" "$secs" "$log"
  done
  if [ -f "$OUT/verify.jsonl" ]; then
    echo
    echo "verify (every op's suite, float64 reference; runs by status):"
    "$PYTHON" - "$OUT/verify.jsonl" <<'EOF2'
import collections, sys
from speedlight import results
counts = collections.defaultdict(collections.Counter)
for r in results.read_jsonl(sys.argv[1]):
    impl = r.get("impl")
    counts[r["op"] + (f" ({impl})" if impl not in (None, "triton") else "")][r["status"]] += 1
for name, c in sorted(counts.items()):
    print(f"  {name:<28} " + ", ".join(f"{n} {s}" for s, n in sorted(c.items())))
EOF2
  fi
  echo
  "$PYTHON" -m speedlight bench table "$OUT" --include-cpu 2>&1
  if [ -f "$OUT/attention/bench.jsonl" ]; then
    echo
    echo "attention headline (bf16, head dim 128, 8K tokens):"
    "$PYTHON" -m speedlight bench table "$OUT/attention" --include-cpu 2>&1
  fi
  if [ -f "$OUT/moe/bench.jsonl" ]; then
    echo
    echo "MoE block (moe_experts, bf16, Mixtral-8x7B and Qwen3-30B-A3B; 32768 tokens unverified):"
    "$PYTHON" -m speedlight bench table "$OUT/moe" --include-cpu 2>&1
  fi
  if [ -f "$OUT/cuda-build.json" ]; then
    echo
    echo "CUDA C++ extension build (apart from every timing): $(tr -d '\n' < "$OUT/cuda-build.json")"
  fi
  if [ -f "$OUT/cuda/bench.jsonl" ]; then
    echo
    echo "CUDA C++ beside Triton (rms_norm, add_rms_norm; bf16, hidden 4096 and 8192; target:"
    echo "CUDA forward >= 0.92x copy bandwidth, no slower than Triton):"
    "$PYTHON" -m speedlight bench table "$OUT/cuda" --include-cpu 2>&1
  fi
  if [ -f "$OUT/grouped/bench.jsonl" ]; then
    echo
    echo "grouped GEMM (MoE experts, bf16, 32768 routed tokens; target: >= 1.0x torch-grouped-mm):"
    "$PYTHON" -m speedlight bench table "$OUT/grouped" --include-cpu 2>&1
  fi
  if [ -f "$OUT/fp8/bench.jsonl" ]; then
    echo
    echo "fp8 matmul (Llama-3-8B projections, 4096 tokens; targets: >= 1.3x cublas-bf16,"
    echo ">= 1.0x torch-scaled-mm):"
    "$PYTHON" -m speedlight bench table "$OUT/fp8" --include-cpu 2>&1
  fi
  if [ -f "$OUT/model-step/model-step.jsonl" ]; then
    echo
    echo "model step (Llama-3-8B widths, 4 layers, bf16, 4 x 4096 tokens; targets: speedlight"
    echo ">= 1.3x hf tokens/s at <= 0.6x its memory, >= 1.1x hf-compile):"
    "$PYTHON" - "$OUT/model-step/model-step.jsonl" <<'EOF2'
import sys
from speedlight import results
for r in results.read_jsonl(sys.argv[1]):
    if r["status"] != "ok":
        print(f"  {r['variant']:<19} {r['status']}: {r.get('reason')}")
        continue
    x = lambda v: "-" if v is None else f"{v:.2f}x"
    print(f"  {r['variant']:<19} {r['tokens_per_s']:>10.0f} tokens/s  {x(r.get('speedup_vs_hf'))}"
          f"  peak {(r.get('peak_bytes') or 0) / 2 ** 30:.1f} GiB {x(r.get('memory_vs_hf'))}"
          f"  loss agrees: {r.get('loss_agrees')}")
EOF2
  fi
  echo
  if [ "$SKU" != unknown-device ]; then
    echo "commit: mkdir -p benchmarks/results/$SKU && cp $OUT/bench.jsonl benchmarks/results/$SKU/"
    if [ -f "$OUT/tune/tuned/$SKU.json" ]; then
      echo "commit: cp $OUT/tune/tuned/$SKU.json speedlight/tuned/  (the shipped tuned table)"
    fi
  fi
} | tee "$OUT/summary.txt"

FAILED=0
for s in "${STEPS[@]}"; do
  IFS='|' read -r name rc _ _ <<< "$s"
  case "$name:$rc" in
    *:0|*:none|probe:2) ;;
    *) FAILED=1 ;;
  esac
done
exit $FAILED
