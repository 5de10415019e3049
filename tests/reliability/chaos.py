"""Chaos: 4 gradcompd and 4 clients run steps while daemons are killed and
restarted and clients are killed or disconnected at random; every failure
must reach its client as an error, no result may be wrong, and the run must
finish with a set of clean steps after the last fault.

    bazel build //service:gradcompd && client/python/generate_protos.sh
    PYTHONPATH=client/python /usr/bin/python3 tests/reliability/chaos.py \\
        --steps 300 --faults 40 --seed 11 [--json out.json] [--keep_logs DIR]

The driver paces the steps (worker.py --clock): it writes go.<t>, and every
worker reduces its tensor set (workload.py) for step t with codec
none, fp16 or qsgd in turn and checks each tensor of the result against the
true mean (workload.check_result); results of ranks that succeed must also
be bit-identical. `--faults` steps, drawn with `--seed`, get one fault each,
injected a random 0-100 ms into the step:

  daemon_kill        SIGKILL a daemon, start it again at once on the same
                     addresses (it redials its peers; their streams break);
  client_kill        SIGKILL a worker, start a new one from the next step;
  client_disconnect  a worker closes its channel 0-30 ms into its stream
                     and reconnects.

A step on which a worker neither returns nor fails within
--hang_seconds (default 2 x collective timeout + 15 s) is a hang and fails
the run. After the last fault the driver waits until every daemon has its
3 peers up again and every worker is ready (the recovery time; a worker
killed at the last fault is a new process), then runs --final_steps steps that
must succeed on every rank. Prints and returns: steps attempted and
completed, faults by kind, failures reported (by status code), wrong
results, the slowest failure, the recovery time. Exits 1 on a wrong result,
a hang, a daemon that died on its own, or a failed final step.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import cluster as cluster_lib  # noqa: E402
import results as results_lib  # noqa: E402
from gradcomp import testing  # noqa: E402

WORLD = 4
KINDS = ("daemon_kill", "client_kill", "client_disconnect")


class Hang(Exception):
    pass


class Chaos:
    def __init__(self, args: argparse.Namespace, work: pathlib.Path,
                 cluster: cluster_lib.Cluster):
        self.args = args
        self.work = work
        self.cluster = cluster
        self.clock = work / "clock"
        self.clock.mkdir()
        self.workers: list[subprocess.Popen | None] = [None] * WORLD
        self.rng = random.Random(args.seed)
        self.faults: list[dict] = []
        self.interrupted = 0  # steps a killed worker never finished

    def start_worker(self, rank: int, first_step: int) -> None:
        (self.clock / f"ready.{rank}").unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=str(REPO / "client/python"))
        with open(self.work / f"worker.{rank}.out", "ab") as out:
            self.workers[rank] = subprocess.Popen(
                ["/usr/bin/python3", str(HERE / "worker.py"), f"--rank={rank}",
                 f"--world={WORLD}", f"--target={self.cluster.target(rank)}",
                 f"--seed={self.args.seed}", f"--every={self.args.every}",
                 f"--codecs={self.args.codecs}", "--job=chaos",
                 f"--start_step={first_step}", f"--clock={self.clock}",
                 f"--rpc_timeout={self.args.hang_seconds + 30}",
                 f"--log={self.work / f'worker.{rank}.jsonl'}",
                 *(["--batch"] if self.args.batch else [])],
                env=env, stdout=out, stderr=subprocess.STDOUT)

    def schedule(self) -> dict[int, tuple[str, int]]:
        """{step: (kind, rank)}: every kind in turn, steps and ranks at random."""
        steps = self.rng.sample(range(2, self.args.steps), self.args.faults)
        kinds = [KINDS[i % len(KINDS)] for i in range(self.args.faults)]
        self.rng.shuffle(kinds)
        return {s: (k, self.rng.randrange(WORLD)) for s, k in zip(sorted(steps), kinds)}

    def run_step(self, step: int, fault: tuple[str, int] | None) -> dict[int, dict]:
        kind, rank = fault if fault else (None, None)
        order: dict = {}
        if kind == "client_disconnect":
            order["disconnect_after"] = {str(rank): self.rng.uniform(0.0, 0.03)}
        cluster_lib.write_atomic(self.clock / f"go.{step}", json.dumps(order))
        killed_worker = None
        if kind in ("daemon_kill", "client_kill"):
            time.sleep(self.rng.uniform(0.0, 0.1))
            if kind == "daemon_kill":
                self.cluster.kill(rank)
                self.cluster.start(rank)
            else:
                self.workers[rank].kill()
                self.workers[rank].wait()
                killed_worker = rank
        if kind:
            self.faults.append({"step": step, "kind": kind, "rank": rank})
        done = self.wait_done(step, skip=killed_worker)
        if killed_worker is not None:
            if killed_worker not in done:
                self.interrupted += 1
            self.start_worker(killed_worker, step + 1)
        return done

    def wait_workers_ready(self, seconds: float) -> None:
        """Until every worker has written its ready file (worker.py)."""
        deadline = time.monotonic() + seconds
        while not all((self.clock / f"ready.{r}").exists() for r in range(WORLD)):
            exited = [f"worker {r} exited {w.returncode}"
                      for r, w in enumerate(self.workers) if w.poll() is not None]
            if exited:
                raise RuntimeError("before the final steps: " + "; ".join(exited))
            if time.monotonic() > deadline:
                raise Hang(f"workers not ready within {seconds} s")
            time.sleep(0.05)

    def wait_done(self, step: int, skip: int | None) -> dict[int, dict]:
        deadline = time.monotonic() + self.args.hang_seconds
        done: dict[int, dict] = {}
        while True:
            for r in range(WORLD):
                path = self.clock / f"done.{step}.{r}"
                if r not in done and path.exists():
                    done[r] = json.loads(path.read_text())
            if all(r in done or r == skip for r in range(WORLD)):
                return done
            crashed = self.cluster.exited() + [
                f"worker {r} exited {w.returncode}" for r, w in enumerate(self.workers)
                if r != skip and w.poll() is not None]
            if crashed:
                raise RuntimeError(f"step {step}: " + "; ".join(crashed))
            if time.monotonic() > deadline:
                waiting = [r for r in range(WORLD) if r not in done and r != skip]
                raise Hang(f"step {step}: ranks {waiting} neither returned nor failed "
                           f"within {self.args.hang_seconds} s")
            time.sleep(0.005)

    def run(self) -> dict:
        self.cluster.wait_peers_up(120)
        for rank in range(WORLD):
            self.start_worker(rank, 0)
        plan = self.schedule()
        t0 = time.monotonic()
        step = 0
        for step in range(self.args.steps):
            if time.monotonic() - t0 > self.args.time_limit:
                break
            done = self.run_step(step, plan.get(step))
            fault = plan.get(step)
            if fault or not all(d["ok"] for d in done.values()):
                print(f"step {step}: " + " ".join(
                    f"{r}:{'ok' if d['ok'] else 'ERR'}" for r, d in sorted(done.items()))
                    + (f"  <- {fault[0]} rank {fault[1]}" if fault else ""), flush=True)
        # Recovery: every daemon has its peers back and every worker (one
        # restarted after the last fault too) is ready, then clean steps.
        t_recover = time.monotonic()
        self.cluster.wait_peers_up(120)
        self.wait_workers_ready(120)
        recovery = time.monotonic() - t_recover
        final_ok = 0
        first_final = step + 1
        for step in range(first_final, first_final + self.args.final_steps):
            done = self.run_step(step, None)
            final_ok += all(d["ok"] and d["wrong"] == 0 for d in done.values())
        cluster_lib.write_atomic(self.clock / "stop", "")
        for w in self.workers:
            try:
                w.wait(timeout=10)
            except subprocess.TimeoutExpired:
                testing.stop_process(w)
        logs = [results_lib.read_log(self.work / f"worker.{r}.jsonl") for r in range(WORLD)]
        return self.summary(logs, first_final, recovery, final_ok, time.monotonic() - t0)

    def summary(self, logs: list[list[dict]], first_final: int, recovery: float,
                final_ok: int, elapsed: float) -> dict:
        records = [r for records in logs for r in records]
        failures = [r for r in records if not r["ok"]]
        by_step: dict[int, list[dict]] = collections.defaultdict(list)
        for r in records:
            by_step[r["step"]].append(r)
        steps = first_final + self.args.final_steps
        wrong = results_lib.wrong_results(logs)

        def all_ok(step: int) -> bool:
            return len(by_step[step]) == WORLD and all(r["ok"] for r in by_step[step])

        # Per fault kind: steps from the fault's step to the first step that
        # succeeds on every rank again (1: only the fault's own step failed).
        to_clean: dict[str, list[int]] = collections.defaultdict(list)
        for fault in self.faults:
            clean = fault["step"]
            while clean < steps and not all_ok(clean):
                clean += 1
            to_clean[fault["kind"]].append(clean - fault["step"])
        return {
            "steps_attempted": steps,
            "steps_completed_all_ranks": sum(1 for s in range(steps) if all_ok(s)),
            "rank_steps_attempted": len(records) + self.interrupted,
            "rank_steps_ok": len(records) - len(failures),
            "tensors_checked_in_failed_steps": sum(r.get("partial_checked", 0)
                                                   for r in failures),
            # --batch: tensors declared in batches in the rank steps that
            # succeeded.
            "batched_tensors_ok": sum(r.get("batched", 0) for r in records if r["ok"]),
            "rank_steps_interrupted_by_client_kill": self.interrupted,
            "faults": dict(collections.Counter(f["kind"] for f in self.faults)),
            "fault_list": self.faults,
            "failed_steps_per_fault": {k: {"mean": round(sum(v) / len(v), 2), "max": max(v)}
                                       for k, v in to_clean.items()},
            "failures_reported": len(failures),
            "failures_by_code": dict(collections.Counter(r["code"] for r in failures)),
            "slowest_failure_seconds": max((r["seconds"] for r in failures), default=0.0),
            "slowest_success_seconds": max((r["seconds"] for r in records if r["ok"]),
                                           default=0.0),
            "wrong_results": len(wrong), "first_wrong": wrong[:5],
            "hangs": 0,  # a hang ends the run (Hang) before any summary
            "recovery_seconds_after_last_fault": round(recovery, 2),
            "final_steps": self.args.final_steps, "final_steps_ok": final_ok,
            "seconds": round(elapsed, 1),
            "example_failures": sorted({r["message"][:300] for r in failures})[:6],
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="steps with faults among them")
    p.add_argument("--faults", type=int, default=40)
    p.add_argument("--final_steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--every", type=int, default=8,
                   help="every n-th parameter of the scaled ResNet-50 set (workload.py)")
    p.add_argument("--codecs", default="none,fp16,qsgd")
    p.add_argument("--batch", action="store_true",
                   help="workers declare batches as the DDP hook does by default")
    p.add_argument("--collective_timeout", type=float, default=3.0, help="seconds")
    p.add_argument("--hang_seconds", type=float, default=None,
                   help="a step longer than this is a hang (default 2 x timeout + 15)")
    p.add_argument("--time_limit", type=float, default=1800,
                   help="seconds for the fault phase; then recovery and final steps")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--keep_logs", help="copy logs here")
    args = p.parse_args()
    # SIGTERM unwinds like an exception, so that the daemons and clients
    # this run started are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.hang_seconds is None:
        args.hang_seconds = 2 * args.collective_timeout + 15
    if "topk" in args.codecs.split(","):
        # Its check needs every rank's residual before each step, which a
        # killed daemon loses without the driver knowing when.
        p.error("--codecs: topk is checked by the soak only (soak.py)")
    if not 0 < args.faults <= args.steps - 2:
        p.error(f"--faults must be in [1, steps - 2 = {args.steps - 2}]")
    work = pathlib.Path(tempfile.mkdtemp(prefix="gradcomp-chaos-"))
    summary = None
    error = None
    try:
        with cluster_lib.Cluster(work, WORLD, f"{args.collective_timeout}s") as cluster:
            chaos = Chaos(args, work, cluster)
            try:
                summary = chaos.run()
            except (Hang, RuntimeError, TimeoutError) as e:
                error = f"{type(e).__name__}: {e}\n{cluster.logs_tail()}"
            finally:
                for w in chaos.workers:
                    if w is not None:
                        testing.stop_process(w)
    finally:
        if args.keep_logs:
            shutil.copytree(work, args.keep_logs, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("gradcompd", "*.sock", "clock"))
        shutil.rmtree(work, ignore_errors=True)
    if error:
        print(f"chaos: FAIL\n{error}")
        return 1
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=1))
    s = summary
    print(f"\nchaos: {s['steps_attempted']} steps x {WORLD} ranks in {s['seconds']} s, "
          f"collective timeout {args.collective_timeout} s")
    print(f"  faults injected: {s['faults']}")
    print(f"  steps failing per fault, from its step to the next step ok on every rank: "
          f"{s['failed_steps_per_fault']}")
    print(f"  steps completed on all ranks: {s['steps_completed_all_ranks']} of "
          f"{s['steps_attempted']}; rank-steps ok {s['rank_steps_ok']} of "
          f"{s['rank_steps_attempted']} ({s['rank_steps_interrupted_by_client_kill']} "
          f"interrupted by a client kill)")
    print(f"  failures reported to clients: {s['failures_reported']} "
          f"{s['failures_by_code']}; slowest failure {s['slowest_failure_seconds']} s, "
          f"slowest success {s['slowest_success_seconds']} s; hangs: 0")
    for message in s["example_failures"]:
        print(f"    e.g. {message}")
    print(f"  wrong results: {s['wrong_results']} (also checked: "
          f"{s['tensors_checked_in_failed_steps']} tensors that reduced in failed steps)")
    for line in s["first_wrong"]:
        print(f"    {line}")
    print(f"  recovery after the last fault: {s['recovery_seconds_after_last_fault']} s; "
          f"final steps ok on every rank: {s['final_steps_ok']} of {s['final_steps']}")
    ok = s["wrong_results"] == 0 and s["final_steps_ok"] == s["final_steps"]
    print("chaos: PASS" if ok else "chaos: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
