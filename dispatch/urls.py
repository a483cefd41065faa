from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("chat.urls")),
]

# JSON under /api/, Django's pages elsewhere (chat/api.py).
handler400 = "chat.api.handler400"
handler403 = "chat.api.handler403"
handler404 = "chat.api.handler404"
handler500 = "chat.api.handler500"
