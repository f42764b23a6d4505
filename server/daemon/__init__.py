"""The sampler-server daemon (``graphfeed serve``): config, lifecycle, control plane.

- :mod:`.config`   -- one YAML schema validated into a frozen :class:`ServerConfig`
                      (defaults < YAML file < ``GRAPHFEED_*`` env vars < flags).
- :mod:`.exitcodes` -- the process exit codes, in one place.
- :mod:`.app`      -- startup -> serve -> drain -> shutdown (gRPC aio on uvloop).
- :mod:`.control`  -- the ``graphfeed.control.v1.Control`` servicer.
- :mod:`.registry` -- groups (one session worker per trainer), sessions, leases, reaper.
- :mod:`.logs`     -- structured (JSON / logfmt) log lines on stderr.
"""
