"""The SQL that makes the rows: one ``INSERT … SELECT`` per table, over a batch of ordinals, and its parameters.

Rows are made by set-based SQL (``INSERT … SELECT … FROM generate_series``),
one batch of ordinals per statement, so 5,000,000 tasks take minutes, not
hours.

Every value of a row is a pure function of its ordinal and ``--seed`` (hashes,
not ``random()``): the task insert, the DLQ insert and the detail insert each
recompute what they need about a task (``_task_rows``) instead of reading it
back. The statements take the shape's tables as arrays (``sql_params``): a
weighted choice indexes an array of ``SLOTS`` positions with a uniform number,
and the DLQ reasons are the production text (``tasks.lifecycle.dead_letters.reason_text``) with a
marker where each item's own message goes, plus the facts pages word it from
(``reason_params``). Batches bind ``first`` and ``last``.
"""

from __future__ import annotations

from devtools.scale_data.shape import (
    CANCEL_MESSAGE,
    COMPENSATION_ERROR,
    COMPENSATION_ERROR_CODE,
    DETAILED_DLQ_TASKS,
    DETAILED_NEWEST_TASKS,
    DETAILED_OLDEST_TASKS,
    FAILURE_MODES,
    FAILURE_STATES,
    IN_FLIGHT_OUTCOMES,
    OUTCOMES,
    PIPELINES,
    RESOLUTION_NOTES,
    RESOLVED_OUTCOMES,
    RETRY_SCHEDULED_ERROR,
    SEEDED_DAYS,
    SLOTS,
    SUCCEEDED,
    TRANSIENT,
    UNRESOLVED_OUTCOMES,
    UNRESOLVED_SHARE,
    SeedPlan,
)
from tasks.lifecycle.dead_letters import reason_text


def _slots(choices, universe) -> list[int]:
    """SLOTS positions of ``choices`` in ``universe``, each repeated in proportion to its weight.

    SQL then makes a weighted choice by indexing the array with a uniform number.
    """
    total = sum(choice.weight for choice in choices)
    slots: list[int] = []
    for choice in choices:
        slots += [universe.index(choice)] * round(SLOTS * choice.weight / total)
    return (slots + slots[-1:] * SLOTS)[:SLOTS]


def sql_params(plan: SeedPlan) -> dict:
    modes_by_pipeline = {shape.name: [m for m in FAILURE_MODES if m.pipeline == shape.name] for shape in PIPELINES}
    mode_slots: list[int] = []
    for shape in PIPELINES:
        mode_slots += _slots(modes_by_pipeline[shape.name], FAILURE_MODES)
    step_offsets, step_names = [], []
    for shape in PIPELINES:
        step_offsets.append(len(step_names))
        step_names += shape.steps
    steps_of = {shape.name: shape.steps for shape in PIPELINES}
    return {
        "now": plan.now,
        "salt": plan.salt,
        "pipeline_slots": _slots(PIPELINES, PIPELINES),
        "pipeline_names": [shape.name for shape in PIPELINES],
        "pipeline_steps": [len(shape.steps) for shape in PIPELINES],
        "input_keys": [shape.input_key for shape in PIPELINES],
        "input_prefixes": [shape.input_prefix for shape in PIPELINES],
        "step_offsets": step_offsets,
        "step_names": step_names,
        "mode_slots": mode_slots,
        "mode_step_index": [steps_of[mode.pipeline].index(mode.step) for mode in FAILURE_MODES],
        "mode_step": [mode.step for mode in FAILURE_MODES],
        "mode_code": [mode.error_code for mode in FAILURE_MODES],
        "mode_class": [mode.error_class for mode in FAILURE_MODES],
        "mode_reason": [mode.reason_code for mode in FAILURE_MODES],
        "mode_message": [mode.message for mode in FAILURE_MODES],
        "mode_attempts": [mode.attempts for mode in FAILURE_MODES],
        "mode_outcome": [mode.attempt_outcome for mode in FAILURE_MODES],
        # The production text, with a marker where each item's own message goes.
        "mode_reason_text": [
            reason_text(
                reason=mode.reason_code,
                step=mode.step,
                code=mode.error_code,
                message="{message}",
                attempts=mode.attempts,
                crashes=mode.attempts,
            )
            for mode in FAILURE_MODES
        ],
        "fingerprints": [f"{mode.pipeline}:{mode.step}:{mode.error_code}" for mode in FAILURE_MODES],
        "outcome_state": [outcome.task_state for outcome in OUTCOMES],
        "outcome_status": [outcome.dlq_status for outcome in OUTCOMES],
        "outcome_resolution": [outcome.resolution_code for outcome in OUTCOMES],
        "outcome_note": [RESOLUTION_NOTES[outcome.resolution_code] for outcome in OUTCOMES],
        "in_flight_slots": _slots(IN_FLIGHT_OUTCOMES, OUTCOMES),
        "unresolved_slots": _slots(UNRESOLVED_OUTCOMES, OUTCOMES),
        "resolved_slots": _slots(RESOLVED_OUTCOMES, OUTCOMES),
        "compensation_code": COMPENSATION_ERROR_CODE,
        "compensation_error": COMPENSATION_ERROR,
        "cancel_message": CANCEL_MESSAGE,
        "retry_error": list(RETRY_SCHEDULED_ERROR),
        "failure_states": list(FAILURE_STATES),
    }


def _task_rows(plan: SeedPlan, source: str) -> str:
    """A SELECT of every task column (and the plan behind it) for the ordinals ``i`` that ``source`` yields.

    Layered subqueries: each layer only names values of the one below. ``OFFSET 0`` keeps PostgreSQL
    from flattening them, which would copy (and compute again) a value's expression at every use.
    """
    n, k, m = plan.tasks, plan.dlq_tasks, plan.dlq_items

    def u(key: int) -> str:
        # A uniform number in [0, 1) per (ordinal, key): the same in every statement of a run.
        return f"((hashint8extended(i, {plan.seed * 64 + key}) & 2147483647)::float8 / 2147483648.0)"

    def number(key: int) -> str:
        return f"(hashint8extended(i, {plan.seed * 64 + key}) & 1048575)"

    step_seconds = SEEDED_DAYS * 86400 / n
    unresolved_share = min(1.0, UNRESOLVED_SHARE * m / k)
    dlq_forced = len(UNRESOLVED_OUTCOMES) + len(RESOLVED_OUTCOMES)
    first_dlq_outcome = len(IN_FLIGHT_OUTCOMES)
    slot = f"1 + floor({u(5)} * {SLOTS})::int"
    return f"""
    SELECT d.*,
        (%(pipeline_names)s::text[])[p + 1] AS pipeline,
        (%(pipeline_steps)s::int[])[p + 1] AS total_steps,
        (%(mode_step)s::text[])[m + 1] AS mode_step,
        (%(mode_code)s::text[])[m + 1] AS mode_code,
        (%(mode_class)s::text[])[m + 1] AS mode_class,
        (%(mode_reason)s::text[])[m + 1] AS mode_reason,
        (%(mode_attempts)s::int[])[m + 1] AS mode_attempts,
        (%(mode_outcome)s::text[])[m + 1] AS mode_outcome,
        replace((%(mode_message)s::text[])[m + 1], '{{n}}', {number(10)}::text) AS message,
        replace(%(compensation_error)s, '{{n}}', {number(10)}::text) AS compensation_message,
        jsonb_build_object(
            'user_id', 'user-' || {number(11)} %% 50000,
            (%(input_keys)s::text[])[p + 1], (%(input_prefixes)s::text[])[p + 1] || {number(12)}
        ) AS input,
        -- Search attributes (tasks.pipelines.attributes): every task's customer (its user), an invoice's order id.
        jsonb_build_object('customer_id', 'user-' || {number(11)} %% 50000)
            || CASE WHEN (%(input_keys)s::text[])[p + 1] = 'order_id'
                THEN jsonb_build_object('order_id', (%(input_prefixes)s::text[])[p + 1] || {number(12)})
                ELSE '{{}}'::jsonb END AS attributes,
        (%(outcome_state)s::text[])[o + 1] AS state,
        (%(outcome_status)s::text[])[o + 1] AS last_status,
        (%(outcome_resolution)s::text[])[o + 1] AS last_resolution,
        (%(outcome_note)s::text[])[o + 1] AS last_note,
        LEAST(%(now)s, failed_at + interval '3 days' * power({u(7)}, 2)) AS last_resolved_at,
        {u(8)} AS u_step,
        {u(9)} AS u_time
    FROM (
        SELECT c.*,
            CASE
                WHEN is_dlq AND t < {dlq_forced} THEN {first_dlq_outcome} + t
                WHEN is_dlq AND {u(4)} < {unresolved_share} THEN (%(unresolved_slots)s::int[])[{slot}]
                WHEN is_dlq THEN (%(resolved_slots)s::int[])[{slot}]
                WHEN i >= {n - len(IN_FLIGHT_OUTCOMES)} THEN {n - 1} - i
                WHEN i >= {n - plan.in_flight} THEN (%(in_flight_slots)s::int[])[{slot}]
                ELSE {OUTCOMES.index(SUCCEEDED)}
            END AS o,
            (%(mode_slots)s::int[])[p * {SLOTS} + 1 + floor({u(6)} * {SLOTS})::int] AS m,
            LEAST(%(now)s, created_at + items * gap) AS failed_at
        FROM (
            SELECT b.*,
                (t < {k} AND t * {n} < (i + 1) * {k}) AS is_dlq,
                (%(pipeline_slots)s::int[])[1 + floor({u(1)} * {SLOTS})::int] AS p,
                md5(%(salt)s || '/' || i)::uuid AS id,
                %(now)s - interval '{SEEDED_DAYS} days' + interval '1 second' * ((i + {u(2)}) * {step_seconds})
                    AS created_at,
                {m // k} + (t < {m % k})::int AS items,
                interval '1 minute' * (2 + 358 * {u(3)}) AS gap
            FROM (SELECT a.*, (a.i * {k} + {n} - 1) / {n} AS t FROM ({source}) AS a OFFSET 0) AS b
            OFFSET 0
        ) AS c
        OFFSET 0
    ) AS d
    OFFSET 0
    """


TASK_COLUMNS = """id, pipeline, input, state, current_step, total_steps, step_attempt, total_attempts, generation,
    deadline, retry_at, lease_owner, lease_expires_at, fencing_token, crash_count, in_dlq, result, failure_reason,
    failure_code, failure_message, failed_step, client_id, idempotency_scope, idempotency_key, request_fingerprint,
    created_at, updated_at, finished_at, cancel_requested_at, cancel_requested_by, cancel_reason, wait_for,
    attributes"""


def tasks_insert(plan: SeedPlan) -> str:
    """The INSERT of the tasks whose ordinals run from ``first`` to ``last``."""
    rows = _task_rows(plan, "SELECT generate_series(%(first)s::bigint, %(last)s::bigint) AS i")
    return f"""
    INSERT INTO tasks_task ({TASK_COLUMNS})
    SELECT id, pipeline, input, state, current_step, total_steps, step_attempt,
        current_step + step_attempt + CASE WHEN is_dlq THEN items * mode_attempts ELSE 0 END,
        0, NULL,
        CASE WHEN state = 'retry_scheduled' THEN %(now)s + interval '1 second' * (1 + 60 * u_time)
            WHEN state = 'waiting' THEN %(now)s + interval '1 hour' * (1 + 24 * u_time) END,
        CASE WHEN state = 'running' THEN 'worker-' || (1 + i %% 8) || ':' || (1000 + i %% 9000) ELSE '' END,
        CASE WHEN state = 'running' THEN %(now)s + interval '30 seconds' END,
        CASE WHEN state IN ('queued', 'waiting') AND NOT is_dlq THEN 0 ELSE 1 + is_dlq::int * items END,
        CASE WHEN state = ANY(%(failure_states)s) AND mode_reason = 'crash_loop' THEN mode_attempts ELSE 0 END,
        is_dlq AND last_status <> 'resolved',
        CASE WHEN state = 'succeeded' THEN jsonb_build_object('ok', true, 'steps', total_steps) END,
        CASE WHEN state = 'compensation_failed' THEN 'compensation_failed'
            WHEN state = 'cancelled' THEN 'cancelled'
            WHEN state = ANY(%(failure_states)s) THEN mode_reason ELSE '' END,
        CASE WHEN state = 'compensation_failed' THEN %(compensation_code)s
            WHEN state = 'cancelled' THEN 'cancelled'
            WHEN state = ANY(%(failure_states)s) THEN mode_code ELSE '' END,
        CASE WHEN state = 'compensation_failed' THEN compensation_message
            WHEN state = 'cancelled' THEN %(cancel_message)s
            WHEN state = ANY(%(failure_states)s) THEN message ELSE '' END,
        CASE WHEN state = ANY(%(failure_states)s) THEN mode_step ELSE '' END,
        NULL,
        CASE WHEN i %% 4 = 0 THEN 'python' ELSE '' END,
        CASE WHEN i %% 4 = 0 THEN pipeline || '-' || i END,
        '',
        created_at,
        COALESCE(finished_at, CASE WHEN is_dlq THEN failed_at ELSE created_at END),
        finished_at,
        CASE WHEN state = 'cancelled' THEN finished_at - interval '1 second' END,
        CASE WHEN state = 'cancelled' THEN 'client:seed' ELSE '' END,
        CASE WHEN state = 'cancelled' THEN 'no longer needed' ELSE '' END,
        CASE WHEN state = 'waiting' THEN 'start' ELSE '' END,
        attributes
    FROM (
        SELECT r.*,
            CASE WHEN state = 'succeeded' THEN total_steps
                WHEN is_dlq THEN (%(mode_step_index)s::int[])[m + 1]
                WHEN state = 'waiting' THEN 0
                ELSE floor(u_step * total_steps)::int END AS current_step,
            CASE WHEN state = ANY(%(failure_states)s) THEN mode_attempts
                WHEN state IN ('queued', 'waiting') THEN 0
                WHEN state = 'retry_scheduled' THEN 1 + floor(u_time * 3)::int
                ELSE 1 END AS step_attempt,
            CASE WHEN state = 'succeeded' AND is_dlq THEN last_resolved_at
                WHEN state IN ('succeeded', 'cancelled') THEN created_at + interval '1 second' * (2 + 300 * u_time)
                WHEN state IN ('failed', 'compensating') THEN failed_at
                WHEN state IN ('compensated', 'compensation_failed') THEN failed_at + interval '20 seconds'
            END AS finished_at
        FROM ({rows}) AS r
        OFFSET 0
    ) AS task
    """


def dlq_insert(plan: SeedPlan) -> str:
    """The INSERT of the run's DLQ items ``first`` to ``last``, in task order."""
    k, m = plan.dlq_tasks, plan.dlq_items
    per_task, extra = m // k, m % k
    # Item q of the run, in task order (so ids grow with creation time, as in production): task number t
    # has per_task (+1 for the first `extra` tasks) items, numbered g = 0, 1, …; the last one is "its" item.
    wide = extra * (per_task + 1)
    source = f"""
        SELECT (t * {plan.tasks}) / {k} AS i, g FROM (
            SELECT CASE WHEN q < {wide} THEN q / {per_task + 1} ELSE {extra} + (q - {wide}) / {per_task} END AS t,
                CASE WHEN q < {wide} THEN q %% {per_task + 1} ELSE (q - {wide}) %% {per_task} END AS g
            FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS q
        ) AS item"""
    rows = _task_rows(plan, source)
    return f"""
    INSERT INTO dlq_dlqitem (task_id, pipeline, reason_code, reason, error_code, error_class, error_message,
        failing_step, attempts, input_snapshot, fingerprint, status, compensation_error, resolution_code,
        resolution_note, created_at, updated_at, resolved_at, reason_params)
    SELECT id, pipeline, mode_reason, replace((%(mode_reason_text)s::text[])[m + 1], '{{message}}', message),
        mode_code, mode_class, message, mode_step, mode_attempts, input, (%(fingerprints)s::text[])[m + 1],
        status,
        CASE WHEN is_last AND state = 'compensation_failed' THEN compensation_message ELSE '' END,
        CASE WHEN is_last THEN last_resolution ELSE 'ignored' END,
        CASE WHEN is_last THEN last_note ELSE 'failed again later' END,
        item_created_at, COALESCE(resolved_at, item_created_at), resolved_at,
        jsonb_build_object('step', mode_step, 'code', mode_code, 'message', message, 'attempts', mode_attempts,
            'crashes', mode_attempts)
    FROM (
        SELECT r.*,
            CASE WHEN is_last THEN last_status ELSE 'resolved' END AS status,
            CASE WHEN NOT is_last THEN item_created_at + gap / 2
                WHEN last_status = 'resolved' THEN last_resolved_at END AS resolved_at
        FROM (
            SELECT r.*, g = items - 1 AS is_last, LEAST(%(now)s, created_at + (g + 1) * gap) AS item_created_at
            FROM ({rows}) AS r
            OFFSET 0
        ) AS r
        OFFSET 0
    ) AS item
    """


def detail_inserts(plan: SeedPlan) -> list[str]:
    """Attempts, checkpoints and side effects of a few hundred tasks: DLQ ones first, the oldest and the newest."""
    k, n = plan.dlq_tasks, plan.tasks
    source = f"""
        SELECT DISTINCT i FROM (
            SELECT (t * {n}) / {k} AS i FROM generate_series(0, {min(k, DETAILED_DLQ_TASKS) - 1}) AS t
            UNION ALL SELECT generate_series(0, {min(n, DETAILED_OLDEST_TASKS) - 1})
            UNION ALL SELECT generate_series({max(0, n - DETAILED_NEWEST_TASKS)}, {n - 1})
        ) AS ordinal"""
    # The stored task, plus what its plan says about the failure that stopped it.
    tasks = f"""
        SELECT task.*, array_position(%(pipeline_names)s::text[], task.pipeline) - 1 AS pipeline_index,
            CASE WHEN task.state = 'retry_scheduled' THEN (%(retry_error)s::text[])[1] ELSE r.mode_code END
                AS error_code,
            CASE WHEN task.state = 'retry_scheduled' THEN (%(retry_error)s::text[])[2] ELSE r.mode_class END
                AS error_class,
            CASE WHEN task.state = 'retry_scheduled' THEN replace((%(retry_error)s::text[])[3], '{{n}}', '1')
                ELSE r.message END AS error_message,
            r.mode_outcome
        FROM tasks_task AS task JOIN ({_task_rows(plan, source)}) AS r USING (id)"""
    step_name = "(%(step_names)s::text[])[(%(step_offsets)s::int[])[pipeline_index + 1] + s + 1]"
    worker = "'worker-' || (1 + s %% 8) || ':' || (1000 + s * 7)"
    attempt_columns = """task_id, kind, generation, step_index, step_name, attempt, worker, fencing_token, started_at,
        finished_at, outcome, error_code, error_class, error_message, traceback, retry_delay_seconds,
        retry_after_seconds"""
    compensation_failed = "state = 'compensation_failed' AND s = current_step - 1"
    return [
        f"""
        INSERT INTO tasks_checkpoint (task_id, step_index, step_name, output, created_at)
        SELECT id, s, {step_name}, jsonb_build_object('step', {step_name}, 'ok', true),
            created_at + interval '2 seconds' * (s + 1)
        FROM ({tasks}) AS task, generate_series(0, task.current_step - 1) AS s
        """,
        f"""
        INSERT INTO tasks_sideeffect (task_id, generation, step_index, step_name, effect_name, effect_key, status,
            created_at, compensated_at)
        SELECT id, generation, s, {step_name}, {step_name}, id || ':' || generation || ':' || {step_name},
            CASE WHEN state = 'compensated' THEN 'compensated' ELSE 'done' END,
            created_at + interval '2 seconds' * (s + 1),
            CASE WHEN state = 'compensated' THEN finished_at END
        FROM ({tasks}) AS task, generate_series(0, task.current_step - 1) AS s
        """,
        # Each completed step: one attempt that succeeded.
        f"""
        INSERT INTO tasks_stepattempt ({attempt_columns})
        SELECT id, 'step', generation, s, {step_name}, 1, {worker}, 1,
            created_at + interval '2 seconds' * s, created_at + interval '2 seconds' * s + interval '1.5 seconds',
            'succeeded', '', '', '', '', NULL, NULL
        FROM ({tasks}) AS task, generate_series(0, task.current_step - 1) AS s
        """,
        # The step the task stopped at: its failed attempts, the last one with the failure that stopped it.
        f"""
        INSERT INTO tasks_stepattempt ({attempt_columns})
        SELECT id, 'step', generation, s, {step_name}, a, {worker}, a,
            created_at + interval '2 seconds' * s + interval '1 second' * power(2, a),
            created_at + interval '2 seconds' * s + interval '1 second' * (power(2, a) + 1),
            CASE WHEN state <> 'retry_scheduled' AND a = step_attempt THEN mode_outcome
                WHEN mode_outcome = 'crashed' THEN 'crashed' ELSE 'transient_error' END,
            error_code, error_class, error_message,
            'Traceback (most recent call last):' || E'\\n' || '  File "pipeline.py", line 42, in ' || {step_name}
                || E'\\n' || error_class || ': ' || error_message,
            CASE WHEN state = 'retry_scheduled' OR a < step_attempt THEN 0.5 * power(2, a - 1) END, NULL
        FROM (SELECT task.*, task.current_step AS s FROM ({tasks}) AS task) AS task,
            generate_series(1, task.step_attempt) AS a
        WHERE state = ANY(%(failure_states)s) OR state = 'retry_scheduled'
        """,
        # Compensations run backwards over the completed steps; the first fails when compensation failed.
        f"""
        INSERT INTO tasks_stepattempt ({attempt_columns})
        SELECT id, 'compensation', generation, s, {step_name}, 1, {worker}, 1,
            finished_at - interval '1 second' * (s + 1), finished_at - interval '1 second' * s,
            CASE WHEN {compensation_failed} THEN 'transient_error' ELSE 'succeeded' END,
            CASE WHEN {compensation_failed} THEN failure_code ELSE '' END,
            CASE WHEN {compensation_failed} THEN '{TRANSIENT}' ELSE '' END,
            CASE WHEN {compensation_failed} THEN failure_message ELSE '' END,
            '', NULL, NULL
        FROM ({tasks}) AS task, generate_series(0, task.current_step - 1) AS s
        WHERE state IN ('compensated', 'compensation_failed')
        """,
    ]
