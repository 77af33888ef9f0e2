"""The deployment files against the code they deploy: what they set, mount, probe,
scrape and chart must be what the API and the workers read, serve and register."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from producer_api.metrics import ApiMetrics
from producer_api.routes.health import router as api_health_router
from producer_api.settings import ApiSettings
from queue_schemas import Names
from worker.service.health import health_app
from worker.service.metrics import WorkerMetrics
from worker.service.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
OUR_IMAGES = re.compile(r"^(ghcr\.io/genfleet/)?genfleet:")


def _documents(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _k8s() -> dict[tuple[str, str], dict]:
    """Every manifest by (kind, name)."""
    found = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in _documents(path):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def _compose() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _setting_names(settings: type) -> set[str]:
    return {f"GENFLEET_{name.upper()}" for name in settings.model_fields}


API_ENV, WORKER_ENV = _setting_names(ApiSettings), _setting_names(WorkerSettings)


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _env(container: dict) -> dict[str, str | None]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


def test_every_yaml_and_json_file_parses() -> None:
    paths = [COMPOSE, *DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")]
    assert len(paths) >= 7
    for path in paths:
        assert _documents(path), path
    for path in DEPLOY.rglob("*.json"):
        assert json.loads(path.read_text())


def test_every_variable_set_is_a_setting_of_what_reads_it() -> None:
    services = _compose()
    reads = {
        "api": API_ENV,
        "batch-runner": API_ENV,
        "worker": WORKER_ENV,
        "worker-gpu": WORKER_ENV,
    }
    for name, known in reads.items():
        unknown = set(services[name]["environment"]) - known
        assert not unknown, f"compose {name}: {unknown}"
    manifests = _k8s()
    shared = set(manifests[("ConfigMap", "genfleet")]["data"])
    assert not shared - (API_ENV & WORKER_ENV)
    deployments = (
        ("genfleet-api", API_ENV),
        ("genfleet-batch-runner", API_ENV),
        ("genfleet-worker", WORKER_ENV),
    )
    for deployment, known in deployments:
        container = _container(manifests[("Deployment", deployment)])
        assert not set(_env(container)) - known, deployment
        assert container["envFrom"] == [{"configMapRef": {"name": "genfleet"}}]


def test_every_file_built_or_mounted_exists() -> None:
    for name, service in _compose().items():
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source}"
    dockerfile = (ROOT / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), line
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.M))
    assert {"cpu", "cuda"} <= targets
    assert {s["build"]["target"] for s in _compose().values() if "build" in s} <= targets
    provider = _documents(DEPLOY / "grafana/provisioning/dashboards/genfleet.yml")[0]
    grafana_mounts = dict(v.split(":")[:2][::-1] for v in _compose()["grafana"]["volumes"])
    dashboards = grafana_mounts[provider["providers"][0]["options"]["path"]]
    assert list((ROOT / dashboards).glob("*.json"))


def _pinned(image: str) -> bool:
    name, _, tag = image.rpartition(":")
    return bool(name) and tag != "latest" and any(c.isdigit() for c in tag)


def test_every_image_is_pinned() -> None:
    images = [s["image"] for s in _compose().values()]
    images += [_container(d)["image"] for (kind, _), d in _k8s().items() if kind == "Deployment"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.M))
    images += [i for i in re.findall(r"^FROM (\S+)", dockerfile, re.M) if i not in stages]
    assert len(images) >= 10
    for image in images:
        if OUR_IMAGES.match(image) and "/" not in image:
            continue  # built here by compose (genfleet:cpu, genfleet:cuda)
        assert _pinned(image), image


def _worker_routes() -> set[str]:
    app = health_app(CollectorRegistry(), lambda: None, lambda: None)
    return {route.path for route in app.routes}  # type: ignore[attr-defined]


def test_scrape_targets_and_probes_match_what_the_code_serves() -> None:
    services = _compose()
    metrics_port = int(services["worker"]["environment"]["GENFLEET_METRICS_PORT"])
    api_port = int(services["api"]["environment"]["GENFLEET_PORT"])
    scrape = _documents(DEPLOY / "prometheus/prometheus.yml")[0]["scrape_configs"]
    by_job = {job["job_name"]: job["dns_sd_configs"][0] for job in scrape}
    assert by_job["genfleet-api"]["port"] == api_port
    assert by_job["genfleet-worker"]["port"] == metrics_port
    workers = {name for name, service in services.items() if service.get("command") == ["worker"]}
    assert workers >= {"worker", "worker-gpu", "worker-second-model"}
    assert set(by_job["genfleet-worker"]["names"]) == workers
    assert by_job["genfleet-api"]["names"] == ["api"]
    for worker in workers:
        assert int(services[worker]["environment"]["GENFLEET_METRICS_PORT"]) == metrics_port
    worker_routes = _worker_routes()
    api_routes = {route.path for route in api_health_router.routes}  # type: ignore[attr-defined]
    for name, routes, port in (("api", api_routes, api_port), ("worker", worker_routes, 9400)):
        probe = " ".join(services[name]["healthcheck"]["test"])
        path = re.search(rf"127\.0\.0\.1:{port}(/\w+)", probe)
        assert path and path.group(1) in routes, probe
    manifests = _k8s()
    for deployment, routes in (("genfleet-api", api_routes), ("genfleet-worker", worker_routes)):
        pod = manifests[("Deployment", deployment)]["spec"]["template"]
        container = _container(manifests[("Deployment", deployment)])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        env = _env(container)
        served = int(env.get("GENFLEET_METRICS_PORT") or env["GENFLEET_PORT"])  # type: ignore[arg-type]
        assert int(pod["metadata"]["annotations"]["prometheus.io/port"]) == served
        assert pod["metadata"]["annotations"]["prometheus.io/path"] in routes
        probes = [container[k] for k in container if k.endswith("Probe")]
        assert len(probes) >= 2
        for probe in probes:
            path, _, query = probe["httpGet"]["path"].partition("?")
            assert path in routes and query in ("", "fleet=false")
            assert ports[probe["httpGet"]["port"]] == served


def test_workers_get_longer_to_stop_than_they_drain() -> None:
    drain = WorkerSettings.model_fields["drain_deadline_s"].default
    for name in ("worker", "worker-gpu"):
        grace = _compose()[name]["stop_grace_period"]
        assert int(grace.rstrip("s")) > drain
    deployment = _k8s()[("Deployment", "genfleet-worker")]
    drain_here = float(_env(_container(deployment))["GENFLEET_DRAIN_DEADLINE_S"])  # type: ignore[arg-type]
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain_here


def test_the_api_and_the_batch_runner_share_one_files_volume() -> None:
    manifests = _k8s()
    claim = manifests[("PersistentVolumeClaim", "genfleet-files")]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for deployment in ("genfleet-api", "genfleet-batch-runner"):
        spec = manifests[("Deployment", deployment)]["spec"]["template"]["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
                  for v in spec["volumes"] if "persistentVolumeClaim" in v}  # fmt: skip
        (container,) = spec["containers"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        files_dir = _env(container)["GENFLEET_FILES_DIR"]
        assert [mounts[name] for name, c in claims.items() if c == "genfleet-files"] == [files_dir]
    runner = manifests[("Deployment", "genfleet-batch-runner")]["spec"]
    assert runner["replicas"] == 1 and runner["strategy"]["type"] == "Recreate"
    services = _compose()
    for name in ("api", "batch-runner"):
        assert (
            f"files-data:{services[name]['environment']['GENFLEET_FILES_DIR']}"
            in (services[name]["volumes"])
        )


def test_keda_scales_each_models_workers_on_their_groups_two_lanes() -> None:
    manifests = _k8s()
    config = manifests[("ConfigMap", "genfleet")]["data"]
    scaled_objects = [doc for (kind, _), doc in manifests.items() if kind == "ScaledObject"]
    assert len(scaled_objects) >= 2  # the default model's workers and a second model's
    for scaled in scaled_objects:
        target = manifests[("Deployment", scaled["spec"]["scaleTargetRef"]["name"])]
        names = Names().for_model(_env(_container(target)).get("GENFLEET_SERVED_MODEL_NAME"))
        triggers = scaled["spec"]["triggers"]
        assert [trigger["metadata"]["topic"] for trigger in triggers] == list(names.lanes)
        for trigger in triggers:
            assert trigger["type"] == "kafka"
            assert trigger["metadata"]["consumerGroup"] == names.consumer_group
            assert trigger["metadata"]["bootstrapServers"] == config["GENFLEET_KAFKA_BOOTSTRAP"]
            assert int(trigger["metadata"]["lagThreshold"]) >= 1
        assert scaled["spec"]["maxReplicaCount"] <= int(config["GENFLEET_JOBS_PARTITIONS"])


def _registered_samples() -> set[str]:
    registries = [WorkerMetrics(CollectorRegistry(), "m", 2048).registry, ApiMetrics().registry]
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {
        family.name + suffix
        for registry in registries
        for family in registry.collect()
        for suffix in suffixes[family.type]
    }


@pytest.mark.parametrize("dashboard", sorted((DEPLOY / "grafana/dashboards").glob("*.json")))
def test_every_metric_the_dashboard_queries_is_registered(dashboard: Path) -> None:
    panels = json.loads(dashboard.read_text())["panels"]
    queried = {
        name
        for panel in panels
        for target in panel["targets"]
        for name in re.findall(r"genfleet:[a-z0-9_]+", target["expr"])
    }
    assert len(queried) >= 15
    assert queried <= _registered_samples(), queried - _registered_samples()
    assert all(panel["datasource"]["uid"] == "prometheus" for panel in panels)
    datasource = _documents(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")[0]
    assert datasource["datasources"][0]["uid"] == "prometheus"
