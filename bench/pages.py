"""Server time to render a tab page, its "load older" page, and the API's chunk pages, by
tab length."""

from __future__ import annotations

from bench.common import fill_tab, measure

SIZES = (1_000, 10_000, 100_000)


def run() -> dict:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    from chat.preferences import new_tab

    user = get_user_model().objects.create_superuser("pages", password="x" * 12)
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    results = {}
    for n in SIZES:
        tab = new_tab(user, "offline/demo")
        fill_tab(tab.pk, n)
        page_url = reverse("tab", kwargs={"tab_id": tab.pk})
        older_url = reverse("tab_older", kwargs={"tab_id": tab.pk}) + f"?before={n - 200}"
        api_url = f"/api/v1/tabs/{tab.pk}/chunks"

        def page(url=page_url):
            response = client.get(url)
            assert response.status_code == 200, response.status_code

        def older(url=older_url):
            response = client.get(url, headers={"HX-Request": "true"})
            assert response.status_code == 200, response.status_code

        def api_newest(url=api_url):
            response = client.get(url)
            assert response.status_code == 200, response.status_code

        def api_middle(url=api_url, before=n // 2):
            # A page wholly below the last seq: immutable, answered in full (no ETag sent).
            response = client.get(url, {"before": before})
            assert response.status_code == 200, response.status_code

        results[n] = {
            "page": measure(page, runs=7),
            "older": measure(older, runs=7),
            "api_newest": measure(api_newest, runs=7),
            "api_middle": measure(api_middle, runs=7),
        }
    first, last = results[SIZES[0]], results[SIZES[-1]]
    return {
        "by_size": {str(n): r for n, r in results.items()},
        "page_ratio_100k_to_1k": round(last["page"]["median"] / first["page"]["median"], 3),
        "older_ratio_100k_to_1k": round(last["older"]["median"] / first["older"]["median"], 3),
        "api_newest_ratio_100k_to_1k": round(
            last["api_newest"]["median"] / first["api_newest"]["median"], 3
        ),
        "api_middle_ratio_100k_to_1k": round(
            last["api_middle"]["median"] / first["api_middle"]["median"], 3
        ),
        "goal": "100k within 1.5x of 1k",
    }
