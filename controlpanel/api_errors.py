"""Every refusal of the JSON API as one shape: ``{"error": code, "field": name or "", "message": sentence}``.

An ``OperationError`` of the Run Engine keeps its own code and field (``as_dict()``), with the
HTTP status its kind calls for (``status_for``); Django REST framework's own refusals
(authentication, permission, a body that is not JSON, a method the endpoint does not take) and
the serializers' validation errors get the same shape here, so a client reads one format only.
"""
from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from engine.operations import OperationError
from engine.text import hints

log = logging.getLogger("engine.api")

#: OperationError codes that say "no such thing" (HTTP 404).
NOT_FOUND = frozenset({"unknown_run", "unknown_pipeline"})
#: OperationError codes that say "not in this state" (HTTP 409): asking again later may work.
CONFLICT = frozenset({"already_started", "not_waiting_review", "not_waiting_approval", "not_waiting",
                      "stale_decision", "already_finished", "budget_exhausted", "host_unconfirmed",
                      "not_ended", "already_rerun"})  # the last two: engine/operations.py ``rerun``


def status_for(code: str) -> int:
    """The HTTP status of an OperationError code: 404 for an unknown run or pipeline, 409 for a
    state conflict, 400 for every other refusal of the input."""
    if code in NOT_FOUND:
        return status.HTTP_404_NOT_FOUND
    if code in CONFLICT:
        return status.HTTP_409_CONFLICT
    return status.HTTP_400_BAD_REQUEST


def body(code: str, message: str, field: str = "", **extra) -> dict:
    """The error body: ``{"error", "field", "message"}`` plus any ``extra`` keys."""
    return {"error": code, "field": field, "message": message, **extra}


def first_validation_error(detail, prefix: str = "") -> tuple[str, str]:
    """``(field, sentence)`` of the first problem in a serializer's ``errors`` (nested dicts and
    lists of ``ErrorDetail``); the field is dotted for nested inputs (``profiles.reviewer``)."""
    if isinstance(detail, dict) and detail:
        key, value = next(iter(detail.items()))
        name = prefix if key in ("non_field_errors", "__all__") else (f"{prefix}.{key}" if prefix else str(key))
        return first_validation_error(value, name)
    if isinstance(detail, (list, tuple)):
        for item in detail:
            if item:  # a list field reports [{}, {...}]: the first non-empty entry
                return first_validation_error(item, prefix)
    if not detail or isinstance(detail, (dict, list, tuple)):
        return prefix, "The input is not valid."
    return prefix, str(detail)


def validation_body(detail) -> dict:
    """The error body of a serializer's errors: code ``invalid``, the first field named in it."""
    field, problem = first_validation_error(detail)
    field = field or "body"
    return body("invalid", f"{field}: {problem}", field)


def _drf_body(exc: exceptions.APIException) -> tuple[dict, int]:
    if isinstance(exc, exceptions.ValidationError):
        return validation_body(exc.detail), status.HTTP_400_BAD_REQUEST
    if isinstance(exc, exceptions.ParseError):
        return body("invalid", f"The body is not valid JSON: {exc.detail}", "body"), status.HTTP_400_BAD_REQUEST
    if isinstance(exc, exceptions.UnsupportedMediaType):
        # a form, plain text or any other body that is not JSON is bad input like any other
        return body("invalid", f"The body must be a JSON object (Content-Type: application/json): {exc.detail}",
                    "body"), status.HTTP_400_BAD_REQUEST
    if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
        code = "not_authenticated" if isinstance(exc, exceptions.NotAuthenticated) else "authentication_failed"
        return body(code, f"{exc.detail} Send 'Authorization: Token KEY' ({hints.manage('api_token USER')}) "
                    "or log in to the admin.", ""), exc.status_code
    if isinstance(exc, exceptions.PermissionDenied):
        extra = {"permission": exc.permission} if getattr(exc, "permission", "") else {}
        return body("permission_denied", str(exc.detail), "", **extra), exc.status_code
    if isinstance(exc, exceptions.MethodNotAllowed):
        return body("method_not_allowed", str(exc.detail), ""), exc.status_code
    if isinstance(exc, exceptions.NotFound):
        return body("not_found", str(exc.detail), ""), exc.status_code
    return body(exc.default_code or "error", str(exc.detail), ""), exc.status_code


def exception_handler(exc, context):
    """REST framework's EXCEPTION_HANDLER: an error body for every exception raised in a view.

    OperationError -> its ``as_dict()`` with ``status_for(code)``; REST framework exceptions ->
    the same shape with their own status (401 carries ``WWW-Authenticate: Token``); anything
    else is a defect: logged with its traceback, answered 500 ``internal_error`` as JSON.
    """
    set_rollback()
    if isinstance(exc, OperationError):
        return Response(exc.as_dict(), status=status_for(exc.code))
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.APIException):
        data, code = _drf_body(exc)
        headers = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
        return Response(data, status=code, headers=headers)
    view = context.get("view")
    log.exception("API %s failed", type(view).__name__ if view else "view")
    return Response(body("internal_error", "The server failed on this request; its log has the details.", ""),
                    status=status.HTTP_500_INTERNAL_SERVER_ERROR)


@csrf_exempt  # it changes nothing: a POST to a wrong path gets the JSON 404, not the HTML CSRF page
def not_found(request, *args, **kwargs):
    """A JSON 404 for any path under /api/ that names no endpoint (any method)."""
    return JsonResponse(body("not_found", f"There is no API endpoint {request.path!r}; see README.md, "
                             "section 'JSON API'.", ""), status=404)
