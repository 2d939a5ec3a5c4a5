"""The Control Panel: the Django project around the Run Engine."""
from .celery import app as celery_app

__all__ = ("celery_app",)
