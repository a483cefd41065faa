"""The web UI's views, one module per surface (chat/urls.py names each route's).

Thin: rendering of chunks is chat.render's, turns are chat.turns'. Every view but
the first-run page and the login page needs a logged-in user, and a tab is only
ever looked up together with its owner (`common.tab_for_user`).
"""
