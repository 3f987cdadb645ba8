"""A stand-in for a training script in tests of the elastic launcher (no TensorFlow): it
"trains" `--steps` steps of 0.1 s and appends "<members> <index> <resize signal named in
its environment> <the places it names>" to <out>/starts.log when it starts.

    --kill INDEX:STEP   the task of that index SIGKILLs itself at STEP, once (<out>/killed
                        marks it)
    --stop INDEX:STEP   the task of that index SIGSTOPs itself at STEP, once
    --preempt STEP      every task exits 143 at STEP (saved at an agreed step), once
    --crash             every task exits with code 3 at step 2 (a bug, not a lost machine)
    --on-resize stop    the resize signal: exit 143 at the next step (as tfdist's watch)
    --on-resize ignore  take no notice (a script without a backup: it trains on)
    --on-resize default no handler: the signal kills the process
"""

import argparse
import json
import os
import signal
import sys
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--kill")
    p.add_argument("--stop")
    p.add_argument("--preempt", type=int)
    p.add_argument("--crash", action="store_true")
    p.add_argument("--on-resize", default="stop", choices=["stop", "ignore", "default"])
    args = p.parse_args()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    cluster = tf_config["cluster"]
    members = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    index = tf_config["task"]["index"]
    asked = []
    if args.on_resize != "default":
        signal.signal(signal.SIGUSR1, lambda *_: asked.append(1))
    with open(os.path.join(args.out, "starts.log"), "a") as f:
        f.write(f"{members} {index} {os.environ.get('TFDIST_RESIZE_SIGNAL')} "
                f"{os.environ.get('TFDIST_ELASTIC_PLACES')}\n")
    marker = os.path.join(args.out, "killed")
    kill = tuple(int(v) for v in args.kill.split(":")) if args.kill else None
    stop = tuple(int(v) for v in args.stop.split(":")) if args.stop else None
    for step in range(args.steps):
        time.sleep(0.1)
        print(f"step {step}", flush=True)  # progress: not hung
        if asked and args.on_resize == "stop":
            return 143
        if args.crash and step == 2:
            return 3
        preempted = os.path.join(args.out, f"preempted-{index}")
        if args.preempt == step and not os.path.exists(preempted):
            open(preempted, "w").close()
            return 143
        if kill == (index, step) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if stop == (index, step) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
    return 0


if __name__ == "__main__":
    sys.exit(main())
