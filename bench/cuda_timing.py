"""CUDA-event timing shared by the PyTorch GPU benchmarks
(bench/cuda_torch_reference.py, bench/cuda_powersgd_torch.py), measured as
the C++ ones measure (bench/cuda_timer.h): WARMUP untimed runs, then the mean
of REPS runs timed back to back on the current stream.

    from cuda_timing import time_ms
    ms = time_ms(lambda: x.sign())
"""

from typing import Callable

import torch

WARMUP = 3
REPS = 20


def time_ms(fn: Callable[[], object]) -> float:
    """Mean milliseconds of fn() over REPS runs after WARMUP."""
    for _ in range(WARMUP):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / REPS
