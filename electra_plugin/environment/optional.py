"""The optional packages, by the feature that needs them and the extra that installs them.

setup.py's ``extras_require`` lists what each extra installs; tests/test_optional.py checks
that every module a feature below imports comes from a package its extra declares. A missing
one is one line naming the feature, the package and the extra, never an ImportError from
deep inside a library.
"""

import importlib

from ..user_io.errors import ElectraUsageError

# feature -> (extra, the modules it imports)
FEATURES = {
    "converting to or from Hugging Face transformers": ("hf", ("transformers", "safetensors")),
    "a tokenizer.json for a sentencepiece vocabulary": ("hf", ("transformers",
                                                                "google.protobuf")),
    "fairseq's --tensorboard-logdir": ("tensorboard", ("tensorboardX",)),
    "the demo's curves": ("plots", ("matplotlib",)),
    "the trials' picture": ("plots", ("matplotlib",)),
    "re-ranking n-best lists by BLEU": ("bleu", ("sacrebleu",)),
}


def require(feature: str):
    """Import the modules ``feature`` needs; -> the first. A missing one raises one line."""
    extra, modules = FEATURES[feature]
    imported = []
    for module in modules:
        try:
            imported.append(importlib.import_module(module))
        except ImportError:
            raise ElectraUsageError(
                f"{feature} needs the Python package that provides '{module}', which is not "
                f"installed: pip install 'electra-fairseq[{extra}]' (in a clone: pip install "
                f"-e '.[{extra}]')") from None
    return imported[0]
