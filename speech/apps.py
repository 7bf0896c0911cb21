from django.apps import AppConfig


class SpeechConfig(AppConfig):
    name = "speech"
    verbose_name = "Speech"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks  # noqa: F401  (registers the system checks)
