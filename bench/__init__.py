"""graphfeed.bench: the figures of ``graphfeed bench sample`` and ``graphfeed bench remote``."""
