"""Streaming DiLoCo 32 from the first step (no synchronous warm-up) against plain local SGD
from the first step and synchronous fp16: the steps each needs to validation mean IoU
0.85, which `warmup_steps: auto` needs to begin DiLoCo's shape at step 0
(`tfdist.local_sgd.go_local.FROM_FIRST_STEP`).

    sudo python benchmarks/diloco_first_step.py [--rates 1000] [--seeds 0 1 2] [--resume]

auto_local.py's runs (time_to_accuracy.py's schedule, the UNet on 2 workers as 2 hosts on
a `tc tbf` link). Writes results/diloco_first_step.{json,md,png}.
"""

import auto_local

NAME = "diloco_first_step"
FIXED = ["fp16", "Streaming local SGD 16", "Streaming DiLoCo 32 from step 0"]
ABOUT = {
    "title": "Streaming DiLoCo 32 from the first step",
    "about": ("The UNet on 2 workers as 2 hosts on a `tc tbf` link (time_to_accuracy.py's "
              "runs, 12 epochs of 40 steps): Streaming DiLoCo 32 (Nesterov 0.7/0.9, 4 "
              "fragments, int4, each exchange beside 2 steps) with no synchronous warm-up, "
              "against plain local SGD from the first step streamed the same way (period 16) "
              "and synchronous fp16: the steps to mean IoU 0.85 from which "
              "`warmup_steps: auto` may begin DiLoCo's shape at the first step."),
}


if __name__ == "__main__":
    auto_local.main(NAME, FIXED, FIXED, rates=(1000,), about=ABOUT)
