"""The names and shapes of ELECTRA's tensors on both sides: this plugin <-> Hugging Face.

* :data:`KEY_TABLE`: every parameter as (component, fairseq name, HF name, shape), with
  ``{n}`` for a layer index and ``{head}`` for a classification head's name. Expanded for a
  concrete model size (:func:`expand`) it gives the exact set of names and shapes each side
  must have; :func:`rename` turns a state dict into the other side's names in either
  direction, and a missing, unexpected or wrongly-shaped tensor is an error that names it.
* :data:`CONFIG_TABLE`: our model config field <-> HF ``ElectraConfig`` field.
* :func:`permute_rows`: HF rows follow the WordPiece ``vocab.txt``; fairseq rows follow its
  dictionary (``<s> <pad> </s> <unk>``, the vocab entries without the five BERT specials,
  then ``<mask>``), see :mod:`electra_plugin.data.wordpiece`. The rows of every tensor whose
  first dimension is the vocabulary (word embeddings, generator output bias) are permuted.

Which HF class holds which components::

    ElectraForPreTraining             discriminator + discriminator_head
    ElectraForSequenceClassification  discriminator + classification_head
    ElectraForTokenClassification     discriminator + token_head (a token_tagging head)
    ElectraForQuestionAnswering       discriminator + span_head (a SQuAD 1.1 head)
    ElectraForMultipleChoice          discriminator + choice_head (a sentence_ranking head)
    ElectraModel                      discriminator (saved without the "electra." prefix)
    ElectraForMaskedLM                generator + generator_head

No file I/O here: :mod:`electra_plugin.convert.hf_files` reads and writes the HF directories.
"""

from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import torch

from ..finetuning.kinds import HfHead as HeadKind
from ..finetuning.kinds import hf_heads
from ..user_io.errors import ElectraUsageError

__all__ = ["KEY_TABLE", "CONFIG_TABLE", "HF_ARCHITECTURES", "COMPONENT_PREFIXES", "head_kinds",
           "Param", "expand", "rename", "permute_rows", "symbols", "component_of", "head_kind",
           "head_keys"]


class Row(NamedTuple):
    component: str
    fairseq: str
    hf: str
    # Symbols: V vocabulary, E embedding size, H hidden size of that encoder, F its FFN size,
    # P positions, T token types, C classes, R relative embeddings, 3H and 2F those
    # multiples, 1 and 2 themselves. A leading V marks rows the
    # vocabulary permutes.
    shape: Tuple[str, ...]
    # "projected": only if E != H; "token_types": only if T > 0; "after_first": not layer 0
    when: Optional[str] = None


_BERT_ENCODER = [
    ("embeddings.word_embeddings.weight", ("V", "E"), None),
    ("embeddings.position_embeddings.weight", ("P", "E"), None),
    ("embeddings.token_type_embeddings.weight", ("T", "E"), "token_types"),
    ("embeddings.LayerNorm.weight", ("E",), None),
    ("embeddings.LayerNorm.bias", ("E",), None),
    ("embeddings_project.weight", ("H", "E"), "projected"),
    ("embeddings_project.bias", ("H",), "projected"),
    *((f"encoder.layer.{{n}}.{name}.{p}", shape if p == "weight" else shape[:1], None)
      for name, shape in (("attention.self.query", ("H", "H")),
                          ("attention.self.key", ("H", "H")),
                          ("attention.self.value", ("H", "H")),
                          ("attention.output.dense", ("H", "H")),
                          ("attention.output.LayerNorm", ("H",)),
                          ("intermediate.dense", ("F", "H")),
                          ("output.dense", ("H", "F")),
                          ("output.LayerNorm", ("H",)))
      for p in ("weight", "bias")),
]


def _encoder_rows(component: str, prefix: str, hf_prefix: str = "electra.",
                  rows=tuple(_BERT_ENCODER), renamed=()) -> List[Row]:
    """One encoder (embeddings, projection, layers) under ``prefix`` on the fairseq side;
    ``renamed``: (our name part, HF's) where HF's module names differ from ours."""
    out = []
    for name, shape, when in rows:
        theirs = name
        for ours, hf in renamed:
            theirs = theirs.replace(ours, hf)
        out.append(Row(component, prefix + name, hf_prefix + theirs, shape, when))
    return out


KEY_TABLE: Tuple[Row, ...] = (
    *_encoder_rows("discriminator", "discriminator."),
    Row("discriminator_head", "discriminator_head.dense.weight",
        "discriminator_predictions.dense.weight", ("H", "H")),
    Row("discriminator_head", "discriminator_head.dense.bias",
        "discriminator_predictions.dense.bias", ("H",)),
    Row("discriminator_head", "discriminator_head.dense_prediction.weight",
        "discriminator_predictions.dense_prediction.weight", ("1", "H")),
    Row("discriminator_head", "discriminator_head.dense_prediction.bias",
        "discriminator_predictions.dense_prediction.bias", ("1",)),
    *_encoder_rows("generator", "generator."),
    Row("generator_head", "generator_head.dense.weight",
        "generator_predictions.dense.weight", ("E", "H")),
    Row("generator_head", "generator_head.dense.bias", "generator_predictions.dense.bias", ("E",)),
    Row("generator_head", "generator_head.LayerNorm.weight",
        "generator_predictions.LayerNorm.weight", ("E",)),
    Row("generator_head", "generator_head.LayerNorm.bias",
        "generator_predictions.LayerNorm.bias", ("E",)),
    # The output weight is the word embedding matrix on both sides (tied), only the bias is own.
    Row("generator_head", "generator_head.bias", "generator_lm_head.bias", ("V",)),
    Row("classification_head", "classification_heads.{head}.dense.weight",
        "classifier.dense.weight", ("H", "H")),
    Row("classification_head", "classification_heads.{head}.dense.bias",
        "classifier.dense.bias", ("H",)),
    Row("classification_head", "classification_heads.{head}.out_proj.weight",
        "classifier.out_proj.weight", ("C", "H")),
    Row("classification_head", "classification_heads.{head}.out_proj.bias",
        "classifier.out_proj.bias", ("C",)),
    # the token_tagging task's head: one linear layer on every token
    Row("token_head", "classification_heads.{head}.out_proj.weight", "classifier.weight",
        ("C", "H")),
    Row("token_head", "classification_heads.{head}.out_proj.bias", "classifier.bias", ("C",)),
    # the squad task's SQuAD 1.1 head: (start, end) logits per token, start first
    Row("span_head", "classification_heads.{head}.out_proj.weight", "qa_outputs.weight",
        ("2", "H")),
    Row("span_head", "classification_heads.{head}.out_proj.bias", "qa_outputs.bias", ("2",)),
    # sentence_ranking's head (a one-class sentence head): first token -> dense -> GELU -> 1
    Row("choice_head", "classification_heads.{head}.dense.weight",
        "sequence_summary.summary.weight", ("H", "H")),
    Row("choice_head", "classification_heads.{head}.dense.bias",
        "sequence_summary.summary.bias", ("H",)),
    Row("choice_head", "classification_heads.{head}.out_proj.weight", "classifier.weight",
        ("1", "H")),
    Row("choice_head", "classification_heads.{head}.out_proj.bias", "classifier.bias", ("1",)),
)

# HF model classes and the components they hold.
HF_ARCHITECTURES = {
    "ElectraForPreTraining": ("discriminator", "discriminator_head"),
    "ElectraForSequenceClassification": ("discriminator", "classification_head"),
    "ElectraForTokenClassification": ("discriminator", "token_head"),
    "ElectraForQuestionAnswering": ("discriminator", "span_head"),
    "ElectraForMultipleChoice": ("discriminator", "choice_head"),
    "ElectraModel": ("discriminator",),
    "ElectraForMaskedLM": ("generator", "generator_head"),
}


def head_kinds() -> List[HeadKind]:
    """The heads transformers serves: the registered fine-tuning kinds' (a kind of one's own
    that declares none has no transformers class)."""
    return hf_heads()


def head_kind(task: Optional[str] = None, architecture: Optional[str] = None
              ) -> Optional[HeadKind]:
    """The head kind of a fairseq task or an HF class (of any family: the class name's
    suffix); None when no registered kind has it."""
    for kind in head_kinds():
        if task == kind.task or (architecture or "").endswith(kind.suffix):
            return kind
    return None


def head_keys(kind: HeadKind, head: str, rows: Iterable[Row] = KEY_TABLE) -> List[str]:
    """The state-dict keys a head of ``kind`` named ``head`` holds (in a family's ``rows``)."""
    return [row.fairseq.format(head=head) for row in rows if row.component == kind.component]


# fairseq state-dict prefixes of the components (classification heads: "...heads.NAME.").
COMPONENT_PREFIXES = {
    "discriminator": "discriminator.",
    "discriminator_head": "discriminator_head.",
    "generator": "generator.",
    "generator_head": "generator_head.",
    "classification_head": "classification_heads.",
}


class Param(NamedTuple):
    """One concrete tensor: its names on both sides, its shape, whether vocab rows permute."""

    fairseq: str
    hf: str
    shape: Tuple[int, ...]
    vocab_rows: bool


def expand(components: Iterable[str], sizes: Dict[str, Dict[str, int]],
           head: Optional[str] = None, rows: Iterable[Row] = KEY_TABLE) -> List[Param]:
    """The concrete parameters of ``components``; ``sizes[component]`` gives its symbols;
    ``rows``: a model family's table (default ELECTRA's)."""
    params = []
    for row in rows:
        if row.component not in components:
            continue
        s = dict(sizes[row.component], **{"1": 1, "2": 2})
        if row.when == "projected" and s["E"] == s["H"]:
            continue
        if row.when == "token_types" and s["T"] == 0:
            continue
        shape = tuple(s[d] for d in row.shape)
        for n in range(s["L"]) if "{n}" in row.fairseq else [None]:
            if row.when == "after_first" and n == 0:  # ModernBERT's first layer: no attn_norm
                continue
            params.append(Param(row.fairseq.format(n=n, head=head), row.hf.format(n=n, head=head),
                                 shape, row.shape[0] == "V"))
    return params


def rename(state: Dict[str, torch.Tensor], params: List[Param], to_hf: bool,
            where: str) -> Dict[str, torch.Tensor]:
    """Rename a state dict to the other side; every key and shape must match the table."""
    src = {(p.fairseq if to_hf else p.hf): p for p in params}
    unexpected = sorted(k for k in state if k not in src)
    missing = sorted(k for k in src if k not in state)
    wrong = [f"{k} {list(state[k].shape)} (expected {list(src[k].shape)})"
             for k in sorted(state) if k in src and tuple(state[k].shape) != src[k].shape]
    if unexpected or missing or wrong:
        problems = []
        for what, keys in (("missing", missing), ("unexpected", unexpected),
                           ("wrongly shaped", wrong)):
            if keys:
                more = f" and {len(keys) - 4} more" if len(keys) > 4 else ""
                problems.append(f"{len(keys)} {what}: {', '.join(keys[:4])}{more}")
        raise ElectraUsageError(f"{where}: weights do not match the config: "
                                f"{'; '.join(problems)}")
    return {(src[k].hf if to_hf else src[k].fairseq): v for k, v in state.items()}


def permute_rows(state: Dict[str, torch.Tensor], params: List[Param], to_hf: bool,
                  fairseq_index: Optional[torch.Tensor]) -> None:
    """In place: vocabulary rows from HF (vocab.txt) order to fairseq order or back.

    ``fairseq_index[i]`` is the fairseq row of vocab.txt row i; None keeps the order.
    """
    if fairseq_index is None:
        return
    for p in params:
        if not p.vocab_rows:
            continue
        key = p.hf if to_hf else p.fairseq
        value = state[key]
        if to_hf:
            state[key] = value[fairseq_index].contiguous()
        else:
            out = torch.empty_like(value)
            out[fairseq_index] = value
            state[key] = out


# Our model config field <-> HF ElectraConfig field (per encoder).
CONFIG_TABLE = (
    ("num_layers", "num_hidden_layers"),
    ("hidden_size", "hidden_size"),
    ("num_heads", "num_attention_heads"),
    ("ffn_size", "intermediate_size"),
    ("embedding_size", "embedding_size"),
    ("max_positions", "max_position_embeddings"),
    ("type_vocab_size", "type_vocab_size"),
    ("dropout", "hidden_dropout_prob"),
    ("attention_dropout", "attention_probs_dropout_prob"),
)


def symbols(fields: dict, vocab_size: int, num_classes: int = 0) -> Dict[str, int]:
    """The sizes the shape symbols of :data:`KEY_TABLE` stand for, from one encoder's fields."""
    return {"V": vocab_size, "E": fields["embedding_size"], "H": fields["hidden_size"],
            "F": fields["ffn_size"], "P": fields["max_positions"],
            "T": fields["type_vocab_size"], "L": fields["num_layers"], "C": num_classes,
            "3H": 3 * fields["hidden_size"], "2F": 2 * fields["ffn_size"],
            "R": 2 * fields.get("position_buckets", 256)}


def component_of(key: str) -> str:
    """The component a plugin state-dict key belongs to; an unknown key is an error."""
    for component, prefix in COMPONENT_PREFIXES.items():
        if key.startswith(prefix):
            return component
    raise ElectraUsageError(f"checkpoint key {key} belongs to no ELECTRA component")
