"""`bertforge serve` bounds what oneDNN caches per input shape (a server sees a new shape with almost every
batch: the default 1 024-entry cache grew a MiniLM server's RSS by ~30 MB before it stopped) and keeps
libgomp's spin short, unless the environment says otherwise."""
import os

from bertforge.cli import main


def test_serve_sets_its_defaults_before_torch_runs_and_keeps_explicit_ones(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")  # given: kept
    assert main(["serve", "--model", str(tmp_path / "missing")]) == 2  # a bad dir: exit 2 before listening
    assert "bertforge: error:" in capsys.readouterr().err
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"
    assert os.environ["GOMP_SPINCOUNT"] == "5"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    monkeypatch.delenv("GOMP_SPINCOUNT")
    assert main(["serve", "--model", str(tmp_path / "missing")]) == 2
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"
    assert os.environ["GOMP_SPINCOUNT"] == "1000"
