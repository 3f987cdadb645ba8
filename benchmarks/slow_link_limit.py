"""Issue 33's limit, measured the same day: the slow link's best time to accuracy against
the free link's best, with local SGD from the first step among the methods, and auto
against it.

    sudo python benchmarks/slow_link_limit.py [--rates 1000 100 20] [--seeds 0 1 2] [--resume]

auto_local.py's runs, with Streaming local SGD 16 (plain local SGD from the first step, no
outer optimizer, streamed as Streaming DiLoCo is: 4 fragments, int4, beside 2 steps) among
the fixed methods: fp16 (the best with the link free), top-k + EF (the best gradient
compressor at 20 Mbit/s); and auto with local steps among its candidates, as "auto, then
Streaming DiLoCo 32" (judged after auto's steps) and "auto, then Streaming local SGD 16"
(judged before the first step too). Writes results/slow_link_limit.{json,md,png}.
"""

import auto_local

NAME = "slow_link_limit"
LOCAL = "Streaming local SGD 16"
FIXED = ["fp16", "topk+EF", LOCAL]
METHODS = [*FIXED, auto_local.AUTO, f"auto, then {LOCAL}"]
ABOUT = {
    "title": "The slow link against the free link, local SGD from the first step included",
    "about": ("The UNet on 2 workers as 2 hosts on a `tc tbf` link (time_to_accuracy.py's "
              "runs, 12 epochs of 40 steps): fp16, top-k + EF, Streaming local SGD 16 (plain "
              "local SGD from the first step, 4 fragments, int4, each exchange beside 2 "
              "steps), and `warmup_steps: auto` with Streaming DiLoCo 32 (judged after auto's "
              "steps) and with Streaming local SGD 16 (judged before the first step too), all "
              "measured the same day. Issue 33's limit: the 20 Mbit/s best within 1.25x the "
              "1 Gbit/s best; item 2: auto within 5% of the best fixed method on every link."),
}


if __name__ == "__main__":
    auto_local.main(NAME, METHODS, FIXED, rates=(1000, 100, 20), about=ABOUT)
