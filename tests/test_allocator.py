"""impl.keep_freed_memory: glibc malloc keeps freed blocks, so re-allocating them takes no page faults."""
import subprocess
import sys
import textwrap

import pytest
import torch

from bertforge.engine.kernels import allocator

_PROBE = textwrap.dedent("""
    import resource, sys, torch
    from bertforge.engine.kernels import allocator
    if sys.argv[1] == "keep":
        assert allocator.keep_freed_memory()
    else:  # glibc's initial thresholds (128 KiB), fixed: what a process gets before its first large free
        libc = allocator._glibc()
        assert libc.mallopt(allocator.M_MMAP_THRESHOLD, 128 << 10)
        assert libc.mallopt(allocator.M_TRIM_THRESHOLD, 128 << 10)
    MB = 1 << 20
    def one_round():
        # what a training step does: several mid-sized tensors (below 32 MiB) alive at once, then all freed
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [torch.ones(6 * MB) for _ in range(4)]  # 4 × 24 MiB, every page written
        del blocks
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    for _ in range(6):  # the heap reaches its peak layout (within 3 rounds here)
        one_round()
    print(max(one_round() for _ in range(3)))
""")


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(allocator._glibc() is None, reason="needs glibc (Linux)")
def test_freed_blocks_are_reused_without_page_faults():
    pages = 4 * 24 * 256  # 4 KiB pages in one round's tensors
    kept = _faults("keep")
    assert kept < 0.05 * pages, kept  # the round's memory comes back from the heap: (almost) no fresh pages
    small = _faults("small")
    assert small > 0.9 * pages, small  # 128 KiB thresholds: every block mapped and unmapped, every page again


def test_trainer_applies_it_on_cpu_unless_turned_off(tmp_path, monkeypatch):
    from bertforge.config import ModelConfig, load_recipe
    from bertforge.data.collate import PadCollator
    from bertforge.task_model import TaskModel
    from bertforge.engine.train import trainer as trainer_mod

    calls = []
    monkeypatch.setattr(trainer_mod, "keep_freed_memory", lambda: calls.append(1) or True)
    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32, num_labels=2)
    data = [{"input_ids": [3, 4, 5], "token_type_ids": [0, 0, 0], "labels": 1}] * 8
    for flag, expected in (("true", 1), ("false", 0)):
        calls.clear()
        recipe = load_recipe(None, ["train.batch_size=4", "train.max_steps=1", "impl.progress=false",
                                    f"impl.keep_freed_memory={flag}"])
        assert recipe.impl.keep_freed_memory is (flag == "true")
        trainer_mod.Trainer(TaskModel(cfg, head="sequence_classification"), data, PadCollator(0), recipe,
                            tmp_path / flag)
        assert len(calls) == expected


def test_keep_freed_memory_is_idempotent_and_reports_glibc():
    first = allocator.keep_freed_memory()
    assert first is (allocator._glibc() is not None)
    assert allocator.keep_freed_memory() is first
    torch.ones(8 << 20).sum()  # allocation still works


_TRIM_PROBE = textwrap.dedent("""
    import sys
    from bertforge.engine.kernels import allocator
    assert allocator.tame_malloc()  # bertforge serve's setting
    def rss():
        for ln in open("/proc/self/status"):
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) << 10
    # what a server's ordinary requests leave: many 4 KB blocks (below the mmap threshold, so from the heap),
    # nine in ten freed, the tenth still alive and pinning the heap around the holes
    blocks = [bytes(4000) + bytes([i % 251]) for i in range(40_000)]
    keep = blocks[::10]
    del blocks
    before = rss()
    allocator.trim()
    print(before, rss())
""")


@pytest.mark.skipif(allocator._glibc() is None, reason="needs glibc (Linux)")
def test_trim_returns_fragmented_free_heap_pages():
    out = subprocess.run([sys.executable, "-c", _TRIM_PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    freed = 36_000 * 4000  # ~137 MiB freed, in holes between live blocks: free() alone gives none of it back
    assert before - after > 0.5 * freed, (before, after)
