"""After pre-training: the discriminator-only checkpoint and the hub interface."""

import sys

import pytest
import torch

from electra_plugin.cli import extract
from electra_plugin.models.electra import ElectraModel
from helpers import PLUGIN, assert_main_error, preprocess, run_here, write_rte


@pytest.fixture(scope="module")
def discriminator(tmp_path_factory, pretrained):
    out = tmp_path_factory.mktemp("disc") / "discriminator.pt"
    extract.main([str(pretrained), "--out", str(out)])  # electra-extract's main, in process
    return out


@pytest.mark.slow
def test_discriminator_checkpoint_holds_exactly_the_discriminator(discriminator, pretrained):
    full = torch.load(pretrained, weights_only=False)["model"]
    disc = torch.load(discriminator, weights_only=False)["model"]
    assert set(disc) == {k for k in full if k.startswith("discriminator.")}
    assert all(torch.equal(disc[k], full[k]) for k in disc)
    # refuses to overwrite, and refuses a checkpoint that has no generator
    before = discriminator.read_bytes()
    assert_main_error(extract.main, [pretrained, "--out", discriminator], "already exists")
    assert discriminator.read_bytes() == before
    assert_main_error(extract.main, [discriminator, "--out", discriminator.parent / "again.pt"],
                      "already a discriminator-only")
    assert not (discriminator.parent / "again.pt").exists()


@pytest.mark.slow
def test_finetune_from_the_discriminator_checkpoint(tmp_path, spm_data, discriminator):
    data = tmp_path / "bin"
    assert preprocess("RTE", write_rte(tmp_path / "RTE", 16, 8), spm_data, data).returncode == 0
    save = tmp_path / "ft"
    proc = run_here([sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
                     "--task", "sentence_prediction", "--arch", "electra_tiny", "--cpu",
                     "--criterion", "sentence_prediction", "--num-classes", "2", "--init-token",
                     "0", "--finetune-from-model", discriminator, "--optimizer", "electra_adam",
                     "--lr", "1e-9", "--batch-size", "8", "--max-update", "1", "--save-dir", save,
                     "--num-workers", "0", "--data-buffer-size", "0"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    tuned = torch.load(save / "checkpoint_last.pt", weights_only=False)["model"]
    start = torch.load(discriminator, weights_only=False)["model"]
    # the encoder came from the checkpoint (lr 1e-9 barely moves it); a new head was added
    key = "discriminator.encoder.layer.0.attention.self.query.weight"
    assert torch.allclose(tuned[key], start[key], atol=1e-6)
    assert "classification_heads.sentence_classification_head.out_proj.weight" in tuned


@pytest.mark.slow
def test_hub_interface_on_the_pretrained_model(pretrained, spm_data):
    hub = ElectraModel.from_pretrained(str(pretrained.parent), pretrained.name, str(spm_data))
    text = "the cat sees a house today ."
    tokens = hub.encode(text)
    d = hub.task.source_dictionary
    assert tokens[0] == d.bos() and tokens[-1] == d.eos() and d.unk() not in tokens.tolist()
    assert hub.decode(tokens) == text
    pair = hub.encode(text, "a dog follows the ball .")
    assert pair.tolist().count(d.eos()) == 2

    features = hub.extract_features(tokens)
    assert features.shape == (1, len(tokens), hub.model.cfg.hidden_size)
    layers = hub.extract_features(tokens, return_all_hiddens=True)
    assert len(layers) == hub.model.cfg.num_layers + 1
    assert torch.allclose(layers[-1], features)

    scores = hub.replaced_token_scores(text)
    assert [p for p, _ in scores] == hub.pieces(tokens[1:-1])
    assert all(0.0 < s < 1.0 for _, s in scores)
    # the scores are the discriminator's: sigmoid of its replaced-token logits
    logits, _ = hub.model(tokens.unsqueeze(0))
    assert torch.allclose(torch.tensor([s for _, s in scores]),
                          torch.sigmoid(logits[0, 1:-1]), atol=1e-6)

    # one replaced-token-detection step: the read pieces differ only where the generator
    # sampled, and the probabilities are the discriminator's on what it read
    shown = hub.generate_and_detect(text, mask_prob=0.3, seed=4)
    assert [o for o, _, _ in shown] == hub.pieces(tokens[1:-1])
    read = [r for _, r, _ in shown]
    logits, _ = hub.model(hub.encode(text).index_put(
        (torch.arange(1, len(tokens) - 1),), torch.tensor([d.index(r) for r in read]))[None])
    assert torch.allclose(torch.tensor([p for _, _, p in shown]),
                          torch.sigmoid(logits[0, 1:-1]), atol=1e-6)
    assert shown == hub.generate_and_detect(text, mask_prob=0.3, seed=4)  # seeded
    assert "<mask>" not in read

    hub.register_classification_head("topic", num_classes=3)
    log_probs = hub.predict("topic", tokens)
    assert log_probs.shape == (1, 3)
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(1))
    from electra_plugin.user_io.errors import ElectraUsageError

    with pytest.raises(ElectraUsageError, match="no classification head named 'nope'"):
        hub.predict("nope", tokens)
    with pytest.raises(ElectraUsageError, match="more than the model's"):
        hub.encode(" ".join(["the cat"] * 400))
    with pytest.raises(ElectraUsageError, match="missing.pt does not exist"):
        ElectraModel.from_pretrained(str(pretrained.parent), "missing.pt", str(spm_data))


@pytest.mark.slow  # pretrained: a fairseq-train run
def test_own_pretraining_keeps_pairs_at_token_type_0(pretrained, spm_data):
    """The electra task never feeds token type 1, so pairs of its checkpoints stay type 0."""
    hub = ElectraModel.from_pretrained(str(pretrained.parent), pretrained.name, str(spm_data))
    assert not hub.model.cfg.segment_token_types
    pair = hub.encode("the cat sees a house .", "a dog follows the ball .").unsqueeze(0)
    with torch.no_grad():
        hub.model.discriminator.embeddings.token_type_embeddings.weight[1].normal_(0, 1)
        ours, _ = hub.model(pair, features_only=True)
        zeros, _ = hub.model(pair, features_only=True, token_types=torch.zeros_like(pair))
    torch.testing.assert_close(ours, zeros, atol=1e-6, rtol=0)

