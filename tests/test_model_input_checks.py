"""The model's forward checks its inputs: a wrong shape or dtype, an id outside the vocabulary, a segment id
outside the model's segments or an empty sequence is a ValueError that names the fix (not a bare
IndexError, and never a mask silently ignored); an empty batch passes.
"""
from __future__ import annotations

import re

import pytest
import torch


def test_model_inputs_of_the_wrong_shape_are_value_errors():
    """The library's forward names the fix instead of a bare IndexError (or silently ignoring a mask)."""
    from bertforge.config import ModelConfig
    from bertforge.task_model import TaskModel
    m = TaskModel(ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=8), head="sequence_classification")
    ids = torch.randint(3, 50, (2, 5))
    assert m(ids, torch.ones(2, 5, dtype=torch.long)).logits.shape == (2, 2)
    for args, needle in [((ids, torch.ones(2, 3, dtype=torch.long)), "attention_mask has shape (2, 3)"),
                         ((ids[0],), "got a 1-D"), ((ids.float(),), "torch.float32"),
                         ((torch.randint(3, 50, (1, 9)),), "sequence length 9 exceeds the model's 8")]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            m(*args)


def test_forward_names_bad_ids_and_segments(workspace):
    from bertforge.checkpoint import load_pretrained
    m = load_pretrained(workspace.tiny)
    v = m.config.vocab_size
    ok = torch.tensor([[2, 5, 3]])
    for kwargs, msg in (({"input_ids": torch.tensor([[2, v, 3]])}, f"id {v}, outside the vocabulary"),
                        ({"input_ids": torch.tensor([[2, -1, 3]])}, "id -1, outside the vocabulary"),
                        ({"input_ids": ok, "token_type_ids": torch.tensor([[0, 2, 0]])}, "segment ids 0…1"),
                        ({"input_ids": ok, "token_type_ids": torch.zeros(1, 4, dtype=torch.long)},
                         r"token_type_ids has shape \(1, 4\)"),
                        ({"input_ids": torch.zeros(1, 0, dtype=torch.long)}, "hold no token")):
        with pytest.raises(ValueError, match=msg):
            m(**kwargs)
    assert m(ok, token_type_ids=torch.tensor([[0, 1, 1]])).last_hidden_state.shape == (1, 3, 32)
    assert m(torch.zeros((0, 5), dtype=torch.long)).last_hidden_state.shape == (0, 5, 32)  # an empty batch
