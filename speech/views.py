from django.http import JsonResponse

from .engines import get_engine


def healthz(request):
    """Liveness and what this instance serves: for load balancers and humans."""
    caps = get_engine().capabilities
    return JsonResponse({"status": "ok", "engine": caps.name, "voices": list(caps.voices),
                         "sample_rate": caps.sample_rate})
