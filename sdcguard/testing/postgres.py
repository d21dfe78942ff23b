"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` into a fresh temporary directory, a Unix socket
in that directory and a TCP port on 127.0.0.1 chosen free, stopped and deleted afterwards.

The server binaries come from the distribution's package (Debian's ``postgresql``: ``/usr/lib/postgresql/<ver>/bin``;
``$SDCGUARD_PG_BIN`` names another folder). PostgreSQL refuses to run as root, so as root the server runs as the
package's ``postgres`` user (created with ``useradd`` if missing), its directory handed to that user. Every test
gets a schema of its own (:meth:`PostgresServer.fresh_url`), which is cheaper than a database.

    with PostgresServer() as server:
        url = server.fresh_url()          # postgresql://...?options=-csearch_path%3Dt_1
        server.kill()                     # SIGKILL the postmaster: a crash mid-transaction
        server.start()                    # the same data directory, the same socket and port
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Self

__all__ = ["PostgresServer", "ServerUnavailable", "find_bin"]


class ServerUnavailable(RuntimeError):
    """No PostgreSQL server could be started here (the message says why and what to install)."""


def find_bin() -> Path:
    """The folder holding ``initdb`` and ``pg_ctl`` (the newest installed version)."""
    named = os.environ.get("SDCGUARD_PG_BIN")
    candidates = [named] if named else sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    found = shutil.which("initdb")
    if found and not named:
        candidates.append(str(Path(found).parent))
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    raise ServerUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl) found under /usr/lib/postgresql/*/bin or on PATH: "
        "install the distribution's package (apt-get install -y postgresql) or set SDCGUARD_PG_BIN"
    )


def _version_key(path: str) -> float:
    try:
        return float(Path(path).parent.name)
    except ValueError:
        return 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One server; :meth:`start` (also after :meth:`stop` or :meth:`kill`), :meth:`close` deletes it all.

    Args:
        settings: extra ``postgres -c`` settings (``max_connections`` is 250 so a hundred writers fit).
    """

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        self.bin = find_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="sdcguard-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.user = "postgres"
        self._as: list[str] = []
        self._schemas = 0
        self.settings = {
            "max_connections": "250",
            "fsync": "off",  # a test server: a killed process loses nothing, only an OS crash would
            "full_page_writes": "off",
            "shared_buffers": "64MB",
            **(settings or {}),
        }
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", _service_user(), "--"]
            shutil.chown(self.dir, user=_service_user())
        self._run([str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8"])
        self.started = False

    def _run(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        p = subprocess.run([*self._as, *argv], capture_output=True, text=True, timeout=120, **kw)
        if p.returncode != 0:
            raise ServerUnavailable(f"{Path(argv[0]).name} failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
        return p

    def start(self) -> None:
        """Start (or restart) the server and wait until it accepts connections."""
        opts = " ".join(
            [f"-k {self.dir}", f"-p {self.port}", "-c listen_addresses=127.0.0.1"]
            + [f"-c {k}={v}" for k, v in self.settings.items()]
        )
        self._run(
            [
                str(self.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.dir / "log"),
                "-o",
                opts,
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
        self.started = True
        if not self._has_database("sdcguard"):
            self.admin("CREATE DATABASE sdcguard", "postgres")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode`` (``immediate``: no shutdown checkpoint, as after a crash)."""
        if self.started:
            self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])
            self.started = False

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend: the server dies mid-whatever, as in a crash."""
        pid_file = self.data / "postmaster.pid"
        pid = int(pid_file.read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        for p in [pid, *map(int, children)]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        self.started = False

    def url(self, database: str = "sdcguard", *, schema: str | None = None, tcp: bool = False) -> str:
        """A ``postgresql://`` URL of this server (the Unix socket, or with ``tcp`` 127.0.0.1) as its superuser."""
        query = {"user": self.user}
        if not tcp:
            query["host"] = str(self.dir)
        if schema:
            query["options"] = f"-csearch_path={schema}"
        where = f"127.0.0.1:{self.port}" if tcp else f":{self.port}"
        return f"postgresql://{where}/{database}?{urllib.parse.urlencode(query)}"

    def fresh_url(self) -> str:
        """The URL of a new, empty schema: a store of its own for one test."""
        self._schemas += 1
        name = f"t_{os.getpid()}_{self._schemas}"
        self.admin(f"CREATE SCHEMA {name}")
        return self.url(schema=name)

    def admin(self, sql: str, database: str = "sdcguard", params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement as the superuser (autocommit); its rows, if any."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []

    def _has_database(self, name: str) -> bool:
        return bool(self.admin("SELECT 1 FROM pg_database WHERE datname = %s", "postgres", (name,)))

    def close(self) -> None:
        """Stop the server (immediately) and delete its directory."""
        try:
            self.stop("immediate")
        except ServerUnavailable:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()  # a server that started but could not be set up must not outlive us
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _service_user() -> str:
    """The user a root process runs the server as: the package's ``postgres``, created when missing."""
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "postgres"], check=True, capture_output=True)
    return "postgres"
