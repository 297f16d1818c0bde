"""`import bertforge` is light: torch and the rest load on first use of a name, not at import time.

Independent truth: ``sys.modules`` of a fresh interpreter.
"""
from __future__ import annotations

import subprocess
import sys


def test_import_bertforge_does_not_load_torch_until_used():
    code = ("import sys, bertforge; a = 'torch' in sys.modules; from bertforge import ModelConfig, load_pretrained; "
            "print(a, 'torch' in sys.modules, ModelConfig.__name__, callable(load_pretrained))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "ModelConfig", "True"]


#: modules the command line must not load before a verb runs (each costs 0.1–3 s to import)
HEAVY = ("torch", "numpy", "transformers", "tokenizers", "safetensors", "scipy", "sklearn", "onnxruntime",
         "onnx", "seqeval", "datasets", "matplotlib", "tqdm")

_PROBE = r"""
import json, sys
from bertforge.cli import _verbs, main
HEAVY = %r
calls = [["--help"], ["--version"], [], ["no-such-verb"], ["finetune", "--no-such-flag"], ["finetune"],
         ["translate", "train", "--help"], ["distill", "--method", "nope", "--teacher", "t", "--out", "o"]]
calls += [[verb, "--help"] for verb in sorted(_verbs())]
codes = []
for argv in calls:
    try:
        codes.append(main(argv))
    except SystemExit as e:
        codes.append(e.code)
loaded = sorted(m for m in HEAVY if m in sys.modules)
import bertforge.tasks  # the control: a heavy module of bertforge does load torch, and the probe sees it
print(json.dumps({"calls": calls, "codes": codes, "loaded": loaded, "control": "torch" in sys.modules}))
"""


def test_cli_help_version_and_argument_errors_import_no_heavy_module():
    """``bertforge --help``, every verb's ``--help``, ``--version`` and argument errors (unknown verb, flag or
    choice, a missing required option, no verb) answer before torch, numpy, transformers … are imported.
    Independent truth: ``sys.modules`` of a fresh interpreter after all those calls; the control import at
    the end shows the probe would see torch had anything loaded it."""
    import json
    res = subprocess.run([sys.executable, "-c", _PROBE % (HEAVY,)], capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    codes = dict(zip(map(tuple, out["calls"]), out["codes"]))
    assert codes[("--help",)] == 0 and codes[("--version",)] == 0
    assert all(codes[c] == 0 for c in codes if c[-1:] == ("--help",)), codes
    for bad in [(), ("no-such-verb",), ("finetune", "--no-such-flag"), ("finetune",),
                ("distill", "--method", "nope", "--teacher", "t", "--out", "o")]:
        assert codes[bad] == 2, (bad, codes[bad])
    assert len(codes) > 15  # every verb was asked
    assert out["loaded"] == [], f"imported before a verb ran: {out['loaded']}"
    assert out["control"] is True


def test_version_flag_prints_the_package_version():
    from bertforge import __version__
    res = subprocess.run([sys.executable, "-m", "bertforge", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == f"bertforge {__version__}"


def test_light_names_equal_the_registries():
    """:mod:`bertforge.cli.names` (what the parsers offer without importing torch) lists exactly the keys of each
    registry, in its order."""
    from bertforge.cli import names
    from bertforge.distillation.distiller import METHODS
    from bertforge.distillation.mapping import STRATEGIES
    from bertforge.objectives.pretrain import OBJECTIVES, SIZES
    from bertforge.runtime.base import BACKENDS
    from bertforge.tasks import TASKS
    assert names.TASK_NAMES == tuple(TASKS)
    assert names.OBJECTIVE_NAMES == tuple(OBJECTIVES)
    assert names.SIZE_NAMES == tuple(SIZES)
    assert names.DISTILL_METHODS == tuple(METHODS)
    assert all(tuple(stages) == names.DISTILL_STAGES for stages in METHODS.values())
    assert names.LAYER_MAPS == tuple(STRATEGIES)
    assert names.BACKENDS == tuple(BACKENDS)
    from bertforge.metrics.retrieval import INDEX_KINDS
    assert names.INDEX_KINDS == INDEX_KINDS
    from bertforge.compress.int8 import CALIBRATION_METHODS, SCHEMES, TARGETS
    assert (names.INT8_TARGETS, names.INT8_SCHEMES, names.CALIBRATION_METHODS) == \
        (TARGETS, tuple(SCHEMES), CALIBRATION_METHODS)


def test_choices_take_registry_entries_added_from_user_code_without_importing_it(monkeypatch):
    """docs/extending.md: ``OBJECTIVES["mlm40"] = …`` from the user's code makes ``--objective mlm40`` valid;
    a name in no table is refused without importing the registry."""
    from bertforge.cli.names import Choices
    from bertforge.objectives import pretrain
    c = Choices(("bert",), "bertforge.objectives.pretrain:OBJECTIVES")
    assert "bert" in c and "mlm40" not in c
    monkeypatch.setitem(pretrain.OBJECTIVES, "mlm40", object())
    assert "mlm40" in c and list(c)[0] == "bert" and "mlm40" in list(c)
    assert "x" not in Choices(("a",), "bertforge.no_such_module:TABLE") and list(Choices(("a",), "m.n:T")) == ["a"]


def test_no_public_name_is_both_a_module_and_a_function():
    """``bertforge.distill`` and ``bertforge.serve`` are functions; the distillation subpackage and the server
    package have their own names; no module of the package swaps its class (issue 50, step 4). Independent
    truth: ``inspect`` and ``types`` in a fresh interpreter, and the source text of every module."""
    import ast
    from pathlib import Path
    code = ("import bertforge, inspect, types, importlib; "
            "print(inspect.isfunction(bertforge.distill), inspect.isfunction(bertforge.serve), "
            "type(importlib.import_module('bertforge.distillation')) is types.ModuleType, "
            "type(importlib.import_module('bertforge.server')) is types.ModuleType, "
            "bertforge.distill.__module__, bertforge.serve.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "True", "True", "bertforge.pipelines.distill", "bertforge.server.background"]
    swaps = []
    for path in (Path(__file__).resolve().parents[1] / "src" / "bertforge").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "attr", getattr(b, "id", "")) == "ModuleType"
                                                      for b in node.bases):
                swaps.append(f"{path.name}: class {node.name}(ModuleType)")
    assert swaps == []
