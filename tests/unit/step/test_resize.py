"""Each replica's exchange state onto another number of replicas (issue 60, item 2): the
rules against NumPy, and a backup written by 4 (or 2) replicas restored by 3 — error
feedback's residuals folded with their sum kept, PowerSGD's Q kept on every replica."""

import json
import subprocess
import sys
import types
import zipfile

import numpy as np
import pytest

from tfdist.step.resize import describe, resized_rows, rule_of_state
from paths import JOBS

JOB = JOBS / "resize_backup_job.py"
ROWS = np.arange(24, dtype="float32").reshape(4, 2, 3) - 7.5  # 4 replicas' (2, 3) state


@pytest.mark.parametrize("replicas", [1, 3, 4, 6])
def test_sum_keeps_the_total_and_the_survivors_rows(replicas):
    got = resized_rows(ROWS, replicas, "sum")
    assert got.shape == (replicas, 2, 3) and got.dtype == ROWS.dtype
    np.testing.assert_allclose(got.sum(axis=0), ROWS.sum(axis=0), rtol=1e-6)
    kept = min(replicas, 4)
    spread = ROWS[kept:].sum(axis=0) / kept  # the replicas gone, evenly over the survivors
    np.testing.assert_allclose(got[:kept], ROWS[:kept] + spread, rtol=1e-6)
    np.testing.assert_array_equal(got[kept:], 0)  # replicas added start with nothing unsent


def test_shared_gives_every_replica_the_first_row_and_afresh_gives_none():
    shared = np.repeat(ROWS[:1], 4, axis=0)
    np.testing.assert_array_equal(resized_rows(shared, 3, "shared"), shared[:3])
    np.testing.assert_array_equal(resized_rows(shared[:2], 5, "shared"),
                                  np.repeat(ROWS[:1], 5, axis=0))
    assert resized_rows(ROWS, 3, "afresh") is None


@pytest.mark.parametrize("replicas", [1, 3, 6])
def test_mean_gives_every_replica_what_a_synchronisation_would(replicas):
    """Replicas that train apart (local SGD, DiLoCo) restart from their average: the
    model a synchronisation of the old replicas would have given, on every new one."""
    got = resized_rows(ROWS, replicas, "mean")
    assert got.shape == (replicas, 2, 3) and got.dtype == ROWS.dtype
    for row in got:
        np.testing.assert_allclose(row, np.mean(ROWS.astype(np.float64), axis=0), rtol=1e-6)


@pytest.mark.parametrize("rows, replicas, rule, says", [
    (ROWS, 3, "median", "rule must be one of [sum, shared, mean, afresh]"),
    (np.zeros((0, 2)), 3, "sum", "one row per replica"),
    (np.float32(1.0), 3, "sum", "one row per replica"),
    (ROWS, 0, "sum", "replicas at least 1")])
def test_a_bad_rule_or_shape_is_refused_in_one_line(rows, replicas, rule, says):
    with pytest.raises(ValueError) as raised:
        resized_rows(rows, replicas, rule)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_each_compressor_state_has_its_rule_and_the_line_counts_them():
    assert [rule_of_state(k) for k in ("residual", "velocity", "powersgd_q0", "ef21_estimate",
                                       "ef21_sum")] == ["sum", "sum", "shared", "afresh",
                                                        "afresh"]
    line = describe(["sum", "shared", "shared", "afresh"], 4, 3)
    assert line.startswith("the exchange state of 4 replicas carried onto 3: 1 variable folded")
    assert "2 variables kept on every replica" in line and "1 variable started afresh" in line


def test_a_state_file_whose_arrays_disagree_on_the_replicas_is_another_layout(tmp_path):
    """Arrays of different replica counts, or another number of variables, are another
    layout; an array of another shape alone (an exchange between islands, sharded by the
    island's size) is marked as not fitting, the others still carried."""
    from tfdist.keras.replica_state_file import layout_of

    state = [types.SimpleNamespace(shape=(2, 3), dtype="float32"),
             types.SimpleNamespace(shape=(5,), dtype="float32")]
    good, bad, shard = tmp_path / "good.npz", tmp_path / "bad.npz", tmp_path / "shard.npz"
    np.savez(good, np.zeros((4, 2, 3)), np.zeros((4, 5)))
    np.savez(bad, np.zeros((4, 2, 3)), np.zeros((3, 5)))
    np.savez(shard, np.zeros((4, 2, 3)), np.zeros((4, 3)))
    assert layout_of(good, state) == (4, [True, True])
    assert layout_of(bad, state) == (None, None)
    assert layout_of(shard, state) == (4, [True, False])
    assert layout_of(shard, state[1:]) == (None, None)  # another number of variables
    assert layout_of(good, state[:1]) == (None, None)
    with zipfile.ZipFile(tmp_path / "scalar.npz", "w") as archive:
        archive.writestr("arr_0.npy", b"not an array")
        archive.writestr("arr_1.npy", b"")
    with pytest.raises(ValueError):
        layout_of(tmp_path / "scalar.npz", state)


def run_job(*args):
    run = subprocess.run([sys.executable, str(JOB), *args], capture_output=True, text=True,
                         timeout=300, env={"TF_CPP_MIN_LOG_LEVEL": "2",
                                           **{k: v for k, v in __import__("os").environ.items()
                                              if k != "TF_CONFIG"}})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    (line,) = [l for l in run.stdout.splitlines() if l.startswith("STATE ")]
    return json.loads(line[len("STATE "):]), run.stdout


@pytest.mark.parametrize("compression, before, after", [("topk", 4, 3), ("powersgd", 2, 3),
                                                        ("topk", 3, 3), ("diloco", 4, 2)])
def test_a_backup_of_one_number_of_replicas_restores_onto_another(tmp_path, compression,
                                                                   before, after):
    """Every replica's state gathered after the restore is the saved rows resized by their
    rule, computed here in NumPy; the same layout restores bit for bit, silently. DiLoCo
    saved between two synchronisations: each replica's weights and momentum restart from
    their mean, the anchors (the outer state, everyone's) are kept — not the zeros they
    are built with, which would make the next outer step take the whole model for a
    pseudo-gradient."""
    directory = str(tmp_path / "backup")
    saved, _ = run_job("save", "--replicas", str(before), "--dir", directory,
                       "--compression", compression)
    restored, out = run_job("restore", "--replicas", str(after), "--dir", directory,
                            "--compression", compression)
    assert saved["rules"] == restored["rules"] and "sum" in saved["rules"]
    if compression == "powersgd":
        assert "shared" in saved["rules"]
    if compression == "diloco":
        assert {"mean", "shared", "sum"} <= set(saved["rules"])
    for name, rule, old, new in zip(saved["names"], saved["rules"], saved["rows"],
                                    restored["rows"]):
        old, new = np.array(old, "float32"), np.array(new, "float32")
        assert old.shape[0] == before and new.shape[0] == after
        if "rows_since_sync" not in name:  # counted since the epoch's end synchronised
            assert np.abs(old).sum() > 0, "nothing to carry: the test would prove nothing"
        np.testing.assert_allclose(new, resized_rows(old, after, rule), rtol=1e-6, atol=1e-7)
    if before == after:
        assert "carried onto" not in out and "afresh" not in out
    else:
        assert f"the exchange state of {before} replicas carried onto {after}" in out


def test_a_forged_header_claiming_many_replicas_is_not_read(tmp_path):
    """A replica_state.npz whose header declares 100,000 replicas but holds one row's bytes
    (or is deflated) is another layout: nothing is allocated for what it declares."""
    from tfdist.keras.replica_state_file import bound, layout_of, read_arrays

    state = [types.SimpleNamespace(shape=(2, 3), dtype="float32")]
    forged = tmp_path / "forged.npz"
    with zipfile.ZipFile(forged, "w") as archive, archive.open("arr_0.npy", "w") as member:
        np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False,
                                                      "shape": (100_000, 2, 3)})
        member.write(np.zeros((1, 2, 3), "float32").tobytes())
    old, _ = layout_of(forged, state)
    assert old == 100_000
    assert read_arrays(forged, [((old, 2, 3), np.dtype("float32"))], bound(state, old)) is None
    deflated = tmp_path / "deflated.npz"
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as archive, \
            archive.open("arr_0.npy", "w") as member:
        np.lib.format.write_array(member, np.zeros((4, 2, 3), "float32"))
    assert read_arrays(deflated, [((4, 2, 3), np.dtype("float32"))], bound(state, 4)) is None
