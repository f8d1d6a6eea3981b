"""Which sample indices each training process reads, epoch by epoch.

:func:`shard_indices` reproduces, index for index, what
``torch.utils.data.DistributedSampler`` yields, so a dlbooster pipeline and a plain
PyTorch one read the same samples in the same order on every rank.
:class:`ShardSampler` wraps it as a sampler for ``torch.utils.data.DataLoader`` that
can also save and restore its position inside an epoch. :func:`dist_env` finds the
process's rank and the world size.

Importing this module does not import torch; shuffling imports it when first needed.
"""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Iterator

__all__ = ["shard_indices", "num_samples", "dist_env", "local_rank_env", "ShardSampler"]


def _integer(name: str, value) -> int:
    """``value`` as an int; TypeError naming ``name`` for a non-integer or a bool (True
    would pass as 1)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    return operator.index(value)


def _seed(name: str, value) -> int:
    """A seed as an int in ``torch.Generator.manual_seed``'s range ``[-2**63, 2**64)`` (one
    outside it failed at the first shuffle); TypeError or ValueError naming ``name``."""
    seed = _integer(name, value)
    if not -(1 << 63) <= seed < 1 << 64:
        raise ValueError(f"{name} must be in [-2**63, 2**64) (torch.Generator's range), not {seed}")
    return seed


def _check_shard(length: int, rank: int, world_size: int) -> tuple[int, int, int]:
    length, rank, world_size = (_integer(n, v) for n, v in
                                (("length", length), ("rank", rank), ("world_size", world_size)))
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size - 1}], got {rank}")
    return length, rank, world_size


def num_samples(length: int, *, drop_last: bool = False, world_size: int = 1) -> int:
    """How many indices each rank gets per epoch (``DistributedSampler.num_samples``).

    ``ceil(length / world_size)`` without ``drop_last`` (the tail is padded), else
    ``length // world_size`` (the tail is dropped).

    Raises:
        ValueError: ``length`` < 0 or ``world_size`` < 1.
        TypeError: an argument is not an integer.
    """
    length, _, world_size = _check_shard(length, 0, world_size)
    # Integer forms of torch's math.ceil(length / n) and math.ceil((length - n) / n):
    # equal to them, and exact beyond 2**53.
    if drop_last:
        return length // world_size
    return -(-length // world_size)


def shard_indices(length: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = True,
                  drop_last: bool = False, rank: int = 0, world_size: int = 1) -> list[int]:
    """The indices ``rank`` reads in ``epoch`` of a dataset of ``length`` samples.

    Equal to ``list(DistributedSampler(dataset, num_replicas=world_size, rank=rank,
    shuffle=shuffle, seed=seed, drop_last=drop_last))`` after ``set_epoch(epoch)``, for
    a dataset with ``len(dataset) == length``:

    1. the order is ``torch.randperm(length)`` drawn from a ``torch.Generator`` seeded
       with ``seed + epoch`` when ``shuffle``, else ``0 .. length - 1``;
    2. without ``drop_last`` the list is padded by repeating its head (several times
       over when the padding is longer than the list) to a multiple of ``world_size``;
       with ``drop_last`` it is cut to the largest multiple of ``world_size``;
    3. rank ``r`` takes every ``world_size``-th index starting at ``r``.

    Returns:
        a list of :func:`num_samples` Python ints in ``[0, length)``; empty when
        ``length`` is 0, or when ``drop_last`` and ``length < world_size``.

    Raises:
        ValueError: ``length`` < 0, ``world_size`` < 1 or ``rank`` outside
            ``[0, world_size)`` (``torch.Generator.manual_seed``'s own errors, for a
            ``seed + epoch`` outside the 64-bit range, pass through).
        TypeError: ``length``, ``rank``, ``world_size``, ``seed`` or ``epoch`` is not an
            integer.
    """
    length, rank, world_size = _check_shard(length, rank, world_size)
    seed, epoch = operator.index(seed), operator.index(epoch)
    total = num_samples(length, drop_last=drop_last, world_size=world_size) * world_size
    if shuffle:
        import torch

        g = torch.Generator()
        g.manual_seed(seed + epoch)
        order = torch.randperm(length, generator=g).tolist()
    else:
        order = list(range(length))
    if total > length:
        # 0 < total - length < world_size, so length > 0 here.
        order = (order * -(-total // length))[:total]
    else:
        order = order[:total]
    return order[rank:total:world_size]


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def local_rank_env() -> int | None:
    """This process's ``LOCAL_RANK`` (torchrun sets it: the rank's index on its node, the
    GPU it takes), or None where it is unset (a single process, ``srun``, ``mpirun``).

    Raises:
        ValueError: ``LOCAL_RANK`` is not an integer (the message gives its value).
    """
    return _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else None


def dist_env() -> tuple[int, int]:
    """This process's ``(rank, world_size)``.

    Taken from the initialised default ``torch.distributed`` process group if there is
    one, else from the ``RANK`` and ``WORLD_SIZE`` environment variables that torchrun
    sets, else ``(0, 1)`` (a single process).

    Raises:
        ValueError: only one of ``RANK`` / ``WORLD_SIZE`` is set, one is not an integer,
            ``WORLD_SIZE`` < 1, or ``RANK`` is outside ``[0, WORLD_SIZE)``.
    """
    # A process group can only exist if torch.distributed was imported already; looking
    # in sys.modules keeps single-process callers from paying for a torch import.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    have_rank, have_world = "RANK" in os.environ, "WORLD_SIZE" in os.environ
    if not have_rank and not have_world:
        return 0, 1
    if have_rank != have_world:
        present, missing = ("RANK", "WORLD_SIZE") if have_rank else ("WORLD_SIZE", "RANK")
        raise ValueError(f"environment variable {present} is set but {missing} is not")
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    if world_size < 1:
        raise ValueError(f"environment variable WORLD_SIZE={world_size} must be >= 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"environment variable RANK={rank} is outside [0, WORLD_SIZE={world_size})")
    return rank, world_size


def _dist_known(name: str) -> bool:
    """Whether an initialised process group or the environment variable gives ``name``."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized()) or name in os.environ


def _dist_one(name: str) -> tuple[int, str | None]:
    """``RANK`` or ``WORLD_SIZE`` alone, for a caller that gave the other: the process
    group's, else the environment variable's, else the single process's (0 or 1); with
    where it came from, for messages (None: the default). Raises ValueError when the
    variable is not an integer."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        value = dist.get_rank() if name == "RANK" else dist.get_world_size()
        return value, "the process group"
    if name not in os.environ:
        return (0 if name == "RANK" else 1), None
    return _env_int(name), f"environment variable {name}={os.environ[name]!r}"


class ShardSampler:
    """A resumable ``DistributedSampler``: the same indices, plus a saved position.

    Pass it as ``DataLoader(dataset, sampler=ShardSampler(len(dataset)), ...)`` and call
    :meth:`set_epoch` at the start of every epoch, as with ``DistributedSampler``.

    Resuming: :meth:`state_dict` records the epoch, the seed and ``start``, the number
    of this epoch's indices the sampler has handed out so far. After
    :meth:`load_state_dict` (or :meth:`skip`) the next iteration begins at ``start``;
    later iterations and later epochs begin at 0 again. ``start`` counts indices the
    DataLoader has *taken*: exact with ``num_workers=0``; with worker processes the
    DataLoader takes up to ``prefetch_factor * num_workers`` batches ahead of the
    ones delivered, so a loop that needs an exact resume should store its own count
    (``batches_done * batch_size``) as ``state["start"]`` instead. A
    :class:`dlbooster.Loader`'s sampler counts the samples of the batches the loader has
    yielded (:meth:`take`, :meth:`advance`), not those it decoded ahead: exact.

    Args:
        length: number of samples in the dataset (>= 0).
        seed: shuffling seed; must be the same on every rank.
        shuffle: shuffle (per ``seed + epoch``) or keep the dataset order.
        drop_last: drop the tail that does not divide evenly instead of padding.
        rank, world_size: this process's place; ``None`` takes both from
            :func:`dist_env`; one given and the other ``None`` reads only the missing
            one (the process group's, else its environment variable, else 0 or 1;
            a ``world_size`` above 1 with no rank anywhere is an error).

    Attributes:
        epoch: the current epoch (0 until :meth:`set_epoch`).
        rank, world_size, length, seed, shuffle, drop_last: as given.

    Raises:
        ValueError: as :func:`shard_indices`, or from :func:`dist_env`; a
            ``world_size`` above 1 given without a rank where no process group or
            ``RANK`` gives one; a ``seed`` outside ``[-2**63, 2**64)`` (what
            ``torch.Generator`` takes). A rank or world size read from the process
            group or the environment (the other one given) is named as such.
        TypeError: ``length``, ``seed``, ``rank`` or ``world_size`` is not an integer
            (a bool included), naming it.
    """

    def __init__(self, length: int, *, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False, rank: int | None = None,
                 world_size: int | None = None) -> None:
        # Checked here: a float seed, or one torch cannot take, failed at the first iteration.
        self.seed = _seed("seed", seed)
        rank = None if rank is None else _integer("rank", rank)
        world_size = None if world_size is None else _integer("world_size", world_size)
        origin = None                         # where a value not given came from
        if rank is None and world_size is None:
            rank, world_size = dist_env()
        elif rank is None:
            if world_size > 1 and not _dist_known("RANK"):
                # Every process would take shard 0 (DistributedSampler raises here too).
                raise ValueError(f"world_size {world_size} without a rank: give rank, or run under torchrun "
                                 f"(RANK) or in an initialised process group")
            rank, origin = _dist_one("RANK")
            origin = origin and f"rank from {origin}"
        elif world_size is None:
            world_size, origin = _dist_one("WORLD_SIZE")
            origin = origin and f"world_size from {origin}"
        try:
            self.length, self.rank, self.world_size = _check_shard(length, rank, world_size)
        except ValueError as exc:
            if origin is None:
                raise
            raise ValueError(f"{exc} ({origin})") from None
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self._num_samples = num_samples(self.length, drop_last=drop_last,
                                        world_size=self.world_size)
        self._start = 0     # where the next iteration begins (one-shot)
        self._position = 0  # indices of this epoch handed out or skipped

    def __len__(self) -> int:
        """Indices in a full epoch (``DistributedSampler.num_samples``).

        A resumed epoch yields ``len(self) - start`` of them.
        """
        return self._num_samples

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch that the next iteration reads.

        A different epoch clears the saved position; the same epoch keeps it, so the
        usual ``set_epoch(epoch)`` at the top of the loop does not undo a resume.
        """
        epoch = operator.index(epoch)
        if epoch != self.epoch:
            self._start = self._position = 0
        self.epoch = epoch

    def skip(self, n: int) -> None:
        """Make the next iteration begin at index ``n`` of this epoch's shard.

        Raises:
            ValueError: ``n`` outside ``[0, len(self)]``.
        """
        n = operator.index(n)
        if not 0 <= n <= self._num_samples:
            raise ValueError(f"skip({n}): must be in [0, {self._num_samples}]")
        self._start = self._position = n

    def indices(self) -> list[int]:
        """The whole shard of the current epoch (ignores ``start``)."""
        return shard_indices(self.length, epoch=self.epoch, seed=self.seed,
                             shuffle=self.shuffle, drop_last=self.drop_last,
                             rank=self.rank, world_size=self.world_size)

    def __iter__(self) -> Iterator[int]:
        """This epoch's indices from ``start`` on, as Python ints."""
        start, self._start = self._start, 0
        self._position = start
        return self._iterate(self.indices()[start:])

    def take(self) -> list[int]:
        """Begin an iteration as :meth:`__iter__` does, for a consumer that reads ahead
        of what it has used (:class:`dlbooster.Loader` decodes batches ahead): this
        epoch's indices from ``start`` on, all at once; the position (:meth:`state_dict`)
        stays at ``start`` until the consumer calls :meth:`advance`."""
        start, self._start = self._start, 0
        self._position = start
        return self.indices()[start:]

    def advance(self, n: int) -> None:
        """Count ``n`` more of this epoch's indices as used (after :meth:`take`)."""
        self._position += n

    def _iterate(self, todo: list[int]) -> Iterator[int]:
        for i in todo:
            # Count before handing out: a DataLoader takes an index when it asks for it.
            self._position += 1
            yield i

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "seed", "start", "length", "world_size"}``, all ints.

        ``length`` and ``world_size`` are only checked on load: ``start`` means nothing
        for another dataset size or another number of ranks.
        """
        return {"epoch": self.epoch, "seed": self.seed, "start": self._position,
                "length": self.length, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore :meth:`state_dict`'s epoch, seed and position.

        Raises:
            KeyError: a key is missing.
            ValueError: ``length`` or ``world_size`` differs from this sampler's,
                ``start`` is outside ``[0, len(self)]``, or ``seed`` outside what
                ``torch.Generator`` takes (as when the sampler is made).
            TypeError: ``epoch``, ``start`` or ``seed`` is not an integer.
        """
        for key, mine in (("length", self.length), ("world_size", self.world_size)):
            if state[key] != mine:
                raise ValueError(f"state was saved with {key}={state[key]}, this sampler has {mine}")
        epoch, start = _integer("epoch", state["epoch"]), _integer("start", state["start"])
        if not 0 <= start <= self._num_samples:
            raise ValueError(f"state start={start} is outside [0, {self._num_samples}]")
        self.seed = _seed("state seed", state["seed"])
        self.epoch = epoch
        self._start = self._position = start
