"""Django settings, all read from environment variables (see docs/configuration.md)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import django
from django.core.exceptions import ImproperlyConfigured

from reliability_console.config import (
    LOG_FORMATS,
    Env,
    database_config,
    proxy_ssl_header,
    redis_connection_config,
    validate_callback_hosts,
    validate_choice,
    validate_database_pooler,
    validate_directory,
    validate_http_url,
    validate_networks,
    validate_redis_url,
    validate_regex,
    validate_regex_list,
    validate_trace_url,
)
from tasks.setting_rules import LOG_LEVELS

BASE_DIR = Path(__file__).resolve().parent.parent
env = Env()
# Local state of the zero-setup run: the SQLite file, static files, the embedded Redis.
VAR_DIR = Path(env.str("RELIABILITY_VAR_DIR") or BASE_DIR / "var")

DEBUG = env.bool("DJANGO_DEBUG", False)
SECRET_KEY = env.str("DJANGO_SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY is required when DJANGO_DEBUG is off")
    SECRET_KEY = "insecure-development-key-only-for-DJANGO_DEBUG-1"
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# HTTPS: on unless DJANGO_DEBUG is on or DJANGO_SECURE_HTTPS=0 turns it off (a plain-HTTP run on
# 127.0.0.1, such as `make run`). Behind a TLS-terminating proxy, DJANGO_SECURE_PROXY_SSL_HEADER names
# the header it sets, or every request looks like plain HTTP and is redirected again and again.
SECURE_HTTPS = env.bool("DJANGO_SECURE_HTTPS", not DEBUG)
SECURE_PROXY_SSL_HEADER = proxy_ssl_header(env.str("DJANGO_SECURE_PROXY_SSL_HEADER"))
SECURE_SSL_REDIRECT = SECURE_HTTPS
SESSION_COOKIE_SECURE = SECURE_HTTPS
CSRF_COOKIE_SECURE = SECURE_HTTPS
SECURE_HSTS_SECONDS = env.integer("DJANGO_SECURE_HSTS_SECONDS", 31_536_000, minimum=0) if SECURE_HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", True)
# Prometheus and load-balancer probes often speak plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = env.list("DJANGO_SECURE_REDIRECT_EXEMPT", [])

INSTALLED_APPS = [
    # Django's admin, with the console's site (its name, translated third-party names) as the default site.
    "reliability_console.admin_site.ConsoleAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Before django_rq: the engine's rqworker command (every engine queue by default) replaces django-rq's.
    "tasks.apps.TasksConfig",
    "django_rq",
    "ninja",
    "axes",
    "dlq.apps.DlqConfig",
]
# Development-only tools (seed_scale_data) exist in a source checkout, not in the wheel, which does not ship them;
# only this project's own devtools/ counts (another installed package may have the same name).
_devtools = importlib.util.find_spec("devtools")
if _devtools is not None and _devtools.origin and Path(_devtools.origin).resolve().parent.parent == BASE_DIR:
    INSTALLED_APPS.append("devtools.apps.DevtoolsConfig")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Before anything queries with the request: a NUL character in a URL or form is a 400.
    "reliability_console.bad_input.RejectNulMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # A filter the admin accepted but the database refuses: the admin's "invalid filter" redirect.
    "reliability_console.bad_input.InvalidFilterMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it throttles repeated failed logins.
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env.integer("RELIABILITY_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env.number("RELIABILITY_LOGIN_COOLOFF_HOURS", 0.25, minimum=0.001)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

ROOT_URLCONF = "reliability_console.urls"
WSGI_APPLICATION = "reliability_console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Templates ship inside the apps (dlq/templates/): the wheel has them.
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# "transaction" when every connection goes through a transaction pooler (PgBouncer pool_mode = transaction).
DATABASE_POOLER = validate_database_pooler(env.str("DATABASE_POOLER"))
DATABASES = {"default": database_config(env.str("DATABASE_URL"), VAR_DIR, pooler=DATABASE_POOLER)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = env.str("LANGUAGE_CODE", "en")
# The console speaks English and Simplified Chinese; LocaleMiddleware picks by
# the browser's Accept-Language, falling back to LANGUAGE_CODE.
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
# The one catalogue ships inside the engine's package (tasks/locale/), so an engine-only deployment has its Chinese
# too; an embedding project finds it as an app's catalogue. Listed here as well so that, as before, it takes
# precedence over Django's and the libraries' own catalogues, and makemessages stores every app's strings in it.
LOCALE_PATHS = [BASE_DIR / "tasks" / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# WhiteNoise serves from here (after collectstatic) and warns when it is missing.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# --- Redis and RQ -----------------------------------------------------------
# Redis only delivers "run task X now"; the database is the source of truth.
REDIS_URL = validate_redis_url(env.str("REDIS_URL", "redis://127.0.0.1:6379/0"))
# Redis under Sentinel: the sentinels to ask (host:port,host:port) and the name they monitor.
REDIS_SENTINELS = env.list("REDIS_SENTINELS", [])
REDIS_SENTINEL_MASTER = env.str("REDIS_SENTINEL_MASTER")
# The engine's RQ queues, highest priority first. A pipeline names one (Pipeline(queue=...), else
# RELIABILITY_QUEUE); a worker listens to them in this order (rqworker with no arguments: all of them) and
# always takes the next job from the first non-empty one, so a critical job waits for at most the jobs
# already running. The engine's own notifications (alerts, completion callbacks) run on "critical".
RELIABILITY_QUEUES = ("critical", "default", "bulk")
RELIABILITY_QUEUE = "default"  # the queue of a pipeline that names none (and of a task whose pipeline is unknown)
_REDIS_CONNECTION = redis_connection_config(
    REDIS_URL,
    sentinels=REDIS_SENTINELS,
    master=REDIS_SENTINEL_MASTER,
    sentinel_password=env.str("REDIS_SENTINEL_PASSWORD"),
)
# One Redis (directly or through Sentinel) for every queue: a worker's queues must share its connection.
RQ_QUEUES = {
    name: {
        # A copy each: nothing that adjusts one queue's connection options reaches another's.
        **copy.deepcopy(_REDIS_CONNECTION),
        # Never pickle: a job payload is data, not code.
        "SERIALIZER": "rq.serializers.JSONSerializer",
        # The engine enforces its own per-step timeouts; RQ's job timeout
        # would kill a healthy long pipeline between two steps.
        "DEFAULT_TIMEOUT": -1,
    }
    for name in RELIABILITY_QUEUES
}
RQ = {
    "WORKER_CLASS": env.str("RELIABILITY_WORKER_CLASS", "tasks.delivery.worker.ReliabilityWorker"),
    "JOB_CLASS": "tasks.delivery.worker.ReliabilityJob",
    "COMMIT_MODE": "auto",
}
# django-rq registers its views inside the admin (/admin/django_rq/…) when this is on; they let any staff user
# empty queues and delete jobs, unaudited. Off: the console's read-only Queues page replaces them.
RQ_SHOW_ADMIN_LINK = False

# --- The engine -------------------------------------------------------------
RELIABILITY_LEASE_SECONDS = env.number("RELIABILITY_LEASE_SECONDS", 30, minimum=1)
RELIABILITY_SWEEP_INTERVAL_SECONDS = env.number("RELIABILITY_SWEEP_INTERVAL_SECONDS", 5, minimum=0.1)
RELIABILITY_MAX_CRASHES = env.integer("RELIABILITY_MAX_CRASHES", 3, minimum=1)
# A QUEUED task younger than this is left to its RQ job; older ones are checked
# against Redis and re-delivered when their job is gone.
RELIABILITY_REDELIVERY_GRACE_SECONDS = env.number("RELIABILITY_REDELIVERY_GRACE_SECONDS", 10, minimum=0)
RELIABILITY_COMPENSATION_TIMEOUT_SECONDS = env.number("RELIABILITY_COMPENSATION_TIMEOUT_SECONDS", 30, minimum=0.1)
RELIABILITY_DEFAULT_STEP_TIMEOUT_SECONDS = env.number("RELIABILITY_DEFAULT_STEP_TIMEOUT_SECONDS", 60, minimum=0.1)
# The demo and the bench pipelines are this project's choice: the engine registers neither by itself (an embedding
# project gets only its apps' pipelines.py and the modules it lists).
RELIABILITY_PIPELINE_MODULES = env.list("RELIABILITY_PIPELINE_MODULES", ["tasks.demo.report_pipeline"])
if env.bool("RELIABILITY_ENABLE_BENCH_PIPELINES", False):
    RELIABILITY_PIPELINE_MODULES.append("tasks.bench_pipelines")
# Redaction (tasks.redaction): a structure's keys whose name matches RELIABILITY_REDACT_PATTERN have their
# values redacted (and a task's input values under such keys are redacted wherever its errors and outputs
# repeat them); RELIABILITY_REDACT_PATTERNS (a JSON array) adds rules to the engine's secret shapes.
RELIABILITY_REDACT_PATTERN = validate_regex(
    "RELIABILITY_REDACT_PATTERN",
    env.str("RELIABILITY_REDACT_PATTERN", r"password|passwd|token|secret|authorization|api[_-]?key|card|cvv"),
)
RELIABILITY_REDACT_PATTERNS = validate_regex_list("RELIABILITY_REDACT_PATTERNS", env.str("RELIABILITY_REDACT_PATTERNS"))
# --- Submission API ------------------------------------------------------------
RELIABILITY_IDEMPOTENCY_TTL_SECONDS = env.number("RELIABILITY_IDEMPOTENCY_TTL_SECONDS", 86400, minimum=1)
# How long a duplicate waits for the first request with its key before a 409.
RELIABILITY_IDEMPOTENCY_WAIT_SECONDS = env.number("RELIABILITY_IDEMPOTENCY_WAIT_SECONDS", 5, minimum=0)
# After this, an IN_PROGRESS record whose owner never finished may be taken over.
RELIABILITY_IDEMPOTENCY_LOCK_SECONDS = env.number("RELIABILITY_IDEMPOTENCY_LOCK_SECONDS", 60, minimum=1)
RELIABILITY_MAX_REQUEST_BYTES = env.integer("RELIABILITY_MAX_REQUEST_BYTES", 262144, minimum=1024)
RELIABILITY_BATCH_DELIVERY_SIZE = env.integer("RELIABILITY_BATCH_DELIVERY_SIZE", 20, minimum=1)
RELIABILITY_DATABASE_STORED_FUNCTIONS = env.bool("RELIABILITY_DATABASE_STORED_FUNCTIONS", True)
# Django refuses bodies past this before our own 413 check could answer.
DATA_UPLOAD_MAX_MEMORY_SIZE = max(RELIABILITY_MAX_REQUEST_BYTES * 2, 2621440)

# --- Completion callbacks (tasks.outbound.callback_events) -------------------------------------------
# Hosts a submission's callback_url may name ("host" for any port, "host:port" for one);
# empty turns callbacks off. Our servers never send a request to any other host.
RELIABILITY_CALLBACK_ALLOWED_HOSTS = validate_callback_hosts(
    "RELIABILITY_CALLBACK_ALLOWED_HOSTS", env.list("RELIABILITY_CALLBACK_ALLOWED_HOSTS", [])
)
# After `callback_secret --rotate`, callbacks are signed with the old secret too for this long.
RELIABILITY_CALLBACK_SECRET_GRACE_SECONDS = env.number("RELIABILITY_CALLBACK_SECRET_GRACE_SECONDS", 86400, minimum=0)
# A callback's retry policy: attempts, the first backoff ceiling (tripled per attempt, at most an hour)
# and the deadline after which it is given up and parked in the DLQ.
RELIABILITY_CALLBACK_MAX_ATTEMPTS = env.integer("RELIABILITY_CALLBACK_MAX_ATTEMPTS", 8, minimum=1, maximum=100)
RELIABILITY_CALLBACK_RETRY_BASE_SECONDS = env.number("RELIABILITY_CALLBACK_RETRY_BASE_SECONDS", 5, minimum=0)
RELIABILITY_CALLBACK_DEADLINE_SECONDS = env.number("RELIABILITY_CALLBACK_DEADLINE_SECONDS", 86400, minimum=1)

# --- Retention ---------------------------------------------------------------------
# Finished tasks (with their attempts, checkpoints, ledger rows and resolved dead
# letters) are deleted this many days after they finished; 0 keeps them forever.
RELIABILITY_TASK_RETENTION_DAYS = env.integer("RELIABILITY_TASK_RETENTION_DAYS", 30, minimum=0)
# Audit entries older than this many days are deleted (and the deletion audited); 0 keeps them forever.
RELIABILITY_AUDIT_RETENTION_DAYS = env.integer("RELIABILITY_AUDIT_RETENTION_DAYS", 0, minimum=0)
# Tasks per purge transaction: each transaction deletes them and every row they own, then commits.
RELIABILITY_PURGE_BATCH_SIZE = env.integer("RELIABILITY_PURGE_BATCH_SIZE", 500, minimum=1, maximum=10000)
# The sweeper runs the purges at most this often, each run for a few seconds at most.
RELIABILITY_PURGE_INTERVAL_SECONDS = env.number("RELIABILITY_PURGE_INTERVAL_SECONDS", 60, minimum=1)
# After each batch the purges pause this many times as long as the batch took, leaving the
# database to the workers (1: it works at most half of the time; 0: flat out).
RELIABILITY_PURGE_PAUSE_RATIO = env.number("RELIABILITY_PURGE_PAUSE_RATIO", 1, minimum=0, maximum=100)

# --- Operator console -------------------------------------------------------------
RELIABILITY_BULK_APPROVAL_THRESHOLD = env.integer("RELIABILITY_BULK_APPROVAL_THRESHOLD", 100, minimum=1)
RELIABILITY_BULK_CANARY_SIZE = env.integer("RELIABILITY_BULK_CANARY_SIZE", 10, minimum=1)
RELIABILITY_BULK_CANARY_MAX_FAILURE_RATE = env.number(
    "RELIABILITY_BULK_CANARY_MAX_FAILURE_RATE", 0.2, minimum=0, maximum=1
)
RELIABILITY_BULK_RATE_PER_SECOND = env.number("RELIABILITY_BULK_RATE_PER_SECOND", 5, minimum=0.01)
# Resolved DLQ items older than this many days are purged; 0 keeps them forever.
RELIABILITY_DLQ_RETENTION_DAYS = env.integer("RELIABILITY_DLQ_RETENTION_DAYS", 0, minimum=0)

# --- Alerts and metrics ----------------------------------------------------------------
RELIABILITY_ALERT_INTERVAL_SECONDS = env.number("RELIABILITY_ALERT_INTERVAL_SECONDS", 60, minimum=1)
# Hosts alert channels may send to ("host" or "host:port"; these may be internal). Empty: any host whose every
# address is public, never loopback, private, link-local or a metadata address (dlq.alerting.url_checks).
RELIABILITY_ALERT_ALLOWED_HOSTS = validate_callback_hosts(
    "RELIABILITY_ALERT_ALLOWED_HOSTS", env.list("RELIABILITY_ALERT_ALLOWED_HOSTS", [])
)
# Where operators open the console: links in notifications point here.
RELIABILITY_CONSOLE_URL = validate_http_url(
    "RELIABILITY_CONSOLE_URL", env.str("RELIABILITY_CONSOLE_URL", "http://127.0.0.1:8000")
)
# /metrics answers only a scraper with this bearer token and/or from these networks;
# with neither configured it refuses everyone.
RELIABILITY_METRICS_TOKEN = env.str("RELIABILITY_METRICS_TOKEN")
RELIABILITY_METRICS_ALLOWED_NETWORKS = validate_networks(
    "RELIABILITY_METRICS_ALLOWED_NETWORKS", env.list("RELIABILITY_METRICS_ALLOWED_NETWORKS", [])
)
# prometheus-client's multiprocess mode: every process of this host (gunicorn,
# workers, the sweeper) must start with the same directory in its environment.
PROMETHEUS_MULTIPROC_DIR = validate_directory("PROMETHEUS_MULTIPROC_DIR", env.str("PROMETHEUS_MULTIPROC_DIR"))

# E-mail (alert channels): SMTP when EMAIL_HOST is set, else printed to the console.
_email_host = env.str("EMAIL_HOST")
_email_smtp = "django.core.mail.backends.smtp.EmailBackend"
_email_console = "django.core.mail.backends.console.EmailBackend"
_email_backend = env.str("EMAIL_BACKEND", _email_smtp if _email_host else _email_console)
_email_smtp_options = {
    "host": _email_host,
    "port": env.integer("EMAIL_PORT", 25, minimum=1, maximum=65535),
    "username": env.str("EMAIL_HOST_USER"),
    "password": env.str("EMAIL_HOST_PASSWORD"),
    "use_tls": env.bool("EMAIL_USE_TLS", False),
    "use_ssl": env.bool("EMAIL_USE_SSL", False),
    "timeout": env.number("EMAIL_TIMEOUT", 10, minimum=0.1),
}
if _email_smtp_options["use_tls"] and _email_smtp_options["use_ssl"]:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL are mutually exclusive")
if django.VERSION >= (6, 1):
    # Django 6.1 configures mail as MAILERS and deprecates every EMAIL_* setting (a warning on each read);
    # 5.2 and 6.0 know only EMAIL_*. The environment variables stay the same. Only the SMTP backend takes
    # these options: any other refuses an option it does not know.
    MAILERS = {
        "default": {
            "BACKEND": _email_backend,
            "OPTIONS": _email_smtp_options if _email_backend == _email_smtp else {},
        }
    }
    if _email_backend == _email_console and not env.str("EMAIL_BACKEND"):
        # With no SMTP server configured, e-mail channels print their messages (docs/configuration.md), in
        # production too, as on 5.2 and 6.0; 6.1's deploy check calls the console backend an error. Silenced only
        # for that default: a console backend asked for by name is still reported.
        SILENCED_SYSTEM_CHECKS = ["mail.E001"]
else:
    EMAIL_BACKEND = _email_backend
    EMAIL_HOST = _email_host
    EMAIL_PORT = _email_smtp_options["port"]
    EMAIL_HOST_USER = _email_smtp_options["username"]
    EMAIL_HOST_PASSWORD = _email_smtp_options["password"]
    EMAIL_USE_TLS = _email_smtp_options["use_tls"]
    EMAIL_USE_SSL = _email_smtp_options["use_ssl"]
    EMAIL_TIMEOUT = _email_smtp_options["timeout"]
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", "reliability-console@localhost")

REPORT_PLATFORM_URL = validate_http_url("REPORT_PLATFORM_URL", env.str("REPORT_PLATFORM_URL", "http://127.0.0.1:8765"))

LOG_LEVEL = env.str("RELIABILITY_LOG_LEVEL", "INFO").upper()
if LOG_LEVEL not in LOG_LEVELS:
    raise ImproperlyConfigured(f"RELIABILITY_LOG_LEVEL={LOG_LEVEL!r} is not a log level")
# "text": event=… task_id=… key=value lines; "json": one JSON object per line, for log shippers.
LOG_FORMAT = validate_choice("RELIABILITY_LOG_FORMAT", env.str("RELIABILITY_LOG_FORMAT", "text").lower(), LOG_FORMATS)
# What each step attempt keeps of what it logged (tasks.observability.attempt_log): its first lines and bytes, the rest
# counted.
RELIABILITY_ATTEMPT_LOG_LINES = env.integer("RELIABILITY_ATTEMPT_LOG_LINES", 200, minimum=0, maximum=10000)
RELIABILITY_ATTEMPT_LOG_BYTES = env.integer("RELIABILITY_ATTEMPT_LOG_BYTES", 65536, minimum=1024, maximum=1048576)
RELIABILITY_ATTEMPT_LOG_LEVEL = validate_choice(
    "RELIABILITY_ATTEMPT_LOG_LEVEL", env.str("RELIABILITY_ATTEMPT_LOG_LEVEL", "INFO").upper(), LOG_LEVELS
)
# Traces (tasks.observability.tracing): with the otel extra installed, every process (web, workers, sweeper) reports
# OpenTelemetry spans, configured by the standard OTEL_* variables (exporter, endpoint, service name, sampler); the
# console's task
# page links to the trace through RELIABILITY_TRACE_URL (a URL with {trace_id}, e.g. Jaeger's /trace/{trace_id}).
RELIABILITY_TRACING = env.bool("RELIABILITY_TRACING", False)
RELIABILITY_TRACE_URL = validate_trace_url("RELIABILITY_TRACE_URL", env.str("RELIABILITY_TRACE_URL"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"()": "reliability_console.logging.StructuredFormatter"},
        "json": {"()": "reliability_console.logging.JsonLinesFormatter"},
    },
    "filters": {
        # A refused request is one line (the audit's), not a warning with a traceback (reliability_console.refusal_log).
        "refusals": {"()": "reliability_console.refusal_log.RefusalFilter"},
        # Inside a step's attempt, every line carries task_id, pipeline, step and attempt
        # (tasks.observability.log_fields).
        "attempt_fields": {"()": "tasks.observability.log_fields.AttemptFieldsFilter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["attempt_fields"]},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "django.request": {"filters": ["refusals"]},
        # runserver's request lines: through our formatter, which takes credentials out of query strings.
        "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
