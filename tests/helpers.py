"""Helpers shared by the test files (plain functions, importable from subprocess-driven tests as well as
from the fixtures in conftest.py): tiny SST-2-style data, a tiny BERT checkpoint with its own WordPiece
vocabulary, running the CLI in a subprocess, and the one-error-line contract of a refused CLI call."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = ("good great fine bad awful dull film movie plot actor scene story music long short funny sad "
         "the a an is was very not quite really and but with of").split()


def sentences(n: int, seed: int = 0) -> list:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 12))]
        label = int(any(w in ("good", "great", "fine", "funny") for w in words))
        out.append((" ".join(words), label))
    return out


def write_tsv(path: Path, rows: list) -> Path:
    path = Path(path)
    path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows), encoding="utf-8")
    return path


def make_tiny_checkpoint(path: Path, vocab: int = 120, hidden: int = 32, layers: int = 2, heads: int = 2,
                         max_pos: int = 64, seed: int = 0) -> Path:
    """A randomly initialised BERT (H=32, 2 layers) with a WordPiece vocabulary trained on ``WORDS``."""
    import torch
    from tokenizers.implementations import BertWordPieceTokenizer
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator([s for s, _ in sentences(200)], vocab_size=vocab, min_frequency=1)
    tok = wp._tokenizer
    torch.manual_seed(seed)
    cfg = ModelConfig(model_type="bert", vocab_size=tok.get_vocab_size(), hidden_size=hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=2 * hidden,
                      max_position_embeddings=max_pos)
    TaskModel(cfg, head="base").save_pretrained(path, tokenizer=tok)
    return Path(path)


def write_file(path: Path, data) -> Path:
    """Write ``data`` (bytes as they are, text as UTF-8) to ``path``; returns ``path``."""
    path = Path(path)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def cli_env(**extra) -> dict:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               BERTFORGE_NO_PROGRESS="1", PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def bertforge_cmd(*args) -> list:
    return [sys.executable, "-m", "bertforge", *map(str, args)]


def torchrun_cmd(nproc: int, *args) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "bertforge", *map(str, args)]


def run(cmd: list, timeout: float = 300, **env) -> subprocess.CompletedProcess:
    if "torch.distributed.run" in cmd and "TMPDIR" not in env:  # torchrun's torchelastic_* dirs go away after
        import tempfile
        with tempfile.TemporaryDirectory(prefix="bertforge-torchrun-") as tmp:
            return run(cmd, timeout, TMPDIR=tmp, **env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=cli_env(**env),
                          cwd=str(REPO))


def read_metrics(run_dir: Path) -> list:
    import json
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def load_weights(path: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(path))


def snapshot(root: Path) -> dict:
    """{relative path: sha1} of every file under ``root`` (to show a run dir was left untouched)."""
    import hashlib
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


def cli_error_line(argv: list, capsys, untouched: Path) -> str:
    """Run ``bertforge argv`` in-process and assert the bad-input contract: exit 2, one ``bertforge … error:``
    line on stderr, no traceback, ``untouched`` unchanged, and no new ``--out`` dir left behind (an empty
    one may stay). Returns the error line."""
    from bertforge.cli import main
    argv = [str(a) for a in argv]
    before = snapshot(untouched)
    new_outs = [Path(argv[i + 1]) for i, a in enumerate(argv[:-1]) if a == "--out"]
    existed = {p: p.exists() for p in new_outs}
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse usage errors
        code = e.code
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2, (code, err)
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert lines[0].startswith("bertforge") and "error:" in lines[0], lines[0]
    assert snapshot(untouched) == before, "the earlier run dir was modified"
    for p, ex in existed.items():
        if not ex:
            assert not p.exists() or not any(p.iterdir()), f"{p} was left behind"
    return lines[0]
