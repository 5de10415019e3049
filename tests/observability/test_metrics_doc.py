"""docs/metrics.md's table of metrics against the metrics the daemon defines.

A scrape cannot tell this: a labelled family shows up on /metrics only once
something has set one of its series, so the names come from the source
(service/metrics/*.cc): every family built with prometheus-cpp's
Build{Counter,Gauge,Histogram}().Name(...), and the ones the collectors
compute when scraped. The table must list each of them, with its type, and
nothing else.

    /usr/bin/python3 -m unittest discover -s tests/observability -v
"""
from __future__ import annotations

import pathlib
import re
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Built through the registry: BuildCounter().Name("gradcomp_...").
_BUILT = re.compile(r"Build(Counter|Gauge|Histogram)\(\)\s*\.Name\(\s*\"(gradcomp_\w+)\"")
# Computed by a collector: OneValue("gradcomp_...", help, MetricType::X, ...)
# or a MetricFamily whose .name and .type are set.
_ONE_VALUE = re.compile(
    r"OneValue\(\s*\"(gradcomp_\w+)\",[^;]*?MetricType::(Counter|Gauge)", re.S)
_FAMILY_NAME = re.compile(r"(\w+)\.name = \"(gradcomp_\w+)\";")
_DOC_ROW = re.compile(r"^\| `(gradcomp_\w+)` \| (counter|gauge|histogram) \|", re.M)


def defined_metrics() -> dict[str, str]:
    """Metric name -> type, from the daemon's source."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "service" / "metrics").glob("*.cc")):
        if path.name.endswith("_test.cc"):
            continue
        text = path.read_text()
        for kind, name in _BUILT.findall(text):
            found[name] = kind.lower()
        for name, kind in _ONE_VALUE.findall(text):
            found[name] = kind.lower()
        for variable, name in _FAMILY_NAME.findall(text):
            kind = re.search(rf"{variable}\.type = prometheus::MetricType::(\w+);", text)
            found[name] = kind.group(1).lower() if kind else "unknown"
    return found


class MetricsDocTest(unittest.TestCase):

    def test_the_table_lists_every_metric_with_its_type_and_no_other(self):
        defined = defined_metrics()
        # The parse itself: too few names means the patterns went stale.
        self.assertGreater(len(defined), 25, f"found only {sorted(defined)}")
        documented = dict(_DOC_ROW.findall((ROOT / "docs" / "metrics.md").read_text()))
        missing = sorted(set(defined) - set(documented))
        extra = sorted(set(documented) - set(defined))
        self.assertEqual(missing, [], "defined but not in docs/metrics.md")
        self.assertEqual(extra, [], "in docs/metrics.md but not defined")
        wrong = {name: (documented[name], kind) for name, kind in defined.items()
                 if documented[name] != kind}
        self.assertEqual(wrong, {}, "documented type vs defined type")


if __name__ == "__main__":
    unittest.main()
