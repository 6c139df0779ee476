"""The in-process latency model: Bayesian ridge from decayed sufficient statistics, the predictor's readiness,
batched refits and clamping, and the per-endpoint running-request TPOT-SLO queues."""

from __future__ import annotations

import importlib
import inspect
import random

import pytest

from epp.latency.inprocess import TPOT_FEATURES, TTFT_FEATURES, InProcessPredictor, tpot_vector, ttft_vector
from epp.latency.predictor import LatencyFeatures, LatencyPredictor, TrainingSample
from epp.latency.ridge import OnlineBayesianRidge, solve_inverse
from epp.latency.running import RunningRequests, TpotSloQueue


def features(rng: random.Random, **fixed: float) -> LatencyFeatures:
    """Random load features (any given field fixed)."""
    values = {"kv_cache_percentage": rng.random(), "input_token_length": rng.randrange(10, 2000),
              "num_request_waiting": rng.randrange(0, 8), "num_request_running": rng.randrange(0, 16),
              "prefix_cache_score": rng.random(), "prefill_tokens_in_flight": rng.randrange(0, 20000)}
    values.update(fixed)
    return LatencyFeatures(**values)  # type: ignore[arg-type]


def true_ttft(f: LatencyFeatures) -> float:
    """A known linear TTFT law (ms): base, prefill of the uncached tokens, queueing, batch interference."""
    return 8.0 + 0.03 * (1 - f.prefix_cache_score) * f.input_token_length + 12.0 * f.num_request_waiting + \
        1.5 * f.num_request_running


def true_tpot(f: LatencyFeatures) -> float:
    return 5.5 + 0.4 * f.num_request_running + 3.0 * f.kv_cache_percentage


# -- OnlineBayesianRidge -----------------------------------------------------------------------------------------


def test_ridge_recovers_a_known_linear_relation() -> None:
    rng = random.Random(7)
    model = OnlineBayesianRidge(3)
    for _ in range(400):
        x = [rng.uniform(0, 10), rng.uniform(0, 1000), rng.random()]
        model.add(x, 3.0 + 2.0 * x[0] - 0.01 * x[1] + 7.0 * x[2] + rng.gauss(0, 0.05))
    model.fit()
    assert model.fitted
    assert model.coef == pytest.approx([2.0, -0.01, 7.0], rel=0.02)
    assert model.intercept == pytest.approx(3.0, abs=0.1)
    assert model.noise_std == pytest.approx(0.05, rel=0.25)
    assert model.predict([1.0, 100.0, 0.5]) == pytest.approx(3.0 + 2.0 - 1.0 + 3.5, abs=0.05)


def test_a_constant_feature_drops_out() -> None:
    model = OnlineBayesianRidge(2)
    for i in range(20):
        model.add([float(i), 42.0], 1.0 + 0.5 * i)
    model.fit()
    assert model.coef[1] == 0.0
    assert model.predict([4.0, 42.0]) == pytest.approx(3.0, abs=1e-3)


def test_old_samples_fade_out_over_the_window() -> None:
    """After the relation changes, about ``window`` new samples make the model follow the new one."""
    rng = random.Random(3)
    model = OnlineBayesianRidge(1, window=50)
    for _ in range(300):
        x = rng.uniform(0, 10)
        model.add([x], 2.0 * x)
    for _ in range(300):
        x = rng.uniform(0, 10)
        model.add([x], 5.0 * x + 1.0)
    model.fit()
    assert model.coef[0] == pytest.approx(5.0, rel=0.01)


def test_fit_needs_two_samples_and_predict_before_it_is_zero() -> None:
    model = OnlineBayesianRidge(2)
    assert model.predict([1.0, 2.0]) == 0.0
    model.add([1.0, 2.0], 5.0)
    model.fit()
    assert not model.fitted


def test_solve_inverse() -> None:
    a = [[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]]
    inv = solve_inverse(a)
    product = [[sum(a[i][k] * inv[k][j] for k in range(3)) for j in range(3)] for i in range(3)]
    for i in range(3):
        assert product[i] == pytest.approx([1.0 if i == j else 0.0 for j in range(3)], abs=1e-12)
    with pytest.raises(ZeroDivisionError):
        solve_inverse([[1.0, 2.0], [2.0, 4.0]])


@pytest.mark.parametrize("dim,window", [(0, 10.0), (2, 0.5)], ids=["no-features", "window-below-1"])
def test_ridge_rejects_bad_sizes(dim: int, window: float) -> None:
    with pytest.raises(ValueError):
        OnlineBayesianRidge(dim, window)


# -- InProcessPredictor -----------------------------------------------------------------------------------------


def test_predictor_learns_ttft_and_tpot_laws() -> None:
    rng = random.Random(11)
    predictor = InProcessPredictor(objective="mean")
    assert isinstance(predictor, LatencyPredictor)
    for _ in range(300):
        f = features(rng)
        predictor.add_training_data([TrainingSample(f, actual_ttft=true_ttft(f)),
                                     TrainingSample(f, actual_tpot=true_tpot(f))])
    probes = [features(rng) for _ in range(20)]
    for f, pred in zip(probes, predictor.predict_bulk(probes)):
        assert pred.ttft == pytest.approx(true_ttft(f), rel=0.02, abs=0.5)
        assert pred.tpot == pytest.approx(true_tpot(f), rel=0.02, abs=0.1)
    idle, loaded = predictor.predict_bulk([features(rng, num_request_waiting=0, num_request_running=0),
                                           features(rng, num_request_waiting=6, num_request_running=12)])
    assert loaded.ttft > idle.ttft and loaded.tpot > idle.tpot
    coefficients = predictor.coefficients()
    assert set(coefficients["ttft"]) == {"intercept", *TTFT_FEATURES}
    assert set(coefficients["tpot"]) == {"intercept", *TPOT_FEATURES}


def test_not_ready_before_min_samples_then_ready_per_model() -> None:
    rng = random.Random(1)
    predictor = InProcessPredictor(min_samples=5)
    assert not predictor.ttft_ready and not predictor.tpot_ready
    for _ in range(4):
        f = features(rng)
        predictor.add_training_data([TrainingSample(f, actual_ttft=true_ttft(f))])
    assert not predictor.ttft_ready
    f = features(rng)
    [pred] = predictor.predict_bulk([f])
    assert (pred.ttft, pred.tpot) == (0.0, 0.0)  # nothing fitted: 0, as the contract says
    predictor.add_training_data([TrainingSample(f, actual_ttft=true_ttft(f))])
    assert predictor.ttft_ready and not predictor.tpot_ready  # TPOT has no sample yet
    assert predictor.samples == (5, 0)
    [pred] = predictor.predict_bulk([f])
    assert pred.ttft > 0 and pred.tpot == 0.0


def test_refits_are_batched_every_refit_every_samples() -> None:
    """Between refits the model (and so every prediction) stays as it was: a sample costs no refit."""
    rng = random.Random(5)
    predictor = InProcessPredictor(min_samples=10, refit_every=8)
    probe = features(rng)

    def add(n: int) -> float:
        for _ in range(n):
            f = features(rng)
            predictor.add_training_data([TrainingSample(f, actual_ttft=true_ttft(f) * 2)])
        return predictor.predict_bulk([probe])[0].ttft

    first = add(10)  # first fit at min_samples
    assert add(7) == first  # 7 < refit_every
    assert add(1) != first  # the 8th sample since the fit refits


def test_predictions_are_clamped_to_zero() -> None:
    predictor = InProcessPredictor(min_samples=4, objective="mean")
    for waiting in range(8):  # TTFT falls as the queue grows: extrapolating far gives a negative number
        f = LatencyFeatures(0.1, 100, waiting, 0)
        predictor.add_training_data([TrainingSample(f, actual_ttft=100.0 - 10.0 * waiting,
                                                    actual_tpot=50.0 - 5.0 * waiting)])
    [pred] = predictor.predict_bulk([LatencyFeatures(0.1, 100, 100, 0)])
    assert (pred.ttft, pred.tpot) == (0.0, 0.0)


def test_quantile_objective_adds_the_noise_quantile() -> None:
    rng = random.Random(2)
    mean, p90 = InProcessPredictor(objective="mean"), InProcessPredictor(objective="quantile", quantile=0.9)
    for _ in range(400):
        f = features(rng)
        sample = TrainingSample(f, actual_ttft=true_ttft(f) + rng.gauss(0, 4.0))
        mean.add_training_data([sample])
        p90.add_training_data([sample])
    probe = features(rng)
    gap = p90.predict_bulk([probe])[0].ttft - mean.predict_bulk([probe])[0].ttft
    assert gap == pytest.approx(1.2816 * 4.0, rel=0.2)


def test_non_positive_observations_train_nothing() -> None:
    predictor = InProcessPredictor()
    predictor.add_training_data([TrainingSample(LatencyFeatures(0.0, 1, 0, 0), actual_ttft=0.0, actual_tpot=-1.0)])
    assert predictor.samples == (0, 0)


@pytest.mark.parametrize("kwargs", [{"min_samples": 1}, {"refit_every": 0}, {"window": 0}, {"objective": "median"},
                                    {"quantile": 1.0}], ids=lambda k: next(iter(k)))
def test_predictor_rejects_bad_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        InProcessPredictor(**kwargs)


def test_feature_vectors_follow_the_named_order() -> None:
    f = LatencyFeatures(kv_cache_percentage=0.5, input_token_length=100, num_request_waiting=2,
                        num_request_running=3, prefix_cache_score=0.25, prefill_tokens_in_flight=700,
                        pod_type="prefill")
    assert dict(zip(TTFT_FEATURES, ttft_vector(f))) == {
        "is_queued": 1.0, "kv_cache_percentage": 0.5, "input_token_length": 100, "num_request_waiting": 2,
        "num_request_running": 3, "prefill_tokens_in_flight": 700, "prefix_cache_score": 0.25,
        "effective_input_tokens": 75.0, "pod_type_prefill": 1.0, "pod_type_decode": 0.0}
    assert dict(zip(TPOT_FEATURES, tpot_vector(f)))["is_queued"] == 1.0
    assert len(tpot_vector(f)) == len(TPOT_FEATURES)


# -- running-request TPOT-SLO queues ----------------------------------------------------------------------------


def test_queue_minimum_count_and_removal() -> None:
    q = TpotSloQueue()
    assert q.min_slo() == 0.0
    assert q.add("a", 50.0) and q.add("b", 20.0) and q.add("c", 30.0)
    assert not q.add("b", 10.0) and not q.add("", 5.0) and not q.add("d", -1.0)  # duplicate, no id, negative
    assert (len(q), q.min_slo()) == (3, 20.0)
    assert q.remove("b") and not q.remove("b")
    assert (len(q), q.min_slo(), "b" in q) == (2, 30.0, False)
    assert q.add("b", 40.0)  # back with another SLO: the stale 20 is not the minimum
    assert q.min_slo() == 30.0


def test_a_request_without_tpot_slo_turns_the_minimum_off() -> None:
    """As the reference: no header queues SLO 0, the minimum, which reads as 'no SLO'."""
    running = RunningRequests()
    running.add("ep", "strict", 15.0)
    running.add("ep", "no-slo", 0.0)
    assert (running.count("ep"), running.min_slo("ep")) == (2, 0.0)
    running.remove("ep", "no-slo")
    assert running.min_slo("ep") == 15.0
    running.remove("ep", "strict")
    assert running.endpoints() == [] and running.count("ep") == 0 and running.min_slo("other") == 0.0


def test_stale_heap_entries_stay_bounded() -> None:
    q = TpotSloQueue()
    q.add("anchor", 0.0)  # never removed: stale entries above it never reach the top
    for i in range(1000):
        q.add(f"r{i}", 100.0 + i)
        q.remove(f"r{i}")
    assert len(q._heap) <= 2 * len(q) + 17
    assert q.min_slo() == 0.0


@pytest.mark.parametrize("name", ["epp.latency", "epp.latency.predictor", "epp.latency.ridge", "epp.latency.inprocess",
                                  "epp.latency.running", "epp.latency.metrics"])
def test_latency_modules_export_their_public_names(name: str) -> None:
    module = importlib.import_module(name)
    exported = set(module.__all__)
    assert all(hasattr(module, n) for n in exported)
    defined = {n for n, obj in vars(module).items() if not n.startswith("_") and
               (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == name}
    assert defined <= exported, sorted(defined - exported)
