"""The approval inbox: ``dlq.decide_approval`` on the console's task proxy (operators and supervisors, through
``setup_roles``), and the alert rule kind ``approval_waiting`` (a task waiting for approval longer than T
seconds). Neither touches a table: a permission row and a field's choices."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dlq', '0014_dlq_filtered_list_index_in_list_order'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='consoletask',
            options={'default_permissions': (), 'permissions': [('cancel_task', 'Can cancel a task'), ('decide_approval', 'Can approve or reject a task waiting for approval')], 'verbose_name': 'task', 'verbose_name_plural': 'tasks'},
        ),
        migrations.AlterField(
            model_name='alertrule',
            name='kind',
            field=models.CharField(choices=[('open_items', 'open DLQ items above N'), ('growth', 'more than M new DLQ items within a window'), ('oldest_age', 'oldest open DLQ item older than T seconds'), ('new_failure_group', 'a failure group not seen in the last D days'), ('sweeper_stalled', 'the sweeper has not run for S seconds'), ('approval_waiting', 'a task waiting for approval longer than T seconds')], max_length=30, verbose_name='kind'),
        ),
    ]
