"""The generator's samples: one token per row of logits, drawn from ``softmax(logits / T)``.

The official code draws by the Gumbel-max trick, one Gumbel variate per vocabulary entry
(the plain path, ``ELECTRA_SPEED=-sampling``). Inverse-CDF sampling draws from the same
distribution with one uniform number per row: a cumulative sum and a binary search, on CPU
6x cheaper at a 30,522-entry vocabulary.
"""

import torch

from .switch import enabled


@torch.no_grad()
def sample(logits, temperature, disallowed=None):
    """M x V logits -> M token ids, drawn in fp32. Temperature 0 takes the argmax; a 0-d
    tensor divides like a number. ``disallowed``: one id per row given probability 0 (the
    others renormalised), exactly where the official code subtracts 1000 from its logit."""
    logits = logits.float()
    if disallowed is not None:
        logits = logits.scatter(1, disallowed[:, None], float("-inf"))
    if torch.is_tensor(temperature):
        logits = logits / temperature
    elif temperature == 0:
        return logits.argmax(-1)
    elif temperature != 1:
        logits = logits / temperature
    if not enabled("sampling"):
        uniform = torch.rand_like(logits).clamp_(min=1e-9, max=1 - 1e-7)
        return (logits - (-uniform.log()).log()).argmax(-1)
    cdf = logits.softmax(-1).cumsum_(-1)
    u = torch.rand(len(cdf), 1, device=cdf.device) * cdf[:, -1:]  # cdf[:, -1] is ~1
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.size(1) - 1)
