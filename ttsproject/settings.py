"""Django settings, read from the environment (every variable is in the README's Settings table).

Every value has a default that serves one machine out of the box: the embedded engine, SQLite,
and no Redis (REDIS_URL unset: one instance). Production changes them with environment variables only.
"""

from pathlib import Path

import environ

from speech.conf import from_environment

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

# Every SPEECH_* setting, from the one table of their defaults, meanings and checks (speech/conf.py).
speech_settings = from_environment(env)
globals().update(speech_settings)
SPEECH_REDIS_PREFIX = speech_settings["SPEECH_REDIS_PREFIX"]  # named here too: the channel layer's prefix below


def secret(name, default=""):
    """A secret from `NAME`, or from the file `NAME_FILE` names (Docker and Kubernetes secrets), or the default."""
    path = env.str(f"{name}_FILE", default="")
    if path:
        return Path(path).read_text().strip()
    return env.str(name, default=default)


# `manage.py serve` refuses to listen off loopback with this key (speech/security.py).
DEVELOPMENT_SECRET_KEY = "django-insecure-development-key-change-me-in-production"
SECRET_KEY = secret("DJANGO_SECRET_KEY", DEVELOPMENT_SECRET_KEY)
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

# TLS, from the environment (docs/deployment.md, "HTTPS"). Behind a proxy that ends TLS, Django learns
# the request was https from X-Forwarded-Proto, which the proxy must set itself (docker/nginx keeps it
# only from a trusted front): without that, the admin's CSRF Origin check fails behind TLS.
if env.bool("DJANGO_SECURE_PROXY_SSL_HEADER", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=False)
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=False)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "speech",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "ttsproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "ttsproject.asgi.application"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
# The password apart from the URL (no escaping of special characters), or from a secret's file.
if database_password := secret("DATABASE_PASSWORD"):
    DATABASES["default"]["PASSWORD"] = database_password
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # SQLite's default rollback journal creates, syncs and deletes a file at every commit: 0.75 ms of
    # CPU each, beside the serving loop (the session registry commits twice a session). A write-ahead
    # log with NORMAL sync commits in 0.18 ms and lets readers work during a write; a power cut can
    # lose the last commits, never corrupt the file. Production runs PostgreSQL (README, "Deploying").
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
    )

# Without REDIS_URL one instance serves everything: Channels' in-memory layer carries control signals
# and per-key session counts stay in the process. With it, channels-redis's core layer (made to outlive
# Redis outages by speech/control/layer.py) carries them across instances, and slots live in Redis (speech/control/slots.py).
REDIS_URL = env.str("REDIS_URL", default="")
# SPEECH_REDIS_PREFIX prefixes every Redis key and channel this deployment uses (the channel layer's,
# per-key slots, instance heartbeats): two deployments sharing one Redis never see each other's signals or slots.
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "speech.control.layer.SpeechChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": SPEECH_REDIS_PREFIX},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "speech.control.memory_layer.SpeechInMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# daphne serves no static files: WhiteNoise serves the admin's straight from the apps, so there
# is no collectstatic step.
WHITENOISE_USE_FINDERS = True
# Uploaded reference voices go through Django's storage API (speech/voices.py), to MEDIA_ROOT by
# default: with several instances it must be a directory they all share (one volume in
# docker/compose.yaml), since a voice uploaded through one instance is read by another's sessions.
MEDIA_ROOT = env.path("MEDIA_ROOT", default=BASE_DIR / "media")
MEDIA_URL = "media/"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Every record carries the session it was logged in (speech/logcontext.py): `session` in the plain
# format ("-" outside a session), `session_id` in JSON (DJANGO_LOG_FORMAT=json: one object a line).
LOG_FORMAT = env.str("DJANGO_LOG_FORMAT", default="plain")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"session": {"()": "speech.logcontext.SessionFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(session)s]: %(message)s"},
        "json": {
            "()": "speech.logcontext.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(session_id)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "filters": ["session"],
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": env.str("DJANGO_LOG_LEVEL", default="INFO")},
    # httpx logs every upstream request at INFO: one line per synthesised segment is noise
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}


# Voice uploads are at most 10 MiB (speech/voices.py); larger request bodies are refused with
# 413 before they are read, and file parts go to a temporary file rather than memory.
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

# `python manage.py test` hands over to pytest, so both ways run the same suite.
TEST_RUNNER = "ttsproject.testrunner.PytestTestRunner"
