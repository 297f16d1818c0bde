"""The layers of docs/architecture.md hold: the import-linter contracts of pyproject.toml pass, and no two
bertforge modules import each other, directly or through others (imports inside functions count too)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]


def import_graph():
    return grimp.build_graph("bertforge", cache_dir=None)


def strongly_connected(graph) -> list:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_cycle_finder_finds_a_cycle_and_counts_imports_inside_functions(tmp_path, monkeypatch):
    """The check below is real: a package whose two modules import each other (one of them inside a
    function) is reported; the same package without that import is not."""
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert strongly_connected(grimp.build_graph("cyclepkg", cache_dir=None)) == [["cyclepkg.a", "cyclepkg.b"]]
    (pkg / "b.py").write_text("def f():\n    return 1\n")
    assert strongly_connected(grimp.build_graph("cyclepkg", cache_dir=None)) == []


def test_no_import_cycles_among_bertforge_modules():
    cycles = strongly_connected(import_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([exe, "--no-cache"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "BROKEN" not in r.stdout and "KEPT" in r.stdout


def test_heads_are_registered_in_one_table_whatever_was_imported_before():
    """A fresh interpreter that imports only TaskModel builds every head by name; nothing depends on
    which modules registered what before."""
    code = ("from bertforge.config import ModelConfig\n"
            "from bertforge.task_model import TaskModel\n"
            "from bertforge.heads import HEADS\n"
            "cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,"
            " intermediate_size=64, max_position_embeddings=32)\n"
            "fams = {'mlm_nsp': 'bert', 'mlm_sop': 'albert', 'mlm_sbo': 'bert', 'electra_discriminator': 'electra'}\n"
            "for name in HEADS:\n"
            "    extra = {'add_pooling_layer': True} if name in ('mlm_nsp', 'mlm_sop') else {}\n"
            "    c = ModelConfig(model_type=fams.get(name, 'bert'), **cfg, **extra,"
            " **({'num_labels': 2} if name == 'question_answering' else {}))\n"
            "    m = TaskModel(c, head=name)\n"
            "    assert m.head_name == name\n"
            "print(sorted(HEADS))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(sorted(["base", "sequence_classification", "token_classification",
                                           "question_answering", "mlm", "mlm_nsp", "mlm_sop", "mlm_sbo",
                                           "electra_discriminator", "embedding"]))
