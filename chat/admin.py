from __future__ import annotations

from django.contrib import admin

from chat.models import Chunk, Tab


@admin.register(Tab)
class TabAdmin(admin.ModelAdmin):
    list_display = ["__str__", "owner", "model", "created_at", "updated_at"]
    search_fields = ["title"]


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin):
    """Read-only: the log is append-only."""

    list_display = ["tab", "seq", "turn_id", "step", "role", "type"]
    list_filter = ["type", "role"]
    ordering = ["tab", "seq"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
