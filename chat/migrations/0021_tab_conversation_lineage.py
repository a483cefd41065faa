"""Tab.conversation and Tab.lineage (chat.render.versions): one sidebar entry per
conversation, and the page's "‹ n / total ›" between versions.

Existing tabs are grouped from their parent chain: a branch made by Edit, Regenerate or
Retry (its `forked` notice's action) joins its parent's conversation, a plain Branch
starts its own. A branch whose parent was deleted before this migration starts its own
too: nothing says any more where it came from. From now on both are stored at the
branch's creation, so deleting a tab no longer splits a conversation.
"""

from django.db import migrations, models

VERSION_ACTIONS = {"edit", "regenerate", "retry"}


def _lineage_for(parent_lineage, parent_id, cut):
    """chat.render.versions.lineage_for as of this migration (a migration keeps its own
    copy: the app's may change)."""
    reach, low = [], None
    for _, seq in reversed(parent_lineage):
        low = seq if low is None else min(low, seq)
        reach.append(low)
    reach.reverse()
    for n, ((tab_id, _), most) in enumerate(zip(parent_lineage, reach, strict=True)):
        if cut <= most:
            return [list(e) for e in parent_lineage[:n]] + [[tab_id, cut]]
    return [list(e) for e in parent_lineage] + [[str(parent_id), cut]]


def backfill(apps, schema_editor):
    Tab = apps.get_model("chat", "Tab")
    Chunk = apps.get_model("chat", "Chunk")
    tabs = {tab.pk: tab for tab in Tab.objects.only("id", "owner_id", "parent_id", "fork_seq")}
    done = {}

    def version_parent(tab):
        parent = tabs.get(tab.parent_id)
        if parent is None or tab.fork_seq is None or parent.owner_id != tab.owner_id:
            return None
        forked = Chunk.objects.filter(tab_id=tab.pk, seq=tab.fork_seq + 1, type="system").first()
        action = (forked.data or {}).get("action") if forked is not None else None
        return parent if action in VERSION_ACTIONS else None

    def cut_in(parent, fork_seq):
        return (
            Chunk.objects.filter(tab_id=parent.pk, seq__lte=fork_seq)
            .exclude(type="system")
            .order_by("-seq")
            .values_list("seq", flat=True)
            .first()
        ) or 0

    def resolve(start):
        # Up the chain to a tab already resolved or a conversation's first (a loop, which
        # only a hand-edited database has, starts at the tab that closes it), then down
        # it: no recursion, however many versions deep (Regenerate in a loop, by the API).
        chain, seen, tab = [], set(), start
        while tab.pk not in done:
            seen.add(tab.pk)
            parent = version_parent(tab)
            if parent is None or parent.pk in seen:
                done[tab.pk] = (tab.pk, [])
                break
            chain.append((tab, parent))
            tab = parent
        for child, parent in reversed(chain):
            conversation, lineage = done[parent.pk]
            done[child.pk] = (
                conversation,
                _lineage_for(lineage, parent.pk, cut_in(parent, child.fork_seq)),
            )
        return done[start.pk]

    for tab in tabs.values():
        tab.conversation, tab.lineage = resolve(tab)
    Tab.objects.bulk_update(tabs.values(), ["conversation", "lineage"], batch_size=500)


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0020_endpoint_api_style_and_reasoning_tokens"),
    ]

    operations = [
        migrations.AddField(
            model_name="tab",
            name="conversation",
            field=models.UUIDField(null=True),
        ),
        migrations.AddField(
            model_name="tab",
            name="lineage",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="tab",
            name="conversation",
            field=models.UUIDField(db_index=True),
        ),
    ]
