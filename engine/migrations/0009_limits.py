from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("engine", "0008_hosts"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="limits",
            field=models.JSONField(blank=True, null=True, help_text="what bounded it (engine/limits.py): {limits, mechanism, reached, written_bytes, peak_processes}"),
        ),
        migrations.AddField(
            model_name="check",
            name="limits",
            field=models.JSONField(blank=True, null=True, help_text="what bounded its command (engine/limits.py): {limits, mechanism, reached, written_bytes, peak_processes}"),
        ),
    ]
