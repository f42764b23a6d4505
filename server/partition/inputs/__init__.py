"""The graphs ``graphfeed partition`` reads: the record they are read into (:mod:`.graph`: ``GraphInput``, its
fingerprint), the readers behind one interface (:mod:`.reader`: ``read_graph`` picks the reader of a path),
the checks every reader shares (:mod:`.arrays`), and the synthetic graphs of ``graphfeed generate``
(:mod:`.synth`).  Chunked inputs (:mod:`.chunked`, over :mod:`.chunks`) are read a row range at a time."""
