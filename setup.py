import os

from setuptools import find_packages, setup

RECIPES = ["electra_plugin.recipes.pretraining", "electra_plugin.recipes.glue"]

setup(
    name="electra-fairseq",
    version="0.1.0",
    description="ELECTRA (replaced token detection) pre-training and fine-tuning as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # the hydra recipes ship inside the package (electra_plugin/recipes/...), so that an
    # installed plugin runs them without a clone: python -m electra_plugin config-dir pretraining
    packages=find_packages(include=["electra_plugin", "electra_plugin.*"]) + RECIPES,
    package_dir={name: os.path.join("examples", name.rsplit(".", 1)[1], "config")
                 for name in RECIPES},
    package_data={"electra_plugin": ["py.typed"], **{name: ["*.yaml", "*/*.yaml"]
                                                     for name in RECIPES}},
    python_requires=">=3.11",
    install_requires=[
        # Install torch before this package (scripts/setup_env.sh pins 2.13.0): an unpinned
        # torch with none installed pulls the newest CUDA build.
        "torch>=2.4",  # (2.4: the fused Adam kernel on CPU)
        # fairseq main with the Python 3.11 dataclass fix; see README "Why ve-fairseq".
        "ve-fairseq==0.12.3",
        "hydra-core>=1.3,<1.4",
        "omegaconf>=2.3,<2.4",
        "sentencepiece>=0.2.2",  # (0.2.2: encode(out_type="offset_mapping"), SQuAD offsets)
        "tokenizers>=0.15",  # BERT WordPiece (BertNormalizer, BertPreTokenizer, offsets)
        "sacremoses",
        "numpy",
        "scikit-learn",  # GLUE's F1 and Matthews correlation
        "scipy",  # GLUE's Pearson and Spearman correlations
        "seqeval",  # entity-level F1 of token tagging (conlleval's counting)
    ],
    entry_points={"console_scripts": [  # each also runs as python -m electra_plugin.cli.NAME
        "electra-train = electra_plugin.cli.train:cli_main",
        "electra-prepare = electra_plugin.cli.prepare:cli",
        "electra-glue = electra_plugin.cli.glue:cli",
        "electra-squad = electra_plugin.cli.squad:cli",
        "electra-finetune = electra_plugin.cli.finetune:cli",
        "electra-tag = electra_plugin.cli.tag:cli",
        "electra-choice = electra_plugin.cli.choice:cli",
        "electra-extract = electra_plugin.cli.extract:cli",
        "electra-convert = electra_plugin.cli.convert:cli",
        "electra-score = electra_plugin.cli.score:cli",
    ]},
    extras_require={
        # (5: the export's ElectraConfig(dtype=...) and tokenizers-backed BertTokenizer;
        # protobuf: transformers' sentencepiece converter reads the model file with it).
        # electra_plugin/environment/optional.py names the modules each feature imports.
        "hf": ["transformers>=5", "safetensors", "protobuf"],
        # fairseq's --tensorboard-logdir writes nothing without a writer package
        "tensorboard": ["tensorboardX>=2.6"],
        "plots": ["matplotlib"],  # the demo's and the equal-compute study's curves
        "bleu": ["sacrebleu>=2"],  # electra-score rerank's corpus BLEU
        # the modern body's variable-length attention on CUDA (a CUDA build; never needed)
        "flash": ["flash-attn>=2.5"],
        "test": ["pytest>=7", "pytest-xdist>=3", "sacrebleu>=2"],  # xdist: -n auto
    },
)
