#!/usr/bin/env bash
# The one-shot device check: everything a GPU machine should show about npydask's device path,
# in stages ordered by value, each under its own timeout, each printing
# "PASS|FAIL|XFAIL name: detail", each writing its output into OUTDIR before the next starts
# (so a run cut short still returns what ran). See ci/README.md.
#
#   ci/gpu_check.sh [OUTDIR] [--only STAGE[,STAGE]] [--dry-run] [--full]
#
# Stages: env, sanity, pytest, probes, bench. OUTDIR (default $OUT, else /tmp/npydask-gpu-check)
# receives at most six files: summary.txt env.txt pytest.log probes.log bench.json bench.log.
# On the GPU machine the wheels of ci/gpu_kit.sh (.whl/) are installed with --no-deps into
# $TMPDIR/site first; nothing outside the project tree is used. --dry-run needs neither wheels
# nor a GPU: every stage's CPU part at tiny size, numpy standing in for CuPy. NPYD_PROBES=NAME[,NAME]
# runs only those probes. A probe whose optional package is missing (torch, which the kit lacks)
# prints "SKIP name: skipped: torch is not installed" and fails nothing.
# Exit status: 0 when no stage FAILed.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root" || exit 2
python="${PYTHON:-python3}"
outdir="" only="" dry=0 full=0
while (($#)); do
  case "$1" in
    --only) only="${2:?--only needs STAGE[,STAGE]}"; shift 2 ;;
    --only=*) only="${1#--only=}"; shift ;;
    --dry-run) dry=1; shift ;;
    --full) full=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [[ -z "$outdir" ]] || { echo "gpu_check: one OUTDIR only" >&2; exit 2; }; outdir="$1"; shift ;;
  esac
done
outdir="${outdir:-${OUT:-/tmp/npydask-gpu-check}}"
stages=(env sanity pytest probes bench)
if [[ -n "$only" ]]; then
  IFS=, read -r -a chosen <<< "$only"
  for s in "${chosen[@]}"; do
    [[ " ${stages[*]} " == *" $s "* ]] || { echo "gpu_check: unknown stage $s; stages: ${stages[*]}" >&2; exit 2; }
  done
else
  chosen=("${stages[@]}")
fi
mkdir -p "$outdir" || exit 2
summary="$outdir/summary.txt"
# Limits in seconds; the default run's sum stays under 5 minutes (install included).
declare -A limit=([env]=25 [sanity]=20 [pytest]=90 [probes]=180 [bench]=180)
((full)) && limit[bench]=300
if ((dry)); then
  work="$(mktemp -d "${TMPDIR:-/tmp}/npydask-gpu-dry.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  mode="dry run (no GPU: numpy stands in for CuPy, tiny sizes)"
else
  work="${NPYDASK_GPU_WORK:-/var/tmp/npydask-gpu-check}"  # on disk, not tmpfs: O_DIRECT and GDS need one
  mkdir -p "$work"
  mode="device run"
fi
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 NPYD_DRY="$dry" NPYD_WORK="$work"

{ echo "npydask gpu_check: $mode, stages ${chosen[*]}, $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname)"; } > "$summary"
results=()
say() {  # say STATUS NAME DETAIL SECONDS: one result line on the console and in the summary
  local line="$1 $2: $3"
  echo "$line"
  echo "$line" >> "$summary"
  results+=("$1|$2|$4|$3")
}

# ---- install the kit (not a stage: every stage needs it)
if ((dry)); then
  export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
else
  site="${TMPDIR:-/tmp}/npydask-gpu-site"
  wheels=(.whl/*.whl)
  if [[ ! -e "${wheels[0]}" ]]; then
    say FAIL install "no wheels in .whl/: run ci/gpu_kit.sh on a machine with the package index first" 0
  elif [[ ! -e "$site/.installed" ]]; then
    t0=$SECONDS
    if timeout 60 "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
         --target "$site" "${wheels[@]}" > "$outdir/env.txt" 2>&1; then
      touch "$site/.installed"
      say PASS install "${#wheels[@]} wheels into $site" $((SECONDS - t0))
    else
      say FAIL install "pip install --no-index --no-deps failed (env.txt)" $((SECONDS - t0))
    fi
  fi
  export PYTHONPATH="$site:$root"
fi

# ---- stages: each writes into its file, then prints its result line
cap() {  # cap FILE: keep a log under 16 MiB (its last 15 MiB, which hold the results)
  if (($(stat -c %s "$1") > 15 * 1024 * 1024)); then
    { echo "[gpu_check: the start of this log was cut to keep it under 16 MiB]"; tail -c $((15 * 1024 * 1024)) "$1"; } > "$1.cut"
    mv "$1.cut" "$1"
  fi
}

run_stage() {  # run_stage NAME FILE: run stage_NAME under its limit, output appended to FILE
  # The stage's own last "PASS|XFAIL|FAIL NAME: detail" line is its result; a timeout or a
  # non-zero exit without one is a FAIL.
  local name="$1" file="$outdir/$2" t0=$SECONDS rc own before
  touch "$file"
  before=$(wc -l < "$file")
  echo "== $name ($(date -u +%H:%M:%S), limit ${limit[$name]} s)" >> "$file"
  timeout -k 10 "${limit[$name]}" bash -c "$(declare -f "stage_$name"); stage_$name" >> "$file" 2>&1
  rc=$?
  cap "$file"
  own="$(tail -n +$((before + 1)) "$file" | grep -E "^(PASS|FAIL|XFAIL) $name[ :(]" | tail -n 1)"
  if ((rc == 124 || rc == 137)); then
    say FAIL "$name" "timed out after ${limit[$name]} s ($2)" $((SECONDS - t0))
  elif ((rc == 0)) && [[ "$own" =~ ^(PASS|XFAIL)\ [a-z_]+(\ \([^\)]*\))?:\ (.*)$ ]]; then
    say "${BASH_REMATCH[1]}" "$name" "${BASH_REMATCH[3]:0:300}${BASH_REMATCH[2]} ($2)" $((SECONDS - t0))
  else
    say FAIL "$name" "exit $rc: ${own:-no result line} ($2)" $((SECONDS - t0))
  fi
}

stage_env() {
  python_=${PYTHON:-python3}
  echo "dry run: $NPYD_DRY   work folder: $NPYD_WORK"
  uname -a; echo "ulimit -n: $(ulimit -n)"; df -T "$NPYD_WORK" 2>&1 | tail -n 1
  if [[ "$NPYD_DRY" == 1 ]]; then
    echo "nvidia-smi -L: not run (dry run)"
  else
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
    echo "nvidia_fs module: $(grep -q "^nvidia_fs " /proc/modules 2>/dev/null && echo loaded || echo "not loaded (kvikio can only run in compat mode)")"
  fi
  timeout 20 "$python_" - <<'PY'
import importlib, os, sys
dry = os.environ["NPYD_DRY"] == "1"
print("python", sys.version.split()[0])
for name in ("numpy", "cupy", "kvikio", "rmm", "dask", "distributed", "dask_cuda", "obstore", "torch", "npydask"):
    try:
        m = importlib.import_module(name)
        print(f"{name} {getattr(m, '__version__', '?')} {os.path.dirname(m.__file__)}")
    except Exception as e:
        print(f"{name}: not importable ({type(e).__name__}: {e})")
problems = []
try:  # before anything imports kvikio.defaults (kvikio's __init__ does not)
    from npydask.gpu import describe

    print("npydask describe():", describe())
except Exception as e:
    print(f"npydask describe(): raised {type(e).__name__}: {e}")
    problems.append(f"describe() raised {type(e).__name__}: {e}")
try:
    import kvikio
    import kvikio.cufile_driver
    import kvikio.defaults
    d = kvikio.defaults
    for key in ("compat_mode", "num_threads", "task_size", "gds_threshold"):
        try:
            print(f"kvikio {key}: {d.get(key)}")
        except Exception as e:
            print(f"kvikio {key}: ? ({e})")
    try:
        print("kvikio is_compat_mode_preferred:", d.is_compat_mode_preferred())
    except Exception as e:
        print("kvikio is_compat_mode_preferred: ?", e)
    try:
        print("kvikio GDS available:", kvikio.cufile_driver.get("is_gds_available"))
    except Exception as e:
        print("kvikio GDS available: ? (", type(e).__name__, e, ")")
except ImportError as e:
    print(f"kvikio: not importable ({e})" + (" (dry run)" if dry else ""))
    if not dry:
        problems.append(f"kvikio does not import: {e}")
work = os.environ["NPYD_WORK"]
p = os.path.join(work, "odirect.probe")
with open(p, "wb") as f:
    f.write(b"\0" * 4096)
try:
    fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    os.close(fd)
    print("O_DIRECT on the work folder: yes")
except OSError as e:
    print(f"O_DIRECT on the work folder: no ({e})")
os.unlink(p)
if not dry:
    try:
        import cupy

        rt = cupy.cuda.runtime
        print("CUDA driver", rt.driverGetVersion(), "runtime", rt.runtimeGetVersion())
    except Exception as e:
        problems.append(f"CuPy: {type(e).__name__}: {e}")
if problems:
    print("FAIL env: " + "; ".join(problems)[:400])
    sys.exit(1)
print("PASS env: versions and modes recorded")
PY
}

stage_sanity() {
  timeout 20 "${PYTHON:-python3}" - <<'PY'
import os
import numpy as np
if os.environ["NPYD_DRY"] == "1":
    xp = np
else:
    import cupy as xp
a = xp.arange(10, dtype=xp.int64)
total = int(a.sum())
t = xp.ascontiguousarray(xp.arange(12).reshape(3, 4).T)
assert total == 45 and int(t[3, 2]) == 11, (total, t)
detail = f"arange(10).sum() = {total}, transposed copy equal"
if xp is not np:
    k = xp.ElementwiseKernel("T x", "T y", "y = x * 2 + 1", "npyd_sanity")  # compiles with NVRTC
    assert int(k(a).sum()) == 100
    detail += ", NVRTC kernel ran"
    import importlib.util
    if importlib.util.find_spec("torch") is None:  # the GPU kit has no torch: its probes skip too
        detail += ", torch.from_dlpack skipped: torch is not installed"
    else:
        import torch
        assert torch.from_dlpack(xp.ones(3)).sum().item() == 3.0
        detail += ", torch.from_dlpack ok"
print(f"PASS sanity{' (dry: numpy)' if xp is np else ''}: {detail}")
PY
}

stage_pytest() {
  py=${PYTHON:-python3}
  args=(-q -p no:cacheprovider -m gpu tests/gpu/test_gpu.py -rfEs)
  if "$py" -c "import pytest_timeout" 2>/dev/null; then args+=(--timeout 60); fi
  ok=1 log="$NPYD_OUT/pytest.log"
  before=$(wc -l < "$log")
  "$py" -m pytest "${args[@]}" || ok=0
  echo "-- again with KVIKIO_COMPAT_MODE=ON"
  KVIKIO_COMPAT_MODE=ON "$py" -m pytest "${args[@]}" || ok=0
  if [[ "$NPYD_DRY" != 1 ]] && tail -n +$((before + 1)) "$log" | grep -qE '[0-9]+ skipped'; then
    echo "FAIL pytest: gpu tests skipped on the device (see the SKIPPED lines)"; return 1
  fi
  if ((ok)); then
    echo "PASS pytest: pytest -m gpu, also with KVIKIO_COMPAT_MODE=ON$([[ $NPYD_DRY == 1 ]] && echo ' (dry: the gpu tests skip without a device)')"
  else
    echo "FAIL pytest: see pytest.log"; return 1
  fi
}

stage_probes() {
  dry=(); [[ "$NPYD_DRY" == 1 ]] && dry=(--dry-run)
  only=(); [[ -n "${NPYD_PROBES:-}" ]] && only=(--only "$NPYD_PROBES")
  "${PYTHON:-python3}" ci/gpu_probes.py --work "$NPYD_WORK/probes" "${dry[@]}" "${only[@]}"
}

stage_bench() {
  if [[ ! -f benchmarks/bench_gpu.py ]]; then
    echo "XFAIL bench: benchmarks/bench_gpu.py not written yet"
    return 0
  fi
  extra=(); [[ "$NPYD_DRY" == 1 ]] && extra=(--dry-run); [[ "$NPYD_FULL" == 1 ]] && extra+=(--full)
  "${PYTHON:-python3}" benchmarks/bench_gpu.py --json "$NPYD_OUT/bench.json" "${extra[@]}"
}

export NPYD_OUT="$outdir" NPYD_FULL="$full" PYTHON="$python"
declare -A file=([env]=env.txt [sanity]=env.txt [pytest]=pytest.log [probes]=probes.log [bench]=bench.log)
for s in "${stages[@]}"; do
  [[ " ${chosen[*]} " == *" $s "* ]] || continue
  probes_from=$(($(cat "$outdir/probes.log" 2>/dev/null | wc -l) + 1))
  run_stage "$s" "${file[$s]}"
  if [[ "$s" == probes ]]; then  # every probe's line goes to the summary too
    tail -n "+$probes_from" "$outdir/probes.log" | grep -E '^(PASS|FAIL|XFAIL|SKIP) ' | grep -v '^[A-Z]* probes:' \
      | sed 's/^/  probe /' >> "$summary"
  fi
  if [[ "$s" == sanity && "${results[-1]}" == FAIL* ]] && ((!dry)); then
    say FAIL stop "CuPy cannot run a kernel: NVRTC or driver trouble, later stages would only repeat it" 0
    break
  fi
done

{
  echo
  printf '%-8s %-8s %6s  %s\n' stage result seconds detail
  for r in "${results[@]}"; do
    IFS='|' read -r st name secs detail <<< "$r"
    printf '%-8s %-8s %6s  %s\n' "$name" "$st" "$secs" "${detail:0:110}"
  done
} >> "$summary"
tail -n $((${#results[@]} + 2)) "$summary"
for r in "${results[@]}"; do [[ "$r" == FAIL* ]] && exit 1; done
exit 0
