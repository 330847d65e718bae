"""Merges 0014 (step names) and 0015 (callbacks); gives ``Task.callback_url`` its database default.

0015 added ``callback_url`` NOT NULL with a Python default only, so an INSERT
that does not name it (the previous release during a rolling deploy,
devtools' backlog and scale-data SQL) failed. A constant default is recorded
in the catalogue: no table rewrite.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0014_steps_keyed_by_name"),
        ("tasks", "0015_completion_callbacks"),
    ]

    operations = [
        migrations.AlterField(
            model_name="task",
            name="callback_url",
            field=models.CharField(
                blank=True, db_default="", default="", max_length=2048, verbose_name="callback URL"
            ),
        ),
    ]
