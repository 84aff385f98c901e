"""benchmarks/interference.py on Gavel's P100 data: the measured matrix pairs as published,
and the pair learner, after three random pairings per job, pairs better than chance."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bench_modules import load

load("_common")  # the benchmark's own first import, found beside it when run as a script
bench = load("interference")

pytestmark = pytest.mark.skipif(not bench.DATA.exists(), reason="shared Gavel data not present")


def test_matrix_pairing_matches_the_published_figure_and_the_learner_beats_chance() -> None:
    raw = json.loads(bench.DATA.read_text())
    jobs, truth = bench.matrix(raw, "p100")
    assert len(jobs) == 26
    assert bench.pairing_value(truth, truth) == pytest.approx(1.299, abs=0.001)
    learned = [bench.pairing_value(bench.learner_predictions(jobs, truth, 3,
                                                             np.random.default_rng(s)), truth)
               for s in range(3)]
    rng = np.random.default_rng(0)
    chance = [bench.pairing_value(rng.random(truth.shape) + 1, truth) for _ in range(3)]
    assert np.mean(learned) > np.mean(chance) + 0.02
