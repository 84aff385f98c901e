"""What passes from one ONNX Runtime piece of a model to the next.

Between pieces cut where one tensor is live, a piece's outputs are the next one's
inputs. Between the row tiles of a long Conv (``preparation/tiling.py``) several
are live: the Conv's input, read by every tile, and the tiles done, read by the
Concat at the end. Each piece is given only what it reads, and the tensors a later
piece reads are carried past the pieces that do not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Feed = dict[str, np.ndarray]
"""Named tensors between pieces of a model."""


def piece_inputs(sess: Any, feed: Feed) -> Feed:
    """What of ``feed`` a piece (an ``onnxruntime.InferenceSession``) reads."""
    return {i.name: feed[i.name] for i in sess.get_inputs()}


def later_inputs(sessions: list[Any], index: int) -> frozenset[str]:
    """The tensors the pieces after ``index`` read."""
    return frozenset(i.name for s in sessions[index + 1:] for i in s.get_inputs())


def advance(sess: Any, outs: list[Any], feed: Feed, carried: frozenset[str]) -> Feed:
    """The feed after a piece: its outputs and what later pieces still read of the
    feed before it (nothing after the last: the model's outputs alone)."""
    kept = {k: v for k, v in feed.items() if k in carried}
    return {**kept, **{o.name: v for o, v in zip(sess.get_outputs(), outs, strict=True)}}
