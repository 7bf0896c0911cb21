"""Reference voices, API keys and their browser tokens, and the session registry's records."""

import hashlib
import secrets
import uuid

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone

from .stream.outcomes import OUTCOME_COMPLETED, OUTCOME_DISCONNECTED, OUTCOME_FAILED, OUTCOME_TERMINATED

KEY_PREFIX = "tts_"


def voice_upload_path(instance, filename):
    """Storage name of a reference: a fresh random name; nothing the client sent becomes a path."""
    return f"voices/{uuid.uuid4().hex}.{instance.container}"


class Voice(models.Model):
    CONTAINERS = [(c, c) for c in ("wav", "flac", "mp3", "ogg", "m4a", "webm")]

    name = models.CharField(max_length=64, help_text="Letters, digits, '.', '_' and '-'; unique ignoring case.")
    consent = models.TextField(help_text="The speaker's consent to this use of their voice.")
    transcript = models.TextField(blank=True, help_text="What is said in the reference (improves cloning).")
    language = models.CharField(max_length=32, blank=True)
    audio = models.FileField(upload_to=voice_upload_path)
    container = models.CharField(max_length=8, choices=CONTAINERS, editable=False)
    sample_rate = models.PositiveIntegerField(editable=False)
    duration_s = models.FloatField("duration (s)", editable=False)
    sha256 = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    created_by = models.CharField(max_length=150, blank=True, editable=False)
    # The key it was uploaded under (REST): that key, or one with the `admin` scope, may delete it.
    owner = models.ForeignKey("ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="voices", editable=False)
    is_active = models.BooleanField("active", default=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                Lower("name"),
                name="speech_voice_name_ci_unique",
                violation_error_message="A voice with this name exists already (names are compared ignoring case).",
            )
        ]

    def __str__(self):
        return self.name


class ApiKeyQuerySet(models.QuerySet):
    def live(self):
        return self.filter(revoked_at__isnull=True)


class Scope(models.TextChoices):
    """What a key may do (docs/security.md). A key holds a space-separated list of them."""

    SPEAK = "speak", "speak: sessions, REST speech, browser tokens"
    VOICES = "voices", "voices: upload voices, delete its own"
    ADMIN = "admin", "admin: cancel or terminate any session, delete any voice"


DEFAULT_SCOPES = "speak"  # new keys; keys from before scopes were migrated to "speak voices"


class ApiKey(models.Model):
    """A client's key. Only a hash is stored; the key itself is shown once, when created."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    hashed = models.CharField(max_length=64, editable=False)
    max_sessions = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Concurrent sessions across all instances; empty: SPEECH_MAX_SESSIONS_PER_KEY.",
    )
    requests_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="REST requests a minute on each instance; empty: SPEECH_KEY_REQUESTS_PER_MINUTE; 0: no limit "
        "(a front instance's key to its upstream makes one request a segment).",
    )
    scopes = models.CharField(
        max_length=64, default=DEFAULT_SCOPES, help_text="Space-separated: speak, voices, admin (docs/security.md)."
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @staticmethod
    def digest(secret):
        return hashlib.sha256(secret.encode()).hexdigest()

    @classmethod
    def issue(cls, name, **fields):
        """Create a key; returns (ApiKey, the key in clear text, to be shown once)."""
        prefix = KEY_PREFIX + secrets.token_hex(4)
        secret = f"{prefix}.{secrets.token_urlsafe(32)}"
        return cls.objects.create(name=name, prefix=prefix, hashed=cls.digest(secret), **fields), secret

    def allows(self, scope):
        return scope in self.scopes.split()

    @property
    def revoked(self):
        return self.revoked_at is not None


class AccessToken(models.Model):
    """A short-lived, single-use credential for browsers (`?token=` on the WebSocket)."""

    key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="tokens")
    hashed = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)


class SessionRecord(models.Model):
    """One WebSocket session, as the registry knows it: written when it starts and when it ends."""

    class Status(models.TextChoices):
        # The session core's outcomes (speech/stream/outcomes.py); labels equal the stored values.
        ACTIVE = "active", "active"
        COMPLETED = OUTCOME_COMPLETED, OUTCOME_COMPLETED
        DISCONNECTED = OUTCOME_DISCONNECTED, OUTCOME_DISCONNECTED
        TERMINATED = OUTCOME_TERMINATED, OUTCOME_TERMINATED
        FAILED = OUTCOME_FAILED, OUTCOME_FAILED

    session_id = models.CharField(max_length=64, primary_key=True)
    instance = models.CharField(max_length=255, db_index=True)
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="sessions")
    voice = models.CharField(max_length=64)
    engine = models.CharField(max_length=32)
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.ACTIVE, db_index=True)
    segments = models.PositiveIntegerField(default=0)
    bytes_sent = models.PositiveBigIntegerField("bytes", default=0)
    first_audio_ms = models.FloatField("first audio (ms)", null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        verbose_name = "session"

    def __str__(self):
        return self.session_id
