"""Reading and using a run's detail page through the Django test client, as a person would: its URL, its HTML,
the buttons (action forms) it shows, pressing one, the messages on top and the values a form was prefilled with."""
import html
import re

from django.urls import reverse


def detail_url(run) -> str:
    return reverse("admin:engine_run_detail", args=[run.pk])


def action_url(run, verb) -> str:
    return reverse("admin:engine_run_action", args=[run.pk, verb])


def page(client, run) -> str:
    response = client.get(detail_url(run))
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def buttons(text: str) -> set[str]:
    """The actions whose forms the page shows."""
    return set(re.findall(r'<form method="post" action="[^"]+" id="action-\w+" class="cp-action[^"]*" data-cp-action="(\w+)"', text))


def press(client, run, verb, **fields) -> str:
    """Post an action's form and follow the redirect back to the page; returns the page's HTML."""
    response = client.post(action_url(run, verb), fields, follow=True)
    assert response.redirect_chain == [(detail_url(run), 302)], response.redirect_chain
    return response.content.decode()


def messages_of(text: str, level: str) -> list[str]:
    return [html.unescape(re.sub(r"<[^>]+>", "", m)).strip()
            for m in re.findall(rf'<li class="{level}">(.*?)</li>', text, re.S)]


def prefilled(text: str, verb: str, name: str) -> str:
    """The value the page put in field ``name`` of the ``verb`` form."""
    form = re.search(rf'data-cp-action="{verb}">(.*?)</form>', text, re.S)
    assert form, f"no {verb} form"
    found = re.search(rf'<input[^>]*name="{name}"[^>]*value="([^"]*)"', form.group(1))
    assert found, f"no prefilled {name} in the {verb} form"
    return html.unescape(found.group(1))
