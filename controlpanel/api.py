"""The JSON API beside the admin: the Run Engine's operations over HTTP (README.md, "JSON API").

    POST /api/runs/                {pipeline, repo, rev, profiles?: {role: profile}}   201 run_status
    GET  /api/runs/<id>/                                                               200 run_status
    POST /api/runs/<id>/start/     {}                                                  202
    POST /api/runs/<id>/approve/   {decision, artifact, reviewer?}                     200
    POST /api/runs/<id>/recheck/   {note}                                              200
    POST /api/runs/<id>/recover/   {decision, note, action: retry|verify}              200
    POST /api/runs/<id>/fail/      {reason}                                            200

Each view checks the body's shape with a serializer (a missing field, a wrong type, an
unknown field or action: 400 ``invalid`` naming the field), then calls one verb of
engine.operations and nothing else; the verb's OperationError becomes its ``as_dict()`` with
404 / 409 / 400 (controlpanel.api_errors). The person is the authenticated user: ``reviewer``
and ``requested_by`` default to their username. Every action answers
``{"run", "status", "simulated", ...}`` with the run's status as it is after the action.
"""
from __future__ import annotations

from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from engine import operations

from .api_auth import RunPermission

_JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}


def _json_type(value) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


class TextField(serializers.CharField):
    """A JSON string, and only a string (REST framework's CharField would take 12 or 1.5 too)."""

    default_error_messages = {"not_a_string": "Must be a string, not {kind}."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string", kind=_json_type(data))
        return super().to_internal_value(data)


class PipelineField(serializers.Field):
    """A saved pipeline's name (a string) or id (an integer)."""

    default_error_messages = {"bad": "Must be a pipeline name (a string) or id (an integer), not {kind}.",
                              "blank": "This field may not be blank."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (str, int)):
            self.fail("bad", kind=_json_type(data))
        if isinstance(data, str) and not data.strip():
            self.fail("blank")
        return data.strip() if isinstance(data, str) else data

    def to_representation(self, value):
        return value


class DecisionField(serializers.IntegerField):
    """A decision id: a JSON integer (a string of digits is taken too, as the commands take it)."""

    default_error_messages = {"not_an_id": "Must be a decision id (an integer), not {kind}."}

    def to_internal_value(self, data):
        if isinstance(data, (bool, float, list, dict)):
            self.fail("not_an_id", kind=_json_type(data))
        return super().to_internal_value(data)


class StrictSerializer(serializers.Serializer):
    """A body that is a JSON object with only the fields the endpoint takes (a misspelt
    optional field is refused, not silently ignored)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                takes = ", ".join(self.fields) or "no fields (send {})"
                raise serializers.ValidationError({unknown[0]: [f"Unknown field; this endpoint takes {takes}."]})
        return super().to_internal_value(data)


class CreateRunInput(StrictSerializer):
    """POST /api/runs/: the arguments of operations.create_run."""

    pipeline = PipelineField()
    repo = TextField(help_text="path of the git repository (any folder inside it)")
    rev = TextField(help_text="commit, branch or tag")
    profiles = serializers.DictField(child=TextField(), required=False, default=dict,
                                     help_text="{role: profile name}")


class StartInput(StrictSerializer):
    """POST /api/runs/<id>/start/: no arguments."""


class ApproveInput(StrictSerializer):
    """POST /api/runs/<id>/approve/: the pending approval decision and the digest of the files looked at."""

    decision = DecisionField()
    artifact = TextField(allow_blank=True)
    reviewer = TextField(required=False, allow_blank=True)


class RecheckInput(StrictSerializer):
    """POST /api/runs/<id>/recheck/: what was corrected (a blank note is refused by the operation)."""

    note = TextField(allow_blank=True)


class RecoverInput(StrictSerializer):
    """POST /api/runs/<id>/recover/: the pending review decision, a note and retry | verify."""

    decision = DecisionField()
    note = TextField(allow_blank=True)
    action = serializers.ChoiceField(choices=["retry", "verify"])


class FailInput(StrictSerializer):
    """POST /api/runs/<id>/fail/: why the run is failed (a blank reason is refused by the operation)."""

    reason = TextField(allow_blank=True)


class RunAPIView(APIView):
    """An endpoint guarded by ``required_permission``, reading its body with ``input_class``."""

    permission_classes = [RunPermission]
    required_permission = ""
    input_class: type[serializers.Serializer] | None = None

    def read(self, request) -> dict:
        """The validated body (raises ValidationError -> 400 ``invalid`` naming the field)."""
        data = self.input_class(data=request.data)
        data.is_valid(raise_exception=True)
        return data.validated_data

    @staticmethod
    def person(request, given: str | None = None) -> str:
        """The name recorded for the person acting: ``given`` when not blank, else the user's username."""
        return (given or "").strip() or request.user.get_username()

    @staticmethod
    def ack(run_id, code=status.HTTP_200_OK, **extra) -> Response:
        """``{"run", "status", "simulated", **extra}`` with the run as it is now."""
        run = operations.get_run(run_id)
        return Response({"run": run.pk, "status": run.status, "simulated": run.simulated, **extra}, status=code)


class RunCreate(RunAPIView):
    """POST /api/runs/ -> 201 with operations.run_status of the new pending run."""

    required_permission = "engine.add_run"
    input_class = CreateRunInput

    def post(self, request):
        data = self.read(request)
        run = operations.create_run(data["pipeline"], data["repo"], data["rev"], data["profiles"] or None)
        return Response(operations.run_status(run), status=status.HTTP_201_CREATED,
                        headers={"Location": f"/api/runs/{run.pk}/"})


class RunDetail(RunAPIView):
    """GET /api/runs/<id>/ -> 200 with operations.run_status (the same contract as ``run_status --json``)."""

    required_permission = "engine.view_run"

    def get(self, request, run_id):
        return Response(operations.run_status(run_id))


class RunStart(RunAPIView):
    """POST /api/runs/<id>/start/ -> 202 ``{run, status, simulated, start_request}``; a second Start 409."""

    required_permission = "engine.start_run"
    input_class = StartInput

    def post(self, request, run_id):
        self.read(request)
        start = operations.request_start(run_id, requested_by=self.person(request), source="api")
        return self.ack(start.run_id, status.HTTP_202_ACCEPTED, start_request=start.pk)


class RunApprove(RunAPIView):
    """POST /api/runs/<id>/approve/ -> 200 ``{run, status, simulated, decision}``."""

    required_permission = "engine.approve_run"
    input_class = ApproveInput

    def post(self, request, run_id):
        data = self.read(request)
        decision = operations.approve(run_id, data["decision"], data["artifact"],
                                      self.person(request, data.get("reviewer")))
        return self.ack(decision.run_id, decision={"id": decision.pk, "state": decision.state,
                                                   "decided_by": decision.decided_by})


class RunRecheck(RunAPIView):
    """POST /api/runs/<id>/recheck/ -> 200 ``{run, status, simulated, stage}``."""

    required_permission = "engine.recheck_run"
    input_class = RecheckInput

    def post(self, request, run_id):
        data = self.read(request)
        stage = operations.recheck(run_id, data["note"], requested_by=self.person(request))
        return self.ack(stage.run_id, stage=stage.key)


class RunRecover(RunAPIView):
    """POST /api/runs/<id>/recover/ -> 200 ``{run, status, simulated, decision}``."""

    required_permission = "engine.recover_run"
    input_class = RecoverInput

    def post(self, request, run_id):
        data = self.read(request)
        decision = operations.recover(run_id, data["decision"], data["note"], data["action"],
                                      reviewer=self.person(request))
        return self.ack(decision.run_id, decision={"id": decision.pk, "state": decision.state,
                                                   "action": decision.action, "decided_by": decision.decided_by})


class RunFail(RunAPIView):
    """POST /api/runs/<id>/fail/ -> 200 ``{run, status, simulated, stop_reason}``."""

    required_permission = "engine.fail_run"
    input_class = FailInput

    def post(self, request, run_id):
        data = self.read(request)
        run = operations.fail_run(run_id, data["reason"], requested_by=self.person(request))
        return self.ack(run.pk, stop_reason=run.stop_reason or None)
