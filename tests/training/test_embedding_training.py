"""Typed training with featureless authors (mag-tiny, 2 servers): the same to_hetero GraphSAGE learns the papers'
classes better with server-held author embeddings than with zero author features (graphfeed.bench.embedding).

The batches sample papers' citations and authors only (the fields' features would carry the label signal on their own):
the papers' features and citations are weak signals by design, the authors' communities a strong one that only a
learned author embedding can carry."""
from __future__ import annotations

import graphfeed.client as gf
from graphfeed.bench.embedding import EmbeddingBenchConfig, featureless_types, train_typed

EDGE_TYPES = (("paper", "cites", "paper"), ("author", "writes", "paper"), ("paper", "written_by", "author"))


def test_server_embeddings_beat_the_same_model_without_them(shared_mag_cluster):
    addresses = tuple(s.address for s in shared_mag_cluster)
    cfg = EmbeddingBenchConfig(servers=addresses, dim=32, hidden=32, num_neighbors=(8, 4), batch_size=128, epochs=4,
                               lr=0.01, emb_lr=0.05, edge_types=EDGE_TYPES)
    runs = {}
    for name, with_tables in (("plain", False), ("embedding", True)):
        with gf.connect(list(addresses), timeout=60) as client:
            assert featureless_types(client) == ["author"]   # papers and fields have features
            runs[name] = train_typed(client, cfg, embeddings=with_tables)
    assert runs["embedding"]["val_accuracy"] >= runs["plain"]["val_accuracy"] + 0.15, runs
    assert runs["embedding"]["rows_applied_per_s_per_server"] > 0
