"""An audit entry's detail as a code and its parameters, worded in the reader's language (dlq.audit_details).

Both columns are added with a constant default, which PostgreSQL records in
the catalogue without rewriting a row: the append-only trigger (0003, 0009)
fires on UPDATE and DELETE of rows, and this changes none, so entries written
before keep their bytes (and show their ``detail`` as stored). The defaults
stay in the database (``db_default``) so a previous release, which names
neither column, can still append entries after a rollback.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dlq', '0011_task_cancel_permission'),
    ]

    operations = [
        migrations.AddField(
            model_name='auditentry',
            name='detail_code',
            field=models.CharField(blank=True, db_default='', default='', max_length=50, verbose_name='detail code'),
        ),
        migrations.AddField(
            model_name='auditentry',
            name='detail_params',
            field=models.JSONField(blank=True, db_default={}, default=dict, verbose_name='detail parameters'),
        ),
    ]
