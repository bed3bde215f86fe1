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

SIZES = dict(vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
             intermediate_size=96, max_position_embeddings=64, pad_token_id=0)
# the DeBERTa and ModernBERT bodies' transformers classes (prefix) and the config options
# they compute
FAMILIES = {
    "deberta": ("DebertaV2", dict(
        type_vocab_size=2, relative_attention=True, position_buckets=16, pos_att_type=[
            "p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
        position_biased_input=False, layer_norm_eps=1e-7, hidden_act="gelu", legacy=False,
        max_relative_positions=-1, pooler_hidden_size=64, pooler_hidden_act="gelu")),
    "modern": ("ModernBert", dict(
        local_attention=16, global_attn_every_n_layers=3, bos_token_id=VOCAB.index("[CLS]"),
        cls_token_id=VOCAB.index("[CLS]"), eos_token_id=VOCAB.index("[SEP]"),
        sep_token_id=VOCAB.index("[SEP]"))),
}


def hf_model(body, suffix, seed, **extra):
    """A transformers ``{prefix}{suffix}`` of ``body`` with random weights."""
    import transformers

    prefix, options = FAMILIES[body]
    config = getattr(transformers, prefix + "Config")(**{**SIZES, **options, **extra})
    config.architectures = [prefix + suffix]
    model = getattr(transformers, prefix + suffix)(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # norms near 1, everything else small and random
        for name, p in model.named_parameters():
            center = 1.0 if "norm" in name.lower() and name.endswith("weight") else 0.0
            p.copy_(torch.randn(p.shape, generator=gen) * (0.1 if center else 0.05) + center)
    return model.eval()


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
