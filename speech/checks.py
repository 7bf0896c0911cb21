"""System checks (`manage.py check`): settings that would only fail once a client connects.

Each setting's own rule is a row of the settings table (speech/conf.py); only checks across settings
are written here."""

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from .conf import SETTINGS, conf
from .server.budget import FRAME_COST_FACTOR


@checks.register(checks.Tags.compatibility)
def check_speech_settings(app_configs, **kwargs):
    errors = []
    for setting in SETTINGS:
        rule = setting.rule
        if rule is None or (setting.engine and conf.ENGINE != setting.engine):
            continue
        value = getattr(settings, setting.name, setting.default)
        allowed = import_string(rule.choices) if rule.choices else None
        if not rule.test(value, allowed):
            choices = ", ".join(map(str, sorted(allowed))) if allowed is not None else ""
            errors.append(checks.Error(rule.message.format(name=setting.name, value=value, choices=choices), id=rule.id))
    if conf.CONFIG_BUDGET_BYTES < FRAME_COST_FACTOR * conf.MAX_CONFIG_BYTES:
        errors.append(
            checks.Error(
                f"SPEECH_CONFIG_BUDGET_BYTES must be at least {FRAME_COST_FACTOR} x SPEECH_MAX_CONFIG_BYTES "
                f"({FRAME_COST_FACTOR * conf.MAX_CONFIG_BYTES}): a largest session.config costs that much in flight.",
                id="speech.E008",
            )
        )
    if conf.MAX_MESSAGE_BYTES > conf.MAX_CONFIG_BYTES:
        errors.append(
            checks.Warning(
                "SPEECH_MAX_MESSAGE_BYTES is larger than SPEECH_MAX_CONFIG_BYTES; daphne's frame limit follows the larger one.",
                id="speech.W001",
            )
        )
    return errors


@checks.register(checks.Tags.security, deploy=True)
def check_deployment(app_configs, **kwargs):
    """`manage.py check --deploy`: a deployment wants API keys, and browser origins it names (docs/security.md)."""
    found = []
    if not conf.REQUIRE_API_KEY:
        found.append(
            checks.Warning(
                "SPEECH_REQUIRE_API_KEY is off: anyone who reaches the server may speak, upload and delete voices.",
                hint="Set SPEECH_REQUIRE_API_KEY=true and create keys with `manage.py create_api_key NAME --scopes …`.",
                id="speech.W002",
            )
        )
    if not conf.ALLOWED_ORIGINS and "*" in settings.ALLOWED_HOSTS:
        found.append(
            checks.Warning(
                "DJANGO_ALLOWED_HOSTS contains '*' and SPEECH_ALLOWED_ORIGINS is empty: a page on any origin may open "
                "WebSocket sessions from its visitors' browsers.",
                hint="Name the host names in DJANGO_ALLOWED_HOSTS, or the allowed origins in SPEECH_ALLOWED_ORIGINS.",
                id="speech.W003",
            )
        )
    return found
