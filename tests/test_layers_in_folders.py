"""A module's folder says its layer (docs/architecture.md): core → engine → runtime → cli, imports point down.

Independent of import-linter (pyproject.toml holds the same layers as contracts): every module under
src/bertforge is read with ``ast`` (nothing is imported or run), put in a layer by the table below — by its
folder, never by its name — and every import it makes, inside functions too, is checked against the layer of
the module it names.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "bertforge"

#: the layers, lowest first
LAYERS = ("core", "engine", "runtime", "pipelines", "cli")

#: folder under src/bertforge → its layer; "" is the modules at the top of the package. A new folder gets a
#: row here (the test below fails until it has one).
FOLDER_LAYER = {
    "": "core",  # config, errors, hardware, heads, io, task_model, tokenizer (and __init__: lazy names)
    "checkpoint": "core",
    "compress": "core",
    "data": "core",
    "distillation": "core",
    "metrics": "core",
    "models": "core",
    "objectives": "core",
    "tasks": "core",
    "engine": "engine",
    "runtime": "runtime",
    "pipelines": "pipelines",  # the Python API the CLI calls
    "cli": "cli",
    "server": "cli",  # the HTTP front end, beside the command line (cli/)
}

#: the one module at the top that is not core: ``python -m bertforge`` needs ``bertforge/__main__.py``
TOP_MODULE_LAYER = {"__main__": "cli"}

#: upward imports allowed, at most (docs/architecture.md lists those there are). None is left, and the
#: import-linter contracts of pyproject.toml allow none either.
MAX_UPWARD = 0


def modules(root: Path) -> dict:
    """Dotted name (``bertforge.cli.commands.finetune``) → ``(path, folder)`` of every module under ``root``;
    ``folder`` is the first folder below ``root`` ("" for the modules at the top)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        parts = [root.name, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = (p, rel.parts[0] if len(rel.parts) > 1 else "")
    return out


def layer_of(name: str, mods: dict, folder_layer: dict = FOLDER_LAYER, top: dict = TOP_MODULE_LAYER) -> str:
    folder = mods[name][1]
    if folder == "":
        return top.get(name.rsplit(".", 1)[-1], folder_layer[""])
    return folder_layer[folder]


def imports(name: str, mods: dict) -> set:
    """The modules of ``mods`` that module ``name`` imports (anywhere in it, relative or absolute)."""
    path = mods[name][0]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                for cand in (f"{target}.{alias.name}", target):  # a submodule, else the module's own name
                    if cand in mods:
                        out.add(cand)
                        break
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                while parts and ".".join(parts) not in mods:
                    parts.pop()
                if parts:
                    out.add(".".join(parts))
    out.discard(name)
    return out


def upward_imports(root: Path, folder_layer: dict = FOLDER_LAYER, top: dict = TOP_MODULE_LAYER) -> list:
    """``(importer, its layer, imported, its layer)`` for every import that points to a higher layer."""
    mods = modules(root)
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    found = []
    for name in sorted(mods):
        mine = layer_of(name, mods, folder_layer, top)
        for other in sorted(imports(name, mods)):
            theirs = layer_of(other, mods, folder_layer, top)
            if rank[theirs] > rank[mine]:
                found.append((name, mine, other, theirs))
    return found


def _listed(rows) -> str:
    return "\n".join(f"  {a} ({la}) imports {b} ({lb})" for a, la, b, lb in rows)


def test_every_folder_has_a_layer():
    folders = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders - set(FOLDER_LAYER) == set(), "folders with no layer in FOLDER_LAYER"
    assert set(FOLDER_LAYER) - {""} - folders == set(), "FOLDER_LAYER names folders that do not exist"
    assert set(FOLDER_LAYER.values()) | set(TOP_MODULE_LAYER.values()) <= set(LAYERS)


def test_imports_point_down():
    up = upward_imports(SRC)
    assert len(up) <= MAX_UPWARD, f"{len(up)} imports point to a higher layer (at most {MAX_UPWARD}):\n{_listed(up)}"


def test_nothing_outside_cli_imports_cli():
    """cli/ is the top: not even server/ (the other front end, same layer) imports it."""
    mods = modules(SRC)
    offenders = [(a, layer_of(a, mods), b, "cli") for a in sorted(mods) if mods[a][1] != "cli"
                 and a != "bertforge.__main__" for b in sorted(imports(a, mods)) if mods[b][1] == "cli"]
    assert offenders == [], f"modules outside cli/ that import cli/:\n{_listed(offenders)}"


def test_the_import_linter_contracts_are_this_table():
    """pyproject.toml has one contract per layer below the top, whose sources are that layer's folders (for
    core, with the modules at the top) and whose forbidden modules are the folders of every layer above."""
    tomllib = pytest.importorskip("tomllib")  # Python ≥ 3.11
    config = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    mods = modules(SRC)
    folders = {layer: {f"bertforge.{f}" for f, lay in FOLDER_LAYER.items() if f and lay == layer} for layer in LAYERS}
    folders["core"] |= {n for n, (_, f) in mods.items() if f == "" and n.count(".") == 1
                        and n.rsplit(".", 1)[1] not in TOP_MODULE_LAYER}
    for i, layer in enumerate(LAYERS[:-1]):
        above = set().union(*(folders[up] for up in LAYERS[i + 1:]))
        assert any(set(c["source_modules"]) == folders[layer] and set(c["forbidden_modules"]) == above
                   for c in contracts), f"no contract with sources {sorted(folders[layer])}, forbidden {sorted(above)}"


def test_the_checks_see_upward_imports(tmp_path):
    """The checks are real: a core module that imports the runtime inside a function, and one that imports
    the CLI by an absolute name, are both reported; relative imports that point down are not."""
    pkg = tmp_path / "bertforge"
    for d in ("", "models", "runtime", "cli", "cli/commands"):
        (pkg / d).mkdir(parents=True, exist_ok=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "models" / "encoder.py").write_text("from ..errors import X\n"
                                               "def f():\n    from ..runtime import load_runner\n")
    (pkg / "runtime" / "base.py").write_text("from ..models.encoder import Encoder\nfrom . import base\n")
    (pkg / "cli" / "commands" / "finetune.py").write_text("from ...runtime import base\nfrom .. import commands\n")
    (pkg / "heads.py").write_text("import bertforge.cli.commands.finetune\n")
    up = upward_imports(pkg)
    assert [(a, b) for a, _, b, _ in up] == [("bertforge.heads", "bertforge.cli.commands.finetune"),
                                             ("bertforge.models.encoder", "bertforge.runtime")]
