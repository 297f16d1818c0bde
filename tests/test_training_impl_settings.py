"""``impl`` keys change speed, never results: ``impl.num_workers`` collates the same batches (with the same
random draws) in DataLoader workers, and ``impl.compile`` trains a module through ``torch.compile``.

Independent truths: the run with ``num_workers=0`` / ``compile=false`` (eager, in-process collation)."""
from __future__ import annotations

import pytest
import torch

from bertforge.config import load_recipe
from bertforge.engine.train.trainer import Trainer


class _Regressor(torch.nn.Module):
    """A plain (non-bertforge) module: two layers, dropout, MSE loss, one logged term."""

    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.lin = torch.nn.Linear(4, 8)
        self.drop = torch.nn.Dropout(dropout)  # draws its masks from the global RNG stream, as the encoder's do
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x, y, noise):
        pred = self.out(self.drop(torch.nn.functional.gelu(self.lin(x + noise)))).squeeze(-1)
        loss = ((pred - y) ** 2).mean()
        return {"loss": loss, "terms": {"mse": loss.detach()}}

    def save_pretrained(self, d):
        from safetensors.torch import save_model
        save_model(self, str(d / "model.safetensors"))


def _collate(items):
    """Stacks the rows and draws fresh random noise per batch (as dynamic masking draws its masks)."""
    x = torch.stack([a for a, _ in items])
    return {"x": x, "y": torch.stack([b for _, b in items]), "noise": 0.1 * torch.randn(x.shape)}


def _trainer(tmp_path, name, *overrides, steps=6, dropout=0.0):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, generator=g), torch.randn((), generator=g)) for _ in range(40)]
    recipe = load_recipe(None, ["train.batch_size=8", f"train.max_steps={steps}", "train.lr=1e-2",
                                "train.log_every=1", "impl.progress=false", *overrides])
    return Trainer(_Regressor(dropout), data, _collate, recipe, tmp_path / name)


def _metrics(run_dir):
    import json
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


def test_num_workers_gives_the_same_batches_and_weights(tmp_path):
    plain, workers = _trainer(tmp_path, "b0"), _trainer(tmp_path, "b2", "impl.num_workers=2")
    assert workers.impl.num_workers == 2
    for epoch, skip in ((0, 0), (1, 2)):
        a, b = list(plain._batches(epoch, skip)), list(workers._batches(epoch, skip))
        assert len(a) == len(b) == 5 - skip
        for x, y in zip(a, b):
            assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)  # same rows, same noise
    # trained with dropout on, each run built then fitted as a verb does: starting the workers must not shift
    # the global RNG stream that the dropout masks come from
    plain = _trainer(tmp_path, "w0", dropout=0.3)
    plain.fit()
    workers = _trainer(tmp_path, "w2", "impl.num_workers=2", dropout=0.3)
    workers.fit()
    for (n, p), (_, q) in zip(plain.model.named_parameters(), workers.model.named_parameters()):
        assert torch.equal(p, q), n
    assert _metrics(tmp_path / "w0") == _metrics(tmp_path / "w2")


def test_compile_trains_a_plain_module_like_eager(tmp_path):
    eager, compiled = _trainer(tmp_path, "eager"), _trainer(tmp_path, "compiled", "impl.compile=true")
    assert compiled.train_model is not compiled.model  # the step runs the torch.compile'd module
    eager.fit()
    compiled.fit()
    before = _trainer(tmp_path, "init").model
    moved = max((p - q).abs().max().item() for p, q in zip(before.parameters(), eager.model.parameters()))
    assert moved > 1e-3  # training changed the weights that are compared
    for (n, p), (_, q) in zip(eager.model.named_parameters(), compiled.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-4, rtol=0), n
    assert _metrics(tmp_path / "compiled") == pytest.approx(_metrics(tmp_path / "eager"), abs=1e-4)
    # the saved weights are the trained module's, not a compile wrapper's (no "_orig_mod." prefix)
    from safetensors.torch import load_file
    assert set(load_file(str(tmp_path / "compiled" / "model.safetensors"))) == {
        "lin.weight", "lin.bias", "out.weight", "out.bias"}
