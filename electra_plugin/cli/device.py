"""Where the evaluation commands (``electra-glue evaluate``, ``electra-squad predict``) run:
the GPU when there is one, the CPU with ``--cpu``, as fairseq's own commands choose."""

import torch
from fairseq import utils


def inference_device(cpu: bool) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")


def net_input_on(sample, device):
    """The batch's ``net_input`` with its tensors on ``device``; the ids and targets the
    commands read stay on the host, so reading them waits for nothing."""
    return utils.apply_to_sample(lambda t: t.to(device), sample["net_input"])
