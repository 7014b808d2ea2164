#!/usr/bin/env bash
# speedlight on a GPU machine in one call of at most 8 minutes: verify first, then the
# timings that matter most, each section within its own line of the budget table below,
# everything in one folder ($OUT, else ./gpu-check-<time>), the summary printed last.
#
# The budget table: sections in the order they run, the most important first, and the
# seconds each may take (tests/bench/test_gpu_check.py holds that the lines sum to at most
# 480). A section is given its line and no more: its script gets `--budget-s` (the line less
# START_S for start-up) and is stopped at the line plus GRACE_S, keeping the rows it wrote;
# a section whose line is 0, or whose script this checkout lacks, is recorded as skipped
# with the reason, and so is one the run has no time left for. Every script verifies its
# implementations (float64 reference, at a size it fits) before it times them.
BUDGET_TABLE="
setup            20  the machine, versions, carried wheels, speedlight probe (measured ceilings)
verify           75  every op's quick suite against float64, one process per op (verify-<op>.log)
compile          15  scripts/gpu/compile_equal.py: a compiled patched model's outputs and gradients equal eager's
attention        50  scripts/gpu/attention.py: the headline case, speedlight beside every attention implementation
membound         45  scripts/gpu/membound.py: norms, GLUs, RoPE, softmax, cross-entropy against a same-size copy_
lce              45  scripts/gpu/lce.py: the fused loss's time, memory and float32 loss against its peers
plan-step       140  scripts/gpu/plan_step.py: every candidate the plan knows, then the training step (planned, Liger, HF)
attention-gluon  25  scripts/gpu/attention_gluon.py: the Gluon forward verified, then timed beside the Triton kernel
moe              20  scripts/gpu/moe.py: the MoE expert block at Qwen3-30B-A3B, DeepSeek-V3 and gpt-oss widths
gemm             25  speedlight bench --predict: matmul and gated_matmul at Llama-3-8B's projections against cuBLAS, each time beside its prediction
fp8              20  speedlight bench: fp8 matmul at Llama-3-8B's projections against torch._scaled_mm and bf16 cuBLAS
bench             0  --ops only: speedlight bench of the ops asked for, then its plots
"
#
# Options (each also an environment variable):
#   --out DIR           OUT               results folder
#   --device D          SPEEDLIGHT_DEVICE auto (default) | cuda | cpu
#   --ops a,b           SPEEDLIGHT_OPS    setup, verify and a general bench of these ops only
#                                         (the bench line becomes BENCH_S, the sections 0)
#   --only a,b          ONLY              the sections to run (setup always runs)
#   --verify-suite S    VERIFY_SUITE      default quick
#   --bench-suite S     BENCH_SUITE       default model (--ops only)
#   --verify-args "..." VERIFY_ARGS       extra verify arguments (default "--seeds 1")
#   --bench-args "..."  BENCH_ARGS        extra bench arguments (--ops only; default
#                                         "--time-cap 0.3 --max-gib 32")
#   <NAME>_S                              a section's line in seconds, e.g. ATTENTION_S=90,
#                                         PLAN_STEP_S=0 (0 skips it)
#   BENCH_S (60), VERIFY_JOBS (8: ops verified at once), START_S (8), GRACE_S (10),
#   PYTHON (python3), WHEEL_DIR (.whl), WHEEL_SITE (/tmp/speedlight-site)
#
# The machine needs python3 with torch and triton (no internet; nothing is installed from a
# registry): speedlight runs from this checkout (PYTHONPATH). Peer baselines and missing
# pure-Python packages (liger-kernel, rich, ...) are installed from wheels carried in .whl/
# when present; fill it on a machine that has the internet, for the GPU's python, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#     liger-kernel==0.8.5 rich markdown-it-py mdurl pygments
# After a run, commit $OUT under benchmarks/results/<sku>/<date>-runN (the summary names the
# SKU), regenerate the README's tables (speedlight bench table benchmarks/results --readme
# README.md) and, on any machine, set the model's prediction beside every bench row the run
# measured (python scripts/predict_rows.py: it compiles each row's revision for the SKU, so
# no GPU minute is spent on it; the gemm section predicts its own rows in the run).
# A CPU smoke test (what tests/bench/test_gpu_check.py runs):
#   scripts/gpu-check.sh --device cpu --ops softmax --verify-args "--dtypes fp32 --seeds 1" \
#     --bench-suite quick --bench-args "--dtypes fp32 --limit 2"
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-}"
DEVICE="${SPEEDLIGHT_DEVICE:-auto}"
OPS="${SPEEDLIGHT_OPS:-}"
ONLY="${ONLY:-}"
VERIFY_SUITE="${VERIFY_SUITE:-quick}"
BENCH_SUITE="${BENCH_SUITE:-model}"
VERIFY_ARGS="${VERIFY_ARGS:---seeds 1}"
BENCH_ARGS="${BENCH_ARGS:---time-cap 0.3 --max-gib 32}"
VERIFY_JOBS="${VERIFY_JOBS:-8}"
BENCH_S="${BENCH_S:-60}"
START_S="${START_S:-8}"
GRACE_S="${GRACE_S:-10}"
PYTHON="${PYTHON:-python3}"
WHEEL_SITE="${WHEEL_SITE:-/tmp/speedlight-site}"
WHEEL_DIR="${WHEEL_DIR:-$REPO/.whl}"

while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --ops) OPS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --verify-suite) VERIFY_SUITE="$2"; shift 2 ;;
    --bench-suite) BENCH_SUITE="$2"; shift 2 ;;
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
START=$SECONDS
STEPS=()  # "section|status|seconds|budget|log|reason"

# a section's line: the table's, or <NAME>_S from the environment; with --ops the sections
# are 0 but setup, verify and bench (BENCH_S); with --only, 0 but setup and those named
line_of() {
  local name="$1" var seconds
  var="$(echo "$name" | tr 'a-z-' 'A-Z_')_S"
  seconds="$(echo "$BUDGET_TABLE" | awk -v n="$name" '$1 == n {print $2}')"
  if [ -n "$OPS" ]; then
    case "$name" in setup|verify) ;; bench) seconds="$BENCH_S" ;; *) seconds=0 ;; esac
  fi
  if [ -n "$ONLY" ] && [ "$name" != setup ] && [[ ",$ONLY," != *",$name,"* ]]; then
    seconds=0
  fi
  echo "${!var:-$seconds}"
}

record() { STEPS+=("$1|$2|$3|$4|$5|$6"); }

# run_section NAME LOG CMD...: CMD within the section's line (+GRACE_S), its output in LOG
run_section() {
  local name="$1" log="$2"; shift 2
  run_within "$name" "$(line_of "$name")" "$log" "$@"
}

# the seconds a section's command may spend on its work: its line less START_S for start-up
work_of() { local line="$1"; echo $((line > START_S * 2 ? line - START_S : line)); }

# run_within NAME SECONDS LOG CMD...
run_within() {
  local name="$1" line="$2" log="$3"; shift 3
  local rc t0=$SECONDS
  if [ "$line" = 0 ]; then
    record "$name" skipped 0 0 "$log" "its line is 0 (--ops, --only or ${name}_S)"
    return 0
  fi
  echo "== gpu-check: $name ($line s): $*" | tee -a "$OUT/$log"
  timeout --kill-after=5 "$((line + GRACE_S))" "$@" >> "$OUT/$log" 2>&1
  rc=$?
  tail -n 5 "$OUT/$log"
  case "$rc" in
    0) record "$name" ok "$((SECONDS - t0))" "$line" "$log" "" ;;
    124|137) record "$name" "out-of-time" "$((SECONDS - t0))" "$line" "$log" \
               "stopped at its line ($line s + $GRACE_S); rows written before are kept" ;;
    *) record "$name" "exit-$rc" "$((SECONDS - t0))" "$line" "$log" "see $log" ;;
  esac
  return 0
}

# run_script NAME SCRIPT ARGS...: scripts/gpu/SCRIPT with --out $OUT/NAME --budget-s
run_script() {
  local name="$1" script="$REPO/scripts/gpu/$2" line; shift 2
  line="$(line_of "$name")"
  if [ "$line" != 0 ] && [ ! -f "$script" ]; then
    record "$name" skipped 0 "$line" "$name.log" "this checkout has no ${script#$REPO/}"
    return 0
  fi
  run_within "$name" "$line" "$name.log" "$PYTHON" "$script" --out "$OUT/$name" \
    --budget-s "$(work_of "$line")" --device "$DEVICE_RESOLVED" "$@"
}

# --- setup: the machine, versions, wheels, probe -----------------------------------------
setup() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi && nvidia-smi -q
  else
    echo "nvidia-smi not found on this machine"
  fi > "$OUT/nvidia-smi.txt" 2>&1
  shopt -s nullglob
  local wheels=("$WHEEL_DIR"/*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -gt 0 ]; then
    echo "wheels: ${#wheels[@]} from $WHEEL_DIR into $WHEEL_SITE"
    "$PYTHON" -m pip install -q --no-index --no-deps --target "$WHEEL_SITE" "${wheels[@]}" || return 1
  else
    echo "wheels: none in $WHEEL_DIR/: baselines are used only if already installed"
  fi
  "$PYTHON" - "$DEVICE" "$OUT/device.txt" > "$OUT/versions.json" <<'EOF' || return 1
import importlib.metadata as md, json, sys
import torch
from speedlight import results
device = sys.argv[1] if sys.argv[1] != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
open(sys.argv[2], "w").write(device)  # the device the sections are run on
env = results.environment(device)
for pkg in ("liger-kernel", "rich", "scipy", "matplotlib", "numpy", "transformers", "flash-attn"):
    try:
        env[pkg] = md.version(pkg)
    except md.PackageNotFoundError:
        env[pkg] = None
print(json.dumps(env, indent=1))
EOF
  # the probe's exit 2 means no GPU: the CPU smoke test goes on without ceilings
  "$PYTHON" -m speedlight probe --device "$DEVICE"
  local rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 2 ]
}
export -f setup
export PYTHON DEVICE OUT WHEEL_DIR WHEEL_SITE
if [ -d "$WHEEL_DIR" ]; then export PYTHONPATH="$PYTHONPATH:$WHEEL_SITE"; fi
run_section setup setup.log bash -c setup
DEVICE_RESOLVED="$(cat "$OUT/device.txt" 2>/dev/null || echo "$DEVICE")"

# --- verify: every op (or --ops), one process per op, VERIFY_JOBS at a time ---------------
if [ -n "$OPS" ]; then
  VERIFY_OPS="$OPS"
else
  VERIFY_OPS="$("$PYTHON" -c "
from speedlight import registry
print(','.join(s.name for s in registry.builtin_specs()))" 2>/dev/null)"
fi
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
export DEVICE VERIFY_SUITE VERIFY_OPS VERIFY_JOBS VERIFY_ARGS
run_section verify verify.log bash -c verify_each_op

# --- the sections, each a script under scripts/gpu/ with --out and --budget-s -------------
run_script compile compile_equal.py
# speedlight first, then what it is held against: cuDNN, FlexAttention, SDPA flash
run_script attention attention.py --impls speedlight,sdpa-cudnn,flex-attention,sdpa-flash,sdpa-efficient
run_script membound membound.py
# speedlight first, then what it is held against (torch.compile, Liger), then the rest
run_script lce lce.py --impls speedlight,speedlight-low,torch-compile,liger,torch-fused,torch-eager,speedlight-low-chunks
# the plan over both models, then the training step with what is left of the line (60 s)
run_script plan-step plan_step.py --step-s 60
run_script attention-gluon attention_gluon.py
run_script moe moe.py
# the GEMMs (verified with every op above): Llama-3-8B's up and down projections and its
# gated MLP at 4096 tokens, forward, against cuBLAS (torch-eager)
GEMM_CASES="${GEMM_CASES:-^(matmul-m4096-n(14336-k4096|4096-k14336)-bf16-linear-proj(up|down)|gated_matmul-m4096-n14336-k4096-bf16)\$}"
run_section gemm gemm.log "$PYTHON" -m speedlight bench --device "$DEVICE" --suite model \
  --ops matmul,gated_matmul --cases "$GEMM_CASES" --modes fwd --baselines torch-eager \
  --out "$OUT/gemm" --budget-s "$(work_of "$(line_of gemm)")" --time-cap 0.3 --max-gib 32 --predict
# fp8 matmul at Llama-3-8B's qkv, o, up and down projections at 4096 tokens, forward, against
# torch._scaled_mm (the same fp8 operands) and bf16 cuBLAS (what fp8 replaces)
FP8_CASES="${FP8_CASES:-^matmul-m4096-n(6144-k4096|4096-k4096|14336-k4096|4096-k14336)-fp8-linear-proj(qkv|o|up|down)\$}"
run_section fp8 fp8.log "$PYTHON" -m speedlight bench --device "$DEVICE" --suite model \
  --ops matmul --dtypes fp8 --cases "$FP8_CASES" --modes fwd \
  --baselines torch-eager,torch-scaled-mm,cublas-bf16 --out "$OUT/fp8" \
  --budget-s "$(work_of "$(line_of fp8)")" --time-cap 0.3 --max-gib 32
# --ops: the general bench of the ops asked for, and its plots
if [ -n "$OPS" ]; then
  # shellcheck disable=SC2086
  run_section bench bench.log "$PYTHON" -m speedlight bench --device "$DEVICE" \
    --suite "$BENCH_SUITE" --ops "$OPS" --out "$OUT" --budget-s "$BENCH_S" $BENCH_ARGS
  if ! "$PYTHON" -c "import matplotlib" 2>/dev/null; then
    record plots skipped 0 0 plots.log "matplotlib is not installed (carry its wheel in .whl/)"
  elif [ -f "$OUT/bench.jsonl" ]; then
    run_within plots 60 plots.log "$PYTHON" -m speedlight bench plot "$OUT/bench.jsonl" \
      --out "$OUT/plots"
  fi
fi
if command -v nvidia-smi >/dev/null 2>&1; then  # clocks and throttle reasons after the work
  nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,TEMPERATURE > "$OUT/nvidia-smi-after.txt" 2>&1
fi

# --- summary, last ------------------------------------------------------------------------
printf '%s\n' "${STEPS[@]}" > "$OUT/sections.txt"
{
  echo
  echo "== speedlight gpu-check summary: $OUT ($((SECONDS - START)) s) =="
  printf '%-16s %-12s %7s %6s  %s\n' section status seconds line "log / reason"
  for s in "${STEPS[@]}"; do
    IFS='|' read -r name status secs line log reason <<< "$s"
    printf '%-16s %-12s %7s %6s  %s\n' "$name" "$status" "$secs" "$line" "$log${reason:+: $reason}"
  done
  "$PYTHON" - "$OUT" <<'EOF'
import collections, sys
from pathlib import Path
from speedlight import hardware, results
out = Path(sys.argv[1])
if (out / "verify.jsonl").exists():
    counts = collections.defaultdict(collections.Counter)
    for r in results.read_jsonl(out / "verify.jsonl"):
        impl = r.get("impl")
        counts[r["op"] + (f" ({impl})" if impl not in (None, "triton") else "")][r["status"]] += 1
    print("\nverify (float64 reference; runs by status):")
    for name, c in sorted(counts.items()):
        print(f"  {name:<28} " + ", ".join(f"{n} {s}" for s, n in sorted(c.items())))
spec = hardware.current_device_spec()
if spec is not None:
    print(f"\ncommit: benchmarks/results/{spec.key}/ <- {out} (then speedlight bench table "
          "benchmarks/results --readme README.md, then python scripts/predict_rows.py)")
EOF
  for folder in "$OUT" "$OUT"/*/; do
    if [ -f "$folder/bench.jsonl" ]; then
      echo
      echo "bench rows in ${folder#$OUT}:"
      "$PYTHON" -m speedlight bench table "$folder" --include-cpu 2>&1
    fi
  done
} | tee "$OUT/summary.txt"

FAILED=0
for s in "${STEPS[@]}"; do
  IFS='|' read -r name status _ <<< "$s"
  case "$status" in ok|skipped|out-of-time) ;; *) FAILED=1 ;; esac
done
exit $FAILED
