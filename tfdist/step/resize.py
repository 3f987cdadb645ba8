"""Each replica's exchange state carried onto another number of replicas (a job resized
after a lost worker, or a backup restored on another cluster): pure NumPy, one rule per
variable.

- ``sum``: what the replicas hold together is kept — error feedback's residual, the
  gradient no exchange has sent yet (Seide et al. 2014; Karimireddy et al. 2019), and
  DGC's momentum correction (Lin et al. 2018). The first replicas keep their rows; the
  rows of replicas gone are added evenly to them; replicas added start at zero.
- ``shared``: every replica holds the same value (PowerSGD's Q, Vogels et al. 2019;
  DiLoCo's anchors and what an overlapped exchange received): every replica gets the
  first row.
- ``mean``: replicas that train apart between synchronisations (local SGD, Stich 2019;
  DiLoCo, Douillard et al. 2023): every replica gets the rows' mean — the weights (and
  slots) a synchronisation would give, so nothing a lost replica trained since the last
  one is lost, and DiLoCo's next pseudo-gradient (anchors - mean) still holds it.
- ``afresh``: nothing carries over (the variable keeps what the model's weights gave it).
"""

import numpy as np

RULES = ("sum", "shared", "mean", "afresh")


def resized_rows(rows, replicas, rule):
    """`rows` ([old replicas, *shape], one row per replica) for `replicas` replicas by
    `rule`, or None when the rule is ``afresh``.

    Raises:
        ValueError: an unknown rule, no rows, or fewer than one replica.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of [{', '.join(RULES)}]. Received: {rule!r}")
    rows = np.asarray(rows)
    if rows.ndim < 1 or rows.shape[0] < 1 or int(replicas) < 1:
        raise ValueError("rows needs one row per replica and replicas at least 1. "
                         f"Received: rows of shape {rows.shape}, replicas={replicas!r}")
    replicas = int(replicas)
    if rule == "afresh":
        return None
    if rule == "shared":
        return np.repeat(rows[:1], replicas, axis=0)
    if rule == "mean":
        mean = rows.astype(np.float64).mean(axis=0).astype(rows.dtype)
        return np.repeat(mean[None], replicas, axis=0)
    kept = min(replicas, rows.shape[0])
    out = np.zeros((replicas, *rows.shape[1:]), rows.dtype)
    gone = rows[kept:].astype(np.float64).sum(axis=0) / kept
    out[:kept] = (rows[:kept].astype(np.float64) + gone).astype(rows.dtype)
    return out


def rule_of_state(key):
    """The rule of a compressor's state variable by its key (`init_state`'s names)."""
    if key in ("residual", "velocity"):
        return "sum"
    if key.startswith("powersgd_q"):
        return "shared"
    return "afresh"  # EF21's estimates: each tied to its worker's own gradients


def describe(rules, old, new):
    """The one line a resized restore prints: what each rule did, counted."""
    counts = {rule: rules.count(rule) for rule in RULES if rule in rules}
    said = {"sum": "{} folded into the survivors (their sum kept: error feedback's "
                   "residuals, DGC's momentum)",
            "shared": "{} kept on every replica (PowerSGD's Q, DiLoCo's anchors)",
            "mean": "{} set to their mean on every replica (local SGD's weights and slots, "
                    "as a synchronisation would)",
            "afresh": "{} started afresh (EF21's estimates, an exchange's state of another "
                      "shape)"}
    parts = [said[rule].format(f"{n} variable{'s' if n > 1 else ''}")
             for rule, n in counts.items()]
    return (f"the exchange state of {old} replicas carried onto {new}: " + "; ".join(parts))
