"""One rank's client process for the soak and chaos runs.

    /usr/bin/python3 tests/reliability/worker.py --rank 0 --world 4 \\
        --target unix:/tmp/x/rank0.sock --steps 400 --log /tmp/x/worker.0.jsonl

Step t reduces the rank's whole tensor set (workload.py) over one
ReduceStream with codec CODECS[t % len] under the job "<job>-<codec>", then
checks every tensor of the result against the true mean (which it derives
from every rank's data, workload.Workload), also the tensors that did
reduce in a stream that failed, and appends one JSON line to --log:

  {"step", "codec", "ok", "seconds", "digest", "wrong": [..]}      success
  {"step", "codec", "ok": false, "code", "message", "seconds",    failure
   "partial_checked", "wrong": [..]}

For top-k it also exports its daemon's state after the step and appends the
identity's numbers (workload.topk_terms) to --log as "topk" (8 per tensor).

With --batch the stream declares batches as the DDP hook does by default
(consecutive tensors, at most 64 per batch), so that their rounds travel as
one collective per batch.

With --clock DIR the steps are paced by a driver (chaos.py): the worker
writes DIR/ready.<rank> once it can take part in a step, waits for
DIR/go.<t> (a JSON object: {"disconnect": [ranks]} tells this rank to close
its channel while the step is in flight and reconnect), runs step t, then
writes DIR/done.<t>.<rank>. Without --clock it runs --steps
steps back to back (soak.py), writes its progress to --progress, and
stops early before the step that --stop_file names once it exists.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import cluster  # noqa: E402
import workload  # noqa: E402
from gradcomp.client import Client  # noqa: E402
from gradcomp.errors import GradcompError  # noqa: E402


class Runner:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.codecs = args.codecs.split(",")
        self.work = workload.Workload(args.seed, args.world, args.every)
        self.client = Client(args.target, timeout=args.rpc_timeout)
        self.log = open(args.log, "a", buffering=1)

    def _batches(self, grads: dict) -> dict[str, list[str]] | None:
        if not self.args.batch:
            return None
        names = list(grads)
        groups = [names[i:i + 64] for i in range(0, len(names), 64)]
        return {f"b{i}": g for i, g in enumerate(groups) if len(g) > 1}

    def _reduce(self, grads: dict, step: int, codec: str, batches: dict | None,
                disconnect_after: float | None):
        job = f"{self.args.job}-{codec}"
        if disconnect_after is None:
            return self.client.reduce_many(grads, step=step, codec=codec,
                                           params=workload.CODECS[codec], job=job,
                                           batches=batches)
        # Close the channel while the stream is in flight, as a trainer that
        # drops its connection would; the call must end with an error.
        outcome: dict = {}

        def call() -> None:
            try:
                outcome["result"] = self.client.reduce_many(
                    grads, step=step, codec=codec, params=workload.CODECS[codec], job=job,
                    batches=batches)
            except BaseException as error:  # handed to the caller below
                outcome["error"] = error

        thread = threading.Thread(target=call)
        thread.start()
        thread.join(disconnect_after)
        self.client.close()
        thread.join()
        self.client = Client(self.args.target, timeout=self.args.rpc_timeout)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def step(self, step: int, disconnect_after: float | None = None) -> dict:
        codec = self.codecs[step % len(self.codecs)]
        grads = self.work.gradients(self.args.rank, step)
        record: dict = {"step": step, "codec": codec}
        t0 = time.monotonic()
        try:
            batches = self._batches(grads)
            record["batched"] = sum(len(m) for m in (batches or {}).values())
            results = self._reduce(grads, step, codec, batches, disconnect_after)
        except GradcompError as error:
            record.update(ok=False, code=error.code.name, message=str(error)[:600],
                          seconds=round(time.monotonic() - t0, 3))
            # The tensors of a failed stream that did reduce must be right too.
            record["partial_checked"] = len(error.completed)
            record["wrong"] = [] if codec == "topk" or not error.completed else self._check(
                error.completed, self.work.all_gradients(step))
            return record
        except ValueError as error:
            # grpc raises ValueError when a call is made on a closed channel.
            record.update(ok=False, code="CLIENT_CLOSED", message=str(error)[:600],
                          seconds=round(time.monotonic() - t0, 3))
            return record
        record["seconds"] = round(time.monotonic() - t0, 3)
        all_grads = self.work.all_gradients(step)
        outs = {name: out for name, (out, _) in results.items()}
        record.update(ok=True, digest=workload.digest(outs), wrong=[])
        used = {name: stats.codec for name, (_, stats) in results.items()}
        record["codecs_used"] = sorted(set(used.values()))
        if codec == "topk":
            state = workload.parse_state(self.client.export_state(f"{self.args.job}-topk"))
            terms = []
            for name in self.work.names:
                if used[name] == "topk":
                    residual = state.get(name, {}).get("dgc.v")
                    terms.append(workload.topk_terms(self.work, outs[name], name,
                                                     all_grads, residual))
                else:
                    # Sent dense (e.g. policy warm-up): checked as none, and
                    # the identity's residual is unchanged.
                    bad = workload.check_result(used[name], {}, outs[name], all_grads, name)
                    if bad:
                        record["wrong"].append(bad)
                    terms.append(None)
            record["topk"] = terms
        else:
            record["wrong"] = self._check(results, all_grads)
        return record

    @staticmethod
    def _check(results: dict, all_grads: list[dict]) -> list[str]:
        """What is wrong in {name: (average, stats)} (workload.check_result)."""
        wrong = []
        for name, (out, stats) in results.items():
            bad = workload.check_result(stats.codec, workload.CODECS.get(stats.codec, {}),
                                        out, all_grads, name)
            if bad:
                wrong.append(bad)
        return wrong

    def write(self, record: dict) -> None:
        self.log.write(json.dumps(record) + "\n")


def run_free(runner: Runner, args: argparse.Namespace) -> None:
    progress = pathlib.Path(args.progress) if args.progress else None
    stop = pathlib.Path(args.stop_file) if args.stop_file else None
    for step in range(args.start_step, args.steps):
        # The driver's time limit: every rank stops before the same step.
        if stop is not None and stop.exists() and step >= int(stop.read_text()):
            break
        runner.write(runner.step(step))
        if progress is not None and (step % 10 == 9 or step == args.steps - 1):
            cluster.write_atomic(progress, str(step + 1))


def run_clocked(runner: Runner, args: argparse.Namespace) -> None:
    clock = pathlib.Path(args.clock)
    # Imports done, workload built and the daemon answering: the driver may
    # start a step this rank must take part in (a restarted worker needs
    # seconds to get here on a busy machine).
    runner.client.info()
    cluster.write_atomic(clock / f"ready.{args.rank}", str(args.start_step))
    step = args.start_step
    while True:
        go = clock / f"go.{step}"
        while not go.exists():
            if (clock / "stop").exists():
                return
            time.sleep(0.005)
        order = json.loads(go.read_text())
        disconnect = order.get("disconnect_after", {}).get(str(args.rank))
        record = runner.step(step, disconnect)
        if disconnect is not None:
            record["disconnected"] = True
        runner.write(record)
        cluster.write_atomic(clock / f"done.{step}.{args.rank}", json.dumps(
            {"ok": record["ok"], "wrong": len(record.get("wrong", [])),
             "seconds": record["seconds"]}))
        step += 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--target", required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--every", type=int, default=8,
                   help="every n-th parameter of the scaled set (workload.py)")
    p.add_argument("--job", default="soak")
    p.add_argument("--codecs", default="none,fp16,qsgd,topk")
    p.add_argument("--batch", action="store_true",
                   help="declare batches as the DDP hook does by default")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--start_step", type=int, default=0)
    p.add_argument("--stop_file", help="once it exists, stop before the step it names (soak)")
    p.add_argument("--rpc_timeout", type=float, default=60.0)
    p.add_argument("--log", required=True)
    p.add_argument("--progress", help="file that gets the number of steps done")
    p.add_argument("--clock", help="directory of go/done files (chaos)")
    args = p.parse_args()
    for codec in args.codecs.split(","):
        if codec not in workload.CODECS:
            p.error(f"--codecs: unknown {codec!r}, expected some of {sorted(workload.CODECS)}")
    runner = Runner(args)
    if args.clock:
        run_clocked(runner, args)
    else:
        run_free(runner, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
