#!/usr/bin/env bash
# Fine-tune a pre-trained ELECTRA discriminator on SQuAD and report the official EM/F1.
#
#   examples/squad/finetune_squad.sh PRETRAIN_DATA CHECKPOINT WORK_DIR [fairseq-train options]
#
# PRETRAIN_DATA  the data directory the model was pre-trained on (electra-prepare):
#                its dict.txt and tokenizer encode the questions and contexts
# CHECKPOINT     the pre-training checkpoint (its generator is dropped on load)
# WORK_DIR       gets json/ (the SQuAD files), data-bin/, checkpoints/, results/
# Anything after WORK_DIR goes to fairseq-train, e.g. the size options of a model that is
# not one of the standard --arch sizes, or --max-update for a short run.
#
# Settings (environment variables), with ELECTRA's official fine-tuning values as defaults
# (google-research/electra configure_finetuning.py):
#   SIZE=small|base|large   lr 3e-4 / 1e-4 / 5e-5, layer-wise lr decay 0.8 / 0.8 / 0.9
#   ARCH=electra_$SIZE      the --arch (size options after WORK_DIR override it)
#   EPOCHS=2 BATCH=32 WARMUP=0.1 (fraction of the updates) WEIGHT_DECAY=0.01
#   MAX_SEQ_LEN=512 DOC_STRIDE=128 MAX_QUERY_LEN=64 N_BEST=20 MAX_ANSWER_LEN=30
#   LR, LAYER_DECAY         override the per-size values
#   TRAIN_JSON, VALID_JSON  SQuAD files (v1.1 or v2.0). Default: the real SQuAD-format files
#                           of the bigbench==1.0.0 sdist, fetched once into
#                           ~/.cache/electra_plugin/squad_shifts; SHIFT=new_wiki (or nyt,
#                           reddit, amazon_reviews) is split by paragraph into train and
#                           valid (VALID_FRACTION=0.1, MAX_TRAIN_QUESTIONS to subsample)
#   NO_ANSWER_THRESHOLD=0   SQuAD 2.0: answer "" above this no-answer logit
#   DEVICE=--cpu            or empty to use the GPU
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
    exit 1
fi
PRETRAIN_DATA=$1 CHECKPOINT=$2 WORK=$3
shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-python}

SIZE=${SIZE:-small}
case $SIZE in
    small) DEFAULT_LR=3e-4 DEFAULT_DECAY=0.8 ;;
    base) DEFAULT_LR=1e-4 DEFAULT_DECAY=0.8 ;;
    large) DEFAULT_LR=5e-5 DEFAULT_DECAY=0.9 ;;
    *) echo "SIZE must be small, base or large" >&2; exit 1 ;;
esac
ARCH=${ARCH:-electra_$SIZE}
LR=${LR:-$DEFAULT_LR}
LAYER_DECAY=${LAYER_DECAY:-$DEFAULT_DECAY}
EPOCHS=${EPOCHS:-2}
BATCH=${BATCH:-32}
WARMUP=${WARMUP:-0.1}
WEIGHT_DECAY=${WEIGHT_DECAY:-0.01}
MAX_SEQ_LEN=${MAX_SEQ_LEN:-512}
DOC_STRIDE=${DOC_STRIDE:-128}
MAX_QUERY_LEN=${MAX_QUERY_LEN:-64}
N_BEST=${N_BEST:-20}
MAX_ANSWER_LEN=${MAX_ANSWER_LEN:-30}
NO_ANSWER_THRESHOLD=${NO_ANSWER_THRESHOLD:-0}
DEVICE=${DEVICE---cpu}
mkdir -p "$WORK"

# 1. data: given files, or the real SQuAD-format files of bigbench (fetched once, cached)
if [ -z "${TRAIN_JSON:-}" ]; then
    SHIFTS=$($PY "$REPO/scripts/fetch_squad.py")
    SHIFT=${SHIFT:-new_wiki}
    SPLIT_ARGS=(--out-dir "$WORK/json" --valid-fraction "${VALID_FRACTION:-0.1}")
    [ -n "${MAX_TRAIN_QUESTIONS:-}" ] && SPLIT_ARGS+=(--max-train-questions "$MAX_TRAIN_QUESTIONS")
    [ -n "${MAX_VALID_QUESTIONS:-}" ] && SPLIT_ARGS+=(--max-valid-questions "$MAX_VALID_QUESTIONS")
    $PY -m electra_plugin.cli.squad split "$SHIFTS/${SHIFT}_v1.0.json" "${SPLIT_ARGS[@]}"
    TRAIN_JSON=$WORK/json/train.json
    VALID_JSON=$WORK/json/valid.json
fi

# 2. windows, binarized with the pre-training dictionary and tokenizer. The released files
#    have a few answers whose answer_start is off by one or more characters: realign them.
$PY -m electra_plugin.cli.squad preprocess --pretrain-data "$PRETRAIN_DATA" \
    --train "$TRAIN_JSON" --valid "$VALID_JSON" --out-dir "$WORK/data-bin" --force \
    --max-seq-len "$MAX_SEQ_LEN" --doc-stride "$DOC_STRIDE" --max-query-len "$MAX_QUERY_LEN" \
    --realign-answers

# 3. fine-tune: EPOCHS epochs of BATCH windows, linear warm-up over WARMUP of the updates
#    then linear decay to 0, Adam (eps 1e-6) with weight decay and layer-wise lr decay.
read -r UPDATES WARMUP_UPDATES < <(
    $PY - "$WORK/data-bin/train.squad.json" "$BATCH" "$EPOCHS" "$WARMUP" <<'EOF'
import json, math, sys
windows = len(json.load(open(sys.argv[1]))["windows"])
updates = math.ceil(windows / int(sys.argv[2])) * int(sys.argv[3])
print(updates, max(1, round(float(sys.argv[4]) * updates)))
EOF
)
echo "fine-tuning: $UPDATES updates ($EPOCHS epochs, batch $BATCH), $WARMUP_UPDATES warm-up," \
    "lr $LR, layer decay $LAYER_DECAY"
fairseq-train "$WORK/data-bin" --user-dir "$REPO/electra_plugin" \
    --task squad --criterion squad --arch "$ARCH" $DEVICE \
    --restore-file "$CHECKPOINT" --reset-optimizer --reset-dataloader --reset-meters \
    --batch-size "$BATCH" --required-batch-size-multiple 1 --max-epoch "$EPOCHS" \
    --optimizer electra_adam --layer-decay "$LAYER_DECAY" --adam-betas '(0.9,0.999)' \
    --adam-eps 1e-6 --weight-decay "$WEIGHT_DECAY" --clip-norm 1.0 \
    --lr "$LR" --lr-scheduler polynomial_decay --end-learning-rate 0 \
    --warmup-updates "$WARMUP_UPDATES" --total-num-update "$UPDATES" --max-update "$UPDATES" \
    --save-dir "$WORK/checkpoints" --no-epoch-checkpoints \
    --num-workers 0 --data-buffer-size 0 --log-format simple --log-interval 50 \
    "$@"

# 4. predict the valid split, write predictions.json, and score it (official EM/F1)
$PY -m electra_plugin.cli.squad predict --checkpoint "$WORK/checkpoints/checkpoint_last.pt" \
    --data "$WORK/data-bin" --split valid --out-dir "$WORK/results" \
    --n-best-size "$N_BEST" --max-answer-len "$MAX_ANSWER_LEN" \
    --no-answer-threshold "$NO_ANSWER_THRESHOLD" --batch-size "$BATCH" $DEVICE
$PY -m electra_plugin.cli.squad evaluate "$VALID_JSON" "$WORK/results/predictions.json"
