"""The broker and Redis variants of the deploy files: docker-compose.rabbitmq.yml and
docker-compose.sentinel.yml (override files layered on docker-compose.yml) and the
deploy/k8s-rabbitmq kustomize overlay.

No Docker engine or cluster runs here: each variant is merged onto its base the way
compose (mappings by key, `command` and `healthcheck.test` replaced) and kustomize (a patch
of a custom resource is a JSON merge patch: lists replaced) merge them (where `kubectl` is
installed, its own `kubectl kustomize` build is compared with that merge), and the
result is checked as test_deploy.py checks the base: it parses, every `switchboard` command
and health check is a real CLI command, health checks stay per role, dependencies exist
and are healthy first, the manifests validate (strict) and the URLs are ones the product
reads.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from test_deploy import (
    COMPOSE,
    K8S,
    K8S_VERSIONS,
    ROLE_CHECKS,
    ROOT,
    SWITCHBOARD_SERVICES,
    check_cli,
    interpolate,
    keda_validator,
    objects,
    pod_spec,
)

from switchboard.shared.config import Settings
from switchboard.shared.store.urls import parse_redis_url
from switchboard.workers.app import RUNS_QUEUE, _kombu_broker

pytestmark = pytest.mark.unit

RABBITMQ = ROOT / "docker-compose.rabbitmq.yml"
SENTINEL = ROOT / "docker-compose.sentinel.yml"
OVERLAY = ROOT / "deploy" / "k8s-rabbitmq"
SENTINEL_URL = "redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/mymaster/0"
# Compose keys whose value an override replaces rather than merges.
REPLACED = {"command", "entrypoint", "test"}
# The `rabbitmq` scaler's metadata keys (KEDA's "RabbitMQ Queue" scaler page).
KEDA_RABBITMQ_METADATA = {
    "host",
    "hostFromEnv",
    "usernameFromEnv",
    "passwordFromEnv",
    "protocol",
    "queueName",
    "mode",
    "value",
    "activationValue",
    "vhostName",
    "useRegex",
    "excludeUnacknowledged",
    "operation",
    "timeout",
    "unsafeSsl",
}


def load(path: Path) -> dict[str, Any]:
    """A YAML file, parsed (anchors and merge keys resolved)."""
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def compose_merge(base: Any, override: Any, key: str = "") -> Any:
    """``override`` layered on ``base`` as `docker compose -f base -f override` does."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for k, v in override.items():
            merged[k] = compose_merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return merged
    if isinstance(base, list) and isinstance(override, list) and key not in REPLACED:
        return base + [v for v in override if v not in base]
    return copy.deepcopy(override)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (kustomize's patch of a custom resource)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = merge_patch(merged.get(k), v)
    return merged


def variant(path: Path) -> dict[str, Any]:
    """docker-compose.yml with the override file ``path`` layered on it."""
    merged: dict[str, Any] = compose_merge(load(COMPOSE), load(path))
    return merged


def sentinel_conf(service: dict[str, Any]) -> list[str]:
    """The sentinel.conf lines a sentinel service writes before it starts."""
    script = service["command"][-1]
    return re.findall(r"'([^']+)'", script.split(">", 1)[0])


# --- compose variants -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "added"),
    [
        (RABBITMQ, {"rabbitmq"}),
        (SENTINEL, {"redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"}),
    ],
)
def test_compose_variant_adds_its_services_and_keeps_the_base(path: Path, added: set[str]) -> None:
    """Each override parses, adds only its own services and keeps every base setting of the
    Switchboard services (image, shared env, entrypoint, depends on a healthy Redis)."""
    base, merged = load(COMPOSE), variant(path)
    assert set(merged["services"]) == set(base["services"]) | added
    assert set(load(path)["services"]) - added <= set(base["services"])
    for name in SWITCHBOARD_SERVICES:
        service = merged["services"][name]
        assert service["image"] == base["services"][name]["image"]
        assert "entrypoint" not in service
        assert service["depends_on"]["redis"] == {"condition": "service_healthy"}, name
    text = path.read_text()
    command = f"docker compose -f docker-compose.yml -f {path.name} up"
    assert command in text
    assert command in (ROOT / "deploy" / "README.md").read_text()


@pytest.mark.parametrize("path", [RABBITMQ, SENTINEL])
def test_compose_variant_commands_and_healthchecks_are_real_and_per_role(path: Path) -> None:
    """In the merged file every Switchboard command and health check parses with the real
    CLI, each role keeps its own check, and every service has a health check that its
    dependants wait for."""
    services = variant(path)["services"]
    for name in SWITCHBOARD_SERVICES:
        service = services[name]
        check_cli([interpolate(str(a)) for a in service["command"]], f"{path.name} {name}")
        test = service["healthcheck"]["test"]
        assert test[:2] == ["CMD", "switchboard"], (name, test)
        assert check_cli(test[2:], f"{path.name} {name}.healthcheck") == "check-health"
        flags = {arg for arg in test if arg in ROLE_CHECKS.values()}
        assert flags == ({ROLE_CHECKS[name]} if name in ROLE_CHECKS else set()), (name, test)
    for name, service in services.items():
        assert service["healthcheck"]["test"][0] == "CMD", name
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, (name, dependency)
            assert condition == {"condition": "service_healthy"}, (name, dependency)
        assert "container_name" not in service, name


def test_compose_rabbitmq_variant_points_every_process_at_its_broker() -> None:
    """Every Switchboard process gets an amqp:// SWITCHBOARD_BROKER_URL naming the rabbitmq
    service with its user, password and vhost, and waits for RabbitMQ; Redis stays the store."""
    services = variant(RABBITMQ)["services"]
    rabbit = services["rabbitmq"]
    rabbit_env = rabbit["environment"]
    assert re.fullmatch(
        r"\$\{SWITCHBOARD_RABBITMQ_PASSWORD:\?[^}]+\}", rabbit_env["RABBITMQ_DEFAULT_PASS"]
    )
    assert all(str(p).startswith("127.0.0.1:") for p in rabbit.get("ports", []))
    assert any(str(v).endswith(":/var/lib/rabbitmq") for v in rabbit["volumes"])
    for name in SWITCHBOARD_SERVICES:
        env = services[name]["environment"]
        assert env["SWITCHBOARD_REDIS_URL"].startswith("redis://redis:6379"), name
        url = re.sub(r"\$\{[A-Z_]+:\?[^}]+\}", "pw", env["SWITCHBOARD_BROKER_URL"])
        parts = urlsplit(url)
        assert parts.scheme == "amqp" and parts.hostname == "rabbitmq" and parts.port == 5672
        assert parts.username == rabbit_env["RABBITMQ_DEFAULT_USER"]
        assert parts.path == "/" + rabbit_env["RABBITMQ_DEFAULT_VHOST"]
        assert "${SWITCHBOARD_RABBITMQ_PASSWORD:?" in env["SWITCHBOARD_BROKER_URL"]
        settings = Settings(redis_url=env["SWITCHBOARD_REDIS_URL"], broker_url=url)
        assert settings.effective_broker_url == url
        assert _kombu_broker(url, {}) == (url, None, None)  # kombu's own amqp transport
        assert "rabbitmq" in services[name]["depends_on"], name
    # Flower's own env block (the shared one plus its login) gets the broker URL too.
    assert "SWITCHBOARD_FLOWER_BASIC_AUTH" in services["flower"]["environment"]


def test_compose_sentinel_variant_is_a_primary_a_replica_and_three_sentinels() -> None:
    """Three sentinels monitor the `redis` primary under the master name the processes ask
    for (quorum 2 of 3); the replica follows it; both stay durable; every process reaches
    Redis (store and broker) through all three sentinels and waits for them."""
    services = variant(SENTINEL)["services"]
    parsed = parse_redis_url(SENTINEL_URL)
    assert parsed is not None and parsed.master == "mymaster" and parsed.db == 0
    sentinels = {f"sentinel-{i}" for i in (1, 2, 3)}
    assert {host for host, _ in parsed.sentinels} == sentinels
    assert {port for _, port in parsed.sentinels} == {26379}
    for name in sentinels:
        conf = sentinel_conf(services[name])
        assert "port 26379" in conf and "sentinel resolve-hostnames yes" in conf, name
        [monitor] = [line for line in conf if line.startswith("sentinel monitor ")]
        _, _, master, host, port, quorum = monitor.split()
        assert (master, host, port) == (parsed.master, "redis", "6379"), name
        assert 2 <= int(quorum) <= len(sentinels) // 2 + 1
        assert services[name]["command"][-1].rstrip().endswith("redis-sentinel /tmp/sentinel.conf")
    replica = " ".join(str(a) for a in services["redis-replica"]["command"])
    assert "--replicaof redis 6379" in replica
    for name in ("redis", "redis-replica"):
        args = " ".join(str(a) for a in services[name]["command"])
        for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
            assert flag in args, (name, flag)
        assert f"--replica-announce-ip {name}" in args
    assert services["redis-replica"]["volumes"] != services["redis"]["volumes"]
    for name in SWITCHBOARD_SERVICES:
        service = services[name]
        assert service["environment"]["SWITCHBOARD_REDIS_URL"] == SENTINEL_URL, name
        assert "SWITCHBOARD_BROKER_URL" not in service["environment"]  # the same Redis
        assert sentinels <= set(service["depends_on"]), name
    broker, transport, ssl = _kombu_broker(SENTINEL_URL, options := {})
    assert transport and transport.endswith(":SentinelTransport") and ssl is None
    assert options["master_name"] == "mymaster" and broker.count("sentinel://") == 3


# --- deploy/k8s-rabbitmq --------------------------------------------------------------------


def overlay() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The overlay's kustomization and its patches, parsed."""
    kustomization = load(OVERLAY / "kustomization.yaml")
    patches = [load(OVERLAY / p["path"]) for p in kustomization["patches"]]
    return kustomization, patches


def overlaid(kind: str) -> dict[str, dict[str, Any]]:
    """The base objects of ``kind``, each with the overlay's patches for it applied."""
    _, patches = overlay()
    result = objects(kind)
    for patch in patches:
        if patch["kind"] == kind:
            name = patch["metadata"]["name"]
            assert name in result, f"the overlay patches {kind} {name}, which the base lacks"
            result[name] = merge_patch(result[name], patch)
    return result


def test_k8s_rabbitmq_overlay_builds_on_the_base() -> None:
    """The overlay takes deploy/k8s whole and patches only objects the base has."""
    kustomization, patches = overlay()
    assert kustomization["kind"] == "Kustomization" and kustomization["resources"] == ["../k8s"]
    files = {p.name for p in OVERLAY.glob("*.yaml")} - {"kustomization.yaml"}
    assert {p["path"] for p in kustomization["patches"]} == files
    for patch in patches:
        assert patch["metadata"]["name"] in objects(patch["kind"]), patch["kind"]


def test_k8s_rabbitmq_overlay_scales_workers_on_the_runs_queue() -> None:
    """The patched ScaledObject validates against KEDA's CRD schema with one `rabbitmq`
    trigger on `sb.runs` (known metadata keys only), the URL from the worker's env, and
    keeps the base's floor and slow scale-down."""
    [scaled] = overlaid("ScaledObject").values()
    validator = keda_validator()
    errors = sorted(validator.iter_errors(scaled), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    spec = scaled["spec"]
    assert spec["minReplicaCount"] >= 1 and spec["scaleTargetRef"]["name"] == "worker"
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    [trigger] = spec["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "rabbitmq" and set(meta) <= KEDA_RABBITMQ_METADATA
    assert meta["queueName"] == RUNS_QUEUE and meta["mode"] == "QueueLength"
    assert meta["protocol"] == "amqp" and int(meta["value"]) >= 1
    # hostFromEnv: an env var of the worker container, from a Secret the overlay fills in.
    secrets = overlaid("Secret")
    worker = pod_spec(objects("Deployment")["worker"])["containers"][0]
    sources = [s["secretRef"]["name"] for s in worker["envFrom"] if "secretRef" in s]
    urls = [secrets[s]["stringData"].get(meta["hostFromEnv"]) for s in sources]
    [url] = [u for u in urls if u]
    assert meta["hostFromEnv"] == "SWITCHBOARD_BROKER_URL"
    parts = urlsplit(url)
    assert parts.scheme == "amqp" and parts.path.strip("/")  # a vhost, as the product needs
    assert "SWITCHBOARD_TOKEN" in secrets["switchboard-secrets"]["stringData"]  # kept


def test_k8s_rabbitmq_overlay_objects_validate() -> None:
    """The patched Secret validates (strict) against the Kubernetes schemas, and the api
    still runs at least two replicas."""
    for secret in overlaid("Secret").values():
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(secret, version, strict=True)
    assert objects("Deployment")["api"]["spec"]["replicas"] >= 2


def test_k8s_rabbitmq_overlay_builds_with_kustomize_as_merged_here() -> None:
    """`kubectl kustomize deploy/k8s-rabbitmq` builds, and its ScaledObject and Secret are
    the ones the tests above check (the merge here is kustomize's)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    built = subprocess.run(
        [kubectl, "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    namespace = load(K8S / "kustomization.yaml")["namespace"]
    for kind in ("ScaledObject", "Secret"):
        for name, expected in overlaid(kind).items():
            [got] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
            assert got["metadata"].pop("namespace") == namespace
            assert got == expected, (kind, name)
