"""Who may call which endpoint of the JSON API: one Django permission per Run Engine operation.

Authentication itself is REST framework's (settings.REST_FRAMEWORK): a token or the admin's
session. The permissions are ``engine.add_run`` (create), ``engine.view_run`` (status) and the
Run model's own ``engine.start_run``, ``approve_run``, ``recheck_run``, ``recover_run`` and
``fail_run`` (engine/models.py, Run.Meta); the admin's buttons check the same ones.
"""
from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.permissions import BasePermission

from engine.models import Run


def permission_label(perm: str) -> str:
    """The human name of an ``engine.<codename>`` permission ("Can start a run")."""
    codename = perm.partition(".")[2]
    custom = dict(Run._meta.permissions)
    if codename in custom:
        return custom[codename]
    action = codename.rpartition("_")[0]
    return f"Can {action} {Run._meta.verbose_name}"


class MissingPermission(exceptions.PermissionDenied):
    """403: the authenticated user lacks ``permission`` (``engine.<codename>``), named in the message."""

    def __init__(self, user, permission: str):
        self.permission = permission
        super().__init__(f"{user.get_username()!r} lacks the permission {permission} "
                         f"({permission_label(permission)}); an administrator can grant it in the admin "
                         "(Users or Groups).")


class RunPermission(BasePermission):
    """Allows a view to the authenticated user holding ``view.required_permission``.

    An anonymous request is refused as not authenticated (401); an authenticated user without
    the permission gets MissingPermission (403) naming it.
    """

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        perm = view.required_permission
        if not user.has_perm(perm):
            raise MissingPermission(user, perm)
        return True


class BearerTokenAuthentication(TokenAuthentication):
    """The same API token in the other common header form, ``Authorization: Bearer KEY``."""

    keyword = "Bearer"
