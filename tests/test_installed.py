"""The plugin from an installed package (a wheel, not this clone), run from another
directory: fairseq-train and fairseq-hydra-train find it through ``python -m electra_plugin``,
and electra-train needs no --user-dir and lists the plugin's options in its help."""

import shutil
import sys
import sysconfig

import pytest

from helpers import REPO, TINY_SIZES, failure, run

# what the wheel is built from (tracked sources, no build output of the clone)
SOURCES = ("setup.py", "README.md", "electra_plugin", "examples/pretraining/config",
           "examples/glue/config")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """-> (the python command that sees only the wheel's plugin, its environment)."""
    root = tmp_path_factory.mktemp("installed")
    for source in SOURCES:
        copy = shutil.copytree if (REPO / source).is_dir() else shutil.copy
        (root / "src" / source).parent.mkdir(parents=True, exist_ok=True)
        copy(REPO / source, root / "src" / source,
             **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree
                else {}))
    proc = run([sys.executable, "-m", "pip", "-q", "wheel", "--no-deps", "--no-build-isolation",
                "-w", root / "wheel", root / "src"])
    assert proc.returncode == 0, failure("pip wheel", proc)
    wheel = next((root / "wheel").glob("electra_fairseq-*.whl"))
    proc = run([sys.executable, "-m", "pip", "-q", "install", "--no-deps", "--target",
                root / "site", wheel])
    assert proc.returncode == 0, failure("pip install --target", proc)
    # the environment's packages without its .pth files, so without the editable clone
    env = {"PYTHONPATH": f"{root / 'site'}:{sysconfig.get_paths()['purelib']}"}
    (root / "elsewhere").mkdir()
    return [sys._base_executable, "-s"], env, root


def python(installed, *args, **kwargs):
    command, env, root = installed
    return run([*command, *args], env=env, cwd=root / "elsewhere", **kwargs)


@pytest.mark.slow
def test_fairseq_commands_find_the_installed_plugin(installed, data_bin):
    _, _, root = installed
    where = python(installed, "-m", "electra_plugin", "user-dir")
    assert where.returncode == 0, failure("python -m electra_plugin", where)
    user_dir = where.stdout.strip()
    assert user_dir == str(root / "site" / "electra_plugin")
    recipes = python(installed, "-m", "electra_plugin", "config-dir", "pretraining").stdout.strip()
    assert recipes == str(root / "site" / "electra_plugin" / "recipes" / "pretraining")

    train = python(installed, "-m", "fairseq_cli.train", data_bin, "--user-dir", user_dir,
                   "--task", "electra", "--criterion", "electra", "--arch", "electra_tiny",
                   *TINY_SIZES, "--cpu", "--tokens-per-sample", "32", "--batch-size", "4",
                   "--max-update", "1", "--num-workers", "0", "--data-buffer-size", "0",
                   "--optimizer", "adam", "--lr", "1e-4", "--disable-validation",
                   "--save-dir", "ck")
    assert train.returncode == 0, failure("fairseq-train", train)
    assert (root / "elsewhere" / "ck" / "checkpoint_last.pt").is_file()

    hydra = python(installed, "-m", "fairseq_cli.hydra_train", "--config-dir", recipes,
                   "--config-name", "small_compute", f"task.data={data_bin}",
                   f"common.user_dir={user_dir}", "common.cpu=true",
                   "optimization.max_update=1", "dataset.num_workers=0",
                   "task.tokens_per_sample=32", "dataset.batch_size=4",
                   "dataset.disable_validation=true")
    assert hydra.returncode == 0, failure("fairseq-hydra-train", hydra)
    # the recipes write where they are started, as the README says
    assert (root / "elsewhere" / "checkpoints" / "checkpoint_last.pt").is_file()


@pytest.mark.slow
def test_electra_train_help_lists_the_plugin_options(installed):
    shown = python(installed, "-m", "electra_plugin.cli.train", "--task", "electra",
                   "--criterion", "electra", "--help")
    assert shown.returncode == 0, failure("electra-train --help", shown)
    for option in ("--objective", "--generator", "--disc-weight", "--global-batch-size",
                   "--mask-prob"):
        assert f"  {option}" in shown.stdout, option
    assert "implies --tpu" not in shown.stdout
    assert "use bfloat16 (on GPUs and CPUs; add --tpu for a TPU)" in shown.stdout


def test_locating_the_plugin_skips_fairseqs_import():
    """``python -m electra_plugin user-dir`` sits inside every command a user types (``--user-dir
    "$(python -m electra_plugin user-dir)"``): it prints at once, without fairseq's seconds of
    imports (``electra-train --help`` below: ``-m`` of a submodule still registers the plugin)."""
    where = run([sys.executable, "-X", "importtime", "-m", "electra_plugin", "user-dir"],
                fresh=True)
    assert where.returncode == 0 and where.stdout.strip() == str(REPO / "electra_plugin"), \
        failure("python -m electra_plugin", where)
    assert " fairseq" not in where.stderr, where.stderr[-2000:]
