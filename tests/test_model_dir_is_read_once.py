"""A model dir is read once into one typed object (``bertforge.checkpoint.modeldir.ModelDir``), and nothing else
reads its files: what each kind of dir bertforge writes holds (the format), its metadata and pooling as the
files say, and — read from the sources with ``ast`` — no module outside ``checkpoint/`` calls a dir probe or
names the ``bertforge`` section of ``config.json``."""
import ast
import json
import sys
from pathlib import Path

import pytest

from helpers import make_tiny_checkpoint

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """One dir of each format, made with the Python API from one tiny checkpoint."""
    import bertforge
    from bertforge.checkpoint.read import load_pretrained
    from bertforge.compress.quantize import quantize_dynamic, save_quantized
    d = tmp_path_factory.mktemp("formats")
    fp32 = make_tiny_checkpoint(d / "fp32")
    bertforge.export(fp32, d / "onnx")
    bertforge.quantize(fp32, d / "int8", max_drop=100.0, calib=["a short text", "another one here"])
    model = load_pretrained(fp32)
    save_quantized(quantize_dynamic(model), model, d / "torch-int8", tokenizer_dir=fp32)
    return d


def test_each_kind_of_dir_opens_with_its_format_and_declarations(dirs, minilm_dir):
    from bertforge.checkpoint.modeldir import FORMATS, ModelDir
    for fmt in ("fp32", "onnx", "int8", "torch-int8"):
        md = ModelDir.open(dirs / fmt)
        assert md.format == fmt and md.format in FORMATS
        assert md.config["model_type"] == "bert"
        assert (md.graph is not None) == (fmt in ("onnx", "int8"))
        assert md.tokenizer().encode("hello world").ids  # the dir's own tokenizer files
    assert ModelDir.open(dirs / "int8" / "model.onnx").path == dirs / "int8"  # a graph file opens its folder
    # the bundled all-MiniLM-L6-v2 declares mean pooling, unit vectors and 256 tokens (its ST files say so)
    ml = ModelDir.open("minilm")
    st = json.loads((minilm_dir / "sentence_bert_config.json").read_text())
    modules = json.loads((minilm_dir / "modules.json").read_text())
    assert (ml.format, ml.pooling.mode, ml.max_seq_len) == ("fp32", "mean", st["max_seq_length"])
    assert ml.pooling.normalize == any(m["type"].endswith("Normalize") for m in modules)


def test_meta_reads_the_bertforge_section_typed(tmp_path):
    from bertforge.checkpoint.layout import META_KEY, with_meta
    from bertforge.checkpoint.modeldir import Meta, ModelDir
    d = make_tiny_checkpoint(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    th = {"use": "global", "global": 0.3}
    cfg = with_meta(cfg, task="goemotions", max_seq_len=64, thresholds=th, task_spec={"metric": "f1"}, note=1)
    (d / "config.json").write_text(json.dumps(cfg))
    m = ModelDir.open(d).meta
    assert (m.task, m.max_seq_len, m.thresholds, m.task_spec, m.get("note")) == ("goemotions", 64, th,
                                                                               {"metric": "f1"}, 1)
    assert Meta.from_config({META_KEY: {"max_seq_len": "64", "task": 3}}) == Meta(raw={"max_seq_len": "64",
                                                                                       "task": 3})


def test_opening_a_dir_loads_no_torch(dirs):
    import subprocess
    code = ("import sys; from bertforge.checkpoint.modeldir import ModelDir; "
            f"md = ModelDir.open({str(dirs / 'int8')!r}); "
            "print(md.format, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["int8", "False"], out.stderr


def test_bad_dirs_give_one_line(tmp_path):
    from bertforge.checkpoint.modeldir import ModelDir
    from bertforge.errors import CheckpointError
    for path, words in ((tmp_path / "nope", "does not exist"), (tmp_path, "no config.json")):
        with pytest.raises(CheckpointError, match=words) as e:
            ModelDir.open(path)
        assert "\n" not in str(e.value)


#: the functions that read a dir's files; only the checkpoint package calls them
PROBES = {"read_config", "read_pooling", "read_truncate_dim", "is_static_dir", "is_quantized_dir", "find_graph",
          "deployed_format", "resolve_model_dir"}


def _calls(path: Path) -> list:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in PROBES:
                out.append((name, node.lineno))
        if isinstance(node, ast.Constant) and node.value == "bertforge" and _is_subscript_or_get(node, tree):
            out.append(("'bertforge' section", node.lineno))
    return out


def _is_subscript_or_get(const, tree) -> bool:
    """Whether the string constant is a dict key read (``cfg["bertforge"]``, ``cfg.get("bertforge")``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and node.slice is const:
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "get", "setdefault", "pop") and node.args and node.args[0] is const:
            return True
    return False


def test_only_the_checkpoint_package_probes_dirs_or_reads_the_bertforge_section():
    found = []
    for p in sorted(SRC.rglob("*.py")):
        if p.relative_to(SRC).parts[0] == "checkpoint":
            continue
        found += [f"{p.relative_to(SRC)}:{line} {what}" for what, line in _calls(p)]
    assert found == [], "read the dir through ModelDir instead:\n" + "\n".join(found)
