from __future__ import annotations

from django.urls import include, path, re_path

from chat import api, views

urlpatterns = [
    path("", views.home, name="home"),
    path("setup/", views.setup, name="setup"),
    path("login/", views.login_view, name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("settings/", views.settings_view, name="settings"),
    path("settings/keys/<str:provider>/delete/", views.apikey_delete, name="apikey_delete"),
    path("account/tokens/", views.api_tokens_view, name="api_tokens"),
    path("account/tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api_token_revoke"),
    path("account/rules/", views.rules_view, name="permission_rules"),
    path("account/rules/<int:rule_id>/delete/", views.rule_delete, name="rule_delete"),
    path(
        "settings/endpoints/<str:provider>/delete/",
        views.endpoint_delete,
        name="endpoint_delete",
    ),
    path("search/", views.search_view, name="search"),
    path("t/new/", views.tab_new, name="tab_new"),
    path("t/<uuid:tab_id>/", views.tab, name="tab"),
    path("t/<uuid:tab_id>/older/", views.tab_older, name="tab_older"),
    path("t/<uuid:tab_id>/rename/", views.tab_rename, name="tab_rename"),
    path("t/<uuid:tab_id>/system-prompt/", views.tab_system_prompt, name="tab_system_prompt"),
    path("t/<uuid:tab_id>/delete/", views.tab_delete, name="tab_delete"),
    path("t/<uuid:tab_id>/model/", views.tab_model, name="tab_model"),
    path("t/<uuid:tab_id>/send/", views.tab_send, name="tab_send"),
    path("t/<uuid:tab_id>/stop/", views.tab_stop, name="tab_stop"),
    path("t/<uuid:tab_id>/approve/", views.tab_approve, name="tab_approve"),
    path("t/<uuid:tab_id>/rules/delete/", views.tab_rule_delete, name="tab_rule_delete"),
    path("t/<uuid:tab_id>/branch/", views.tab_branch, name="tab_branch"),
    path("t/<uuid:tab_id>/edit/", views.tab_edit, name="tab_edit"),
    path("t/<uuid:tab_id>/regenerate/", views.tab_regenerate, name="tab_regenerate"),
    path("t/<uuid:tab_id>/retry/", views.tab_retry, name="tab_retry"),
    path("t/<uuid:tab_id>/continue/", views.tab_continue, name="tab_continue"),
    path("t/<uuid:tab_id>/compact/", views.tab_compact, name="tab_compact"),
    path("t/<uuid:tab_id>/export/", views.tab_export, name="tab_export"),
    path(
        "t/<uuid:tab_id>/chunk/<int:seq>/output/",
        views.tab_chunk_output,
        name="tab_chunk_output",
    ),
    path("t/<uuid:tab_id>/attachments/", views.tab_attachments, name="tab_attachments"),
    re_path(r"^blob/(?P<sha256>[0-9a-f]{64})/$", views.blob, name="blob"),
    re_path(r"^blob/(?P<sha256>[0-9a-f]{64})/thumb/$", views.blob_thumb, name="blob_thumb"),
    path("t/import/", views.tab_import, name="tab_import"),
    path("api/v1/", include(api.urlpatterns)),
]
