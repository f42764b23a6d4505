"""The compact wire form of a batch (graphfeed.core.compact): exact round trips, fewer bytes, bad packings refused."""
from __future__ import annotations

import pickle

import pytest
import torch
from helpers.graphs import mag_tiny_parts, synthetic_parts

from graphfeed.core import batch as schema
from graphfeed.core import compact
from graphfeed.core.compact import PackedBatch, pack, unpack
from graphfeed.server.loader.link import LocalLinkNeighborLoader
from graphfeed.server.loader.local import LocalNeighborLoader
from graphfeed.server.sampling.producer import planned_batches
from graphfeed.transport import wire

EI = schema.edge_key("edge_index", ("_N", "to", "_N"))


def assert_identical(got: dict, want: dict) -> None:
    """Same keys in the same order, and per key the same dtype, shape and values."""
    assert list(got) == list(want)
    for key, t in want.items():
        assert got[key].dtype == t.dtype and got[key].shape == t.shape, key
        assert torch.equal(got[key], t), key


def raw_batches(loader, limit: int = 4) -> list[dict]:
    """The first wire batches (before to_pyg) of a local loader's epoch 0."""
    plan = loader._plan(0)
    out = []
    for seq, entry, seeds, input_id in planned_batches(plan, loader.inputs, loader.positions):
        out.append(loader._produce(0, seq, entry, seeds, input_id))
        if len(out) == limit:
            break
    return out


def through_secure_wire(value, tamper=None):
    """``value`` encoded and decoded as the secure data path's frames carry it (JSON header, one body);
    ``tamper(header)`` changes the header on the way."""
    header, buffers = wire.encode(value)
    if tamper is not None:
        tamper(header)
    offsets, size = wire.layout(buffers)
    body = torch.zeros(size, dtype=torch.uint8)
    for at, b in zip(offsets, buffers):
        body[at:at + b.numel()] = b
    descriptors = [[at, int(b.numel())] for at, b in zip(offsets, buffers)]
    return wire.decode(wire.loads_header(wire.dumps_header(header)), body, descriptors)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return synthetic_parts(tmp_path_factory.mktemp("compact") / "parts", nodes=3000, avg_degree=8, features=8,
                           classes=5, parts=2, name="compact")


def a_node_batch(num_nodes: int = 400, num_edges: int = 1500, seed: int = 0) -> dict:
    """A node batch of the one-type graph with every integer field (disjoint ``batch``, ``x_cached``,
    ``emb_gid``) and a sorted column with gaps (destinations without edges), as the sampler emits."""
    g = torch.Generator().manual_seed(seed)
    col = torch.sort(torch.randint(0, num_nodes // 2, (num_edges,), generator=g)).values
    row = torch.randint(0, num_nodes, (num_edges,), generator=g)
    n_id = torch.randperm(10**6, generator=g)[:num_nodes]
    wire_batch = schema.encode(x=torch.randn(num_nodes, 4, generator=g),
                               y=torch.randint(0, 40, (num_nodes,), generator=g),
                               edge_index=torch.stack([row, col]), n_id=n_id,
                               e_id=torch.randint(0, 3 * 10**7, (num_edges,), generator=g),
                               num_sampled_nodes=[64, 136, 200], num_sampled_edges=[500, 1000], batch_size=64,
                               epoch=1, seq=2, index=3, input_id=torch.arange(64) * 7,
                               batch=torch.randint(0, 64, (num_nodes,), generator=g))
    wire_batch[schema.node_key("x_cached", "_N")] = torch.arange(0, num_nodes, 3)
    wire_batch[schema.node_key("emb", "_N")] = torch.randn(num_nodes, 2, generator=g)
    wire_batch[schema.node_key("emb_gid", "_N")] = n_id.clone()
    return wire_batch


# ---- exact round trips ------------------------------------------------------------------------------

def test_every_index_field_round_trips_bit_identical_and_travels_narrow():
    b = a_node_batch()
    packed = pack(b)
    assert_identical(unpack(packed), b)
    t = packed.tensors
    assert t[EI].dtype == torch.int16 and t[EI].shape == (1500,), "the row alone, narrowed"
    assert packed.counts[EI].dtype == torch.uint8 and int(packed.counts[EI].sum()) == 1500
    assert t[schema.node_key("n_id", "_N")].dtype == torch.int32        # ids below 10**6
    assert t[schema.edge_key("e_id", ("_N", "to", "_N"))].dtype == torch.int32
    for key in ("y", "batch"):
        assert t[schema.node_key(key, "_N")].dtype in (torch.uint8, torch.int16), key
    assert t[schema.node_key("emb_gid", "_N")].dtype == torch.int32
    # strictly increasing index sets travel as bitmasks: x_cached (positions 0, 3, ..., 399), a sorted input_id
    assert set(packed.bitsets) == {schema.node_key("x_cached", "_N"), "input_id"}
    assert t[schema.node_key("x_cached", "_N")].shape == (50,) and t["input_id"].shape == (56,)
    for key in ("x", "emb"):   # floating tensors untouched, not even copied
        assert t[schema.node_key(key, "_N")] is b[schema.node_key(key, "_N")]
    assert t[schema.META].dtype == torch.int64 and schema.META not in packed.widen   # too small to bother
    assert packed.nbytes() < schema.nbytes(b) * 0.7


def test_values_that_need_their_width_stay_int64_and_boundaries_narrow_exactly():
    b = a_node_batch()
    n_id = schema.node_key("n_id", "_N")
    e_id = schema.edge_key("e_id", ("_N", "to", "_N"))
    b[n_id] = b[n_id].clone()
    b[n_id][5] = 2**31                        # one id past int32: the whole field stays int64
    b[e_id] = b[e_id].clone()
    b[e_id][0] = -(2**31) - 1
    b["input_id"] = torch.full((64,), 2**31 - 1)      # the int32 bounds themselves narrow
    b["input_id"][0] = -(2**31)
    packed = pack(b)
    assert packed.tensors[n_id].dtype == torch.int64 and n_id not in packed.widen
    assert packed.tensors[e_id].dtype == torch.int64 and e_id not in packed.widen
    assert packed.tensors["input_id"].dtype == torch.int32
    assert_identical(unpack(packed), b)
    for lo, hi, dtype in ((0, 255, torch.uint8), (-1, 127, torch.int8), (0, 256, torch.int16), (-129, 0, torch.int16),
                          (0, 2**15, torch.int32)):
        assert compact._narrow(torch.tensor([lo, hi] * 10)).dtype == dtype, (lo, hi)


def test_index_sets_travel_as_bitmasks_only_when_smaller_and_strictly_increasing():
    key = schema.node_key("x_cached", "_N")
    for values, as_bits in ((torch.arange(0, 4000, 2), True), (torch.arange(8, 24), True),
                            (torch.tensor([0] * 5 + list(range(100))), False),     # repeats: not a set
                            (torch.arange(0, 40000, 500), False),                   # sparse: bits are more bytes
                            (torch.arange(-3, 100), False), (torch.arange(100).flip(0), False)):
        b = a_node_batch()
        b[key] = values
        packed = pack(b)
        assert (key in packed.bitsets) == as_bits, values[:6]
        assert_identical(unpack(packed), b)
        assert_identical(unpack(through_secure_wire(packed)), b)


def test_an_unsorted_or_big_column_travels_narrowed_not_as_counts():
    b = a_node_batch()
    ei = b[EI].clone()
    ei[1] = ei[1].flip(0)          # descending: not grouped by destination
    b[EI] = ei
    packed = pack(b)
    assert EI not in packed.counts and packed.tensors[EI].shape == (2, 1500)
    assert packed.tensors[EI].dtype == torch.int16
    assert_identical(unpack(packed), b)
    few = a_node_batch(num_nodes=400, num_edges=16)   # 16 edges over 200 destinations: counts would be bigger
    few[EI] = torch.stack([few[EI][0], torch.arange(16) * 12])
    assert EI not in pack(few).counts
    assert_identical(unpack(pack(few)), few)


def test_columns_with_leading_and_trailing_gaps_and_empty_edge_types_round_trip():
    b = a_node_batch()
    col = torch.tensor([3] * 5 + [4] * 20 + [9] * 300 + [700] * 2000)   # leading zeros and gaps in the counts
    b[EI] = torch.stack([torch.arange(col.numel()), col])
    packed = pack(b)
    assert EI in packed.counts and packed.counts[EI].dtype == torch.int16   # 2000 edges of one destination
    assert_identical(unpack(packed), b)
    empty = a_node_batch()
    empty[EI] = torch.empty((2, 0), dtype=torch.int64)
    assert_identical(unpack(pack(empty)), empty)


def test_sampled_node_typed_and_link_batches_round_trip(parts, tmp_path):
    node = raw_batches(LocalNeighborLoader(parts, [5, 3], batch_size=64, shuffle=True, seed=1, disjoint=True))
    mag = tmp_path / "mag"
    mag_tiny_parts(mag)
    typed = raw_batches(LocalNeighborLoader(mag, [4, 2], batch_size=32, input_nodes=("paper", "train"), seed=2))
    first = raw_batches(LocalNeighborLoader(parts, [1], batch_size=200), 1)[0]
    seeds = first[EI][:, :150]
    link = raw_batches(LocalLinkNeighborLoader(parts, [4, 2], edge_label_index=seeds, batch_size=32, shuffle=True,
                                               neg_sampling_ratio=1.0))
    triplet = raw_batches(LocalLinkNeighborLoader(parts, [4, 2], edge_label_index=seeds, batch_size=32,
                                                  neg_sampling=dict(mode="triplet", amount=2)))
    assert "edge_label_index" in link[0] and "dst_neg_index" in triplet[0]
    for b in node + typed + link + triplet:
        packed = pack(b)
        assert_identical(unpack(packed), b)
        assert packed.nbytes() < schema.nbytes(b)
    # the sampler emits each edge type's edges grouped by destination: every non-trivial column travels as counts
    packed = [pack(b) for b in node + typed]
    assert all(k in p.counts for p in packed for k, t in p.tensors.items()
               if k.startswith("edge_index@") and t.numel() > 4 * compact.MIN_NUMEL)
    assert sum(len(p.counts) for p in packed) >= len(packed)


def test_packed_batches_cross_both_transports_and_plain_batches_pass_unpack():
    b = a_node_batch()
    packed = pack(b)
    assert_identical(unpack(pickle.loads(pickle.dumps(packed))), b)      # torch RPC pickles it
    assert_identical(unpack(through_secure_wire(packed)), b)              # the secure path's allow-listed record
    assert unpack(b) is b                                                # shared memory answers plain batches


# ---- bad packings -----------------------------------------------------------------------------------

def test_a_packing_that_does_not_fit_is_refused_naming_the_version():
    b = a_node_batch()
    packed = pack(b)
    short = dict(packed.counts)
    short[EI] = short[EI].clone()
    short[EI][0] += 1
    with pytest.raises(schema.BatchSchemaError, match="counts sum to 1501 for 1500 edges.*same graphfeed version"):
        unpack(PackedBatch(packed.tensors, packed.widen, short))
    with pytest.raises(ValueError, match="format 2 is not this graphfeed's 1"):
        PackedBatch(packed.tensors, packed.widen, packed.counts, version=2)
    with pytest.raises(ValueError, match="widen must map keys to one of"):
        PackedBatch(packed.tensors, {EI: "float32"}, {})
    with pytest.raises(ValueError, match="does not carry"):
        PackedBatch({}, {"n_id@_N": "int64"}, {})
    with pytest.raises(ValueError, match="bitsets must name its 1-D uint8 tensors"):
        PackedBatch(packed.tensors, packed.widen, packed.counts, (EI,))
    with pytest.raises(ValueError, match="not an edge_index"):
        PackedBatch(packed.tensors, packed.widen, {"n_id@_N": torch.ones(3, dtype=torch.uint8)})
    def widen_to_pickle(header):
        header["f"]["widen"] = {"$d": [["meta", "pickle"]]}

    with pytest.raises(wire.WireError, match="record PackedBatch does not validate"):   # through its constructor
        through_secure_wire(packed, widen_to_pickle)
