"""`local_sgd: {warmup_steps: auto}`: synchronous steps exchanged as `compression: auto`
chooses, until its measurements predict that local steps reach accuracy sooner
(tfdist/local_sgd/go_local.py) — then DiLoCo's local steps from the next step on.

The judgement's arithmetic is checked against the cost model by hand; the switch is
checked against runs with the same decisions fixed in advance (a fixed warm-up of that
many steps, exchanged with auto's choice), on every replica, under mixed_float16 and
across a SIGTERM. The verdict itself is forced in those runs (`goes_local` patched): on
the in-process link its inputs are timings.
"""

import keras
import numpy as np
import pytest

import tfdist
from tfdist.compression import choice
from tfdist.compression import cost_model
from tfdist.compression.auto import METHODS, AutoCompression
from tfdist.compression.link_timer import LinkTimer
from tfdist.config import ConfigError, config_from_dict
from tfdist.local_sgd import go_local
from tfdist.local_sgd.averager import NOT_YET

pytestmark = pytest.mark.usefixtures("two_cpus", "jobs_path")
PERIOD, STEPS = 4, 16
QUALITY_STEPS = choice.QUALITY["steps"]


def auto():
    """auto deciding after 4 steps, keeping its first choice (no trial of another)."""
    return AutoCompression(probe_steps=4, probe_seconds=0, min_gain=1.0)


@pytest.fixture
def fixed_link(monkeypatch):
    """A fixed link measurement (1 Gbit/s, 0.1 ms): auto's first choice is the same in
    every run (it is timed on the in-process link otherwise)."""
    monkeypatch.setattr(LinkTimer, "time",
                        lambda self: (cost_model.Link(1e9, 1e-4), 0.0))


@pytest.fixture
def verdict(monkeypatch):
    """verdict(going) forces `go_local.goes_local`'s answer; returns the calls it got."""
    calls = []

    def force(going):
        def goes_local(local, synchronous, min_gain=0.05):
            calls.append((local, synchronous, min_gain))
            return going

        monkeypatch.setattr(go_local, "goes_local", goes_local)
        return calls

    return force


def every_replica(strategy, model):
    from tfdist.step.variables import underlying

    return [[v.numpy() for v in strategy.experimental_local_results(underlying(w))]
            for w in model.trainable_variables]


def fit(strategy, **local_sgd):
    from test_local_sgd import fit as fit_steps

    callback = tfdist.callbacks.LocalSGD(**local_sgd)
    with strategy.scope():
        optimizer = keras.optimizers.Adam(0.01)
    model, _ = fit_steps(strategy, [callback], steps=STEPS, optimizer=optimizer)
    return model, callback.averager


def assert_same_everywhere(strategy, model, reference):
    for mine, theirs in zip(every_replica(strategy, model), every_replica(strategy, reference)):
        for replica, (a, b) in enumerate(zip(mine, theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"replica {replica}")


# --- the prediction --------------------------------------------------------------------

def test_a_local_step_costs_its_compute_and_what_the_overlap_does_not_hide():
    # 4 fragments of 0.2 s each per period of 32 steps of 0.1 s compute
    compute = 0.1 * go_local.LOCAL_OVERHEAD  # the synchronisations' work beside the steps
    assert go_local.local_step_seconds(0.1, 0.8, 32) == pytest.approx(compute + 0.8 / 32)
    assert go_local.local_step_seconds(0.1, 0.8, 32, fragments=4, overlap_steps=1) == \
        pytest.approx(compute + 4 * (0.2 - 0.1) / 32)
    assert go_local.local_step_seconds(0.1, 0.8, 32, fragments=4, overlap_steps=2) == \
        pytest.approx(compute)


def test_going_local_weighs_its_one_time_cost_over_what_is_left_of_the_run():
    """Synchronous steps of 0.1 s needing 1.5x none's steps, against local steps of 0.05 s
    after a switch of 4 s: per step of none's, the local phase is predicted 0.05 x 1.36
    against 0.15 — but over 30 planned steps (20 of none's) the switch is not repaid."""
    local_steps = go_local.LOCAL_STEPS
    rates = go_local.seconds_to_target(0.05, 0.1, 1.5)
    assert rates == pytest.approx((0.05 * local_steps, 0.15))
    assert go_local.goes_local(*rates)
    long = go_local.seconds_to_target(0.05, 0.1, 1.5, remaining=3000, switch=4.0)
    assert long == pytest.approx((4.0 + 2000 * local_steps * 0.05, 300.0))
    assert go_local.goes_local(*long)
    short = go_local.seconds_to_target(0.05, 0.1, 1.5, remaining=30, switch=4.0)
    assert short == pytest.approx((4.0 + 20 * local_steps * 0.05, 3.0))
    assert not go_local.goes_local(*short)
    # without a switch to pay for, the run's length does not change the verdict
    for remaining in (30, 3000):
        local, synchronous = go_local.seconds_to_target(0.05, 0.1, 1.5, remaining)
        assert local / synchronous == pytest.approx(rates[0] / rates[1])
    # the margin: min_gain of what synchronous training would take
    assert go_local.goes_local(0.94, 1.0) and not go_local.goes_local(0.96, 1.0)
    assert not go_local.goes_local(1.0, 1.0, min_gain=0.0)
    assert go_local.switch_seconds(5.0) == pytest.approx(go_local.SWITCH_TRACES * 5.0)


def test_the_judgement_reads_autos_measurements_and_the_models_bytes(strategies):
    """`_judge_going_local` on auto's numbers (a 20 Mbit/s link, top-k + EF measured at
    0.1 s/step of which 0.06 compute): the local step is the compute plus the model's ring
    all-reduce every period, computed here from the parameter count."""
    import tensorflow as tf
    import types

    strategy = strategies("mirrored")
    averager = tfdist.local_sgd.ModelAverager(PERIOD, warmup_steps="auto", fragments=2)
    with strategy.scope():
        variables = [tf.Variable(tf.zeros([1000])), tf.Variable(tf.zeros([24]))]
    averager.build(strategy, variables)
    link = cost_model.Link(20e6, 1e-3)
    averager.warmup_exchange = types.SimpleNamespace(
        decisions=[{"compute_seconds": 0.06, "measured": 0.1}], kept=True, link=link,
        workers=2, choice="topk+EF", min_gain=0.05)
    averager.warmup.judge(steps_done=20)
    ring = 2 * (2 - 1) / 2 * 4 * 1024  # bytes one worker sends for 1024 floats
    sync = 8 * ring / 20e6 + 2 * (2 * (2 - 1)) * 1e-3  # 2 fragments, 2 messages each
    local = 0.06 * go_local.LOCAL_OVERHEAD + sync / PERIOD
    judged = averager.going_local[-1]
    assert judged["sync_seconds"] == pytest.approx(sync)
    assert judged["local_seconds"] == pytest.approx(local)
    assert judged["remaining_steps"] is None  # no length planned: the rates alone
    going = local * go_local.LOCAL_STEPS < 0.95 * 0.1 * choice.QUALITY["steps"]["topk+EF"]
    assert judged["local"] is going is True and averager.warmup_steps == 20
    averager.warmup.judge(steps_done=24)  # judged once per auto decision
    assert len(averager.going_local) == 1


@pytest.mark.parametrize("planned, going", [(60, False), (20000, True)])
def test_the_judgement_weighs_the_switch_over_the_steps_the_run_plans(strategies, planned,
                                                                      going):
    """The first step's trace (auto measured 5 s over a step) predicts the switch's one-time
    cost; 40 steps before the run's planned end it is not repaid, 19980 steps before it is."""
    import tensorflow as tf
    import types

    strategy = strategies("mirrored")
    averager = tfdist.local_sgd.ModelAverager(PERIOD, warmup_steps="auto")
    with strategy.scope():
        averager.build(strategy, [tf.Variable(tf.zeros([1000]))])
    averager.plan(planned)
    averager.warmup_exchange = types.SimpleNamespace(
        decisions=[{"compute_seconds": 0.06, "measured": 0.1, "trace_seconds": 5.0}],
        kept=True, link=cost_model.Link(20e6, 1e-3), workers=2, choice="topk+EF",
        min_gain=0.05)
    averager.warmup.judge(steps_done=20)
    judged = averager.going_local[-1]
    assert judged["remaining_steps"] == planned - 20
    assert judged["switch_seconds"] == pytest.approx(5.0 * go_local.SWITCH_TRACES)
    factor = choice.QUALITY["steps"]["topk+EF"]
    local = (judged["switch_seconds"] + (planned - 20) / factor * go_local.LOCAL_STEPS
             * judged["local_seconds"])
    assert judged["to_target"] == pytest.approx((local, (planned - 20) * 0.1))
    assert judged["local"] is going and (averager.warmup_steps == 20) is going


def test_local_from_the_first_step_must_win_whatever_a_step_computes():
    """`starts_local`: before any step is timed, plain local steps begin only if they beat
    the best synchronous method by min_gain at every compute time weighed. By hand: with
    one method whose exchange takes 1 s, a local step of compute c (nothing exposed) is
    predicted c x LOCAL_OVERHEAD x 0.95 against c + 1."""
    factor = go_local.LOCAL_OVERHEAD * go_local.FROM_FIRST_STEP["steps"]
    going, ratio = go_local.starts_local({"none": 1.0}, 0.0, 16, computes=(0.1, 1.0))
    assert ratio == pytest.approx(1.0 * factor / 2.0) and going
    # one compute time where the exchange is nearly free decides it: no
    going, ratio = go_local.starts_local({"none": 1.0}, 0.0, 16, computes=(0.1, 1000.0))
    assert ratio == pytest.approx(1000 * factor / 1001) and not going
    # the best synchronous method is the bar, not the first: fp16 at 0.01 s
    going, ratio = go_local.starts_local({"none": 1.0, "fp16": 0.01}, 0.0, 16,
                                         computes=(1.0,))
    fp16 = (1.0 * (1 + choice.COST_SHARE["fp16"]) + 0.01) * QUALITY_STEPS["fp16"]
    assert ratio == pytest.approx(factor / fp16) and going is (ratio < 0.95)
    # what the overlap does not hide of a synchronisation counts: 4 fragments of 0.5 s
    # each beside 2 steps of 0.1 s, every 16 steps
    going, ratio = go_local.starts_local({"none": 1.0}, 2.0, 16, fragments=4,
                                         overlap_steps=2, computes=(0.1,))
    local = 0.1 * go_local.LOCAL_OVERHEAD + 4 * (0.5 - 0.2) / 16
    assert ratio == pytest.approx(local * go_local.FROM_FIRST_STEP["steps"] / 1.1)


@pytest.mark.parametrize("outer, period, measured", [
    (None, 16, True), (None, 4, True), (None, 32, False), ("nesterov", 16, False)])
def test_only_the_measured_shape_may_begin_at_the_first_step(outer, period, measured):
    assert go_local.measured_from_first_step(outer, period) is measured


@pytest.fixture
def slow_link(monkeypatch):
    """A 1 Mbit/s link with 50 ms a message: local steps from the first step win even for
    the tests' small model."""
    monkeypatch.setattr(LinkTimer, "time",
                        lambda self: (cost_model.Link(1e6, 0.05), 0.0))


@pytest.mark.parametrize("policy", [None, "mixed_float16"])
def test_on_a_slow_link_plain_local_steps_begin_at_the_first_step(strategies, slow_link,
                                                                  policy, request, capsys):
    """No synchronous step is traced (auto never measures one) and the run trains exactly
    as local SGD without a warm-up, on every replica."""
    if policy:
        keras.mixed_precision.set_global_policy(policy)
        request.addfinalizer(lambda: keras.mixed_precision.set_global_policy("float32"))
    strategy = strategies("mirrored")
    shape = dict(period=PERIOD, fragments=2, overlap_steps=1)
    hook = AutoCompression(probe_steps=4, probe_seconds=0)  # min_gain 0.05
    model, averager = fit(strategy, warmup_steps="auto", warmup_compression=hook, **shape)
    judged = averager.going_local
    assert [(j["step"], j["first_step"], j["local"]) for j in judged] == [(0, True, True)]
    assert judged[0]["ratio"] < 0.95 and averager.warmup_steps == 0
    assert not averager.warmup_exchange.decisions  # no synchronous step measured
    said = capsys.readouterr().out
    assert said.count("tfdist local_sgd warmup_steps auto at step 0: local steps from the "
                      "first step predicted at most") == 1 and "; local steps begin" in said
    reference, fixed = fit(strategy, **shape)
    assert averager.averages == fixed.averages > 0
    assert_same_everywhere(strategy, model, reference)
    assert averager.stateful.checkpoint_state()["warmup_steps"] == 0


@pytest.mark.parametrize("link, outer", [("fixed_link", None), ("slow_link", "nesterov")])
def test_a_fast_link_or_an_outer_optimizer_waits_for_autos_measurement(strategies, link,
                                                                       outer, request, capsys):
    """On a fast link (1 Gbit/s) plain local steps do not win at every compute time: the
    first step stays synchronous, and local steps are judged again after auto's 4 steps.
    Unmeasured from the first step (DiLoCo's outer Nesterov), they are judged only then."""
    request.getfixturevalue(link)
    strategy = strategies("mirrored")
    _, averager = fit(strategy, warmup_steps="auto", warmup_compression=auto(),
                      period=PERIOD, outer=outer)
    judged = [(j["step"], j["first_step"]) for j in averager.going_local]
    assert averager.warmup_exchange.decisions[0]["step"] == 4
    said = capsys.readouterr().out.count("at step 0: local steps from the first step")
    if outer is None:
        assert judged == [(0, True), (4, False)] and said == 1
        assert averager.going_local[0]["ratio"] >= 0.95 and not averager.going_local[0]["local"]
    else:
        assert judged == [(4, False)] and said == 0


def test_the_first_steps_verdict_keeps_autos_quality_rule(strategies, slow_link, monkeypatch,
                                                          capsys):
    """Measured 2 points under none, local steps from the first step are out of auto's
    default max_quality_loss (1 point) and in with 3."""
    monkeypatch.setitem(go_local.FROM_FIRST_STEP, "points", -2.0)
    strategy = strategies("mirrored")
    for allowed, going in ((1.0, False), (3.0, True)):
        hook = AutoCompression(probe_steps=4, probe_seconds=0, max_quality_loss=allowed)
        _, averager = fit(strategy, warmup_steps="auto", warmup_compression=hook,
                          period=PERIOD)
        assert averager.going_local[0]["local"] is going
        assert (averager.warmup_steps == 0) is going
    assert "outside max_quality_loss 1.0" in capsys.readouterr().out


# --- the switch -------------------------------------------------------------------------

def test_staying_synchronous_trains_exactly_as_autos_choice(strategies, fixed_link, verdict):
    strategy = strategies("mirrored")
    calls = verdict(False)
    model, averager = fit(strategy, period=PERIOD, warmup_steps="auto",
                          warmup_compression=auto())
    assert len(calls) == 1 and averager.warmup_steps == NOT_YET
    assert [(j["step"], j["local"]) for j in averager.going_local] == [(0, False), (4, False)]
    choice = averager.warmup_exchange.choice
    reference, _ = fit(strategy, period=PERIOD, warmup_steps=STEPS,
                       warmup_compression=METHODS[choice])
    assert_same_everywhere(strategy, model, reference)
    assert averager.stateful.checkpoint_state()["warmup_steps"] is None


@pytest.mark.parametrize("policy", [None, "mixed_float16"])
def test_local_steps_begin_at_the_step_judged(strategies, fixed_link, verdict, policy, request):
    """Going local after auto's 4 measured steps trains exactly as a 4-step warm-up with
    auto's choice followed by DiLoCo (2 fragments, Nesterov): every replica's weights."""
    if policy:
        keras.mixed_precision.set_global_policy(policy)
        request.addfinalizer(lambda: keras.mixed_precision.set_global_policy("float32"))
    strategy = strategies("mirrored")
    verdict(True)
    diloco = dict(period=PERIOD, outer="nesterov", fragments=2)
    model, averager = fit(strategy, warmup_steps="auto", warmup_compression=auto(), **diloco)
    assert averager.warmup_steps == 4 and averager.going_local[0]["local"]
    choice = averager.warmup_exchange.choice
    reference, fixed = fit(strategy, warmup_steps=4, warmup_compression=METHODS[choice],
                           **diloco)
    assert averager.averages == fixed.averages > 0
    assert_same_everywhere(strategy, model, reference)
    assert averager.stateful.checkpoint_state()["warmup_steps"] == 4


def test_a_fixed_warm_up_exchanged_by_auto_measures_and_trains_as_its_choice(strategies,
                                                                               fixed_link):
    """`warmup_compression: auto` with a count of warm-up steps: auto decides after its 4
    measured steps (it is told of every step), and the run trains exactly as that warm-up
    exchanged with auto's choice, then DiLoCo; its kept choice is in the backup's state."""
    strategy = strategies("mirrored")
    diloco = dict(period=PERIOD, outer="nesterov", warmup_steps=8)
    model, averager = fit(strategy, warmup_compression=auto(), **diloco)
    auto_hook = averager.warmup_exchange
    assert auto_hook.kept and auto_hook.decisions[0]["step"] == 4 and not averager.going_local
    reference, _ = fit(strategy, warmup_compression=METHODS[auto_hook.choice], **diloco)
    assert_same_everywhere(strategy, model, reference)
    assert averager.stateful.checkpoint_state()["auto"]["choice"] == auto_hook.choice


@pytest.mark.parametrize("when", ["after auto's steps", "from the first step"])
def test_a_sigterm_after_going_local_resumes_every_replica_exactly(strategies, verdict,
                                                                    tmp_path, request, when):
    """The decision (DiLoCo local from step 4, or plain local SGD from step 0 on a slow
    link) and the replicas' own weights and Adam moments are in the backup; the resumed run
    ends where a run never interrupted ends, on every replica (mixed_float16)."""
    from test_preemption import BATCH, SignalAt, compiled, data, per_replica

    from tfdist.step.preemption import Preempted

    keras.mixed_precision.set_global_policy("mixed_float16")
    request.addfinalizer(lambda: keras.mixed_precision.set_global_policy("float32"))
    strategy = strategies("mirrored")
    first = when == "from the first step"
    request.getfixturevalue("slow_link" if first else "fixed_link")
    if not first:
        verdict(True)
    x, y = data()
    backup, averagers = str(tmp_path / "backup"), []

    def run(*callbacks):
        model = compiled(strategy, None)
        hook = AutoCompression(probe_steps=4, probe_seconds=0) if first else auto()
        local_sgd = tfdist.callbacks.LocalSGD(period=3, warmup_steps="auto",
                                              warmup_compression=hook,
                                              outer=None if first else "nesterov")
        averagers.append(local_sgd.averager)
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, shuffle=False,
                  callbacks=[*callbacks, local_sgd])
        return model, local_sgd.averager

    with pytest.raises(Preempted, match="after step 3 of epoch 1"):
        run(SignalAt(epoch=1, batch=1), tfdist.callbacks.BackupAndRestore(backup))
    decided = averagers[0].warmup_steps
    # local before the signal: after the steps auto measured, or from the first
    assert decided == 0 if first else 0 < decided < 6
    resumed, averager = run(tfdist.callbacks.BackupAndRestore(backup))
    assert averager.warmup_steps == decided and not averager.going_local  # restored
    clean, fresh = run()
    assert fresh.warmup_steps == decided
    assert not np.allclose(*per_replica(strategy, clean)[-1], atol=1e-6)  # Adam's own
    for mine, theirs in zip(per_replica(strategy, resumed), per_replica(strategy, clean)):
        for replica, (a, b) in enumerate(zip(mine, theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=f"replica {replica}")


def test_a_backup_with_an_impossible_decision_is_refused():
    from tfdist.checkpoint import CheckpointError

    averager = tfdist.local_sgd.ModelAverager(PERIOD, warmup_steps="auto")
    averager.groups = [[0]]
    good = {"averages": 0, "anchored": False, "differ": [], "in_flight": [],
            "warmup_steps": 8, "auto": None}
    averager.stateful.restore_checkpoint_state(good)
    assert averager.warmup_steps == 8
    for bad in (-1, "8", 2.5, True):
        with pytest.raises(CheckpointError, match="local SGD schedule"):
            averager.stateful.restore_checkpoint_state({**good, "warmup_steps": bad})
    with pytest.raises(CheckpointError, match="local SGD schedule"):
        averager.stateful.restore_checkpoint_state({k: v for k, v in good.items() if k != "auto"})


# --- the config ---------------------------------------------------------------------------

def local_sgd(**section):
    return config_from_dict({"strategy": "mirrored", "local_sgd": {"period": 8, **section}})


def test_warmup_steps_auto_implies_autos_warm_up():
    config = local_sgd(warmup_steps="auto")
    assert config.local_sgd.warmup_steps == "auto"
    assert config.local_sgd.warmup_compression.name == "auto"
    averager = tfdist.local_sgd.ModelAverager.from_config(config.local_sgd)
    assert isinstance(averager.warmup_exchange, AutoCompression)
    assert averager.phased and averager.warmup_steps == NOT_YET
    assert "warmup_steps='auto'" in repr(averager)
    # auto may also exchange a warm-up of a fixed count
    fixed = local_sgd(warmup_steps=16, warmup_compression="auto").local_sgd
    assert fixed.warmup_steps == 16 and fixed.warmup_compression.name == "auto"


@pytest.mark.parametrize("section, message", [
    ({"warmup_steps": "soon"}, r"warmup_steps: expected a count of steps or auto"),
    ({"warmup_steps": "AUTO"}, "expected a count of steps or auto"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"warmup_steps": "auto", "warmup_compression": {"name": "topk", "ratio": 0.01}},
     "warmup_compression.name: warmup_steps: auto decides from compression: auto"),
    ({"warmup_steps": "auto", "warmup_compression": {"name": "auto", "probe_steps": 3}},
     "warmup_compression.probe_steps: unknown key 'probe_steps'"),
    ({"warmup_steps": "auto", "warmup_compression": {"name": "auto", "ratio": 0.01}},
     "chooses the method and its options itself; remove 'ratio'"),
    ({"warmup_steps": "auto", "islands": 2},
     "auto does not yet choose the exchange between islands"),
    ({"warmup_steps": 8, "warmup_compression": "auto", "islands": 2},
     "auto does not yet choose the exchange between islands")])
def test_a_wrong_auto_warm_up_is_refused_where_it_is_written(section, message):
    with pytest.raises(ConfigError, match=message):
        local_sgd(**section)


def test_a_ratio_warm_up_inside_the_warm_up_is_refused_by_the_config_as_at_start():
    """validate and the job agree (issue 55, item 6): the averager refuses a warm-up
    exchange with phases of its own when it is built; the config refuses it where it is
    written, before any job starts."""
    section = {"warmup_steps": 10, "warmup_compression": {
        "name": "topk", "ratio": 0.1, "ratio_warmup_steps": 5}}
    with pytest.raises(ConfigError, match="warmup_compression.ratio_warmup_steps: the "
                                          "warm-up's exchange has no phases of its own"):
        local_sgd(**section)
    with pytest.raises(ValueError, match="the warm-up's exchange has no phases of its own"):
        tfdist.local_sgd.ModelAverager(4, warmup_steps=10, warmup_compression=(
            tfdist.compression.build({"name": "topk", "ratio": 0.1,
                                      "ratio_warmup_steps": 5})))
    assert local_sgd(warmup_steps=10, warmup_compression={"name": "topk", "ratio": 0.1}) \
        .local_sgd.warmup_compression.name == "topk"


def test_the_python_api_refuses_what_the_config_refuses():
    with pytest.raises(ConfigError, match="expected a count of steps or auto"):
        tfdist.local_sgd.ModelAverager(8, warmup_steps="later")
    with pytest.raises(ValueError, match="the warm-up exchanges as auto chooses"):
        tfdist.local_sgd.ModelAverager(8, warmup_steps="auto",
                                       warmup_compression=tfdist.compression.build("fp16"))
