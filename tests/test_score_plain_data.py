"""electra-score on data made by plain fairseq-preprocess (no electra-prepare tokenizer):
the input is read as whitespace tokens of dict.txt, as fairseq's hub reads text without a
BPE, and the command says so in one log line."""

import logging

import pytest
import torch

from electra_plugin.cli import score as score_cli
from electra_plugin.data.tokenizer import METADATA_FILE
from electra_plugin.finetuning import scoring
from electra_plugin.models.electra import ElectraModel
from helpers import train

CORPUS_LIKE = "the cat sees a house in the park ."  # the templates of conftest's corpus
SHUFFLED = "park house in sees . a cat the the"
UNKNOWN = "the zyzzyva sees a house in the park ."  # zyzzyva: not in dict.txt


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, data_bin):
    """A 20-update electra pre-training checkpoint on plain fairseq-preprocess data."""
    save = tmp_path_factory.mktemp("plain-ck")
    train(data_bin, save, "--max-update", "20",
          "--no-epoch-checkpoints", "--disable-validation", "--batch-size", "16")
    return save / "checkpoint_last.pt"


def scores(path, data, lines, tmp_path, kind):
    """The language scores electra-score score writes for ``lines``, in process."""
    text, out = tmp_path / "in.txt", tmp_path / f"{kind}.tsv"
    text.write_text("\n".join(lines) + "\n")
    score_cli.main(["score", "--checkpoint", str(path), "--pretrain-data", str(data),
                    "--input", str(text), "--scorer", kind, "--cpu", "--out", str(out)])
    return [float(row.split("\t")[3]) for row in out.read_text().splitlines()[1:]]


@pytest.mark.slow  # checkpoint: a fairseq-train run
@pytest.mark.parametrize("kind", scoring.SCORERS)
def test_plain_fairseq_data_is_scored_as_whitespace_tokens_of_dict_txt(
        kind, checkpoint, data_bin, tmp_path, caplog):
    assert not (data_bin / METADATA_FILE).exists()  # what the test is about
    with caplog.at_level(logging.INFO, logger="electra_plugin.finetuning.scoring"):
        got = scores(checkpoint, data_bin, [CORPUS_LIKE, SHUFFLED, UNKNOWN], tmp_path, kind)
    said = [r.getMessage() for r in caplog.records if "whitespace-separated tokens" in r.message]
    assert len(said) == 1 and METADATA_FILE in said[0] and "dict.txt" in said[0], said

    # the ids are fairseq's own binarization of the line: Dictionary.encode_line, after <s>
    hub = ElectraModel.from_pretrained(str(checkpoint.parent), checkpoint.name, str(data_bin))
    d = hub.task.source_dictionary
    rows = [torch.cat([torch.tensor([d.bos()]),
                       d.encode_line(line, add_if_not_exist=False, append_eos=True).long()])
            for line in (CORPUS_LIKE, SHUFFLED, UNKNOWN)]
    assert d.unk() in rows[2] and d.unk() not in rows[0]
    expected = scoring.SentenceScorer(hub.model, kind, hub.task.mask_idx)(rows)
    assert got == pytest.approx(expected, abs=1e-5)
    assert len(set(got)) == 3  # the word order and the <unk> change the score
    # a word missing from dict.txt is <unk>: the sentence scores as with <unk> written there
    assert got[2] == pytest.approx(
        scores(checkpoint, data_bin, [CORPUS_LIKE.replace("cat", "<unk>")], tmp_path, kind)[0],
        abs=1e-5)
