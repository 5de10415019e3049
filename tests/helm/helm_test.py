"""The Helm chart (helm/gradcomp) under the real tools, offline.

For the default values and every file in tests/helm/values/: `helm lint
--strict`, `helm template`, every rendered object validated against the
Kubernetes (and Prometheus Operator) schemas of kubernetes-models, and the
rendered daemon config run through `gradcompd --check_config` with the
container's own arguments. Every file in tests/helm/bad/ must be refused by
values.schema.json with the message its `# expect:` line names. Every
limit in config.limits must reach the daemon's effective config, and none
be rendered by default. The default render (world size 4) is started as 4
real daemons on loopback and a reduce runs across them
(LoopbackClusterTest), and tests/helm/parent-chart adds the sidecar to a
user's own StatefulSet with the named template (ParentChartTest).

Run by tools/test through tests/helm/run; needs tools/setup's helm and
node packages (.out/) and bazel-bin/service/gradcompd (or $GRADCOMPD).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
import unittest

import numpy as np

from chart_files import COPIES as CHART_COPIES

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "gradcomp"
HELM = REPO / ".out" / "bin" / "helm"
NODE_MODULES = REPO / ".out" / "k8s-validate" / "node_modules"
VALIDATE = REPO / "tests" / "helm" / "validate" / "validate.js"
VALUE_SETS = {"default": None} | {
    p.stem: p for p in sorted((REPO / "tests" / "helm" / "values").glob("*.yaml"))}
BAD_VALUES = sorted((REPO / "tests" / "helm" / "bad").glob("*.yaml"))
RELEASE = "train"
NAMESPACE = "ml"


def _missing_tools() -> str | None:
    if not os.access(HELM, os.X_OK) or not (NODE_MODULES / "kubernetes-models").is_dir():
        return "helm or kubernetes-models missing: run tools/setup"
    if shutil.which("node") is None:
        return "node missing: run tools/setup"
    return None


def gradcompd() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GRADCOMPD") or REPO / "bazel-bin" / "service" / "gradcompd")


class Helm:
    """helm with its cache, config and data homes in a temporary directory."""

    def __init__(self, home: str):
        self.env = dict(os.environ, HELM_CACHE_HOME=f"{home}/cache",
                        HELM_CONFIG_HOME=f"{home}/config", HELM_DATA_HOME=f"{home}/data")

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(HELM), *args], env=self.env, capture_output=True,
                              text=True, timeout=120)

    def template(self, values: pathlib.Path | None) -> subprocess.CompletedProcess:
        extra = ["-f", str(values)] if values else []
        return self.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra)


def validate(rendered: str, workdir: str) -> tuple[list[dict], list[str]]:
    """Every object of a manifest, parsed, and the schema errors of each."""
    path = pathlib.Path(workdir) / "rendered.yaml"
    path.write_text(rendered)
    result = subprocess.run(["node", str(VALIDATE), str(path)], capture_output=True, text=True,
                            env=dict(os.environ, NODE_PATH=str(NODE_MODULES)), timeout=120)
    if not result.stdout:
        raise AssertionError(f"validate.js printed nothing: {result.stderr}")
    report = json.loads(result.stdout)
    return report["objects"], report["errors"]


def find(objects: list[dict], kind: str, suffix: str = "") -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    if len(matches) != 1:
        raise AssertionError(f"expected one {kind} named *{suffix}, rendered "
                             f"{[o['metadata']['name'] for o in matches]}")
    return matches[0]


def sidecar(pod_spec: dict) -> dict:
    (container,) = [c for c in pod_spec["containers"] if c["name"] == "gradcompd"]
    return container


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of container args: $$ escapes, unknown names stay."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def pod_env(container: dict, ordinal: int, pod_labels: dict) -> dict[str, str]:
    """The container's environment in the pod with this ordinal, as the
    downward API fills it: the StatefulSet controller sets the
    apps.kubernetes.io/pod-index label to the ordinal."""
    labels = dict(pod_labels, **{"apps.kubernetes.io/pod-index": str(ordinal)})
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        path = var["valueFrom"]["fieldRef"]["fieldPath"]
        match = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
        if not match:
            raise AssertionError(f"env {var['name']}: no emulation of fieldPath {path}")
        env[var["name"]] = labels[match.group(1)]
    return env


def write_tls_secret(local: pathlib.Path) -> None:
    """Writes what a cert-manager Secret holds (ca.crt, tls.crt, tls.key),
    made with openssl, into `local`."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=local, check=True, capture_output=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=test CA",
            "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-new", *ec, "-subj", "/CN=peer", "-keyout", "tls.key", "-out", "tls.csr")
    openssl("x509", "-req", "-days", "2", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-set_serial", "2", "-out", "tls.crt")


def mounted(container: dict, volumes: list[dict], objects: list[dict], root: pathlib.Path) -> dict[str, str]:
    """Writes the container's ConfigMap mounts (and test certificates for its
    Secret mounts, and an empty directory for its client socket) under `root`;
    returns the mount path -> local directory map for rewriting the
    container's args and config."""
    paths = {}
    for mount in container.get("volumeMounts", []):
        (volume,) = [v for v in volumes if v["name"] == mount["name"]]
        socket_dir = volume["name"] == "gradcomp-socket"
        if "configMap" not in volume and "secret" not in volume and not socket_dir:
            continue
        local = root / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        if socket_dir:
            pass  # the daemon creates its socket there
        elif "secret" in volume:
            write_tls_secret(local)
        else:
            config_map = find(objects, "ConfigMap", volume["configMap"]["name"])
            for key, text in config_map["data"].items():
                (local / key).write_text(text)
        paths[mount["mountPath"]] = str(local)
    return paths


def limit_fields() -> dict[str, str]:
    """DaemonConfig's limits, its fields from 30 on (config.proto): JSON name -> field name."""
    from gradcomp.v1.config_pb2 import DaemonConfig
    return {f.json_name: f.name for f in DaemonConfig.DESCRIPTOR.fields if f.number >= 30}


def check_config(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(gradcompd()), *args, "--check_config"], capture_output=True,
                          text=True, timeout=60)


def check_rendered_config(objects: list) -> subprocess.CompletedProcess:
    """check_config of the daemon started with rank 0's sidecar arguments, its
    mounted files (the ConfigMap's daemon.json among them) on this host."""
    pod = find(objects, "StatefulSet")["spec"]["template"]
    container = sidecar(pod["spec"])
    with tempfile.TemporaryDirectory() as root:
        mounts = mounted(container, pod["spec"]["volumes"], objects, pathlib.Path(root))
        env = pod_env(container, 0, pod["metadata"]["labels"])
        return check_config([rewrite_paths(expand(a, env), mounts) for a in container["args"]])


@unittest.skipIf(_missing_tools(), _missing_tools())
class ChartTest(unittest.TestCase):
    """Lint, render, validate and config-check every value set."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="helm-test-")
        cls.helm = Helm(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def render(self, name: str) -> list[dict]:
        result = self.helm.template(VALUE_SETS[name])
        self.assertEqual(result.returncode, 0, result.stderr)
        objects, errors = validate(result.stdout, self.tmp.name)
        self.assertEqual(errors, [], f"value set {name}: invalid objects")
        return objects

    def check_value_set(self, name: str) -> None:
        values = VALUE_SETS[name]
        extra = ["-f", str(values)] if values else []
        lint = self.helm.run("lint", "--strict", str(CHART), *extra)
        self.assertEqual(lint.returncode, 0, lint.stdout + lint.stderr)
        self.assertIn("0 chart(s) failed", lint.stdout)

        objects = self.render(name)
        config_text = find(objects, "ConfigMap", "-config")["data"]["daemon.json"]
        config = json.loads(config_text)
        world_size = config["worldSize"]
        self.assertEqual(len(config["peers"]), world_size)
        statefulsets = [o for o in objects if o["kind"] == "StatefulSet"]
        if not statefulsets:
            # Only the named template's objects: check the config alone.
            with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
                file.write(config_text)
                file.flush()
                result = check_config([f"--config={file.name}", f"--rank={world_size - 1}"])
            self.assertEqual(result.returncode, 0, result.stderr)
            return
        (statefulset,) = statefulsets
        self.assertEqual(statefulset["spec"]["replicas"], world_size)
        self.assertEqual(statefulset["spec"]["podManagementPolicy"], "Parallel")
        pod = statefulset["spec"]["template"]
        container = sidecar(pod["spec"])
        self.assertNotIn("command", container, "the image's entrypoint is gradcompd")
        self.assertTrue(container["securityContext"]["readOnlyRootFilesystem"])
        self.assertTrue(pod["spec"]["securityContext"]["runAsNonRoot"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(container[probe]["grpc"]["port"], 50051, probe)
        (dshm,) = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
        self.assertEqual(dshm["emptyDir"]["medium"], "Memory")
        for c in pod["spec"]["containers"]:
            self.assertIn("/dev/shm", [m["mountPath"] for m in c["volumeMounts"]], c["name"])
            # The client API is a unix socket in a directory every container shares.
            self.assertIn({"name": "gradcomp-socket", "mountPath": "/run/gradcomp"},
                          c["volumeMounts"], c["name"])
        self.assertEqual(config["listen"], "unix:/run/gradcomp/gradcomp.sock")
        self.assertIn("--health_listen=0.0.0.0:50051", container["args"])
        # Daemons of another release refuse ours at the handshake.
        self.assertIn(f"--peer_group={NAMESPACE}/{RELEASE}-gradcomp", container["args"])
        for c in pod["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            if "GRADCOMP_TARGET" in env:
                self.assertEqual(env["GRADCOMP_TARGET"], "unix:/run/gradcomp/gradcomp.sock")
                # The demo scrapes the sidecar's metrics port, whatever it is.
                (metrics_port,) = [p["containerPort"] for p in container["ports"]
                                   if p["name"] == "metrics"]
                self.assertEqual(env["GRADCOMP_METRICS_URL"],
                                 f"http://127.0.0.1:{metrics_port}/metrics")

        # Every rank's arguments pass --check_config; the last rank is the
        # one a wrong world size would refuse.
        with tempfile.TemporaryDirectory() as root:
            mounts = mounted(container, pod["spec"]["volumes"], objects, pathlib.Path(root))
            for ordinal in (0, world_size - 1):
                env = pod_env(container, ordinal, pod["metadata"]["labels"])
                args = [rewrite_paths(expand(a, env), mounts) for a in container["args"]]
                result = check_config(args)
                self.assertEqual(result.returncode, 0, f"{args}: {result.stderr}")
                effective = json.loads(result.stdout)
                self.assertEqual(effective["rank"], ordinal)
                self.assertEqual(effective["world_size"], world_size)
                self.assertEqual(effective["peers"], config["peers"])
                self.assertEqual(effective["error_sample_rate"], config["errorSampleRate"])
                self.assertEqual(len(effective["policy"]["rules"]), len(config["policy"]["rules"]))
                self.assertEqual(effective.get("allow_client_shm", False),
                                 config.get("allowClientShm", False))

    def test_bad_values_are_refused_by_the_schema(self):
        self.assertGreaterEqual(len(BAD_VALUES), 5)
        for path in BAD_VALUES:
            with self.subTest(values=path.name):
                expect = re.search(r"^# expect: (.+)$", path.read_text(), re.M).group(1)
                result = self.helm.template(path)
                self.assertNotEqual(result.returncode, 0, f"{path.name} rendered")
                # By the schema, or by a template's `fail` for what a JSON
                # schema cannot say (three ports that must differ).
                self.assertTrue("don't meet the specifications of the schema" in result.stderr
                                or "execution error" in result.stderr, result.stderr)
                self.assertIn(expect, result.stderr)

    def test_a_long_release_name_still_names_a_statefulset_kubernetes_takes(self):
        # 44 characters: "<release>-gradcomp" is 53, one more than a
        # StatefulSet's pods can carry in their revision label.
        release = "r" * 44
        result = self.helm.run("template", release, str(CHART), "--namespace", NAMESPACE)
        self.assertEqual(result.returncode, 0, result.stderr)
        objects, errors = validate(result.stdout, self.tmp.name)
        self.assertEqual(errors, [])
        statefulset = find(objects, "StatefulSet")
        self.assertLessEqual(len(statefulset["metadata"]["name"]), 52)
        config = json.loads(find(objects, "ConfigMap", "-config")["data"]["daemon.json"])
        self.assertTrue(config["peers"][0].startswith(statefulset["metadata"]["name"] + "-0."))

    def test_chart_versions(self):
        chart = (CHART / "Chart.yaml").read_text()
        version = re.search(r'kVersion\[\] = "([^"]+)"',
                            (REPO / "service" / "version.h").read_text()).group(1)
        self.assertIn(f'appVersion: "{version}"', chart, "appVersion is not gradcompd's version")
        # The rank comes from the pod-index label, set since Kubernetes 1.28.
        old = self.helm.run("template", RELEASE, str(CHART), "--kube-version", "1.27.9")
        self.assertNotEqual(old.returncode, 0)
        self.assertIn("incompatible with Kubernetes v1.27.9", old.stderr)

    def test_gpu_values_request_gpus(self):
        pod = find(self.render("gpu"), "StatefulSet")["spec"]["template"]["spec"]
        for c in pod["containers"]:
            self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], 1, c["name"])
        self.assertTrue(sidecar(pod)["image"].endswith(":0.1.0-cuda"))

    def test_tls_values_mount_the_secret(self):
        objects = self.render("tls")
        pod_template = find(objects, "StatefulSet")["spec"]["template"]
        policy = find(objects, "NetworkPolicy")
        self.assertEqual(policy["spec"]["podSelector"]["matchLabels"], pod_template["metadata"]["labels"])
        pod = pod_template["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "gradcomp-tls"]
        self.assertEqual(volume["secret"]["secretName"], "gradcomp-peer-tls")
        self.assertIn({"name": "gradcomp-tls", "mountPath": "/etc/gradcomp/tls", "readOnly": True},
                      sidecar(pod)["volumeMounts"])
        # The daemon reads the mounted files: mutual TLS on the peer port.
        args = sidecar(pod)["args"]
        for flag, key in (("cert", "tls.crt"), ("key", "tls.key"), ("ca", "ca.crt")):
            self.assertIn(f"--peer_tls_{flag}=/etc/gradcomp/tls/{key}", args)
        default = sidecar(find(self.render("default"), "StatefulSet")["spec"]["template"]["spec"])
        self.assertFalse([a for a in default["args"] if a.startswith("--peer_tls")], default["args"])

    def test_limits_reach_the_daemon(self):
        limits = {"memoryBudgetBytes": 3 << 30, "memoryWaitSeconds": 2.5, "maxConcurrentJobs": 4,
                  "maxTensorsPerJob": 1000, "maxStateBytesPerJob": 1 << 30,
                  "maxQueuedRequests": 512, "maxRpcThreads": 64}
        fields = limit_fields()
        self.assertEqual(sorted(limits), sorted(fields), "set every limit")
        values = pathlib.Path(self.tmp.name) / "limits.yaml"  # JSON is YAML
        values.write_text(json.dumps({"config": {"limits": limits}}))
        lint = self.helm.run("lint", "--strict", str(CHART), "-f", str(values))
        self.assertEqual(lint.returncode, 0, lint.stdout + lint.stderr)
        result = self.helm.template(values)
        self.assertEqual(result.returncode, 0, result.stderr)
        objects, errors = validate(result.stdout, self.tmp.name)
        self.assertEqual(errors, [])
        config = json.loads(find(objects, "ConfigMap", "-config")["data"]["daemon.json"])
        # Protobuf JSON: 64-bit integers as strings, the double as a number.
        expected = {k: v if isinstance(v, float) else str(v) for k, v in limits.items()}
        self.assertEqual({k: config.get(k) for k in limits}, expected)

        # The daemon, started with the sidecar's arguments, runs with them.
        result = check_rendered_config(objects)
        self.assertEqual(result.returncode, 0, result.stderr)
        effective = json.loads(result.stdout)
        self.assertEqual({k: effective[fields[k]] for k in limits}, expected)

    def test_a_memory_wait_of_zero_means_no_wait(self):
        values = pathlib.Path(self.tmp.name) / "no-wait.yaml"
        values.write_text(json.dumps({"config": {"limits": {"memoryWaitSeconds": 0}}}))
        result = self.helm.template(values)
        self.assertEqual(result.returncode, 0, result.stderr)
        objects, errors = validate(result.stdout, self.tmp.name)
        self.assertEqual(errors, [])
        config = json.loads(find(objects, "ConfigMap", "-config")["data"]["daemon.json"])
        self.assertEqual(config.get("memoryWaitSeconds"), 0)
        result = check_rendered_config(objects)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(json.loads(result.stdout)["memory_wait_seconds"], 0)

    def test_default_limits_are_left_to_the_daemon(self):
        config = json.loads(find(self.render("default"), "ConfigMap", "-config")["data"]["daemon.json"])
        self.assertEqual([k for k in limit_fields() if k in config], [], "a limit of 0 is rendered")

    def test_large_values_render_monitoring_and_every_peer(self):
        objects = self.render("large")
        config = json.loads(find(objects, "ConfigMap", "-config")["data"]["daemon.json"])
        self.assertEqual(config["peers"][255],
                         f"{RELEASE}-gradcomp-255.{RELEASE}-gradcomp-peers.{NAMESPACE}.svc.cluster.example:50052")
        monitor = find(objects, "ServiceMonitor")
        self.assertEqual(monitor["spec"]["endpoints"][0]["port"], "metrics")
        # The scraped job is named from the Service's label jobLabel names;
        # the rules select job="gradcomp".
        service = find(objects, "Service", "-peers")
        self.assertEqual(service["metadata"]["labels"][monitor["spec"]["jobLabel"]], "gradcomp")
        self.assertTrue(set(monitor["spec"]["selector"]["matchLabels"].items())
                        <= set(service["metadata"]["labels"].items()))
        self.assertIn({"name": "metrics", "port": 9464, "targetPort": "metrics"},
                      service["spec"]["ports"])
        rules = find(objects, "PrometheusRule")
        shipped = (CHART / "files" / "gradcomp-rules.yml").read_text()
        expressions = [rule["expr"] for group in rules["spec"]["groups"] for rule in group["rules"]]
        self.assertGreater(len(expressions), 0)
        for group in rules["spec"]["groups"]:
            for rule in group["rules"]:
                self.assertIn(rule.get("alert") or rule.get("record"), shipped)
        # Every job selector of the rules matches the job the ServiceMonitor names.
        for expr in expressions:
            for op, value in re.findall(r'job(=~|=)"([^"]+)"', expr):
                if op == "=":
                    self.assertEqual(value, "gradcomp", expr)
                else:
                    self.assertTrue(re.fullmatch(value, "gradcomp"), expr)
        dashboard = find(objects, "ConfigMap", "-dashboard")
        self.assertEqual(dashboard["metadata"]["labels"]["grafana_dashboard"], "1")
        shipped = (CHART / "files" / "gradcomp-dashboard.json").read_text()
        self.assertEqual(json.loads(dashboard["data"]["gradcomp-dashboard.json"]),
                         json.loads(shipped.replace("${DS_PROMETHEUS}", "prometheus")))
        self.assertNotIn("${DS_PROMETHEUS}", dashboard["data"]["gradcomp-dashboard.json"])

    def test_chart_copies_equal_deploy_files(self):
        for copy, source in CHART_COPIES.items():
            with self.subTest(file=copy.name):
                self.assertTrue(source.exists(), f"{source} is missing")
                self.assertEqual(copy.read_bytes(), source.read_bytes(),
                                 f"{copy} differs from {source}: run /usr/bin/python3 tests/helm/chart_files.py")


class SchemaTest(unittest.TestCase):
    """values.schema.json against the daemon (no helm needed)."""

    def test_schema_codecs_are_the_daemons(self):
        from gradcomp.testing import Daemon
        import gradcomp
        schema = json.loads((CHART / "values.schema.json").read_text())
        listed = schema["definitions"]["codec"]["properties"]["name"]["enum"]
        with Daemon() as daemon, gradcomp.Client(daemon.target) as client:
            self.assertEqual(sorted(listed), sorted(c.name for c in client.info().codecs))


@unittest.skipIf(_missing_tools(), _missing_tools())
class ParentChartTest(unittest.TestCase):
    """tests/helm/parent-chart: a user's own chart with gradcomp as a
    dependency adds the sidecar to its StatefulSet with gradcomp.podSpec."""

    def test_named_template_adds_the_sidecar_to_a_users_pods(self):
        tmp = tempfile.TemporaryDirectory(prefix="helm-parent-")
        self.addCleanup(tmp.cleanup)
        chart = pathlib.Path(tmp.name) / "my-training"
        shutil.copytree(REPO / "tests" / "helm" / "parent-chart", chart)
        chart_yaml = chart / "Chart.yaml"
        chart_yaml.write_text(chart_yaml.read_text().replace(
            "file://../../../helm/gradcomp", f"file://{CHART}"))
        helm = Helm(tmp.name)
        for args in (("dependency", "build", str(chart)), ("lint", "--strict", str(chart))):
            result = helm.run(*args)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        result = helm.run("template", RELEASE, str(chart), "--namespace", NAMESPACE)
        self.assertEqual(result.returncode, 0, result.stderr)
        objects, errors = validate(result.stdout, tmp.name)
        self.assertEqual(errors, [])
        statefulset = find(objects, "StatefulSet", "resnet")
        self.assertEqual(statefulset["spec"]["serviceName"], find(objects, "Service")["metadata"]["name"])
        spec = statefulset["spec"]["template"]["spec"]
        self.assertEqual([c["name"] for c in spec["containers"]],
                         ["train", "loader", "gradcompd"])
        # The user's pod runs as root; the sidecar keeps its own uid, else
        # the kubelet refuses it (runAsNonRoot beside an inherited uid 0).
        # The pod gets the chart's fsGroup, through which the sidecar reads
        # its TLS secret (0440) and non-root trainers reach its socket.
        self.assertEqual(spec["securityContext"], {"runAsUser": 0, "fsGroup": 65532})
        sidecar_security = spec["containers"][2]["securityContext"]
        self.assertTrue(sidecar_security["runAsNonRoot"])
        self.assertEqual(sidecar_security["runAsUser"], 65532)
        self.assertEqual(sidecar_security["runAsGroup"], 65532)
        self.assertEqual(sidecar_security["seccompProfile"], {"type": "RuntimeDefault"})
        # One /dev/shm and one socket directory for every container, the
        # loader's own "shm" mount included.
        for container in spec["containers"]:
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            self.assertEqual(mounts["/dev/shm"], "dshm", container["name"])
            self.assertEqual(mounts["/run/gradcomp"], "gradcomp-socket", container["name"])
        self.assertEqual(spec["containers"][0]["args"], ["--epochs=90"])
        self.assertIn({"name": "dshm", "mountPath": "/dev/shm"}, spec["containers"][0]["volumeMounts"])
        self.assertIn({"name": "gradcomp-socket", "mountPath": "/run/gradcomp"},
                      spec["containers"][0]["volumeMounts"])
        self.assertEqual(sorted(v["name"] for v in spec["volumes"]),
                         ["data", "dshm", "gradcomp-config", "gradcomp-socket", "shm"])
        config = json.loads(find(objects, "ConfigMap", "-config")["data"]["daemon.json"])
        self.assertEqual(config["peers"], [
            f"resnet-{r}.resnet-peers.{NAMESPACE}.svc.cluster.local:50052" for r in range(2)])
        self.assertEqual(config["policy"]["rules"][0]["codec"]["name"], "topk")


def health(target: str) -> bytes:
    """grpc.health.v1.Health/Check for the empty service name, as the
    kubelet's gRPC probes send it; the raw response (b"\\x08\\x01": SERVING)."""
    import grpc
    with grpc.insecure_channel(target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            return check(b"", timeout=2)
        except grpc.RpcError:
            return b""


@unittest.skipIf(_missing_tools(), _missing_tools())
class LoopbackClusterTest(unittest.TestCase):
    """The default render (world size 4) started as Kubernetes would start
    it, short of Kubernetes: for each pod ordinal, the sidecar's rendered
    args with $(VAR) expanded from its rendered env (the rank from the
    pod-index label the StatefulSet controller sets), and its ConfigMap
    mounted, run as a real gradcompd. What a cluster gives every pod (its
    own IP, the headless Service's DNS names) is mapped onto one host: every
    address the pods use, bound or dialled, is rewritten to a 127.0.0.1
    port of that pod. Then the pods' readiness probes must pass and a reduce
    across the 4 daemons must return the average on every rank."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="helm-cluster-")
        self.addCleanup(tmp.cleanup)
        self.tmp = pathlib.Path(tmp.name)
        result = Helm(tmp.name).template(None)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.objects, errors = validate(result.stdout, tmp.name)
        self.assertEqual(errors, [])
        self.statefulset = find(self.objects, "StatefulSet")
        self.service = find(self.objects, "Service", "-peers")
        self.pod = self.statefulset["spec"]["template"]
        self.container = sidecar(self.pod["spec"])
        self.world_size = self.statefulset["spec"]["replicas"]
        self.port = {p["name"]: p["containerPort"] for p in self.container["ports"]}
        self.config_text = find(self.objects, "ConfigMap", "-config")["data"]["daemon.json"]
        # Pod r's stable name: <statefulset>-r.<headless service>.<namespace>.svc.<domain>.
        self.names = [f"{self.statefulset['metadata']['name']}-{r}.{self.service['metadata']['name']}."
                      f"{NAMESPACE}.svc.cluster.local" for r in range(self.world_size)]

    def start_pods(self) -> list[tuple[subprocess.Popen, pathlib.Path, str]] | None:
        """Starts one daemon per pod on fresh local ports; None when one
        exits before all are ready (a port taken meanwhile by another
        process), after stopping the others."""
        import time
        from gradcomp.testing import free_port
        local = [{port: free_port() for port in self.port.values()} for _ in range(self.world_size)]
        peer = self.port["peer"]

        def localise(text: str, ordinal: int, used: set) -> str:
            mapping = {f"{self.names[r]}:{peer}": f"127.0.0.1:{local[r][peer]}"
                       for r in range(self.world_size)}
            mapping.update({f"0.0.0.0:{p}": f"127.0.0.1:{local[ordinal][p]}" for p in self.port.values()})
            for address, replacement in mapping.items():
                if address in text:
                    used.add(address)
                    text = text.replace(address, replacement)
            return text

        pods = []
        sockets = self.sockets = []
        for ordinal in range(self.world_size):
            root = self.tmp / f"pod-{ordinal}"
            mounts = mounted(self.container, self.pod["spec"]["volumes"], self.objects, root)
            used: set = set()
            daemon_json = pathlib.Path(mounts["/etc/gradcomp/config"]) / "daemon.json"
            daemon_json.write_text(localise(rewrite_paths(self.config_text, mounts), ordinal, used))
            # The trainer's target: the client socket in the pod's shared directory.
            sockets.append("unix:" + rewrite_paths("/run/gradcomp/gradcomp.sock", mounts))
            env = pod_env(self.container, ordinal, self.pod["metadata"]["labels"])
            self.assertEqual(env["GRADCOMP_RANK"], str(ordinal))
            args = [localise(rewrite_paths(expand(a, env), mounts), ordinal, used)
                    for a in self.container["args"]]
            # Every address the rendered pod uses was mapped: nothing was
            # left pointing at a cluster name or a shared port.
            self.assertEqual(len(used), self.world_size + len(self.port), sorted(used))
            with open(root / "gradcompd.log", "wb") as log:
                process = subprocess.Popen([str(gradcompd()), *args], env=dict(os.environ, **env),
                                           stdout=log, stderr=subprocess.STDOUT)
            self.addCleanup(process.kill)
            pods.append((process, root / "gradcompd.log", f"127.0.0.1:{local[ordinal][self.port['api']]}"))

        # The readiness probe: SERVING once a daemon has met every peer.
        deadline = time.monotonic() + 60
        while any(health(target) != b"\x08\x01" for _, _, target in pods):
            if any(process.poll() is not None for process, _, _ in pods):
                for process, _, _ in pods:
                    process.kill()
                    process.wait()
                self.failed_logs = logs(pods)
                return None
            self.assertLess(time.monotonic(), deadline, "pods not ready within 60 s\n" + logs(pods))
            time.sleep(0.2)
        return pods

    def test_world_size_4_starts_and_reduces(self):
        import gradcomp
        self.assertEqual(self.world_size, 4)
        self.assertEqual(self.service["spec"]["clusterIP"], "None")
        self.assertTrue(self.service["spec"]["publishNotReadyAddresses"])
        config = json.loads(self.config_text)
        self.assertEqual(config["peers"], [f"{n}:{self.port['peer']}" for n in self.names])

        for _ in range(3):
            pods = self.start_pods()
            if pods:
                break
        else:
            self.fail("a daemon exited before the pods were ready, three times\n" + self.failed_logs)

        rng = np.random.default_rng(8)
        grads = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(self.world_size)]
        results: dict = {}

        def worker(rank: int) -> None:
            with gradcomp.Client(self.sockets[rank], timeout=60.0) as client:
                info = client.info()
                results[rank] = (info.rank, client.reduce(grads[rank], "layer.weight", 0),
                                 client.reduce(grads[rank], "layer.weight", 1, codec="topk",
                                               params={"ratio": "0.01"}))

        threads = [threading.Thread(target=worker, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(sorted(results), list(range(self.world_size)), logs(pods))
        mean = np.mean(grads, axis=0)
        for rank, (info_rank, (dense, dense_stats), (topk, topk_stats)) in results.items():
            self.assertEqual(info_rank, rank)
            self.assertEqual(dense_stats.world_size, self.world_size)
            np.testing.assert_allclose(dense, mean, rtol=1e-5, atol=1e-6)
            self.assertEqual(topk_stats.codec, "topk")
            np.testing.assert_array_equal(topk, results[0][2][0])
        self.assertGreater(np.count_nonzero(results[0][2][0]), 0)

        # Pod deletion: SIGTERM, graceful exit 0.
        for process, _, _ in pods:
            process.terminate()
        for process, _, _ in pods:
            self.assertEqual(process.wait(30), 0, logs(pods))


def logs(pods) -> str:
    return "\n".join(f"--- pod {i}:\n{path.read_text(errors='replace')[-2000:]}"
                     for i, (_, path, _) in enumerate(pods))


def rewrite_paths(arg: str, mounts: dict[str, str]) -> str:
    for mount, local in mounts.items():
        arg = arg.replace(mount + "/", local + "/")
    return arg


def _value_set_test(name: str):
    def test(self):
        self.check_value_set(name)
    test.__doc__ = f"lint, render, validate, --check_config: values {name}"
    return test


for _name in VALUE_SETS:
    setattr(ChartTest, f"test_values_{_name.replace('-', '_')}", _value_set_test(_name))


if __name__ == "__main__":
    unittest.main()
