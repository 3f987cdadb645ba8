"""Whether a value is JSON that reads back as itself — what a store writes as a
checkpoint's metadata or a run's record. Pure Python."""

import json
import math

from tfdist.checkpoint.errors import CheckpointError


def json_text(value):
    """`value` as JSON that reads back as itself (`check_json`), or a CheckpointError
    naming where it is not (the store raises it before anything is written)."""
    try:
        check_json("a backup's metadata", value)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return json.dumps(value, allow_nan=False)


def check_json(what, value, depth=0, at=""):
    """Raises ValueError unless `value` is JSON that reads back as itself: finite numbers,
    strings, booleans, None, lists, and dicts with string keys, at most 64 deep. `at`: where
    in the value it is (said in the error)."""
    where = f" (at {at})" if at else ""
    if depth > 64:
        raise ValueError(f"{what} must be JSON values at most 64 deep")
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be JSON values (finite numbers, strings, lists, "
                             f"dicts): {value!r} is not a JSON number{where}")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json(what, item, depth + 1, f"{at}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{what} must be JSON values (finite numbers, strings, "
                                 f"lists, dicts with string keys): the key {key!r} is a "
                                 f"{type(key).__name__}{where}")
            check_json(what, item, depth + 1, f"{at}[{key!r}]")
        return
    raise ValueError(f"{what} must be JSON values (finite numbers, strings, lists, dicts): "
                     f"{type(value).__name__} is not{where}")
