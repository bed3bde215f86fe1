"""Multiple choice through fairseq's sentence_ranking: SWAG / RACE / JSONL files -> contexts and
options binarized with the pre-training tokenizer -> a real fairseq-train run -> electra-choice
evaluate's accuracy, checked against the model's own scores of hand-built inputs."""

import argparse
import json
import random
import sys

import pytest
import torch

from electra_plugin.cli import choice as choice_cli
from electra_plugin.data import multiple_choice as mc
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import (OBJECTS, PLUGIN, SUBJECTS, VERBS, assert_main_error, assert_usage_line,
                     command, failure, records, run, run_here)

SWAG = ("video-id,fold-ind,startphrase,sent1,sent2,gold-source,"
        "ending0,ending1,ending2,ending3,label\n"
        'v1,0,x,The cat sits.,It,gold,"sleeps, then eats.",runs.,flies.,sings.,0\n'
        "v2,1,y,A man waits.,  The bus,gold,arrives.,leaves.,explodes.,sings.,1\n")
ARTICLE = {"id": "high1.txt", "article": "The cat sat.\nThe dog  ran.",
           "questions": ["The cat _ .", "Who ran?"],
           "options": [["sat", "ran", "flew", "sang"], ["the cat", "the dog", "a bird", "nobody"]],
           "answers": ["A", "B"]}


def error_line(path, fmt=None) -> str:
    with pytest.raises(ElectraUsageError) as caught:
        mc.read_examples(str(path), fmt)
    return assert_usage_line(caught.value, str(path))


def test_readers_give_the_contexts_and_options_by_hand(tmp_path):
    (tmp_path / "train.csv").write_text(SWAG)
    swag = mc.read_examples(str(tmp_path / "train.csv"))
    assert [e.context for e in swag] == ["The cat sits.", "A man waits."]
    assert swag[0].options == ["It sleeps, then eats.", "It runs.", "It flies.", "It sings."]
    assert swag[1].options[0] == "The bus arrives."  # sent2 + " " + ending, spaces collapsed
    assert [e.label for e in swag] == [0, 1] and swag[1].where == f"{tmp_path}/train.csv:3"
    unlabelled = "\n".join(line.rsplit(",", 1)[0] for line in SWAG.splitlines())
    (tmp_path / "test.csv").write_text(unlabelled + "\n")
    assert [e.label for e in mc.read_examples(str(tmp_path / "test.csv"))] == [None, None]

    # RACE: one article per file, a JSON list of them, JSONL, a directory of files
    race = tmp_path / "race"
    (race / "high").mkdir(parents=True)
    (race / "high" / "1.txt").write_text(json.dumps(ARTICLE))
    examples = mc.read_examples(str(race / "high" / "1.txt"))
    assert [e.context for e in examples] == ["The cat sat. The dog ran."] * 2
    assert examples[0].options == ["The cat sat .", "The cat ran .", "The cat flew .",
                                   "The cat sang ."]  # the blank filled
    assert examples[1].options == ["Who ran? the cat", "Who ran? the dog", "Who ran? a bird",
                                   "Who ran? nobody"]  # no blank: question + option
    assert [e.label for e in examples] == [0, 1]
    (race / "2.json").write_text(json.dumps([ARTICLE, dict(ARTICLE, answers=["D", "C"])]))
    listed = mc.read_examples(str(race / "2.json"))
    assert [e.label for e in listed] == [0, 1, 3, 2]
    assert listed[3].where == f"{race}/2.json, article 2, question 2"
    (tmp_path / "race.jsonl").write_text(json.dumps(ARTICLE) + "\n" + json.dumps(ARTICLE) + "\n")
    assert len(mc.read_examples(str(tmp_path / "race.jsonl"), "race")) == 4
    assert len(mc.read_examples(str(race))) == 6  # 2.json, then high/1.txt
    no_answers = {k: v for k, v in ARTICLE.items() if k != "answers"}
    (tmp_path / "test.json").write_text(json.dumps(no_answers))
    assert [e.label for e in mc.read_examples(str(tmp_path / "test.json"))] == [None, None]

    (tmp_path / "dev.jsonl").write_text(
        '{"context": "a b", "choices": ["x", "y  z", ""], "label": 2}\n\n'
        '{"context": "c", "choices": ["u", "v", "w"], "label": 0}\n')
    generic = mc.read_examples(str(tmp_path / "dev.jsonl"))
    assert [(e.context, e.options, e.label) for e in generic] == [
        ("a b", ["x", "y z", ""], 2), ("c", ["u", "v", "w"], 0)]
    assert generic[1].where.endswith("dev.jsonl:3")
    assert [mc.detect_format(p) for p in ("a.csv", "a.jsonl", "a.json", "a.txt", str(race))] \
        == ["swag", "jsonl", "race", "race", "race"]


def test_bad_files_give_one_line_errors(tmp_path, spm_data):
    bad = tmp_path / "ragged.jsonl"
    bad.write_text('{"context": "c", "choices": ["a", "b", "c", "d"], "label": 0}\n'
                   '{"context": "c", "choices": ["a", "b", "c"], "label": 0}\n')
    assert "ragged.jsonl:2 has 3 choices, the first example 4" in error_line(bad)
    ragged_race = tmp_path / "ragged.json"
    options = [ARTICLE["options"][0], ARTICLE["options"][1][:3]]
    ragged_race.write_text(json.dumps(dict(ARTICLE, options=options)))
    assert "question 2 has 3 choices" in error_line(ragged_race)
    (tmp_path / "nosent2.csv").write_text(SWAG.replace("sent2", "other"))
    assert "nosent2.csv:1 has no column sent2" in error_line(tmp_path / "nosent2.csv")
    (tmp_path / "short.csv").write_text(SWAG + "v3,2,z,Too short.,It\n")
    assert "short.csv:4 does not have the header's 11" in error_line(tmp_path / "short.csv")
    (tmp_path / "mixed.jsonl").write_text('{"context": "c", "choices": ["a", "b"]}\n'
                                          '{"context": "c", "choices": ["a", "b"], "label": 1}\n')
    assert "mixed.jsonl:2 is labelled, the first example unlabelled" in \
        error_line(tmp_path / "mixed.jsonl")
    (tmp_path / "range.jsonl").write_text('{"context": "c", "choices": ["a", "b"], "label": 2}\n')
    assert "label 2 is not an option index 0..1" in error_line(tmp_path / "range.jsonl")
    (tmp_path / "letter.json").write_text(json.dumps(dict(ARTICLE, answers=["A", "E"])))
    assert "question 2: answer 'E' is not one of the option letters ABCD" in \
        error_line(tmp_path / "letter.json")
    (tmp_path / "broken.json").write_text('{"article": "x",\n "questions": [}')
    assert "broken.json:2 is not JSON" in error_line(tmp_path / "broken.json")
    (tmp_path / "race.jsonl").write_text(json.dumps(ARTICLE) + "\n")
    assert "pass --format race" in error_line(tmp_path / "race.jsonl")
    (tmp_path / "data.tsv").write_text("a\tb\n")
    assert "--format swag|race|jsonl" in error_line(tmp_path / "data.tsv")

    # the command: choices differing between splits, a bad --max-seq-len
    (tmp_path / "four.jsonl").write_text(bad.read_text().splitlines()[0] + "\n")
    (tmp_path / "three.jsonl").write_text(bad.read_text().splitlines()[1] + "\n")
    common = ["preprocess", "--pretrain-data", spm_data, "--destdir", tmp_path / "out"]
    assert_main_error(choice_cli.main, [*common, "--train", tmp_path / "four.jsonl", "--valid",
                                        tmp_path / "three.jsonl"],
                      "three.jsonl has 3 choices per example", "four.jsonl 4")
    assert_main_error(choice_cli.main, [*common, "--train", tmp_path / "four.jsonl",
                                        "--max-seq-len", "9000"], "--max-seq-len 9000")
    assert not (tmp_path / "out").exists()


def test_preprocess_writes_what_sentence_ranking_reads(tmp_path, spm_data):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    from electra_plugin.data.dictionary import load_dictionary
    from electra_plugin.data.tokenizer import load_tokenizer

    long_context = " ".join(["the cat sees a house ."] * 6)
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"context": "a dog likes the ball .", "choices": ["the ball", "a house"],
                    "label": 0}) + "\n" +
        json.dumps({"context": long_context, "choices": ["a house", "the long road"],
                    "label": 1}) + "\n")
    (tmp_path / "test.jsonl").write_text(
        json.dumps({"context": "the teacher", "choices": ["x", "y"]}) + "\n")
    out = tmp_path / "mc"
    assert choice_cli.main(["preprocess", "--pretrain-data", str(spm_data), "--train",
                            str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "test.jsonl"),
                            "--destdir", str(out), "--max-seq-len", "24"]) == 0
    for k in range(3):
        assert (out / f"input{k}" / "dict.txt").read_bytes() == \
            (spm_data / "dict.txt").read_bytes()
    assert (out / "label" / "train.label").read_text() == "0\n1\n"
    assert not (out / "label" / "test.label").exists()  # unlabelled
    tokenizer, d = load_tokenizer(str(out)), load_dictionary(str(spm_data))

    def ids(text, cut=None):
        return [d.index(p) for p in tokenizer.pieces(text)][:cut] + [d.eos()]

    def item(k, split, i):
        return MMapIndexedDataset(str(out / f"input{k}" / split))[i].tolist()

    assert item(0, "train", 0) == ids("a dog likes the ball .")
    assert item(1, "train", 0) == ids("the ball") and item(2, "train", 0) == ids("a house")
    # 24 tokens = <s> option </s> </s> context </s>: 20 pieces, the long context cut to
    # what the longest option leaves
    longest = max(len(tokenizer.pieces("a house")), len(tokenizer.pieces("the long road")))
    assert item(0, "train", 1) == ids(long_context, 20 - longest)
    assert item(2, "train", 1) == ids("the long road")
    assert item(1, "test", 0) == ids("x")
    assert mc.fit(3, 20, 12) == (3, 9) and mc.fit(20, 3, 12) == (9, 3)
    assert mc.fit(8, 8, 12) == (6, 6) and mc.fit(9, 8, 13) == (7, 6)  # ties: the context


def synthetic(rng, labelled=True):
    """4 choices; the right one names the object the context names."""
    subject, verb, obj = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)
    label = rng.randrange(4)
    others = rng.sample([o for o in OBJECTS if o != obj], 3)
    example = {"context": f"{subject} {verb} {obj} .",
               "choices": [f"{subject} likes {o} ." for o in others[:label] + [obj] +
                           others[label:]]}
    return dict(example, label=label) if labelled else example


def write_jsonl(path, examples):
    path.write_text("".join(json.dumps(e) + "\n" for e in examples))
    return path


@pytest.mark.slow
def test_sentence_ranking_train_and_evaluate(tmp_path, spm_data):
    rng = random.Random(0)
    train = write_jsonl(tmp_path / "train.jsonl", [synthetic(rng) for _ in range(32)])
    valid = [synthetic(rng) for _ in range(12)]
    write_jsonl(tmp_path / "valid.jsonl", valid)
    write_jsonl(tmp_path / "test.jsonl", [synthetic(rng, False) for _ in range(5)])
    data = tmp_path / "mc"
    proc = run(command("choice", "preprocess", "--pretrain-data", spm_data, "--train", train,
                       "--valid", tmp_path / "valid.jsonl", "--test", tmp_path / "test.jsonl",
                       "--destdir", data))
    assert proc.returncode == 0, failure("electra-choice preprocess", proc)
    assert "--num-classes 4 --init-token 0 --separator-token 2" in proc.stderr

    # the contexts are what fairseq-preprocess makes of their pieces with the same dict.txt
    from electra_plugin.data.binarize import fairseq_preprocess
    from electra_plugin.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(data))
    (tmp_path / "valid.pieces").write_text(
        "".join(tokenizer.encode_line(e["context"]) + "\n" for e in valid))
    fairseq_preprocess(str(tmp_path / "reference"), str(spm_data / "dict.txt"),
                       {"validpref": str(tmp_path / "valid.pieces")})
    for suffix in ("bin", "idx"):
        assert (data / "input0" / f"valid.{suffix}").read_bytes() == \
            (tmp_path / "reference" / f"valid.{suffix}").read_bytes()

    save = tmp_path / "ck"
    train = [sys.executable, "-m", "fairseq_cli.train", data, "--user-dir", PLUGIN,
             "--task", "sentence_ranking", "--criterion", "sentence_ranking",
             "--num-classes", "4", "--init-token", "0", "--separator-token", "2",
             "--arch", "electra_tiny", "--max-positions", "64", "--num-layers", "2",
             "--hidden-size", "64", "--num-heads", "4", "--ffn-size", "128",
             "--embedding-size", "32", "--cpu", "--optimizer", "adam", "--lr", "1e-3",
             "--batch-size", "8", "--required-batch-size-multiple", "1",
             "--save-dir", save, "--no-epoch-checkpoints", "--num-workers", "0",
             "--data-buffer-size", "0", "--log-format", "json", "--log-interval", "1",
                "--seed", "1"]
    proc = run_here([*train, "--max-update", "4"])
    assert proc.returncode == 0, failure("fairseq-train", proc)
    checkpoint = save / "checkpoint_last.pt"
    # an argparse task: its settings are stored as a Namespace named by _name
    task_cfg = torch.load(checkpoint, weights_only=False)["cfg"]["task"]
    assert isinstance(task_cfg, argparse.Namespace)
    assert task_cfg._name == "sentence_ranking" and task_cfg.num_classes == 4

    proc = run(command("choice", "evaluate", "--checkpoint", checkpoint, "--data", data,
                       "--split", "valid", "--out", tmp_path / "valid.txt", "--cpu", "--json"))
    assert proc.returncode == 0, failure("electra-choice evaluate", proc)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    predicted = [int(x) for x in (tmp_path / "valid.txt").read_text().split()]

    # by hand: <s> option </s> </s> context </s> per option, the head's score, the best
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data)})
    model, d = models[0].eval(), task.source_dictionary

    def ids(text):
        return [d.index(p) for p in tokenizer.pieces(text)]

    by_hand, inputs, plugin_scores = [], [], []
    with torch.no_grad():
        for e in valid:
            rows = [[d.bos()] + ids(option) + [d.eos(), d.eos()] + ids(e["context"]) +
                    [d.eos()] for option in e["choices"]]
            scores = [model(torch.tensor([row]),
                            classification_head_name="sentence_classification_head")[0].item()
                      for row in rows]
            by_hand.append(max(range(4), key=scores.__getitem__))
            inputs.append(rows)
            plugin_scores.append(scores)
    assert predicted == by_hand
    assert result == {"split": "valid", "examples": 12, "accuracy": pytest.approx(
        100 * sum(p == e["label"] for p, e in zip(by_hand, valid)) / 12)}

    # the unlabelled test split: predictions only; without --predictions one line
    assert choice_cli.main(["evaluate", "--checkpoint", str(checkpoint), "--data", str(data),
                            "--split", "test", "--predictions", str(tmp_path / "test.txt"),
                            "--cpu"]) == 0
    assert len((tmp_path / "test.txt").read_text().split()) == 5
    evaluate = ["evaluate", "--checkpoint", checkpoint, "--data", data, "--cpu"]
    assert_main_error(choice_cli.main, [*evaluate, "--split", "test"], "no labels",
                      "--out")
    assert_main_error(choice_cli.main, [*evaluate, "--head", "nope"],
                      "no classification head named 'nope'")
    assert_main_error(choice_cli.main, [*evaluate, "--split", "valid1"],
                      "input0/valid1.idx is missing")

    # served by transformers: ElectraForMultipleChoice gives the plugin's scores and choices,
    # its import is the checkpoint's weights bit for bit, and exports the same tensors again
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from electra_plugin.cli import convert

    convert.main(["export", str(checkpoint), "--out", str(tmp_path / "hf")])
    hf = transformers.AutoModelForMultipleChoice.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "ElectraForMultipleChoice"
    largest, chosen = 0.0, []
    with torch.no_grad():
        for rows, scores in zip(inputs, plugin_scores):
            width = max(len(r) for r in rows)
            ids_ = torch.tensor([[r + [d.pad()] * (width - len(r)) for r in rows]])
            logits = hf(input_ids=ids_, attention_mask=ids_.ne(d.pad()).long(),
                        token_type_ids=torch.zeros_like(ids_)).logits[0]
            largest = max(largest, float((logits - torch.tensor(scores)).abs().max()))
            chosen.append(int(logits.argmax()))
    print(f"ElectraForMultipleChoice: largest logit difference {largest:.1e}")
    assert largest < 1e-5 and chosen == by_hand
    convert.main(["import", "--discriminator", str(tmp_path / "hf"),
                  "--out", str(tmp_path / "imported")])
    imported = tmp_path / "imported" / "checkpoint.pt"
    original = torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]
    back = torch.load(imported, map_location="cpu", weights_only=True)["model"]
    assert sorted(back) == sorted(original)
    assert all(torch.equal(back[k], original[k]) for k in original)
    proc = run(command("choice", "evaluate", "--checkpoint", imported, "--data", data,
                       "--split", "valid", "--predictions", tmp_path / "again.txt", "--cpu"))
    assert proc.returncode == 0, failure("electra-choice evaluate (imported)", proc)
    assert (tmp_path / "again.txt").read_text() == (tmp_path / "valid.txt").read_text()
    further = [tmp_path / "further" if a == save else a for a in train]
    proc = run([*further, "--max-update", "2", "--finetune-from-model", imported])
    assert proc.returncode == 0, failure("fairseq-train from the import", proc)
    convert.main(["export", str(imported), "--out", str(tmp_path / "hf2")])
    first, second = (load_file(tmp_path / d / "model.safetensors") for d in ("hf", "hf2"))
    assert sorted(first) == sorted(second)
    assert all(torch.equal(first[k], second[k]) for k in first)

    # resuming the run: fairseq's argparse task config loads weights-only
    proc = run_here([*train, "--max-update", "6"])
    assert proc.returncode == 0, failure("fairseq-train (resumed)", proc)
    assert [r["num_updates"] for r in records(proc.stdout)] == [5, 6]
