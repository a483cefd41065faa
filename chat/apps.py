from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "chat"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Signal receivers connect once the models are loaded.
        from chat import revocation, search

        search.connect_signals()
        revocation.connect_signals()
