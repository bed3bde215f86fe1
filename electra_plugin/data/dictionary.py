"""The plugin's dictionary: a data directory's dict.txt plus ``<mask>``.

Every reader (the tasks, the converter, the commands, the demo) loads it here, so the ids
that checkpoints and Hugging Face exports depend on come from one place, and a missing or
malformed dict.txt gives one error naming the file and the fix.
"""

import glob
import os

from fairseq.data import Dictionary

from ..user_io.errors import ElectraUsageError, first_line
from .binarize import STAGING_PREFIX

# Appended after dict.txt's rows, as fairseq's masked_lm and sentence_prediction tasks do.
MASK_SYMBOL = "<mask>"


def load_dictionary(data_dir: str) -> Dictionary:
    """dict.txt of a binarized data directory with ``<mask>`` added (a no-op when dict.txt
    already lists it), with errors that say what to run."""
    if not os.path.isdir(data_dir):
        raise ElectraUsageError(
            f"data directory {data_dir} does not exist; binarize text first with "
            f"electra-prepare (or fairseq-preprocess --only-source)")
    path = os.path.join(data_dir, "dict.txt")
    if not os.path.isfile(path) and glob.glob(os.path.join(data_dir, STAGING_PREFIX + "*")):
        raise ElectraUsageError(
            f"{data_dir} is incomplete: an electra-prepare run into it was interrupted; "
            f"run it again with --force")
    if not os.path.isfile(path):
        raise ElectraUsageError(
            f"{path} is missing; pass a data directory holding the dict.txt that "
            f"electra-prepare (or fairseq-preprocess) wrote next to the .bin/.idx files")
    try:
        dictionary = Dictionary.load(path)
    except (ValueError, RuntimeError) as e:
        raise ElectraUsageError(f"{path} is not a fairseq dictionary ({first_line(e)})") \
            from None
    dictionary.add_symbol(MASK_SYMBOL)
    return dictionary
