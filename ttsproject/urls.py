from django.contrib import admin
from django.urls import path

from speech.web import api, openapi, playground, views

urlpatterns = [
    path("", playground.page, name="playground"),
    path("playground/token", playground.staff_token, name="playground-token"),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("health", views.health, name="health"),
    path("metrics", views.metrics, name="metrics"),
    path("v1/models", api.model_list, name="model-list"),
    path("v1/models/<str:model>", api.model_detail, name="model-detail"),
    path("v1/audio/speech", api.speech, name="speech"),
    path("v1/audio/voices", api.voice_list, name="voice-list"),
    path("v1/audio/voices/<str:name>", api.voice_detail, name="voice-detail"),
    path("v1/audio/speech/tokens", api.speech_tokens, name="speech-tokens"),
    path("v1/audio/speech/sessions/<str:session_id>/cancel", api.session_cancel, name="session-cancel"),
    path("v1/audio/speech/sessions/<str:session_id>", api.session_terminate, name="session-terminate"),
    path("v1/openapi.json", openapi.openapi_json, name="openapi"),
    path("v1/audio/speech/stream/schema.json", openapi.websocket_schema_json, name="websocket-schema"),
]

handler404 = "speech.web.api.not_found"
