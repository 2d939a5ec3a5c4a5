"""The Control Panel's forms: the run detail page's action buttons (controlpanel/views/), the
"Create a run" and "Edit the definition" pages of a pipeline (controlpanel/admin.py).

The forms check only the shape of what arrives (a decision id is a whole number, an action is
retry or verify). Whether a value is acceptable (a note given, the decision pending, the
artifact the files waiting for approval) is the operation's to say: text fields are optional
here, so that ``engine.operations`` refuses a blank one with its own code, field and sentence,
exactly as the command line and the API do. The browser still asks for them (``required``).
"""
import yaml
from django import forms

from engine import operations
from engine.models import Pipeline
from engine.pipeline.format import PipelineFormatError, validate

_TEXT = {"class": "vTextField"}


def _required(attrs: dict | None = None) -> dict:
    return {**_TEXT, "required": True, **(attrs or {})}


class StartForm(forms.Form):
    """Start: no input; the person pressing it is recorded as the requester."""


class ApproveForm(forms.Form):
    """Approve A Human Gate: the pending decision and the digest of the files the person looked at."""

    decision = forms.IntegerField(min_value=1, label="decision id", widget=forms.NumberInput(attrs=_required()))
    artifact = forms.CharField(required=False, max_length=64, label="artifact (files' digest)",
                               widget=forms.TextInput(attrs=_required({"size": 44, "spellcheck": "false"})))


class RequestChangesForm(forms.Form):
    """Request changes at a human gate: the pending decision and files (as for Approve), what must
    change, and optional comments on the diff, one a line: ``path:line: text`` or ``path: text``."""

    decision = forms.IntegerField(min_value=1, label="decision id", widget=forms.NumberInput(attrs=_required()))
    artifact = forms.CharField(required=False, max_length=64, label="artifact (files' digest)",
                               widget=forms.TextInput(attrs=_required({"size": 44, "spellcheck": "false"})))
    note = forms.CharField(required=False, label="what must change (the agent reads it)",
                           widget=forms.Textarea(attrs=_required({"rows": 3, "cols": 60})))
    comments = forms.CharField(required=False, label="comments on the diff (one a line: path:line: text)",
                               widget=forms.Textarea(attrs={**_TEXT, "rows": 3, "cols": 60, "placeholder":
                                                            "textstats/core.py:12: count hyphenated words once"}))

    def clean_comments(self) -> list[dict]:
        """``[{"file", "line", "text"}]`` from the lines typed (engine.operations.parse_comment; a
        line without ``path:`` is a general comment); the operation checks files and lines."""
        return [operations.parse_comment(line) for line in (self.cleaned_data.get("comments") or "").splitlines()
                if line.strip()]


class RecheckForm(forms.Form):
    """Recheck A Corrected Result: what was corrected."""

    note = forms.CharField(required=False, label="what was corrected",
                           widget=forms.Textarea(attrs=_required({"rows": 2, "cols": 60})))


class RecoverForm(forms.Form):
    """Recover An Interruption: the pending review decision, a note, and retry or verify."""

    ACTIONS = [("retry", "retry: a new attempt of the stage"), ("verify", "verify: check the existing result")]

    decision = forms.IntegerField(min_value=1, label="decision id", widget=forms.NumberInput(attrs=_required()))
    note = forms.CharField(required=False, label="note (why)",
                           widget=forms.Textarea(attrs=_required({"rows": 2, "cols": 60})))
    action = forms.ChoiceField(choices=ACTIONS, initial="retry", widget=forms.RadioSelect)

    def __init__(self, *args, **kwargs):
        """An unbound form whose ``initial`` says ``verify: False`` (engine/answers.py ``actions``: the
        stage never produced a result) offers only retry, with why in the field's help text."""
        super().__init__(*args, **kwargs)
        if self.initial.get("verify") is False:
            self.fields["action"].choices = [choice for choice in self.ACTIONS if choice[0] == "retry"]
            self.fields["action"].help_text = self.initial.get("verify_why") or "verify does not apply"


class FailForm(forms.Form):
    """End An Unsuccessful Run: the reason a person should know."""

    reason = forms.CharField(required=False, label="reason",
                             widget=forms.Textarea(attrs=_required({"rows": 2, "cols": 60})))


class RerunForm(forms.Form):
    """Re-run An Ended Run: the same pipeline version or the latest, and whether to start it at once
    (``engine.operations.rerun``; starting needs ``engine.start_run`` too)."""

    latest_pipeline = forms.BooleanField(required=False, label="latest pipeline", help_text=(
        "Use the saved pipeline's latest version (with this run's profile choices) instead of this run's own."))
    start = forms.BooleanField(required=False, initial=True, label="start it now",
                               help_text="Request its start at once: the new run is queued for a worker.")
    seen = forms.IntegerField(required=False, min_value=0, widget=forms.HiddenInput,
                              help_text="the run's re-runs when the page was shown: a second click makes no second run")


class ContinueForm(forms.Form):
    """Continue a run its budget stopped with a raised budget (``engine.operations.continue_run``): the budgets as
    YAML, prefilled with the run's; starting needs ``engine.start_run`` too."""

    budgets = forms.CharField(label="budgets (YAML)", widget=forms.Textarea(attrs={"rows": 6, "cols": 60}), help_text=(
        "The run's budgets, raised: every cap at least what it was (or removed) and one higher. The new run starts "
        "from the last checkpoint; the stopped attempt's patch and calls are its first attempt's evidence."))
    start = forms.BooleanField(required=False, initial=True, label="start it now",
                               help_text="Request its start at once: the new run is queued for a worker.")
    seen = forms.IntegerField(required=False, min_value=0, widget=forms.HiddenInput,
                              help_text="the run's re-runs when the page was shown: a second click makes no second run")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self.initial.get("budgets"), dict):  # the run's budgets (answers.actions), as YAML to edit
            self.initial["budgets"] = yaml.safe_dump(self.initial["budgets"], sort_keys=False)

    def clean_budgets(self):
        try:
            found = yaml.safe_load(self.cleaned_data["budgets"])
        except yaml.YAMLError as exc:
            raise forms.ValidationError(f"budgets is not YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(found, dict):
            raise forms.ValidationError("budgets must be a mapping, e.g. max_tokens: 2000000")
        return found


def first_error(form: forms.Form) -> tuple[str, str]:
    """``(field, message)`` of the first error of an invalid bound form (field '' for a form-wide one)."""
    for field, errors in form.errors.items():
        return ("" if field == "__all__" else field), str(errors[0])
    return "", "The form is not valid."


def typed_fields(form_class: type[forms.Form], data) -> dict[str, str]:
    """What a person typed into the fields of ``form_class`` (``data``: the POST), as strings; empty ones left out."""
    typed = {}
    for name in form_class.base_fields:
        value = data.get(name)
        if isinstance(value, str) and value.strip():
            typed[name] = value[:10000]
    return typed


def mark_kept(form: forms.Form, field: str) -> None:
    """Mark an unbound action form filled with what was typed into it before a refusal: every field is
    ``data-cp-kept`` (run.js counts it as typed text), and the field at fault (else the first) has the focus."""
    names = list(form.fields)
    focus = field if field in form.fields else (names[0] if names else "")
    for name, each in form.fields.items():
        attrs = dict(each.widget.attrs, **{"data-cp-kept": "1"})
        if name == focus:
            attrs["autofocus"] = True
        each.widget.attrs = attrs


def preflight_labels(pipeline: Pipeline) -> dict[str, str]:
    """``{profile name: what it lacks}`` for the pipeline's profiles that would be refused at creation
    (``engine.operations.preflight_problems``), e.g. ``no credentials: set ANTHROPIC_API_KEY``."""
    found = operations.preflight_problems(pipeline.definition)
    return {name: "; ".join(dict.fromkeys(problem.label() for problem in problems)) for name, problems in found.items()}


def labelled(name: str, lacking: dict[str, str]) -> str:
    """A profile's choice label: its name, and what it lacks to run unattended when it does (``preflight_labels``)."""
    return f"{name} ({lacking[name]})" if name in lacking else name


class CreateRunForm(forms.Form):
    """Create A Run from a saved pipeline: a repository path, a revision, and optionally a profile per role.

    Only the shape is checked here (a profile one of the pipeline's); whether the repository,
    the revision and the profiles are usable is ``engine.operations.create_run``'s to say, with
    its own code and field, as the command line and the API do (so the text fields are optional
    here; the browser still asks for them).
    """

    repo = forms.CharField(required=False, label="repository path", help_text=(
        "A folder inside a git work tree, on the Run Engine's machine. Its checkout is only read."),
        widget=forms.TextInput(attrs={"class": "vLargeTextField", "required": True, "spellcheck": "false"}))
    rev = forms.CharField(required=False, label="revision", initial="main",
                          help_text="A commit id, branch or tag; the run is frozen at its commit.",
                          widget=forms.TextInput(attrs={"class": "vTextField", "required": True}))

    def __init__(self, *args, pipeline: Pipeline, **kwargs):
        super().__init__(*args, **kwargs)
        names = sorted(pipeline.definition.get("profiles", {}))
        lacking = preflight_labels(pipeline)
        for role in operations.ROLES:
            current = pipeline.definition.get("roles", {}).get(role, "")
            if current is None:  # the pipeline leaves the role out: nothing to choose
                self.fields[f"profile_{role}"] = forms.ChoiceField(
                    required=False, label=f"{role} profile", choices=[("", "not configured (roles." + role + ": null)")],
                    disabled=True)
                continue
            shown = ", ".join(labelled(name, lacking) for name in operations.role_profiles(current))
            self.fields[f"profile_{role}"] = forms.ChoiceField(
                required=False, label=f"{role} profile", choices=[("", f"the pipeline's: {shown}")]
                + [(name, labelled(name, lacking)) for name in names])

    def profile_override(self) -> dict:
        """``{role: profile}`` for the roles whose profile was chosen (cleaned data; {} for none)."""
        return {role: self.cleaned_data[f"profile_{role}"] for role in operations.ROLES
                if self.cleaned_data.get(f"profile_{role}")}


class PipelineDefinitionForm(forms.Form):
    """Edit a saved pipeline's definition as YAML, validated exactly as ``load_pipelines`` validates
    a file (``engine.pipeline.format.validate``). ``cleaned_data["definition"]`` is the normalized
    definition. Every problem is reported on the ``definition`` field as ``field: problem`` (the
    dotted path inside the document, e.g. ``stages[0].gates[0].command``). The name cannot change
    here: a pipeline of another name is another pipeline (load it from a file). ``version`` (hidden)
    is the version the editor was opened on: a save over a newer version is refused on ``version``
    (two people editing at once never silently undo each other's change)."""

    definition = forms.CharField(widget=forms.Textarea(attrs={"rows": 36, "cols": 110, "spellcheck": "false",
                                                               "class": "vLargeTextField cp-yaml"}),
                                 help_text="YAML, as in a pipeline file (docs/pipeline-format.md). Saving makes a new "
                                           "version; runs already created keep the definition they froze.")
    #: the version the person started from: saving over a newer one would lose someone else's change
    version = forms.IntegerField(widget=forms.HiddenInput, min_value=1)

    def __init__(self, *args, name: str, current_version: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.name, self.current_version = name, current_version

    def clean_version(self) -> int:
        version = self.cleaned_data["version"]
        if self.current_version is not None and version != self.current_version:
            raise forms.ValidationError(
                f"the pipeline was saved as version {self.current_version} since you opened version {version}: "
                f"nothing was saved. Open the editor again to start from version {self.current_version}, then "
                f"make your change there.")
        return version

    def clean_definition(self) -> dict:
        text = self.cleaned_data["definition"]
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise forms.ValidationError(f"(yaml): not valid YAML: {exc}") from None
        try:
            definition = validate(data, "<Control Panel>")
        except PipelineFormatError as exc:
            raise forms.ValidationError([f"{field}: {problem}" for _, field, problem in exc.errors]) from None
        if definition["name"] != self.name:
            raise forms.ValidationError(f"name: the name is {self.name!r} and cannot change here (a pipeline of "
                                        f"another name is another pipeline: load it with load_pipelines).")
        return definition

    @staticmethod
    def initial_text(definition: dict) -> str:
        """The YAML shown for ``definition`` (keys in their saved order, Unicode kept)."""
        return yaml.safe_dump(definition, sort_keys=False, allow_unicode=True, width=110)
