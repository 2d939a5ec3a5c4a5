"""Django app configuration of the Control Panel: the admin pages, the run page and the JSON API.

Installed after the Run Engine (controlpanel/settings.py INSTALLED_APPS), so that Django's admin
autodiscovery imports controlpanel/admin.py, where the engine's models are registered. The app
has no models of its own; the admin's URLs keep the models' app label (``/admin/engine/run/``).
"""
from django.apps import AppConfig


class ControlPanelConfig(AppConfig):
    """The ``controlpanel`` app: UI over the ``engine`` app, which imports nothing from it."""

    name = "controlpanel"
    verbose_name = "Control Panel"
