"""The hydra recipes of examples/: each config named with --config-name composes, as
fairseq-hydra-train composes it, into every value its files state, and the pre-training
recipes into the official hyperparameters. (GLUE's against its task table: test_glue.py.)"""

import itertools

import pytest
from helpers import REPO, composed
from omegaconf import OmegaConf

PRETRAINING = REPO / "examples" / "pretraining" / "config"
GLUE = REPO / "examples" / "glue" / "config"
RECIPES = ["electra_small", "electra_base", "electra_large", "small_compute"]
GLUE_TASKS = ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]

# google-research/electra configure_pretraining.py (the global batch: test_global_batch.py)
OFFICIAL = {  # tokens per sequence, mask rate, peak lr, updates
    "electra_small": (128, 0.15, 5e-4, 1_000_000),
    "electra_base": (512, 0.15, 2e-4, 766_000),
    "electra_large": (512, 0.25, 2e-4, 400_000),
}

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # hydra's deprecation notes


def leaves(tree, prefix=""):
    """-> {dotted key: value} of a nested dict."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def stated(*files, resolve=True):
    """-> {dotted key: value} the yaml files state (their defaults lists and hydra's own
    settings aside: a composed run config holds neither), later files overriding earlier
    ones, interpolations resolved (or not: a file's may point elsewhere)."""
    configs = [OmegaConf.load(f) for f in files]
    for config in configs:
        config.pop("defaults", None)
        config.pop("hydra", None)
    return leaves(OmegaConf.to_container(OmegaConf.merge(*configs), resolve=resolve))


def assert_holds(cfg, values):
    """``cfg`` holds ``values``, but for the ones stated as ??? (for the command line to give:
    fairseq's schema leaves some of these at its own default, e.g. common.user_dir at None)."""
    got = leaves(OmegaConf.to_container(cfg))
    wrong = {k: (v, got.get(k, "<absent>")) for k, v in values.items()
             if v != "???" and got.get(k) != v}
    assert not wrong, f"stated -> composed: {wrong}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_pretraining_recipe_is_the_shared_file_then_its_own(recipe):
    # the named file only lists: fairseq-hydra-train merges its whole schema over it
    assert set(OmegaConf.load(PRETRAINING / f"{recipe}.yaml")) == {"defaults"}
    assert_holds(composed(PRETRAINING, recipe), stated(PRETRAINING / "shared" / "official.yaml",
                                                       PRETRAINING / "recipe" / f"{recipe}.yaml"))


def test_the_base_config_runs_electra_small():
    """``--config-name pretraining``, the first file a user sees, is the default run: the
    official ELECTRA-Small recipe, the same config as electra_small."""
    assert OmegaConf.to_container(composed(PRETRAINING, "pretraining")) == \
        OmegaConf.to_container(composed(PRETRAINING, "electra_small"))


# each task with one size, each size with three tasks: a recipe is its task's file, glue.yaml
# and a size file, composed in the same way whichever the three are
@pytest.mark.parametrize("task, size", zip(GLUE_TASKS, itertools.cycle(["small", "base",
                                                                         "large"])))
def test_a_glue_recipe_is_the_task_then_the_shared_file_then_the_size(task, size):
    own, shared = (stated(GLUE / f, resolve=False) for f in (f"{task}.yaml", "glue.yaml"))
    # glue.yaml comes after the task's values, so it would silently replace any it repeats
    assert not set(own) & set(shared)
    assert_holds(composed(GLUE, task, f"size={size}"),
                 stated(GLUE / f"{task}.yaml", GLUE / "glue.yaml", GLUE / "size" / f"{size}.yaml"))


@pytest.mark.parametrize("recipe", sorted(OFFICIAL))
def test_pretraining_recipes_compose_to_the_official_hyperparameters(recipe):
    cfg = composed(PRETRAINING, recipe)
    tokens, mask_prob, lr, updates = OFFICIAL[recipe]
    assert cfg.model._name == recipe and cfg.task.tokens_per_sample == tokens
    assert cfg.task.mask_prob == mask_prob and list(cfg.optimization.lr) == [lr]
    assert cfg.optimization.max_update == updates and cfg.lr_scheduler.warmup_updates == 10_000
    assert_official_shared(cfg)
    assert cfg.criterion.disc_weight == 50.0 and not cfg.common.cpu


def assert_official_shared(cfg):
    """What no recipe changes: AdamW 0.9/0.999/1e-6, weight decay 0.01, clipping at 1, linear
    decay to 0, BERT masking of 15% of the masked positions kept, dropout 0.1."""
    assert cfg.optimizer._name == "electra_adam" and cfg.optimizer.adam_eps == 1e-6
    assert cfg.optimizer.adam_betas == "(0.9,0.999)" and cfg.optimizer.weight_decay == 0.01
    assert cfg.optimization.clip_norm == 1.0 and cfg.lr_scheduler.end_learning_rate == 0.0
    assert cfg.task.leave_unmasked_prob == 0.15 and cfg.task.random_token_prob == 0.0
    assert cfg.model.dropout == 0.1 == cfg.model.attention_dropout


def test_small_compute_is_the_official_recipe_scaled_down():
    cfg = composed(PRETRAINING, "small_compute")
    assert cfg.model._name == "electra_tiny" and cfg.common.cpu
    assert cfg.dataset.batch_size == 32 and list(cfg.optimization.lr) == [1e-3]
    assert cfg.optimization.max_update == cfg.lr_scheduler.total_num_update == 1200
    assert cfg.lr_scheduler.warmup_updates == 120  # 10%
    assert cfg.criterion.disc_weight == 1.0 and cfg.task.mask_prob == 0.15
    assert_official_shared(cfg)
