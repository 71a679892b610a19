"""A local Airflow cluster on the CeleryExecutor, from the real components, in one folder.

    python -m training.airflow.local_cluster up --dir D [--workers 2] [--workdir W] [--no-schedules]
    set -a; . D/airflow.env; set +a        # then any `airflow ...` command talks to this cluster
    python -m training.airflow.local_cluster down --dir D

(``docker/celery-cluster`` is the same script.) It starts, each as its own process group with its log in
``D/logs/<name>.log``:

* **PostgreSQL** (Debian's ``postgresql``: ``initdb`` + ``pg_ctl``) as the metadata database and the
  Celery result backend, on a free loopback port, password (scram) auth;
* **Redis** (Debian's ``redis-server``) as the Celery broker, on a free loopback port, with a password;
* the Airflow **API server** (which also serves the Task Execution API the workers call), the
  **scheduler** and the **DAG processor**;
* ``--workers`` **Celery workers** (``apache-airflow-providers-celery``), each with its own working
  directory ``D/worker-<i>`` and its own name: task instances record it as their hostname
  (:func:`worker_hostname`), so one can tell which worker ran what. Each takes one task at a time
  (concurrency 1, prefetch 1), so parallel tasks spread over the workers.

Secrets (database and Redis passwords, Fernet key, JWT and API secrets, the admin password) are
generated into ``D/secrets`` (mode 0700, files 0600). None is on a command line or in an environment
variable: Airflow reads them with its ``*_CMD`` settings (``cat <file>``) and reaches PostgreSQL
through a password-free URI, libpq reading the pgpass file ``PGPASSFILE`` names -- as in
docker/docker-compose.yml. ``D/airflow.env`` (0600) is the client environment (no secret in it).

PostgreSQL refuses to run as root: as root, its data folder is a fresh ``/tmp/seqenc-pg-*`` owned
by the ``postgres`` user (the Debian package creates it) and its commands run through ``runuser``.

Everything listens on 127.0.0.1, or on ``--host ADDR``: then PostgreSQL also accepts (password)
connections from the address's subnet, and ``worker --dir D --name N`` -- run on another host that
sees ``D`` and the work directory at the same paths (an NFS mount, say) -- adds a Celery worker
there. docs/operations.md ("Workers on other hosts") shows both, and the run that was started.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DAGS = REPO / "dags"
DATABASE, DB_USER = "airflow", "seqenc"


class ClusterError(RuntimeError):
    """A component did not start (the message names it and the tail of its log)."""


def worker_hostname() -> str:
    """Airflow's ``[core] hostname_callable`` for the cluster: ``$SEQENC_WORKER_NAME`` (each worker
    has its own), else the machine's FQDN -- several workers on one host stay distinguishable."""
    return os.environ.get("SEQENC_WORKER_NAME") or socket.getfqdn()


def postgres_tool(name: str) -> str | None:
    """A PostgreSQL server program (``initdb``, ``pg_ctl``): on PATH, else Debian's
    ``/usr/lib/postgresql/<version>/bin`` (newest version), else None."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    return str(versions[-1]) if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _secret_file(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _wait(check, what: str, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    raise ClusterError(f"{what} did not come up within {timeout:.0f} s" + (f"; its log ends:\n{_tail(log)}" if log else ""))


class LocalCluster:
    """The cluster in folder ``dir``: :meth:`up` starts it, :meth:`down` stops it, :meth:`env` is
    what an Airflow client (CLI, Python) needs to talk to it. Its state is ``dir/cluster.json``."""

    def __init__(self, dir: str | os.PathLike):
        self.dir = Path(dir).resolve()
        self.secrets = self.dir / "secrets"
        self.logs = self.dir / "logs"
        self.state_path = self.dir / "cluster.json"
        self.state: dict = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}

    # -- the environment every Airflow process (and client) of the cluster shares --------------
    def env(self) -> dict[str, str]:
        s, ports = self.secrets, self.state["ports"]
        host = self.state["host"]
        db = f"{DB_USER}@{host}:{ports['postgres']}/{DATABASE}"
        return {
            "AIRFLOW_HOME": str(self.dir / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": self.state["dags"],
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": "training.airflow.local_cluster.worker_hostname",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{host}:{ports['api']}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{db}",
            "PGPASSFILE": str(s / "pgpass"),
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://{db}",
            "AIRFLOW__CELERY__BROKER_URL_CMD": f"cat {s / 'broker_url'}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
            "AIRFLOW__CORE__FERNET_KEY_CMD": f"cat {s / 'fernet_key'}",
            "AIRFLOW__API_AUTH__JWT_SECRET_CMD": f"cat {s / 'jwt_secret'}",
            "AIRFLOW__API__SECRET_KEY_CMD": f"cat {s / 'api_secret_key'}",
            "AIRFLOW__API__PORT": str(ports["api"]),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(s / "passwords.json"),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.dir / "airflow" / "logs"),
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(not self.state.get("no_schedules", False)),
            **({"SEQENC_WORKDIR": self.state["workdir"]} if self.state["workdir"] else {}),
            **self.state.get("extra_env", {}),
        }

    def client_env(self, extra: dict | None = None) -> dict[str, str]:
        """This process's environment with the cluster's Airflow settings in place of its own
        (an Airflow client: the CLI, training.airflow.cluster_client)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PGPASS"))}
        return {**base, **self.env(), **(extra or {})}

    def _start(self, name: str, argv: list[str], cwd: Path | None = None, env: dict | None = None) -> None:
        self.logs.mkdir(exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(argv, cwd=cwd or self.dir, env=env or self.client_env(), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.state["pids"][name] = proc.pid
        self._save()

    def _save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=2))

    def _alive(self, name: str) -> bool:
        pid = self.state.get("pids", {}).get(name)
        if not pid:
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return not Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"

    # -- PostgreSQL --------------------------------------------------------------------------
    def _pg(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run(as_postgres + argv, capture_output=True, text=True, **kw)

    def _start_postgres(self, password: str) -> None:
        initdb, pg_ctl = postgres_tool("initdb"), postgres_tool("pg_ctl")
        if not (initdb and pg_ctl):
            raise ClusterError("PostgreSQL's initdb / pg_ctl not found; install Debian's postgresql package")
        if os.geteuid() == 0:  # initdb refuses root: a folder the postgres user owns, reachable by it
            pg = Path(tempfile.mkdtemp(prefix="seqenc-pg-"))
            owner = pwd.getpwnam("postgres")
            os.chown(pg, owner.pw_uid, owner.pw_gid)
        else:
            pg = self.dir / "postgres"
            pg.mkdir(mode=0o700)
        self.state["postgres_dir"] = str(pg)
        self._save()
        pwfile = pg / "pwfile"
        _secret_file(pg, "pwfile", password + "\n")
        if os.geteuid() == 0:
            os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
        init = self._pg([initdb, "-D", str(pg / "data"), "-U", DB_USER, "--auth=scram-sha-256",
                         f"--pwfile={pwfile}", "-E", "UTF8"], timeout=180)
        pwfile.unlink()
        if init.returncode:
            raise ClusterError(f"initdb failed: {init.stdout[-2000:]}{init.stderr[-2000:]}")
        if self.state["host"] != "127.0.0.1":  # workers on other hosts of the address's subnet, with the password
            hba = pg / "data" / "pg_hba.conf"
            self._pg(["sh", "-c", f"echo 'host all {DB_USER} samenet scram-sha-256' >> {hba}"], timeout=30)
        port = self.state["ports"]["postgres"]
        start = self._pg([pg_ctl, "-D", str(pg / "data"), "-l", str(pg / "postgres.log"), "-w", "-t", "120",
                          "-o", f"-p {port} -k {pg} -c listen_addresses={self.state['host']}", "start"], timeout=180)
        if start.returncode:
            raise ClusterError(f"PostgreSQL did not start: {start.stderr[-1000:]}\n{_tail(pg / 'postgres.log')}")
        created = subprocess.run([postgres_tool("createdb") or "createdb", "-h", self.state["host"], "-p", str(port), "-U", DB_USER, DATABASE],
                                 env={**os.environ, "PGPASSFILE": str(self.secrets / "pgpass")},
                                 capture_output=True, text=True, timeout=60)
        if created.returncode:
            raise ClusterError(f"createdb {DATABASE} failed: {created.stderr[-1000:]}")

    # -- Redis --------------------------------------------------------------------------------
    def _start_redis(self, password: str) -> None:
        if not shutil.which("redis-server"):
            raise ClusterError("redis-server is not on PATH; install Debian's redis-server package")
        folder = self.dir / "redis"
        folder.mkdir(mode=0o700)
        conf = _secret_file(self.secrets, "redis.conf",  # the password in a 0600 file, not on a command line
                            f"bind {self.state['host']}\nport {self.state['ports']['redis']}\ndir {folder}\nsave \"\"\n"
                            f"appendonly no\nrequirepass {password}\n")
        self._start("redis", ["redis-server", str(conf)])

        def ponged() -> bool:
            try:
                with socket.create_connection((self.state["host"], self.state["ports"]["redis"]), timeout=2) as c:
                    c.sendall(f"AUTH {password}\r\nPING\r\n".encode())
                    return b"+PONG" in c.recv(100)
            except OSError:
                return False

        _wait(ponged, "Redis", 30, self.logs / "redis.log")

    # -- the whole cluster ---------------------------------------------------------------------
    def up(self, workers: int = 2, workdir: str | None = None, dags: str | os.PathLike = DEFAULT_DAGS,
           no_schedules: bool = False, timeout: float = 300, extra_env: dict | None = None,
           host: str = "127.0.0.1") -> dict:
        """Start every component; returns :meth:`describe`. The folder must be new or empty.
        ``extra_env``: more environment for every component (no secrets: it is kept in cluster.json)."""
        if self.state_path.exists():
            raise ClusterError(f"{self.dir} already holds a cluster; run `down` first or use another --dir")
        if workers < 1:
            raise ClusterError("--workers must be at least 1")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.secrets.mkdir(mode=0o700, exist_ok=True)
        self.state = {"pids": {}, "workers": [f"worker-{i + 1}" for i in range(workers)], "dags": str(Path(dags).resolve()),
                      "workdir": str(Path(workdir).resolve()) if workdir else None, "no_schedules": no_schedules,
                      "extra_env": dict(extra_env or {}), "host": host,
                      "ports": {"postgres": _free_port(), "redis": _free_port(), "api": _free_port()}}
        self._save()
        try:
            self._write_secrets()
            self._start_postgres(self._read_secret("pg_password"))
            self._start_redis(self._read_secret("redis_password"))
            self._write_client_env()
            migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=self.client_env(),
                                     capture_output=True, text=True, timeout=timeout)
            if migrate.returncode:
                raise ClusterError(f"airflow db migrate failed: {(migrate.stdout + migrate.stderr)[-3000:]}")
            airflow = [sys.executable, "-m", "airflow"]
            self._start("api-server", airflow + ["api-server", "--host", self.state["host"], "--port",
                                                 str(self.state["ports"]["api"]), "--workers", "1"])
            self._start("scheduler", airflow + ["scheduler"])
            self._start("dag-processor", airflow + ["dag-processor"])
            for name in self.state["workers"]:
                self._start_worker(name)
            _wait(self._api_healthy, "the Airflow API server", timeout, self.logs / "api-server.log")
            for name in self.state["workers"]:
                _wait(lambda n=name: self._ready(n), f"Celery {name}", timeout, self.logs / f"{name}.log")
        except BaseException:
            self.down()
            raise
        return self.describe()

    def _start_worker(self, name: str) -> None:
        home = self.dir / name
        home.mkdir(exist_ok=True)
        self._start(name, [sys.executable, "-m", "airflow", "celery", "worker", "--celery-hostname", f"{name}@%h",
                           "--concurrency", "1", "--skip-serve-logs"],  # the log folder is shared (one folder D)
                    cwd=home, env=self.client_env({"SEQENC_WORKER_NAME": name}))

    def add_worker(self, name: str, timeout: float = 300) -> dict:
        """Start one more Celery worker, here -- on this host, or on another one that sees this
        folder and the work directory at the same paths and reaches the cluster's ``--host``."""
        from parsers.names import check_name

        check_name(name, "worker name")
        if name in self.state["pids"]:
            raise ClusterError(f"a process named {name} is already in this cluster; choose another --name")
        self.state["workers"].append(name)
        self._start_worker(name)
        _wait(lambda: self._ready(name), f"Celery {name}", timeout, self.logs / f"{name}.log")
        return self.describe()

    def _write_secrets(self) -> None:
        s = self.secrets
        values = {"pg_password": secrets.token_urlsafe(24), "redis_password": secrets.token_urlsafe(24),
                  "jwt_secret": secrets.token_urlsafe(32), "api_secret_key": secrets.token_urlsafe(32),
                  "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode()}
        for name, value in values.items():
            _secret_file(s, name, value)
        _secret_file(s, "pgpass", f"{self.state['host']}:{self.state['ports']['postgres']}:*:{DB_USER}:{values['pg_password']}\n")
        _secret_file(s, "broker_url", f"redis://:{values['redis_password']}@{self.state['host']}:{self.state['ports']['redis']}/0")
        _secret_file(s, "passwords.json", json.dumps({"admin": secrets.token_urlsafe(16)}))

    def _read_secret(self, name: str) -> str:
        return (self.secrets / name).read_text().strip()

    def _write_client_env(self) -> None:
        lines = [f"{k}={v!r}" if " " in v else f"{k}={v}" for k, v in self.env().items()]
        _secret_file(self.dir, "airflow.env", "\n".join(lines) + "\n")

    def _ready(self, name: str) -> bool:
        """Celery prints ``celery@<name>... ready.`` once it consumes; a worker that exited fails at once."""
        if not self._alive(name):
            raise ClusterError(f"Celery {name} exited; its log ends:\n{_tail(self.logs / f'{name}.log')}")
        return "ready." in _tail(self.logs / f"{name}.log", 20000)

    def _api_healthy(self) -> bool:
        if not self._alive("api-server"):
            raise ClusterError(f"the API server exited; its log ends:\n{_tail(self.logs / 'api-server.log')}")
        try:
            with urllib.request.urlopen(f"http://{self.state['host']}:{self.state['ports']['api']}/api/v2/monitor/health",
                                        timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def describe(self) -> dict:
        return {"dir": str(self.dir), "api": f"http://{self.state['host']}:{self.state['ports']['api']}",
                "env_file": str(self.dir / "airflow.env"), "workers": self.state["workers"],
                "processes": {name: {"pid": pid, "alive": self._alive(name)} for name, pid in self.state["pids"].items()}}

    def down(self, grace: float = 20.0) -> None:
        """Stop every process group, PostgreSQL, and remove PostgreSQL's folder; logs stay."""
        pids = self.state.get("pids", {})
        for pid in pids.values():
            try:
                os.killpg(pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        while any(self._alive(n) for n in pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        for name, pid in pids.items():
            if self._alive(name):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        pg = self.state.get("postgres_dir")
        if pg and Path(pg, "data", "postmaster.pid").exists():
            self._pg([postgres_tool("pg_ctl") or "pg_ctl", "-D", str(Path(pg) / "data"), "-m", "fast", "-w", "stop"], timeout=120)
        if pg and os.geteuid() == 0 and Path(pg).parent == Path(tempfile.gettempdir()):
            shutil.rmtree(pg, ignore_errors=True)
        if self.state_path.exists():
            self.state_path.rename(self.dir / "cluster.stopped.json")
        self.state = {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="celery-cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start PostgreSQL, Redis, the API server, scheduler, DAG processor and workers")
    up.add_argument("--dir", required=True, help="the cluster's folder (new or empty)")
    up.add_argument("--workers", type=int, default=2, help="number of Celery workers (default 2)")
    up.add_argument("--workdir", help="SEQENC_WORKDIR of every component (the DAGs' default work directory)")
    up.add_argument("--dags", default=str(DEFAULT_DAGS), help="DAGs folder (default: the repo's dags/)")
    up.add_argument("--no-schedules", action="store_true", help="run triggered DAG runs only (no cron runs)")
    up.add_argument("--host", default="127.0.0.1",
                    help="address PostgreSQL, Redis and the API server listen on (default 127.0.0.1; another "
                         "host's workers need one they can reach)")
    worker = sub.add_parser("worker", help="start one more Celery worker here (this or another host)")
    worker.add_argument("--dir", required=True, help="the cluster's folder (the same path on every host)")
    worker.add_argument("--name", required=True, help="the worker's name (task instances' hostname)")
    for name in ("down", "status"):
        sub.add_parser(name).add_argument("--dir", required=True, help="the cluster's folder")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.dir)
    try:
        if args.command == "up":
            print(json.dumps(cluster.up(args.workers, args.workdir, args.dags, args.no_schedules, host=args.host),
                             indent=2))
        elif not cluster.state:
            raise ClusterError(f"no running cluster in {cluster.dir}; start one with `up --dir {args.dir}`")
        elif args.command == "down":
            cluster.down()
        elif args.command == "worker":
            print(json.dumps(cluster.add_worker(args.name), indent=2))
        else:
            print(json.dumps(cluster.describe(), indent=2))
    except (ClusterError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        logs = f" (logs: {cluster.logs})" if cluster.logs.is_dir() else ""
        print(f"celery-cluster: {str(e).splitlines()[0]}{logs}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
