"""The JSON API beside the admin: the Run Engine's operations over HTTP (README.md, "JSON API").

    GET  /api/runs/?status=&pipeline=&waiting=&page=&page_size=                       200 {count, next, previous, results}
    POST /api/runs/                {pipeline, repo, rev, profiles?: {role: profile}}   201 run_status
    GET  /api/runs/<id>/                                                               200 run_status
    POST /api/runs/<id>/request-changes/ {decision, artifact, note, comments?, reviewer?} 200
    GET  /api/schema/              the OpenAPI 3 schema of these endpoints (drf-spectacular)
    POST /api/runs/<id>/start/     {}                                                  202
    POST /api/runs/<id>/approve/   {decision, artifact, reviewer?}                     200
    POST /api/runs/<id>/recheck/   {note}                                              200
    POST /api/runs/<id>/recover/   {decision, note, action: retry|verify, reviewer?}   200
    POST /api/runs/<id>/fail/      {reason}                                            200
    POST /api/runs/<id>/rerun/     {latest_pipeline?, start?}                          201 run_status (the new run)
    POST /api/runs/<id>/continue/  {budgets, start?, expect_reruns?}                   201 run_status (the new run)

One REST framework viewset (``RunViewSet``) behind one router (``RunRouter``, routes named
``api-run-create``, ``api-run`` and ``api-run-<action>``; controlpanel/urls.py). Each action checks
the body's shape with an input serializer (a missing field, a wrong type, an unknown field or
action: 400 ``invalid`` naming the field), then calls one verb of engine.operations and nothing
else; the verb's OperationError becomes its ``as_dict()`` with 404 / 409 / 400
(controlpanel/api_errors.py). The person is the authenticated user: ``reviewer`` and
``requested_by`` default to their username. Answers are output serializers: create and status
give ``RunStatusSerializer`` (operations.run_status, the contract of ``run_status --json``); every
action answers ``{"run", "status", "simulated", ...}`` (``RunAckSerializer`` and its subclasses)
with the run's status as it is after the action.
"""
from __future__ import annotations

from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.routers import DynamicRoute, Route, SimpleRouter
from rest_framework.utils import formatting

from engine import operations

from .api_auth import MissingPermission, RunPermission
from .api_schema import document

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


class FlagField(serializers.BooleanField):
    """A JSON boolean, and only a boolean (REST framework's BooleanField would take "yes" or 1 too)."""

    default_error_messages = {"not_a_boolean": "Must be true or false, not {kind}."}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("not_a_boolean", kind=_json_type(data))
        return data


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
    start = FlagField(required=False, default=False, help_text="also start it (needs engine.start_run)")


class RerunInput(StrictSerializer):
    """POST /api/runs/<id>/rerun/: the arguments of operations.rerun (all optional; false / none by default)."""

    latest_pipeline = FlagField(required=False, default=False,
                                help_text="the saved pipeline's latest version instead of the run's own")
    start = FlagField(required=False, default=False, help_text="also start it (needs engine.start_run)")
    expect_reruns = serializers.IntegerField(required=False, allow_null=True, min_value=0, default=None, help_text=(
        "the run's re-run count you saw (actions[rerun].initial.seen): a re-run made since refuses this one "
        "(409 already_rerun), so a retried request makes no second run"))


class ContinueInput(StrictSerializer):
    """POST /api/runs/<id>/continue/: the arguments of operations.continue_run."""

    budgets = serializers.JSONField(help_text=(
        "the pipeline's budgets, raised: every cap at least the run's (or null: none) and one higher "
        "(docs/pipeline-format.md \"budgets\")"))
    start = FlagField(required=False, default=True, help_text="also start it (needs engine.start_run); default true")
    expect_reruns = serializers.IntegerField(required=False, allow_null=True, min_value=0, default=None, help_text=(
        "the run's re-run count you saw (actions[continue].initial.seen): a second request makes no second run"))


class StartInput(StrictSerializer):
    """POST /api/runs/<id>/start/: no arguments."""


class ApproveInput(StrictSerializer):
    """POST /api/runs/<id>/approve/: the pending approval decision and the digest of the files looked at."""

    decision = DecisionField()
    artifact = TextField(allow_blank=True)
    reviewer = TextField(required=False, allow_blank=True)


class CommentInput(StrictSerializer):
    """One comment on the diff of a request for changes: ``{file, line, text}`` (file and line may be null)."""

    file = TextField(required=False, allow_null=True, allow_blank=False)
    line = serializers.IntegerField(required=False, allow_null=True, min_value=1)
    text = TextField()


class RequestChangesInput(StrictSerializer):
    """POST /api/runs/<id>/request-changes/: the pending approval decision, the digest of the files
    looked at, the note (what must change) and optional comments on the diff."""

    decision = DecisionField()
    artifact = TextField(allow_blank=True)
    note = TextField(allow_blank=True)
    comments = CommentInput(many=True, required=False)
    reviewer = TextField(required=False, allow_blank=True)


class RecheckInput(StrictSerializer):
    """POST /api/runs/<id>/recheck/: what was corrected (a blank note is refused by the operation)."""

    note = TextField(allow_blank=True)


class RecoverInput(StrictSerializer):
    """POST /api/runs/<id>/recover/: the pending review decision, a note and retry | verify."""

    decision = DecisionField()
    note = TextField(allow_blank=True)
    action = serializers.ChoiceField(choices=["retry", "verify"])
    reviewer = TextField(required=False, allow_blank=True)


class FailInput(StrictSerializer):
    """POST /api/runs/<id>/fail/: why the run is failed (a blank reason is refused by the operation)."""

    reason = TextField(allow_blank=True)


# ----------------------------------------------------------------------------- output


class ListInput(StrictSerializer):
    """GET /api/runs/ query: ``status`` (one or several, comma-separated), ``pipeline`` (a name or
    id), ``waiting`` (true: runs that wait for a person; false: the others), ``page``, ``page_size``."""

    status = TextField(required=False, allow_blank=True)
    pipeline = TextField(required=False, allow_blank=True)
    waiting = serializers.BooleanField(required=False, allow_null=True, default=None)
    page = serializers.IntegerField(required=False, min_value=1)
    page_size = serializers.IntegerField(required=False, min_value=1, max_value=100)


class RunPages(PageNumberPagination):
    """Pages of ``GET /api/runs/``: 25 runs a page by default, ``page_size`` up to 100."""

    page_size = 25
    page_size_query_param = "page_size"
    max_page_size = 100


class RunStatusSerializer(serializers.BaseSerializer):
    """A run (a Run or its id) as ``operations.run_status``: the public JSON shape of a run.

    The engine owns the shape (``run_status --json`` prints the same); ``CONTRACT_KEYS`` are the
    top-level keys clients rely on: later versions may add keys, never remove or rename one
    (tests/test_api_contract.py). Raises OperationError ``unknown_run`` for an unknown id.
    """

    CONTRACT_KEYS = frozenset({
        "id", "uid", "status", "simulated", "simulated_reason", "pipeline", "repo", "revision", "commit", "branch",
        "worktree", "stop_reason", "stop_message", "stop_evidence", "waiting_for", "active_seconds",
        "heartbeat_age_seconds", "heartbeat_stale", "definition_sha256", "control_records", "not_included", "roles",
        "protected_files", "budgets", "pending_decision", "created_at", "finished_at", "stages",
    }) | frozenset({"rerun_of", "reruns"})  # re-run links (docs/run-status.md)

    def to_representation(self, instance) -> dict:
        return operations.run_status(instance)


class NullIfBlankField(serializers.CharField):
    """A text attribute, given as null when it is empty (``stop_reason`` of a run)."""

    def to_representation(self, value):
        text = super().to_representation(value)
        return text or None


class RunAckSerializer(serializers.Serializer):
    """``{"run": id, "status", "simulated"}`` of ``{"run": Run}`` (read fresh after the action)."""

    run = serializers.IntegerField(source="run.pk")
    status = serializers.CharField(source="run.status")
    simulated = serializers.BooleanField(source="run.simulated")


class StartAckSerializer(RunAckSerializer):
    """Start: ``{run, status, simulated, start_request: id}`` of ``{"run", "start_request": StartRequest}``."""

    start_request = serializers.IntegerField(source="start_request.pk")


class DecisionSerializer(serializers.Serializer):
    """A decided approval: ``{id, state, decided_by}``."""

    id = serializers.IntegerField(source="pk")
    state = serializers.CharField()
    decided_by = serializers.CharField()


class RecoveryDecisionSerializer(serializers.Serializer):
    """A decided recovery: ``{id, state, action, decided_by}``."""

    id = serializers.IntegerField(source="pk")
    state = serializers.CharField()
    action = serializers.CharField()
    decided_by = serializers.CharField()


class ApproveAckSerializer(RunAckSerializer):
    """Approve: ``{run, status, simulated, decision: {id, state, decided_by}}``."""

    decision = DecisionSerializer()


class RecoverAckSerializer(RunAckSerializer):
    """Recover: ``{run, status, simulated, decision: {id, state, action, decided_by}}``."""

    decision = RecoveryDecisionSerializer()


class RecheckAckSerializer(RunAckSerializer):
    """Recheck: ``{run, status, simulated, stage: key}`` of ``{"run", "stage": StageRun}``."""

    stage = serializers.CharField(source="stage.key")


class FailAckSerializer(RunAckSerializer):
    """Fail: ``{run, status, simulated, stop_reason}`` (null when the run has none)."""

    stop_reason = NullIfBlankField(source="run.stop_reason")


# ----------------------------------------------------------------------------- the viewset and its router


class RunViewSet(viewsets.ViewSet):
    """The runs: create, status, and the five actions; each guarded by its own permission.

    ``PERMISSIONS`` maps an action to the ``engine.<codename>`` permission RunPermission checks
    (controlpanel/api_auth.py); a method a route does not take is checked against the route's
    own action first, then answered 405. ``INPUTS`` maps an action to its input serializer.
    """

    permission_classes = [RunPermission]
    pagination_class = RunPages  # ``list`` pages with it (and the OpenAPI schema says so)
    lookup_field = "pk"
    lookup_url_kwarg = "run_id"
    lookup_value_regex = "[^/]+"  # any id text: the operation says 404 unknown_run for a bad one

    PERMISSIONS = {"list": "engine.view_run", "create": "engine.add_run", "retrieve": "engine.view_run",
                   "start": "engine.start_run",
                   "approve": "engine.approve_run", "request_changes": "engine.approve_run",
                   "recheck": "engine.recheck_run", "recover": "engine.recover_run", "fail": "engine.fail_run",
                   # a re-run is a new run; with "start": true engine.start_run as well (``also_start``)
                   "rerun": "engine.add_run", "continue_run": "engine.add_run"}
    INPUTS = {"create": CreateRunInput, "start": StartInput, "approve": ApproveInput,
              "request_changes": RequestChangesInput, "recheck": RecheckInput, "recover": RecoverInput,
              "fail": FailInput, "rerun": RerunInput, "continue_run": ContinueInput}

    @property
    def route_action(self) -> str:
        """The action of this request, or for a method the route does not take, the route's own."""
        if self.action in self.PERMISSIONS:
            return self.action
        return next(iter((getattr(self, "action_map", None) or {}).values()), "")

    @property
    def required_permission(self) -> str:
        """The permission of ``route_action`` (RunPermission reads it)."""
        return self.PERMISSIONS.get(self.route_action, "")

    def get_view_name(self) -> str:
        """The endpoint's name in an OPTIONS answer: "Run Create", "Run Detail", "Run Start"..."""
        return "Run " + ("Detail" if self.route_action == "retrieve" else self.route_action.title())

    def get_view_description(self, html=False) -> str:
        """The endpoint's description in an OPTIONS answer: its action's docstring."""
        handler = getattr(self, self.route_action, None)
        return super().get_view_description(html) if handler is None else formatting.dedent(handler.__doc__ or "")

    def read(self, request) -> dict:
        """The validated body of the action (raises ValidationError -> 400 ``invalid`` naming the field)."""
        data = self.INPUTS[self.action](data=request.data)
        data.is_valid(raise_exception=True)
        return data.validated_data

    @staticmethod
    def person(request, given: str | None = None) -> str:
        """The name recorded for the person acting: ``given`` when not blank, else the user's username."""
        return (given or "").strip() or request.user.get_username()

    @staticmethod
    def ack(serializer_class: type[RunAckSerializer], run_id, code=status.HTTP_200_OK, **parts) -> Response:
        """``serializer_class`` of ``{"run": the run as it is now, **parts}``, with status ``code``."""
        return Response(serializer_class({"run": operations.get_run(run_id), **parts}).data, status=code)

    def list(self, request):
        """GET /api/runs/ -> 200 ``{count, next, previous, results}``: the runs, newest first, each as
        operations.run_summary; filters ``status`` (comma-separated), ``pipeline`` (name or id),
        ``waiting`` (true | false); ``page``, ``page_size`` (at most 100)."""
        query = ListInput(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        found = query.validated_data
        statuses = [s.strip() for s in (found.get("status") or "").split(",") if s.strip()]
        runs = operations.list_runs(status=statuses or None, pipeline=(found.get("pipeline") or "").strip() or None,
                                    waiting=found.get("waiting"))
        pages = self.pagination_class()
        page = pages.paginate_queryset(runs, request, view=self)
        return pages.get_paginated_response([operations.run_summary(run) for run in page])

    def create(self, request):
        """POST /api/runs/ -> 201 with operations.run_status of the new pending run (queued with ``"start": true``)."""
        data = self.read(request)
        self.also_start(request, data)
        run = operations.create_run(data["pipeline"], data["repo"], data["rev"], data["profiles"] or None,
                                    start=data["start"], requested_by=self.person(request), source="api")
        return Response(RunStatusSerializer(run).data, status=status.HTTP_201_CREATED,
                        headers={"Location": f"/api/runs/{run.pk}/"})

    def retrieve(self, request, run_id=None):
        """GET /api/runs/<id>/ -> 200 with operations.run_status (the same contract as ``run_status --json``)."""
        return Response(RunStatusSerializer(run_id).data)

    @action(detail=True, methods=["post"])
    def start(self, request, run_id=None):
        """POST /api/runs/<id>/start/ -> 202 ``{run, status, simulated, start_request}``; a second Start 409."""
        self.read(request)
        start = operations.request_start(run_id, requested_by=self.person(request), source="api")
        return self.ack(StartAckSerializer, start.run_id, status.HTTP_202_ACCEPTED, start_request=start)

    @action(detail=True, methods=["post"])
    def approve(self, request, run_id=None):
        """POST /api/runs/<id>/approve/ -> 200 ``{run, status, simulated, decision}``."""
        data = self.read(request)
        decision = operations.approve(run_id, data["decision"], data["artifact"],
                                      self.person(request, data.get("reviewer")))
        return self.ack(ApproveAckSerializer, decision.run_id, decision=decision)

    @action(detail=True, methods=["post"], url_path="request-changes", url_name="request-changes")
    def request_changes(self, request, run_id=None):
        """POST /api/runs/<id>/request-changes/ -> 200 ``{run, status, simulated, decision}``: the files at
        the human gate go back to a repair session with the note and comments (queued), or, with the
        stage's repair allowance used up, the run waits for review (``repair_exhausted``)."""
        data = self.read(request)
        comments = [{"file": c.get("file"), "line": c.get("line"), "text": c["text"]}
                    for c in data.get("comments") or []]
        decision = operations.request_changes(run_id, data["decision"], data["artifact"],
                                              self.person(request, data.get("reviewer")), data["note"], comments)
        return self.ack(ApproveAckSerializer, decision.run_id, decision=decision)

    @action(detail=True, methods=["post"])
    def recheck(self, request, run_id=None):
        """POST /api/runs/<id>/recheck/ -> 200 ``{run, status, simulated, stage}``."""
        data = self.read(request)
        stage = operations.recheck(run_id, data["note"], requested_by=self.person(request))
        return self.ack(RecheckAckSerializer, stage.run_id, stage=stage)

    @action(detail=True, methods=["post"])
    def recover(self, request, run_id=None):
        """POST /api/runs/<id>/recover/ -> 200 ``{run, status, simulated, decision}``."""
        data = self.read(request)
        decision = operations.recover(run_id, data["decision"], data["note"], data["action"],
                                      reviewer=self.person(request, data.get("reviewer")))
        return self.ack(RecoverAckSerializer, decision.run_id, decision=decision)

    @action(detail=True, methods=["post"])
    def fail(self, request, run_id=None):
        """POST /api/runs/<id>/fail/ -> 200 ``{run, status, simulated, stop_reason}``."""
        data = self.read(request)
        run = operations.fail_run(run_id, data["reason"], requested_by=self.person(request))
        return self.ack(FailAckSerializer, run.pk)


    # --------------------------------------------------------------- re-run, create-and-start

    @staticmethod
    def also_start(request, data: dict) -> None:
        """A body asking ``"start": true`` needs ``engine.start_run`` too (MissingPermission, 403, naming it)."""
        if data.get("start") and not request.user.has_perm("engine.start_run"):
            raise MissingPermission(request.user, "engine.start_run")

    @action(detail=True, methods=["post"])
    def rerun(self, request, run_id=None):
        """POST /api/runs/<id>/rerun/ {latest_pipeline?, start?} -> 201 with operations.run_status of the new run."""
        data = self.read(request)
        self.also_start(request, data)
        run = operations.rerun(run_id, latest_pipeline=data["latest_pipeline"], start=data["start"],
                               requested_by=self.person(request), source="api", expect_reruns=data.get("expect_reruns"))
        return Response(RunStatusSerializer(run).data, status=status.HTTP_201_CREATED,
                        headers={"Location": f"/api/runs/{run.pk}/"})

    @action(detail=True, methods=["post"], url_path="continue", url_name="continue")
    def continue_run(self, request, run_id=None):
        """POST /api/runs/<id>/continue/ {budgets, start?} -> 201 with operations.run_status of the new run: the run
        its budget stopped, continued from its last checkpoint with the raised budgets (engine/runs_again.py)."""
        data = self.read(request)
        self.also_start(request, data)
        run = operations.continue_run(run_id, data["budgets"], start=data["start"], requested_by=self.person(request),
                                      source="api", expect_reruns=data.get("expect_reruns"))
        return Response(RunStatusSerializer(run).data, status=status.HTTP_201_CREATED,
                        headers={"Location": f"/api/runs/{run.pk}/"})



class RunRouter(SimpleRouter):
    """The API's routes, with the URL names the API has always had: ``{basename}-create`` (POST
    the collection), ``{basename}`` (GET one run) and ``{basename}-<action>`` (POST an action).
    ``GET`` of the collection lists runs (``list``); no update or delete routes: those methods answer 405."""

    routes = [
        Route(url=r"^{prefix}{trailing_slash}$", mapping={"post": "create", "get": "list"}, name="{basename}-create",
              detail=False, initkwargs={"suffix": "Create"}),
        Route(url=r"^{prefix}/{lookup}{trailing_slash}$", mapping={"get": "retrieve"}, name="{basename}",
              detail=True, initkwargs={"suffix": "Instance"}),
        DynamicRoute(url=r"^{prefix}/{lookup}/{url_path}{trailing_slash}$", name="{basename}-{url_name}",
                     detail=True, initkwargs={}),
    ]


router = RunRouter()
router.register(r"api/runs", RunViewSet, basename="api-run")


# the OpenAPI schema's declarations of each action (/api/schema/)
document(RunViewSet, ListInput, {"start": StartAckSerializer, "approve": ApproveAckSerializer,
                                 "request_changes": ApproveAckSerializer, "recheck": RecheckAckSerializer,
                                 "recover": RecoverAckSerializer, "fail": FailAckSerializer})
