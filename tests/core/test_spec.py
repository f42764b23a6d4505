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


@pytest.mark.parametrize("given, split, ids, node_type", [
    (None, None, None, None),
    ("train", "train", None, None),
    ([5, 2], None, [5, 2], None),
    (torch.tensor([9, 0, 4]), None, [9, 0, 4], None),
    (("paper", "train"), "train", None, "paper"),
    (("paper", "test"), "test", None, "paper"),
    (("paper", torch.tensor([3, 1])), None, [3, 1], "paper"),
    (("author", [7]), None, [7], "author"),
    (("paper", None), None, None, "paper"),
], ids=["none", "split", "list", "tensor", "typed-split", "typed-test", "typed-tensor", "typed-list", "typed-none"])
def test_node_input_of_every_pyg_form(given, split, ids, node_type):
    got = NodeInput.of(given)
    assert (got.split, got.node_type) == (split, node_type)
    assert (None if got.ids is None else got.ids.tolist()) == ids
    assert got.ids is None or got.ids.dtype == torch.int64
    assert NodeInput.of(got) is got


@pytest.mark.parametrize("given", [("", "train"), ("x" * 300, None)])
def test_node_type_must_be_a_non_empty_name(given):
    with pytest.raises(ValueError, match="input node type must be a non-empty string"):
        NodeInput.of(given)


def test_typed_input_is_validated_like_an_untyped_one():
    with pytest.raises(ValueError, match="unknown split 'training'"):
        NodeInput.of(("paper", "training"))
    with pytest.raises(ValueError, match="1 repeated id"):
        NodeInput.of(("paper", [4, 4, 2]))


def test_typed_node_input_equality_and_hash():
    a, b = NodeInput.of(("paper", "train")), NodeInput(split="train", node_type="paper")
    assert a == b and hash(a) == hash(b)
    assert a != NodeInput(split="train")                       # None = the label type, a different record
    assert a != NodeInput(split="train", node_type="author")
    assert NodeInput.of(("paper", [1, 2])) == NodeInput(ids=torch.tensor([1, 2]), node_type="paper")
    assert NodeInput.of(("paper", [1, 2])) != NodeInput.of([1, 2])
    assert len({a, b, NodeInput(split="train"), NodeInput(split="train", node_type="author")}) == 3


def test_typed_node_input_label_and_description():
    assert NodeInput.of(("paper", "train")).label == "paper:train"
    assert NodeInput.of(("paper", [1, 2])).label == "paper:nodes"
    assert NodeInput.of(("paper", None)).describe() == "all nodes of type 'paper'"
    assert NodeInput.of(("paper", [1, 2])).describe() == "2 node ids of type 'paper'"
    assert LoaderSpec(SAMPLING, NodeInput.of(("paper", "val"))).kind == "paper:val"
    # untyped records read exactly as before
    assert (NodeInput.of("val").label, NodeInput.of("val").describe()) == ("val", "val")
    assert NodeInput().describe() == "all nodes" and NodeInput.of([1]).describe() == "1 node ids"
    assert NodeInput.of(("paper", "val")).type_or("_N") == "paper" and NodeInput.of("val").type_or("_N") == "_N"


def test_kind_defaults_to_the_input_label():
    assert LoaderSpec(SAMPLING, NodeInput(split="test")).kind == "test"
    assert LoaderSpec(SAMPLING, NodeInput(ids=torch.tensor([1]))).kind == "nodes"
    assert LoaderSpec(SAMPLING, NodeInput()).kind == "nodes"
    assert LoaderSpec(SAMPLING, NodeInput(split="test"), kind="eval").kind == "eval"


# ---- per-edge-type fanouts --------------------------------------------------------------------

CITES, WRITES, IN_FIELD = ("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "in", "field")
EDGE_TYPES = [list(CITES), list(WRITES), list(IN_FIELD)]   # as PartitionMeta.edge_types holds them


def test_list_fanouts_are_stored_as_today():
    spec = SamplingSpec([15, "10", 5])
    assert spec.num_neighbors == (15, 10, 5) and len(spec.num_neighbors) == 3
    assert list(spec.num_neighbors) == [15, 10, 5]
    assert not spec.is_typed and spec.num_hops == 3
    assert spec.fanouts_for(EDGE_TYPES) == {CITES: (15, 10, 5), WRITES: (15, 10, 5), IN_FIELD: (15, 10, 5)}
    assert SamplingSpec([4]).fanouts_for([("_N", "to", "_N")]) == {("_N", "to", "_N"): (4,)}


def test_dict_fanouts_are_canonical_and_hashable():
    a = SamplingSpec({WRITES: [5, 0], CITES: [10, -1]})
    b = SamplingSpec({CITES: (10, -1), WRITES: torch.tensor([5, 0])})
    assert a == b and hash(a) == hash(b) and a.is_typed and a.num_hops == 2
    assert a.num_neighbors == ((WRITES, (5, 0)), (CITES, (10, -1)))      # sorted by edge type
    assert SamplingSpec(a.num_neighbors) == a                             # the stored form reads back
    assert SamplingSpec([(list(CITES), [10, -1]), (list(WRITES), [5, 0])]) == a   # pairs, as from protobuf
    assert a != SamplingSpec({CITES: [10, -1]})
    assert LoaderSpec.of("train", {WRITES: [5, 0], CITES: [10, -1]}, batch_size=4).sampling == a


def test_fanouts_for_a_dict_fills_missing_edge_types_with_zeros():
    spec = SamplingSpec({CITES: [10, 5]})
    got = spec.fanouts_for(EDGE_TYPES)
    assert list(got) == [CITES, WRITES, IN_FIELD]                          # the graph's order
    assert got == {CITES: (10, 5), WRITES: (0, 0), IN_FIELD: (0, 0)}


def test_fanouts_for_names_an_unknown_edge_type_and_the_known_ones():
    spec = SamplingSpec({CITES: [10], ("paper", "writes", "author"): [3]})
    with pytest.raises(ValueError, match=r"edge type \('paper', 'writes', 'author'\), which the graph does not "
                                         r"have; its edge types are \('paper', 'cites', 'paper'\), \('author', "
                                         r"'writes', 'paper'\), \('paper', 'in', 'field'\)"):
        spec.fanouts_for(EDGE_TYPES)


def test_dict_fanouts_need_one_hop_count():
    with pytest.raises(ValueError, match=r"different numbers of hops.*same number of hops"):
        SamplingSpec({CITES: [10, 5], WRITES: [3]})


@pytest.mark.parametrize("num_neighbors, message", [
    ({}, "empty"),
    ({CITES: []}, r"num_neighbors\[\('paper', 'cites', 'paper'\)\] is empty"),
    ({CITES: [10, -2]}, r"invalid fanout\(s\) \[-2\]: each hop's fanout must be -1 \(all neighbors\) or 0\.\."),
    ({CITES: [1 << 21]}, "invalid fanout"),
    ({CITES: 5}, "must be a list of per-hop fanouts"),
    ({("paper", "cites"): [5]}, r"\(src, rel, dst\) triple"),
    ({("paper", "", "paper"): [5]}, "relation must be a non-empty string"),
    (7, "must be a list of per-hop fanouts"),
    ("15,10", "must be a list of per-hop fanouts"),
])
def test_bad_dict_fanouts(num_neighbors, message):
    with pytest.raises(ValueError, match=message):
        SamplingSpec(num_neighbors)


def test_loader_spec_check_schema():
    node_types = ["author", "field", "paper"]
    LoaderSpec.of(("paper", "train"), {CITES: [5]}, batch_size=2).check_schema(node_types, EDGE_TYPES)
    LoaderSpec.of("train", [5]).check_schema(node_types, EDGE_TYPES)
    with pytest.raises(ValueError, match="node type 'venue', which the graph does not have; its node types are "
                                         "'author', 'field', 'paper'"):
        LoaderSpec.of(("venue", "train"), [5]).check_schema(node_types, EDGE_TYPES)
    with pytest.raises(ValueError, match="edge type"):
        LoaderSpec.of("train", {("a", "b", "c"): [5]}).check_schema(node_types, EDGE_TYPES)


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


@pytest.mark.parametrize("node_input", [NodeInput.of(("paper", "train")), NodeInput.of(("paper", [7, 0, 42])),
                                        NodeInput(split="val")], ids=["typed-split", "typed-ids", "untyped"])
@pytest.mark.parametrize("num_neighbors", [(15, -1), {CITES: [10, 5], WRITES: [0, -1]}], ids=["list", "dict"])
def test_proto_round_trip_typed(node_input, num_neighbors):
    spec = LoaderSpec(SamplingSpec(num_neighbors, replace=True, direction="out"), node_input, batch_size=8,
                      shuffle=True, seed=3, rank=1, world_size=2)
    req = open_session_request(spec, "g")
    assert req.node_type == (node_input.node_type or "")
    assert bool(req.spec.num_neighbors) != bool(req.spec.edge_type_fanouts)   # exactly one form on the wire
    assert loader_spec_from_proto(req) == spec


def test_proto_refuses_both_fanout_forms_and_bad_types():
    req = open_session_request(LoaderSpec.of("train", {CITES: [5]}), "g")
    req.spec.num_neighbors.append(5)
    with pytest.raises(ValueError, match="num_neighbors .* or edge_type_fanouts, not both"):
        loader_spec_from_proto(req)
    req = open_session_request(LoaderSpec.of("train", {CITES: [5]}), "g")
    req.spec.edge_type_fanouts.add(edge_type=req.spec.edge_type_fanouts[0].edge_type, fanouts=[3])
    with pytest.raises(ValueError, match=r"spec: num_neighbors names edge type \('paper', 'cites', 'paper'\) twice"):
        loader_spec_from_proto(req)
    req.spec.edge_type_fanouts[1].edge_type.rel = ""
    with pytest.raises(ValueError, match="spec: an edge type's relation must be a non-empty string"):
        loader_spec_from_proto(req)


def test_every_node_travels_as_no_input_an_ordered_loader_as_ids():
    req = open_session_request(LoaderSpec(SAMPLING, NodeInput(node_type="paper")), "g")
    assert req.WhichOneof("input") is None and loader_spec_from_proto(req).input == NodeInput(node_type="paper")
    ordered = LoaderSpec(SAMPLING, NodeInput(), ordered=True)
    with pytest.raises(ValueError, match="ordered loader sends its input as ids"):
        open_session_request(ordered, "g")
    back = loader_spec_from_proto(open_session_request(ordered.ordered_input(5), "g"))
    assert back.ordered and torch.equal(back.input.ids, torch.arange(5))


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


def test_bool_mask_input_nodes_are_the_true_positions():
    mask = torch.tensor([False, True, True, False, True])
    assert torch.equal(NodeInput.of(mask).ids, torch.tensor([1, 2, 4]))
    assert NodeInput.of(("paper", mask)) == NodeInput(ids=torch.tensor([1, 2, 4]), node_type="paper")
    with pytest.raises(ValueError, match="boolean mask must be 1-D"):
        NodeInput.of(torch.ones(2, 2, dtype=torch.bool))
