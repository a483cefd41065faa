from django.db import migrations, models

# The registry's own rule, not a copy as of this migration: what is bound here is what
# a request compares with, when this runs.
from chat.providers.registry import PROVIDERS, from_env, key_endpoint


def bind_stored_keys(apps, schema_editor):
    """Each stored key is bound to the endpoint in effect when the migration runs, as a
    request resolves it: the environment's URL, else the Settings endpoint, else the
    SDK's default."""
    ApiKey = apps.get_model("chat", "ApiKey")
    ProviderEndpoint = apps.get_model("chat", "ProviderEndpoint")
    endpoints = dict(ProviderEndpoint.objects.values_list("provider", "base_url"))
    for row in ApiKey.objects.all():
        spec = PROVIDERS.get(row.provider)
        if spec is None:
            continue  # no request uses a provider this version does not know
        url = from_env(spec.url_env) or endpoints.get(row.provider) or spec.default_url
        row.endpoint = key_endpoint(url)
        row.save(update_fields=["endpoint"])


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0015_mcp_confinement"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="endpoint",
            field=models.CharField(blank=True, default="", max_length=500),
        ),
        migrations.RunPython(bind_stored_keys, migrations.RunPython.noop),
    ]
