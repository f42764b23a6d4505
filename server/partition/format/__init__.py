"""What a partition folder is and what the servers read from it: the on-disk layout and ``META.json``
(:mod:`.layout`, the one module that knows the paths), the range partition book (:mod:`.book`), the
memory-mapped part (:mod:`.store`: ``Partition``), and what the loaders' options read besides the graph: int8
feature scales (:mod:`.quantize`) and per-edge hard negatives (:mod:`.hard_negatives`).  Imports nothing of
``build`` or ``inputs``: a daemon that only serves partitions never loads the partitioner."""
