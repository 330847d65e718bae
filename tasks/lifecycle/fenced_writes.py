"""A worker's fenced write: the task's conditional update and the rows of the same outcome, as one statement.

A step's outcome (task progress, checkpoint, attempt row, ledger rows) is
small, and on PostgreSQL its cost is round trips and planning: BEGIN, one
statement per row, COMMIT. Here it is one statement::

    WITH fenced AS (UPDATE tasks_task SET ... WHERE id = $1 AND (state = $2 AND fencing_token = $3) IS TRUE
                    RETURNING ...),
         row_1 AS (INSERT INTO tasks_checkpoint (task_id, ...) SELECT fenced.id, v.* FROM fenced
                   CROSS JOIN (VALUES (...)) AS v),
         row_2 AS (INSERT INTO tasks_stepattempt (task_id, ...) SELECT fenced.id, v.* FROM fenced
                   CROSS JOIN (VALUES (...)) AS v)
    SELECT TRUE, ... FROM fenced

The inserts read ``fenced``, so they write nothing when the guard fails: a
zombie's outcome is rejected as a whole. A single statement is atomic on
its own, so outside a transaction it commits by itself in one round trip;
inside ``transaction.atomic()`` (a transactional step) it joins the step's
transaction. The guard is the one ``Task.save`` applies: the state the row
was read or last saved in (ConcurrentTransitionMixin) and the fencing token
it was read with. Other databases (SQLite for local use) take the ORM path.

On a direct connection each statement is prepared once per database
session (SQL ``PREPARE``), so parsing and planning happen once too: that
saves about a quarter of a step write. A prepared statement is session
state, and a transaction pooler (PgBouncer in ``pool_mode = transaction``)
hands each transaction whichever server session is free, where the name is
missing or already taken. So with ``DATABASE_POOLER=transaction`` the same
statement runs as a PL/pgSQL function made of it (a database object, created
once; PL/pgSQL caches its plan per server session, which the pooler keeps),
or, where the user may not create functions, is sent with its parameters
each time; nothing relies on the session. A process that meets a pooler it
was not told about (a prepared name missing or taken) says so in its log and
goes the pooler's way from then on; the write that met it fails as any
bookkeeping error does, and the lease hands the task on (``tasks.execution.attempts``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, models, transaction
from django.db.models.sql import UpdateQuery
from django.utils import timezone
from django_fsm import ConcurrentTransition

from tasks.conf import engine_settings
from tasks.database_errors import sqlstate
from tasks.exceptions import LeaseLost
from tasks.models import PipelineControl, Task

logger = logging.getLogger(__name__)

# Databases whose fenced writes take one statement; others take the ORM path (same outcome, more round trips).
ONE_STATEMENT_VENDORS = frozenset({"postgresql"})


def one_statement() -> bool:
    """Whether the current database takes the one-statement path."""
    return connection.vendor in ONE_STATEMENT_VENDORS


@dataclass(frozen=True)
class BoundarySignals:
    """What a step's write found on its way: a cancel of the task, a pause of its pipeline
    (``tasks.execution.runner``)."""

    cancel_requested: bool = False
    paused: bool = False


NO_SIGNALS = BoundarySignals()


@dataclass(frozen=True)
class NewRow:
    """A row to insert as its fields' values, without a model instance (a step writes two or more per step).

    Fields not in ``values`` take what a new instance would: ``auto_now``/``auto_now_add`` the current time,
    else the field's default.
    """

    model: type[models.Model]
    values: dict

    def instance(self) -> models.Model:
        return self.model(**self.values)


def task_save_fenced(
    task: Task,
    fields: Sequence[str],
    *,
    rows: Sequence[models.Model | NewRow] = (),
    rows_ignoring_conflicts: Sequence[models.Model | NewRow] = (),
    signals: bool = False,
) -> None:
    """Save ``fields`` of ``task`` and insert ``rows``, all or nothing; ``LeaseLost`` when the guard fails.

    ``rows_ignoring_conflicts`` skip rows that would violate a unique
    constraint (the ledger: a key recorded once stays recorded). With
    ``signals``, ``task.boundary`` is set to the ``BoundarySignals`` the row
    and its pipeline's control row had at the write, in the same round trip.
    """
    if not one_statement():
        _save_with_orm(task, fields, rows, rows_ignoring_conflicts)
        if signals:
            task.boundary = _signals_read(task)
        return
    db = connections[DEFAULT_DB_ALIAS]  # the thread's connection itself: no proxy lookup per value
    state, token = task.fencing_guard()
    values = []
    expressions = []
    for field, to_db in _task_fields(tuple(fields)):
        value = field.pre_save(task, add=False)  # auto_now fields take the current time, as in save()
        if hasattr(value, "resolve_expression"):
            expressions.append(_compile(value))
        else:
            expressions.append(None)
            values.append(to_db(value, db))
    groups = _by_model(rows)
    kept_groups = _by_model(rows_ignoring_conflicts)
    statement = _statement(
        tuple(fields),
        tuple(expressions),
        token is not None,
        tuple((model, len(group)) for model, group in groups),
        tuple((model, len(group)) for model, group in kept_groups),
        signals,
    )
    # Plain str and the id's text: the driver adapts a str subclass (a TaskState) and a UUID by slower paths.
    params = [*values, str(task.pk), str.__str__(state) if isinstance(state, str) else state]
    if token is not None:
        params.append(token)
    now = None
    for model, group in groups + kept_groups:
        link = _task_link(model).attname
        for row in group:
            new = isinstance(row, NewRow)
            # A row's link to the task is the task the statement updates (its column reads fenced's id).
            if (row.values.get(link) if new else getattr(row, link)) != task.pk:
                raise ValueError(f"a {model.__name__} row of another task in task {task.pk}'s fenced write")
            if not new:
                params += [to_db(field.pre_save(row, add=True), db) for field, to_db in _child_fields(model)]
                continue
            values = row.values
            for attname, as_is, to_db, default in _row_plan(model):
                value = values.get(attname, _ABSENT)
                if value is _ABSENT:
                    if default is _NOW:
                        now = now or timezone.now()
                        value = now
                    else:
                        value = default()
                params.append(value if value is None or type(value) in as_is else to_db(value, db))
    written = execute_statement(db, statement, params)
    if written is None:
        raise LeaseLost(f"task {task.pk}: a newer lease holder or state exists")
    returned = written[1:]
    if signals:
        *returned, cancel_requested, paused = returned
        task.boundary = BoundarySignals(bool(cancel_requested), bool(paused))
    # The database's values of expressions (the lease's expiry) replace them, as a reload would.
    for field, value in zip(statement.returned, returned, strict=True):
        setattr(task, field.attname, value)
    task.mark_saved()


def _signals_read(task: Task) -> BoundarySignals:
    cancel_requested = Task.objects.filter(pk=task.pk, cancel_requested_at__isnull=False).exists()
    paused = PipelineControl.objects.filter(pipeline=task.pipeline, paused=True).exists()
    return BoundarySignals(cancel_requested, paused)


def task_save_guarded(task: Task, fields: Sequence[str]) -> None:
    """``task.save(update_fields=fields)`` through the ORM, its guard failing as ``LeaseLost``."""
    try:
        task.save(update_fields=list(fields))
    except ConcurrentTransition:
        raise LeaseLost(f"task {task.pk}: a newer lease holder or state exists") from None


def _save_with_orm(task: Task, fields, rows, rows_ignoring_conflicts) -> None:
    with transaction.atomic():
        task_save_guarded(task, fields)
        for model, group in _by_model(rows):
            model.objects.bulk_create([_instance(row) for row in group])
        for model, group in _by_model(rows_ignoring_conflicts):
            model.objects.bulk_create([_instance(row) for row in group], ignore_conflicts=True)


def _instance(row: models.Model | NewRow) -> models.Model:
    return row.instance() if isinstance(row, NewRow) else row


@dataclass(frozen=True)
class _Statement:
    name: str
    prepare_sql: str  # PREPARE name AS ... ($n placeholders)
    execute_sql: str  # EXECUTE name(%s, ...)
    plain_sql: str  # the statement itself, %s placeholders in the order of the parameters
    returned: tuple[models.Field, ...]
    # The same statement as a stored function (behind a transaction pooler): its CREATE and its call, each
    # parameter cast to the function's argument type. Empty when the builder gave no types.
    function_sql: str = ""
    call_sql: str = ""


# One statement text per shape of write (fields, literal expressions, row counts): a handful per process.
@functools.lru_cache(maxsize=256)
def _statement(fields, expressions, fenced: bool, row_shape, kept_shape, signals: bool = False) -> _Statement:
    types: list[str] = []  # each parameter's type, in order (for the stored function's arguments)

    def param(db_type: str, cast: bool = False) -> str:
        types.append(db_type)
        return f"CAST({PARAMETER} AS {db_type})" if cast else PARAMETER

    table = Task._meta.db_table
    sets = []
    returned = []
    for name, expression in zip(fields, expressions, strict=True):
        field = Task._meta.get_field(name)
        if expression is None:
            sets.append(f"{_q(field.column)} = {param(cast_type(field))}")
        else:
            sets.append(f"{_q(field.column)} = {expression}")
            returned.append(field)
    where = f"{_q(Task._meta.pk.column)} = {param(cast_type(Task._meta.pk))}"
    guard = f"{_q(Task._meta.get_field('state').column)} = {param('text')}"
    if fenced:
        guard += f" AND {_q(Task._meta.get_field('fencing_token').column)} = {param('bigint')}"
    # "(guard) IS TRUE" filters the row the primary key finds: written as
    # plain conditions, the planner may use an index on state instead and
    # walk every running task (and its dead versions) on each step.
    where += f" AND ({guard}) IS TRUE"
    returning_fenced = ", ".join([_q(Task._meta.pk.column)] + [_q(field.column) for field in returned])
    # The statement answers a row when it wrote (its first column a constant: the caller knows the id, and a
    # returned uuid is parsed back into one on every step), then the database's values of the expressions.
    returning = ", ".join(["TRUE"] + [_q(field.column) for field in returned])
    if signals:
        # Read in the same statement, so a step boundary costs no round trip to learn them.
        cancel = f"{_q(Task._meta.get_field('cancel_requested_at').column)} IS NOT NULL"
        paused = (
            f"EXISTS (SELECT 1 FROM {_q(PipelineControl._meta.db_table)} rc_control "
            f"WHERE rc_control.{_q('pipeline')} = {_q(table)}.{_q('pipeline')} AND rc_control.{_q('paused')})"
        )
        returning_fenced += f", {cancel} AS rc_cancel, {paused} AS rc_paused"
        returning += ", rc_cancel, rc_paused"
    parts = [f"fenced AS (UPDATE {_q(table)} SET {', '.join(sets)} WHERE {where} RETURNING {returning_fenced})"]
    task_id = f"fenced.{_q(Task._meta.pk.column)}"  # each inserted row's task: the one updated
    for prefix, shape, conflict in (("row", row_shape, ""), ("kept", kept_shape, " ON CONFLICT DO NOTHING")):
        for model, count in shape:
            fields_of_row = [field for field, _ in _child_fields(model)]
            # The row's task is the updated one: its id comes from fenced, not once more as a parameter.
            columns = ", ".join(_q(field.column) for field in [_task_link(model), *fields_of_row])
            # Parameters of INSERT ... SELECT are not typed by their target
            # columns (as in VALUES): each is cast to its column's type. Text
            # goes as text (a cast to varchar(n) would silently truncate).
            casts = [cast_type(field) for field in fields_of_row]
            values = ", ".join("(" + ", ".join(param(cast, cast=True) for cast in casts) + ")" for _ in range(count))
            parts.append(
                f"{prefix}_{len(parts)} AS (INSERT INTO {_q(model._meta.db_table)} ({columns}) "
                f"SELECT {task_id}, v.* FROM fenced CROSS JOIN (VALUES {values}) AS v{conflict})"
            )
    # The columns' own types: RETURN QUERY takes no other (varchar is not text there).
    result_types = ["boolean", *(field.db_type(connection) for field in returned)]
    if signals:
        result_types += ["boolean", "boolean"]
    sql = f"WITH {', '.join(parts)} SELECT {returning} FROM fenced"
    return prepared_form(sql, tuple(returned), types=tuple(types), result_types=tuple(result_types))


def prepared_form(sql: str, returned: tuple = (), *, types: tuple = (), result_types: tuple = ()) -> _Statement:
    """A statement written with ``PARAMETER`` for each parameter, in its prepared and its plain form, and with
    its parameters' ``types`` and its columns' ``result_types``, as a stored function too."""
    pieces = sql.split(PARAMETER)
    numbered = pieces[0] + "".join(f"${number}{piece}" for number, piece in enumerate(pieces[1:], start=1))
    # An inlined literal's "%" would read as a placeholder in the plain form.
    plain = "%s".join(piece.replace("%", "%%") for piece in pieces)
    name = "rc_fenced_" + hashlib.sha1(numbered.encode()).hexdigest()[:20]
    arguments = ", ".join(["%s"] * (len(pieces) - 1))
    function_sql = call_sql = ""
    if types and result_types:
        if len(types) != len(pieces) - 1:
            raise ValueError(f"{len(types)} parameter types for {len(pieces) - 1} parameters")
        # The body is the statement itself ($n are the function's arguments). Its columns are named rc_out_n:
        # a name of a column it reads would be ambiguous with them in PL/pgSQL.
        outputs = ", ".join(f"rc_out_{number} {kind}" for number, kind in enumerate(result_types, start=1))
        body = f"BEGIN RETURN QUERY {numbered}; END"
        signature = f"{', '.join(types)}) RETURNS TABLE ({outputs}) LANGUAGE plpgsql VOLATILE AS $rc_fn$ {body} $rc_fn$"
        function = "rc_fn_" + hashlib.sha1(signature.encode()).hexdigest()[:20]
        function_sql = f"CREATE OR REPLACE FUNCTION {function}({signature}"
        call_sql = f"SELECT * FROM {function}({', '.join(f'CAST(%s AS {kind})' for kind in types)})"
    return _Statement(
        name, f"PREPARE {name} AS {numbered}", f"EXECUTE {name}({arguments})", plain, returned, function_sql, call_sql
    )


# Stands for a parameter while a statement is built; no SQL text contains it.
PARAMETER = "\ue000"
# The statements prepared on each server connection (a new connection starts with none).
_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# SQLSTATEs of "prepared statement does not exist" and "... already exists": a pooler between us and the server.
POOLER_SIGNS = frozenset({"26000", "42P05"})
# Set once this process has met a pooler it was not told about.
_pooler_seen = False


def prepared_statements() -> bool:
    """Whether fenced writes are prepared per session: only on a connection that is its own server session and
    whose parameters Django binds on the client (its default)."""
    return (
        engine_settings.DATABASE_POOLER != "transaction"
        and not _pooler_seen
        # psycopg 3 with Django's server_side_binding sends parameters apart, which EXECUTE cannot take
        # ("there is no parameter $1"), and prepares a statement it sees often by itself.
        and connections[DEFAULT_DB_ALIAS].settings_dict.get("OPTIONS", {}).get("server_side_binding") is not True
    )


def execute_statement(db, statement: _Statement, params: list) -> tuple | None:
    """Run ``statement`` (prepared once per session where that holds, else plain); its first row or None."""
    global _pooler_seen
    with db.cursor() as cursor:
        if not prepared_statements():
            if not (statement.call_sql and _function_ready(db, cursor, statement)):
                cursor.execute(statement.plain_sql, params)
                return cursor.fetchone()
            try:
                cursor.execute(statement.call_sql, params)
            except DatabaseError as exc:
                if sqlstate(exc) != UNDEFINED_FUNCTION:
                    raise
                # Dropped since this process made it (a restored database, a clean-up): made again.
                _functions.discard(statement.call_sql)
                if db.in_atomic_block or not _function_ready(db, cursor, statement):
                    raise
                cursor.execute(statement.call_sql, params)
            return cursor.fetchone()
        prepared = _prepared.setdefault(db.connection, set())
        try:
            if statement.name not in prepared:
                cursor.execute(statement.prepare_sql)
                # Prepared statements outlive a rolled-back transaction, so the
                # record holds even if this transaction fails later.
                prepared.add(statement.name)
            cursor.execute(statement.execute_sql, params)
        except DatabaseError as exc:
            if sqlstate(exc) not in POOLER_SIGNS:
                raise
            # The session's statements are not what this connection prepared:
            # a pooler hands out server sessions per transaction (or someone
            # ran DISCARD ALL). Stop relying on them for good.
            _pooler_seen = True
            _prepared.clear()
            logger.warning(
                "prepared statements lost between transactions: a transaction pooler? Sending plain statements",
                extra={"event": "pooler_detected", "hint": "set DATABASE_POOLER=transaction"},
            )
            if db.in_atomic_block:
                raise  # the error aborted the caller's transaction: only its retry can help
            cursor.execute(statement.plain_sql, params)
        return cursor.fetchone()


# Behind a transaction pooler nothing prepared outlives a transaction, so a plain statement is parsed and
# planned on every step. A PL/pgSQL function's plans are cached per server session, which the pooler keeps: the
# statement as a function gives back the prepared statement's saving (`make bench` measures both). A function
# is a database object, created by the first process that needs it (CREATE OR REPLACE, idempotent, named by a
# hash of its text: a changed shape is a new function). The functions this process created or found.
_functions: set[str] = set()
# Set when the database refused to create one (no CREATE privilege on the schema): plain statements from then on.
_functions_refused = False
# SQLSTATEs: the function is missing (dropped, a restored database); the user may not create one.
UNDEFINED_FUNCTION = "42883"
INSUFFICIENT_PRIVILEGE = "42501"
# Another process created the same function at the same moment: pg_proc's unique index ("duplicate key"), or
# "tuple concurrently updated" when both replaced it. Either way it exists now.
CONCURRENTLY_CREATED = frozenset({"23505", "XX000"})


def stored_functions() -> bool:
    """Whether a write behind a pooler goes through a stored function (else as a plain statement)."""
    return engine_settings.DATABASE_STORED_FUNCTIONS and not _functions_refused


def _function_ready(db, cursor, statement: _Statement) -> bool:
    """Whether ``statement``'s function may be called now: known to exist, or created here and now."""
    global _functions_refused
    if not stored_functions():
        return False
    if statement.call_sql in _functions:
        return True
    if db.in_atomic_block:
        return False  # a CREATE would join the caller's transaction (and die with it): plain this time
    try:
        cursor.execute(statement.function_sql)
    except DatabaseError as exc:
        code = sqlstate(exc)
        if code == INSUFFICIENT_PRIVILEGE:
            _functions_refused = True
            logger.warning(
                "the database user may not create functions: writes behind the pooler are sent as plain statements",
                extra={
                    "event": "stored_functions_refused",
                    "hint": "grant CREATE on the schema, or set RELIABILITY_DATABASE_STORED_FUNCTIONS=0",
                },
            )
            return False
        if code not in CONCURRENTLY_CREATED:
            raise
    _functions.add(statement.call_sql)
    return True


@functools.lru_cache(maxsize=64)
def _compile(expression) -> str:
    """An expression's SQL with its parameters inlined (a literal: the statement's text is then fixed per shape)."""
    query = UpdateQuery(Task)
    compiler = query.get_compiler(connection=connection)
    sql, params = compiler.compile(expression.resolve_expression(query, allow_joins=False, for_save=True))
    # Django's own literal rendering: a psycopg2 cursor's mogrify returns bytes, psycopg 3's cursors other than
    # ClientCursor have none.
    return connection.ops.compose_sql(sql, params)


@functools.lru_cache(maxsize=64)
def _task_fields(names: tuple[str, ...]) -> tuple[tuple[models.Field, Callable], ...]:
    """The task's fields of a write, each with its conversion: looked up once per shape, not on every step."""
    return tuple((field, _to_db(field)) for field in (Task._meta.get_field(name) for name in names))


@functools.cache
def _insert_fields(model: type[models.Model]) -> tuple[tuple[models.Field, Callable], ...]:
    return tuple((field, _to_db(field)) for field in model._meta.concrete_fields if field is not model._meta.auto_field)


@functools.cache
def _task_link(model: type[models.Model]) -> models.Field:
    """``model``'s foreign key to the task: a row written with a task's outcome belongs to that task."""
    links = [field for field, _ in _insert_fields(model) if field.is_relation and field.related_model is Task]
    if len(links) != 1:
        raise TypeError(f"{model.__name__} has {len(links)} foreign keys to Task: a fenced write's rows need one")
    return links[0]


@functools.cache
def _child_fields(model: type[models.Model]) -> tuple[tuple[models.Field, Callable], ...]:
    """The inserted fields of ``model`` sent as parameters: all but its link to the task."""
    link = _task_link(model)
    return tuple((field, to_db) for field, to_db in _insert_fields(model) if field is not link)


# A field a NewRow leaves out: it takes the current time (auto_now, auto_now_add) or its default.
_ABSENT = object()
_NOW = object()


@functools.cache
def _row_plan(model: type[models.Model]) -> tuple[tuple[str, tuple, Callable, object], ...]:
    """Per inserted field of ``model``: its attname, the types it sends unchanged, its conversion and what it
    takes when a ``NewRow`` leaves it out, looked up once per model (a step writes two rows of ~25 fields)."""
    plan = []
    for field, to_db in _child_fields(model):
        now = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
        plan.append((field.attname, _as_is(field), to_db, _NOW if now else field.get_default))
    return tuple(plan)


# Python types that a field of each kind sends to PostgreSQL unchanged (get_db_prep_save is the identity).
_AS_IS = {
    "AutoField": (int,),
    "BigAutoField": (int,),
    "IntegerField": (int,),
    "BigIntegerField": (int,),
    "SmallIntegerField": (int,),
    "PositiveIntegerField": (int,),
    "PositiveBigIntegerField": (int,),
    "PositiveSmallIntegerField": (int,),
    "CharField": (str,),
    "TextField": (str,),
    "FloatField": (float,),
    "BooleanField": (bool,),
    "UUIDField": (uuid.UUID,),
}


@functools.cache
def _to_db(field: models.Field) -> Callable:
    """``field.get_db_prep_save``, skipped for values it would pass unchanged (most of a step's values)."""
    if _kind(field) == "DateTimeField":

        def to_db(value, db):
            if value is None or (type(value) is datetime and value.tzinfo is not None):
                return value
            return field.get_db_prep_save(value, db)  # a naive datetime: Django warns and converts

        return to_db
    as_is = _as_is(field)
    if not as_is:
        return field.get_db_prep_save  # JSON and anything else: always Django's conversion

    if str in as_is:

        def to_db(value, db):
            if value is None or type(value) is str:
                return value
            # A text choice (TaskState.RUNNING) goes as the plain string it is: the driver adapts a str subclass
            # by a slower lookup (a step sends four).
            return str.__str__(value) if isinstance(value, str) else field.get_db_prep_save(value, db)

        return to_db

    def to_db(value, db):
        return value if value is None or type(value) in as_is else field.get_db_prep_save(value, db)

    return to_db


def _kind(field: models.Field) -> str:
    """The internal type of what ``field`` stores (a foreign key: its target's)."""
    return (field.target_field if field.is_relation else field).get_internal_type()


def _as_is(field: models.Field) -> tuple[type, ...]:
    """The Python types ``field`` sends unchanged (``_to_db`` passes them through): none for JSON, datetimes, …"""
    return _AS_IS.get(_kind(field), ())


def cast_type(field: models.Field) -> str:
    """The SQL type a parameter of ``field`` is sent as (text for any string: a varchar(n) cast truncates)."""
    db_type = field.db_type(connection)
    return "text" if db_type.startswith(("varchar", "text")) else db_type


def _by_model(rows: Sequence) -> list[tuple[type[models.Model], list]]:
    groups: dict[type[models.Model], list] = {}
    for row in rows:
        groups.setdefault(row.model if isinstance(row, NewRow) else type(row), []).append(row)
    return list(groups.items())


def _q(name: str) -> str:
    return connection.ops.quote_name(name)
