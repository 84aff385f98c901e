import pytest

from predictor.batching import BatchingProfile, ProfileError
from predictor.shape import PiecewiseLinear, ShapeError, scale_to_score, validate_points


@pytest.mark.parametrize(
    "x, want",
    [(-5, 0.0), (0, 0.0), (5, 5.0), (10, 10.0), (15, 30.0), (20, 50.0), (99, 50.0)],
    ids=["below", "first", "mid-first", "knot", "mid-second", "last", "above"],
)
def test_piecewise_linear_interpolates_and_clamps(x, want):
    f = PiecewiseLinear.from_points([[0, 0], [10, 10], [20, 50]])
    assert f(x) == pytest.approx(want)


@pytest.mark.parametrize(
    "points, fragment",
    [
        ([], "at least one point"),
        ([[0, 0], [0, 1]], "points[1]: x=0 is not greater"),
        ([[1, 0], [0, 1]], "points[1]"),
        ([[0, float("nan")]], "finite"),
        ([[0, 1, 2]], "expected [x, y]"),
        ([["a", 1]], "numbers"),
    ],
    ids=["empty", "repeated-x", "decreasing-x", "nan", "triple", "text"],
)
def test_invalid_points_report_their_path(points, fragment):
    assert any(fragment in p for p in validate_points(points))
    with pytest.raises(ShapeError):
        PiecewiseLinear.from_points(points)


def test_scale_to_score_is_int_and_oriented():
    assert scale_to_score(0.0, worst=1.0, best=0.0) == 10
    assert scale_to_score(1.0, worst=1.0, best=0.0) == 0
    assert scale_to_score(0.26, worst=1.0, best=0.0) == 7
    assert isinstance(scale_to_score(0.5, worst=1.0, best=0.0), int)
    assert scale_to_score(5.0, worst=1.0, best=0.0) == 0


def test_linear_profile_matches_formula_and_inverse():
    # Nexus Table 2 model A: l(b) = 3.125 b + 37.5 ms (digest worked example)
    p = BatchingProfile.linear("A", "titanx", alpha_ms=3.125, beta_ms=37.5)
    assert p.latency_ms(8) == pytest.approx(62.5)
    assert p.max_batch_within(62.5) == 8
    assert p.max_batch_within(62.4) == 7
    assert p.max_batch_within(10.0) == 0
    assert p.throughput_rps(8) == pytest.approx(128.0)


def test_table_profile_is_monotone_upper_bound():
    p = BatchingProfile.from_table("B", "titanx", [[1, 10], [4, 20], [5, 18], [8, 30]])
    assert p.max_batch == 8
    assert p.latency_ms(5) == pytest.approx(20.0)  # the dip to 18 is not trusted
    assert p.latency_ms(6) == pytest.approx(22.0)
    assert [p.latency_ms(b) for b in range(1, 9)] == sorted(p.latency_ms(b) for b in range(1, 9))
    with pytest.raises(ProfileError):
        p.latency_ms(9)


def test_table_below_first_row_uses_first_latency():
    p = BatchingProfile.from_table("B", "titanx", [[4, 50], [8, 90], [16, 125]])
    assert p.latency_ms(1) == pytest.approx(50.0)
    assert p.latency_ms(12) == pytest.approx(107.5)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(alpha_ms=0, beta_ms=1),
        dict(alpha_ms=1, beta_ms=-1),
        dict(alpha_ms=1, beta_ms=1, memory_mib=-5),
        dict(alpha_ms=1, beta_ms=1, max_batch=0),
    ],
    ids=["zero-alpha", "negative-beta", "negative-memory", "zero-max-batch"],
)
def test_invalid_linear_profiles_raise(kwargs):
    with pytest.raises(ProfileError):
        BatchingProfile.linear("m", "g", **kwargs)


@pytest.mark.parametrize(
    "rows",
    [[[0, 1]], [[1.5, 2]], [[1, 0]], [[2, 1], [1, 2]]],
    ids=["zero-batch", "fractional-batch", "zero-latency", "unsorted"],
)
def test_invalid_tables_raise(rows):
    with pytest.raises(ProfileError):
        BatchingProfile.from_table("m", "g", rows)
