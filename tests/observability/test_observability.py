"""The shipped dashboard and alert rules against a real Prometheus server.

Four real gradcompd daemons peer on loopback while a workload runs; Debian's
`prometheus` scrapes them every second and evaluates a copy of
deploy/prometheus/gradcomp-rules.yml whose `for:` durations are 0 (nothing
else changes). The test then

- evaluates every query of every panel of deploy/grafana/gradcomp-dashboard.json
  through the HTTP API and asserts each returns data,
- provokes each alert (failing requests, a lossy codec, dense bytes, a rank
  that stops, then a killed rank) and asserts that it fires and that its
  expression returns data,
- runs `promtool check config` / `check rules` on the shipped files,
- checks that the relative-error histogram of a daemon agrees, bucket by
  bucket, with the error the client computes itself from the results.

Run by tools/test; skipped when prometheus/promtool or gradcompd are missing.
    GRADCOMPD=bazel-bin/service/gradcompd PYTHONPATH=client/python \
        /usr/bin/python3 -m unittest discover -s tests/observability -v
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))

from gradcomp import metrics  # noqa: E402
from gradcomp.client import Client  # noqa: E402
from gradcomp.errors import GradcompError  # noqa: E402
from gradcomp.testing import Daemon, daemon_binary, free_port, stop_process  # noqa: E402

DASHBOARD = REPO / "deploy" / "grafana" / "gradcomp-dashboard.json"
RULES = REPO / "deploy" / "prometheus" / "gradcomp-rules.yml"
# promtool's unit test of the alerts' timing.
RULES_TEST = REPO / "deploy" / "prometheus" / "gradcomp-rules_test.yml"
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
WORLD = 4

# Every rank holds the same policy (its hash is checked at the handshake).
POLICY = {
    "rules": [
        {"name_glob": "*.w", "codec": {"name": "topk", "params": {"ratio": "0.01"}}},
        # 2-bit QSGD: relative error ~4, above the alert's threshold of 2.
        {"name_glob": "*.q", "codec": {"name": "qsgd", "params": {"bits": "2"}}},
        {"name_glob": "*.dense", "codec": {"name": "none"}},
    ],
}


def _missing_daemon() -> str | None:
    try:
        daemon_binary()
    except FileNotFoundError as error:
        return str(error)
    return None


def _missing_tools() -> str | None:
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install prometheus)"
    return _missing_daemon()


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, with Grafana's
    variables replaced by what a user sees with "All" selected."""
    return [(title, expr) for title, expr, _ in dashboard_targets()]


def dashboard_targets() -> list[tuple[str, str, str]]:
    """dashboard_queries() with each target's legend format."""
    board = json.loads(DASHBOARD.read_text())
    targets = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = (target["expr"].replace("$__rate_interval", "20s")
                    .replace('"$instance"', '".*"'))
            targets.append((panel["title"], expr, target.get("legendFormat", "")))
    return targets


def legend_labels(legend: str) -> set[str]:
    """The labels a Grafana legend format names: {{codec}} -> codec."""
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))


def alert_rules(text: str) -> dict[str, str]:
    """{alert name: expression} of a rules file (the subset of YAML it uses:
    `expr:` inline or as a `>-` folded block)."""
    rules: dict[str, str] = {}
    name = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"\s*- alert: (\S+)", line):
            name = m.group(1)
        elif (m := re.match(r"(\s*)expr: (.*)", line)) and name:
            expr = m.group(2)
            if expr.startswith(">-"):
                indent = len(m.group(1))
                block = []
                for more in lines[i + 1:]:
                    if len(more) - len(more.lstrip()) <= indent:
                        break
                    block.append(more.strip())
                expr = " ".join(block)
            rules[name] = expr
    return rules


def alert_annotation_labels(text: str) -> dict[str, set[str]]:
    """{alert name: the labels its annotations name as {{ $labels.x }} that
    its own `labels:` block does not set}: what the expression's series must
    carry, or the alert reads "<no value>"."""
    needed: dict[str, set[str]] = {}
    for block in re.split(r"\n\s*- alert: ", text)[1:]:
        name = block.split(None, 1)[0]
        own = set()
        if m := re.search(r"\n(\s+)labels:\n((?:\1\s+\w+: .*\n)+)", block):
            own = set(re.findall(r"(\w+):", m.group(2)))
        needed[name] = set(re.findall(r"\$labels\.(\w+)", block)) - own
    return needed


class Prometheus:
    """A real Prometheus server on a free loopback port, its data in `dir`."""

    def __init__(self, directory: pathlib.Path, config: pathlib.Path):
        self.port = free_port()
        self.log_path = directory / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={config}",
                 f"--storage.tsdb.path={directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT)

    def api(self, path: str, **params: str) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise AssertionError(f"{url}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def wait(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log()}")
            try:
                if ready():
                    return
            except (OSError, AssertionError) as error:
                last = error
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout} s waiting for {what} "
                             f"(last error: {last}); prometheus log:\n{self.log()}")

    def firing(self) -> set[str]:
        return {a["labels"]["alertname"] for a in self.api("alerts")["alerts"]
                if a["state"] == "firing"}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        stop_process(self.process)


def step_tensors(rank: int, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 * step + rank)
    return {
        "layer.w": rng.standard_normal((64, 512), dtype=np.float32),
        "layer.q": rng.standard_normal((16, 512), dtype=np.float32),
        "layer.dense": rng.standard_normal((256, 512), dtype=np.float32),
        "layer.b": rng.standard_normal(100, dtype=np.float32),  # 1-D: dense
    }


@unittest.skipIf(_missing_tools(), _missing_tools())
class ShippedFilesTest(unittest.TestCase):

    def test_promtool_accepts_the_scrape_config_and_rules_and_their_timing(self):
        for args in (["check", "config", str(SCRAPE_CONFIG)],
                     ["check", "rules", str(RULES)],
                     ["test", "rules", str(RULES_TEST)]):
            result = subprocess.run(["promtool", *args], capture_output=True,
                                    text=True)
            self.assertEqual(result.returncode, 0,
                             f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}")

    def test_every_alert_the_issue_asks_for_is_shipped(self):
        rules = alert_rules(RULES.read_text())
        self.assertEqual(set(rules), {
            "GradcompDaemonDown", "GradcompPeerDown", "GradcompErrorsRising",
            "GradcompStepStalled", "GradcompCompressionErrorHigh",
            "GradcompDenseFallbacks"})


@unittest.skipIf(_missing_tools(), _missing_tools())
class DashboardAndAlertsTest(unittest.TestCase):
    """4 daemons, a workload, a real Prometheus: the whole scenario is one
    test because each phase builds on the last (stall, then kill)."""

    def setUp(self):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="gradcomp-observability-"))
        self.daemons: list[Daemon] = []
        self.prometheus: Prometheus | None = None
        self.stop_workload = [threading.Event() for _ in range(WORLD)]
        self.workers: list[threading.Thread] = []
        self.worker_errors: list[str] = []

    def tearDown(self):
        for event in self.stop_workload:
            event.set()
        for daemon in self.daemons:
            daemon.stop()
        for worker in self.workers:
            worker.join(timeout=30)
        if self.prometheus is not None:
            self.prometheus.stop()
        for daemon in self.daemons:
            daemon.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start_daemons(self) -> None:
        config = self.dir / "daemon.json"
        config.write_text(json.dumps({"policy": POLICY}))
        peers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(WORLD))
        for rank in range(WORLD):
            self.daemons.append(Daemon([
                f"--config={config}", f"--rank={rank}", f"--world_size={WORLD}",
                f"--peers={peers}", "--collective_timeout=120s"]).start())
        deadline = time.monotonic() + 60
        for daemon in self.daemons:
            while metrics.total(metrics.scrape(daemon.metrics_url),
                                "gradcomp_peers_up") < WORLD - 1:
                if time.monotonic() > deadline:
                    raise AssertionError(f"peers not up; log:\n{daemon.log()[-3000:]}")
                time.sleep(0.2)

    def start_prometheus(self) -> None:
        rules = self.dir / "rules.yml"
        # The shipped rules, with every `for:` at 0 so a test need not wait
        # minutes; expressions and thresholds stay as shipped.
        rules.write_text(re.sub(r"(?m)^(\s*for:) \S+$", r"\1 0s", RULES.read_text()))
        targets = ", ".join(f'"127.0.0.1:{d.metrics_port}"' for d in self.daemons)
        config = self.dir / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{rules}]\n"
            "scrape_configs:\n"
            f"  - job_name: gradcomp\n    static_configs: [{{targets: [{targets}]}}]\n")
        self.prometheus = Prometheus(self.dir, config)
        self.prometheus.wait(
            "every daemon scraped",
            lambda: len([r for r in self.prometheus.query('up{job="gradcomp"} == 1')]) == WORLD,
            timeout=60)

    def run_rank(self, rank: int, start_step: int) -> None:
        """Steps until told to stop; rank 0 also sends a bad request a step."""
        client = Client(self.daemons[rank].target, timeout=300)
        step = start_step
        try:
            while not self.stop_workload[rank].is_set():
                client.reduce_many(step_tensors(rank, step), step=step)
                if rank == 0:
                    try:
                        # An unknown codec: INVALID_ARGUMENT before any
                        # collective, so only this rank sends it.
                        client.reduce(np.ones(4, np.float32), "bad", step,
                                      codec="no-such-codec")
                        self.worker_errors.append("the bad request succeeded")
                    except GradcompError:
                        pass
                step += 1
        except GradcompError as error:
            if not self.stop_workload[rank].is_set():
                self.worker_errors.append(f"rank {rank} step {step}: {error}")
        finally:
            client.close()

    def test_dashboard_queries_return_data_and_alerts_fire(self):
        self.start_daemons()
        self.start_prometheus()
        for rank in range(WORLD):
            worker = threading.Thread(target=self.run_rank, args=(rank, 0), daemon=True)
            worker.start()
            self.workers.append(worker)

        # Panels: every query of every panel returns data (a quantile with
        # a value, not only NaN) once a few scrapes of the workload exist.
        queries = dashboard_queries()
        self.assertGreaterEqual(len(queries), 20)

        def all_have_data() -> bool:
            self.empty = [(t, q) for t, q in queries
                          if not any(not math.isnan(float(s["value"][1]))
                                     for s in self.prometheus.query(q))]
            return not self.empty

        try:
            self.prometheus.wait("data for every dashboard query", all_have_data, 60)
        except AssertionError:
            self.fail(f"dashboard queries without data: {self.empty}; "
                      f"workload errors: {self.worker_errors}")
        self.assertEqual(self.worker_errors, [])
        # Each series carries the labels its legend names: a `by (...)` that
        # drops one, or a misspelt label, would draw every line alike.
        unlabelled = []
        for title, expr, legend in dashboard_targets():
            needed = legend_labels(legend)
            for series in self.prometheus.query(expr):
                absent = sorted(n for n in needed if not series["metric"].get(n))
                if absent:
                    unlabelled.append((title, legend, absent, series["metric"]))
                    break
        self.assertEqual(unlabelled, [], "series without the labels their legend names")

        # Alerts: each phase provokes some; each must fire, and its
        # expression return data, while the phase lasts.
        rules = alert_rules(RULES.read_text())
        annotation_labels = alert_annotation_labels(RULES.read_text())
        self.assertEqual(set(annotation_labels), set(rules))
        fired: set[str] = set()

        def expect_firing(names: set[str], timeout: float) -> None:
            self.prometheus.wait(f"{sorted(names)} firing",
                                 lambda: names <= self.prometheus.firing(), timeout)
            for name in names:
                series = self.prometheus.query(rules[name])
                self.assertTrue(series, f"alert {name}: `{rules[name]}` returned no data")
                # Its annotations' {{ $labels.x }} each find a value.
                for one in series:
                    absent = sorted(annotation_labels[name] - set(one["metric"]))
                    self.assertEqual(absent, [], f"alert {name}: its annotations name "
                                     f"labels its series {one['metric']} lack")
            fired.update(names)

        # The running workload: a failing request a step, 2-bit QSGD, mostly
        # dense bytes. Nothing is down or stalled yet.
        expect_firing({"GradcompErrorsRising", "GradcompCompressionErrorHigh",
                       "GradcompDenseFallbacks"}, 60)
        self.assertEqual(self.prometheus.firing() & {"GradcompPeerDown",
                                                    "GradcompDaemonDown",
                                                    "GradcompStepStalled"}, set())

        # A rank that stops calling: the others wait on it, then stall.
        self.stop_workload[3].set()
        self.workers[3].join(timeout=60)
        expect_firing({"GradcompStepStalled"}, 90)
        stalled = self.prometheus.query(rules["GradcompStepStalled"])
        self.assertEqual({s["metric"]["peer"] for s in stalled}, {"3"})

        # The stopped rank's daemon dies: its peers lose it, its scrapes fail.
        self.daemons[3].process.send_signal(signal.SIGKILL)
        self.daemons[3].process.wait()
        expect_firing({"GradcompPeerDown", "GradcompDaemonDown"}, 60)
        self.assertEqual(fired, set(rules))


@unittest.skipIf(_missing_daemon(), _missing_daemon())
class RelativeErrorHistogramTest(unittest.TestCase):
    """With one worker the result is D(C(g)) itself, so the client can measure
    ||g - D(C(g))|| / ||g|| on its own; the daemon's histogram must put
    every one of those values in the same bucket."""

    def test_histogram_agrees_with_the_client_bucket_by_bucket(self):
        rng = np.random.default_rng(7)
        codecs = [("qsgd", {"bits": "2"}), ("qsgd", {"bits": "4"}),
                  ("qsgd", {"bits": "8"}), ("int8", {}),
                  ("topk", {"ratio": "0.01"}), ("topk", {"ratio": "0.3"})]
        measured: dict[str, list[float]] = {}
        with Daemon(["--error_sample_rate=1"]) as daemon:
            client = Client(daemon.target)
            for i in range(60):
                name, params = codecs[i % len(codecs)]
                g = (rng.standard_normal(int(rng.integers(2000, 20000)))
                     * rng.uniform(1e-3, 10)).astype(np.float32)
                out, stats = client.reduce(g, f"t{i}", step=0, codec=name, params=params)
                g64 = g.astype(np.float64)
                error = float(np.linalg.norm(g64 - out) / np.linalg.norm(g64))
                self.assertAlmostEqual(stats.relative_error, error, delta=1e-5 * error)
                measured.setdefault(name, []).append(error)
            samples = metrics.scrape(daemon.metrics_url)
            client.close()
        for codec, errors in measured.items():
            buckets = [s for s in samples
                       if s.name == "gradcomp_compression_relative_error_bucket"
                       and s.labels.get("codec") == codec]
            self.assertTrue(buckets, f"no histogram for {codec}")
            for bucket in buckets:
                le = float(bucket.labels["le"])
                # A value within float rounding of a bound may land on
                # either side of it: that is bucket resolution.
                sure = sum(e <= le * (1 - 1e-6) for e in errors)
                maybe = sum(e <= le * (1 + 1e-6) for e in errors)
                with self.subTest(codec=codec, le=le):
                    self.assertTrue(sure <= bucket.value <= maybe,
                                    f"bucket le={le}: daemon {bucket.value}, "
                                    f"client {sure}..{maybe} of {errors}")
            self.assertEqual(metrics.total(samples, "gradcomp_compression_relative_error_count",
                                           codec=codec), len(errors))


if __name__ == "__main__":
    unittest.main()
