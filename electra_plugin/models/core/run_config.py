"""Settings of the whole run that the plugin checks or completes before fairseq builds the
trainer: precision, the DDP wrapper (on CPUs: fairseq's legacy one), the global batch.

A task or a model sees only its own config group, but fairseq keeps that group a child of
the run's config (the task's ``seed: ${common.seed}`` reads it) and hands the same object to
the trainer, which builds the optimizer and the DDP wrapper later. So what must be decided
before then is decided when the task or the model is built, logged, and refused in one line
where nothing can make it work.
"""

import logging

import torch
from omegaconf import OmegaConf, open_dict

from ...environment.bf16_units import warn_if_emulated
from ...user_io.errors import ElectraUsageError

logger = logging.getLogger(__name__)

# the DDP backends that are torch's DistributedDataParallel
TORCH_DDP = ("c10d", "pytorch_ddp")


def run_config(node):
    """The run's config that a task or model config belongs to; None for a bare config (a
    hub interface or a test that builds a model from its own group)."""
    if not OmegaConf.is_config(node):
        return None
    root = node._get_root()
    return root if root is not node and "common" in root else None


def complete_for_model(run) -> None:
    """Check and complete the run's settings for an ELECTRA model (pre-training or not);
    ``run`` is :func:`run_config` of the model's config."""
    distributed = run.get("distributed_training", {})
    if distributed.get("ddp_backend") == "fully_sharded":
        raise ElectraUsageError(
            "--ddp-backend fully_sharded flattens and shards the parameters, which the "
            "plugin does not support (electra_adam's per-parameter weight decay and layer "
            "decay, the two-stage copy and the float64 FLOPs count need whole parameters); "
            "use --ddp-backend c10d (the default) or legacy_ddp")
    common = run.common
    if common.get("cpu") and distributed.get("distributed_world_size", 1) > 1 and \
            distributed.get("ddp_backend") in TORCH_DDP:
        # fairseq hands torch's DDP a CUDA device id, which CPU modules refuse
        set_logged(distributed, "ddp_backend", "legacy_ddp",
                   f"--cpu on {distributed.distributed_world_size} processes: --ddp-backend "
                   f"legacy_ddp (fairseq builds its {distributed.ddp_backend} wrapper for "
                   f"GPUs only)")
    optimizer = run.get("optimizer", None) or {}
    if flat_fp16(common) and optimizer.get("_name") == "electra_adam":
        # fairseq would flatten every fp32 master weight into one tensor, and electra_adam
        # would lose the LayerNorm/bias weight-decay exemption and the layer-decay groups
        set_logged(common, "fp16_no_flatten_grads", True,
                   "--fp16 with electra_adam: fp32 master weights kept per parameter "
                   "(--fp16-no-flatten-grads), so LayerNorm and biases keep their "
                   "weight-decay exemption and --layer-decay its groups")
    autocast = getattr(run.get("task", None), "autocast_bf16", None)  # (a Namespace or not)
    bf16 = next((flag for flag, on in (("--bf16", common.get("bf16")),
                                       ("--autocast-bf16", autocast)) if on), None)
    if bf16:
        warn_if_emulated(bf16, cuda=not common.get("cpu") and torch.cuda.is_available())
    if flat_fp16(common) and (common.get("cpu") or not torch.cuda.is_available()):
        raise ElectraUsageError(
            "--fp16 on the CPU: fairseq's FP16Optimizer asks for a CUDA device for its flat "
            "fp32 copy of the weights; train on the CPU in fp32 (no precision flag), with "
            "--autocast-bf16 or with electra-train --bf16 (or add --fp16-no-flatten-grads: "
            "fp16 is slower than fp32 on most CPUs)")


def flat_fp16(common) -> bool:
    """Whether fairseq's FP16Optimizer would keep its fp32 master weights as one flat tensor
    (plain --fp16: not --bf16, --amp, memory-efficient or --fp16-no-flatten-grads)."""
    return bool(common.get("fp16")) and not any(common.get(flag) for flag in (
        "bf16", "amp", "memory_efficient_fp16", "memory_efficient_bf16",
        "fp16_no_flatten_grads"))


def master_copies(run) -> bool:
    """Whether fairseq keeps separate fp32 master weights (--fp16/--bf16, not memory
    efficient)."""
    common = run.common
    return bool((common.get("fp16") and not common.get("memory_efficient_fp16")) or
                (common.get("bf16") and not common.get("memory_efficient_bf16")))


def update_freq_for(global_batch: int, batch_size, world_size: int) -> int:
    """--update-freq that makes ``global_batch`` sequences per update out of ``batch_size``
    sequences per GPU (process) and step on ``world_size`` of them."""
    if not batch_size:
        raise ElectraUsageError(
            "--global-batch-size counts sequences, so it needs --batch-size (sequences per "
            "GPU and step) rather than --max-tokens alone")
    if global_batch % world_size:
        raise ElectraUsageError(
            f"--global-batch-size {global_batch} does not split over {world_size} GPUs; use a "
            f"number of GPUs that divides it")
    per_gpu = global_batch // world_size
    if per_gpu % batch_size:
        raise ElectraUsageError(
            f"--global-batch-size {global_batch} over {world_size} GPU(s) is {per_gpu} "
            f"sequences per GPU, not a multiple of --batch-size {batch_size}; use a "
            f"--batch-size that divides {per_gpu}")
    return per_gpu // batch_size


def complete_global_batch(task_cfg) -> None:
    """Set --update-freq from the task's --global-batch-size (0: leave it as given)."""
    run = run_config(task_cfg)  # None for a dataclass or a bare group: nothing to set
    global_batch = run is not None and task_cfg.get("global_batch_size", 0)
    if not global_batch:
        return
    world = run.distributed_training.get("distributed_world_size", 1) or 1
    freq = update_freq_for(global_batch, run.dataset.get("batch_size"), world)
    given = list(run.optimization.get("update_freq", [1]))
    if given not in ([1], [freq]):
        raise ElectraUsageError(
            f"--global-batch-size {global_batch} sets --update-freq itself ({freq} here), but "
            f"--update-freq {','.join(map(str, given))} was given; drop one of the two")
    set_logged(run.optimization, "update_freq", [freq],
         f"--global-batch-size {global_batch}: {run.dataset.batch_size} sequences x "
         f"{world} GPU(s) x --update-freq {freq}")


def set_logged(group, key, value, message):
    with open_dict(group):
        group[key] = value
    logger.info(message)
