"""A fine-tuned checkpoint's predictions on a binarized split, for the commands
(``electra-glue evaluate``, ``electra-squad predict``) and the trials that call them in
process: sentence-level classes or values, and SQuAD answers."""

import argparse
import logging
import os

from ..data import squad_answers as answers
from ..data.evaluation import inference_device, predict_split, squad_window_logits
from ..models.hub_interface import from_pretrained
from ..user_io.errors import ElectraUsageError
from ..user_io.progress import progress

logger = logging.getLogger(__name__)


def require_finetuned(checkpoint, task_name):
    """A checkpoint not fine-tuned with ``--task task_name`` (a pre-training one, or a
    discriminator imported alone) refused in one line before its task is built, which would
    fail on data that task reads (its dict.txt) with fairseq's traceback."""
    from .checkpoint_kind import read_kind

    kind = read_kind(checkpoint)  # (a file that is no checkpoint: its own one line)
    if kind.task != task_name:
        raise kind.refusal(f"this needs one fine-tuned with --task {task_name} (a trial's "
                           f"checkpoint_last.pt)")


def sentence_predictions(checkpoint, data, splits=("valid",), cpu=False):
    """-> {split: (predictions, gold labels or None for an unlabelled split)}: class
    indices, or floats for regression, in each split's file order; the model is loaded once."""
    require_finetuned(checkpoint, "sentence_prediction")
    hub = from_pretrained(os.path.dirname(os.path.abspath(checkpoint)),
                          os.path.basename(checkpoint), os.path.abspath(data))
    device = inference_device(cpu)
    model = hub.model.to(device)
    logger.info(f"predicting {', '.join(splits)} on {device.type}")
    return {split: predict_split(model, hub.task, split) for split in splits}


def load_finetuned(checkpoint, data, task_name):
    """-> (the model in eval mode, its task) of a checkpoint fine-tuned with ``--task
    task_name``, its data directory replaced by ``data`` when given."""
    require_finetuned(checkpoint, task_name)
    return load_checked(checkpoint, data)


def load_checked(checkpoint, data):
    """:func:`load_finetuned` of a checkpoint that :func:`require_finetuned` has passed."""
    from fairseq import checkpoint_utils, utils

    plugin = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    utils.import_user_module(argparse.Namespace(user_dir=plugin))
    overrides = {"data": os.path.abspath(data)} if data else {}
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides=overrides)
    return models[0].eval(), task


def squad_predictions(checkpoint, data=None, split="valid", cpu=False, *,
                      n_best_size=answers.N_BEST_SIZE, max_answer_len=answers.MAX_ANSWER_LEN,
                      no_answer_threshold=0.0, batch_size=32):
    """-> ({question id: Prediction}, the split's SquadMetadata) of a ``--task squad``
    checkpoint on ``data``'s ``split`` (default: the checkpoint's own data)."""
    model, task = load_finetuned(checkpoint, data, "squad")
    device = inference_device(cpu)
    model = model.to(device)
    dataset = task.load_dataset(split)
    meta = task.load_metadata(split)
    logger.info(f"predicting {len(dataset)} windows of {len(meta.examples)} questions "
                f"({device.type})")
    logits = squad_window_logits(model, task, dataset, batch_size, device)
    return answers.predict_answers(meta, logits, n_best_size, max_answer_len,
                              no_answer_threshold), meta


def tagging_predictions(checkpoint, data=None, split="valid", cpu=False, batch_size=32):
    """-> (the split's sentences, each word's predicted label, the labels) of a
    ``--task token_tagging`` checkpoint; a word cut off by the length limit gets "O" (or the
    first label)."""
    import torch

    from ..data.conll import load_metadata
    from ..data.evaluation import net_input_on
    model, task = load_finetuned(checkpoint, data, "token_tagging")
    sentences, first_pieces, labels = load_metadata(task.cfg.data, split)
    if labels != task.labels:
        raise ElectraUsageError(f"the {split} split's labels {labels} are not the model's "
                                f"{task.labels}; preprocess it with the training labels")
    device = inference_device(cpu)
    model = model.to(device)
    batches = task.get_batch_iterator(
        dataset=task.load_dataset(split), max_sentences=batch_size,
        max_positions=task.max_positions(), ignore_invalid_inputs=False,
        num_workers=0).next_epoch_itr(shuffle=False)
    fallback = "O" if "O" in labels else labels[0]
    predicted = [None] * len(sentences)
    with torch.inference_mode():
        for sample in progress(batches, len(batches), f"tagging {split}"):
            logits, _ = model(**net_input_on(sample, device),
                              classification_head_name=task.cfg.classification_head_name)
            best = logits.argmax(-1).cpu()
            for row, index in enumerate(sample["id"].tolist()):
                predicted[index] = [labels[int(best[row, p])] if p else fallback
                                    for p in first_pieces[index]]
    return sentences, predicted, labels
