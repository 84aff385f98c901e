"""What row tiles cost: a best-effort job's pieces of a long Conv against one whole run.

Run (CPU, ONNX Runtime, one intra-op thread as the server's executor; about 30 s):
    .venv/bin/python benchmarks/serving_tiles.py

The model is ``serving_clients``'s best-effort job (Conv 3->64, Conv 64->64 3x3 on
192x192, then a mean). Its atoms (``agent.inference.preparation.segments.atoms``: the
second Conv in row tiles) run in turn, each given what it reads and carrying what
later ones read (``executors/feeds.py``), alternating with one run of the whole
model; medians over ``--repeats`` (after two warm-up rounds). ``overhead``: the pieces
in turn over the whole run, less 1; ``pieces_ms``: each piece's mean.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import _common
import numpy as np
import onnxruntime as ort

from agent.inference.executors.feeds import advance, later_inputs, piece_inputs
from agent.inference.preparation.segments import atoms, fold_constants
from agent.inference.preparation.tiling import MAX_TILE_MACS
from benchmarks.serving_clients import BE_SHAPE, conv_net


def measure(repeats: int) -> dict[str, Any]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    whole = ort.InferenceSession(fold_constants(conv_net()).SerializeToString(), opts)
    pieces = [ort.InferenceSession(p.SerializeToString(), opts) for p in atoms(conv_net())]
    x = np.random.default_rng(0).standard_normal(BE_SHAPE).astype(np.float32)
    chained, alone, each = [], [], np.zeros(len(pieces))
    for r in range(repeats + 2):
        feed, began = {"x": x}, time.perf_counter()
        for i, sess in enumerate(pieces):
            start = time.perf_counter()
            outs = sess.run(None, piece_inputs(sess, feed))
            feed = advance(sess, outs, feed, later_inputs(pieces, i))
            if r >= 2:
                each[i] += (time.perf_counter() - start) * 1000.0 / repeats
        took = (time.perf_counter() - began) * 1000.0
        start = time.perf_counter()
        whole.run(None, {"x": x})
        if r >= 2:
            chained.append(took)
            alone.append((time.perf_counter() - start) * 1000.0)
    chain_ms, whole_ms = float(np.median(chained)), float(np.median(alone))
    return {"pieces": len(pieces), "max_tile_macs": MAX_TILE_MACS,
            "pieces_in_turn_median_ms": chain_ms, "whole_median_ms": whole_ms,
            "overhead": chain_ms / whole_ms - 1.0,
            "pieces_ms": [round(float(v), 2) for v in each],
            "longest_piece_ms": float(each.max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    _common.add_out_option(parser, "serving_tiles_cpu")
    args = parser.parse_args()
    before = _common.load_average()
    out = {"benchmark": "serving_tiles", "repeats": args.repeats, **measure(args.repeats),
           "load_average_before": before, "load_average_after": _common.load_average()}
    out.update(_common.context(("numpy", "onnxruntime")))
    _common.write_result(out, args.out)


if __name__ == "__main__":
    main()
