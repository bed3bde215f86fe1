"""An output directory filled from a staging directory beside it, so that a killed run never
leaves files that look finished (the staging directories are named by
``binarize.STAGING_PREFIX``)."""

import os
import shutil


def same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def install_file(src, dst):
    """Copy ``src`` to ``dst`` unless they are already the same file."""
    if not same_file(src, dst):
        shutil.copyfile(src, dst)


def publish(staged, destdir):
    """Move the finished files into ``destdir``, dict.txt last (renames in one file system).

    A run killed on the way leaves a directory without dict.txt, which no task loads, never
    a mix of an earlier run's files and this one's that trains on part of the corpus.
    """
    old_dict = os.path.join(destdir, "dict.txt")
    if os.path.exists(old_dict):
        os.remove(old_dict)
    for name in sorted(os.listdir(staged), key=lambda name: name == "dict.txt"):
        os.replace(os.path.join(staged, name), os.path.join(destdir, name))
