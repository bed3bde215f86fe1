"""--length-buckets: fine-tuning batches reach the encoder at a few lengths, and what the model
returns at the batch's own positions does not change (speed/buckets.py)."""

import math
import sys

import pytest
import torch
from fairseq.data.indexed_dataset import MMapIndexedDataset

from electra_plugin.speed.buckets import bucket_length
from electra_plugin.profiling.host_work import HostWork
from helpers import PLUGIN, REPO, failure, preprocess, records, run_here, tiny_model, write_rte


@pytest.mark.parametrize("length, longest, buckets, expected", [
    (5, 512, 8, 64), (64, 512, 8, 64), (65, 512, 8, 128), (511, 512, 8, 512),
    (512, 512, 8, 512), (3, 10, 3, 4), (9, 10, 3, 10), (7, 512, 0, 7), (600, 512, 8, 600)])
def test_bucket_lengths(length, longest, buckets, expected):
    assert bucket_length(length, longest, buckets) == expected


@pytest.mark.parametrize("body", ["bert", "deberta", "modern"])
def test_outputs_and_gradients_do_not_change_and_the_encoder_meets_few_shapes(body):
    model, task = tiny_model(encoder_body=body, max_positions=64, dropout=0.0,
                             attention_dropout=0.0)
    model.register_classification_head("head", num_classes=3)
    model.eval()
    d = task.dictionary
    seen = set()
    model.discriminator.register_forward_pre_hook(lambda _, args: seen.add(args[0].size(1)))
    g = torch.Generator().manual_seed(0)
    for length in (5, 11, 16, 17, 30, 33, 64):
        tokens = torch.randint(d.nspecial, len(d) - 1, (3, length), generator=g)
        tokens[:, 0], tokens[:, -1] = d.bos(), d.eos()
        tokens[-1, -2:] = d.pad()  # a padded row
        results = []
        for buckets in (0, 4):
            model.cfg.length_buckets = buckets
            model.zero_grad()
            features, extra = model(tokens, features_only=True, return_all_hiddens=True)
            logits, _ = model(tokens, classification_head_name="head")
            (features.sum() + logits.sum()).backward()
            grads = [p.grad.clone() for p in model.discriminator.parameters()
                     if p.grad is not None]
            assert features.shape[1] == length and extra["inner_states"][-1].shape[1] == length
            results.append((features, logits, grads))
        (f0, l0, g0), (f4, l4, g4) = results
        torch.testing.assert_close(f4, f0, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(l4, l0, atol=1e-5, rtol=1e-5)
        assert len(g0) == len(g4) > 0
        for a, b in zip(g0, g4):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    # without buckets, each batch's own length; with 4, the lengths 16, 32, 48 and 64
    assert seen == {5, 11, 16, 17, 30, 33, 64} | {16, 32, 48, 64}
    # bucketed batches take the padded layout: no host sync asks whether there is padding
    # (the modern body's unpadding reads the mask either way)
    for buckets in (0, 4):
        model.cfg.length_buckets = buckets
        with torch.no_grad(), HostWork() as work:
            model(tokens, classification_head_name="head")
        assert (work.syncs == 0) == (buckets == 4 and body != "modern"), (buckets, work.syncs)


@pytest.mark.slow
def test_fine_tuning_with_buckets_logs_what_it_logs_without(tmp_path, spm_data):
    """fairseq-train's sentence_prediction (RTE, lengths vary per batch) with --length-buckets
    against without, dropout off (its masks take the padded shape): the same losses and the
    same accuracy, update by update."""
    data = tmp_path / "bin"
    assert preprocess("RTE", write_rte(tmp_path / "RTE", 24, 8), spm_data, data).returncode == 0
    logs = []
    for name, extra in (("plain", []), ("buckets", ["--length-buckets", "4"])):
        proc = run_here([
            sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
            "--task", "sentence_prediction", "--criterion", "sentence_prediction",
            "--arch", "electra_tiny", "--num-layers", "2", "--cpu", "--num-classes", "2",
            "--init-token", "0", "--max-positions", "128", "--dropout", "0",
            "--attention-dropout", "0", "--optimizer", "electra_adam", "--lr", "1e-4",
            "--batch-size", "4", "--max-update", "5", "--seed", "2",
            "--save-dir", tmp_path / name, "--num-workers", "0", "--data-buffer-size", "0",
            "--log-format", "json", "--log-interval", "1", "--no-progress-bar", *extra])
        assert proc.returncode == 0, failure("fairseq-train", proc)
        logs.append(records(proc.stdout))
    plain, bucketed = logs
    assert len(plain) == len(bucketed) == 5
    for a, b in zip(plain, bucketed):
        assert float(b["loss"]) == pytest.approx(float(a["loss"]), abs=2e-3)
        assert b["accuracy"] == a["accuracy"]
    saved = torch.load(tmp_path / "buckets" / "checkpoint_last.pt", weights_only=False)
    assert saved["cfg"]["model"]["length_buckets"] == 4


def test_the_shape_count_script(data_bin, capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import length_buckets
    finally:
        sys.path.pop(0)
    length_buckets.main([str(data_bin), "--batch-size", "8", "--max-positions", "64",
                         "--buckets", "0", "2"])
    lines = capsys.readouterr().out.splitlines()
    examples = len(MMapIndexedDataset(str(data_bin / "train")))
    assert f"{examples} examples" in lines[0] and \
        f"{math.ceil(examples / 8)} batches of 8" in lines[0], lines[0]
    assert lines[1].startswith("--length-buckets 0: ") and "1.00x the tokens" in lines[1]
    shapes = int(lines[2].split(": ")[1].split()[0])
    assert lines[2].startswith("--length-buckets 2: ") and 1 <= shapes <= 2
