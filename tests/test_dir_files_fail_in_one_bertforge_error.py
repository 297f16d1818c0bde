"""Property-based (hypothesis): whatever a model dir's declaration files hold — random bytes, any JSON value, or
the keys bertforge reads with values of any type — opening the dir (:meth:`ModelDir.open`) and reading what it
declares (:mod:`bertforge.checkpoint.layout`'s readers, ModelDir's properties) either answers or raises a
:class:`~bertforge.errors.BertforgeError` (one line saying what to fix); never a traceback of another type.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                    | st.text(max_size=12),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
                    max_leaves=8)
#: what each file may declare: its keys, each with a value of any JSON type
KEYS = {
    "config.json": ["model_type", "max_position_embeddings", "pad_token_id", "hidden_size", "id2label",
                    "architectures", "bertforge_head", "bertforge"],
    "config_sentence_transformers.json": ["prompts", "default_prompt_name", "truncate_dim"],
    "sentence_bert_config.json": ["max_seq_length", "do_lower_case"],
    "1_Pooling/config.json": ["pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens"],
    "manifest.json": ["bundle"],
    "onnx.json": ["quantization"],
    "model.safetensors.index.json": ["weight_map"],
}
BERTFORGE = st.dictionaries(st.sampled_from(["task", "task_spec", "max_seq_len", "thresholds", "pooling",
                                             "quantization"]), JSON | st.dictionaries(st.just("bits"), JSON),
                            max_size=4)


def file_content(name):
    keyed = st.fixed_dictionaries({}, optional={k: (BERTFORGE if k == "bertforge" else JSON) for k in KEYS[name]})
    return (st.binary(max_size=40) | JSON.map(lambda v: json.dumps(v).encode())
            | keyed.map(lambda d: json.dumps(d).encode()))


MODULES = st.lists(st.fixed_dictionaries({}, optional={"path": JSON | st.sampled_from(["1_Pooling", "", "../x"]),
                                                       "type": st.sampled_from([
                                                           "sentence_transformers.models.Pooling",
                                                           "sentence_transformers.models.Normalize"]) | JSON}),
                   max_size=3).map(lambda v: json.dumps(v).encode()) | st.binary(max_size=20)

DIR = st.fixed_dictionaries({"config.json": file_content("config.json")},
                            optional={**{n: file_content(n) for n in KEYS if n != "config.json"},
                                      "modules.json": MODULES})


@settings(max_examples=150, **SETTINGS)
@given(files=DIR)
def test_any_declaration_files_open_or_fail_in_one_bertforge_error(files):
    from bertforge.checkpoint import layout
    from bertforge.checkpoint.modeldir import ModelDir
    from bertforge.errors import BertforgeError
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for name, data in files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_bytes(data)
        readers = [lambda: ModelDir.open(d), lambda: layout.read_config(d), lambda: layout.read_pooling(d),
                   lambda: layout.read_truncate_dim(d), lambda: layout.read_prompts(d),
                   lambda: layout.weight_files(d), lambda: layout.shard_index(d)]
        for read in readers:
            try:
                read()
            except BertforgeError as e:
                assert str(e) and "\n" not in str(e).strip()
        try:
            md = ModelDir.open(d)
        except BertforgeError:
            return
        for prop in ("model_type", "head", "labels", "max_seq_len", "positions", "describe", "is_static",
                     "is_int8", "backend", "prompts", "truncate_dim"):
            try:
                v = getattr(md, prop)
                v() if callable(v) else v
            except BertforgeError as e:
                assert str(e)
        if md.prompts.default_prompt_name is not None:  # a declared default is one of the prompts
            assert md.prompts.default_prompt_name in md.prompts.prompts
