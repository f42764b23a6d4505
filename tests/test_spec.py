"""The loader records (graphfeed.core.spec), their one protobuf conversion, and EpochPlan coverage."""
from __future__ import annotations

import pytest
import torch

from graphfeed.core.epoch import EpochPlan
from graphfeed.core.spec import LoaderSpec, NodeInput, SamplingSpec
from graphfeed.proto.convert import loader_spec_from_proto, open_session_request

SAMPLING = SamplingSpec((10, 5))


# ---- validation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [0, -3, True, 2.5, 10**12])
def test_bad_batch_size(batch_size):
    with pytest.raises(ValueError, match="batch_size must be an integer"):
        LoaderSpec(SAMPLING, batch_size=batch_size)


@pytest.mark.parametrize("rank, world_size", [(2, 2), (-1, 2), (0, 0)])
def test_rank_outside_world(rank, world_size):
    with pytest.raises(ValueError, match="not valid for world_size"):
        LoaderSpec(SAMPLING, rank=rank, world_size=world_size)


@pytest.mark.parametrize("seed", [-1, 2**64, True, 1.5])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match="seed must be an integer"):
        LoaderSpec(SAMPLING, seed=seed)


def test_bool_mask_ids():
    with pytest.raises(ValueError, match="integer node ids.*mask.nonzero"):
        NodeInput(ids=torch.ones(8, dtype=torch.bool))


def test_float_ids():
    with pytest.raises(ValueError, match="integer node ids"):
        NodeInput.of(torch.tensor([1.0, 2.0]))


def test_repeated_ids():
    with pytest.raises(ValueError, match="2 repeated id"):
        NodeInput(ids=torch.tensor([4, 1, 4, 1, 9]))


def test_unknown_split():
    with pytest.raises(ValueError, match="unknown split 'training'"):
        NodeInput.of("training")


def test_split_and_ids_together():
    with pytest.raises(ValueError, match="not both"):
        NodeInput(split="train", ids=torch.tensor([1, 2]))


@pytest.mark.parametrize("num_neighbors, message", [((), "empty"), ((10, 0), "invalid fanout"),
                                                     ((-2,), "invalid fanout")])
def test_bad_fanouts(num_neighbors, message):
    with pytest.raises(ValueError, match=message):
        SamplingSpec(num_neighbors)


def test_node_input_of_what_users_pass():
    assert NodeInput.of(None) == NodeInput()
    assert NodeInput.of("val") == NodeInput(split="val")
    assert NodeInput.of([3, 1, 2]).ids.tolist() == [3, 1, 2]
    assert NodeInput.of([3, 1, 2]).ids.dtype == torch.int64


def test_kind_defaults_to_the_input_label():
    assert LoaderSpec(SAMPLING, NodeInput(split="test")).kind == "test"
    assert LoaderSpec(SAMPLING, NodeInput(ids=torch.tensor([1]))).kind == "nodes"
    assert LoaderSpec(SAMPLING, NodeInput()).kind == "nodes"
    assert LoaderSpec(SAMPLING, NodeInput(split="test"), kind="eval").kind == "eval"


# ---- the protobuf round trip --------------------------------------------------------------------

@pytest.mark.parametrize("node_input", [NodeInput(split="train"), NodeInput(ids=torch.tensor([7, 0, 42, 3]))],
                         ids=["split", "ids"])
@pytest.mark.parametrize("seed", [0, 12345, 2**63, 2**64 - 1])
def test_proto_round_trip(node_input, seed):
    spec = LoaderSpec(SamplingSpec((15, -1, 3), replace=True, direction="out"), node_input, batch_size=64,
                      shuffle=True, drop_last=True, seed=seed, rank=2, world_size=3, kind="my-loader")
    assert loader_spec_from_proto(open_session_request(spec, "group-1")) == spec


def test_proto_round_trip_defaults():
    spec = LoaderSpec(SAMPLING, NodeInput(split="val"))
    req = open_session_request(spec, "g")
    assert req.group_id == "g" and req.kind == "val"
    assert loader_spec_from_proto(req) == spec


def test_every_node_input_must_be_spelled_out_for_the_wire():
    with pytest.raises(ValueError, match="explicit input nodes"):
        open_session_request(LoaderSpec(SAMPLING, NodeInput()), "g")


# ---- EpochPlan ----------------------------------------------------------------------------------

@pytest.mark.parametrize("counts", [[37, 0], [100, 65], [1, 130], [64, 64]])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_epoch_plan_covers_every_input_once_across_ranks(counts, world_size, shuffle):
    inputs = [torch.arange(counts[0]), torch.arange(counts[0], counts[0] + counts[1])]
    seen, lengths = [], set()
    for rank in range(world_size):
        spec = LoaderSpec(SAMPLING, batch_size=16, shuffle=shuffle, seed=5, rank=rank, world_size=world_size)
        plan = EpochPlan(spec, counts, epoch=3)
        lengths.add(len(plan))
        orders = [plan.order(p, t) for p, t in enumerate(inputs)]
        for entry in plan.entries:
            seeds = EpochPlan.seeds(orders[entry.part], entry)
            assert 1 <= seeds.numel() <= 16
            assert bool(((seeds >= inputs[entry.part][0]) & (seeds <= inputs[entry.part][-1])).all())
            seen += seeds.tolist()
        assert sum(len(plan.owned_by(p)) for p in range(2)) == len(plan)
    assert len(lengths) == 1                          # every rank gets as many batches
    assert sorted(seen) == list(range(sum(counts)))   # every input position exactly once
