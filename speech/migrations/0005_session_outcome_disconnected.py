"""A session whose client disconnected was stored as "cancelled", the word a barge-in uses: it is
"disconnected" now (speech/stream/outcomes.py), in the registry's rows as in the metric's label."""

from django.db import migrations, models


def rename(old, new):
    def run(apps, schema_editor):
        apps.get_model("speech", "SessionRecord").objects.filter(status=old).update(status=new)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("speech", "0004_key_scopes_and_voice_owner"),
    ]

    operations = [
        migrations.AlterField(
            model_name="sessionrecord",
            name="status",
            field=models.CharField(
                choices=[
                    ("active", "active"),
                    ("completed", "completed"),
                    ("disconnected", "disconnected"),
                    ("terminated", "terminated"),
                    ("failed", "failed"),
                ],
                db_index=True,
                default="active",
                max_length=12,
            ),
        ),
        migrations.RunPython(rename("cancelled", "disconnected"), rename("disconnected", "cancelled")),
    ]
