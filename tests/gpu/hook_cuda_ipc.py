#!/usr/bin/env python3
"""gradcomp.torch.hook on CUDA gradients, through CUDA IPC, on one GPU.

W = 2 DDP processes (Gloo) share the GPU; each has its own gradcompd
(loopback peers). A small MLP on Fashion-MNIST-shaped random data, its
buckets kept small so that there are several, trains STEPS steps per run,
each run from the same seeds:

  none/cuda_ipc, fp16/cuda_ipc   cuda_ipc=True: buckets copied on the device
                                 into the hook's registered CUDA buffer
  none/host, fp16/host           cuda_ipc=False: buckets copied to host memory
  fp16/fallback                  cuda_ipc=None against daemons started with
                                 CUDA_VISIBLE_DEVICES="" (no usable GPU)
  timing/cuda_ipc, timing/host   a 5.8M-parameter MLP, fp16: step times
                                 (reported, not asserted)

It fails (exit 1) unless: both ranks end with identical parameters in every
run; the CUDA IPC runs equal their host twins (fp32 tolerance, and fp16's
for fp16) and changed the model; the CUDA IPC runs used the CUDA path
(HookState.cuda_transport) and the daemons hold their regions as kind
"cuda" (SharedMemoryStatus) with no warning; each GPU daemon's
gradcomp_reduce_backend_total{backend="cuda"} equals the reduces its
rank's hook sent by CUDA IPC (where the daemon exports that metric); the
fallback run warned once,
saying the daemon has no usable CUDA device, and equals fp16/host exactly.
Exit 77 without a CUDA GPU.

    GRADCOMPD=.../gradcompd PYTHONPATH=client/python python3 tests/gpu/hook_cuda_ipc.py
(`tools/gpu_test run` sets both and runs it.)
"""
import os
import pathlib
import statistics
import sys
import tempfile
import time
import traceback
import urllib.request
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "client" / "python"))
# Deterministic cuBLAS, so that two runs differ only by the hook's path.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

W = 2
STEPS = 4
TIMED_STEPS = 6  # the first 2 are warm-up
RUNS = [  # label, codec, cuda_ipc, daemons
    ("none/cuda_ipc", "none", True, "gpu"),
    ("none/host", "none", False, "gpu"),
    ("fp16/cuda_ipc", "fp16", True, "gpu"),
    ("fp16/host", "fp16", False, "gpu"),
    ("fp16/fallback", "fp16", None, "nogpu"),
    ("timing/cuda_ipc", "fp16", True, "gpu"),
    ("timing/host", "fp16", False, "gpu"),
]


def _model(label: str) -> nn.Module:
    torch.manual_seed(0)
    hidden = 2048 if label.startswith("timing/") else 128
    return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def _batch(rank: int, step: int) -> tuple:
    g = torch.Generator().manual_seed(100 * rank + step)
    return (torch.randn(64, 1, 28, 28, generator=g).cuda(),
            torch.randint(0, 10, (64,), generator=g).cuda())


def _worker(rank: int, port: int, targets: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      GLOO_SOCKET_IFNAME="lo")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=W)
    results = {}
    for label, codec, cuda_ipc, daemons in RUNS:
        try:
            results[label] = _run(rank, label, codec, cuda_ipc, targets[daemons][rank])
        except Exception:  # reported by the parent; the next run goes on
            results[label] = {"error": traceback.format_exc()}
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _run(rank: int, label: str, codec: str, cuda_ipc, target: str) -> dict:
    """One run of one rank: its parameters, what the hook chose and saw."""
    import gradcomp.torch as gtorch

    model = _model(label).cuda()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    state = gtorch.HookState(
        model, target, job=label.replace("/", "."),
        codecs={name: gtorch.Codec(codec) for name, _ in model.named_parameters()},
        cuda_ipc=cuda_ipc)
    try:
        ddp.register_comm_hook(state, gtorch.hook)
        return _train(rank, label, model, ddp, state)
    finally:
        state.close()


def _train(rank: int, label: str, model: nn.Module, ddp: nn.Module, state) -> dict:
    from gradcomp.v1 import gradcomp_pb2

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = TIMED_STEPS if label.startswith("timing/") else STEPS
    times = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            x, y = _batch(rank, step)
            torch.cuda.synchronize()
            start = time.perf_counter()
            optimizer.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            optimizer.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    regions = state.client._shm_call("SharedMemoryStatus",
                                     gradcomp_pb2.SharedMemoryStatusRequest())
    return {
        "params": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "transport": state.cuda_transport,
        "reason": state.cuda_transport_reason,
        "warnings": [str(w.message) for w in caught
                     if "gradcomp" in str(w.message)],
        "regions": {r.name: r.kind for r in regions.regions},
        "reduces": state.stats.reduces,
        "step_s": times[2:] if label.startswith("timing/") else times,
    }


def _daemons(extra_env: dict) -> list:
    from gradcomp.testing import Daemon, free_port
    peers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(W))
    saved = {k: os.environ.get(k) for k in extra_env}
    os.environ.update(extra_env)
    try:
        return [Daemon([f"--rank={r}", f"--world_size={W}", f"--peers={peers}",
                        "--allow_client_shm", "--collective_timeout=20s"]).start()
                for r in range(W)]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _metric_lines(daemon, needle: str) -> list[str]:
    with urllib.request.urlopen(daemon.metrics_url, timeout=5) as response:
        text = response.read().decode()
    return [line for line in text.splitlines()
            if needle in line and not line.startswith("#")]


def _cuda_backend_reduces(daemon) -> int | None:
    """The reduces the daemon ran on its CUDA backend
    (gradcomp_reduce_backend_total{backend="cuda"}), or None for a daemon
    that does not export the metric."""
    lines = _metric_lines(daemon, "gradcomp_reduce_backend_total")
    if not lines:
        return None
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in lines
               if 'backend="cuda"' in line)


def _check_served(ranks: list[dict], served: list, check) -> None:
    """Each GPU daemon reduced on its CUDA backend exactly what its rank's
    hook sent by CUDA IPC (the host runs went through system memory)."""
    for r, (result, count) in enumerate(zip(ranks, served)):
        runs = [result[label] for label in ("none/cuda_ipc", "fp16/cuda_ipc",
                                            "timing/cuda_ipc")]
        if count is None or any("error" in run for run in runs):
            print(f"note  rank {r}: no backend count to compare (metric absent or a run failed)")
            continue
        expected = sum(run["reduces"] for run in runs)
        check(count == expected,
              f"rank {r}: its daemon reduced {count} tensors on the CUDA backend, "
              f"the hook sent {expected} by CUDA IPC")


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def main() -> int:
    if not torch.cuda.is_available():
        print("hook_cuda_ipc: skipped: no CUDA GPU (torch.cuda.is_available() is False)")
        return 77
    from gradcomp.testing import free_port

    failures = []

    def check(ok: bool, what: str) -> None:
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    daemons = {"gpu": _daemons({}), "nogpu": _daemons({"CUDA_VISIBLE_DEVICES": ""})}
    ranks, metrics, served = None, {}, []
    try:
        targets = {k: [d.target for d in v] for k, v in daemons.items()}
        with tempfile.TemporaryDirectory() as out:
            try:
                mp.spawn(_worker, args=(free_port(), targets, out), nprocs=W, join=True)
                ranks = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(W)]
            except Exception as error:
                check(False, f"the workers: {error}")
        metrics = {k: [line for d in v for line in _metric_lines(d, "cuda") +
                       _metric_lines(d, "gpu_unavailable")]
                   for k, v in daemons.items()}
        served = [_cuda_backend_reduces(d) for d in daemons["gpu"]]
    finally:
        logs = {k: [d.log() for d in v] for k, v in daemons.items()}
        for group in daemons.values():
            for d in group:
                d.close()
    if ranks is not None:
        _check_runs(ranks, check)
        _check_served(ranks, served, check)
    print("daemon metrics mentioning cuda / gpu_unavailable:")
    for k, lines in metrics.items():
        for line in lines:
            print(f"  [{k}] {line}")
    if failures:
        for k, texts in logs.items():
            for r, text in enumerate(texts):
                print(f"--- {k} daemon {r} log (tail)\n{text[-3000:]}")
        print(f"hook_cuda_ipc: {len(failures)} check(s) failed")
        return 1
    print("hook_cuda_ipc: all checks passed")
    return 0


def _check_runs(ranks: list[dict], check) -> None:
    good = set()
    for label, *_ in RUNS:
        errors = [f"rank {r}: {result[label]['error']}" for r, result in enumerate(ranks)
                  if "error" in result[label]]
        check(not errors, f"{label}: ran on every rank" + "".join(f"\n{e}" for e in errors))
        if not errors:
            good.add(label)
    first = ranks[0]
    for label in sorted(good):
        same = all(torch.equal(first[label]["params"][k], r[label]["params"][k])
                   for r in ranks[1:] for k in first[label]["params"])
        check(same, f"{label}: every rank ends with the same parameters")
    for r, result in enumerate(ranks):
        for label in good & {"none/cuda_ipc", "fp16/cuda_ipc", "timing/cuda_ipc"}:
            run = result[label]
            check(run["transport"] == "cuda_ipc" and not run["warnings"],
                  f"rank {r} {label}: CUDA IPC path, no warning "
                  f"({run['transport']}: {run['reason']}; {run['warnings']})")
            check(bool(run["regions"]) and set(run["regions"].values()) == {"cuda"},
                  f"rank {r} {label}: the daemon holds the hook's regions as CUDA "
                  f"({run['regions']}); {run['reduces']} reduces")
        for label in good & {"none/host", "fp16/host", "timing/host"}:
            run = result[label]
            check(run["transport"] == "host" and not run["warnings"],
                  f"rank {r} {label}: host path, no warning ({run['reason']})")
        if "fp16/fallback" in good:
            run = result["fp16/fallback"]
            check(run["transport"] == "host" and len(run["warnings"]) == 1
                  and "no usable CUDA device" in run["warnings"][0],
                  f"rank {r} fp16/fallback: host path with one warning ({run['warnings']})")
    initial = _model("none/host").state_dict()
    for codec, rtol, atol in (("none", 1e-5, 1e-6), ("fp16", 1e-3, 1e-4)):
        if not {f"{codec}/cuda_ipc", f"{codec}/host"} <= good:
            continue
        ipc, host = first[f"{codec}/cuda_ipc"]["params"], first[f"{codec}/host"]["params"]
        diff = _max_diff(ipc, host)
        bitwise = all(torch.equal(ipc[k], host[k]) for k in ipc)
        close = all(torch.allclose(ipc[k], host[k], rtol=rtol, atol=atol) for k in ipc)
        check(close, f"{codec}: CUDA IPC parameters equal the host path's "
                     f"(max |diff| {diff:.3g}, bit-identical: {bitwise}, "
                     f"rtol {rtol}, atol {atol})")
        check(_max_diff(ipc, initial) > 1e-4, f"{codec}: training changed the model")
    if {"fp16/fallback", "fp16/host"} <= good:
        check(all(torch.equal(first["fp16/fallback"]["params"][k],
                              first["fp16/host"]["params"][k]) for k in initial),
              "fp16/fallback equals fp16/host bit for bit")
    if {"timing/cuda_ipc", "timing/host"} <= good:
        ipc_s = statistics.median(first["timing/cuda_ipc"]["step_s"])
        host_s = statistics.median(first["timing/host"]["step_s"])
        print(f"timing (5.8M-parameter MLP, fp16, W={W} on one GPU, median of "
              f"{TIMED_STEPS - 2} steps, rank 0): cuda_ipc {ipc_s * 1e3:.1f} ms, "
              f"host {host_s * 1e3:.1f} ms, host/cuda_ipc {host_s / ipc_s:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
