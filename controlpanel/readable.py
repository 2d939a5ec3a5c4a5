"""How the Control Panel's record pages show a value that Django's admin would show raw.

The admin shows a JSON field as one line of JSON, a time to the minute and a float of seconds with
all its digits. The record pages (controlpanel/admin.py, and the check log page of
controlpanel/views/) show instead:

- a JSON value as YAML in a ``<pre class="cp-yaml">`` (``yaml_block``), as a person reads a pipeline
  file; a list of paths (a run's ``not_included``) as a bulleted list (``path_list``);
- a time with its seconds and milliseconds, in the site's time zone (``moment_text``);
- a duration to the tenth of a second (``duration_text``: ``0.4 s``, ``1 min 3.2 s``);
- an agent's usage as a small table, one row per key (``usage_table``).

``Readable`` is the admin mixin that puts these in place of the raw model fields on a page.
Every function returns escaped HTML (or plain text) and never reads a file.
"""
from __future__ import annotations

import datetime
import re

import yaml
from django.contrib import admin
from django.db import models
from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import mark_safe

from engine.text import tool_outcomes

#: What a value that was never recorded shows.
NONE = "—"

#: An agent's usage keys (engine/agents/base.py USAGE_KEYS) as the usage table names them, in its order.
USAGE_ROWS = (
    ("input_tokens", "input tokens"),
    ("output_tokens", "output tokens"),
    ("cached_tokens", "cached tokens (read)"),
    ("cache_creation_tokens", "cache creation tokens"),
    ("reasoning_tokens", "reasoning tokens"),
    ("cost_usd", "cost in USD"),
)
#: Usage rows shown even when their value is unknown (shown "—"); the others only when reported.
USAGE_ALWAYS = ("input_tokens", "output_tokens", "cached_tokens", "cache_creation_tokens", "cost_usd")


def duration_text(seconds: float | None) -> str:
    """A duration to the tenth of a second: ``0.4 s``, ``59.9 s``, ``1 min 3.2 s``, ``2 h 0 min 4.5 s``;
    "—" for None. (controlpanel/views/common.py ``seconds_text(..., precise=True)`` is this.)"""
    if seconds is None:
        return NONE
    tenths = int(round(max(0.0, seconds) * 10))
    minutes, tenths = divmod(tenths, 600)
    secs = f"{tenths / 10:.1f} s"
    if not minutes:
        return secs
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min {secs}" if hours else f"{minutes} min {secs}"


def moment_text(moment: datetime.datetime | None, zone: bool = True) -> str:
    """``2025-01-02 13:04:05.123 UTC``: a time in the site's time zone, to the millisecond (without the
    zone's name when ``zone`` is false); "—" for None."""
    if moment is None:
        return NONE
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    text = local.strftime("%Y-%m-%d %H:%M:%S") + f".{local.microsecond // 1000:03d}"
    name = local.tzname() if zone else ""
    return f"{text} {name}" if name else text


def moment_html(moment: datetime.datetime | None, zone: bool = True) -> str:
    """``moment_text`` in a ``<time>`` element whose ``datetime`` is the ISO 8601 instant; "—" for None."""
    if moment is None:
        return NONE
    return format_html('<time datetime="{}">{}</time>', moment.isoformat(), moment_text(moment, zone))


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, writing a text of several lines as a literal block (``|``), as a person writes it."""


def _text(dumper: yaml.SafeDumper, value: str):
    # PyYAML falls back to a quoted scalar by itself when a block cannot hold the text (trailing spaces, ...)
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


#: Keys a mapping shows first, in this order (what a record is: its kind, its key, its name, its adapter); the rest
#: follow alphabetically. Not the recorded order: PostgreSQL's jsonb keeps keys by length, SQLite as written.
LEADING_KEYS = ("kind", "key", "name", "adapter")


def _ordered(value):
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (LEADING_KEYS.index(k) if k in LEADING_KEYS else len(LEADING_KEYS),
                                            str(k)))
        return {key: _ordered(value[key]) for key in keys}
    if isinstance(value, list):
        return [_ordered(item) for item in value]
    return value


def yaml_text(value) -> str:
    """``value`` (what a JSON field holds) as YAML, keys in LEADING_KEYS order then alphabetically (the same
    on every database), a text of several lines as a literal block, without a document end."""
    text = yaml.dump(_ordered(value), Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False,
                     width=100)
    if text.endswith("\n...\n"):  # a lone scalar: no end-of-document marker for a person to read
        text = text[: -len("...\n")]
    return text.rstrip("\n")


def yaml_block(value, empty: str = NONE) -> str:
    """``value`` as YAML in a ``<pre class="cp-yaml">`` (HTML, escaped); ``empty`` for None, {} or []."""
    if value is None or value == {} or value == []:
        return empty
    return format_html('<pre class="cp-yaml">{}</pre>', yaml_text(value))


def path_list(items, empty: str = "none") -> str:
    """A list of paths as ``<ul class="cp-paths">``: each item a path, or a ``{"path", "status",
    "orig_path"}`` record (engine/workspace.py ``uncommitted_changes``); ``empty`` for none."""
    if not items:
        return empty
    if not isinstance(items, list):
        return yaml_block(items, empty)
    rows = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("path"), str):
            status = str(item.get("status") or "")
            if item.get("orig_path"):
                rows.append(format_html('<li><code>{}</code> → <code>{}</code> <span class="cp-quiet">{}</span></li>',
                                        item["orig_path"], item["path"], status))
            else:
                rows.append(format_html('<li><code>{}</code> <span class="cp-quiet">{}</span></li>', item["path"],
                                        status))
        elif isinstance(item, str):
            rows.append(format_html("<li><code>{}</code></li>", item))
        else:
            rows.append(format_html("<li>{}</li>", yaml_block(item)))
    return format_html('<ul class="cp-paths">{}</ul>', format_html_join("", "{}", ((row,) for row in rows)))


def _usage_value(key: str, value) -> str:
    if value is None:
        return NONE
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if key == "cost_usd":
        return f"${value:,.4f}"
    return f"{int(value):,}"


def usage_table(usage) -> str:
    """An attempt's reported usage as ``<table class="cp-usage">``: a row for each of USAGE_ALWAYS ("—" when
    unknown), for each other key that is set; "not reported" when there is none at all."""
    if not usage:
        return "not reported"
    if not isinstance(usage, dict):
        return yaml_block(usage)
    known = dict(USAGE_ROWS)
    keys = [key for key, _ in USAGE_ROWS if key in USAGE_ALWAYS or usage.get(key) is not None]
    keys += [key for key in usage if key not in known and usage.get(key) is not None]
    rows = format_html_join("", '<tr><th scope="row">{}</th><td>{}</td></tr>',
                            ((known.get(key, key.replace("_", " ")), _usage_value(key, usage.get(key)))
                             for key in keys))
    return format_html('<table class="cp-usage"><tbody>{}</tbody></table>', rows)


def verdict_html(verdict) -> str:
    """A reviewer's verdict ``{verdict, findings[{file, line, severity, text}]}``: the verdict in bold, then
    its findings as a list (``file:line [severity] text``); any other key as YAML; "—" for none."""
    if not verdict:
        return NONE
    if not isinstance(verdict, dict):
        return yaml_block(verdict)
    parts = [format_html("<b>{}</b>", verdict.get("verdict", "(no verdict)"))]
    findings = verdict.get("findings")
    if isinstance(findings, list) and findings:
        items = []
        for finding in findings:
            if not isinstance(finding, dict):
                items.append(format_html("<li>{}</li>", yaml_block(finding)))
                continue
            where = str(finding.get("file") or "(general)")
            if finding.get("line") is not None:
                where += f":{finding['line']}"
            items.append(format_html('<li><code>{}</code> <span class="cp-quiet">[{}]</span> {}</li>', where,
                                     finding.get("severity") or "?", finding.get("text") or ""))
        parts.append(format_html('<ul class="cp-findings">{}</ul>', format_html_join("", "{}", ((i,) for i in items))))
    elif isinstance(findings, list):
        parts.append(mark_safe(" · no findings"))
    rest = {key: value for key, value in verdict.items() if key not in ("verdict", "findings")}
    if rest:
        parts.append(yaml_block(rest))
    return format_html_join("", "{}", ((part,) for part in parts))


def refusals_html(refusals) -> str:
    """Tool calls that did not succeed ``[{tool, message, outcome?}]`` as a list, each with its outcome
    in words (engine/text/tool_outcomes.py: "command not found", "failed", "refused"; "refused or failed" for
    a record older than outcomes), after a count of each; "none" for none."""
    if not refusals:
        return "none"
    if not isinstance(refusals, list) or not all(isinstance(r, dict) for r in refusals):
        return yaml_block(refusals)
    rest = [{k: v for k, v in r.items() if k not in ("tool", "message", "outcome")} for r in refusals]
    items = format_html_join("", '<li><b>{}</b> <span class="cp-outcome">[{}]</span>: '
                                 '<span class="cp-message">{}</span>{}</li>',
                             ((r.get("tool") or "?", tool_outcomes.WORDS[tool_outcomes.outcome_of(r)],
                               r.get("message") or "", yaml_block(extra, "") if extra else "")
                              for r, extra in zip(refusals, rest)))
    return format_html('<p>{}</p><ul class="cp-findings">{}</ul>',
                       tool_outcomes.sentence(tool_outcomes.counts(refusals)), items)


def _display_for(field: models.Field, formatter):
    """The admin display function showing ``field`` of an object through ``formatter``."""
    def show(obj):
        return formatter(getattr(obj, field.attname))
    return admin.display(description=field.verbose_name, ordering=field.name)(show)


def default_format(field: models.Field):
    """How a field is shown when its admin says nothing: JSON as YAML, a time with its seconds, a
    ``*_seconds`` float as a duration; None for a field Django's own display shows well."""
    if isinstance(field, models.JSONField):
        return yaml_block
    if isinstance(field, models.DateTimeField):
        return moment_html
    if isinstance(field, models.FloatField) and field.name.endswith("seconds"):
        return duration_text
    return None


class Readable:
    """Admin mixin (a ModelAdmin or an inline) of a read-only page: each model field that Django would show
    raw (``default_format``, or a formatter of ``readable_formats``) is shown instead through a display
    attribute named ``<field>_shown``, in its place among ``fields``, ``fieldsets`` and ``readonly_fields``
    (an admin that declares none of them shows every field). The field's help text goes with it."""

    #: field name -> formatter(value) -> HTML, instead of the field's ``default_format``.
    readable_formats: dict = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shown_names, self.readable_help, self.readable_displays = {}, {}, {}
        for field in self.model._meta.fields:
            formatter = self.readable_formats.get(field.name) or default_format(field)
            if formatter is None:
                continue
            name = f"{field.name}_shown"
            self.readable_displays[name] = _display_for(field, formatter)
            self.shown_names[field.name] = name
            if field.help_text:
                self.readable_help[name] = field.help_text
        if self.fields:
            self.fields = self.readable(self.fields)
        if self.fieldsets:
            self.fieldsets = [(title, {**options, "fields": self.readable(options["fields"])})
                              for title, options in self.fieldsets]
        readonly = self.readable(self.readonly_fields or ())
        self.readonly_fields = readonly + [n for n in self.shown_names.values() if n not in readonly]

    def __getattr__(self, name):
        """A readable display (``<field>_shown``), found by name as the admin finds its own displays."""
        displays = self.__dict__.get("readable_displays") or {}
        if name in displays:
            return displays[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def readable(self, names) -> list:
        """``names`` with each model field that has a readable display replaced by its display's name."""
        return [self.shown_names.get(name, name) if isinstance(name, str) else name for name in names]

    def get_fields(self, request, obj=None):
        """Every model field, readable, then the admin's own displays, when the admin declares no fields."""
        if self.fields:
            return self.fields
        names = self.readable(f.name for f in self.model._meta.fields)
        return names + [n for n in self.readonly_fields if n not in names]

    def get_form(self, request, obj=None, change=False, **kwargs):
        """The admin's form, the model fields' help texts given to their readable displays."""
        kwargs["help_texts"] = {**self.readable_help, **kwargs.get("help_texts", {})}
        return super().get_form(request, obj, change, **kwargs)

    def get_formset(self, request, obj=None, **kwargs):
        """An inline's formset, the model fields' help texts given to their readable displays."""
        kwargs["help_texts"] = {**self.readable_help, **kwargs.get("help_texts", {})}
        return super().get_formset(request, obj, **kwargs)


def code_spans(text: str):
    """``text`` escaped, with each `backquoted` part as <code> (a command in a sentence, as the engine's
    sentences write one: engine/workers.py ``queued_without_worker``)."""
    return mark_safe(re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(text)))
