"""Layer maps: which student layer learns from which teacher layer.

Layers are numbered as ``hidden_states``: 0 = the embedding layer, 1…M the student's blocks, 1…N the
teacher's. A map is a list of ``(student_layer, teacher_layer)`` pairs. Attention-type features of block
m are ``attentions[m − 1]`` (layer 0 has none).

* ``uniform``  — TinyBERT (Jiao et al. 2020, §3.1 "Mapping function"): ``g(m) = m·N/M`` for m = 1…M
  (``⌊m·N/M⌋`` when M does not divide N, so g(M) = N always); 0 ↦ 0 is added by ``with_embeddings``.
* ``pkd_skip`` — BERT-PKD (Sun et al. 2019, §3.2): student j = 1…M−1 learns teacher layer j·N/M (every
  N/M-th layer; the last layer is left to the prediction loss).
* ``pkd_last`` — BERT-PKD: student j = 1…M−1 learns teacher layer N − M + j (the last M−1 blocks before the top).
* ``last``     — MiniLM (Wang et al. 2020, §3.1): only (M, N).
* explicit     — a list of pairs or ``"1:2,2:4"``.
"""
from __future__ import annotations

from typing import Iterable, Union

from ..errors import ConfigError

MapSpec = Union[str, Iterable]


def uniform_map(m: int, n: int, with_embeddings: bool = False) -> list:
    """TinyBERT uniform strategy: [(j, ⌊j·N/M⌋) for j = 1…M] (+ (0, 0))."""
    _check_depths(m, n)
    pairs = [(j, (j * n) // m) for j in range(1, m + 1)]
    return ([(0, 0)] if with_embeddings else []) + pairs


def pkd_skip_map(m: int, n: int) -> list:
    """BERT-PKD PKD-Skip: [(j, ⌊j·N/M⌋) for j = 1…M−1] (e.g. M=6, N=12 → teacher 2,4,6,8,10)."""
    _check_depths(m, n)
    return [(j, (j * n) // m) for j in range(1, m)]


def pkd_last_map(m: int, n: int) -> list:
    """BERT-PKD PKD-Last: [(j, N − M + j) for j = 1…M−1] (e.g. M=6, N=12 → teacher 7,8,9,10,11)."""
    _check_depths(m, n)
    return [(j, n - m + j) for j in range(1, m)]


def last_map(m: int, n: int) -> list:
    """MiniLM: the last student block learns the last teacher block: [(M, N)]."""
    _check_depths(m, n)
    return [(m, n)]


STRATEGIES = {"uniform": uniform_map, "pkd_skip": pkd_skip_map, "pkd_last": pkd_last_map,
              "last": last_map}


def _check_depths(m: int, n: int) -> None:
    if m < 1 or n < 1:
        raise ConfigError(f"layer map needs depths ≥ 1 (student {m}, teacher {n})")
    if m > n:
        raise ConfigError(f"student has {m} layers but the teacher only {n}; a layer map needs a student "
                          f"no deeper than its teacher (use an explicit map to repeat teacher layers)")


def resolve_map(spec: MapSpec, m: int, n: int) -> list:
    """A strategy name, ``"s:t,s:t"`` or a list of pairs → validated list of (student, teacher) pairs.

    Raises:
        ConfigError: unknown strategy, malformed pair, or a layer outside 0…M (student) / 0…N (teacher).
    """
    if isinstance(spec, str):
        key = spec.strip().lower().replace("-", "_")
        if key in STRATEGIES:
            return STRATEGIES[key](m, n)
        try:
            items = spec.split(",")
            if any(not p.strip() for p in items):
                raise ValueError("empty item")
            pairs = [tuple(int(x) for x in p.split(":")) for p in items]
        except ValueError:
            raise ConfigError(f"layer map {spec!r} is neither a strategy ({', '.join(STRATEGIES)}) nor "
                              f"pairs like '1:2,2:4'") from None
    else:
        pairs = [tuple(p) for p in spec]
    out = []
    for p in pairs:
        if len(p) != 2:
            raise ConfigError(f"layer pair {p!r} must be (student_layer, teacher_layer)")
        s, t = int(p[0]), int(p[1])
        if not 0 <= s <= m:
            raise ConfigError(f"layer map pair ({s}, {t}): the student has layers 0…{m} (0 = embeddings)")
        if not 0 <= t <= n:
            raise ConfigError(f"layer map pair ({s}, {t}): the teacher has layers 0…{n} (0 = embeddings)")
        out.append((s, t))
    if not out:
        raise ConfigError(f"layer map {spec!r} is empty; give at least one pair")
    return out
