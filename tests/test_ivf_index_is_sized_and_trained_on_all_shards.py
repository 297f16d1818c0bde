"""`bertforge embed --index faiss --index-kind ivf` sizes its cells from every record, not the first shard's, trains
them on a sample drawn across all shards (the same rows on every run), records the cell count and training points
in index.json, and says in one stderr line when there are fewer than faiss's 39 training points per cell.

Issue #49: with ``--shard-size 50`` the index had one cell (a flat scan with extra steps), silently."""
import json

import numpy as np
import pytest

from helpers import make_tiny_checkpoint, sentences


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ivf") / "tiny")


def _embed(main, model, tmp_path, n: int, shard_size: int, name: str = "vecs"):
    txt = tmp_path / f"corpus{n}.txt"
    txt.write_text("\n".join(s for s, _ in sentences(n, 5)) + "\n", encoding="utf-8")
    out = tmp_path / name
    assert main(["embed", "--model", str(model), "--input", str(txt), "--out", str(out), "--shard-size",
                 str(shard_size), "--max-seq-len", "32", "--threads", "1", "--index", "faiss",
                 "--index-kind", "ivf"]) == 0
    return out


def _faiss_nlist(out) -> int:
    import faiss
    return faiss.extract_index_ivf(faiss.read_index(str(out / "index.faiss"))).nlist


def test_cells_come_from_all_records_and_the_training_points_are_recorded(model, tmp_path, capfd):
    from bertforge.cli import main
    n = 400
    out = _embed(main, model, tmp_path, n, 20)  # 20 shards; the first alone would size 1 cell
    assert _faiss_nlist(out) == 10  # min(4·√400, 400 / 39): sized from every record
    rec = json.loads((out / "index.json").read_text())
    from bertforge.metrics.retrieval import ivf_nlist
    assert rec["nlist"] == ivf_nlist(n) == 10 and ivf_nlist(20) == 1
    assert rec["train_points"] == n and rec["ntotal"] == n and rec["nprobe"] == 10
    assert "warning" not in capfd.readouterr().err.lower()


def test_a_sample_across_shards_trains_the_cells_the_same_way_every_run(model, tmp_path, monkeypatch, capfd):
    from bertforge.cli import main
    from bertforge.pipelines import embed_corpus
    monkeypatch.setattr(embed_corpus, "IVF_TRAIN_POINTS_PER_CELL", 39)  # 390 of 400 rows: a sample
    a = _embed(main, model, tmp_path, 400, 20, "a")
    b = _embed(main, model, tmp_path, 400, 20, "b")
    rec = json.loads((a / "index.json").read_text())
    assert rec["nlist"] == 10 and rec["train_points"] == 390 and rec["train_seed"] == 0
    assert (a / "index.faiss").read_bytes() == (b / "index.faiss").read_bytes()
    from bertforge.pipelines.embed_corpus import ivf_training_sample, read_shards
    plan = json.loads((a / "manifest.json").read_text())
    sample = ivf_training_sample(a, plan, 10)
    vecs, _ = read_shards(a)
    rows = [int(np.flatnonzero((vecs == v).all(1))[0]) for v in sample]
    assert len(set(r // 20 for r in rows)) == 20  # drawn from every shard, not the first
    # 39 points per cell: faiss's minimum, met
    assert "warning" not in capfd.readouterr().err.lower()


def test_too_few_training_points_per_cell_is_one_warning_line(model, tmp_path, capfd):
    from bertforge.cli import main
    capfd.readouterr()
    out = _embed(main, model, tmp_path, 30, 10)
    err = [line for line in capfd.readouterr().err.splitlines() if "warning" in line.lower()]
    assert len(err) == 1 and "30 points for 1 cell" in err[0] and "39" in err[0], err
    rec = json.loads((out / "index.json").read_text())
    assert rec["nlist"] == 1 and rec["train_points"] == 30
