"""Settings for the Control Panel and the Run Engine.

Every setting comes from the environment through django-environ; the defaults run one
machine on embedded services (a SQLite file and kombu's filesystem broker, both under the
var directory). Each variable is documented in README.md with its default.
"""
import os
import re
import socket
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

#: Where the database file, the broker's folders, run worktrees and control records live.
VAR_DIR = Path(env.str("CP_VAR_DIR", default=str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="insecure-dev-key-change-me-in-production")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",  # the API's OpenAPI schema (/api/schema/)
    "engine.apps.EngineConfig",
    # the UI over the engine: its admin registrations (controlpanel/admin.py), found by the admin's
    # autodiscovery, and its static files (controlpanel/static, found as an app's)
    "controlpanel.apps.ControlPanelConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlpanel.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

WSGI_APPLICATION = "controlpanel.wsgi.application"

_default_db = "sqlite:///" + str(VAR_DIR / "controlpanel.sqlite3")
DATABASES = {"default": env.db_url("DATABASE_URL", default=_default_db)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Writers are serialised: every transaction takes the write lock at BEGIN, so a
    # read-then-write never fails half way with "database is locked" (docs/field-cases.md C16),
    # and WAL lets readers go on while a writer holds the lock.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": env.int("CP_SQLITE_TIMEOUT", default=60),
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
    DATABASES["default"]["TEST"] = {
        "NAME": env.str("CP_TEST_SQLITE", default=str(VAR_DIR / "test.sqlite3")),
    }
DATABASES["default"].setdefault("CONN_MAX_AGE", 0)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The JSON API under /api/ (controlpanel/api.py): a token (``Authorization: Token KEY``,
# ``python manage.py api_token USER``) or the admin's session (CSRF checked on writes);
# JSON in and out, and every refusal as {"error", "field", "message"}.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "controlpanel.api_auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "controlpanel.api_errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

#: The OpenAPI schema of the JSON API (drf-spectacular 0.30.0, served at /api/schema/).
SPECTACULAR_SETTINGS = {
    "TITLE": "Control Panel API",
    "DESCRIPTION": "The Run Engine's operations over HTTP (README.md, \"JSON API\"). A run's record is the "
                   "contract of `run_status --json` (docs/run-status.md).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# the run page's CSS/JS and vendored htmx are the controlpanel app's static files (controlpanel/static)

# ---------------------------------------------------------------- Celery (the Run Engine)
_default_broker = "filesystem://"
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=_default_broker)
CELERY_BROKER_IS_FILESYSTEM = CELERY_BROKER_URL.startswith("filesystem")
BROKER_DIR = VAR_DIR / "broker"
if CELERY_BROKER_IS_FILESYSTEM:
    for _name in ("queue", "processed", "control"):
        (BROKER_DIR / _name).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "store_processed": False,
        "control_folder": str(BROKER_DIR / "control"),
        # seconds between looks at the queue folder when it is empty
        "polling_interval": env.float("CP_BROKER_POLL", default=0.1),
    }
else:
    # Longer than the longest step: a message held by a live worker is not redelivered
    # while it still runs (docs/field-cases.md C15). The claim protects us when it is anyway.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "visibility_timeout": env.int("CP_VISIBILITY_TIMEOUT", default=6 * 3600),
    }
    # Seconds between a worker's scans for unacknowledged messages older than the visibility
    # timeout, which kombu then puts back on the queue. 0 keeps kombu's own period (kombu 5.7:
    # every 10 s with a throttle of 10, so about 100 s); tests of docs/field-cases.md C15 set 1 so that
    # the redelivery comes seconds after CP_VISIBILITY_TIMEOUT, as it would in a long run.
    if env.int("CP_BROKER_RESTORE_INTERVAL", default=0) > 0:
        CELERY_BROKER_TRANSPORT_OPTIONS.update(
            unacked_restore_interval=env.int("CP_BROKER_RESTORE_INTERVAL"), unacked_restore_throttle=1)
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A broker that blips must not kill the agent steps in progress (Celery 6 makes True the default):
# a step's evidence is in the database and its result needs no broker; a lost hand-off message is
# sent again by reconciliation.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_DEFAULT_QUEUE = env.str("CP_QUEUE", default="runs")
# No remote control: a message on the broker cannot shut a worker down, change its pool or read
# its tasks (the engine has heartbeats of its own); ``celery inspect``/``control`` get no answer.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
# beat runs reconciliation in its own process (controlpanel/beat.py): it must happen when no worker lives
CELERY_BEAT_SCHEDULER = "controlpanel.beat:ReconcilingScheduler"

# ---------------------------------------------------------------- the Run Engine's own settings
#: Run branches are named <prefix>/run-<id>.
CP_BRANCH_PREFIX = env.str("CP_BRANCH_PREFIX", default="agent")
#: Seconds between reconciliation passes (Celery beat).
CP_RECONCILE_PERIOD = env.float("CP_RECONCILE_PERIOD", default=30.0)
#: Seconds between heartbeats of a worker that holds a run's lease.
CP_HEARTBEAT_INTERVAL = env.float("CP_HEARTBEAT_INTERVAL", default=5.0)
#: Seconds a worker goes on taking a run's next steps itself, one after another, before it hands the
#: next one to the queue (engine/runner.py ``advance_chain``); 0 sends every step through the queue.
#: The default, an hour, keeps a pool process on one run to its end or its wait for a person, first
#: come first served even when steps are real agents' attempts of minutes (docs/workers.md).
CP_STEP_CHAIN_SECONDS = env.float("CP_STEP_CHAIN_SECONDS", default=3600.0)
#: Seconds without a heartbeat after which a running step's lease is stale.
CP_HEARTBEAT_STALE = env.float("CP_HEARTBEAT_STALE", default=60.0)
# git inside a database transaction or row lock: refused (a WorkspaceError) when true, else logged
# (engine/apps.py GitOutsideTransactions); the test settings refuse it, so the suite finds every one
CP_REFUSE_GIT_IN_TRANSACTION = env.bool("CP_REFUSE_GIT_IN_TRANSACTION", default=False)
#: Seconds a queued run may wait unclaimed before reconciliation enqueues it again.
CP_QUEUED_STALE = env.float("CP_QUEUED_STALE", default=60.0)
#: Seconds between the beats of a Run Engine worker's main process, which upserts the worker's row
#: (engine/workers.py: ``Worker``: its host, pid, queues, pool processes, last beat).
CP_WORKER_BEAT = env.float("CP_WORKER_BEAT", default=5.0)
#: Seconds after its last beat a worker no longer counts as alive (the home page, the Workers list,
#: ``queued_without_worker``); by default three beats, and never less than 15 s.
CP_WORKER_STALE = env.float("CP_WORKER_STALE", default=max(15.0, 3 * CP_WORKER_BEAT))
# ---------------------------------------------------------------- hosts (README.md, "Several hosts")
#: This machine's name as a host of the Run Engine: a run's worktree lives on the disk of the host
#: that claimed it, and every later step of it goes to that host's queue (engine/hosts.py). Two
#: workers with one name are one host: give each machine (each var volume) its own.
CP_HOST_NAME = env.str("CP_HOST_NAME", default="") or socket.gethostname()
if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,119}", CP_HOST_NAME):
    # it names a queue (CP_QUEUE.host.NAME) and half of a run's lease owner (NAME:pid); every process
    # (web, worker, beat, a command) stops here with this one line, exit status 1, not a traceback
    raise SystemExit(f"CP_HOST_NAME={CP_HOST_NAME!r}: a host name is 1 to 120 letters, digits, dots, dashes or "
                     f"underscores, starting with a letter or a digit")
#: The folders under which this host can reach repositories (a list separated by ":"); empty: any
#: repository path that exists here. A run is only claimed on a host that can reach its repository.
CP_HOST_REPOS = [p for p in env.str("CP_HOST_REPOS", default="").split(os.pathsep) if p.strip()]
#: The var directories of other hosts, mounted here read-only (a list separated by ":"): where the
#: Control Panel looks for a run's logs and records that its own var directory does not hold.
CP_OTHER_VAR_DIRS = [p for p in env.str("CP_OTHER_VAR_DIRS", default="").split(os.pathsep) if p.strip()]
#: The agent CLI binaries a profile's ``executable`` may name, besides the pinned installs of `make
#: agents` (absolute paths, a list separated by ":"): the operator's choice, never a pipeline
#: author's (engine/agents/executables.py). A path under a var directory is refused regardless.
CP_AGENT_EXECUTABLES = [p for p in env.str("CP_AGENT_EXECUTABLES", default="").split(os.pathsep) if p.strip()]
for _exe in CP_AGENT_EXECUTABLES:
    if not os.path.isabs(_exe):
        raise SystemExit(f"CP_AGENT_EXECUTABLES: {_exe!r} is not an absolute path (list absolute paths, separated by ':')")
#: The model gateways a profile's base_url may name, each with the variable of the workers'
#: environment that holds its key: entries URL=VARIABLE separated by commas (e.g.
#: http://127.0.0.1:4000=GATEWAY_API_KEY). The operator's choice, never a pipeline author's: the
#: workers' own provider keys go only to the provider's own hosts (engine/agents/gateways.py).
CP_GATEWAYS = [e.strip() for e in env.str("CP_GATEWAYS", default="").split(",") if e.strip()]
try:
    from engine.agents.gateways import parse as _parse_gateways

    _parse_gateways(CP_GATEWAYS)
except ValueError as _exc:
    raise SystemExit(f"CP_GATEWAYS: {_exc}") from None
#: The limits of each agent attempt and gate (engine/processes/limits.py; README.md "Configuration"): processes,
#: memory (MB), bytes written to its folders (MB), captured output (MB). A pipeline's `limits` may lower
#: each, never raise it.
for _name, _default in (("CP_ATTEMPT_MAX_PROCESSES", 512), ("CP_ATTEMPT_MAX_MEMORY_MB", 4096),
                        ("CP_ATTEMPT_MAX_WRITE_MB", 2048), ("CP_ATTEMPT_MAX_OUTPUT_MB", 64)):
    _value = os.environ.get(_name, "").strip() or str(_default)
    if not _value.isdigit() or int(_value) < 1:
        raise SystemExit(f"{_name}: must be a whole number of at least 1, got {_value!r}")
    globals()[_name] = int(_value)
#: The package registries a pipeline's setup step may reach (engine/steps/setup.py), the operator's
#: choice, never a pipeline author's: hosts (`name`, `*.suffix`, `name:port`) separated by commas. Agents
#: and gates reach none of them. With its port, a host may resolve to a private address (a mirror inside the
#: network: engine/agents/netproxy.py). CP_SETUP_PIP_INDEX_URL and CP_SETUP_NPM_REGISTRY name a mirror the
#: setup's pip and npm use instead (given as PIP_INDEX_URL and npm_config_registry; its host joins the list).
CP_SETUP_REGISTRIES = [e.strip().lower() for e in env.str(
    "CP_SETUP_REGISTRIES", default="pypi.org:443,files.pythonhosted.org:443,registry.npmjs.org:443").split(",") if e.strip()]
CP_SETUP_PIP_INDEX_URL = env.str("CP_SETUP_PIP_INDEX_URL", default="")
CP_SETUP_NPM_REGISTRY = env.str("CP_SETUP_NPM_REGISTRY", default="")
#: Days an environment no run used is kept before `python manage.py environments --evict` (which the beat
#: runs once a day) removes it; one an unfinished run uses is never removed (engine/environments.py).
CP_ENVIRONMENT_MAX_AGE_DAYS = env.float("CP_ENVIRONMENT_MAX_AGE_DAYS", default=14.0)
#: Seconds after the last beat of its last worker that a host counts as gone: reconciliation then
#: marks its running runs interrupted (once), never resuming them elsewhere.
CP_HOST_STALE = env.float("CP_HOST_STALE", default=max(CP_WORKER_STALE, CP_HEARTBEAT_STALE))

#: Seconds a step waits at most for a live process to release git's index.lock in the run's
#: worktree (a stale lock, left by a killed git, is removed at once: engine/workspace.py
#: ``clear_stale_index_lock``); then the run stops ``index_locked``.
CP_INDEX_LOCK_WAIT = env.float("CP_INDEX_LOCK_WAIT", default=120.0)
#: First port of the range handed to runs, and the size of each run's range.
CP_PORT_BASE = env.int("CP_PORT_BASE", default=20000)
CP_PORT_SPAN = env.int("CP_PORT_SPAN", default=20)
#: host:port of the Control Panel's web server (``make web``'s): with the database and the broker,
#: an address no agent or gate may reach (engine/boundary.py ``service_addresses``).
CP_WEB_ADDRESS = env.str("CP_WEB_ADDRESS", default="127.0.0.1:8000")

# ---------------------------------------------------------------- notifications (docs/notifications.md)
# A run that starts waiting for a person, and a run that ends, is notified once per decision through
# each configured channel (engine/notifications.py). No channel is configured by default.
#: Email: the addresses (comma list) that get the notices; empty: no email is sent.
CP_NOTIFY_EMAIL_TO = env.list("CP_NOTIFY_EMAIL_TO", default=[])
#: Email: the sender of the notices.
CP_NOTIFY_EMAIL_FROM = env.str("CP_NOTIFY_EMAIL_FROM", default="control-panel@localhost")
#: Webhook: the URL a JSON notice is POSTed to; empty: no webhook.
CP_NOTIFY_WEBHOOK_URL = env.str("CP_NOTIFY_WEBHOOK_URL", default="")
#: Webhook: the HMAC-SHA256 key of the X-CP-Signature header; a webhook without one is not used.
CP_NOTIFY_WEBHOOK_SECRET = env.str("CP_NOTIFY_WEBHOOK_SECRET", default="")
#: Seconds a webhook POST may take before the try counts as failed.
CP_NOTIFY_TIMEOUT = env.float("CP_NOTIFY_TIMEOUT", default=10.0)
#: Tries per delivery (the first included) before it is marked failed.
CP_NOTIFY_TRIES = env.int("CP_NOTIFY_TRIES", default=5)
#: Seconds before the first retry; each further retry waits twice as long as the one before.
CP_NOTIFY_BACKOFF = env.float("CP_NOTIFY_BACKOFF", default=30.0)
#: Seconds after which a delivery still "sending" (its worker died mid-try) is claimed again.
CP_NOTIFY_STALE = env.float("CP_NOTIFY_STALE", default=120.0)
#: The Control Panel's address as a person reaches it, for the links in notices (no trailing slash).
CP_PUBLIC_URL = env.str("CP_PUBLIC_URL", default="http://127.0.0.1:8000").rstrip("/")
# Django's mail framework sends the email: the console backend (prints to the process's output) unless
# EMAIL_BACKEND says otherwise (django.core.mail.backends.smtp.EmailBackend with EMAIL_HOST etc.).
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
EMAIL_TIMEOUT = env.float("EMAIL_TIMEOUT", default=10.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # a message's control characters (an agent-chosen name in it) are printed escaped (engine/text/terminal.py)
    "formatters": {"plain": {"()": "engine.text.terminal.SafeFormatter",
                             "format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "engine": {"handlers": ["console"], "level": env.str("CP_LOG_LEVEL", default="INFO")},
    },
}
