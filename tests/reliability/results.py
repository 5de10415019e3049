"""Reads the workers' logs (worker.py) and finds wrong results among them:
per-tensor bound violations the workers found (in whole results and in the
tensors that reduced in a failed stream), ranks whose results for a step
differ, and top-k steps that break the error-feedback identity."""
from __future__ import annotations

import collections
import json
import pathlib

# Tolerance of the top-k identity, in float32 roundings per unit of
# magnitude: v = e + g is rounded once, the decode adds W scaled payloads
# in fp32 (W + 1 roundings), and W <= 8 here.
_TOPK_TOLERANCE = 16 * 2.0 ** -24


def read_log(path: pathlib.Path) -> list[dict]:
    """The step records of one worker log (a killed worker may leave a
    half-written last line, which is dropped)."""
    records = []
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if "step" in r]


def wrong_results(logs: list[list[dict]]) -> list[str]:
    """Every wrong result in the logs of all ranks, described."""
    wrong = []
    by_step: dict[int, dict[int, str]] = collections.defaultdict(dict)
    for rank, records in enumerate(logs):
        for r in records:
            wrong += [f"rank {rank} step {r['step']}: {w}" for w in r.get("wrong", [])]
            if r["ok"]:
                by_step[r["step"]][rank] = r["digest"]
    for step, digests in sorted(by_step.items()):
        if len(set(digests.values())) > 1:
            wrong.append(f"step {step}: the ranks' results differ (digests {digests})")
    wrong += topk_identity_violations(logs)
    return wrong


def topk_identity_violations(logs: list[list[dict]]) -> list[str]:
    """Checks W out_t - sum_r g_r,t = sum_r (e_r,t-1 - e_r,t) along the
    logged projections (workload.topk_terms) for every top-k step that
    succeeded on every rank, in step order, from daemons that started with
    no top-k state. A top-k step that failed on any
    rank ends the chain (the ranks' residuals are then unknown to the
    driver), so the check restarts from the next step that succeeded
    everywhere with the residuals that step reports."""
    world = len(logs)
    steps: dict[int, dict[int, list]] = collections.defaultdict(dict)
    failed: set[int] = set()
    for rank, records in enumerate(logs):
        for r in records:
            if r["codec"] != "topk":
                continue
            if r["ok"]:
                steps[r["step"]][rank] = r["topk"]
            else:
                failed.add(r["step"])
    violations = []
    # Per rank, per tensor: [P0, B0, P1, B1] of the residual before the
    # step; None where unknown. The daemons start with no residual.
    prev: list | None = [collections.defaultdict(lambda: None) for _ in range(world)]
    for step in sorted(set(steps) | failed):
        ranks = steps.get(step, {})
        if step in failed or len(ranks) != world:
            prev = None
            continue
        current = [[None if t is None else t[4:] for t in ranks[r]] for r in range(world)]
        if prev is not None:
            for i, terms in enumerate(ranks[0]):
                if terms is None:
                    continue
                for j in (0, 1):
                    lhs, mag = terms[2 * j], terms[2 * j + 1]
                    rhs = 0.0
                    for r in range(world):
                        before = prev[r][i] or [0.0] * 4  # None: no state yet
                        rhs += before[2 * j] - current[r][i][2 * j]
                        mag += before[2 * j + 1] + current[r][i][2 * j + 1]
                    if abs(lhs - rhs) > _TOPK_TOLERANCE * mag:
                        violations.append(
                            f"step {step} tensor #{i}: top-k identity off by "
                            f"{abs(lhs - rhs):.3g} (tolerance {_TOPK_TOLERANCE * mag:.3g}) "
                            f"along projection {j}")
        # Tensors sent dense keep the residual of the step before.
        prev = [[cur if cur is not None else (prev[r][i] if prev else None)
                 for i, cur in enumerate(current[r])] for r in range(world)]
    return violations
