"""Where a loader is in its epochs: the one live iterator, the cursor, and the checkpoint state.

Both loaders (local and remote) keep an :class:`EpochProgress`:

* **Epochs.** Each ``iter()`` starts the next epoch (``set_epoch`` overrides); a loaded
  checkpoint makes the next ``iter()`` continue its epoch at its cursor.
* **One live iterator.** ``iter()`` while an earlier iterator of the same loader is still
  running raises RuntimeError at that call (nothing is sent to any server, so the running
  epoch and every other loader are unaffected).  An iterator that finished, failed, was
  closed (``it.close()``) or was dropped (``break`` out of a ``for``) is no longer live.
* **Checkpoint.** :meth:`EpochProgress.state_dict` follows torchdata's
  ``StatefulDataLoader``: taken after the trainer received ``k`` batches of epoch ``e``, it
  says (``epoch=e``, ``cursor=k``), and a loader that loads it continues with batch ``k``.
  Taken between epochs, it names the next epoch with cursor 0.  The state carries the
  loader's seed and its settings and inputs fingerprints (:mod:`graphfeed.core.agreement`);
  a loader with others refuses it.
"""
from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STATE_VERSION = 1
STATE_KEYS = ("version", "epoch", "cursor", "seed", "inputs_fingerprint", "settings_fingerprint")


class EpochProgress:
    """Epoch counter, resume cursor and the state of the loader's latest iterator."""

    def __init__(self) -> None:
        self.next_epoch = 0        # what the next iter() starts
        self.resume_cursor = 0     # ... at this position (a loaded checkpoint)
        self.epoch: int | None = None   # the latest iterator's epoch
        self.delivered = 0         # batches of that epoch the trainer has received (its cursor)
        self.total = 0             # batches of that epoch for this rank
        self.status = "none"       # none | live | done | abandoned | failed
        self._gen: weakref.ReferenceType | None = None

    def set_epoch(self, epoch: int) -> None:
        self.next_epoch, self.resume_cursor = int(epoch), 0

    def live(self) -> bool:
        """True while the latest iterator can still yield batches."""
        gen = self._gen() if self._gen is not None else None
        if self.status == "live" and (gen is None or gen.gi_frame is None):
            self.status = "abandoned"   # dropped (or closed) before it ran its own clean-up
        return self.status == "live"

    def begin(self) -> tuple[int, int]:
        """``(epoch, start cursor)`` of a new iterator; RuntimeError while another one is live."""
        if self.live():
            raise RuntimeError(f"this loader already has a live iterator (epoch {self.epoch}, {self.delivered} of "
                               f"{self.total} batches delivered): finish it, or stop it (break / it.close()) "
                               f"before iter() again; to look at a batch, keep the one the loop gave you, or use "
                               f"a second loader")
        epoch, start = self.next_epoch, self.resume_cursor
        self.next_epoch, self.resume_cursor = epoch + 1, 0
        return epoch, start

    def attach(self, gen, epoch: int, start: int, total: int) -> None:
        """``gen`` is the running iterator of ``epoch``, starting at ``start`` of ``total`` batches."""
        self._gen = weakref.ref(gen)
        self.epoch, self.delivered, self.total, self.status = epoch, start, total, "live"

    def finish(self, status: str) -> None:
        """The iterator ended: ``done`` (every batch delivered), ``abandoned`` or ``failed``."""
        self.status = status

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around an epoch's generator body: records how the iterator ended (:meth:`finish`) --
        ``abandoned`` when it is closed early, ``failed`` when it raises, ``done`` otherwise."""
        try:
            yield
        except GeneratorExit:
            self.finish("abandoned")
            raise
        except BaseException:
            self.finish("failed")
            raise
        self.finish("done")

    # ---- checkpoint ---------------------------------------------------------------------------------

    def position(self) -> tuple[int, int]:
        """``(epoch, cursor)`` a checkpoint taken now resumes at."""
        unfinished = self.live() or self.status == "failed"
        if unfinished and self.epoch is not None and self.delivered < self.total:
            return self.epoch, self.delivered
        return self.next_epoch, self.resume_cursor

    def state_dict(self, seed: int, settings_fp: int, inputs_fp: int) -> dict[str, Any]:
        epoch, cursor = self.position()
        return {"version": STATE_VERSION, "epoch": epoch, "cursor": cursor, "seed": int(seed),
                "inputs_fingerprint": int(inputs_fp), "settings_fingerprint": int(settings_fp)}

    def load_state_dict(self, state, seed: int, settings_fp: int, inputs_fp: int) -> None:
        """Continue at ``state``'s position on the next ``iter()``.  ValueError when the state is
        malformed or was taken from a loader with another seed, settings or input set;
        RuntimeError while an iterator is live."""
        check_state(state, seed, settings_fp, inputs_fp)
        if self.live():
            raise RuntimeError("load_state_dict() while an iterator of this loader is live: finish or stop it first")
        self.next_epoch, self.resume_cursor = int(state["epoch"]), int(state["cursor"])


def check_state(state, seed: int, settings_fp: int, inputs_fp: int) -> None:
    """ValueError naming the problem unless ``state`` is a graphfeed loader state of this loader."""
    if not isinstance(state, dict) or any(k not in state for k in STATE_KEYS):
        raise ValueError(f"not a graphfeed loader state: expected a dict with keys {', '.join(STATE_KEYS)} "
                         f"(what loader.state_dict() returns)")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"loader state version {state['version']!r} is not supported (this graphfeed writes "
                         f"{STATE_VERSION})")
    for key in ("epoch", "cursor"):
        if not isinstance(state[key], int) or state[key] < 0:
            raise ValueError(f"loader state {key} = {state[key]!r}: must be a non-negative integer")
    mismatches = [name for name, mine in (("seed", seed), ("settings_fingerprint", settings_fp),
                                          ("inputs_fingerprint", inputs_fp)) if state[name] != mine]
    if mismatches:
        raise ValueError(f"this loader state was saved by a different loader ({', '.join(mismatches)} differ): "
                         f"create the loader with the same input_nodes, num_neighbors, batch_size, shuffle, "
                         f"drop_last, seed and world size as the one that saved it")


def check_cursor(epoch: int, start: int, total: int) -> None:
    """ValueError unless a resumed epoch's cursor ``start`` is within its ``total`` batches."""
    if not 0 <= start <= total:
        raise ValueError(f"the loaded state resumes epoch {epoch} at batch {start}, but this rank's epoch has "
                         f"{total} batches: the state belongs to another rank or world size")


class PygLoaderFace:
    """What PyG's loaders expose that both of graphfeed's loaders answer alike (mixed into each): the epoch a
    DDP script sets, the batch size and the dataset.  The loader holds ``spec`` (its ``LoaderSpec``),
    ``counts`` (every part's input count) and ``_progress`` (its :class:`EpochProgress`)."""

    spec: Any
    counts: list[int]
    _progress: EpochProgress

    def set_epoch(self, epoch: int) -> None:
        self._progress.set_epoch(epoch)

    @property
    def batch_size(self) -> int:
        """Seeds (seed edges) per batch, as PyG's ``loader.batch_size``."""
        return self.spec.batch_size

    @property
    def dataset(self) -> range:
        """``range(number of input nodes or seed edges)``, every rank's together, as PyG's ``loader.dataset``."""
        return range(sum(self.counts))
