"""Training FLOPs of ELECTRA pre-training: the paper's count and what our step executes.

**Paper count** (``paper_train_flops``): the rules of the official ``flops_computation.py``
(google-research/electra), which give the "train FLOPs" column of the paper:

- a multiply-add is 2 FLOPs, and the elementwise work is counted too, per value: layer norm
  5, GELU 8, softmax 5, dropout 4, a bias or a residual add 1;
- the token-embedding lookup is counted as a dense multiplication by a one-hot vector
  (``2 * E * V`` per token), position and token-type lookups likewise (``2 * E * (T + 2)``);
- the generator's output layer (dense, GELU, LayerNorm, tied vocabulary projection, softmax)
  is counted at a fixed fraction of the positions, 0.15625 by default (20 of 128);
- backward costs as much as forward: training = 2 x forward.

We keep the official script's one quirk so that the numbers agree with it: the attention
output LayerNorm is counted as 5 FLOPs per position, not per value. (The script also sizes
the generator's FFN as ``4 * H_gen`` and its heads as ``H_gen / 64``; we take the model's
own sizes, which are the same for every official size.) For the official configurations this gives 1.29e18
for ELECTRA-Small (1M updates of 128 x 128; the paper's Table 1 rounds it to 1.4e18, the
same as BERT-Small) and 6.42e19 for ELECTRA-Base (766k updates of 256 x 512).

**Executed count** (``executed_train_flops``): the matrix multiplications our training step
runs, 2 FLOPs per multiply-add and 3 x forward for training (the backward pass computes the
gradients of both the inputs and the weights). Embedding lookups are free; the generator's
vocabulary projection is counted at the masked positions only, because that is all
``ElectraGeneratorPredictions`` computes. This is the count to divide by the time for MFU.
``executed_train_flops(..., full_vocab_generator=True)`` is the same count for a step that
projects every position onto the vocabulary, as transformers' ``ElectraForMaskedLM`` does.
"""

from typing import Optional

import torch

from .fixed_dtype import FixedDtypeBuffers
from .config import EncoderSize
# Elementwise costs per value, as the official script counts them.
_LAYER_NORM, _GELU, _SOFTMAX, _DROPOUT = 5, 8, 5, 4
# Fraction of positions whose generator output the official script counts (20 of 128).
PAPER_OUTPUT_FRACTION = 0.15625


# ---------------------------------------------------------------------------- paper count


def _paper_layer(size: EncoderSize, length: int) -> float:
    """Forward FLOPs of one Transformer layer for one position of a length-T sequence."""
    h, i, t, n = size.hidden, size.ffn, length, size.heads
    attention = (
        3 * (2 * h * h + h)  # query, key, value projections and biases
        + 2 * h * t  # scores q.k against every position
        + (_SOFTMAX + _DROPOUT + 1) * t * n  # softmax, dropout and 1/sqrt(d) of the scores
        + 2 * h * t  # weighted average of the values
        + 2 * h * h + h + _DROPOUT * h + h  # output projection, bias, dropout, residual
        + _LAYER_NORM  # (sic: the official script counts 5, not 5 * H)
    )
    ffn = (
        2 * h * i + i + _GELU * i  # intermediate dense, bias, GELU
        + 2 * i * h + h + _DROPOUT * h + h + _LAYER_NORM * h  # output dense ... LayerNorm
    )
    return attention + ffn


def _paper_embeddings(size: EncoderSize, vocab: int, length: int) -> float:
    """Forward FLOPs of the input embedding block for one position."""
    e, h = size.embedding, size.hidden
    flops = (
        2 * e * vocab  # token lookup as a one-hot multiplication
        + 2 * e * (length + 2)  # position and token-type lookups, the same way
        + 2 * e  # adding the three
        + _LAYER_NORM * e + _DROPOUT * e
    )
    if e != h:
        flops += 2 * e * h + h  # projection to the hidden size
    return flops


def paper_generator_output(size: EncoderSize, vocab: int) -> float:
    """Forward FLOPs of the generator's output layer for one predicted position."""
    e, h = size.embedding, size.hidden
    return (2 * h * e + e + _GELU * e + _LAYER_NORM * e  # dense, bias, GELU, LayerNorm
            + 2 * e * vocab + _SOFTMAX * vocab + 2 * vocab)  # projection, softmax, target


def paper_discriminator_output(size: EncoderSize) -> float:
    """Forward FLOPs of the replaced-token head for one position."""
    h = size.hidden
    return 2 * h * h + h + _GELU * h + 2 * h


def paper_encoder_flops(size: EncoderSize, vocab: int, length: int, positions: int) -> float:
    """Forward FLOPs of one encoder (embeddings and layers) over ``positions`` positions of
    length-``length`` sequences."""
    return positions * (size.layers * _paper_layer(size, length)
                        + _paper_embeddings(size, vocab, length))


def paper_train_flops(disc: EncoderSize, gen: Optional[EncoderSize], vocab: int, length: int,
                      sequences: int = 1, predicted: float = None) -> float:
    """Training FLOPs of ELECTRA (replaced token detection, generator trained with the
    discriminator), as the paper counts them, of ``sequences`` sequences of ``length``.

    ``predicted`` is the number of positions with a generator output over all the sequences
    (default: the official fraction 0.15625 of every sequence); ``gen`` None when no network
    generates. Multiply by the number of updates for a whole run. The other objectives and
    generators count their own parts (``paper_head_flops``, ``GeneratorKind.paper_flops``).
    """
    if predicted is None:
        predicted = PAPER_OUTPUT_FRACTION * length * sequences
    positions = length * sequences
    flops = 2 * (paper_encoder_flops(disc, vocab, length, positions)
                 + positions * paper_discriminator_output(disc))
    if gen is not None:
        flops += 2 * (paper_encoder_flops(gen, vocab, length, positions)
                      + predicted * paper_generator_output(gen, vocab))
    return flops


# ------------------------------------------------------------------------- executed count


def _matmul_forward(size: EncoderSize, length: int) -> float:
    """Forward matmul FLOPs of one encoder (without lookups) for one position."""
    h, e = size.hidden, size.embedding
    layer = 2 * 4 * h * h + 2 * 2 * h * size.ffn + 2 * 2 * h * length  # proj, FFN, attention
    return size.layers * layer + (2 * e * h if e != h else 0)


def executed_train_flops(disc: EncoderSize, gen: EncoderSize, vocab: int, length: int,
                         sequences: int, predicted: float,
                         full_vocab_generator: bool = False) -> float:
    """Matmul FLOPs of one training step on ``sequences`` x ``length`` tokens.

    ``predicted``: number of masked positions (where the generator head runs), or ignored
    with ``full_vocab_generator`` (the head runs at every position).
    """
    positions = length * sequences
    head_positions = positions if full_vocab_generator else predicted
    forward = positions * (_matmul_forward(disc, length) + _matmul_forward(gen, length))
    forward += positions * (2 * disc.hidden * disc.hidden + 2 * disc.hidden)  # RTD head
    forward += head_positions * (2 * gen.hidden * gen.embedding + 2 * gen.embedding * vocab)
    return 3 * forward


# --------------------------------------------------------------------------- running count


class FlopsCounter(FixedDtypeBuffers):
    """The training FLOPs a pre-training model has seen, as the paper counts them.

    A float64 buffer (``flops_counter.flops`` in the state dict), so the count travels with
    every checkpoint and survives any resume, including from an end-of-epoch checkpoint,
    where fairseq drops its logged meters. The ``electra`` task adds each update's FLOPs
    after fairseq has summed the criterion's logs over micro-batches (``--update-freq``) and
    workers, so every worker holds the same global count. The buffer stays float64 under
    --fp16/--bf16.
    """

    KEY = "flops_counter.flops"

    def __init__(self):
        super().__init__()
        self.register_buffer("flops", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def add(self, flops: float) -> torch.Tensor:
        """Add ``flops`` (no host-device sync) and return the new total (a 0-d tensor)."""
        self.flops.add_(flops)
        return self.flops.detach().clone()
