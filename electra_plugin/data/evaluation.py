"""A fine-tuned model run over a binarized split, batch by batch in eval mode: the loops of
``electra-glue evaluate`` and ``electra-squad predict``, on the device they choose (the GPU
when there is one, the CPU when asked, as fairseq's own commands choose)."""

import torch
from fairseq import utils

from ..user_io.progress import progress


def inference_device(cpu: bool) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")


def net_input_on(sample, device):
    """The batch's ``net_input`` with its tensors on ``device``; the ids and targets the
    commands read stay on the host, so reading them waits for nothing."""
    return utils.apply_to_sample(lambda t: t.to(device), sample["net_input"])


def predict_split(model, task, split, batch_size=64):
    """-> (predictions, gold labels): class indices, or floats for regression; gold is None
    for a split without labels (a test set). Runs in eval mode on the device the model is
    on; the predictions come to the host once, at the end."""
    device = next(model.parameters()).device
    model.eval()
    task.load_dataset(split)
    itr = task.get_batch_iterator(task.dataset(split), max_sentences=batch_size,
                                  max_positions=model.max_positions(),
                                  ignore_invalid_inputs=False).next_epoch_itr(shuffle=False)
    head = task.cfg.classification_head_name
    ids, preds, gold = [], [], []
    with torch.inference_mode():
        for sample in progress(itr, len(itr), f"predicting {split}"):
            logits, _ = model(**net_input_on(sample, device), features_only=True,
                              classification_head_name=head)
            # targets come as B x 1 (labels) or B x 1 (one regression value)
            if "target" in sample:
                gold.append(sample["target"].view(-1))
            preds.append(logits.view(-1) if task.cfg.regression_target else logits.argmax(-1))
            ids.append(sample["id"])
    ids, preds, gold = (torch.cat(t).tolist() if t else [] for t in (ids, preds, gold))
    order = sorted(range(len(ids)), key=ids.__getitem__)  # back to file order
    return [preds[i] for i in order], ([gold[i] for i in order] if gold else None)


def squad_window_logits(model, task, dataset, batch_size, device):
    """{window id: WindowLogits} of a SQuAD split's dataset: the start/end logits of its
    pieces and the no-answer logit (SQuAD 2.0), brought to the host once per batch."""
    batches = task.get_batch_iterator(
        dataset=dataset, max_sentences=batch_size, max_positions=task.max_positions(),
        ignore_invalid_inputs=False, num_workers=0).next_epoch_itr(shuffle=False)
    head = task.cfg.classification_head_name
    logits = {}
    with torch.inference_mode():
        for sample in progress(batches, len(batches), "predicting SQuAD windows"):
            logits.update(batch_window_logits(model, sample, head, device))
    return logits


def batch_window_logits(model, sample, head, device):
    """{window id: WindowLogits} of one batch of SQuAD windows, as decoding reads them (the
    joint head's beam over starts included)."""
    from .squad_answers import WindowLogits

    out, _ = model(**net_input_on(sample, device), classification_head_name=head)
    start, end = (x.float().cpu().numpy() for x in (out.start, out.end))
    no_answer = None if out.no_answer is None else out.no_answer.float().tolist()
    top = None if out.start_top is None else out.start_top.cpu().numpy()
    lengths = sample["net_input"]["src_lengths"].tolist()
    return {window: WindowLogits(start[b, :lengths[b]], end[b, ..., :lengths[b]],
                                 None if no_answer is None else no_answer[b],
                                 None if top is None else top[b])
            for b, window in enumerate(sample["id"].tolist())}
