"""Django app configuration of the Run Engine."""
from django.apps import AppConfig


class EngineConfig(AppConfig):
    name = "engine"
    verbose_name = "Run Engine"
    default_auto_field = "django.db.models.BigAutoField"
