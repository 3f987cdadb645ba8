"""Local SGD's parts on one process: the schedule, a fragment's synchronisation (through a
recording, deterministic communicator instead of real collectives), the rounds between
steps, the islands' agreement, the warm-up policy and the hooks' optional abilities.

The multi-process tests (tests/unit/local_sgd/test_islands.py, test_diloco.py, ...) check
the same parts with real collectives; these check each part's own logic against plain NumPy and the
schedule's definition, in milliseconds.
"""

import logging
import types

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.local_sgd import fragments as fragmenting
from tfdist.local_sgd.agreement import IslandAgreement, NoIslands
from tfdist.local_sgd.rounds import Rounds
from tfdist.local_sgd.schedule import Schedule
from tfdist.local_sgd.synchroniser import Anchors, FragmentSync
from tfdist.local_sgd.warmup import NOT_YET, Warmup
from tfdist.step import abilities
from tfdist.step.hooks import GradientPipeline, TrainingHook
from tfdist.step.update import Updater
from paths import DATA


class RecordingCommunicator:
    """A `Communicator` whose one other replica contributes `other(values)`: records
    every collective (its kind and shapes) and returns the mean over the two."""

    def __init__(self, record, other):
        self.record, self.other, self.num_replicas = record, other, 2

    def mean(self, tensors):
        self.record.append(("mean", [tuple(t.shape) for t in tensors]))
        return [(t + o) / 2 for t, o in zip(tensors, self.other(tensors))]

    def all_reduce(self, tensors):
        self.record.append(("sum", [tuple(t.shape) for t in tensors]))
        return [t + o for t, o in zip(tensors, self.other(tensors))]


class FakeReplicas:
    """`Replicas` on one process: bodies run eagerly, collectives are recorded."""

    many = True

    def __init__(self, other=lambda tensors: [tf.zeros_like(t) for t in tensors]):
        self.record, self.other = [], other

    def compile(self, body, counted=True):
        return body

    def communicator(self, context=None):
        return RecordingCommunicator(self.record, self.other)


def variables(*values):
    return [tf.Variable(np.asarray(v, "float32")) for v in values]


# --- the schedule ---------------------------------------------------------------------------

@pytest.mark.parametrize("period, count, overlap", [(4, 1, 0), (4, 2, 0), (6, 3, 2), (4, 2, 1)])
def test_the_schedule_starts_each_fragment_once_a_period_and_applies_it_overlap_later(
        period, count, overlap):
    schedule, started, applied = Schedule(period, count, overlap), [], []
    for local in range(1, 3 * period + 1):
        due = schedule.after_local_step(local)
        assert schedule.differ == set(range(count))  # a local step changed every fragment
        assert due.agree == (bool(due.finishing or due.starting) and not overlap)
        for fragment in due.finishing:
            schedule.finished(fragment, 0.5)
            applied.append((local, fragment))
        for fragment in due.starting:
            schedule.started(fragment, local)
            started.append((local, fragment))
    # the definition: fragment f starts at local steps l with l % period == (f+1)·period/count
    expected = [(local, f) for local in range(1, 3 * period + 1) for f in range(count)
                if local % period == (f + 1) * period // count % period]
    assert started == expected and schedule.averages == len(expected)
    if overlap:
        assert applied == [(l + overlap, f) for l, f in expected if l + overlap <= 3 * period]
    else:
        assert not applied and not schedule.in_flight


def test_before_a_read_every_exchange_in_flight_is_applied_then_every_fragment_synchronised():
    schedule = Schedule(4, 2, overlap_steps=1)
    for local in range(1, 5):
        due = schedule.after_local_step(local)
        for fragment in due.finishing:
            schedule.finished(fragment, 0.5)
        for fragment in due.starting:
            schedule.started(fragment, local)
    assert schedule.in_flight == {1: 5}  # fragment 0 went at step 2, was applied at 3
    due = schedule.before_read()
    assert due.agree and due.finishing == (1,) and due.starting == (0, 1)
    schedule.finished(1, mix=0.0)  # applied whole: that fragment is in sync
    assert schedule.differ == {0} and not schedule.in_sync and not schedule.in_flight


def test_a_schedules_state_round_trips_and_damaged_ones_are_refused():
    schedule = Schedule(4, 2, overlap_steps=1)
    schedule.averages, schedule.anchored = 3, True
    schedule.differ, schedule.in_flight = {0, 1}, {1: 9}
    state = schedule.state()
    fresh = Schedule(4, 2, overlap_steps=1)
    assert fresh.valid(state)
    fresh.restore(state)
    assert fresh.state() == state == {"averages": 3, "anchored": True, "differ": [0, 1],
                                      "in_flight": [[1, 9]]}
    for bad in ({"differ": [2]}, {"differ": [True]}, {"in_flight": [[0]]}, {"averages": -1},
                {"anchored": 1}, {"in_flight": [[0, 2**62]]}, {"averages": "3"}):
        assert not fresh.valid({**state, **bad}), bad


# --- a fragment's synchronisation ----------------------------------------------------------

def test_plain_averaging_sends_the_weights_once_and_takes_the_mean():
    replicas = FakeReplicas(other=lambda tensors: [tf.fill(t.shape, 3.0) for t in tensors])
    weights = variables([1.0, 2.0], [[5.0]])
    sync = FragmentSync([0, 1], replicas, agreement=NoIslands())
    sync.compiled("sync", weights)(tf.constant(0, tf.int64))
    np.testing.assert_allclose(weights[0].numpy(), [2.0, 2.5])
    np.testing.assert_allclose(weights[1].numpy(), [[4.0]])
    assert replicas.record == [("mean", [(2,), (1, 1)])]  # one collective for the fragment


def test_a_fragment_reads_only_its_own_weights_and_averages_the_state_beside_them():
    replicas = FakeReplicas(other=lambda tensors: [t * 0 + 10.0 for t in tensors])
    weights, state = variables([0.0], [4.0]), variables([2.0])
    FragmentSync([1], replicas, agreement=NoIslands()).compiled("sync", weights, state, True)(
        tf.constant(0, tf.int64))
    assert weights[0].numpy() == 0.0 and weights[1].numpy() == 7.0 and state[0].numpy() == 6.0
    assert replicas.record == [("mean", [(1,), (1,)])]


def test_diloco_moves_the_anchors_by_nesterov_on_the_mean_change_as_numpy_does():
    """The pseudo-gradient is anchor - mean weight (Douillard et al. 2023); Keras' SGD with
    Nesterov: m = μm - ηg, w += μm - ηg."""
    anchor, mine, theirs = np.array([1.0, -1.0]), np.array([1.5, -0.5]), np.array([2.5, -2.0])
    weights = variables(mine)
    anchors = Anchors(weights, "nesterov")
    anchors.tensors[0].assign(anchor)
    replicas = FakeReplicas(other=lambda tensors: [tf.constant(theirs - anchor, tf.float32)])
    sync = FragmentSync([0], replicas, anchors=anchors, agreement=NoIslands())
    sync.compiled("sync", weights, last=True)(tf.constant(0, tf.int64))
    change = ((mine - anchor) + (theirs - anchor)) / 2
    momentum = 0.7 * change
    expected = anchor + 0.9 * momentum + 0.7 * change
    np.testing.assert_allclose(weights[0].numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(anchors.tensors[0].numpy(), expected, rtol=1e-6)
    assert int(anchors.optimizer.iterations.numpy()) == 1  # the period's last fragment counts


def test_an_overlapped_exchange_sends_then_mixes_the_local_steps_in_when_applied():
    """Streaming DiLoCo's α: the weights become mix x the local ones (trained on beside the
    exchange) + (1 - mix) x the synchronised ones."""
    replicas = FakeReplicas(other=lambda tensors: [t * 0 + 4.0 for t in tensors])
    weights = variables([2.0])
    sync = FragmentSync([0], replicas, agreement=NoIslands(), overlapped=True,
                        shapes=[weights[0].shape])
    sync.compiled("send", weights)()
    sync.compiled("exchange", weights)(tf.constant(0, tf.int64))
    weights[0].assign([10.0])  # a local step beside the exchange
    sync.compiled("apply", weights)(tf.constant(0.25))
    assert weights[0].numpy() == pytest.approx(0.25 * 10.0 + 0.75 * 3.0)
    assert sync.sent[0].numpy() == 2.0 and sync.received[0].numpy() == 3.0
    sync.compiled("apply", weights)(tf.constant(0.0))  # mix 0: the synchronised ones
    assert weights[0].numpy() == 3.0


def test_one_compiled_function_per_kind_model_and_arguments():
    replicas = FakeReplicas()
    weights = variables([1.0])
    sync = FragmentSync([0], replicas, agreement=NoIslands())
    for _ in range(3):
        sync.compiled("sync", weights, last=True)
    sync.compiled("sync", weights, last=False)
    sync.compiled("sync", variables([1.0]), last=True)  # another model
    assert len(sync.functions) == 3


# --- the rounds between steps ---------------------------------------------------------------

def test_the_rounds_run_the_schedules_collectives_and_a_read_makes_one_model():
    period, count = 4, 2
    weights = variables([1.0], [2.0], [3.0])
    model = types.SimpleNamespace(trainable_variables=weights)
    replicas = FakeReplicas()  # the other replica holds zeros: each mean halves
    groups = fragmenting.split([1, 1, 1], count)
    schedule = Schedule(period, count)
    syncs = [FragmentSync(g, replicas, agreement=NoIslands()) for g in groups]
    rounds = Rounds(Warmup(2, None, None), schedule, syncs, NoIslands())
    for steps_done in range(1, 2 + 2 * period + 1):
        rounds.after_step(model, steps_done)
        rounds.after_step(model, steps_done)  # a micro-batch's call again: nothing more
    due = [(local, f) for local in range(1, 2 * period + 1)
           for f in fragmenting.due(local, count, period)]
    assert [len(r[1]) for r in replicas.record] == [len(groups[f]) for _, f in due]
    halvings = [sum(f == fragment for _, f in due) for fragment in range(count)]
    for fragment, group in enumerate(groups):
        for i in group:
            assert weights[i].numpy() == pytest.approx((i + 1.0) / 2 ** halvings[fragment])
    # after the last local step, the fragments that synchronised then agree
    assert schedule.differ == set(range(count)) - set(fragmenting.due(2 * period, count, period))
    rounds.after_step(model, 2 + 2 * period + 1)
    assert not schedule.in_sync
    rounds.average(model)
    assert schedule.in_sync and [len(r[1]) for r in replicas.record[-2:]] == [2, 1]


def test_the_rounds_refuse_a_model_they_were_not_built_for():
    syncs = [FragmentSync([0, 1], FakeReplicas(), agreement=NoIslands())]
    rounds = Rounds(Warmup(0, None, None), Schedule(2, 1), syncs, NoIslands())
    model = types.SimpleNamespace(trainable_variables=variables([1.0]))
    with pytest.raises(ValueError, match="the model has 1 trainable weights but the averager "
                                         "was built for 2; use one averager per model"):
        rounds.after_step(model, 2)


# --- the islands' agreement -----------------------------------------------------------------

def test_without_islands_nothing_is_agreed_and_the_steps_count_as_they_are():
    agreement = NoIslands()
    assert agreement.steps(17, 3) == 17 and not agreement.decides_alone
    assert agreement.agree("anywhere") is None and agreement.state() == {}


def test_islands_count_attempted_steps_and_refuse_as_one_line_on_every_worker(strategies):
    agreement = IslandAgreement(strategies("mirrored"), islands=None)
    for _ in range(5):
        agreement.count_attempt()
    assert agreement.steps(2, 3) == 2 and agreement.steps(9, 3) == 3 + 5
    assert agreement.state() == {"attempts": 5} and agreement.valid({"attempts": 5})
    assert not any(agreement.valid({"attempts": bad}) for bad in (-1, True, "5", 2.0, None))
    with pytest.raises(tf.errors.InvalidArgumentError, match="2 local step") as error:
        agreement._take(tf.constant(2.0), tf.zeros([0]), "the synchronisation after step 8")
    assert "every worker stops here" in str(error.value) and "\n" not in error.value.message
    agreement._take(tf.constant(0.0), tf.zeros([0]), "here")  # nothing refused: no error


# --- the warm-up policy ---------------------------------------------------------------------

def shape(**overrides):
    return types.SimpleNamespace(**{
        "period": 8, "fragments": 1, "overlap_steps": 0, "outer": None, "islands": None,
        "planned_steps": None, "strategy": tf.distribute.get_strategy(), **overrides})


def test_a_fixed_warm_up_is_synchronous_then_local_and_says_nothing(capsys):
    warmup = Warmup(3, None, shape())
    assert [warmup.phase(s) for s in range(5)] == [True, True, True, False, False]
    for step in range(5):
        warmup.prepare(step)
        warmup.after_step(None, step + 1)
    assert warmup.state() == {} and capsys.readouterr().out == ""


def auto_exchange(**overrides):
    from tfdist.compression import AutoCompression

    exchange = AutoCompression(probe_steps=4, probe_seconds=0)
    for key, value in overrides.items():
        setattr(exchange, key, value)
    return exchange


def test_warmup_auto_logs_its_judgement_and_a_user_can_silence_it(capsys, monkeypatch):
    """The judgement goes to the `tfdist` logger, one line on the standard output; set to
    WARNING it says nothing and the judgement is the same."""
    from tfdist.compression import cost_model
    from tfdist.local_sgd import go_local

    monkeypatch.setattr(go_local, "sync_seconds", lambda shape, link, workers: 0.01)
    said, logger = [], logging.getLogger("tfdist")
    previous = logger.level
    try:
        for level in (logging.INFO, logging.WARNING):
            logger.setLevel(level)
            exchange = auto_exchange()
            warmup = Warmup("auto", exchange, shape())
            warmup.exchange = types.SimpleNamespace(
                decisions=[{"compute_seconds": 0.06, "measured": 0.1}], kept=True,
                link=cost_model.Link(20e6, 1e-3), workers=2, choice="topk+EF", min_gain=0.05)
            assert warmup.steps == NOT_YET
            warmup.judge(20)
            said.append(capsys.readouterr().out)
            assert warmup.steps == 20 and [j["local"] for j in warmup.going_local] == [True]
    finally:
        logger.setLevel(previous)  # setLevel, not the attribute: logging caches the check
    assert said[0].startswith("tfdist local_sgd warmup_steps auto at step 20: local steps "
                              "predicted") and said[0].count("\n") == 1
    assert said[1] == ""


def test_warmup_auto_restores_its_decision_and_refuses_an_impossible_one():
    warmup = Warmup("auto", auto_exchange(), shape())
    state = warmup.state()
    assert set(state) == {"warmup_steps", "auto"} and state["warmup_steps"] is None
    assert warmup.valid({**state, "warmup_steps": 12})
    assert not any(warmup.valid({**state, "warmup_steps": bad}) for bad in (-1, "8", 2.5))
    warmup.restore({**state, "warmup_steps": 12})
    assert warmup.steps == 12 and warmup.phase(11) is not False and warmup.phase(12) is False


# --- the hooks' optional abilities ----------------------------------------------------------

class Plain(TrainingHook):
    def __init__(self):
        self.reads = 0

    def before_read(self, model):
        self.reads += 1


class Skipping:
    def __init__(self, trains):
        self.trains, self.skips = trains, 0

    def trains_next(self):
        return self.trains

    def skipped(self):
        self.skips += 1


def test_the_pipeline_finds_abilities_on_hooks_and_on_their_parts():
    plain, composed, part = Plain(), Plain(), Skipping(trains=False)
    composed.abilities = (part,)
    pipeline = GradientPipeline([plain, composed])
    assert abilities.found(pipeline.hooks, abilities.SkipsCalls) == [part]
    assert not pipeline.trains_next() and pipeline.couples_workers()
    pipeline.skipped()
    assert part.skips == 1
    assert type(pipeline.updater()) is Updater  # no hook changes the update: Keras' own
    # no hook prepares backups: each makes one model instead
    pipeline.before_backup(None, 3)
    assert plain.reads == composed.reads == 1
    assert not any(hasattr(TrainingHook, name) for name in (
        "couples_workers", "trains_next", "skipped", "before_backup", "updater",
        "saveables", "replica_state", "checkpoint_state"))


# --- a backup of the averager before it was taken apart ------------------------------------

def test_a_backup_written_before_local_sgd_was_taken_apart_resumes_as_if_never_interrupted(
        strategies, tmp_path):
    """tests/data/local_sgd_backup_v0: Streaming DiLoCo (2 fragments, an exchange in flight,
    top-k + EF, Nesterov outer, Adam inner) saved after step 6 of 12 by tfdist before this
    layout (`tests/local_sgd_backup.py`), beside every replica's weights and slots of a run
    that tfdist never interrupted. Resumed now, every replica ends with those."""
    import shutil

    import local_sgd_backup

    source = DATA / "local_sgd_backup_v0"
    shutil.copytree(source / "backup", tmp_path / "backup")
    strategy = strategies("mirrored")
    model, start = local_sgd_backup.train(strategy, str(tmp_path / "backup"))
    assert start == local_sgd_backup.SAVED_AFTER  # resumed, not trained afresh
    averager = tfdist.core.pipeline_of(model.optimizer).exchange_owner
    assert averager.averages > 2 and averager.in_sync
    expected, got = np.load(source / "expected.npz"), local_sgd_backup.replicas(strategy, model)
    assert sorted(got) == sorted(expected.files) and len(got) == 4 + 8  # weights, Adam's
    for name in expected.files:
        assert got[name].shape[0] == 2  # every replica
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
