"""The paper's two-stage training (section 3.2): a full-size masked LM trained alone, then
frozen, with the discriminator initialised from it and trained on its samples."""

import logging

import torch

from ...user_io.errors import ElectraUsageError
from ..core.run_config import TORCH_DDP, master_copies, set_logged
from .base import register_generator_kind
from .masked_lm import MaskedLMGenerator

logger = logging.getLogger(__name__)


@register_generator_kind("two_stage")
class TwoStageGenerator(MaskedLMGenerator):
    """Stage 1 (``--two-stage-updates`` updates): the generator alone runs and learns.
    Stage 2: the discriminator, a copy of the generator, learns; the generator only samples.

    The generator has embeddings of its own: the second stage trains the discriminator's,
    and shared ones would move the frozen generator's sampling distribution with them.
    """

    reads = ("temperature", "two_stage_updates")
    embedding_sharing = ("untied",)
    binary_only = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.stage = None  # 1 or 2, read from the model's second_stage flag after each load

    def check(self, objective):
        super().check(objective)
        if self.cfg.get("two_stage_updates", 0) <= 0:
            raise ElectraUsageError(
                "--generator two_stage trains the generator alone for --two-stage-updates "
                "updates first; give --two-stage-updates N (N > 0)")

    def complete_run(self, run):
        if master_copies(run):  # before anything is written into --save-dir
            raise ElectraUsageError(
                "--generator two_stage copies the generator into the discriminator in place, "
                "which the separate fp32 master weights of --fp16/--bf16 would undo; use --amp "
                "or --memory-efficient-fp16 (--autocast-bf16 or --memory-efficient-bf16 for "
                "bf16)")
        distributed = run.get("distributed_training", {})
        if distributed.get("distributed_world_size", 1) > 1 and \
                distributed.get("ddp_backend") in TORCH_DDP and \
                not distributed.get("find_unused_parameters"):
            # each stage leaves the other part without gradient, which torch's DDP only
            # allows when it looks for unused parameters
            set_logged(distributed, "find_unused_parameters", True,
                       "--generator two_stage under --ddp-backend c10d: "
                       "--find-unused-parameters, since each stage trains one of the "
                       "generator and the discriminator")

    def size(self):
        return self.disc_size()  # the discriminator starts as a copy of it

    def build(self, model, dictionary, shared_embeddings):
        super().build(model, dictionary, shared_embeddings)
        # saved with checkpoints, so a resumed run knows the discriminator was initialised
        model.register_buffer("second_stage", torch.zeros((), dtype=torch.bool))

    def current_stage(self, model) -> int:
        """Read from the device once after each load, not at every step (a host sync)."""
        if self.stage is None:
            self.stage = 2 if bool(model.second_stage) else 1
        return self.stage

    def before_step(self, model):
        self.current_stage(model)

    def trains(self, model):
        return self.current_stage(model) == 1

    def runs_discriminator(self, model):
        return self.current_stage(model) == 2

    def set_num_updates(self, model, num_updates):
        """At the switch, initialise the discriminator from the generator."""
        if self.current_stage(model) == 1 and num_updates >= self.cfg.two_stage_updates:
            model.discriminator.load_state_dict(model.generator.state_dict())
            model.second_stage.fill_(True)
            self.stage = 2
            logger.info(f"update {num_updates}: discriminator initialised from the generator, "
                        f"which is frozen from now on")

    def loaded(self, model):
        self.stage = None  # the checkpoint's second_stage flag decides

    def resting_parameters(self, model):
        """The part the current stage does not train. The task drops their gradients before
        each update: the step gives them none, but fairseq's legacy DDP fills in zeros, and
        Adam would then move them anyway (weight decay, momentum). requires_grad stays on:
        fairseq builds its optimizer from the parameters that require gradients, and a
        resumed run must find the same ones."""
        parts = (model.discriminator, model.discriminator_head) \
            if self.current_stage(model) == 1 else (model.generator, model.generator_head)
        return [p for part in parts for p in part.parameters()]
