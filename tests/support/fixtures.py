"""Fixtures more than one test module uses, made available to every test by tests/conftest.py."""
import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from engine import runner

from .claude import REVIEW_TURNS, WRITE_ANSWER, claude_profile

#: the credential variables of claude and codex (bare() removes them all)
CREDENTIAL_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN", "CODEX_API_KEY",
                        "OPENAI_API_KEY", "CODEX_HOME")


@pytest.fixture
def route(monkeypatch):
    """Send the messages this process sends (Start, Recover) to ``queue`` instead of the session's."""
    from engine.tasks import advance_run

    def to(queue: str) -> None:
        monkeypatch.setattr(runner, "enqueue",
                            lambda run_id, token: advance_run.apply_async(args=[run_id, token], queue=queue))
    return to


@pytest.fixture
def staff(client, django_user_model):
    """A client logged in as a superuser (every permission), user name ``admin``."""
    user = django_user_model.objects.create_superuser("admin", "admin@example.invalid", "pw-for-tests-only")
    client.force_login(user)
    return client


@pytest.fixture
def staff_with(django_user_model):
    """``make(name, *codenames)``: a client of a staff user holding only those engine permissions."""
    def make(name, *codenames):
        user = django_user_model.objects.create_user(name, f"{name}@example.invalid", "pw-for-tests-only",
                                                     is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(content_type__app_label="engine",
                                                              codename__in=codenames))
        client = Client()
        client.force_login(user)
        return client
    return make


@pytest.fixture
def author(django_user_model):
    """A staff user with only engine.change_pipeline, engine.view_pipeline and engine.add_run: a web
    client (logged in) and an API client (its token)."""
    user = django_user_model.objects.create_user("author", "author@example.invalid", "pw-for-tests-only",
                                                 is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="engine",
                                                         codename__in=("change_pipeline", "view_pipeline", "add_run")))
    from django.test import Client

    web = Client()
    web.force_login(user)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return web, api


@pytest.fixture
def bare(monkeypatch, tmp_path):
    """No credential variable in the environment and an empty HOME (no login file); returns HOME."""
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "worker-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.fixture
def claude_pipeline(make_pipeline):
    """``claude_pipeline(endpoint=WRITE_ANSWER, deadline=60, **profile)``: a saved pipeline whose every role is the
    real claude against the scripted endpoint (tests/support/claude.py)."""
    def factory(endpoint=WRITE_ANSWER, deadline=60, **profile_extra):
        return make_pipeline(
            name="claude", roles={"implementer": "claude", "reviewer": "claude", "documenter": "claude"},
            profiles={"claude": claude_profile({"stages": {"answer": {"implement": endpoint, "review": REVIEW_TURNS}}},
                                               **profile_extra)},
            deadlines={"implement": deadline, "gate": 120})
    return factory


def client_of(django_user_model, name: str, *codenames: str) -> APIClient:
    user = django_user_model.objects.create_user(name, f"{name}@example.invalid", "pw-for-tests-only")
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="engine", codename__in=codenames))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


WORKER_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "GITHUB_TOKEN": "ghp_0123456789abcdefghijklmnopqrstuvwxyz",
    "PGPASSWORD": "pg-password-of-the-worker",
    "DATABASE_URL": "postgres://cp:db-password-of-the-worker@127.0.0.1:5432/controlpanel",
    "CELERY_BROKER_URL": "redis://:broker-password@127.0.0.1:6379/0",
    "DJANGO_SECRET_KEY": "django-secret-of-the-worker",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
}
