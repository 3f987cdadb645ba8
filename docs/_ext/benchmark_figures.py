"""The numbers the guides quote, read from the files the benchmarks write
(benchmarks/results/), never typed by hand: a page writes ``{{ step_clock_ms }}`` (MyST's
substitutions) and the build puts the figure in; a name no file gives is an error."""

import json
import pathlib

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _comparison(data, key):
    return next(c for c in data["comparisons"] if c["key"] == key)


#: name -> (results file, figure from its JSON, as text).
FIGURES = {
    "step_clock_ms": ("step_times_cost.json",
                      lambda d: f"{_comparison(d, 'clock')['ms']:.2f} ms"),
    "step_clock_ms_half": ("step_times_cost.json",
                           lambda d: f"{_comparison(d, 'clock')['ms_half']:.2f} ms"),
    "step_clock_base_ms": ("step_times_cost.json",
                           lambda d: f"{_comparison(d, 'clock')['base_ms']:.0f} ms"),
    "step_clock_percent": ("step_times_cost.json",
                           lambda d: f"{(_comparison(d, 'clock')['ratio'] - 1) * 100:+.1f}%"),
    "step_callbacks_ms": ("step_times_cost.json",
                          lambda d: f"{_comparison(d, 'callbacks')['ms']:.2f} ms"),
    "step_callbacks_percent": ("step_times_cost.json", lambda d: (
        f"{(_comparison(d, 'callbacks')['ratio'] - 1) * 100:+.1f}%")),
    "step_times_cost_block": ("step_times_cost.json", lambda d: str(d["block_steps"])),
    "step_times_cost_date": ("step_times_cost.json", lambda d: d["measured"]),
}


def figures():
    """{name: text} of every figure of `FIGURES`, read now."""
    read = {}
    for name, (file, figure) in FIGURES.items():
        if file not in read:
            read[file] = json.loads((RESULTS / file).read_text())
        yield name, figure(read[file])
