"""The order in which a training run sees its data, and its global micro-batches.

Data order (what makes 1 process ≡ N processes, and resume ≡ no interruption): epoch ``e`` is a
permutation of the dataset that is a pure function of ``(train.seed, e)`` (:class:`EpochSampler`); global
micro-batch ``j`` of epoch ``e`` is the slice ``[j·B, (j+1)·B)`` of it (``B = train.batch_size``; with
``train.no_duplicates`` and a dataset that names its texts, the permutation is first rearranged so that no
slice holds one text twice: :func:`no_duplicate_batches`), and it is
collated — with the collator's random draws (dynamic masking, as RoBERTa's, Liu et al. 2019 §4.1) seeded by
``(seed, e, j)`` — identically on every rank; rank ``r`` of ``W`` then trains on rows ``r, r+W, …`` of it
(:class:`GlobalMicroBatches`). DDP averages the ``W`` shard gradients, which equals the gradient of the mean
loss over the global micro-batch. Because item ``j`` depends on nothing but ``(seed, e, j)``, it can be
built in a DataLoader worker process (``impl.num_workers``) with the same result as in the main process.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ...errors import ConfigError, DataError

from .distributed import loss_normalizer, shard_batch
from .rng import seeded


class EpochSampler(Sampler):
    """Shuffles with a generator seeded by (seed, epoch) and shards across ranks.

    The order of epoch e is a pure function of (seed, e), so a resumed run skips exactly the batches it
    already saw, and N processes see the same global order as one. :meth:`global_order` is what the
    Trainer slices into global micro-batches; :meth:`order` (every W-th index, padded by repetition so
    every rank has the same count, as ``DistributedSampler``) is this rank's share of it.

    With ``lengths`` (one token count per item) and ``group`` (the global micro-batch B), the order is
    grouped by length (``train.group_by_length``, as the ``transformers`` Trainer's option): the permutation
    is cut into mega-batches of ``MEGA·B`` items, each sorted by length, cut into slices of B, and the slices
    are shuffled. A micro-batch then holds texts of similar length and is padded little; which items an
    epoch sees is unchanged, only how they are grouped.
    """

    #: mega-batch size in micro-batches (the ``transformers`` LengthGroupedSampler uses 50)
    MEGA = 50

    def __init__(self, n: int, seed: int, shuffle: bool = True, rank: int = 0, world: int = 1,
                 lengths: Optional[list] = None, group: int = 0, keys: Optional[list] = None):
        self.n, self.seed, self.shuffle, self.rank, self.world = n, seed, shuffle, rank, world
        if lengths is not None and len(lengths) != n:
            raise ValueError(f"lengths has {len(lengths)} entries for {n} items")
        if keys is not None and len(keys) != n:
            raise ValueError(f"keys has {len(keys)} entries for {n} items")
        self.lengths, self.group, self.keys = lengths, group, keys
        self.epoch = 0
        #: with ``keys``: what :func:`no_duplicate_batches` did to the last order built (``deferred``, ``dropped``,
        #: ``unfilled``, ``batches``)
        self.duplicates: Optional[dict] = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_order(self, length: Optional[int] = None) -> list:
        """The permutation of epoch ``self.epoch`` (identical on every rank), repeated cyclically up to
        ``length`` indices when the dataset is smaller than that."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed * 1000003 + self.epoch)
            idx = torch.randperm(self.n, generator=g).tolist()
            if self.lengths is not None and self.group > 1:
                idx = self._grouped(idx, g)
        else:
            idx = list(range(self.n))
        if self.keys is not None and self.group > 1:
            batches, deferred, dropped, unfilled = no_duplicate_batches(idx, self.keys, self.group)
            self.duplicates = {"epoch": self.epoch, "deferred": deferred, "dropped": len(dropped),
                               "unfilled": len(unfilled), "batches": len(batches)}
            if not batches:
                raise DataError(f"no batch of {self.group} training pairs can be formed without repeating a text "
                                f"(train.no_duplicates); lower train.batch_size, add distinct pairs, or set "
                                f"train.no_duplicates=false")
            idx = [i for b in batches for i in b]  # whole clean batches: cycling them keeps every batch clean
        if length is not None and length > len(idx):
            idx = (idx * (length // max(1, len(idx)) + 1))[:length]
        return idx

    def _grouped(self, idx: list, g: torch.Generator) -> list:
        """``idx`` regrouped by length (see the class docstring); the incomplete last slice stays last."""
        b, lengths = self.group, self.lengths
        mega = self.MEGA * b
        idx = [i for m in range(0, len(idx), mega) for i in sorted(idx[m:m + mega], key=lambda i: -lengths[i])]
        full = len(idx) // b
        slices = [idx[k * b:(k + 1) * b] for k in range(full)]
        perm = torch.randperm(full, generator=g).tolist()
        return [i for k in perm for i in slices[k]] + idx[full * b:]

    def order(self) -> list:
        idx = self.global_order()
        per = math.ceil(self.n / self.world)
        idx = idx + idx[: per * self.world - self.n]
        return idx[self.rank::self.world]

    def __iter__(self):
        return iter(self.order())

    def __len__(self) -> int:
        return math.ceil(self.n / self.world)


def no_duplicate_batches(order: list, keys: list, size: int) -> tuple:
    """Cut ``order`` into batches of ``size`` items in which no text repeats, for in-batch-negative losses
    (a text twice in a batch makes one row's positive another row's negative: sentence-transformers issues
    #3189, #2827; its ``NoDuplicatesBatchSampler`` has the same aim — this is bertforge's own greedy).

    ``keys[i]`` = ``(texts, negatives)`` of item ``i``: hashables (e.g. token-id tuples) for its query and
    positive, and for its hard negatives. Item ``i`` joins a batch when none of its ``texts`` is already there
    (as a text or a negative) and none of its ``negatives`` is a text there; two rows may share a negative
    (both treat it as a negative, which it is). Items are taken in ``order``; one that collides is deferred
    (tried first for the next batches, in order). Items left when ``order`` runs out that cannot make up a
    whole clean batch are left out of the epoch.

    Returns ``(batches, deferred, dropped, unfilled)``: the whole batches (lists of indices; every item of
    ``order`` is in exactly one of them or of the two lists), how many items were deferred at least once, the
    indices dropped because they collide with every batch that could still be formed, and those of the last,
    incomplete batch (the epoch's remainder, which plain slicing leaves out too). Cost: O(n·size) hash
    look-ups plus the rescans of deferred items."""
    batches, pending, deferred_ever = [], [], set()
    pos, n = 0, len(order)
    while True:
        batch, texts, negs, still = [], set(), set(), []

        def fits(i) -> bool:
            t, ng = set(keys[i][0]), set(keys[i][1])
            return not (t & texts or t & negs or ng & texts)

        def take(i) -> None:
            batch.append(i)
            texts.update(keys[i][0])
            negs.update(keys[i][1])

        for k, i in enumerate(pending):  # the deferred first, in their order
            if len(batch) == size:
                still.extend(pending[k:])
                break
            (take if fits(i) else still.append)(i)
        pending = still
        while len(batch) < size and pos < n:
            i = order[pos]
            pos += 1
            if fits(i):
                take(i)
            else:
                pending.append(i)
                deferred_ever.add(i)
        if len(batch) < size:  # the order ran out: what is left cannot fill a clean batch
            return batches, len(deferred_ever), pending, batch
        batches.append(batch)


def item_length(item: dict) -> int:
    """Tokens of one dataset item, for :class:`EpochSampler`'s length grouping: ``len(input_ids)``, or the
    longest of its texts when ``input_ids`` holds one list per text (a retrieval example)."""
    ids = item["input_ids"]
    if torch.is_tensor(ids):
        return int(ids.shape[-1])
    if ids and isinstance(ids[0], (list, tuple)):
        return max(len(x) for x in ids)
    return len(ids)


def micro_batch_seed(seed: int, epoch: int, j: int) -> int:
    """The seed of the collator's random draws for global micro-batch ``j`` of ``epoch``."""
    return (seed * 7919 + epoch * 1_000_003 + j * 31) % 2**63


class GlobalMicroBatches(Dataset):
    """Item ``j``: this rank's share of global micro-batch ``j`` of one epoch, as a batch dict.

    Args:
        dataset: map-style dataset of examples (or, with ``prebatched``, of whole batches).
        collate_fn: list of examples → batch dict of tensors; its random draws are seeded per item.
        order: the epoch's global order (:meth:`EpochSampler.global_order`), at least ``len · size`` long.
        size: ``B``, the global micro-batch in dataset items.
        seed, epoch: the run's seed and this epoch (they seed the collator).
        rank, world: this process and the number of processes.
        prebatched: items are whole batches; rank ``r`` takes items ``[r·B/W, (r+1)·B/W)`` of the slice
            and collates them alone (each rank its own items, as token-count batches need).

    Under ``world > 1`` a batch whose ``labels`` are token-level targets also carries ``loss_normalizer``
    (:func:`bertforge.engine.train.distributed.loss_normalizer`), which the model's forward receives.
    """

    def __init__(self, dataset, collate_fn: Callable, order: list, size: int, seed: int, epoch: int,
                 rank: int = 0, world: int = 1, prebatched: bool = False):
        self.dataset, self.collate_fn, self.order, self.size = dataset, collate_fn, order, size
        self.seed, self.epoch, self.rank, self.world, self.prebatched = seed, epoch, rank, world, prebatched

    def __len__(self) -> int:
        return len(self.order) // self.size

    def __getitem__(self, j: int) -> dict:
        idx = self.order[j * self.size:(j + 1) * self.size]
        seed, r, w = micro_batch_seed(self.seed, self.epoch, j), self.rank, self.world
        if self.prebatched:  # this rank's own items of the global micro-batch
            per = self.size // w
            with seeded((seed + 7 * r) % 2**63):
                return self.collate_fn([self.dataset[i] for i in idx[r * per:(r + 1) * per]])
        with seeded(seed):
            batch = self.collate_fn([self.dataset[i] for i in idx])
        if w > 1:
            norm = loss_normalizer(batch, w)
            batch = shard_batch(batch, r, w, len(idx))
            if norm is not None:
                batch["loss_normalizer"] = norm
        return batch


def iterate(items: GlobalMicroBatches, indices: range, num_workers: int = 0, pin_memory: bool = False):
    """Yield ``items[j]`` for ``j`` in ``indices``, built in this process (``num_workers`` 0) or in that many
    DataLoader worker processes (``impl.num_workers``; the same batches, prepared ahead of the step)."""
    if num_workers == 0:
        return (items[j] for j in indices)
    # the loader's own generator: starting its workers must not draw from the global RNG stream, whose next
    # numbers are the model's dropout masks (the items are seeded per micro-batch, see GlobalMicroBatches)
    return iter(DataLoader(items, batch_size=None, sampler=indices, num_workers=num_workers,
                           collate_fn=_as_is, pin_memory=pin_memory, generator=torch.Generator()))


def _as_is(item):
    """DataLoader ``collate_fn`` for items that are whole batches already."""
    return item


def global_micro_batch(batch_size: int, world: int, n_examples: int, prebatched: bool = False) -> int:
    """The global micro-batch in dataset items: ``train.batch_size`` rows split over ``world`` ranks, or, for
    a ``prebatched`` dataset, ``batch_size`` items per rank.

    Raises:
        ConfigError: ``batch_size`` not divisible by ``world``; a global micro-batch larger than the
            ``n_examples`` items (every row would repeat examples; ``reason="batch_exceeds_data"``).
        DataError: ``n_examples`` is 0.
    """
    if not prebatched and batch_size % world:
        raise ConfigError(f"train.batch_size={batch_size} is not divisible by the {world} processes; pick a "
                          f"multiple of {world}")
    size = batch_size * world if prebatched else batch_size
    if n_examples == 0:
        raise DataError("the training set is empty; pass a file with examples")
    if size > n_examples:
        raise ConfigError(f"train.batch_size {size} exceeds the {n_examples} training examples; lower "
                          f"train.batch_size to {n_examples} or less, or add data", reason="batch_exceeds_data",
                          batch_size=size, n_examples=n_examples)
    return size


__all__ = ["EpochSampler", "GlobalMicroBatches", "no_duplicate_batches", "item_length", "micro_batch_seed", "iterate", "global_micro_batch"]
