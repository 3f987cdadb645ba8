"""`ModelAverager`'s arguments, checked as the config file's `local_sgd:` section is."""

import types

from tfdist.compression.factory import build
from tfdist.config.load import local_sgd_from_dict
from tfdist.config.yaml_source import Source


def checked_arguments(**arguments):
    """ModelAverager's arguments as a `LocalSGDConfig`, checked by the config loader's
    own checks of the `local_sgd:` section (refused exactly when a config file's would be);
    an outer optimizer or compression given as an object is checked where it is used."""
    objects = ("outer", "compression", "warmup_compression")
    section = {k: v for k, v in arguments.items() if k not in objects
               and not (k == "islands" and v is None)}
    for key in objects:
        value = arguments[key]
        if isinstance(value, (dict, types.MappingProxyType)):
            section[key] = dict(value)
        elif isinstance(value, str):
            section[key] = value
    return local_sgd_from_dict(section, source=Source.of_call("ModelAverager"))


def compression_hook(compression):
    if compression is None:
        return None
    hook = build(compression)
    if not hook.compressor.compresses:
        return None
    if getattr(hook, "start_step", 0) > 0:
        raise Source.of_call("ModelAverager").error(
            ("compression", "start_step"), "a compressed model average has no delayed start; "
            f"warm up with warmup_steps instead. Received: start_step={hook.start_step}")
    return hook
