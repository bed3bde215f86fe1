"""The transformers model family that serves each encoder body: its classes, its tensor names
and its config, and the config options the body does not implement (refused on import).

=========  ===========  ====================================================================
body       model_type   classes
=========  ===========  ====================================================================
bert       electra      Electra{Model, ForPreTraining, ForMaskedLM, ForSequenceClassification,
                        ForTokenClassification, ForQuestionAnswering, ForMultipleChoice}
deberta    deberta-v2   DebertaV2{Model, ForMaskedLM, ForSequenceClassification,
                        ForTokenClassification, ForQuestionAnswering, ForMultipleChoice}
modern     modernbert   ModernBert{Model, ForMaskedLM, ForSequenceClassification,
                        ForTokenClassification, ForQuestionAnswering, ForMultipleChoice}
=========  ===========  ====================================================================

No DeBERTa or ModernBERT class holds the replaced-token head: it stays in the fairseq
checkpoint, and the discriminator leaves as the family's base model. ModernBERT's task heads
put a dense layer and a norm (``head``) before their classifier: the modern body's heads have
them too (the body's ``head_transform``).
"""

import math
from typing import Callable, Dict, Tuple

from ..environment.optional import require
from ..models.core.encoder import LAYER_NORM_EPS
from ..user_io.errors import ElectraUsageError
from .keys import (_BERT_ENCODER, CONFIG_TABLE, KEY_TABLE, HeadKind, Row, _encoder_rows,
                   head_kinds)

# the components each class suffix holds (and each fine-tuning kind's head class its head)
CLASS_COMPONENTS = {
    "Model": ("discriminator",),
    "ForPreTraining": ("discriminator", "discriminator_head"),
    "ForMaskedLM": ("generator", "generator_head"),
}


def class_components() -> Dict[str, Tuple[str, ...]]:
    return {**CLASS_COMPONENTS, **{kind.suffix: ("discriminator", kind.component)
                                   for kind in head_kinds()}}


class Family:
    """The transformers side of one encoder body: its classes (``prefix`` + suffix), the base
    model's attribute in them (``base``, with its dot), the tensor rows, the config fields
    both ways and what the config must say for the body to compute it. A body of one's own
    (a ``--user-dir`` module) gets a transformers family by registering one
    (:func:`register_family`); without one its checkpoints stay fairseq checkpoints."""

    always_token_types = False  # the HF embeddings hold a token type table even with none
    projects_embeddings = False  # the HF classes have a slot for an embedding projection
    pools_mean = False  # the HF task heads can read the mean of the tokens
    names_special_ids = True  # the HF config names the start and separator ids

    def __init__(self, body: str, model_type: str, prefix: str, base: str,
                 rows: Tuple[Row, ...], config_table: Tuple[Tuple[str, str], ...],
                 fixed: Dict[str, object], tied_output: Tuple[str, str]):
        self.body, self.model_type, self.prefix, self.base = body, model_type, prefix, base
        self.rows, self.config_table, self.fixed = rows, config_table, fixed
        self.tied_output = tied_output  # (the generator's output layer, the table it ties to)

    @property
    def architectures(self) -> Dict[str, Tuple[str, ...]]:
        present = {row.component for row in self.rows}
        return {self.prefix + suffix: components for suffix, components in
                class_components().items() if set(components) <= present}

    def head_architecture(self, kind: HeadKind) -> str:
        return self.prefix + kind.suffix

    @property
    def pretraining_class(self) -> str:
        """The class a pre-training checkpoint's discriminator leaves as: with the replaced
        token head where the family has a class for it, else the base model."""
        with_head = self.prefix + "ForPreTraining"
        return with_head if with_head in self.architectures else self.prefix + "Model"

    def config_class(self):
        return getattr(require("converting to or from Hugging Face transformers"),
                       self.prefix + "Config")

    def check_config(self, config: dict, path: str) -> dict:
        """``config`` (a transformers ``to_dict()``) if the body computes what it describes;
        the first option it does not implement is refused in one line, naming it."""
        for name, value in self.fixed.items():
            theirs = config.get(name, value)
            same = math.isclose(float(theirs), float(value), rel_tol=1e-6) if \
                isinstance(value, float) else (sorted(theirs) == sorted(value) if
                                               isinstance(value, list) else theirs == value)
            if not same and name not in WRITTEN_ONLY:
                raise ElectraUsageError(f"{path}: {name} {theirs!r} is not supported; the "
                                        f"plugin's {self.body} body computes {name} {value!r}")
        if config["hidden_size"] % config["num_attention_heads"]:
            raise ElectraUsageError(f"{path}: hidden_size {config['hidden_size']} is not "
                                    f"divisible by num_attention_heads "
                                    f"{config['num_attention_heads']}")
        return config

    def fields_from_hf(self, config: dict) -> dict:
        """The plugin's model fields of one encoder's HF config."""
        fields = {ours: config[theirs] for ours, theirs in self.config_table}
        if not self.projects_embeddings:  # the embeddings are as wide as the layers
            fields["embedding_size"] = fields["hidden_size"]
        return fields

    def hf_config_values(self, fields: dict) -> dict:
        """The HF config's fields of one encoder."""
        return dict({theirs: fields[ours] for ours, theirs in self.config_table}, **self.fixed)

    def head_config(self, architecture: str, cfg) -> dict:
        """Config fields the head class ``architecture`` reads (none by default)."""
        return {}


_SHARED_FIELDS = (("num_layers", "num_hidden_layers"), ("hidden_size", "hidden_size"),
                  ("num_heads", "num_attention_heads"), ("ffn_size", "intermediate_size"),
                  ("max_positions", "max_position_embeddings"))

class BertFamily(Family):
    always_token_types = True
    projects_embeddings = True
    names_special_ids = False

    def check_config(self, config, path):
        act, eps = self.fixed["hidden_act"], self.fixed["layer_norm_eps"]
        if config["hidden_act"] != act:
            raise ElectraUsageError(f"{path}: hidden_act '{config['hidden_act']}' is not "
                                    f"supported; the plugin's ELECTRA uses '{act}' (exact GELU)")
        if not math.isclose(float(config["layer_norm_eps"]), eps, rel_tol=1e-6):
            raise ElectraUsageError(f"{path}: layer_norm_eps {config['layer_norm_eps']} is not "
                                    f"supported; the plugin's ELECTRA uses {eps}")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ElectraUsageError(f"{path}: position_embedding_type "
                                    f"'{config['position_embedding_type']}' is not supported "
                                    f"(only 'absolute')")
        return super().check_config(config, path)

    def head_config(self, architecture, cfg):
        """ELECTRA's multiple-choice summary is the sentence_ranking head (first token,
        dense, GELU, dropout, one logit)."""
        if architecture == self.prefix + "ForMultipleChoice":
            return dict(summary_type="first", summary_use_proj=True, summary_activation="gelu",
                        summary_last_dropout=cfg.dropout)
        return {}


_SHARED_FIELDS = (("num_layers", "num_hidden_layers"), ("hidden_size", "hidden_size"),
                  ("num_heads", "num_attention_heads"), ("ffn_size", "intermediate_size"),
                  ("max_positions", "max_position_embeddings"))

BERT = BertFamily("bert", "electra", "Electra", "electra.", KEY_TABLE, CONFIG_TABLE,
                  dict(hidden_act="gelu", layer_norm_eps=LAYER_NORM_EPS),
                  ("generator_lm_head.weight", "electra.embeddings.word_embeddings.weight"))


def _deberta_encoder(component, prefix):
    rows = [(name.replace("self.query.", "self.query_proj.").replace(
        "self.key.", "self.key_proj.").replace("self.value.", "self.value_proj."), shape, when)
        for name, shape, when in _BERT_ENCODER
        if "position_embeddings" not in name and when != "projected"]
    rows += [("encoder.rel_embeddings.weight", ("R", "H"), None),
             ("encoder.LayerNorm.weight", ("H",), None), ("encoder.LayerNorm.bias", ("H",), None)]
    return _encoder_rows(component, prefix, "deberta.", rows)  # the plugin's names are HF's


def _head_rows(component, rows):
    """(our part, HF name, shape) of a head, for every parameter."""
    return [Row(component, f"{ours}.{p}" if ours.startswith("generator_head") else
                f"classification_heads.{{head}}.{ours}.{p}", f"{theirs}.{p}",
                shape if p == "weight" else shape[:1])
            for ours, theirs, shape, parts in rows for p in parts]


class DebertaFamily(Family):
    def check_config(self, config, path):
        if config.get("embedding_size", config["hidden_size"]) != config["hidden_size"]:
            raise ElectraUsageError(f"{path}: embedding_size {config['embedding_size']} differs "
                                    f"from hidden_size; DeBERTa's embedding projection is not "
                                    f"supported")
        return super().check_config(config, path)

    def hf_config_values(self, fields):
        return dict(super().hf_config_values(fields), pooler_hidden_size=fields["hidden_size"],
                    pooler_dropout=fields["dropout"])


_WB = ("weight", "bias")
DEBERTA = DebertaFamily("deberta", "deberta-v2", "DebertaV2", "deberta.", (
    *_deberta_encoder("discriminator", "discriminator."),
    *_deberta_encoder("generator", "generator."),
    *_head_rows("generator_head", [
        ("generator_head.dense", "lm_predictions.lm_head.dense", ("E", "H"), _WB),
        ("generator_head.LayerNorm", "lm_predictions.lm_head.LayerNorm", ("E",), _WB)]),
    Row("generator_head", "generator_head.bias", "lm_predictions.lm_head.bias", ("V",)),
    *_head_rows("classification_head", [("dense", "pooler.dense", ("H", "H"), _WB),
                                        ("out_proj", "classifier", ("C", "H"), _WB)]),
    *_head_rows("token_head", [("out_proj", "classifier", ("C", "H"), _WB)]),
    *_head_rows("span_head", [("out_proj", "qa_outputs", ("2", "H"), _WB)]),
    *_head_rows("choice_head", [("dense", "pooler.dense", ("H", "H"), _WB),
                                ("out_proj", "classifier", ("1", "H"), _WB)]),
), (*_SHARED_FIELDS, ("type_vocab_size", "type_vocab_size"), ("dropout", "hidden_dropout_prob"),
    ("attention_dropout", "attention_probs_dropout_prob"),
    ("position_buckets", "position_buckets")),
    dict(hidden_act="gelu", layer_norm_eps=1e-7, relative_attention=True,
         max_relative_positions=-1, pos_att_type=["p2c", "c2p"], share_att_key=True,
         norm_rel_ebd="layer_norm", position_biased_input=False, conv_kernel_size=0,
         legacy=False, pooler_hidden_act="gelu"),
    ("lm_predictions.lm_head.decoder.weight", "deberta.embeddings.word_embeddings.weight"))


def _modern_encoder(component, prefix):
    rows = [("embeddings.word_embeddings.weight", ("V", "E"), None),
            ("embeddings.norm.weight", ("E",), None),
            ("encoder.layer.{n}.attn_norm.weight", ("H",), "after_first"),
            ("encoder.layer.{n}.attn.Wqkv.weight", ("3H", "H"), None),
            ("encoder.layer.{n}.attn.Wo.weight", ("H", "H"), None),
            ("encoder.layer.{n}.mlp_norm.weight", ("H",), None),
            ("encoder.layer.{n}.mlp.Wi.weight", ("2F", "H"), None),
            ("encoder.layer.{n}.mlp.Wo.weight", ("H", "F"), None),
            ("final_norm.weight", ("H",), None)]
    return _encoder_rows(component, prefix, "model.", rows, renamed=(
        ("word_embeddings", "tok_embeddings"), ("encoder.layer.", "layers.")))


def _rope_theta(config: dict, kind: str, old: str):
    """transformers 5 keeps ModernBERT's thetas in rope_parameters, older ones flat."""
    params = (config.get("rope_parameters") or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default":
        return None
    return params.get("rope_theta", config.get(old))


class ModernFamily(Family):
    pools_mean = True

    def check_config(self, config, path):
        every = config["global_attn_every_n_layers"]
        expected = ["sliding_attention" if i % every else "full_attention"
                    for i in range(config["num_hidden_layers"])]
        layer_types = config.get("layer_types") or expected
        thetas = dict(global_rope_theta=_rope_theta(config, "full_attention",
                                                    "global_rope_theta"),
                      local_rope_theta=_rope_theta(config, "sliding_attention",
                                                   "local_rope_theta"))
        for name, value, needs in (
                ("layer_types", layer_types, f"global attention every {every} layers from "
                 f"the first" if layer_types != expected else None),
                ("local_attention", config["local_attention"],
                 f"a window no wider than max_position_embeddings "
                 f"{config['max_position_embeddings']}" if config["local_attention"] >
                 config["max_position_embeddings"] else None),
                ("rope_parameters", config.get("rope_parameters"),
                 "the default RoPE, no scaling" if None in thetas.values() else None)):
            if needs:
                raise ElectraUsageError(f"{path}: {name} {value!r} is not supported; the "
                                        f"plugin's modern body needs {needs}")
        return super().check_config(dict(config, **thetas), path)

    def fields_from_hf(self, config):
        return dict(super().fields_from_hf(config), type_vocab_size=0)

    def head_config(self, architecture, cfg):
        """ModernBERT's heads pool as the plugin's head does (first token or mean)."""
        return dict(classifier_pooling="mean" if cfg.get("classifier_pooling") == "mean"
                    else "cls", classifier_dropout=cfg.dropout)


MODERN = ModernFamily("modern", "modernbert", "ModernBert", "model.", (
    *_modern_encoder("discriminator", "discriminator."),
    *_modern_encoder("generator", "generator."),
    Row("generator_head", "generator_head.dense.weight", "head.dense.weight", ("E", "H")),
    Row("generator_head", "generator_head.LayerNorm.weight", "head.norm.weight", ("E",)),
    Row("generator_head", "generator_head.bias", "decoder.bias", ("V",)),
    # the task heads: the body's transform (HF's ``head``), then the classifier
    *(row for component, out in (("classification_head", "C"), ("token_head", "C"),
                                 ("span_head", "2"), ("choice_head", "1"))
      for row in _head_rows(component, [
          ("transform.dense", "head.dense", ("H", "H"), ("weight",)),
          ("transform.norm", "head.norm", ("H",), ("weight",)),
          ("out_proj", "classifier", (out, "H"), _WB)])),
), (*_SHARED_FIELDS, ("dropout", "embedding_dropout"), ("dropout", "mlp_dropout"),
    ("attention_dropout", "attention_dropout"),
    ("global_attn_every_n_layers", "global_attn_every_n_layers"),
    ("local_attention", "local_attention"), ("global_rope_theta", "global_rope_theta"),
    ("local_rope_theta", "local_rope_theta")),
    dict(hidden_activation="gelu", norm_eps=1e-5, norm_bias=False, attention_bias=False,
         mlp_bias=False, decoder_bias=True, classifier_bias=False, tie_word_embeddings=True,
         classifier_activation="gelu"),
    ("decoder.weight", "model.embeddings.tok_embeddings.weight"))

WRITTEN_ONLY = ("legacy",)  # read either way (LEGACY_NAMES), written as the newer layout
FAMILIES: Dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """``family`` serves ``--encoder-body family.body`` in electra-convert (the built-in
    bodies' below; a ``--user-dir`` body's from its own module)."""
    FAMILIES[family.body] = family
    return family


for _family in (BERT, DEBERTA, MODERN):
    register_family(_family)


def family_of_body(body: str, where: str) -> Family:
    """The transformers family of ``--encoder-body body``; a body without one is refused in
    one line, naming ``where`` (its checkpoints are fairseq's alone)."""
    if body not in FAMILIES:
        raise ElectraUsageError(
            f"{where}: --encoder-body {body} has no transformers family (electra-convert converts "
            f"{', '.join(FAMILIES)}); keep the fairseq checkpoint, or register a family for "
            f"the body (electra_plugin.convert.families.register_family)")
    return FAMILIES[body]


def family_of_model_type(model_type, path: str) -> Family:
    for family in FAMILIES.values():
        if family.model_type == model_type:
            return family
    raise ElectraUsageError(
        f"{path} describes a '{model_type}' model; the conversion reads "
        f"{', '.join(f.model_type for f in FAMILIES.values())} (ELECTRA, DeBERTa-v2/v3, "
        f"ModernBERT)")


# transformers' older DeBERTa masked-LM layout (``legacy``) -> today's names
LEGACY_NAMES: Callable[[str], str] = lambda key: key.replace(  # noqa: E731
    "cls.predictions.transform.", "lm_predictions.lm_head.").replace(
    "cls.predictions.bias", "lm_predictions.lm_head.bias").replace(
    "cls.predictions.decoder.", "lm_predictions.lm_head.decoder.")
