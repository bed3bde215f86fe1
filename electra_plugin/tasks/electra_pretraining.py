"""The ``electra`` task: fairseq-binarized text -> masked blocks for replaced token detection."""

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq import metrics, utils
from fairseq.data import (
    Dictionary,
    PrependTokenDataset,
    TokenBlockDataset,
    data_utils,
)
from fairseq.data.shorten_dataset import maybe_shorten_dataset
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.optim.amp_optimizer import AMPOptimizer
from fairseq.optim.fp16_optimizer import FP16Optimizer, MemoryEfficientFP16Optimizer
from fairseq.tasks import FairseqTask, register_task
from fairseq.tasks.language_modeling import SHORTEN_METHOD_CHOICES
from omegaconf import II, MISSING
from torch.profiler import record_function

from ..data.dictionary import MASK_SYMBOL, load_dictionary
from ..data.masking import ElectraMaskingDataset, word_starts
from ..data.segment_pairs import SegmentPairDataset
from ..data.shuffle import EpochShuffleDataset
from ..models.core.run_config import complete_global_batch
from ..optim.amp import optimizer_step
from ..speed import COMPILE_BACKENDS, PretrainingSpeed
from ..user_io.errors import ElectraUsageError

logger = logging.getLogger(__name__)
SEGMENT_PAIRS = "segment_pairs"
SAMPLE_BREAK_MODE_CHOICES = ChoiceEnum(["none", "complete", "complete_doc", "eos",
                                        SEGMENT_PAIRS])


@dataclass
class ElectraPretrainingConfig(FairseqDataclass):
    data: str = field(
        default=MISSING,
        metadata={"help": "directory of fairseq-preprocess --only-source output (dict.txt, "
                          "train.bin/idx, valid.bin/idx); colon-separated directories are "
                          "used in turn, one per epoch"})
    sample_break_mode: SAMPLE_BREAK_MODE_CHOICES = field(
        default="none",
        metadata={"help": "how text is cut into samples: 'segment_pairs' as the official "
                          "builder, <s> A </s> B </s> from whole lines of one document, token "
                          "type 1 on B (needs --segment-token-types; one example in ten has "
                          "one segment, one in twenty a shorter length; data/segment_pairs.py)"
                          "; 'none' fills every "
                          "sample with tokens_per_sample tokens across sentence ends; "
                          "'complete' ends samples at sentence ends; 'complete_doc' also at "
                          "document ends (empty lines); 'eos' one sentence per sample"})
    tokens_per_sample: int = field(
        default=512, metadata={"help": "tokens per sample, <s> included (official: 128 for "
                                       "Small, 512 for Base and Large)"})
    mask_prob: float = field(
        default=0.15, metadata={"help": "fraction of the non-special tokens picked for the "
                                        "generator to fill (official: 0.15, 0.25 for Large)"})
    leave_unmasked_prob: float = field(
        default=0.15, metadata={"help": "fraction of the picked tokens left unchanged instead "
                                        "of replaced by <mask> (official: 0.15)"})
    random_token_prob: float = field(
        default=0.0, metadata={"help": "fraction of the picked tokens replaced by a random "
                                       "token (official: 0; BERT, for --objective mlm: 0.1 "
                                       "with --leave-unmasked-prob 0.1)"})
    whole_word_mask: bool = field(
        default=False, metadata={"help": "pick whole words, all their pieces, instead of single "
                                         "pieces (same number of picked tokens); words are "
                                         "read from dict.txt: WordPiece '##' pieces continue "
                                         "a word, sentencepiece '\u2581' pieces begin one"})
    shorten_method: SHORTEN_METHOD_CHOICES = field(
        default="none", metadata={"help": "if not none, shorten sentences longer than "
                                          "tokens_per_sample ('truncate' or 'random_crop')"})
    shorten_data_split_list: str = field(
        default="", metadata={"help": "comma-separated splits to shorten (default: all)"})
    skip_nonfinite_updates: int = field(
        default=0, metadata={"help": "skip up to this many updates whose gradients are "
                                     "NaN/Inf (each logged) before stopping as diverged; "
                                     "0: stop at the first"})
    release_cpu_memory: bool = field(
        default=False, metadata={"help": "on CPU, let glibc return freed memory to the OS "
                                         "after each update as it does by default; without "
                                         "this flag the task keeps it in the process, which "
                                         "saves tens of thousands of page faults per update "
                                         "(about a tenth faster on 2 cores) but holds the "
                                         "peak memory"})
    autocast_bf16: bool = field(
        default=False, metadata={"help": "compute in bf16 under torch.autocast (CPU and CUDA) "
                                         "while the weights, gradients and optimizer stay "
                                         "fp32; no loss scaling. Unlike --bf16, which keeps "
                                         "the weights themselves in bf16. Faster than fp32 "
                                         "only where the CPU or GPU has bf16 matrix units "
                                         "(AMX, avx512_bf16, Ampere or later)"})
    torch_compile: ChoiceEnum(COMPILE_BACKENDS) = field(  # type: ignore
        default="off", metadata={"help": "torch.compile each encoder (embeddings and "
                                         "Transformer layers) with this backend: inductor "
                                         "(generated kernels; for GPUs, and CPUs with a C++ "
                                         "compiler) or aot_eager (no code generation, to "
                                         "check a setting); batches of any size, length, "
                                         "masked count reuse the graphs; off: eager"})
    graphed_step: bool = field(
        default=False, metadata={"help": "run the whole pre-training step (generator, "
                                         "sampling, discriminator, losses; forward and "
                                         "backward) as one torch.compile graph "
                                         "(fullgraph; on a GPU replayed as CUDA "
                                         "graphs, ELECTRA_SPEED=-cudagraphs: not); "
                                         "with the --torch-compile backend (inductor when "
                                         "off); a configuration that cannot compile whole "
                                         "runs eager, said in one log line"})
    global_batch_size: int = field(
        default=0, metadata={"help": "sequences per update over all GPUs (official: 128 "
                                     "Small, 256 Base, 2048 Large); sets --update-freq to "
                                     "this / (--batch-size x GPUs), which must divide evenly, "
                                     "so a recipe gives the same batch on any number of "
                                     "GPUs; 0: --update-freq as given"})
    no_tf32: bool = field(
        default=False, metadata={"help": "on CUDA, keep fp32 matrix products in full fp32; "
                                         "by default they use TF32 on Ampere and later GPUs "
                                         "(fp32 range, 10-bit mantissa inputs, fp32 "
                                         "accumulation), several times faster, like the "
                                         "TPUs' default precision the official runs had"})
    seed: int = II("common.seed")


@register_task("electra", dataclass=ElectraPretrainingConfig)
class ElectraPretrainingTask(FairseqTask):
    """Replaced token detection pre-training.

    A batch holds ``net_input.src_tokens`` (B x T, the masked input) and ``target`` (B x T,
    the original token at picked positions, ``<pad>`` elsewhere), the same layout as
    fairseq's ``masked_lm``, plus ``net_input.masked_positions`` and ``has_padding``
    (:class:`~electra_plugin.data.masking.ElectraMaskingDataset` masks each batch as the
    loader collates it); the model builds the corrupted input itself.
    """

    cfg: ElectraPretrainingConfig
    # read by ElectraModel.build_model: with this task it builds generator and heads too
    builds_pretraining_model = True

    def __init__(self, cfg: ElectraPretrainingConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.device_set = False  # process-wide settings for the training device, at step 1
        self.speed = PretrainingSpeed(cfg.graphed_step, str(cfg.torch_compile),
                                      keep_cpu_memory=not cfg.release_cpu_memory)
        if not 0 < cfg.mask_prob < 1:
            raise ElectraUsageError(f"--mask-prob {cfg.mask_prob:g} is not a fraction in (0, 1)")
        if min(cfg.leave_unmasked_prob, cfg.random_token_prob) < 0 or \
                cfg.leave_unmasked_prob + cfg.random_token_prob > 1:
            raise ElectraUsageError(
                f"--leave-unmasked-prob {cfg.leave_unmasked_prob:g} and --random-token-prob "
                f"{cfg.random_token_prob:g} must be fractions that add up to at most 1")
        self.dictionary = dictionary
        self.flops_counter = None  # the model's, once built: reduce_metrics adds to it
        # Same dictionary as fairseq's sentence_prediction builds from the same dict.txt.
        self.mask_idx = dictionary.add_symbol(MASK_SYMBOL)
        self.word_starts = word_starts(dictionary) if cfg.whole_word_mask else None

    @classmethod
    def setup_task(cls, cfg: ElectraPretrainingConfig, **kwargs):
        complete_global_batch(cfg)
        return cls(cfg, load_dictionary(utils.split_paths(cfg.data)[0]))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        data_path = paths[(epoch - 1) % len(paths)]
        dataset = load_split(data_path, split, self.dictionary, combine)
        room = self.cfg.tokens_per_sample - 1  # for <s>
        dataset = maybe_shorten_dataset(
            dataset, split, self.cfg.shorten_data_split_list, self.cfg.shorten_method, room,
            self.cfg.seed)
        if self.cfg.sample_break_mode == SEGMENT_PAIRS:  # <s> A </s> B </s>, with its <s>
            dataset = SegmentPairDataset(dataset, self.cfg.tokens_per_sample,
                                         self.dictionary.bos(), self.dictionary.eos(),
                                         self.cfg.seed)
        elif self.cfg.sample_break_mode != "eos":  # eos: every sentence is a block already
            # (fairseq's eos path also calls numpy's removed np.compat)
            dataset = TokenBlockDataset(
                dataset, dataset.sizes, room, pad=self.dictionary.pad(),
                eos=self.dictionary.eos(), break_mode=self.cfg.sample_break_mode)
        if self.cfg.sample_break_mode != SEGMENT_PAIRS and len(dataset) and \
                dataset.sizes.max() > room:
            raise ElectraUsageError(
                f"{split} has a sentence of {dataset.sizes.max()} tokens, longer than "
                f"--tokens-per-sample {self.cfg.tokens_per_sample}; add --shorten-method "
                f"truncate or use --sample-break-mode none")
        if self.cfg.sample_break_mode != SEGMENT_PAIRS:
            dataset = PrependTokenDataset(dataset, self.dictionary.bos())
        logger.info(f"loaded {len(dataset)} blocks from {os.path.join(data_path, split)}")

        dataset = ElectraMaskingDataset(
            dataset, self.dictionary, self.mask_idx, seed=self.cfg.seed,
            mask_prob=self.cfg.mask_prob, leave_unmasked_prob=self.cfg.leave_unmasked_prob,
            random_token_prob=self.cfg.random_token_prob, word_starts=self.word_starts,
            pad_to_multiple=length_bucket(self.cfg), max_length=self.cfg.tokens_per_sample)
        self.datasets[split] = EpochShuffleDataset(dataset, dataset.sizes, self.cfg.seed)

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        self.flops_counter = model.flops_counter
        self.speed.model_built(model)
        return model

    def build_criterion(self, cfg, from_checkpoint=False):
        criterion = super().build_criterion(cfg, from_checkpoint)
        self.speed.criterion_built(criterion)
        return criterion

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    def max_positions(self):
        return self.cfg.tokens_per_sample

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        self.before_first_update(model, optimizer)
        if not self.cfg.autocast_bf16:
            return super().train_step(sample, model, criterion, optimizer, update_num,
                                      ignore_grad)
        if isinstance(optimizer, (FP16Optimizer, MemoryEfficientFP16Optimizer, AMPOptimizer)):
            raise ElectraUsageError(
                "--autocast-bf16 does not combine with --fp16, --bf16, --amp or "
                "--memory-efficient-fp16/bf16 (they cast the weights or add fp16 autocast "
                "and loss scaling); keep --autocast-bf16 alone for bf16 compute on fp32 "
                "weights")
        # fairseq's FairseqTask.train_step with bf16 autocast around the forward and loss;
        # the backward then runs each op in the dtype its forward used
        model.train()
        model.set_num_updates(update_num)
        with self.autocast(model), record_function("forward"):
            loss, sample_size, logging_output = criterion(model, sample)
        if ignore_grad:
            loss *= 0
        with record_function("backward"):  # fairseq's labels, for profiles
            optimizer.backward(loss)
        return loss, sample_size, logging_output

    def before_first_update(self, model, optimizer):
        """The device's settings and speed/'s once the optimizer and device are known; once
        (the whole update, speed/whole_update.py, calls it before it takes the step)."""
        if not self.device_set:
            self.device_set = True
            device_type = next(model.parameters()).device.type
            self.set_up_device(device_type)
            self.speed.first_update(model, optimizer, device_type)

    def set_up_device(self, device_type):
        """Process-wide settings for training on ``device_type``, made once."""
        if device_type == "cuda":
            tf32 = not self.cfg.no_tf32
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
            logger.info(f"CUDA training: fp32 matrix products in {'TF32' if tf32 else 'fp32'}"
                        f" ({'--no-tf32 keeps them fp32' if tf32 else '--no-tf32'})")

    def optimizer_step(self, optimizer, model, update_num):
        for p in model.resting_parameters():  # two-stage training: the other part is frozen
            p.grad = None
        optimizer_step(optimizer)  # --amp: unscaled once (optim/amp.py)

    def reduce_metrics(self, logging_outputs, criterion):
        """fairseq's, plus the running FLOPs count: an update's training FLOPs are known here,
        summed over its micro-batches and workers, so they are added to the model's counter."""
        super().reduce_metrics(logging_outputs, criterion)
        if self.flops_counter is not None and any("flops" in log for log in logging_outputs):
            flops = sum(log.get("flops", 0) for log in logging_outputs)
            # weight 0: the meter shows the latest value, the running total after this update
            metrics.log_scalar("train_flops", self.flops_counter.add(flops), weight=0,
                               priority=600, round=0)

    def valid_step(self, sample, model, criterion):
        with self.autocast(model):
            return super().valid_step(sample, model, criterion)

    def autocast(self, model):
        """bf16 autocast on the model's device type with --autocast-bf16, else nothing."""
        return torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16,
                              enabled=self.cfg.autocast_bf16)


def length_bucket(cfg) -> int:
    """What the collater rounds a batch's length up to: in ``none`` break mode every block is
    full already (one shape); under --graphed-step --tokens-per-sample, one shape for its one
    graph (each length compiles a graph of its own: eight of them took the arms of an H200
    run minutes; the official builder pads every example so too); otherwise an eighth of
    it, so that batches come in at most eight lengths (--torch-compile's graphs are
    dynamic)."""
    if cfg.sample_break_mode == "none":
        return 1
    return cfg.tokens_per_sample if cfg.graphed_step else max(8, cfg.tokens_per_sample // 8)


def load_split(data_path: str, split: str, dictionary: Dictionary, combine: bool):
    """A binarized split, checked to be non-empty and to fit the dictionary."""
    split_path = os.path.join(data_path, split)
    if os.path.isfile(split_path + ".bin") and os.path.getsize(split_path + ".bin") == 0:
        raise ElectraUsageError(f"the '{split}' split in {data_path} is empty")
    dataset = data_utils.load_indexed_dataset(split_path, dictionary, combine=combine)
    if dataset is None:
        raise ElectraUsageError(
            f"no '{split}' split in {data_path} (expected {split}.bin and {split}.idx); "
            f"binarize it or choose another --valid-subset / --disable-validation")
    if len(dataset) == 0 or dataset.sizes.sum() == 0:
        raise ElectraUsageError(f"the '{split}' split in {data_path} is empty")
    top = max_token_id(dataset)
    if top is not None and top >= len(dictionary):
        raise ElectraUsageError(
            f"{split_path}.bin holds token id {top} but {data_path}/dict.txt has only "
            f"{len(dictionary)} entries: the data was binarized with another dictionary; "
            f"binarize it again with --srcdict {data_path}/dict.txt")
    return dataset


def max_token_id(dataset):
    """Largest id in an mmap-indexed dataset (one pass over the memory map), else None."""
    buffer = getattr(dataset, "_bin_buffer", None)
    index = getattr(dataset, "_index", None)
    if buffer is None or index is None:
        return None
    return int(np.frombuffer(buffer, dtype=index.dtype).max())
