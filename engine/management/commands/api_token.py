"""``python manage.py api_token USERNAME``: print the user's JSON API token, creating it if needed."""
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from engine.operations import OperationError
from engine.text import hints

from ._base import EngineCommand


class Command(EngineCommand):
    help = ("Print USERNAME's token for the JSON API (header 'Authorization: Token KEY'), creating it the "
            "first time; the same token is printed again afterwards.")

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, **options):
        username = options["username"]
        user = get_user_model()._default_manager.filter(**{get_user_model().USERNAME_FIELD: username}).first()
        if user is None:
            raise OperationError("unknown_user", f"There is no user {username!r}; create one first "
                                 f"({hints.manage('createsuperuser')}).", "username")
        if not user.is_active:
            raise OperationError("inactive_user", f"User {username!r} is not active; a token would not "
                                 "authenticate.", "username")
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(token.key)
