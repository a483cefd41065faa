"""The full-text search index (chat/search.py): FTS5 on SQLite, tsvector + GIN on PostgreSQL.

Raw SQL, not a model: the index is written and read only by chat.search, and
its SQLite half is a virtual table the ORM cannot describe. The chunks an
install already has are indexed here, once, oldest first; from then on
chat.log indexes each chunk as it appends it.
"""

from django.db import migrations

from chat import search

# Chunks read per query while indexing an existing log.
BACKFILL_BATCH = 2_000

SQLITE = [
    # AUTOINCREMENT: rowids are never reused after a tab's rows go, so the FTS
    # index's rowid order is the order chunks were sealed in (hits newest first).
    """CREATE TABLE chat_searchentry (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        chunk_id char(32) NOT NULL,
        tab_id char(32) NOT NULL,
        seq bigint NOT NULL,
        role varchar(16) NOT NULL,
        type varchar(16) NOT NULL,
        body text NOT NULL
    )""",
    "CREATE INDEX chat_searchentry_tab ON chat_searchentry (tab_id)",
    # External content: the body is stored once, in chat_searchentry.
    """CREATE VIRTUAL TABLE chat_searchentry_fts USING fts5(
        body,
        content='chat_searchentry',
        content_rowid='id',
        tokenize='unicode61 remove_diacritics 2'
    )""",
]
SQLITE_REVERSE = [
    "DROP TABLE chat_searchentry_fts",
    "DROP TABLE chat_searchentry",
]

POSTGRESQL = [
    # No foreign key to chat_tab, as on SQLite: rows go with their tab through
    # chat.search.forget, and a key would make Django's flush (TRUNCATE without
    # CASCADE) refuse to empty chat_tab.
    """CREATE TABLE chat_searchentry (
        id bigserial PRIMARY KEY,
        chunk_id uuid NOT NULL,
        tab_id uuid NOT NULL,
        seq bigint NOT NULL,
        role varchar(16) NOT NULL,
        type varchar(16) NOT NULL,
        body text NOT NULL,
        document tsvector NOT NULL
    )""",
    "CREATE INDEX chat_searchentry_tab ON chat_searchentry (tab_id)",
    "CREATE INDEX chat_searchentry_document ON chat_searchentry USING gin (document)",
]
POSTGRESQL_REVERSE = ["DROP TABLE chat_searchentry"]


def _run(schema_editor, statements):
    vendor = schema_editor.connection.vendor
    if vendor not in statements:
        raise RuntimeError(f"The search index supports SQLite and PostgreSQL, not {vendor}.")
    for sql in statements[vendor]:
        schema_editor.execute(sql)


def forward(apps, schema_editor):
    _run(schema_editor, {"sqlite": SQLITE, "postgresql": POSTGRESQL})
    Chunk = apps.get_model("chat", "Chunk")
    chunks = Chunk.objects.order_by("created_at", "seq").only(
        "id", "tab_id", "seq", "role", "type", "data"
    )
    for chunk in chunks.iterator(chunk_size=BACKFILL_BATCH):
        search.index(chunk.tab_id, [chunk])


def backward(apps, schema_editor):
    _run(schema_editor, {"sqlite": SQLITE_REVERSE, "postgresql": POSTGRESQL_REVERSE})


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0003_apitoken"),
    ]

    operations = [migrations.RunPython(forward, backward)]
