"""dlbooster.runtime.sampler against torch's DistributedSampler, which is the oracle."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlbooster.runtime.sampler import ShardSampler, dist_env, num_samples, shard_indices

pytest.importorskip("torch")
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402


class _Sized:
    """The only thing DistributedSampler reads from a dataset is its length."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


def torch_indices(length, *, epoch=0, seed=0, shuffle=True, drop_last=False, rank=0, world_size=1):
    sampler = DistributedSampler(_Sized(length), num_replicas=world_size, rank=rank,
                                 shuffle=shuffle, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler), len(sampler)


@st.composite
def configs(draw):
    world_size = draw(st.integers(1, 9))
    return dict(
        # Small lengths often, so that length < world_size and multi-fold padding occur.
        length=draw(st.one_of(st.integers(0, 12), st.integers(0, 400))),
        epoch=draw(st.integers(0, 10**6)),
        seed=draw(st.one_of(st.integers(0, 5), st.integers(-2**31, 2**40))),
        shuffle=draw(st.booleans()),
        drop_last=draw(st.booleans()),
        rank=draw(st.integers(0, world_size - 1)),
        world_size=world_size,
    )


@settings(max_examples=200)
@given(configs())
def test_shard_indices_matches_distributed_sampler(cfg):
    expected, expected_len = torch_indices(**cfg)
    got = shard_indices(**cfg)
    assert got == expected
    assert all(type(i) is int for i in got)
    assert num_samples(cfg["length"], drop_last=cfg["drop_last"],
                       world_size=cfg["world_size"]) == expected_len == len(got)


@pytest.mark.parametrize("cfg, expected", [
    # Padding longer than the list: [0] repeated, then rank 2 of 3 gets the copy.
    (dict(length=1, shuffle=False, rank=2, world_size=3), [0]),
    (dict(length=2, shuffle=False, rank=4, world_size=5), [0]),
    (dict(length=5, shuffle=False, rank=1, world_size=2), [1, 3, 0]),
    (dict(length=5, shuffle=False, drop_last=True, rank=1, world_size=2), [1, 3]),
    (dict(length=2, shuffle=False, drop_last=True, rank=0, world_size=3), []),
    (dict(length=0, rank=0, world_size=1), []),
    (dict(length=0, rank=3, world_size=4), []),
    (dict(length=0, drop_last=True, rank=1, world_size=2), []),
])
def test_shard_indices_explicit(cfg, expected):
    assert shard_indices(**cfg) == expected
    assert torch_indices(**cfg)[0] == expected


@pytest.mark.parametrize("epoch, seed", [(0, 0), (1, 0), (0, 1), (7, 1234), (3, -10)])
def test_shard_indices_explicit_shuffled(epoch, seed):
    for world_size in (1, 2, 3, 8):
        for rank in range(world_size):
            for length in (1, 2, 7, 100):
                cfg = dict(length=length, epoch=epoch, seed=seed, rank=rank, world_size=world_size)
                assert shard_indices(**cfg) == torch_indices(**cfg)[0]


def test_epochs_and_seeds_reorder():
    base = shard_indices(50, epoch=0, seed=0)
    assert sorted(base) == list(range(50))
    assert base != list(range(50))
    assert shard_indices(50, epoch=1, seed=0) != base
    assert shard_indices(50, epoch=0, seed=1) != base
    # seed + epoch is all that matters, as in torch.
    assert shard_indices(50, epoch=1, seed=0) == shard_indices(50, epoch=0, seed=1)


@pytest.mark.parametrize("world_size", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("length", [0, 1, 5, 16, 101])
def test_union_over_ranks_covers_everything(length, world_size):
    shards = [shard_indices(length, epoch=2, seed=9, rank=r, world_size=world_size)
              for r in range(world_size)]
    assert {i for s in shards for i in s} == set(range(length))
    assert len({len(s) for s in shards}) == 1
    if length >= world_size:
        # Only the padding repeats, and it is shorter than one index per rank.
        assert sum(map(len, shards)) - length < world_size


def test_drop_last_ranks_are_disjoint():
    shards = [shard_indices(103, epoch=1, drop_last=True, rank=r, world_size=4) for r in range(4)]
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat)) == 100


@pytest.mark.parametrize("kwargs, match", [
    (dict(length=-1), "length"),
    (dict(length=3, world_size=0), "world_size"),
    (dict(length=3, world_size=-2), "world_size"),
    (dict(length=3, rank=2, world_size=2), "rank"),
    (dict(length=3, rank=-1, world_size=2), "rank"),
])
def test_shard_indices_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        shard_indices(**kwargs)


def test_shard_indices_rejects_non_integers():
    with pytest.raises(TypeError):
        shard_indices(3.0)
    with pytest.raises(TypeError):
        shard_indices(3, world_size=2.0)
    with pytest.raises(TypeError):
        shard_indices(3, seed=1.5)


def test_shard_sampler_checks_the_seed_when_made():
    # A float seed, or one torch.Generator cannot take, passed the constructor and failed
    # at the first iteration (the float's message did not say which argument).
    with pytest.raises(TypeError, match="seed must be an integer, not 1.5"):
        ShardSampler(3, seed=1.5, rank=0, world_size=1)
    with pytest.raises(ValueError, match="seed must be in"):
        ShardSampler(3, seed=2**64, rank=0, world_size=1)
    assert ShardSampler(3, seed=2**64 - 1, rank=0, world_size=1).indices() == \
        shard_indices(3, seed=2**64 - 1)
    sampler = ShardSampler(3, seed=np.int64(4), rank=0, world_size=1)
    assert type(sampler.seed) is int and sampler.seed == 4
    with pytest.raises(TypeError):
        sampler.load_state_dict({**sampler.state_dict(), "seed": "4"})


@pytest.mark.parametrize("length, world_size, drop_last", [
    (0, 1, False), (1, 3, False), (1, 3, True), (10, 3, False), (10, 3, True), (12, 4, True),
])
@pytest.mark.parametrize("shuffle", [False, True])
def test_shard_sampler_matches_distributed_sampler(length, world_size, drop_last, shuffle):
    for rank in range(world_size):
        ours = ShardSampler(length, seed=5, shuffle=shuffle, drop_last=drop_last,
                            rank=rank, world_size=world_size)
        theirs = DistributedSampler(_Sized(length), num_replicas=world_size, rank=rank,
                                    shuffle=shuffle, seed=5, drop_last=drop_last)
        for epoch in (0, 1, 4):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert len(ours) == len(theirs)
            assert list(ours) == list(theirs)
            # Iterating again in the same epoch gives the same order again.
            assert list(ours) == list(theirs)
        assert (ours.epoch, ours.rank, ours.world_size) == (4, rank, world_size)


def test_shard_sampler_in_a_dataloader():
    sampler = ShardSampler(10, seed=3, rank=1, world_size=2)
    sampler.set_epoch(2)
    loader = DataLoader(list(range(100, 110)), batch_size=2, sampler=sampler)
    got = [int(x) for batch in loader for x in batch]
    assert got == [100 + i for i in shard_indices(10, epoch=2, seed=3, rank=1, world_size=2)]


def test_shard_sampler_defaults_from_env(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    s = ShardSampler(10)
    assert (s.rank, s.world_size) == (2, 3)
    assert list(s) == shard_indices(10, rank=2, world_size=3)
    # An explicit value wins over the environment for that one.
    assert ShardSampler(10, rank=0).rank == 0
    assert ShardSampler(10, rank=0).world_size == 3
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    s = ShardSampler(10)
    assert (s.rank, s.world_size) == (0, 1)


def test_an_explicit_value_reads_only_the_other_variable(monkeypatch):
    """Given one of rank and world size, the sampler needs only the other's variable: a
    malformed or missing one of the given kind does not matter."""
    monkeypatch.setenv("RANK", "not-a-number")
    monkeypatch.setenv("WORLD_SIZE", "4")
    s = ShardSampler(10, rank=3)
    assert (s.rank, s.world_size) == (3, 4)
    with pytest.raises(ValueError, match="RANK='not-a-number'"):
        ShardSampler(10, world_size=4)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("WORLD_SIZE")
    assert (ShardSampler(10, world_size=2).rank, ShardSampler(10, rank=0).world_size) == (1, 1)
    # A world size above 1 with no rank anywhere put every process on shard 0;
    # DistributedSampler(num_replicas=2) raises here too.
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="world_size 2 without a rank: give rank, or run under torchrun"):
        ShardSampler(10, world_size=2)
    assert ShardSampler(10, world_size=1).rank == 0


def test_shard_sampler_rejects_bad_rank():
    with pytest.raises(ValueError, match="rank"):
        ShardSampler(10, rank=3, world_size=3)


@pytest.mark.parametrize("taken", [0, 1, 4, 7])
def test_state_dict_resumes_where_it_stopped(taken):
    full = ShardSampler(20, seed=11, rank=1, world_size=3)
    full.set_epoch(3)
    everything = list(full)
    assert len(everything) == 7

    run = ShardSampler(20, seed=11, rank=1, world_size=3)
    run.set_epoch(3)
    it = iter(run)
    seen = [next(it) for _ in range(taken)]
    state = run.state_dict()
    assert state == {"epoch": 3, "seed": 11, "start": taken, "length": 20, "world_size": 3}

    resumed = ShardSampler(20, seed=0, rank=1, world_size=3)
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed.seed) == (3, 11)
    assert resumed.state_dict() == state
    resumed.set_epoch(3)  # the usual call at the top of the loop keeps the position
    rest = list(resumed)
    assert seen + rest == everything
    assert len(resumed) == 7
    # The skip applies once: the epoch read again, or the next one, starts at 0.
    assert list(resumed) == everything
    resumed.set_epoch(4)
    assert resumed.state_dict()["start"] == 0
    assert list(resumed) == shard_indices(20, epoch=4, seed=11, rank=1, world_size=3)


def test_state_after_a_full_epoch_and_new_epoch():
    s = ShardSampler(9, world_size=2, rank=0)
    s.set_epoch(1)
    assert len(list(s)) == 5
    assert s.state_dict()["start"] == 5
    resumed = ShardSampler(9, world_size=2, rank=0)
    resumed.load_state_dict(s.state_dict())
    assert list(resumed) == []
    s.set_epoch(2)
    assert s.state_dict()["start"] == 0


def test_skip_and_set_epoch_clears_pending_skip():
    s = ShardSampler(30, seed=2)
    s.set_epoch(1)
    s.skip(25)
    assert list(s) == shard_indices(30, epoch=1, seed=2)[25:]
    s.skip(10)
    s.set_epoch(2)
    assert list(s) == shard_indices(30, epoch=2, seed=2)
    with pytest.raises(ValueError, match="skip"):
        s.skip(31)
    with pytest.raises(ValueError, match="skip"):
        s.skip(-1)


def test_load_state_dict_rejects_mismatch():
    state = ShardSampler(20, rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="world_size"):
        ShardSampler(20, rank=0, world_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="length"):
        ShardSampler(21, rank=0, world_size=2).load_state_dict(state)
    target = ShardSampler(20, seed=4, rank=0, world_size=2)
    with pytest.raises(ValueError, match="start"):
        target.load_state_dict({**state, "start": 11, "epoch": 9, "seed": 1})
    with pytest.raises(ValueError, match=r"state seed must be in \[-2\*\*63, 2\*\*64\)"):
        target.load_state_dict({**state, "start": 1, "epoch": 9, "seed": 2**64})
    with pytest.raises(TypeError, match="epoch must be an integer, not True"):
        target.load_state_dict({**state, "epoch": True})
    # A refused state changes nothing.
    assert target.state_dict() == {"epoch": 0, "seed": 4, "start": 0, "length": 20, "world_size": 2}
    with pytest.raises(KeyError):
        target.load_state_dict({"epoch": 1})


def test_dist_env_defaults(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert dist_env() == (0, 1)


@pytest.mark.parametrize("rank, world_size", [("0", "1"), ("3", "4"), (" 1 ", "2")])
def test_dist_env_reads_torchrun_variables(monkeypatch, rank, world_size):
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", world_size)
    assert dist_env() == (int(rank), int(world_size))


@pytest.mark.parametrize("env, match", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x'"),
    ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE='two'"),
    ({"RANK": "", "WORLD_SIZE": "2"}, "RANK=''"),
    ({"RANK": "1.0", "WORLD_SIZE": "2"}, "RANK='1.0'"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1"),
    ({"RANK": "0"}, "WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "RANK is not"),
])
def test_dist_env_rejects_garbage(monkeypatch, env, match):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=match):
        dist_env()


def test_dist_env_prefers_the_process_group(monkeypatch, tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert dist_env() == (0, 1)
        assert (ShardSampler(8).rank, ShardSampler(8).world_size) == (0, 1)
    finally:
        dist.destroy_process_group()
    assert dist_env() == (3, 4)


def test_import_does_not_import_torch():
    code = ("import sys, dlbooster.runtime.sampler as s; "
            "assert s.shard_indices(5, shuffle=False, rank=1, world_size=2) == [1, 3, 0]; "
            "assert s.dist_env() == (0, 1); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
