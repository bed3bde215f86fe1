#!/usr/bin/env bash
# Every GPU figure of docs/benchmarks.md ("GPU") in one run on a one-GPU machine with torch
# already installed: the CUDA tests, the speed rows against the transformers peer, each body
# in bf16, then a short pre-training and sentiment trials from it and from random init.
#
#   OUT=results bash benchmarks/gpu_session.sh [SECONDS]   # SECONDS: the whole budget (560)
#
# Needs, in the checkout: .whl/ (fairseq and what the machine lacks, as wheels: docs/benchmarks.md
# "GPU" names them) and gpu_data/{data-bin,sentiment-bin} (the main job's binarized corpus and
# sentiment set). Each stage runs under what is left of the budget, so a slow stage cuts the later
# ones instead of losing what was measured; every log lands in $OUT as it is written.
set -u
budget=${1:-560}
start=$SECONDS
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
left() { echo $(( budget - (SECONDS - start) - ${1:-0} )); }
stage() {  # stage NAME SECONDS_TO_KEEP_FOR_LATER_STAGES COMMAND...
    local name=$1 keep=$2; shift 2
    local t; t=$(left "$keep")
    if [ "$t" -lt 20 ]; then echo "== $name: skipped, ${t}s left" | tee -a "$OUT/stages.txt"; return; fi
    echo "== $name (limit ${t}s)" | tee -a "$OUT/stages.txt"
    local s=$SECONDS
    timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
    echo "   rc=$? in $(( SECONDS - s ))s" | tee -a "$OUT/stages.txt"
}

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
    .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, fairseq, transformers, electra_plugin; print('torch', torch.__version__, 'fairseq', fairseq.__version__, 'transformers', transformers.__version__)"
  python3 -c "import flash_attn" 2>&1 | tail -1; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

stage pytest_gpu 330 python3 -m pytest -m gpu -q -p no:cacheprovider --timeout 150 -rA tests
stage bench_pretrain 200 python3 benchmarks/bench_pretrain.py --device cuda --precisions bf16 \
    --compile --json "$OUT/bench_pretrain.json"
stage bench_bodies 150 python3 benchmarks/bench_bodies.py --device cuda --precision bf16 \
    --sizes small base --lengths 128 512 --batch-size 32 --json "$OUT/bench_bodies.json"

# a short pre-training: electra_small, official recipe, bf16, stopped by the clock
data=$PWD/gpu_data
stage pretrain 110 python3 -m fairseq_cli.hydra_train --config-dir examples/pretraining/config \
    --config-name electra_small task.data=$data/data-bin common.user_dir=$PWD/electra_plugin \
    common.bf16=true common.log_interval=100 optimization.max_update=4000 \
    lr_scheduler.warmup_updates=400 \
    optimization.stop_time_hours=$(python3 -c "print(max($(left 160), 30) / 3600)") \
    checkpoint.save_dir=/tmp/pretrain checkpoint.save_interval_updates=0 \
    checkpoint.no_epoch_checkpoints=true dataset.disable_validation=true \
    hydra.run.dir=/tmp/pretrain-hydra
keep=60
for arm in "--checkpoint /tmp/pretrain/checkpoint_last.pt" "--arch electra_small"; do
    stage "trials${arm%% *}" $keep python3 -m electra_plugin.cli.finetune trials $arm \
        --task sentiment=$data/sentiment-bin --seeds 1 2 3 4 5 --jobs 5 --out-dir /tmp/trials
    keep=0
done
cp /tmp/trials/trials.md "$OUT/trials.md" 2>/dev/null
echo "total $(( SECONDS - start ))s" | tee -a "$OUT/stages.txt"
