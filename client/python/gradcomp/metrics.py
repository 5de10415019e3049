"""Reads a Prometheus text-format /metrics page, e.g. gradcompd's.

    samples = scrape("http://127.0.0.1:9464/metrics")
    total(samples, "gradcomp_raw_bytes_total", codec="topk")
"""
from __future__ import annotations

import dataclasses
import re
import urllib.request

# name{label="value",...} value  (the optional timestamp is ignored)
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclasses.dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    line: str


def parse(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (comments skipped)."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        name, labels, value = match.groups()
        samples.append(Sample(name, dict(_LABEL.findall(labels or "")),
                              float(value), line))
    return samples


def scrape(url: str, timeout: float = 10.0) -> list[Sample]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return parse(response.read().decode("utf-8"))


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """Sum of the `name` samples whose labels include `labels`."""
    return sum(s.value for s in samples if s.name == name and
               all(s.labels.get(k) == v for k, v in labels.items()))
