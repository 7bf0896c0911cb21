"""HTTPS end to end (issue 45, item 3), as docker/compose.yaml's `tls` profile runs it, without docker:
docker/nginx/tls.conf.template with a self-signed certificate made here, in front of the plain nginx
template, in front of `manage.py serve` with the TLS settings of docker/production.env.example.

Chromium reaches it by a host name that is not localhost (`--host-resolver-rules`), logs in to the
admin over HTTPS (the CSRF Origin check that failed behind TLS before) and speaks in the playground
with the staff token; a client holds a `wss://` session; and the plain nginx keeps X-Forwarded-Proto
from the trusted front only.
"""

from __future__ import annotations

import asyncio
import http.client
import secrets
import ssl
import subprocess

import pytest

from .support.browser import chromium, needs_chromium
from .support.deploy import Nginx, TlsFront, local_environment, self_signed
from .support.live import PROJECT_ROOT, PYTHON, DaphneServer, free_port, run_session, wait_for

pytestmark = [pytest.mark.live, pytest.mark.heavy, pytest.mark.deploy]

HOST = "speech.test"  # reached through Chromium's resolver rules, never DNS
PASSWORD = "a-long-test-password-1"
CONFIG = {"response_format": "pcm", "stream_audio": True}


class TlsStack:
    """One instance (listed twice in the plain nginx), the plain nginx, the TLS front."""

    def __init__(self, folder):
        folder.chmod(0o755)
        self.cert, self.key = self_signed(folder, [HOST])
        self.port = free_port()
        self.origin = f"https://{HOST}:{self.port}"
        self.server = DaphneServer(
            {
                "SPEECH_ENGINE": "hibari",
                "DJANGO_SECRET_KEY": secrets.token_hex(32),
                "DJANGO_ALLOWED_HOSTS": f"{HOST},127.0.0.1",
                "DJANGO_SECURE_PROXY_SSL_HEADER": "true",
                "DJANGO_CSRF_TRUSTED_ORIGINS": self.origin,
                "DJANGO_SECURE_COOKIES": "true",
                "DJANGO_SECURE_SSL_REDIRECT": "true",
                "DJANGO_SECURE_HSTS_SECONDS": "3600",
                "SPEECH_REQUIRE_API_KEY": "true",
            }
        )
        self.nginx = self.front = None

    def start(self):
        self.server.start()
        backend = f"127.0.0.1:{self.server.port}"
        self.nginx = Nginx([backend, backend], trusted_front="127.0.0.1/32").start()
        self.front = TlsFront(f"127.0.0.1:{self.nginx.port}", self.cert, self.key, self.port).start()
        self.manage("createsuperuser", "--noinput", "--username", "admin", "--email", "admin@example.com")
        self.api_key = self.manage("create_api_key", "tls-client").strip()
        return self

    def manage(self, *args):
        env = local_environment({**self.server.environment(), "DJANGO_SUPERUSER_PASSWORD": PASSWORD})
        done = subprocess.run(
            [PYTHON, "manage.py", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def stop(self):
        for proxy in (self.front, self.nginx):
            if proxy is not None:
                proxy.__exit__(None, None, None)
        code = self.server.stop()
        self.server.assert_no_traceback()
        self.server.cleanup()
        return code

    def trusting(self):
        """An SSL context that trusts the self-signed certificate (and checks it: 127.0.0.1 is in it)."""
        return ssl.create_default_context(cafile=str(self.cert))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    running = TlsStack(tmp_path_factory.mktemp("tls")).start()
    try:
        yield running
    finally:
        assert running.stop() == 0


def get(connection, path, headers):
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def test_nginx_keeps_x_forwarded_proto_from_the_trusted_front_only(stack):
    """Through the TLS front, Django sees https: no redirect, HSTS and secure cookies. Straight to the
    plain nginx from another address, a forged `X-Forwarded-Proto: https` is replaced by http, so
    Django redirects to HTTPS."""
    secure = get(
        http.client.HTTPSConnection("127.0.0.1", stack.port, context=stack.trusting(), timeout=30),
        "/admin/login/",
        {"Host": f"{HOST}:{stack.port}"},
    )
    assert secure.status == 200
    assert secure.getheader("Strict-Transport-Security") == "max-age=3600"
    assert "; Secure" in secure.getheader("Set-Cookie")
    forged = get(
        http.client.HTTPConnection("127.0.0.1", stack.nginx.port, timeout=30, source_address=("127.0.0.2", 0)),
        "/admin/login/",
        {"Host": HOST, "X-Forwarded-Proto": "https"},
    )
    assert forged.status == 301 and forged.getheader("Location") == f"https://{HOST}/admin/login/"


def test_a_wss_session_through_the_tls_front(stack):
    result = asyncio.run(
        run_session(
            f"wss://127.0.0.1:{stack.port}/v1/audio/speech/stream",
            CONFIG,
            ["Hello over TLS."],
            ssl=stack.trusting(),
            headers={"Authorization": f"Bearer {stack.api_key}"},
        )
    )
    assert result.close_code == 1000 and result.types()[-1] == "session.done"
    assert sum(map(len, result.audio_frames)) > 24000 * 2 * 0.5  # at least half a second of speech


@needs_chromium
def test_admin_login_and_the_playground_over_https_at_a_host_name(stack, tmp_path):
    from selenium.webdriver.common.by import By

    flags = (f"--host-resolver-rules=MAP {HOST} 127.0.0.1", "--ignore-certificate-errors")
    with chromium(tmp_path / "profile", flags=flags) as browser:
        browser.get(f"{stack.origin}/admin/login/?next=/")
        browser.find_element(By.ID, "id_username").send_keys("admin")
        browser.find_element(By.ID, "id_password").send_keys(PASSWORD)
        browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        wait_for(lambda: browser.current_url == f"{stack.origin}/", "the login lands on the playground", 30)
        assert "CSRF" not in browser.page_source
        assert browser.execute_script("return window.isSecureContext") is True
        wait_for(lambda: browser.find_element(By.ID, "speak").is_enabled(), "the playground is ready", 30)
        browser.find_element(By.ID, "speak").click()  # a staff token (CSRF-protected POST), then wss://
        wait_for(lambda: browser.execute_script("return window.playground.played") > 0, "the playground plays", 60)
        wait_for(
            lambda: browser.execute_script("const u = window.playground.utterance; return u && u.closed"),
            "the session ends",
            60,
        )
        assert browser.find_element(By.ID, "error").get_attribute("hidden") is not None, browser.find_element(By.ID, "error").text
