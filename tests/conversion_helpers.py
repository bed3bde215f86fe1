"""What the conversion tests share: a small BERT-style WordPiece vocabulary and English text,
random transformers models saved as HF directories, and the fairseq side loaded back."""

from pathlib import Path

import torch

from electra_plugin.data.wordpiece import vocab_to_fairseq_indices

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "She didn't expect the weather in Paris to be so warm in October!",
    "Researchers trained a small discriminator to detect replaced tokens.",
    "ELECTRA learns from every input token, not only the masked ones; it's efficient.",
]
WORDS = sorted(set(
    "the quick brown fox jumps over lazy dog she didn expect weather in paris to be so warm "
    "october researchers trained small detect replaced tokens learns from every input token "
    "not only masked ones it efficient learn mask train play".split()))
LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
# Laid out like BERT's vocab.txt: [PAD], unused slots, the other specials, unused, pieces.
VOCAB = (["[PAD]"] + [f"[unused{i}]" for i in range(6)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
         + [f"[unused{i}]" for i in range(6, 10)] + list(".,!?;'-") + LETTERS
         + ["##" + c for c in LETTERS] + [w for w in WORDS if w not in LETTERS]
         + ["##ing", "##ed", "##er"])

FAIRSEQ_INDEX = torch.tensor(vocab_to_fairseq_indices(VOCAB))  # vocab row -> fairseq id
MASK_ID = VOCAB.index("[MASK]")



def randomize(model, seed):
    """Every parameter random (LayerNorm gains near 1), so that no tensor is trivially equal."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            center, scale = (1.0, 0.1) if "LayerNorm.weight" in name else (0.0, 0.05)
            p.copy_(torch.randn(p.shape, generator=gen) * scale + center)
    return model.eval()


def save_hf(model, path, vocab="txt"):
    """save_pretrained plus the vocabulary as vocab.txt or (transformers 5 style) tokenizer.json."""
    model.save_pretrained(path)
    if vocab == "txt":
        (Path(path) / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    else:
        tmp = Path(path) / "_vocab.txt"
        tmp.write_text("\n".join(VOCAB) + "\n")
        from transformers import BertTokenizer

        BertTokenizer(str(tmp), do_lower_case=True).save_pretrained(path)
        tmp.unlink()
    return Path(path)


def bert_batch(bert, texts=TEXTS):
    batch = bert(texts, padding=True, return_tensors="pt")
    return batch.input_ids, batch.attention_mask.bool()


def assert_close(ours, theirs):
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def load_fairseq(checkpoint, data):
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data)})
    return models[0].eval(), task
