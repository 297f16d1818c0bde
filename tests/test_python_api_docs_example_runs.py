"""docs/python.md's session, run as written: the Python API (bertforge.embed / quantize / finetune / export /
evaluate / distill / serve).

Truths: the session's own claims — the embedding pair that is close in meaning is closer than the unrelated
one; the AVX2 INT8 dir records the 7-bit scheme and a cosine gate, and its vectors keep cosine ≥ 0.95 with
FP32's; the export's FP32 parity is < 1e-4; evaluate scores exactly the rows asked for, with the same metrics
the CLI prints for the same dir; a 64-step fine-tune is above chance, and its exported graph scores what the run
reported on the same 200 dev rows; the 32-step distillation writes a student with the two layers asked for (the
dir's own config.json), fewer parameters than its teacher, and `evaluate` of that dir scores what the run's last
evaluation reported; the server it starts answers with both SST-2 labels and probabilities that
sum to 1, the model's own prediction for that text first, and is stopped after.
"""
import json
import re
from pathlib import Path

import numpy as np
import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "python.md"


def test_the_python_session_of_the_docs_runs_and_its_claims_hold(tmp_path, data_dir, minilm_dir, monkeypatch,
                                                                   capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1
    monkeypatch.setenv("BERTFORGE_DATA", str(data_dir))
    monkeypatch.setenv("BERTFORGE_WORK", str(tmp_path / "work"))
    ns = {}
    exec(compile(blocks[0], str(DOC), "exec"), ns)  # noqa: S102  (our own documentation)
    v, v8, q, ft, onnx, r = ns["v"], ns["v8"], ns["q"], ns["ft"], ns["onnx"], ns["r"]
    sims = v @ v.T
    assert v.shape == (3, 384) and sims[0, 1] > sims[0, 2] and sims[0, 1] > sims[1, 2]
    assert q.record["scheme"] == "u8s8-7bit" and q.record["target"] == "avx2" and "cosine" in q.gate["metric"]
    assert json.loads((q.out / "onnx.json").read_text())["scheme"] == "u8s8-7bit"
    assert ((v * v8).sum(1) >= 0.95).all()
    assert onnx.record["fp32_max_abs_diff"] < 1e-4 and (onnx.out / "model.onnx").is_file()
    assert ft.metrics["step"] == 64 and (ft.out / "recipe.yaml").is_file() and (ft.out / "model.safetensors").is_file()
    assert r.task.name == "sst2" and r.n == 200 and ft.metrics["accuracy"] > 0.6
    assert r.metrics["accuracy"] == pytest.approx(ft.metrics["accuracy"], abs=0.011)  # ONNX vs PyTorch: ≤ 2 rows
    kd, s = ns["kd"], ns["s"]
    cfg = json.loads((kd.out / "config.json").read_text())
    assert kd.metrics["step"] == 32 and kd.metrics["method"] == "kd" and kd.metrics["stage"] == "task"
    assert cfg["num_hidden_layers"] == 2 and cfg["bertforge"]["task"] == "sst2"
    assert kd.metrics["student_params"] < kd.metrics["teacher_params"]
    assert s.n == 200 and s.metrics["accuracy"] == pytest.approx(kd.metrics["accuracy"], abs=1e-9)
    answer, srv = ns["answer"], ns["srv"]
    assert sorted(a["label"] for a in answer) == ["0", "1"] and sum(a["score"] for a in answer) == pytest.approx(1)
    from bertforge.checkpoint import load_pretrained
    from bertforge.tokenizer import load_tokenizer
    import torch
    enc = load_tokenizer(ft.out).encode("a gripping, funny film")
    with torch.no_grad():
        z = load_pretrained(ft.out).eval()(torch.tensor([enc.ids])).logits[0]
    assert answer[0]["label"] == ["0", "1"][int(z.argmax())] and not srv.running
    # the CLI's evaluate of the same dir prints the same metrics (the verb calls this function)
    from bertforge.cli import main
    capsys.readouterr()
    assert main(["evaluate", "--model", str(onnx.out), "--data", str(data_dir / "glue/SST-2/dev.tsv"),
                 "--max-samples", "200"]) == 0
    cli = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli["accuracy"] == pytest.approx(r.metrics["accuracy"]) and cli["n"] == 200


def test_python_api_errors_name_the_python_options(tmp_path, capsys):
    """The CLI's check, worded with the Python option's name for a Python caller (and the flag for the CLI);
    values of the wrong type refused in one line before anything is written."""
    import bertforge
    from bertforge.cli import main
    from bertforge.errors import BertforgeError, ConfigError
    with pytest.raises(BertforgeError, match=r"^max_drop -1 is not a number of points"):
        bertforge.quantize("minilm", tmp_path / "q", max_drop=-1)
    assert main(["quantize", "--model", "minilm", "--out", str(tmp_path / "q"), "--max-drop", "-1"]) == 2
    assert "--max-drop -1 is not a number of points" in capsys.readouterr().err
    with pytest.raises(BertforgeError, match="unknown option"):
        bertforge.quantize("minilm", tmp_path / "q", max_dorp=1)
    for bad, said in (({"overwrite": "no"}, "overwrite='no' is a str; pass True or False"),
                      ({"max_drop": "0.5"}, "max_drop='0.5' is a str; pass a number"),
                      ({"calib_samples": 1.5}, "calib_samples=1.5 is a float; pass a whole number"),
                      ({"scheme": "u4"}, "scheme 'u4' is not an INT8 scheme")):
        with pytest.raises(ConfigError, match=said):
            bertforge.quantize("minilm", tmp_path / "q", **bad)
    for texts in (None, 3, ["ok", 4]):
        with pytest.raises(ConfigError, match="texts"):
            bertforge.embed("minilm", texts)
    with pytest.raises(ConfigError, match="max_seq_len=2 leaves no room"):
        bertforge.embed("minilm", ["x"], max_seq_len=2)
    assert bertforge.embed("minilm", (t for t in ["a", "b"])).shape == (2, 384)  # any iterable, read once
    with pytest.raises(BertforgeError, match="list of strings"):
        bertforge.embed("minilm", "one text")
    assert not (tmp_path / "q").exists()
    assert np.asarray(bertforge.embed("minilm", ["x"])).shape == (1, 384)
    # checks below the API (the embedder, the task loader) worded with the Python name, the flag for the CLI
    with pytest.raises(ConfigError) as e:
        bertforge.embed("minilm", ["x"], dim=0)
    assert "--dim" not in str(e.value) and "dim" in str(e.value)
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\na fine film\t1\n")
    with pytest.raises(ConfigError, match=r"^max_seq_len 1 must be ≥ 2"):
        bertforge.evaluate("minilm", str(dev), task="sst2", max_seq_len=1)
    assert main(["evaluate", "--model", "minilm", "--data", str(dev), "--task", "sst2", "--max-seq-len", "1"]) == 2
    assert "--max-seq-len 1 must be ≥ 2" in capsys.readouterr().err
