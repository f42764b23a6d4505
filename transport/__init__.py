"""graphfeed.transport: the data path between session workers and the trainer (torch RPC group
set-up, the batch channel)."""
