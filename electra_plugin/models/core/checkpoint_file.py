"""Reading a checkpoint file safely, and saying in one line what a file is when it is not one.

Every reader of checkpoints goes through here: the plugin's own (:func:`read_checkpoint_file`
for convert, extract, trials) and fairseq's ``load_checkpoint_to_cpu`` (the hub, the
tag/choice/squad/glue/score commands, ``--restore-file``, ``--finetune-from-model``), whose
failures :mod:`electra_plugin.run.safety_wrappers` hands to :func:`not_a_checkpoint`. Files are
read by torch's weights-only unpickler only: a file of unknown origin is never run as code,
and no message advises loading it any other way.
"""

import io
import os
import pickle
import pickletools
import zipfile
from collections.abc import Mapping
from typing import Any, Dict, List, Optional

import torch

from ...user_io.errors import ElectraUsageError

__all__ = ["read_checkpoint_file", "file_error", "checkpoint_file_error", "require_checkpoint_file",
           "not_a_checkpoint", "checkpoint_damage",
           "damaged_checkpoint_error", "refused_pickle_error", "unsafe_globals"]

ZIP_MAGIC = b"PK\x03\x04"
PICKLE_PROTOCOL = b"\x80"  # the PROTO opcode that opens a pickle of protocol 2 or newer
SNIFF_BYTES = 4096


def read_checkpoint_file(path, mmap: bool = False) -> Dict[str, Any]:
    """The state dict of a fairseq checkpoint file (``model`` weights and the rest), read with
    torch's safe loader; a missing, damaged, refused or foreign file raises one line.
    ``mmap``: the tensors mapped from the file, not read (a caller that looks at the config
    and the shapes alone; torch's zip format only)."""
    path = os.fspath(path)
    error = file_error(path)
    if error:
        raise error
    try:
        state = torch.load(path, map_location="cpu", mmap=mmap and _is_zip(path))
    except Exception as e:  # pickle, zip and weights-only errors all mean "not readable"
        raise not_a_checkpoint(path, e) or _unreadable(path, e) from None
    payload = _payload_error(path, state)
    if payload:
        raise payload
    return state


def file_error(path) -> Optional[ElectraUsageError]:
    """The line for a path that cannot be a checkpoint file, from its first bytes and its zip
    directory alone (missing, a directory, empty, cut short, not in torch's formats)."""
    path = os.fspath(path)
    return _unopenable(path) or _damage_error(path, thorough=False) or _foreign_error(path)


def checkpoint_file_error(path) -> Optional[ElectraUsageError]:
    """The line for a path that holds no checkpoint (missing, a directory, empty, cut short,
    not in torch's formats, refused, or holding something else), else None. Found before a
    reader loads it: a zip checkpoint is opened memory-mapped, which reads its structure and
    none of its tensors."""
    path = os.fspath(path)
    return file_error(path) or (_is_zip(path) and _loaded_error(path, mmap=True)) or None


def require_checkpoint_file(path) -> None:
    """Raise :func:`checkpoint_file_error`'s line, if any: commands call it before they look
    at their data, so a wrong file is named first."""
    error = checkpoint_file_error(path)
    if error:
        raise error


def not_a_checkpoint(path, error: Optional[BaseException] = None) -> Optional[ElectraUsageError]:
    """One line saying why ``path`` could not be read as a checkpoint (``error``: what the
    reader raised), or None when the file is a readable checkpoint and the failure lies
    elsewhere. Decided from the file, never from the wording of torch's error."""
    path = os.fspath(path)
    found = _unopenable(path) or _damage_error(path, thorough=True)
    if found:
        return found
    refused = error is not None and refused_pickle_error(path, error)
    return refused or _foreign_error(path) or _loaded_error(path)


def _loaded_error(path, mmap=False) -> Optional[ElectraUsageError]:
    try:
        state = torch.load(path, map_location="cpu", mmap=mmap)
    except Exception as e:
        return refused_pickle_error(path, e) or _unreadable(path, e)
    return _payload_error(path, state)


def _is_zip(path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(ZIP_MAGIC)) == ZIP_MAGIC


def _unopenable(path) -> Optional[ElectraUsageError]:
    if not os.path.exists(path):
        return ElectraUsageError(f"checkpoint {path} does not exist")
    if os.path.isdir(path):
        return ElectraUsageError(f"{path} is a directory, not a checkpoint file; give the .pt "
                                 f"file in it (e.g. {os.path.join(path, 'checkpoint_last.pt')})")
    return None


def _damage_error(path, thorough) -> Optional[ElectraUsageError]:
    reason = checkpoint_damage(path, thorough=thorough)
    return damaged_checkpoint_error(path, reason) if reason else None


def _foreign_error(path) -> Optional[ElectraUsageError]:
    what = _foreign_format(path)
    return ElectraUsageError(f"{path} is not a checkpoint: it is {what}; give a .pt file that "
                             f"fairseq-train, electra-extract or electra-convert wrote") \
        if what else None


def _unreadable(path, error: BaseException) -> ElectraUsageError:
    """A file in torch's formats that its safe loader still cannot read; torch's own text is
    left out (it ends in advice to load the file unsafely)."""
    return ElectraUsageError(
        f"{path} is not a PyTorch checkpoint this version can read (torch's safe loader "
        f"stopped with {type(error).__name__}); give a .pt file that fairseq-train, "
        f"electra-extract or electra-convert wrote")


def _foreign_format(path) -> Optional[str]:
    """What a file is when it is in neither of ``torch.save``'s formats (a zip archive with a
    pickle inside, or the legacy stream of pickles), else None."""
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    if head.startswith(ZIP_MAGIC):
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
        if any(n.endswith(".pkl") for n in names):
            return None
        shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        return f"a zip archive of other files ({shown or 'none'})"
    if head.startswith(PICKLE_PROTOCOL):
        return None if _legacy_torch_file(path) else \
            "a Python pickle of other data (torch.save writes a zip archive)"
    text = _as_text(head)
    if text is not None:
        first = text.strip().splitlines()[0][:40] if text.strip() else ""
        return f"a text file (it begins {first!r})" if first else "a text file of white space"
    return f"binary data of another format (it begins {head[:8]!r})"


def _legacy_torch_file(path) -> bool:
    """Whether a pickle stream starts as torch's legacy format does: its magic number."""
    from torch.serialization import MAGIC_NUMBER

    with open(path, "rb") as f:
        try:
            ops = pickletools.genops(f)
            return any(op.name.startswith("LONG") and arg == MAGIC_NUMBER
                       for _, (op, arg, _pos) in zip(range(4), ops))
        except Exception:  # not a pickle after all
            return False


def _as_text(head: bytes) -> Optional[str]:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not just a character cut at the sniffed end
            return None
        text = head[:e.start].decode("utf-8")
    printable = sum(c.isprintable() or c in "\t\r\n" for c in text)
    return text if printable >= 0.95 * max(len(text), 1) else None


def _payload_error(path, state) -> Optional[ElectraUsageError]:
    """One line when what a PyTorch file holds is not a fairseq checkpoint."""
    if isinstance(state, Mapping) and isinstance(state.get("model"), Mapping):
        return None
    if isinstance(state, Mapping):
        keys = [str(k) for k in list(state)[:4]]
        held = f"a dict of {', '.join(keys)}{' ...' if len(state) > 4 else ''}" if keys else \
            "an empty dict"
        if state and all(isinstance(v, torch.Tensor) for v in state.values()):
            held = f"bare weights ({held})"
    else:
        held = f"a {type(state).__name__}"
    return ElectraUsageError(
        f"{path} is a PyTorch file but not a fairseq checkpoint: it holds {held}, not 'model' "
        f"weights with their config; give a .pt file that fairseq-train, electra-extract or "
        f"electra-convert wrote (electra-convert import reads a transformers directory)")


def checkpoint_damage(path, thorough: bool = False) -> Optional[str]:
    """Why ``path`` cannot be a whole checkpoint file, or None when it may be one.

    ``torch.save`` writes a zip archive whose directory is its last record, so a file cut
    short (a kill during a copy, a full disk) has lost it, and opening the archive is a cheap
    test. ``thorough`` also reads every member against its CRC (a full read). Files that are
    not zip archives (fairseq's legacy pickle format, or not checkpoints at all) are left to
    ``torch.load`` to judge.
    """
    if os.path.getsize(path) == 0:
        return "the file is empty"
    with open(path, "rb") as f:
        if f.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
            return None
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip() if thorough else None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f"cut short or overwritten: {e}"
    return f"its part {bad} fails its checksum" if bad else None


def damaged_checkpoint_error(path, reason: str) -> ElectraUsageError:
    return ElectraUsageError(
        f"checkpoint {path} is damaged ({reason}); use an intact copy (fairseq-train keeps "
        f"checkpoint_last.pt, checkpoint_best.pt and numbered checkpoints in --save-dir)")


def refused_pickle_error(path, error: BaseException) -> Optional[ElectraUsageError]:
    """The line for a file that ``torch.load``'s safe (weights-only) unpickler refused, or
    None for any other error.

    Decided from the file, not from the error's wording: its pickle is read opcode by opcode
    (nothing is built) for the objects it names, and a name that torch's weights-only
    loader does not build is a refusal. Such a file (tampered, or a foreign pickle) would run
    code when loaded any other way; the safe loader stopped before building anything.
    """
    if not isinstance(error, pickle.UnpicklingError):  # torch's weights-only failures
        return None
    unsafe = unsafe_globals(path)
    if not unsafe:  # a malformed pickle, not a refusal
        return None
    shown = ", ".join(unsafe[:3]) + (" ..." if len(unsafe) > 3 else "")
    return ElectraUsageError(
        f"checkpoint {path} is refused: it holds objects that are not plain weights ({shown}), "
        f"which loading would run as code; nothing in it was run. Use a checkpoint written by "
        f"fairseq-train, electra-extract or electra-convert (and do not load a file of "
        f"unknown origin in any other way)")


# pickle opcodes that push the strings STACK_GLOBAL takes as module and name
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING",
               "BINSTRING", "SHORT_BINSTRING"}


def unsafe_globals(path) -> List[str]:
    """The ``module.name`` objects that the pickle(s) of a checkpoint file name and that
    torch's weights-only unpickler does not build, in file order, read with ``pickletools``
    (nothing is unpickled). Empty for a file that names none, or one that is not a pickle."""
    from torch import _weights_only_unpickler
    from torch.serialization import get_safe_globals

    allowed = set(_weights_only_unpickler._get_allowed_globals())
    allowed |= {f"{g.__module__}.{g.__qualname__}" for g in get_safe_globals()
                if not isinstance(g, tuple)}
    found = []
    for data in _pickles(path):
        strings = []
        stream = io.BytesIO(data)
        while stream.tell() < len(data):  # the legacy format holds several pickles in a row
            try:
                for op, arg, _ in pickletools.genops(stream):
                    if op.name in _STRING_OPS:
                        strings.append(arg)
                    elif op.name in ("GLOBAL", "INST"):
                        found.append(".".join(arg.split(" ", 1)))
                    elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                        found.append(f"{strings[-2]}.{strings[-1]}")
            except Exception:  # not (or no longer) a pickle: what was read so far counts
                break
    return list(dict.fromkeys(name for name in found if name not in allowed and
                              not _torch_storage(name)))


def _torch_storage(name: str) -> bool:
    """Storage types the weights-only loader rebuilds (legacy checkpoints name them)."""
    module, _, attr = name.rpartition(".")
    return module in ("torch", "torch.cuda") and attr.endswith("Storage")


def _pickles(path) -> List[bytes]:
    """The pickled parts of a checkpoint: ``data.pkl`` of a zip archive (torch.save), or the
    whole file (the legacy format)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return [archive.read(n) for n in archive.namelist() if n.endswith(".pkl")]
    except (zipfile.BadZipFile, OSError):
        with open(path, "rb") as f:
            return [f.read()]


