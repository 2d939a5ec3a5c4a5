"""The Celery app of the Run Engine, its beat schedule, and one fix to kombu's Redis transport.

Workers start with ``celery -A controlpanel worker`` (the flags: engine/processes/worker_process.py
``WORKER_FLAGS``, the same in the Makefile and docker-compose.yml); exactly one beat process runs
``celery -A controlpanel beat``, which runs the ``engine.reconcile`` entry every
``CP_RECONCILE_PERIOD`` seconds in its own process (controlpanel/beat.py).
"""
import logging
import os
from queue import Empty

from celery import Celery
from celery.signals import celeryd_after_setup
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis


def close_redis_channels_after_a_lost_broker() -> None:
    """Make kombu's Redis ``Channel.close`` finish when its connection is already dead.

    The defect (celery 5.7.0, kombu 5.7.0, redis-py 8.1.0; a worker killed by any Redis restart):
    when the broker goes away while a step runs (an unacknowledged message, ``acks_late``) and
    the worker has a free pool process (so a BRPOP is pending), Celery's
    ``Consumer.on_connection_error_after_connected`` first calls ``connection.collect()``. That
    closes the task channel: ``Channel.close`` reads the pending BRPOP reply, the read raises a
    ConnectionError, and the close is abandoned half way (the channel stays open, its
    unacknowledged message still listed). The transport's own pass over its channels stops at
    the remote-control channel, whose close (deleting its fanout queue) raises a ConnectionError
    too; ``collect()`` swallows both and detaches the transport (``transport.client = None``).
    Celery then calls ``connection.close()``, which closes the task channel again: restoring its
    unacknowledged message builds a Redis pool from the detached transport and fails with
    ``AttributeError: 'NoneType' object has no attribute 'hostname'``, which is no connection
    error, so the worker stops ("Unrecoverable error") once its steps end. Gossip, mingle and
    the worker heartbeat play no part; a worker whose pool processes are all busy (``-c 1``) has
    no BRPOP pending and survives.

    The fix: a pending BRPOP whose connection is dead has nothing to read, so its ConnectionError
    no longer abandons the close; the first close then completes while the transport is still
    attached (restoring the message fails with a connection error, which is ignored, as when no
    BRPOP was pending), and the second close is a no-op. Idempotent; does nothing when kombu's
    channel no longer has the attributes it relies on. The message itself is not lost: it is
    still in Redis's unacknowledged set if Redis kept it, and a redelivered copy claims nothing
    (the step's fencing token), and the step's result needs no broker.
    """
    channel = kombu_redis.Channel
    close = channel.close
    if getattr(close, "drains_dead_brpop", False) or not hasattr(channel, "_brpop_read"):
        return

    def close_draining_a_dead_brpop(self):
        if self._in_poll:
            try:
                self._brpop_read()  # resets _in_poll whatever happens
            except Empty:
                pass
            except self.connection_errors:
                pass  # the connection is gone: there is no reply to read
        return close(self)

    close_draining_a_dead_brpop.drains_dead_brpop = True
    close_draining_a_dead_brpop.__doc__ = close.__doc__
    channel.close = close_draining_a_dead_brpop


close_redis_channels_after_a_lost_broker()

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


@celeryd_after_setup.connect
def _consume_the_host_queue(sender, instance, **kwargs):
    """Every worker also consumes its host's own queue (engine/hosts.py ``host_queue``), where the
    steps of the runs pinned to this host go (Celery's documented ``celeryd_after_setup`` +
    ``app.amqp.queues.select_add``). A worker whose host name another live worker serves with another
    var directory is refused here, before it consumes anything (engine/hosts.py ``disk_conflict``)."""
    from engine.hosts import disk_conflict, host_queue, this_host

    try:
        conflict = disk_conflict()
    except Exception:  # the database away at start: the worker starts, as it did before hosts were records
        logging.getLogger("engine.hosts").warning("could not check this host's var directory", exc_info=True)
        conflict = ""
    if conflict:  # printed once, by Python, as the worker exits with status 1
        raise SystemExit(f"worker refused: {conflict}")  # BaseException: Celery's signal dispatch re-raises it
    instance.app.amqp.queues.select_add(host_queue(this_host()))
