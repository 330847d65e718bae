"""Scale data for benchmarks: millions of realistic tasks and DLQ items, made by set-based SQL in PostgreSQL.

- ``shape``: sizes, shares, pipelines, failure modes, outcomes and a run's ``SeedPlan``;
- ``sql``: the ``INSERT … SELECT`` statements for tasks, DLQ items and a few tasks' details, and those
  tables as the arrays the statements index;
- ``service``: ``scale_data_seed``, which runs them in batches and refuses a database already in use.

``python manage.py seed_scale_data`` (``devtools.management.commands``) is its command line.
"""
