"""Admin: reference voices (list, player, checked upload, deactivate, delete) and API keys."""

from django import forms
from django.contrib import admin, messages
from django.db import transaction
from django.http import FileResponse, Http404, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from .audio.codecs import MEDIA_TYPES
from .control import signals as control
from . import voices
from .models import DEFAULT_SCOPES, ApiKey, Scope, SessionRecord, Voice


class VoiceUploadForm(forms.ModelForm):
    audio_sample = forms.FileField(help_text="wav, flac, mp3, ogg, m4a or webm; 1–30 s; at most 10 MiB.")

    class Meta:
        model = Voice
        fields = ["name", "consent", "transcript", "language", "is_active"]

    def clean(self):
        cleaned = super().clean()
        sample = cleaned.get("audio_sample")
        if sample is None:
            return cleaned
        if sample.size > voices.MAX_UPLOAD_BYTES:
            raise forms.ValidationError({"audio_sample": "The file is larger than 10 MiB."})
        data = sample.read()
        try:
            name = voices.check_name(cleaned.get("name", ""))
            if Voice.objects.filter(name__iexact=name).exists():
                raise voices.VoiceError(f"a voice named '{name}' exists already", "name")
        except voices.VoiceError as exc:
            self.add_error("name", str(exc))
        try:
            facts = voices.inspect_audio(data)
            voices.check_claims(facts, sample.name, sample.content_type)
        except voices.VoiceError as exc:
            self.add_error("audio_sample", str(exc))
        cleaned["audio_bytes"] = data
        return cleaned


class VoiceEditForm(forms.ModelForm):
    class Meta:
        model = Voice
        fields = ["consent", "transcript", "language", "is_active"]


@admin.register(Voice)
class VoiceAdmin(admin.ModelAdmin):
    list_display = ["name", "duration_s", "sample_rate", "container", "is_active", "created_at", "player"]
    list_filter = ["is_active", "container"]
    search_fields = ["name", "transcript"]
    readonly_fields = ["name", "container", "sample_rate", "duration_s", "sha256", "created_at", "created_by", "player"]
    actions = ["deactivate", "activate"]

    def get_form(self, request, obj=None, **kwargs):
        kwargs["form"] = VoiceEditForm if obj else VoiceUploadForm
        return super().get_form(request, obj, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj else []

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["name", "consent", "transcript", "language", "is_active", "audio_sample"]
        return [
            "name",
            "player",
            "consent",
            "transcript",
            "language",
            "is_active",
            "container",
            "sample_rate",
            "duration_s",
            "sha256",
            "created_at",
            "created_by",
        ]

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            if "is_active" in form.changed_data and not obj.is_active:
                transaction.on_commit(lambda: voices.end_sessions_using(obj.name))
            return
        data = form.cleaned_data
        try:
            voice = voices.create_voice(
                name=data["name"],
                consent=data["consent"],
                data=data["audio_bytes"],
                filename=data["audio_sample"].name,
                content_type=data["audio_sample"].content_type,
                transcript=data.get("transcript", ""),
                language=data.get("language", ""),
                created_by=request.user.get_username(),
            )
        except voices.VoiceError:  # lost a race for the name after validation: see changeform_view
            raise
        if not data.get("is_active", True):
            Voice.objects.filter(pk=voice.pk).update(is_active=False)
        obj.pk, obj.id = voice.pk, voice.pk

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except voices.VoiceError as exc:  # another upload took the name after this form was checked
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def delete_model(self, request, obj):
        voices.delete_voice(obj)

    def delete_queryset(self, request, queryset):
        for voice in queryset:
            voices.delete_voice(voice)

    @admin.display(description="listen")
    def player(self, obj):
        url = reverse("admin:speech_voice_audio", args=[obj.pk])
        return format_html('<audio controls preload="none" src="{}"></audio>', url)

    @admin.action(description="Deactivate selected voices (ends the sessions using them)")
    def deactivate(self, request, queryset):
        count = voices.deactivate_voices(queryset)
        self.message_user(request, f"{count} voice(s) deactivated.", messages.SUCCESS)

    @admin.action(description="Activate selected voices")
    def activate(self, request, queryset):
        count = queryset.update(is_active=True)
        self.message_user(request, f"{count} voice(s) activated.", messages.SUCCESS)

    def get_urls(self):
        audio = path("<int:pk>/audio/", self.admin_site.admin_view(self.audio_view), name="speech_voice_audio")
        return [audio, *super().get_urls()]

    def audio_view(self, request, pk):
        voice = Voice.objects.filter(pk=pk).first()
        if voice is None or not self.has_view_permission(request, voice):
            raise Http404
        return FileResponse(voice.audio.open("rb"), content_type=MEDIA_TYPES[voice.container])


class ApiKeyForm(forms.ModelForm):
    """The key's scopes as checkboxes, stored space-separated."""

    scopes = forms.MultipleChoiceField(choices=Scope.choices, widget=forms.CheckboxSelectMultiple, initial=[DEFAULT_SCOPES])

    class Meta:
        model = ApiKey
        fields = ["name", "max_sessions", "requests_per_minute", "scopes"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["scopes"] = self.instance.scopes.split()

    def clean_scopes(self):
        return " ".join(scope for scope in Scope.values if scope in self.cleaned_data["scopes"])


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = ["name", "prefix", "scopes", "max_sessions", "requests_per_minute", "created_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    fields = ["name", "max_sessions", "requests_per_minute", "scopes"]
    actions = ["revoke"]

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        key, secret = ApiKey.issue(
            obj.name, max_sessions=obj.max_sessions, requests_per_minute=obj.requests_per_minute, scopes=obj.scopes
        )
        obj.pk, obj.id = key.pk, key.pk
        self.message_user(
            request,
            format_html(
                "API key created: <code>{}</code>. Copy it now: it is stored hashed and will not be shown again.", secret
            ),
            messages.SUCCESS,
        )

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"{count} key(s) revoked.", messages.SUCCESS)


@admin.register(SessionRecord)
class SessionRecordAdmin(admin.ModelAdmin):
    list_display = [
        "session_id",
        "status",
        "instance",
        "voice",
        "engine",
        "api_key",
        "started_at",
        "ended_at",
        "segments",
        "bytes_sent",
        "first_audio_ms",
    ]
    list_filter = ["status", "engine", "instance"]
    search_fields = ["session_id", "voice"]
    actions = ["cancel_speech", "terminate"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def _signal(self, request, queryset, kind):
        live = list(queryset.filter(status=SessionRecord.Status.ACTIVE).values_list("session_id", flat=True))
        try:
            for session_id in live:
                control.send_sync(kind, session_id)
        except control.SignalsUnavailable as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        self.message_user(request, f"Sent {kind} to {len(live)} live session(s).", messages.SUCCESS)

    @admin.action(description="Cancel current speech", permissions=["view"])
    def cancel_speech(self, request, queryset):
        self._signal(request, queryset, control.CANCEL)

    @admin.action(description="Terminate", permissions=["view"])
    def terminate(self, request, queryset):
        self._signal(request, queryset, control.TERMINATE)
