"""Writing a partition folder: the in-memory builder (:mod:`.builder`: assign, renumber, write atomically), its
assignments (:mod:`.metis`), and the bounded-memory pipeline for graphs bigger than one machine
(:mod:`.bounded`: chunk tasks through disk under a memory plan, :mod:`.plan`; resumable through the scratch
folder, :mod:`.scratch`; streaming assignment, :mod:`.fennel` over :mod:`.coarsen`; tasks run by
:mod:`.runner`, here or on Dask).  Both write byte-identical folders for the same assignment."""
