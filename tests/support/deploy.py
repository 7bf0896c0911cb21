"""The production topology without docker: nginx (Debian's), daphne instances, a private Redis and a
fresh PostgreSQL database, configured from the same files docker/ ships.

    with PostgresDatabase() as db, Nginx(["127.0.0.1:8001", "127.0.0.1:8002"]) as nginx: ...

`render_template` fills docker/nginx/speech.conf.template the way the nginx image's envsubst does
(only the variables given; nginx's own `$variables` stay), and `Nginx` runs it under a minimal main
configuration of its own (temporary paths and logs in a private folder), on a free port.
`dockerfile()` reads docker/Dockerfile's ENV, CMD and HEALTHCHECK so tests can run them here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from .live import PROJECT_ROOT, free_port, port_accepts, wait_for

DOCKER = PROJECT_ROOT / "docker"
NGINX_TEMPLATE = DOCKER / "nginx" / "speech.conf.template"
TLS_TEMPLATE = DOCKER / "nginx" / "tls.conf.template"
NGINX_START_S = 20.0  # hang guard
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"  # Debian's package; /usr/sbin may be off a user's PATH
POSTGRES = {"host": "127.0.0.1", "port": 5432, "user": "postgres", "dbname": "postgres"}


def _postgres_unusable():
    """Why the machine's PostgreSQL cannot serve the tests ("" when it can): they are then skipped, saying so."""
    try:
        psycopg.connect(**POSTGRES, connect_timeout=3).close()
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"no PostgreSQL for user postgres without a password on 127.0.0.1:5432 ({first}); make test starts one (.ci/services)"
        )
    return ""


_POSTGRES_UNUSABLE = _postgres_unusable()
needs_postgres = pytest.mark.skipif(bool(_POSTGRES_UNUSABLE), reason=_POSTGRES_UNUSABLE)


def render_template(path, variables):
    """envsubst with a list of variables: `${NAME}` of those given is replaced, nothing else."""
    text = Path(path).read_text()
    missing = [name for name in re.findall(r"\$\{(\w+)\}", text) if name not in variables]
    assert not missing, f"{path} wants {missing}"
    return string.Template(text).safe_substitute(variables)


class Nginx:
    """Debian's nginx with the shipped template, in the foreground of a subprocess, on a free port.
    `trusted_front`: the address whose X-Forwarded-Proto it keeps (SPEECH_TRUSTED_FRONT)."""

    template = NGINX_TEMPLATE
    scheme = "http"

    def __init__(self, backends, trusted_front="127.0.0.1/32"):
        assert len(backends) == 2, "the template names two backends"
        self.backends = backends
        self.trusted_front = trusted_front
        self.dir = Path(tempfile.mkdtemp(prefix="nginx-test-"))
        self.dir.chmod(0o755)  # workers (nobody, when started as root) write temporary files here
        self.port = None
        self.proc = None

    @property
    def http_url(self):
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def ws_url(self):
        return f"{self.scheme.replace('http', 'ws')}://127.0.0.1:{self.port}/v1/audio/speech/stream"

    @property
    def access_log(self):
        return self.dir / "access.log"

    def variables(self):
        return {
            "SPEECH_LISTEN": f"127.0.0.1:{self.port}",
            "SPEECH_BACKEND_A": self.backends[0],
            "SPEECH_BACKEND_B": self.backends[1],
            "SPEECH_ACCESS_LOG": str(self.access_log),
            "SPEECH_TRUSTED_FRONT": self.trusted_front,
        }

    def configure(self):
        self.port = self.port or free_port()
        site = render_template(self.template, self.variables())
        (self.dir / "speech.conf").write_text(site)
        for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (self.dir / name).mkdir(mode=0o777, exist_ok=True)
            (self.dir / name).chmod(0o777)
        d = self.dir
        (d / "nginx.conf").write_text(f"""
daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 512; }}
http {{
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    include {d}/speech.conf;
}}
""")
        return self

    def command(self, *extra):
        return [NGINX, "-e", str(self.dir / "error.log"), "-p", str(self.dir), "-c", str(self.dir / "nginx.conf"), *extra]

    def test_config(self):
        """`nginx -t`: (exit status, what it said)."""
        done = subprocess.run(self.command("-t"), capture_output=True, text=True, timeout=30)
        return done.returncode, done.stdout + done.stderr

    def start(self):
        self.configure()
        code, said = self.test_config()
        assert code == 0, said
        self.proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + NGINX_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.proc.returncode}: {self.error_log()[-2000:]}")
            if port_accepts("127.0.0.1", self.port):
                return self
            time.sleep(0.02)
        raise RuntimeError(f"nginx did not listen on {self.port}: {self.error_log()[-2000:]}")

    def upstreams(self, method, path):
        """The upstream address of every logged request `METHOD path` (nginx's access log, in order)."""
        pattern = re.compile(rf'"{re.escape(method)} {re.escape(path)}" \d+ \d+ upstream=(\S+)')
        text = self.access_log.read_text() if self.access_log.exists() else ""
        return [match.group(1) for match in pattern.finditer(text)]

    def served_by(self, method, path, send):
        """Calls send() (one request `METHOD path` through nginx) and returns (its result, the upstream
        that served it), once nginx has logged it: it logs a request as it finishes, which may be just
        after the client has read the response, so an earlier line must not be taken for it."""
        before = len(self.upstreams(method, path))
        result = send()
        logged = wait_for(lambda: self.upstreams(method, path)[before:], f"{method} {path} in nginx's access log")
        assert len(logged) == 1, logged
        return result, logged[0]

    def error_log(self):
        path = self.dir / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: nginx's fast shutdown
            self.proc.wait(timeout=20)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return False


class TlsFront(Nginx):
    """docker/nginx/tls.conf.template: HTTPS with a certificate and key (PEM files) in front of `backend`."""

    template = TLS_TEMPLATE
    scheme = "https"

    def __init__(self, backend, cert, key, port=None):
        super().__init__([backend, backend])
        self.backend, self.cert, self.key, self.port = backend, cert, key, port

    def variables(self):
        return {
            "SPEECH_TLS_LISTEN": f"127.0.0.1:{self.port}",
            "SPEECH_TLS_CERT": str(self.cert),
            "SPEECH_TLS_KEY": str(self.key),
            "SPEECH_TLS_BACKEND": self.backend,
            "SPEECH_ACCESS_LOG": str(self.access_log),
        }


def self_signed(folder, names):
    """A self-signed certificate for `names` (DNS names; 127.0.0.1 as an IP too), made with `cryptography`:
    (certificate path, key path), PEM."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    alt = [x509.DNSName(name) for name in names] + [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = Path(folder)
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class PostgresDatabase:
    """A fresh database on the machine's PostgreSQL (127.0.0.1:5432, trust auth), dropped after."""

    def __init__(self):
        self.name = f"speech_deploy_{uuid.uuid4().hex[:12]}"

    @property
    def url(self):
        return f"postgres://{POSTGRES['user']}@{POSTGRES['host']}:{POSTGRES['port']}/{self.name}"

    def _admin(self):
        return psycopg.connect(**POSTGRES, autocommit=True, connect_timeout=10)

    def query(self, statement, *params):
        with psycopg.connect(**{**POSTGRES, "dbname": self.name}, connect_timeout=10) as conn:
            return conn.execute(statement, params).fetchall()

    def __enter__(self):
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        return self

    def __exit__(self, *exc_info):
        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
        return False


def http(method, url, body=None, headers=None, timeout=60.0):
    """(status, body bytes) of one request, error statuses included."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# -- docker/Dockerfile, read for what can be run without docker ------------------------------------


def dockerfile():
    """{"env": {...}, "cmd": [...], "healthcheck": [...], "user": str, "run": [str], "copy": [(src, dst)]}."""
    text = (DOCKER / "Dockerfile").read_text()
    logical = re.sub(r"\\\n\s*", " ", text)  # join continued lines
    facts = {"env": {}, "run": [], "copy": []}
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "ENV":
            facts["env"].update(dict(item.split("=", 1) for item in shlex.split(rest)))
        elif word == "CMD":
            facts["cmd"] = json.loads(rest)
        elif word == "HEALTHCHECK":
            facts["healthcheck"] = json.loads(rest[rest.index(" CMD ") + len(" CMD ") :])
        elif word == "USER":
            facts["user"] = rest.strip()
        elif word == "RUN":
            facts["run"].append(rest)
        elif word == "COPY":
            *sources, dest = shlex.split(rest)
            facts["copy"] += [(source, dest) for source in sources]
        elif word == "WORKDIR":
            facts["workdir"] = rest.strip()
    return facts


def local_environment(extra):
    """This machine's environment with the project's venv first on PATH, so `python` in a shipped
    command is the project's interpreter, plus `extra`."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env
