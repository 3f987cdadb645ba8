"""The methods the benchmark report compares, and the UNet job that runs each.

A method is plain tf.distribute (no tfdist in the process), tfdist in pass-through mode
(`none`), a gradient compressor, or local SGD. `job_config` writes the config file of the
UNet example for it; `command` is what every task runs.
"""

import json
import sys

from .netns import ROOT, TRAIN

PLAIN = ROOT / "benchmarks" / "plain_tf_distribute.py"
EF = {"error_feedback": True, "min_size": 0}
FROZEN = {"freeze_variance": True}
NESTEROV = {"name": "nesterov", "learning_rate": 0.7, "momentum": 0.9}  # DiLoCo's outer step
# One intra-op thread per task: each worker gets one core of this 2-core machine, as each
# emulated host would. TensorFlow's default pools (one thread per core, in every process)
# oversubscribe the cores and made single runs differ by 10-40%.
ONE_CORE = ["env", "TF_NUM_INTRAOP_THREADS=1", "TF_NUM_INTEROP_THREADS=2"]
METHODS = {  # name -> config sections (None: plain tf.distribute)
    "plain tf.distribute": None,
    "none": {},
    "fp16": {"compression": {"name": "fp16"}},
    "bf16": {"compression": {"name": "bf16"}},
    "int8": {"compression": {"name": "int8"}},
    "qsgd": {"compression": {"name": "qsgd", "levels": 15}},
    "sign+EF": {"compression": {"name": "sign", **EF}},
    "sign": {"compression": {"name": "sign", "min_size": 0}},
    "topk+EF": {"compression": {"name": "topk", "ratio": 0.01, **EF}},
    "topk": {"compression": {"name": "topk", "ratio": 0.01, "min_size": 0}},
    "randomk+EF": {"compression": {"name": "randomk", "ratio": 0.01, **EF}},
    "powersgd+EF": {"compression": {"name": "powersgd", "rank": 4, **EF}},
    # issue 16: DGC's corrections (Lin et al. 2018), EF21, a warm-up, and auto
    "topk+DGC": {"compression": {"name": "topk", "ratio": 0.01, **EF, "momentum_correction": 0.9,
                                 "ratio_warmup_steps": 120, "ratio_warmup_start": 0.25}},
    "topk+EF21": {"compression": {"name": "topk", "ratio": 0.01, "error_feedback": "ef21",
                                  "min_size": 0}},
    "sign+EF21": {"compression": {"name": "sign", "error_feedback": "ef21", "min_size": 0}},
    # Zheng et al. 2019's blockwise scales (per-tensor is Karimireddy et al.'s scaled sign)
    "sign+EF blocks": {"compression": {"name": "sign", "block_size": 64, **EF}},
    "sign+EF21 blocks": {"compression": {"name": "sign", "block_size": 64,
                                         "error_feedback": "ef21", "min_size": 0}},
    "sign+EF, small tensors float32": {"compression": {"name": "sign", "error_feedback": True}},
    "topk+EF, ratio warm-up": {"compression": {"name": "topk", "ratio": 0.01, **EF,
                                               "ratio_warmup_steps": 120}},
    "topk+EF from 80": {"compression": {"name": "topk", "ratio": 0.01, **EF, "start_step": 80}},
    "sign+EF from 80": {"compression": {"name": "sign", **EF, "start_step": 80}},
    # 1-bit Adam's second moment, frozen after the warm-up (Tang et al. 2021)
    "topk+EF from 80, frozen v": {"compression": {"name": "topk", "ratio": 0.01, **EF,
                                                  "start_step": 80, **FROZEN}},
    "sign+EF from 80, frozen v": {"compression": {"name": "sign", **EF, "start_step": 80,
                                                  **FROZEN}},
    "powersgd+EF from 80, frozen v": {"compression": {"name": "powersgd", "rank": 4, **EF,
                                                      "start_step": 80, **FROZEN}},
    "auto": {"compression": "auto"},
    "local SGD 2": {"local_sgd": {"period": 2}},
    "local SGD 8": {"local_sgd": {"period": 8}},
    "local SGD 32": {"local_sgd": {"period": 32}},
    # issue 17: DiLoCo (Douillard et al. 2023) and Streaming DiLoCo (2025), after one epoch
    # of synchronous steps, against plain local SGD at the same period and warm-up
    "local SGD 32, warm-up 80": {"local_sgd": {"period": 32, "warmup_steps": 80}},
    "DiLoCo 32": {"local_sgd": {"period": 32, "warmup_steps": 80, "outer": NESTEROV}},
    **{name: {"local_sgd": {"period": period, "warmup_steps": 80, **outer}}
       for period in (8, 16, 64, 128)  # diloco_periods.py: where the outer step starts to matter
       for name, outer in ((f"local SGD {period}, warm-up 80", {}),
                           (f"DiLoCo {period}", {"outer": NESTEROV}))},
    "Streaming DiLoCo 32": {"local_sgd": {
        "period": 32, "warmup_steps": 80, "outer": NESTEROV, "fragments": 4,
        "overlap_steps": 2, "overlap_mix": 0.5, "compression": {"name": "int4", "min_size": 0}}},
}
# issue 33 item 4: Adam then sees each worker's own uncompressed gradients, and error-fed
# top-k compresses what the workers' models moved (the outer pseudo-gradient), from step 0:
# SparseLoCo's recipe (Sarfi et al. 2025) without its 2-bit values
for period, ratio in ((4, 0.1), (8, 0.1)):
    METHODS[f"SparseLoCo {period}, top {ratio:.0%}"] = {"local_sgd": {
        "period": period, "warmup_steps": 0, "outer": NESTEROV,
        "compression": {"name": "topk", "ratio": ratio, **EF}}}
# Streaming DiLoCo's synchronous warm-up is most of its time to accuracy on a slow link
METHODS["Streaming DiLoCo 32, warm-up 20"] = {"local_sgd": {
    **METHODS["Streaming DiLoCo 32"]["local_sgd"], "warmup_steps": 20}}
# issue 33 item 4: less lag for fewer bytes saved. Error feedback's lag grows with what the
# residual holds back; a richer approximation holds back less. PowerSGD at rank 6 (Vogels et
# al. 2019 find accuracy rising with rank) and top-k at 4% both still send >= 10x fewer bytes
# than none on the UNet (10.6x and 12.5x by their payloads)
METHODS["powersgd+EF rank 6"] = {"compression": {"name": "powersgd", "rank": 6, **EF}}
METHODS["topk+EF 4%"] = {"compression": {"name": "topk", "ratio": 0.04, **EF}}
# issue 33 item 2: the DiLoCo family among auto's candidates (tfdist/local_sgd/go_local.py):
# synchronous as auto chooses until local steps are predicted to pay, then Streaming DiLoCo
METHODS["auto, then Streaming DiLoCo 32"] = {"local_sgd": {
    **METHODS["Streaming DiLoCo 32"]["local_sgd"], "warmup_steps": "auto"}}
# issue 33's limit: plain local SGD (no outer optimizer) from the first step, streamed as
# Streaming DiLoCo is (4 fragments, int4, beside 2 steps): on the UNet it reached mean IoU
# 0.85 in 0.95x synchronous fp16's steps, where DiLoCo 32 after a warm-up needed 1.36x
METHODS["Streaming local SGD 16"] = {"local_sgd": {
    **{k: v for k, v in METHODS["Streaming DiLoCo 32"]["local_sgd"].items() if k != "outer"},
    "period": 16, "warmup_steps": 0}}
# ... and Streaming DiLoCo 32 itself from the first step (no synchronous warm-up): what
# `warmup_steps: auto` could begin at step 0 with DiLoCo's shape (diloco_first_step.py)
METHODS["Streaming DiLoCo 32 from step 0"] = {"local_sgd": {
    **METHODS["Streaming DiLoCo 32"]["local_sgd"], "warmup_steps": 0}}
# ... and as auto's candidate: where plain local steps are predicted to win whatever a step
# computes, `warmup_steps: auto` begins them at the first step (go_local.starts_local)
METHODS["auto, then Streaming local SGD 16"] = {"local_sgd": {
    **METHODS["Streaming local SGD 16"]["local_sgd"], "warmup_steps": "auto"}}


def job_config(method, workers, warmup=0, hosts=None, port=23456):
    """The config text of `method` on `workers` local workers (or on `hosts`, one worker
    each at a fixed port: the emulated-network runs)."""
    cluster = (f"worker: {json.dumps([f'{h}:{port}' for h in hosts])}" if hosts
               else f"worker: {workers}")
    lines = [f"cluster: {{{cluster}}}",
             "strategy: {name: multi_worker_mirrored, communication: ring}",
             f"train: {{image_size: 32, batch_size: {16 * workers}, loop: ctl, "
             "validation_steps: 2}"]  # 16 per worker
    for section, value in (METHODS[method] or {}).items():
        if section == "local_sgd":
            value = {"warmup_steps": warmup, **value}  # a method's own warm-up wins
        lines.append(f"{section}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def command(method, config, output_dir, steps, epochs=1, seed=0, workers=2, train=None):
    """The command every task runs for `method` (steps per epoch x epochs), with the UNet
    example's script or `train` (another example taking the same flags)."""
    if METHODS[method] is None:
        return [*ONE_CORE, sys.executable, str(PLAIN), "--output_dir", str(output_dir),
                "--steps", str(steps * epochs), "--seed", str(seed),
                "--batch_size", str(16 * workers)]
    section = (METHODS[method] or {}).get("compression")
    delayed = isinstance(section, dict) and "start_step" in section
    return [*ONE_CORE, sys.executable, str(train or TRAIN), "--config", str(config), "--output_dir", str(output_dir),
            "--epochs", str(epochs), "--steps_per_epoch", str(steps), "--seed", str(seed),
            *([] if delayed else ["--start_step", "0"])]  # compress from step 0 unless delayed
