"""Learnable embedding tables held by the servers (:mod:`graphfeed.core.embedding` has the records and rules).

:class:`PartTable` is the rows of one table that one part owns; :class:`EmbeddingStore` a session worker's
tables (its trainer group's), with the reads of other parts' rows through the group's data path;
:class:`LocalEmbedding` every part's rows of a table in one process, for the local loader.
"""
from graphfeed.server.embedding.store import EmbeddingStore, LocalEmbedding
from graphfeed.server.embedding.table import PartTable

__all__ = ["EmbeddingStore", "LocalEmbedding", "PartTable"]
