from django.http import HttpResponse, JsonResponse

from . import health as readiness_checks
from .. import metrics as prometheus
from .api import error
from ..conf import conf
from ..runtime import get_engine


def healthz(request):
    """Liveness and what this instance serves: the process answers. It asks nothing outside the process
    (no database, Redis or upstream), so a dependency's outage never makes an orchestrator restart it."""
    caps = get_engine().capabilities
    return JsonResponse({"status": "ok", "engine": caps.name, "voices": list(caps.voices), "sample_rate": caps.sample_rate})


async def health(request):
    """Readiness (speech/web/health.py): 200 while sessions can be served (`ok`, or `degraded` with
    Redis away), 503 `unavailable` without the database or the engine; every part's state in the body."""
    status, checks = await readiness_checks.readiness()
    failing = [part for part, state in checks.items() if state != "ok"]
    body = {"status": status, "checks": checks}
    if failing:
        body["failing"] = failing
    return JsonResponse(body, status=503 if status == readiness_checks.UNAVAILABLE else 200)


async def metrics(request):
    """This process's Prometheus metrics; SPEECH_METRICS_TOKEN decides who may read them."""
    if not prometheus.allowed(request, conf.METRICS_TOKEN):
        if conf.METRICS_TOKEN:
            return error(401, "metrics need Authorization: Bearer <SPEECH_METRICS_TOKEN>", type="authentication_error")
        return error(
            403,
            "metrics are served to this machine only (set SPEECH_METRICS_TOKEN to read them from elsewhere)",
            type="permission_error",
        )
    body, content_type = prometheus.exposition()
    return HttpResponse(body, content_type=content_type)
