#!/bin/bash
# One device lease in one command (docs/gpu.md): run from the checkout on the GPU machine, with .whl/ carried
# (`make gpu-wheels` here first), e.g. the device tool's run with carry [".whl"]:
#     bash scripts/gpu_lease.sh 480 "bench:2:170" "bench:1:130" "notebooks:[01][0-79]_*.ipynb:rest"
# Arguments: the seconds this script may take in all, then steps "STEP:ARG:SECONDS" run in order, each under its
# own timeout (SECONDS "rest": what is left), so one slow step cannot hide the others. STEP: a gpu_report step;
# ARG: the bench run's number (bench), the notebooks' glob (notebooks), unused otherwise. After each step every
# report so far is packed into $OUT/gpu.tgz: the device tool brings files back only two folders deep.
# Rehearsal on a CPU: NO_WHEELS=1 GPU_REPORT_ARGS=--dry OUT=/tmp/lease bash scripts/gpu_lease.sh 200 "choices::60"
set -u
TOTAL=${1:?seconds in all}; shift
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT/g"
T0=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then  # the wheels a bare image lacks (requirements/gpu-image-extras.txt)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
python3 -m ipykernel install --user --name python3 >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
n=0
for spec in "$@"; do
    n=$((n + 1))
    IFS=: read -r step arg secs <<< "$spec"
    left=$(( TOTAL - ($(date +%s) - T0) - 10 ))
    [ "$secs" = "rest" ] && secs=$left
    [ "$secs" -gt "$left" ] && secs=$left
    if [ "$secs" -le 20 ]; then echo "[lease] $spec skipped: ${left}s left"; continue; fi
    extra=()
    case $step in
        bench) extra=(--bench-runs "$arg") ;;
        notebooks) extra=(--notebooks "$arg") ;;
    esac
    echo "[lease] t=$(( $(date +%s) - T0 ))s: $step ${extra[*]} for ${secs}s"
    timeout "$secs" python3 -m specdec_lib.tools.gpu_report --size lease --steps "$step" "${extra[@]}" \
        --out "$OUT/g/$n-$step" ${GPU_REPORT_ARGS:-}
    echo "[lease] $step: exit $?"
    tar czf "$OUT/gpu.tgz" -C "$OUT/g" .
done
