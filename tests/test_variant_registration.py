"""A pre-training variant is one file plus its registration: a generator kind and an objective
defined in a module of the user's own, outside the plugin, train through fairseq-train with
no edit anywhere else (choices, option checks, logged counts and rates, FLOPs)."""

import math

import pytest

from electra_plugin.models.generators import GENERATOR_KINDS, generator_kind
from electra_plugin.models.objectives import OBJECTIVES, objective_named
from electra_plugin.user_io.errors import ElectraUsageError
from helpers import records, run, train_cmd

THROWAWAY = '''
"""A generator kind and an objective of a user's own (registered on import)."""
import math

import torch

import electra_plugin  # noqa: F401  (the plugin's task, model and criterion)
from electra_plugin.models.generators import GeneratorKind, register_generator_kind
from electra_plugin.models.objectives import register_objective
from electra_plugin.models.objectives.rtd import ReplacedTokenDetection


@register_generator_kind("flat_noise")
class FlatNoise(GeneratorKind):
    """Every vocabulary entry equally likely: no network, nothing to learn."""

    def propose(self, model, src_tokens, attn_mask, positions, token_types=None):
        rows = torch.full((len(positions), model.vocab_size), -math.log(model.vocab_size))
        return rows.to(src_tokens.device), None


@register_objective("electra_counted")
class CountedDetection(ReplacedTokenDetection):
    """Replaced token detection that also counts the replaced tokens it flags."""

    logged_counts = ReplacedTokenDetection.logged_counts + ("flagged",)
    logged_rates = (("flagged_frac", "flagged", "masked"),)

    def main_loss(self, out):
        loss, per_token, counts = super().main_loss(out)
        return loss, per_token, {**counts, "flagged": counts["true_replaced"]}
'''


@pytest.mark.slow
def test_a_variant_of_ones_own_trains_with_no_other_edit(data_bin, tmp_path):
    user_dir = tmp_path / "my_variants"
    user_dir.mkdir()
    (user_dir / "__init__.py").write_text(THROWAWAY)
    cmd = train_cmd(data_bin, tmp_path / "ck", "--max-update", "2", "--no-save",
                    "--disable-validation", "--generator", "flat_noise",
                    "--objective", "electra_counted")
    cmd[cmd.index("--user-dir") + 1] = str(user_dir)
    result = run(cmd)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = records(result.stdout)
    assert [r["num_updates"] for r in logs] == [1, 2]
    assert all(math.isfinite(r["disc_loss"]) and 0 <= r["flagged_frac"] <= 100
               and r["train_flops"] > 0 for r in logs)
    # the objective's own rate and the step's: a uniform sample is rarely the original
    assert all(r["replaced_frac"] > 50 and "gen_loss" not in r for r in logs)


def test_unregistered_names_are_one_line_errors_that_list_the_registered_ones():
    with pytest.raises(ElectraUsageError) as error:
        generator_kind("no_such_kind")
    assert all(name in str(error.value) for name in GENERATOR_KINDS)
    with pytest.raises(ElectraUsageError) as error:
        objective_named("no_such_objective")
    assert all(name in str(error.value) for name in OBJECTIVES)
