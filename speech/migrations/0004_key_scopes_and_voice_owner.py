"""API key scopes (issue 45): keys that exist already keep what they could do, `speak` and `voices`;
new keys get `speak` unless their scopes are chosen. Voices remember the key they were uploaded under.
A key may have its own REST request rate."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0003_key_limits_and_messages"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="scopes",
            field=models.CharField(default="speak voices", max_length=64),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="apikey",
            name="scopes",
            field=models.CharField(
                default="speak", help_text="Space-separated: speak, voices, admin (docs/security.md).", max_length=64
            ),
        ),
        migrations.AddField(
            model_name="apikey",
            name="requests_per_minute",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="REST requests a minute on each instance; empty: SPEECH_KEY_REQUESTS_PER_MINUTE; 0: no limit "
                "(a front instance's key to its upstream makes one request a segment).",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="voice",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="voices",
                to="speech.apikey",
            ),
        ),
    ]
