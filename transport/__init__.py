"""graphfeed.transport: the data path between session workers and the trainer.

:mod:`.registry` names its transports -- data paths (:mod:`.torch_rpc`, :mod:`.secure`), each a
:class:`~graphfeed.transport.path.DataPath` with a worker end and a trainer end, and pull channels
(:mod:`.shm`) -- and the daemon, the workers and the client ask it rather than a flag."""
