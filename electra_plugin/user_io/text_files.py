"""A user's text file (TSV, CoNLL, JSON lines, hypotheses) read whole as UTF-8: what cannot be
read is one line that names the file, and for bytes that are not UTF-8 their line and the
fix, never a codec traceback. A byte-order mark (as Excel and Notepad write) is dropped."""

from .errors import ElectraUsageError


def read_text(path) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ElectraUsageError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ElectraUsageError(f"{path}:{line} is not UTF-8 text (byte {data[e.start]:#04x}); "
                                f"convert the file first (a Latin-1 file: iconv -f latin1 -t "
                                f"utf-8)") from None
