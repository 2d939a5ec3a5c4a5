"""The Celery app of the Run Engine and its beat schedule.

Workers start with ``celery -A controlpanel worker``; exactly one beat process runs
``celery -A controlpanel beat``, which sends ``engine.reconcile`` every
``CP_RECONCILE_PERIOD`` seconds.
"""
import os

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

# the embedded broker: kombu's filesystem transport with an atomic publish (fs_broker.py)
TRANSPORT_ALIASES["filesystem"] = "controlpanel.fs_broker:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")

app = Celery("controlpanel")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["engine"])


@app.on_after_finalize.connect
def _schedule_reconcile(sender, **kwargs):
    from django.conf import settings

    sender.add_periodic_task(
        settings.CP_RECONCILE_PERIOD, sender.signature("engine.reconcile"), name="reconcile"
    )
