"""Deployment files: docker-compose.yml, deploy/Dockerfile, deploy/k8s, `switchboard flower`.

No Docker engine or cluster runs here, so these check what can be checked without one: the
files parse, every `switchboard ...` they run is a real CLI command with options the CLI
accepts (parsed by the CLI's own click parser), the Kubernetes manifests validate against
the Kubernetes JSON schemas bundled in the `kubernetes-validate` package (strict: unknown
fields fail), and the KEDA ScaledObject validates against a schema written here from KEDA's
CRD (no package ships one that can be used; see SCALED_OBJECT_SCHEMA).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import json5
import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml
from typer.testing import CliRunner

from switchboard.cli import app
from switchboard.shared.config import Settings, parse_config, reset_caches
from switchboard.workers.app import RUNS_QUEUE, VISIBILITY_TIMEOUT_S

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes minor the manifests target, and the newest the validator knows.
K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
# A stopping worker hands its runs back rather than finishing them: it stops in seconds,
# so a rollout waits at most this long per worker (issue 19: not the longest run).
MAX_WORKER_GRACE_S = 60
SWITCHBOARD_SERVICES = {"api", "worker", "beat", "flower"}
# The check-health option each role's container runs (flower: Redis only, the default).
ROLE_CHECKS = {"api": "--api", "worker": "--worker", "beat": "--beat"}


# --- helpers --------------------------------------------------------------------------------


# Click's base error, whichever click typer uses (recent typer versions vendor it).
CLICK_ERROR: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)


def cli_commands() -> dict[str, Any]:
    """The `switchboard` commands, from the typer app's click group."""
    group: Any = typer.main.get_command(app)
    return dict(group.commands)


def check_cli(argv: list[str], where: str) -> str:
    """Assert `switchboard <argv>` is a real command whose options the CLI parses; its name."""
    if not argv:
        pytest.fail(f"{where}: empty switchboard command")
    commands = cli_commands()
    name, *rest = argv
    if name not in commands:
        pytest.fail(f"{where}: `switchboard {name}` is not a CLI command")
    command = commands[name]
    known = {opt for param in command.params for opt in param.opts + param.secondary_opts}
    for token in rest:
        option = token.split("=", 1)[0]
        if token.startswith("-") and option not in known:
            pytest.fail(f"{where}: `switchboard {name}` has no option {option}")
    # The command's own parser: types, ranges and arity, without running it.
    try:
        command.make_context(name, list(rest))
    except CLICK_ERROR as exc:
        message = exc.format_message()  # type: ignore[attr-defined]
        pytest.fail(f"{where}: `switchboard {' '.join(argv)}`: {message}")
    return name


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with VAR unset: the default."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


def duration_s(value: str | int) -> float:
    """A compose duration (`3700s`, `1h2m`, `90`) in seconds."""
    if isinstance(value, int):
        return float(value)
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"bad duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


def compose() -> dict[str, Any]:
    """docker-compose.yml, parsed (anchors and merge keys resolved)."""
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def manifests() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every Kubernetes object in deploy/k8s (not the kustomization), with its file name."""
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def objects(kind: str) -> dict[str, dict[str, Any]]:
    """The manifests of one kind, by name."""
    return {doc["metadata"]["name"]: doc for _, doc in manifests() if doc["kind"] == kind}


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod template's spec of a Deployment or StatefulSet."""
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuations joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "Dockerfile ends in a line continuation"
    out = []
    for line in lines:
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


# KEDA's ScaledObject (keda.sh/v1alpha1), written from the CRD's openAPIV3Schema
# (kedacore/keda config/crd/bases/keda.sh_scaledobjects.yaml, KEDA 2.x): no Python package
# ships it (cloudcoil-models-keda has models generated from it, but installs a pytest plugin
# that breaks collection). Every spec field the CRD defines is listed, so a misspelled one
# fails; the parts this project uses are typed as in the CRD, the HPA behaviour and the
# object metadata by the Kubernetes schemas bundled in kubernetes-validate.
K8S_DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
SCALED_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"$ref": K8S_DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "behavior": {
                                    "$ref": K8S_DEFS
                                    + "io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerBehavior"
                                },
                                "name": {"type": "string"},
                            },
                        },
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "scalingModifiers": {"type": "object"},
                    },
                },
                "cooldownPeriod": INT32,
                "fallback": {"type": "object", "required": ["failureThreshold", "replicas"]},
                "idleReplicaCount": INT32,
                "initialCooldownPeriod": INT32,
                "maxReplicaCount": INT32,
                "minReplicaCount": INT32,
                "pollingInterval": INT32,
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                    },
                },
                "triggers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["metadata", "type"],
                        "properties": {
                            "authenticationRef": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["name"],
                                "properties": {
                                    "kind": {"type": "string"},
                                    "name": {"type": "string"},
                                },
                            },
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "name": {"type": "string"},
                            "type": {"type": "string"},
                            "useCachedMetrics": {"type": "boolean"},
                        },
                    },
                },
            },
        },
        "status": {"type": "object"},
    },
}


def keda_validator() -> jsonschema.Draft202012Validator:
    """A validator for SCALED_OBJECT_SCHEMA, resolving the bundled Kubernetes definitions."""
    from referencing import Registry, Resource

    strict = f"v{kubernetes_validate.utils.latest_version()}-local-strict"
    definitions = json.loads(
        resources.files("kubernetes_validate")
        .joinpath("kubernetes-json-schema", strict, "_definitions.json")
        .read_text()
    )
    registry: Registry[Any] = Resource.from_contents(definitions) @ Registry()
    return jsonschema.Draft202012Validator(SCALED_OBJECT_SCHEMA, registry=registry)


# The `redis` scaler's metadata keys (KEDA's "Redis Lists" scaler page). The CRD types
# trigger metadata only as a map of strings, so the keys are checked against this list.
KEDA_REDIS_METADATA = {
    "address",
    "addressFromEnv",
    "host",
    "hostFromEnv",
    "port",
    "portFromEnv",
    "usernameFromEnv",
    "passwordFromEnv",
    "listName",
    "listLength",
    "activationListLength",
    "enableTLS",
    "unsafeSsl",
    "databaseIndex",
}


# --- switchboard flower ---------------------------------------------------------------------


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    """A CliRunner with a dummy Redis URL and no Flower credentials in the environment."""
    monkeypatch.setenv("SWITCHBOARD_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.delenv("SWITCHBOARD_FLOWER_BASIC_AUTH", raising=False)
    monkeypatch.delenv("SWITCHBOARD_CONFIG", raising=False)
    reset_caches()
    yield CliRunner()
    reset_caches()


@pytest.fixture
def flower_argv(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Records the argv `switchboard flower` hands to Celery instead of starting Flower."""
    from celery import Celery

    calls: list[list[str]] = []
    monkeypatch.setattr(Celery, "start", lambda self, argv=None: calls.append(list(argv or [])))
    return calls


def test_flower_refuses_to_start_without_auth(
    runner: CliRunner, flower_argv: list[list[str]]
) -> None:
    """`switchboard flower` without credentials or --no-auth exits 2 with a clear message."""
    result = runner.invoke(app, ["flower"])
    assert result.exit_code == 2, result.output
    assert "refusing to start Flower without authentication" in result.output
    assert "SWITCHBOARD_FLOWER_BASIC_AUTH" in result.output
    assert flower_argv == []


def test_flower_rejects_malformed_or_conflicting_auth(
    runner: CliRunner, flower_argv: list[list[str]]
) -> None:
    """A pair without user or password, or --no-auth with credentials, is refused."""
    for bad in ("admin", "admin:", ":secret"):
        result = runner.invoke(app, ["flower", "--basic-auth", bad])
        assert result.exit_code == 2, (bad, result.output)
        assert "expected user:password" in result.output
    result = runner.invoke(
        app, ["flower", "--no-auth"], env={"SWITCHBOARD_FLOWER_BASIC_AUTH": "a:b"}
    )
    assert result.exit_code == 2 and "conflicting" in result.output
    assert flower_argv == []


def test_flower_passes_auth_from_env_and_options_flower_knows(
    runner: CliRunner, flower_argv: list[list[str]]
) -> None:
    """With credentials from the env, Flower gets them and only options it defines."""
    from flower.options import default_options

    result = runner.invoke(
        app,
        ["flower", "--port", "5566", "--address", "0.0.0.0"],
        env={"SWITCHBOARD_FLOWER_BASIC_AUTH": "admin:s3cret"},
    )
    assert result.exit_code == 0, result.output
    [argv] = flower_argv
    assert argv[0] == "flower"
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in argv[1:])
    assert flags["basic_auth"] == "admin:s3cret"
    assert flags["port"] == "5566" and flags["address"] == "0.0.0.0"
    assert flags["max_tasks"] == "10000" and flags["purge_offline_workers"] == "60"
    known = {name.replace("-", "_") for name in default_options._options}
    assert set(flags) <= known


def test_flower_runs_without_auth_only_when_asked(
    runner: CliRunner, flower_argv: list[list[str]]
) -> None:
    """--no-auth starts Flower with no basic-auth option."""
    result = runner.invoke(app, ["flower", "--no-auth"])
    assert result.exit_code == 0, result.output
    [argv] = flower_argv
    assert not any(arg.startswith("--basic_auth") for arg in argv)


def test_cli_check_rejects_unknown_commands_and_options() -> None:
    """The CLI check used below fails on a made-up command, option or bad value."""
    check_cli(["worker", "--concurrency", "8"], "ok")
    for argv in (["wrker"], ["worker", "--threads", "8"], ["worker", "--concurrency", "x"]):
        with pytest.raises(pytest.fail.Exception):
            check_cli(argv, "bad")


# --- docker-compose.yml ---------------------------------------------------------------------


def test_compose_parses_with_the_expected_services() -> None:
    """docker-compose.yml is YAML with redis plus the four Switchboard processes."""
    services = compose()["services"]
    assert set(services) == {"redis", *SWITCHBOARD_SERVICES}


def test_compose_services_build_the_image_and_share_the_env_anchor() -> None:
    """Each Switchboard service builds deploy/Dockerfile and carries x-switchboard-env."""
    data = compose()
    shared = data["x-switchboard-env"]
    assert shared["SWITCHBOARD_REDIS_URL"].startswith("redis://redis:6379")
    assert "*switchboard-env" in COMPOSE.read_text()
    for name in SWITCHBOARD_SERVICES:
        service = data["services"][name]
        build = service["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        env = service["environment"]
        assert {k: env[k] for k in shared} == shared, name
        assert "entrypoint" not in service, f"{name} must keep the image's switchboard entrypoint"


def test_compose_commands_and_healthchecks_are_real_cli_commands() -> None:
    """Every command and `switchboard` healthcheck in compose parses with the real CLI."""
    services = compose()["services"]
    ran = set()
    for name in SWITCHBOARD_SERVICES:
        service = services[name]
        argv = [interpolate(str(arg)) for arg in service["command"]]
        ran.add(check_cli(argv, f"compose {name}.command"))
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1] == "switchboard", f"{name}: {test}"
        assert check_cli(test[2:], f"compose {name}.healthcheck") == "check-health"
    assert ran == SWITCHBOARD_SERVICES
    for name, service in services.items():
        test = service["healthcheck"]["test"]
        flags = {arg for arg in test if arg in ROLE_CHECKS.values()}
        assert flags == ({ROLE_CHECKS[name]} if name in ROLE_CHECKS else set()), (name, test)


def test_compose_redis_is_durable_and_never_evicts() -> None:
    """Redis runs with AOF (everysec), noeviction, a volume and a redis-cli healthcheck."""
    redis = compose()["services"]["redis"]
    assert redis["image"].startswith("redis:7")
    args = " ".join(str(a) for a in redis["command"])
    for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert flag in args
    assert any(str(v).endswith(":/data") for v in redis["volumes"])
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_compose_services_wait_for_a_healthy_redis() -> None:
    """Every Switchboard service depends on redis with condition service_healthy."""
    services = compose()["services"]
    for name in SWITCHBOARD_SERVICES:
        assert services[name]["depends_on"] == {"redis": {"condition": "service_healthy"}}


def test_compose_worker_scales_and_drains() -> None:
    """The worker has no container_name or host ports and stops within 60 s (hands runs back)."""
    worker = compose()["services"]["worker"]
    assert "container_name" not in worker and "ports" not in worker
    grace = duration_s(worker["stop_grace_period"])
    assert 10 < grace <= MAX_WORKER_GRACE_S < VISIBILITY_TIMEOUT_S
    for name, service in compose()["services"].items():
        assert "container_name" not in service, name


def test_compose_flower_has_auth_from_env_on_loopback() -> None:
    """Flower gets its credentials from the env and publishes only on loopback."""
    flower = compose()["services"]["flower"]
    assert "SWITCHBOARD_FLOWER_BASIC_AUTH" in flower["environment"]
    assert all(str(p).startswith("127.0.0.1:") for p in flower["ports"])
    assert "--basic-auth" not in flower["command"], "credentials belong in the env"


def test_compose_flower_without_a_password_does_not_loop() -> None:
    """Unset/empty Flower auth stops `docker compose` up front; a bad pair is retried a few
    times, not forever (`switchboard flower` exits 2 on it)."""
    flower = compose()["services"]["flower"]
    auth = flower["environment"]["SWITCHBOARD_FLOWER_BASIC_AUTH"]
    assert re.fullmatch(r"\$\{SWITCHBOARD_FLOWER_BASIC_AUTH:\?[^}]+\}", auth), auth
    policy, _, retries = flower["restart"].partition(":")
    assert policy == "on-failure" and 1 <= int(retries) <= 5


# --- deploy/Dockerfile ----------------------------------------------------------------------


def test_dockerfile_is_multi_stage_from_pyproject() -> None:
    """A builder stage installs from pyproject.toml into a venv; runtime copies the venv."""
    steps = dockerfile_instructions()
    froms = [args for kw, args in steps if kw == "FROM"]
    assert froms == ["python:3.11-slim AS builder", "python:3.11-slim AS runtime"]
    runtime_at = next(i for i, (kw, _) in enumerate(steps) if kw == "FROM" and i > 0)
    builder, runtime = steps[:runtime_at], steps[runtime_at:]
    copies = [args for kw, args in builder if kw == "COPY"]
    assert any("pyproject.toml" in c for c in copies) and any(c.startswith("src ") for c in copies)
    runs = " ".join(args for kw, args in builder if kw == "RUN")
    assert "python -m venv /opt/venv" in runs and "pip wheel" in runs and "pip install" in runs
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in runtime
    assert not any(kw == "RUN" and "pip " in args for kw, args in runtime)


def test_dockerfile_runtime_is_non_root_with_the_switchboard_entrypoint() -> None:
    """Non-root USER, ENTRYPOINT switchboard, CMD api on 0.0.0.0, EXPOSE 8780; no
    image-wide HEALTHCHECK (it would probe the api in worker, beat and flower containers)."""
    steps = dockerfile_instructions()
    by_kw: dict[str, list[str]] = {}
    for kw, args in steps:
        by_kw.setdefault(kw, []).append(args)
    user = by_kw["USER"][-1].split(":")[0]
    assert user not in {"root", "0"}
    assert json.loads(by_kw["ENTRYPOINT"][-1]) == ["switchboard"]
    cmd = json.loads(by_kw["CMD"][-1])
    assert cmd[:3] == ["api", "--host", "0.0.0.0"]
    check_cli(cmd, "Dockerfile CMD")
    assert "8780" in by_kw["EXPOSE"][-1].split()
    assert "HEALTHCHECK" not in by_kw


def test_dockerfile_entrypoint_is_the_packaged_console_script() -> None:
    """`switchboard` is pyproject's console script, and the image copies what it builds."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["switchboard"] == "switchboard.cli:main"
    assert any(dep.startswith("flower") for dep in project["dependencies"])
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    for kept in ("!pyproject.toml", "!README.md", "!src/"):
        assert kept in ignore


# --- deploy/k8s -----------------------------------------------------------------------------


def test_k8s_manifests_validate_against_kubernetes_schemas() -> None:
    """Every built-in object validates (strict) against the bundled Kubernetes schemas."""
    checked = 0
    for filename, doc in manifests():
        if doc["apiVersion"].startswith("keda.sh/"):
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{filename} {doc['kind']} (k8s {version}): {path}: {exc.message}")
        checked += 1
    assert checked >= 12


def test_k8s_validator_is_strict() -> None:
    """The validator rejects a misspelled field (so passing means something)."""
    deployment = copy.deepcopy(objects("Deployment")["worker"])
    pod_spec(deployment)["terminationGracePeriodSecond"] = 3700
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def test_keda_scaledobject_validates_against_the_crd_schema() -> None:
    """The ScaledObject validates (strict) against KEDA's CRD schema; its scaler keys exist."""
    validator = keda_validator()
    [scaled] = objects("ScaledObject").values()
    errors = sorted(validator.iter_errors(scaled), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    typos = [copy.deepcopy(scaled) for _ in range(3)]
    typos[0]["spec"]["minReplicaCont"] = 1
    typos[1]["spec"]["triggers"][0]["metadata"]["listLength"] = 16  # must be a string
    behavior = typos[2]["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    behavior["scaleDown"]["stabilisationWindowSeconds"] = 60
    for typo in typos:
        assert not validator.is_valid(typo)
    for trigger in scaled["spec"]["triggers"]:
        assert set(trigger["metadata"]) <= KEDA_REDIS_METADATA


def test_keda_scales_workers_on_the_runs_queue() -> None:
    """KEDA scales the worker Deployment on the sb.runs list, never to zero, slowly down."""
    [scaled] = objects("ScaledObject").values()
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == "worker" in objects("Deployment")
    assert spec["minReplicaCount"] >= 1 and spec["maxReplicaCount"] > spec["minReplicaCount"]
    assert spec["cooldownPeriod"] >= 600
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    [trigger] = spec["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "redis"
    assert meta["listName"] == RUNS_QUEUE
    assert int(meta["listLength"]) >= 1 and int(meta["activationListLength"]) >= 0
    namespace = yaml.safe_load((K8S / "kustomization.yaml").read_text())["namespace"]
    assert meta["address"] == f"redis-0.redis.{namespace}.svc.cluster.local:6379"
    text = (K8S / "keda-scaledobject.yaml").read_text()
    assert "prefetched" in text and "no copy" in text  # what queue length can't see


def test_k8s_commands_and_probes_are_real_cli_commands() -> None:
    """Container args and exec probes that run switchboard parse with the real CLI."""
    ran = set()
    for filename, doc in manifests():
        if doc["kind"] not in {"Deployment", "StatefulSet"}:
            continue
        for container in pod_spec(doc)["containers"]:
            where = f"{filename} {container['name']}"
            if container["image"].startswith("switchboard"):
                assert "command" not in container, f"{where}: keep the image's entrypoint"
                ran.add(check_cli(container["args"], f"{where} args"))
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                argv = container.get(probe, {}).get("exec", {}).get("command")
                if argv and argv[0] == "switchboard":
                    check_cli(argv[1:], f"{where} {probe}")
    assert ran == SWITCHBOARD_SERVICES


def test_k8s_deployments_have_the_required_shape() -> None:
    """api x2 with probes, worker stops within 60 s, per-role liveness (worker pings itself,
    beat's heartbeat), one beat (Recreate), one flower."""
    deployments = objects("Deployment")
    assert set(deployments) == SWITCHBOARD_SERVICES
    api = deployments["api"]
    assert api["spec"]["replicas"] == 2
    [api_container] = pod_spec(api)["containers"]
    assert api_container["readinessProbe"] and api_container["livenessProbe"]
    worker = pod_spec(deployments["worker"])
    assert 10 < worker["terminationGracePeriodSeconds"] <= MAX_WORKER_GRACE_S
    assert worker["containers"][0]["livenessProbe"]["exec"]["command"] == [
        "switchboard",
        "check-health",
        "--worker",
    ]
    assert pod_spec(deployments["beat"])["containers"][0]["livenessProbe"]["exec"]["command"] == [
        "switchboard",
        "check-health",
        "--beat",
    ]
    assert "--api" in api_container["livenessProbe"]["exec"]["command"]
    beat = deployments["beat"]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"
    assert deployments["flower"]["spec"]["replicas"] == 1


def test_k8s_pods_that_count_are_annotated_for_scraping() -> None:
    """Each worker serves its own metrics on the port its pod is annotated with (set as
    SWITCHBOARD_METRICS_PORT, on every interface); each api on its /metrics port."""
    deployments = objects("Deployment")
    for name, port in (("worker", None), ("api", 8780)):
        notes = deployments[name]["spec"]["template"]["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
        if port is not None:
            assert notes["prometheus.io/port"] == str(port)
    worker = deployments["worker"]
    [container] = pod_spec(worker)["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    annotated = worker["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"]
    assert env["SWITCHBOARD_METRICS_PORT"] == annotated
    assert env["SWITCHBOARD_HOST"] == "0.0.0.0"
    assert {"name": "metrics", "containerPort": int(annotated)} in container["ports"]
    assert Settings(metrics_port=int(annotated)).metrics_port == int(annotated)


def test_k8s_redis_is_a_durable_statefulset_with_a_headless_service() -> None:
    """Redis: StatefulSet with a PVC, AOF and noeviction, a headless Service; no Cluster."""
    [redis] = objects("StatefulSet").values()
    args = " ".join(pod_spec(redis)["containers"][0]["args"])
    for flag in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert flag in args
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    service = objects("Service")[redis["spec"]["serviceName"]]
    assert service["spec"]["clusterIP"] == "None"
    text = (K8S / "redis.yaml").read_text()
    assert "Sentinel" in text and "Redis Cluster" in text


def test_k8s_references_resolve() -> None:
    """envFrom, config volumes, Service selectors/ports and PDB selectors point at real things."""
    configmaps, secrets = objects("ConfigMap"), objects("Secret")
    workloads = {**objects("Deployment"), **objects("StatefulSet")}
    for name, obj in workloads.items():
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        spec = pod_spec(obj)
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                cm = configmaps[volume["configMap"]["name"]]
                assert all(item["key"] in cm["data"] for item in volume["configMap"]["items"])
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps, name
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, name
    for name, service in objects("Service").items():
        selected = [
            w
            for w in workloads.values()
            if service["spec"]["selector"].items()
            <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, name
        ports = {p["name"] for c in pod_spec(selected[0])["containers"] for p in c["ports"]}
        assert all(p["targetPort"] in ports for p in service["spec"]["ports"]), name
    assert {"api", "flower", "redis"} <= set(objects("Service"))
    budgets = objects("PodDisruptionBudget")
    assert {"worker", "api"} <= set(budgets)
    for name, pdb in budgets.items():
        labels = workloads[name]["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    flower_env = {
        s["secretRef"]["name"]
        for s in pod_spec(objects("Deployment")["flower"])["containers"][0]["envFrom"]
        if "secretRef" in s
    }
    assert any("SWITCHBOARD_FLOWER_BASIC_AUTH" in secrets[s]["stringData"] for s in flower_env)
    assert "SWITCHBOARD_TOKEN" in secrets["switchboard-secrets"]["stringData"]


def test_k8s_configmap_holds_a_valid_config_mounted_where_settings_point() -> None:
    """The ConfigMap's JSON5 config loads and is mounted at SWITCHBOARD_CONFIG."""
    [cm] = objects("ConfigMap").values()
    config = parse_config(json5.loads(cm["data"]["switchboard.json5"]))
    assert config.runs.timeout_seconds > 0
    target = Path(cm["data"]["SWITCHBOARD_CONFIG"])
    assert cm["data"]["SWITCHBOARD_REDIS_URL"].startswith("redis://redis-0.redis:6379")
    for name, deployment in objects("Deployment").items():
        mounts = pod_spec(deployment)["containers"][0]["volumeMounts"]
        assert any(Path(m["mountPath"]) == target.parent for m in mounts), name


def test_kustomization_lists_every_manifest() -> None:
    """kustomization.yaml lists exactly the manifest files in deploy/k8s."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    images = {image["name"] for image in kustomization["images"]}
    used = {
        c["image"].split(":")[0]
        for _, doc in manifests()
        if doc["kind"] == "Deployment"
        for c in pod_spec(doc)["containers"]
    }
    assert used <= images


def test_deploy_readme_covers_the_pieces() -> None:
    """deploy/README.md explains compose, the image, k8s, KEDA, Flower and Redis choices."""
    text = (ROOT / "deploy" / "README.md").read_text()
    for topic in ("docker compose", "--scale worker", "KEDA", "Flower", "Sentinel", "Cluster"):
        assert topic in text, topic
    for command in re.findall(r"`switchboard ([a-z-]+)", text):
        assert command in cli_commands(), command
