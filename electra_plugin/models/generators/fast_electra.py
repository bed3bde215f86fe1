"""Fast-ELECTRA (Dong et al., ICLR 2024): an existing masked LM as the generator, frozen, its
output smoothed by a temperature that decays over training.

No generator is trained, so its backward pass, its optimizer state and its gradient
all-reduce are gone; the curriculum that joint training gave (a generator that starts weak
and improves) comes from the temperature instead: a high one flattens the distribution into
easy-to-spot replacements, and it descends to ``--temperature`` over
``--temperature-decay-updates``.
"""

import math

import torch
from omegaconf import open_dict

from ...user_io.errors import ElectraUsageError
from ..core.checkpoint import load_checkpoint
from ..core.config import complete_config, discriminator_size, scaled_size
from ..objectives import objective_named
from .base import frozen, generator_kind, register_generator_kind
from .masked_lm import MaskedLMGenerator

# where a checkpoint keeps a masked LM: (encoder prefix, head prefix), generator first
MASKED_LM_PARTS = (("generator.", "generator_head."), ("discriminator.", "mlm_head."))


@register_generator_kind("fast_electra")
class FastElectraGenerator(MaskedLMGenerator):
    reads = ("generator_size", "generator_layers", "temperature", "generator_checkpoint",
             "temperature_start", "temperature_decay_updates", "temperature_schedule")
    embedding_sharing = ("untied",)
    logged_means = ("gen_loss", "gen_temperature")

    def __init__(self, cfg):
        super().__init__(cfg)
        self.updates = 0
        self.ready = None  # whether the model holds the masked LM's weights; read once
        self.held = None  # this update's temperature, a 0-d tensor on the model's device
        self.sampled_at = None  # what this update's step samples at (before_step)

    def check(self, objective):
        super().check(objective)
        cfg = self.cfg
        if not cfg.get("generator_checkpoint", None):
            raise ElectraUsageError("--generator fast_electra samples from an existing masked "
                                    "LM; give it with --generator-checkpoint PATH")
        if cfg.temperature_decay_updates < 0 or min(cfg.temperature,
                                                    cfg.temperature_start) < 0:
            raise ElectraUsageError("--temperature, --temperature-start and "
                                    "--temperature-decay-updates must not be negative")
        if cfg.get("generator_size", None) is None:  # a checkpoint of this run records it
            size = self.source_size(self.read_source()[0])
            with open_dict(cfg):
                cfg.generator_size, cfg.generator_layers = self.fractions(size)

    def read_source(self):
        """-> (the masked LM checkpoint's completed model config, its weights)."""
        path = self.cfg.generator_checkpoint
        state = load_checkpoint(path)
        source = complete_config(state["cfg"].model)
        for field in ("max_positions", "type_vocab_size", "embedding_size"):
            if source[field] != self.cfg[field]:
                raise ElectraUsageError(
                    f"--generator-checkpoint {path} has {field} {source[field]}, this model "
                    f"{self.cfg[field]}; the generator reads the same inputs, so they must "
                    f"agree")
        return source, state["model"]

    def source_size(self, source):
        if not objective_named(source.objective).corrupts:  # BERT's: the network is the LM
            return discriminator_size(source)
        kind = generator_kind(source.generator)
        size = None if kind.cloze else kind(source).size()  # a cloze model is no masked LM
        if size is None:
            raise ElectraUsageError(
                f"--generator-checkpoint {self.cfg.generator_checkpoint} has no masked LM "
                f"(its generator is {source.generator}); give an electra or --objective mlm "
                f"checkpoint")
        return size

    def fractions(self, size):
        """(generator_size, generator_layers) that give ``size`` under this discriminator."""
        disc = self.disc_size()
        fractions = size.hidden / disc.hidden, size.layers / disc.layers
        if size.heads * disc.hidden != size.hidden * disc.heads or \
                size.layers > disc.layers or size.hidden > disc.hidden or \
                scaled_size(disc, *fractions) != size:
            raise ElectraUsageError(
                f"the masked LM of --generator-checkpoint {self.cfg.generator_checkpoint} "
                f"({size.layers} layers, hidden {size.hidden}, {size.heads} heads, FFN "
                f"{size.ffn}) is not a generator of this discriminator's shape: a generator "
                f"keeps its head size and FFN ratio, at most its depth and width")
        return fractions

    def size(self):
        return scaled_size(self.disc_size(), self.cfg.generator_size,
                           self.cfg.generator_layers)

    def build(self, model, dictionary, shared_embeddings):
        super().build(model, dictionary, shared_embeddings)
        frozen(model.generator)
        frozen(model.generator_head)
        # saved with checkpoints: a resumed run has the weights and needs no file
        model.register_buffer("generator_loaded", torch.zeros((), dtype=torch.bool))

    def trains(self, model):
        return False

    def set_num_updates(self, model, num_updates):
        self.updates = num_updates
        self.held = self.sampled_at = None  # before_step sets this update's
        self.load_weights(model)

    def loaded(self, model):
        self.ready = None

    def before_step(self, model):
        self.load_weights(model)
        temperature = self.temperature()
        # a tensor of its own each update: logged (a compiled step's logs are tensors, and
        # the logs of several updates wait for --log-interval)
        self.held = torch.full((), temperature, device=model.generator_loaded.device)
        decaying = self.updates < self.cfg.temperature_decay_updates
        # a new value every update, read as a tensor; 0 (the argmax) and the final value:
        # numbers
        self.sampled_at = self.held if decaying and temperature > 0 else temperature

    def sampling_temperature(self):
        # (a step called without the model's forward, which runs before_step: the number)
        return self.temperature() if self.sampled_at is None else self.sampled_at

    def propose(self, model, src_tokens, layout, positions, token_types=None):
        self.load_weights(model)
        return super().propose(model, src_tokens, layout, positions, token_types)

    def loss(self, model, out, per_token):
        loss, logs = super().loss(model, out, per_token)
        # the schedule, in every log line
        logs["gen_temperature"] = self.temperature() if self.held is None else self.held
        return loss, logs

    def load_weights(self, model):
        """The masked LM's weights into the generator, once per run (not on resume)."""
        if self.ready is None:
            self.ready = bool(model.generator_loaded)
        if self.ready:
            return
        source, weights = self.read_source()
        if self.source_size(source) != self.size():
            raise ElectraUsageError(
                f"--generator-checkpoint {self.cfg.generator_checkpoint} holds another masked "
                f"LM than this run was started with (--generator-size/--generator-layers); "
                f"give the checkpoint the run started from")
        encoder, head = next(parts for parts in MASKED_LM_PARTS
                             if any(k.startswith(parts[1]) for k in weights))
        for module, prefix in ((model.generator, encoder), (model.generator_head, head)):
            part = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
            rows = part.get("embeddings.word_embeddings.weight", part.get("bias"))
            if rows is not None and rows.shape[0] != model.generator_head.bias.shape[0]:
                raise ElectraUsageError(
                    f"--generator-checkpoint {self.cfg.generator_checkpoint} has a vocabulary "
                    f"of {rows.shape[0]} entries, this data's dictionary "
                    f"{model.generator_head.bias.shape[0]}; use a masked LM trained on the "
                    f"same dict.txt")
            with torch.no_grad():
                module.load_state_dict(part)
        model.generator_loaded.fill_(True)
        self.ready = True

    def temperature(self):
        """``--temperature-start`` at update 0, descending to ``--temperature`` at
        ``--temperature-decay-updates`` (linearly or along a half cosine), then constant."""
        cfg = self.cfg
        if self.updates >= cfg.temperature_decay_updates:
            return cfg.temperature
        progress = self.updates / cfg.temperature_decay_updates
        remaining = 0.5 * (1 + math.cos(math.pi * progress)) \
            if cfg.temperature_schedule == "cosine" else 1 - progress
        return cfg.temperature + (cfg.temperature_start - cfg.temperature) * remaining
