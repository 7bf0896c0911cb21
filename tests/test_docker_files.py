"""docker/: what can be checked without a Docker engine (none runs here).

The compose file is parsed and its topology checked (services, start order, health checks, the
shared voice volume); the Dockerfile's sources, user and data directory are checked against the
settings; the nginx template is filled in and `nginx -t` judges it. tests/test_deploy.py runs the
same topology, and the Dockerfile's own commands, for real.
"""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

import pytest
import yaml

from .support.deploy import DOCKER, NGINX_TEMPLATE, Nginx, dockerfile, render_template
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


def test_the_nginx_template_is_valid_nginx():
    nginx = Nginx(["127.0.0.1:8001", "127.0.0.1:8002"]).configure()
    try:
        code, said = nginx.test_config()
        site = (nginx.dir / "speech.conf").read_text()
    finally:
        shutil.rmtree(nginx.dir, ignore_errors=True)
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
