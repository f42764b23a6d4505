"""graphfeed.core: what the client and the servers both import -- the epoch contract, the
spec records, the batch schema, RNG seeding and shared constants.  Depends on torch only."""
