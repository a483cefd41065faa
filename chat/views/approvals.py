"""Approvals: answering a pending tool call, "always allow" (a rule for the tab or the
user), and the tab's own rules in its menu.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from chat import rules, turns
from chat.chunks import Kind
from chat.models import Chunk, PermissionRule, Tab
from chat.tools import files as workspace_files
from chat.tools import workdir
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest

# The approval form's answers: each names the call it answers.
APPROVAL_ANSWERS = ("approve", "deny", "always_tab", "always_user")


@login_required
@require_POST
def tab_approve(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Answer a pending approval: the button says approve=<call_id> or deny=<call_id>, or
    always_tab / always_user=<call_id>: approve it and add the call's rule
    (chat.rules.natural) to this tab or to all the user's tabs."""
    tab = common.tab_for_user(request, tab_id)
    given = [(key, request.POST[key]) for key in APPROVAL_ANSWERS if request.POST.get(key)]
    if len(given) != 1:
        return HttpResponseBadRequest(
            "Send one of approve, deny, always_tab or always_user = <call id>."
        )
    answer, call_id = given[0]
    rule = None
    if answer in ("always_tab", "always_user"):
        source = rules.TAB if answer == "always_tab" else rules.USER
        try:
            rule = _always_allow(request, tab, call_id, source)
        except rules.RuleError as exc:
            # Plain text: the message may quote the call id the request sent.
            return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    turns.approve(tab.id, call_id, answer != "deny", rule=rule)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    return HttpResponse(status=204)


def _always_allow(
    request: AuthenticatedHttpRequest, tab: Tab, call_id: str, source: str
) -> dict[str, Any]:
    """Add the call's own rule for this tab or the user, unless a rule already allows the
    call or an ask or deny rule would still win over it. Returns what the runner logs."""
    call = (
        Chunk.objects.filter(tab=tab, type=Kind.TOOL_CALL, data__call_id=call_id)
        .order_by("-seq")
        .first()
    )
    if call is None:
        raise rules.RuleError(f"There is no call {call_id!r} in this tab.")
    name, arguments = str(call.data.get("name") or ""), call.data.get("arguments") or {}
    pattern = rules.natural(name, arguments) if isinstance(arguments, dict) else None
    if pattern is None:
        raise rules.RuleError(
            "This call has no rule to always allow (a compound command, a wildcard, a "
            "redirection to a file or a path outside the workspace): approve it once, or add "
            "a rule in Permission rules."
        )
    new = rules.parse(rules.ALLOW, pattern, source=source)
    where = "this tab" if source == rules.TAB else "all your tabs"
    note: dict[str, Any] = {"action": rules.ALLOW, "pattern": pattern, "source": source}

    def resolve(path: str) -> str:
        # The runner's own (chat.turn.calls): decided as the runner decides, an ask rule that
        # matches where a link leads still decides first, so no rule is added for it.
        return workspace_files.resolve(
            workdir.ensure(workdir.user_workspace(tab.owner_id), tab.workdir), path
        )

    with transaction.atomic():
        locked = Tab.objects.select_for_update().get(pk=tab.pk)
        before = rules.decide(_rules_of(locked, request.user), name, arguments, resolve=resolve)
        if before is not None and before.action == rules.ALLOW:
            text = f"Approved; no rule added: {before.text} already allows this call"
        elif before is not None:
            text = f"Approved once; no rule added: {before.text} would still decide first"
        else:
            if source == rules.TAB:
                entry = {"action": rules.ALLOW, "pattern": new.pattern}
                Tab.objects.filter(pk=tab.pk).update(rules=[*locked.rules, entry])
            else:
                PermissionRule.objects.create(
                    user=request.user, action=rules.ALLOW, pattern=new.pattern
                )
            text = f"Rule added for {where}: allow `{pattern}`"
            note["added"] = True
    return {"text": text, "rule": note}


def _rules_of(tab: Tab, owner: User) -> list[rules.Rule]:
    """The rules that decide the tab's calls, in order: its own, then its owner's (the
    user answering: a tab is only ever found with its owner)."""
    own, _ = rules.parse_all(tab.rules or [], source=rules.TAB)
    rows = PermissionRule.objects.filter(user=owner).values("action", "pattern")
    users, _ = rules.parse_all(rows, source=rules.USER)
    return own + users


@login_required
@require_POST
@common.tab_gone_is_404
def tab_rule_delete(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Remove one of the tab's own rules (the tab menu), named by its action and pattern."""
    tab = common.tab_for_user(request, tab_id)
    action, pattern = request.POST.get("action", ""), request.POST.get("pattern", "")
    with transaction.atomic():
        locked = Tab.objects.select_for_update().get(pk=tab.pk)
        kept = list(locked.rules or [])
        index = next(
            (
                i
                for i, entry in enumerate(kept)
                if isinstance(entry, dict)
                and entry.get("action") == action
                and entry.get("pattern") == pattern
            ),
            None,
        )
        if index is not None:
            del kept[index]
            Tab.objects.filter(pk=tab.pk).update(rules=kept)
    if index is None:
        messages.error(request, f"This tab has no rule {action} `{pattern}` (already removed?).")
    else:
        messages.success(request, f"Removed this tab's rule {action} `{pattern}`.")
    return redirect("tab", tab_id=tab.id)
