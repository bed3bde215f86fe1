#!/usr/bin/env bash
# Every GPU figure of docs/benchmarks.md ("GPU") in one run on a one-GPU machine with torch
# already installed: first the paper's comparison (scripts/electra_vs_mlm.py: ELECTRA-Small
# against a masked LM at equal training FLOPs, each arm and a random init fine-tuned by
# trials), then the CUDA tests, what an update asks of the host, the eager, graphed and
# peer rows at the paper's batches (electra_small 128 x 128, electra_base 32 x 512, bf16;
# the graphed rows replayed as CUDA graphs), each body in bf16, then a short graphed
# pre-training and sentiment trials from it and from random init.
#
#   OUT=results bash benchmarks/gpu_session.sh [SECONDS]   # SECONDS: the whole budget (560)
#   BACK=$OUT OUT=/tmp/gpu STAGES=compare bash benchmarks/gpu_session.sh 540  # a lent session's
#       first call: the results packed into the device's $OUT, which returns at most 8 files
#   STAGES="count bench_small pytest_gpu" OUT=results bash benchmarks/gpu_session.sh 300
#
# Needs, in the checkout: .whl/ (fairseq and what the machine lacks, as wheels: docs/benchmarks.md
# "GPU" names them) and gpu_data/{data-bin,sentiment-bin} (a binarized corpus and the sentiment
# set; amazon-bin, a second task, where present): scripts/pack_gpu_data.py makes the folder,
# 20.8 MiB; gpu_data/inductor-cache.tar.gz, where an earlier session's $OUT left one, spares
# the compile. Each stage runs under its weight's share of what is left of the budget, so
# a stage that ends early leaves its time to the later ones and a slow one is cut instead of
# losing what was measured; every log lands in $OUT as it is written. STAGES picks stages
# (compare count bench_small bench_base pretrain pytest_gpu trials bench_bodies: all by
# default).
# TINY=1 runs every stage on the CPU at tiny sizes, with the Python at hand and DATA as the data
# folder (tests/test_gpu_session.py), so that a GPU's minutes are never lost to a typo; there
# AT_ONCE stages run at once (default 2, a core each; on a GPU 1, one after the other).
set -u
budget=${1:-560}
TINY=${TINY:-0}
AT_ONCE=${AT_ONCE:-$([ "$TINY" = 1 ] && echo 2 || echo 1)}
data=${DATA:-$PWD/gpu_data}
start=$SECONDS
OUT=${OUT:?set OUT to a folder for the results}
BACK=${BACK:-$OUT}  # the folder that comes back from a lent machine (at most 8 files there):
mkdir -p "$BACK"   # another than OUT, it gets OUT packed (results.tar.gz) and the cache
STAGES=${STAGES:-compare count bench_small bench_base pretrain pytest_gpu trials bench_bodies}
# the GPU tests skip on a CPU
[ "$TINY" = 1 ] && STAGES=${STAGES/pytest_gpu/}
mkdir -p "$OUT"
weight() {  # each stage's relative share of the time left
    case $1 in compare) echo 700;; count) echo 80;; bench_small) echo 180;; bench_base) echo 150;;
               pretrain) echo 80;; pytest_gpu) echo 110;;
               trials*) echo 40;; bench_bodies) echo 30;; esac; }
pending=""  # the chosen stages not yet run, in order
for name in compare count bench_small bench_base pretrain pytest_gpu trials--arch \
            trials--checkpoint bench_bodies; do
    [[ " $STAGES " == *" ${name%%--*} "* ]] && pending="$pending $name "
done
share() {  # share NAME: NAME's seconds, its weight over those of the stages still to run
    local rest=1 other
    for other in $pending; do rest=$(( rest + $(weight "$other") )); done
    echo $(( (budget - (SECONDS - start)) * $(weight "$1") / rest ))
}
stage() {  # stage NAME COMMAND...: a chosen stage, under its share (AT_ONCE > 1: in the
    # background once a slot is free; its pid in pid_NAME)
    local name=$1; shift
    [[ "$pending" == *" $name "* ]] || return 0
    local t; t=$(share "$name")
    # stages at once overlap: each may take all the time left
    [ "$AT_ONCE" -gt 1 ] && t=$(( budget - (SECONDS - start) ))
    pending=${pending/ $name / }
    if [ "$t" -lt 20 ]; then echo "== $name: skipped, ${t}s for it" | tee -a "$OUT/stages.txt"; return; fi
    if [ "$AT_ONCE" -gt 1 ]; then
        while [ "$(jobs -rp | wc -l)" -ge "$AT_ONCE" ]; do wait -n; done
        run_stage "$name" "$t" "$@" &
        eval "pid_${name//-/_}=$!"
    else
        run_stage "$name" "$t" "$@"
    fi
}
stop_stages() {  # the stages still running in the background, and their commands
    local job
    for job in $(jobs -p); do pkill -P "$job"; kill "$job"; done 2>/dev/null
}
trap stop_stages EXIT
trap 'exit 143' INT TERM
run_stage() {  # run_stage NAME SECONDS COMMAND...
    local name=$1 t=$2; shift 2
    echo "== $name (limit ${t}s)" | tee -a "$OUT/stages.txt"
    local s=$SECONDS
    timeout "$t" "$@" > "$OUT/$name.txt" 2>&1
    echo "   $name: rc=$? in $(( SECONDS - s ))s" | tee -a "$OUT/stages.txt"
    pack
}
pack() {  # $OUT as one file in $BACK, rewritten whole after each stage (a cut run keeps it)
    [ "$BACK" = "$OUT" ] && return
    local part="$BACK/.results.$BASHPID.tar.gz"  # (stages at once pack at once)
    tar czf "$part" --exclude=./scratch -C "$OUT" . 2>/dev/null
    mv "$part" "$BACK/results.tar.gz"
}

if [ "$TINY" = 1 ]; then  # the CPU rehearsal: tiny sizes, this environment's Python
    py=${PYTHON:-python3}; device=cpu; backend=aot_eager; graphed_backend=aot_eager; scratch=$OUT/scratch
    small="--batch-size 2 --lengths 16 --steps 1 --warmup 1 --repeats 1 --vocab 64 --data-batch-size 8 --data-batches 1"
    base="$small"; arch=electra_tiny; updates=4; seeds="1"; jobs=1; trials="--max-update 2"
    bodies="--sizes small --lengths 16 --batch-size 2 --steps 1 --warmup 1 --repeats 1 --vocab 64"
    count="--steps 1 --warmup 1 --repeats 1 --plugin-args --num-layers 1"  # compiles fast
    pretrain="task.tokens_per_sample=32 dataset.batch_size=8 task.global_batch_size=8"
    pretrain="$pretrain ++model.num_layers=1"  # one layer: the graphed step compiles fast
    tiny_model="--plugin-args --num-layers 1 --hidden-size 16 --num-heads 4 --ffn-size 16"
    tiny_model="$tiny_model --embedding-size 16"  # one layer: the graphed row compiles fast
    tiny_base="$tiny_model --generator-size 0.25"
    compare="--cpu --arch electra_tiny --updates 4 --batch 8 --length 32 --finetune-updates 1"
    compare="$compare --log-interval 1 --graphed --override ++task.torch_compile=aot_eager"
    compare="$compare --override ++model.num_layers=1"
    # a clock shorter than the compile: each arm stops after its first update
    compare="$compare --jobs 2 --pretrain-minutes 0.01"; reserve=0; compile=0
else
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
    py=python3; device=cuda; backend=inductor; graphed_backend=""; scratch=/tmp
    small="--batch-size 128 --lengths 128"; base="--batch-size 32 --lengths 512"
    arch=electra_small; updates=4000; seeds="1 2 3 4 5"; jobs=5; count=""; pretrain=""; trials=""
    bodies="--sizes small base --lengths 128 512 --batch-size 32"; tiny_model=""; tiny_base=""
    compare="--flops 1e16"; reserve=240; compile=1  # seconds kept for the fine-tuning of three
    # arms (66-67 s each on an H200, 10 runs at once); minutes for each arm's start-up and
    # compile
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  $py -c "import torch, fairseq, transformers, electra_plugin; print('torch', torch.__version__, 'fairseq', fairseq.__version__, 'transformers', transformers.__version__)"
  $py -c "import flash_attn" 2>&1 | tail -1; } > "$OUT/machine.txt" 2>&1 &
# (beside the first stage: its imports take seconds; printed at the end)
# inductor's compiled graphs (on a GPU with Triton's kernels) in one folder for every stage;
# $data/inductor-cache.tar.gz, this script's own output of an earlier session on the same
# torch and GPU, fills it first: a graph found there is loaded, not compiled again
# (docs/benchmarks.md, "Compile time")
export TORCHINDUCTOR_CACHE_DIR=$scratch/inductor-cache
mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
[ -f "$data/inductor-cache.tar.gz" ] && tar xzf "$data/inductor-cache.tar.gz" -C "$TORCHINDUCTOR_CACHE_DIR"

# the paper's comparison at what fits: electra_small by the official recipe against the masked
# LM of the same network, both planned to 1e16 training FLOPs and pre-trained at once in the
# share left after the fine-tuning's reserve (the window): $compile minutes to start and
# compile, the window's rest less 30 s as each arm's clock, the window as the deadline of an
# arm that never updates; then trials on each task, 5 seeds an arm
tasks="--task sentiment=$data/sentiment-bin"
[ -d "$data/amazon-bin" ] && tasks="$tasks --task amazon=$data/amazon-bin"
window=$(( $(share compare) - reserve ))
clock=$($py -c "print(f'--pretrain-minutes {max($window - 60 * $compile - 30, 30) / 60:.3g}' \
                      f' --deadline-minutes {max($window, 60) / 60:.3g}')")
# ELECTRA_SPEED=-gradients: the arms' graphed step as two graphs (forward, autograd's
# backward), the form measured on an H200 (docs/benchmarks.md, "GPU"), whose encoder layers
# are traced once (speed/layers.py): the compile that starts each arm's clock is the shorter
stage compare env ELECTRA_SPEED=-gradients $py scripts/electra_vs_mlm.py --data $data/data-bin \
    $tasks --seeds $seeds --out-dir "$OUT/compare" --work-dir $scratch/compare \
    --compile-minutes $compile $clock $compare

# per update at electra_small's depth, near-zero widths: operators, syncs, host ms (on a
# GPU the whole update's row replays it as one CUDA graph, ELECTRA_SPEED=+replay)
stage count $py benchmarks/bench_pretrain.py --count --device $device --compile $backend \
    --json "$OUT/count.json" $count
# the paper's batches: eager (--autocast-bf16 and --bf16), graphed (small: also with its
# backward by autograd, ELECTRA_SPEED=-gradients, and with the whole update replayed as one
# CUDA graph, +replay: on a CPU the whole update, rehearsing the flags), the transformers
# peer; each row profiled once more: the GPU's busy time per update, the host's top operators
stage bench_small $py benchmarks/bench_pretrain.py --device $device --precisions bf16 \
    --models electra_small $small --impls plugin peer --graphed $graphed_backend \
    --graphed-speed=-gradients --graphed-speed +replay --profile --json "$OUT/bench_small.json" $tiny_model
stage bench_base $py benchmarks/bench_pretrain.py --device $device --precisions bf16 \
    --models electra_base $base --impls plugin peer --graphed $graphed_backend --profile \
    --json "$OUT/bench_base.json" $tiny_base
# a short pre-training at the graphed pace: electra_small, official recipe, bf16 autocast on
# fp32 weights (the update's checks stay on the device), stopped by the clock
stage pretrain $py -m fairseq_cli.hydra_train --config-dir examples/pretraining/config \
    --config-name electra_small task.data=$data/data-bin common.user_dir=$PWD/electra_plugin \
    model._name=$arch task.autocast_bf16=true task.graphed_step=true \
    ++task.torch_compile=$backend common.log_interval=100 optimization.max_update=$updates \
    lr_scheduler.warmup_updates=400 common.cpu=$([ $device = cpu ] && echo true || echo false) \
    optimization.stop_time_hours=$($py -c "print(max($(share pretrain) - 40, 20) / 3600)") \
    checkpoint.save_dir=$scratch/pretrain checkpoint.save_interval_updates=0 \
    checkpoint.no_epoch_checkpoints=true dataset.disable_validation=true \
    hydra.run.dir=$scratch/pretrain-hydra $pretrain
# four files at once (a file's shared runs made once): tiny models, the GPU holds them all
stage pytest_gpu $py -m pytest -m gpu -n 4 --dist loadfile -q -p no:cacheprovider --timeout 150 -rA tests
for arm in "--arch $arch" "--checkpoint $scratch/pretrain/checkpoint_last.pt"; do
    name=trials${arm%% *}  # each arm in a folder of its own
    # the pre-training's checkpoint is the second trials' start (the first runs beside it)
    [ "$name" = trials--checkpoint ] && [ -n "${pid_pretrain:-}" ] && wait "$pid_pretrain"
    stage $name $py -m electra_plugin.cli.finetune trials $arm \
        --task sentiment=$data/sentiment-bin --seeds $seeds --jobs $jobs \
        --out-dir $scratch/$name $trials $([ $device = cpu ] && echo --cpu)
done
stage bench_bodies $py benchmarks/bench_bodies.py --device $device --precision bf16 $bodies \
    --json "$OUT/bench_bodies.json" $tiny_model
wait  # the stages still running
for name in trials--checkpoint trials--arch; do
    cp $scratch/$name/trials.md "$OUT/$name.md" 2>/dev/null
done
# the cache for the next session (copied into $data); a file comes back from a lent machine
# only under 16 MiB
tar czf "$BACK/inductor-cache.tar.gz" -C "$TORCHINDUCTOR_CACHE_DIR" .
[ "$(stat -c %s "$BACK/inductor-cache.tar.gz")" -gt $(( 16 << 20 )) ] && \
    mv "$BACK/inductor-cache.tar.gz" "$scratch/" && echo "inductor cache over 16 MiB: kept in $scratch" \
    | tee -a "$OUT/stages.txt"
cat "$OUT/machine.txt"
echo "total $(( SECONDS - start ))s" | tee -a "$OUT/stages.txt"
pack
