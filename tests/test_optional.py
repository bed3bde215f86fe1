"""Every extra installs what its features import, and a missing optional package is one line
naming the feature and the extra."""

import importlib.metadata
import re
import sys

import pytest

from electra_plugin.data.fast_tokenizer import sentencepiece_tokenizer
from electra_plugin.environment import optional
from electra_plugin.user_io.errors import ElectraUsageError


def declared_extras():
    """{extra: set of distribution names} as the installed package declares them."""
    extras = {}
    for requirement in importlib.metadata.requires("electra-fairseq") or []:
        found = re.match(r"([A-Za-z0-9_.-]+).*extra == \"(\w+)\"", requirement)
        if found:
            extras.setdefault(found.group(2), set()).add(found.group(1).lower())
    return extras


def test_each_extra_declares_the_packages_its_features_import():
    extras = declared_extras()
    providers = importlib.metadata.packages_distributions()
    for feature, (extra, modules) in optional.FEATURES.items():
        for module in modules:
            top = module.split(".")[0]
            packages = {name.lower() for name in providers.get(top, [])}
            assert packages & extras.get(extra, set()), \
                f"{feature} imports {module} (from {packages}), which the [{extra}] extra " \
                f"does not install ({sorted(extras.get(extra, []))})"


@pytest.mark.parametrize("missing", ["google.protobuf", "transformers"])
def test_a_missing_package_is_one_line_naming_the_extra(missing, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, missing, None)  # what an environment without it imports
    with pytest.raises(ElectraUsageError) as caught:
        sentencepiece_tokenizer(str(tmp_path / "spm.model"))
    line = str(caught.value)
    assert "\n" not in line and f"'{missing}'" in line
    assert "a tokenizer.json for a sentencepiece vocabulary needs" in line
    assert "pip install 'electra-fairseq[hf]'" in line


def test_curves_and_conversion_name_their_extras(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ElectraUsageError, match=r"the demo's curves needs .*\[plots\]"):
        optional.require("the demo's curves")
    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(ElectraUsageError, match=r"Hugging Face transformers needs .*\[hf\]"):
        optional.require("converting to or from Hugging Face transformers")
