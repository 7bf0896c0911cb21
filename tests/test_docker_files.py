"""docker/: what can be checked without a Docker engine (none runs here).

The compose file is parsed and its topology checked (services, start order, health checks, the
shared voice volume); the Dockerfile's sources, user and data directory are checked against the
settings; the nginx template is filled in and `nginx -t` judges it. tests/test_deploy.py runs the
same topology, and the Dockerfile's own commands, for real.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .support.deploy import DOCKER, NGINX_TEMPLATE, Nginx, TlsFront, dockerfile, render_template, self_signed
from .support.live import PROJECT_ROOT

WEB = ("web-a", "web-b")


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_the_topology(compose):
    services = compose["services"]
    assert {"postgres", "redis", "migrate", *WEB, "nginx"} <= set(services)
    assert set(compose["volumes"]) >= {"voices", "pgdata"}


def test_the_instances_wait_for_migrate_which_waits_for_postgres(compose):
    services = compose["services"]
    migrate = services["migrate"]
    assert migrate["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in WEB:
        web = services[name]
        assert web["command"] == ["python", "manage.py", "serve"]  # never migrates itself
        assert web["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert web["depends_on"]["postgres"] == web["depends_on"]["redis"] == {"condition": "service_healthy"}
        env = web["environment"]
        assert env["DATABASE_URL"] == migrate["environment"]["DATABASE_URL"]
        assert env["REDIS_URL"].startswith("redis://redis:")
        assert env["SPEECH_INSTANCE_ID"] == name
    assert services["web-a"]["environment"]["SPEECH_INSTANCE_ID"] != services["web-b"]["environment"]["SPEECH_INSTANCE_ID"]
    assert services["nginx"]["depends_on"] == {name: {"condition": "service_healthy"} for name in WEB}


def test_every_long_running_service_has_a_health_check(compose):
    for name, service in compose["services"].items():
        if name == "migrate":  # one-shot: its exit status is what the instances wait for
            assert service["healthcheck"] == {"disable": True}
            continue
        check = service["healthcheck"]
        assert check["test"][0] == "CMD" and len(check["test"]) > 1, name
        assert {"interval", "timeout", "retries"} <= set(check), name
    web_check = compose["services"]["web-a"]["healthcheck"]["test"]
    assert "/health'" in web_check[-1]  # readiness, not /healthz
    assert web_check[1:] == dockerfile()["healthcheck"]  # the same probe as the image's


def test_one_voice_volume_shared_by_every_instance(compose):
    mounts = set()
    for name in WEB:
        web = compose["services"][name]
        media_root = web["environment"]["MEDIA_ROOT"]
        (volume,) = [v for v in web["volumes"] if v.endswith(f":{media_root}")]
        mounts.add(volume)
    assert mounts == {"voices:/data/media"}
    assert dockerfile()["env"]["MEDIA_ROOT"] == "/data/media"  # owned by the server's user in the image


def test_nginx_gets_the_shared_template_and_only_its_own_variables(compose):
    nginx = compose["services"]["nginx"]
    (mount,) = nginx["volumes"]
    source, target, mode = mount.split(":")
    assert (DOCKER / source).resolve() == NGINX_TEMPLATE
    assert target == "/etc/nginx/templates/default.conf.template" and mode == "ro"
    env = nginx["environment"]
    assert env["NGINX_ENVSUBST_FILTER"] == "^SPEECH_"  # nginx's own $variables are never substituted
    render_template(NGINX_TEMPLATE, env)  # every ${VAR} of the template is given
    assert env["SPEECH_BACKEND_A"] == "web-a:8000" and env["SPEECH_BACKEND_B"] == "web-b:8000"


def judged(nginx):
    """`nginx -t` on the configured template: (exit status, what it said, the filled-in site)."""
    nginx.configure()
    try:
        code, said = nginx.test_config()
        return code, said, (nginx.dir / "speech.conf").read_text()
    finally:
        shutil.rmtree(nginx.dir, ignore_errors=True)


def test_the_nginx_template_is_valid_nginx():
    code, said, site = judged(Nginx(["127.0.0.1:8001", "127.0.0.1:8002"]))
    assert code == 0, said
    for directive in (
        "proxy_buffering off;",
        "proxy_read_timeout 1h;",
        "proxy_set_header Upgrade $http_upgrade;",
        "proxy_http_version 1.1;",
    ):
        assert directive in site


def test_the_image_runs_as_tts_which_owns_its_data_directory():
    facts = dockerfile()
    assert facts["user"] == "tts"
    assert facts["env"]["DATABASE_URL"] == "sqlite:////data/db.sqlite3"
    (setup,) = [run for run in facts["run"] if "useradd" in run]
    assert "mkdir -p /data/media" in setup and "chown -R tts:tts /data" in setup
    assert facts["cmd"] == ["sh", "-c", "python manage.py migrate --noinput && exec python manage.py serve"]


def test_the_build_context_holds_what_the_dockerfile_copies_and_no_venv():
    patterns = [
        line.strip()
        for line in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def included(path):
        keep = True
        for pattern in patterns:
            negated = pattern.startswith("!")
            bare = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                keep = negated
        return keep

    for source, _ in dockerfile()["copy"]:
        assert (PROJECT_ROOT / source).exists(), source
        assert included(source), f"{source} is copied but left out of the build context"
    for kept_out in (".venv", ".git", "media", "db.sqlite3", "tests", "bench", "speech/__pycache__"):
        assert not included(kept_out), kept_out
    assert included("speech/voices.py") and included("ttsproject/settings.py")
    assert Path(PROJECT_ROOT / "docker" / "Dockerfile").exists()


# -- refusing to start insecurely (issue 45) ---------------------------------------------------------

DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    not DOCKER_COMPOSE, reason="docker-compose (Debian's package) resolves the compose file; make test installs it"
)
PRODUCTION_ENV = DOCKER / "production.env.example"
FILLED = {
    "DJANGO_SECRET_KEY": "5b0f3c1e9d8a7f6e5d4c3b2a19081726354453627180918a7b6c5d4e3f2a1b0c",
    "POSTGRES_PASSWORD": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "DJANGO_ALLOWED_HOSTS": "tts.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://tts.example.com",
}


def compose_config(env, *profiles):
    """`docker-compose config` (no Docker engine needed) with only `env`: (exit status, resolved file or error)."""
    args = [DOCKER_COMPOSE, "-f", str(DOCKER / "compose.yaml"), *(f"--profile={p}" for p in profiles), "config"]
    done = subprocess.run(args, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=60)
    return done.returncode, (yaml.safe_load(done.stdout) if done.returncode == 0 else done.stdout + done.stderr)


@needs_compose
@pytest.mark.parametrize("missing", ["DJANGO_SECRET_KEY", "POSTGRES_PASSWORD", "DJANGO_ALLOWED_HOSTS"])
def test_compose_refuses_to_start_without_a_secret_key_a_database_password_and_allowed_hosts(missing):
    env = {name: value for name, value in FILLED.items() if name != missing}
    code, said = compose_config(env)
    assert code != 0 and f"set {missing} to" in said, said


@needs_compose
def test_compose_with_the_production_environment_requires_keys_and_a_password():
    code, resolved = compose_config(FILLED, "tls")
    assert code == 0, resolved
    services = resolved["services"]
    for name in ("migrate", *WEB):
        env = services[name]["environment"]
        assert env["SPEECH_REQUIRE_API_KEY"] == "true", name
        assert env["DJANGO_SECRET_KEY"] == FILLED["DJANGO_SECRET_KEY"] and env["DJANGO_ALLOWED_HOSTS"] == "tts.example.com"
        assert env["DATABASE_PASSWORD"] == FILLED["POSTGRES_PASSWORD"]
        assert "SPEECH_INSECURE" not in env
    postgres = services["postgres"]["environment"]
    assert postgres["POSTGRES_PASSWORD"] == FILLED["POSTGRES_PASSWORD"] and "POSTGRES_HOST_AUTH_METHOD" not in postgres
    # the TLS front is the one address whose X-Forwarded-Proto nginx keeps
    front = services["nginx-tls"]["networks"]["default"]["ipv4_address"]
    assert services["nginx"]["environment"]["SPEECH_TRUSTED_FRONT"] == f"{front}/32"
    assert services["nginx-tls"]["environment"]["SPEECH_TLS_BACKEND"] == "nginx:80"


def test_the_production_env_example_names_every_required_variable():
    names = {line.partition("=")[0] for line in PRODUCTION_ENV.read_text().splitlines() if line and not line.startswith("#")}
    assert set(FILLED) <= names


def test_the_tls_template_is_valid_nginx(tmp_path):
    tmp_path.chmod(0o755)
    cert, key = self_signed(tmp_path, ["tts.example.com"])
    code, said, site = judged(TlsFront("127.0.0.1:8080", cert, key))
    assert code == 0, said
    assert "proxy_set_header X-Forwarded-Proto https;" in site and "proxy_buffering off;" in site
